//! RoPE and the KV cache append (kernels/rope.cu).

use m40_device::{DeviceBuffer, DeviceView, Stream};

use crate::error::Result;
use crate::launch::{cfg, check_len, shape, to_i32};
use crate::layout::{KvType, KV_PAGE};
use crate::Kernels;

/// Threads per block of kernels/rope.cu (`ROPE_THREADS`).
const ROPE_THREADS: u32 = 256;
/// Rotated pairs per head at most (kernels/rope.cu `ROPE_MAX_HALF`).
const ROPE_MAX_HALF: usize = 128;

/// Which dimensions RoPE pairs: (2i, 2i+1) or (i, i + n_rot/2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    Normal,
    Neox,
}

/// The shape and parameters of a RoPE launch.
#[derive(Clone, Copy, Debug)]
pub struct RopeParams {
    pub style: RopeStyle,
    pub n_head: usize,
    pub head_dim: usize,
    /// Rotated dimensions per head (even, at most head_dim).
    pub n_rot: usize,
    /// Positions are multiplied by this (1 / the linear scaling factor).
    pub pos_scale: f32,
}

/// Where rotated keys and their values go: one sequence's pages of the
/// FP16 KV pools (the layout of kernels/attention.cu), at positions read
/// on the device.
/// Per-head RMSNorm weights of the queries and keys (head_dim each), and
/// the norm's epsilon.
#[derive(Clone, Copy)]
pub struct HeadNorms<'x, 'v> {
    pub q: &'x DeviceView<'v, f32>,
    pub k: &'x DeviceView<'v, f32>,
    pub eps: f32,
}

pub struct KvAppend<'a, 'c> {
    pub n_head_kv: usize,
    /// pos[t]: token t's position (read on the device; `max_start` bounds
    /// pos[0], and the positions after it follow on: pos[t] = pos[0] + t).
    pub pos: &'a DeviceView<'a, i32>,
    /// (n_rot / 2 + 1): base^(-2i/n_rot) with any per-dimension factors
    /// applied, then the magnitude scale of the rotated dimensions
    /// (`Rope::device_table`; the one-token GEMVs that rotate read it too).
    pub inv_freq: &'a DeviceView<'a, f32>,
    pub p: &'a RopeParams,
    pub kpool: &'c mut DeviceBuffer<u16>,
    pub vpool: &'c mut DeviceBuffer<u16>,
    /// How the pools' pages store values (the queries are rotated with
    /// the keys for a quantized one).
    pub format: KvType,
    /// The sequence's block table: its pages, in order.
    pub table: &'a DeviceView<'a, i32>,
    pub max_start: usize,
}

impl<'a> KvAppend<'a, '_> {
    /// The same destinations for another launch (one stack of a layer's
    /// Q/K/V after another).
    pub fn reborrow(&mut self) -> KvAppend<'a, '_> {
        KvAppend {
            kpool: &mut *self.kpool,
            vpool: &mut *self.vpool,
            ..*self
        }
    }
}

impl Kernels {
    /// RoPE of the queries q (n_tok, p.n_head, head_dim) in place, and of
    /// the keys k (n_tok, n_head_kv, head_dim) into `kv`'s K pages with the
    /// values v beside them in its V pages: token t at position pos[t];
    /// k and v are left as they were.
    pub fn rope_kv_append(
        &self,
        stream: &Stream,
        q: &mut DeviceBuffer<f32>,
        k: &DeviceView<'_, f32>,
        v: &DeviceView<'_, f32>,
        kv: KvAppend<'_, '_>,
    ) -> Result<()> {
        self.rope_kv(stream, q, k, v, kv, None, None, None)
    }

    /// [`Kernels::rope_kv_append`] over tokens of different sequences (a
    /// batched decode step): token t at its own position pos[t] (at most
    /// `kv.max_start`, which need not follow pos[0]) into the pages of the
    /// block table that starts at `kv.table[tab[t]]`.
    pub fn rope_kv_append_batch(
        &self,
        stream: &Stream,
        q: &mut DeviceBuffer<f32>,
        k: &DeviceView<'_, f32>,
        v: &DeviceView<'_, f32>,
        kv: KvAppend<'_, '_>,
        tab: &DeviceView<'_, i32>,
    ) -> Result<()> {
        check_len("rope_kv_append_batch", "tab", tab.len(), kv.pos.len())?;
        self.rope_kv(stream, q, k, v, kv, Some(tab), None, None)
    }

    /// [`Kernels::rope_kv_append`] (with `tab`: its batched form) with Q's,
    /// K's and V's biases added first in the same launch: `bias` holds
    /// them in that order ((n_head + 2 n_head_kv) head_dim; qwen2,
    /// gpt-oss).
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kv_append_biased(
        &self,
        stream: &Stream,
        q: &mut DeviceBuffer<f32>,
        k: &DeviceView<'_, f32>,
        v: &DeviceView<'_, f32>,
        kv: KvAppend<'_, '_>,
        tab: Option<&DeviceView<'_, i32>>,
        bias: &DeviceView<'_, f32>,
    ) -> Result<()> {
        const K: &str = "rope_kv_append_biased";
        let heads = kv.p.n_head + 2 * kv.n_head_kv;
        check_len(K, "bias", bias.len(), heads * kv.p.head_dim)?;
        if let Some(tab) = tab {
            check_len(K, "tab", tab.len(), kv.pos.len())?;
        }
        self.rope_kv(stream, q, k, v, kv, tab, None, Some(bias))
    }

    /// [`Kernels::rope_kv_append`] (with `tab`: its batched form) with each
    /// query and key head RMS-normed by `norms` before its rotation, in
    /// the same launch (qwen3, gemma3). An error where the head size is
    /// not a multiple of 64 (the caller norms the heads apart then).
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kv_append_normed(
        &self,
        stream: &Stream,
        q: &mut DeviceBuffer<f32>,
        k: &DeviceView<'_, f32>,
        v: &DeviceView<'_, f32>,
        kv: KvAppend<'_, '_>,
        tab: Option<&DeviceView<'_, i32>>,
        norms: HeadNorms<'_, '_>,
    ) -> Result<()> {
        const K: &str = "rope_kv_append_normed";
        let hd = kv.p.head_dim;
        if !hd.is_multiple_of(64) || hd > 2 * ROPE_MAX_HALF {
            return Err(shape(
                K,
                format!("head_dim {hd}: a multiple of 64, at most 256"),
            ));
        }
        check_len(K, "q norm", norms.q.len(), hd)?;
        check_len(K, "k norm", norms.k.len(), hd)?;
        if let Some(tab) = tab {
            check_len(K, "tab", tab.len(), kv.pos.len())?;
        }
        self.rope_kv(stream, q, k, v, kv, tab, Some(norms), None)
    }

    #[allow(clippy::too_many_arguments)]
    fn rope_kv(
        &self,
        stream: &Stream,
        q: &mut DeviceBuffer<f32>,
        k: &DeviceView<'_, f32>,
        v: &DeviceView<'_, f32>,
        kv: KvAppend<'_, '_>,
        tab: Option<&DeviceView<'_, i32>>,
        norms: Option<HeadNorms<'_, '_>>,
        bias: Option<&DeviceView<'_, f32>>,
    ) -> Result<()> {
        const K: &str = "rope_kv_append";
        let KvAppend {
            n_head_kv,
            pos,
            inv_freq,
            p,
            kpool,
            vpool,
            format,
            table,
            max_start,
        } = kv;
        let (n_rot, head_dim) = (p.n_rot, p.head_dim);
        if n_rot == 0 || !n_rot.is_multiple_of(2) || n_rot > head_dim || n_rot > 2 * ROPE_MAX_HALF {
            return Err(shape(
                K,
                format!(
                    "n_rot {n_rot} must be even, positive and at most head_dim {head_dim} and {}",
                    2 * ROPE_MAX_HALF
                ),
            ));
        }
        let n_tok = pos.len();
        if n_tok == 0 {
            return Ok(());
        }
        let hd = p.head_dim;
        if !hd.is_multiple_of(2) {
            return Err(shape(K, format!("head_dim {hd} must be even")));
        }
        let kv_dim = n_head_kv * hd;
        check_len(K, "q", q.len(), n_tok * p.n_head * hd)?;
        check_len(K, "k", k.len(), n_tok * kv_dim)?;
        check_len(K, "v", v.len(), n_tok * kv_dim)?;
        check_len(K, "inv_freq", inv_freq.len(), p.n_rot / 2 + 1)?;
        // One sequence's tokens follow on from pos[0]; a batch's are each
        // at most max_start, in tables the caller keeps within `table`.
        let last = match tab {
            None => max_start + n_tok,
            Some(_) => max_start + 1,
        };
        check_len(K, "table", table.len(), last.div_ceil(KV_PAGE))?;
        format.check_pool(K, kpool.len(), kv_dim, hd)?;
        check_len(K, "vpool", vpool.len(), kpool.len())?;
        let names = match (p.style, tab.is_some(), norms.is_some()) {
            (RopeStyle::Normal, false, false) => crate::layout::kv_names!("rope_kv_norm", f32),
            (RopeStyle::Neox, false, false) => crate::layout::kv_names!("rope_kv_neox", f32),
            (RopeStyle::Normal, true, false) => crate::layout::kv_names!("rope_kv_b_norm", f32),
            (RopeStyle::Neox, true, false) => crate::layout::kv_names!("rope_kv_b_neox", f32),
            (RopeStyle::Normal, false, true) => crate::layout::kv_names!("rope_kv_qkn_norm", f32),
            (RopeStyle::Neox, false, true) => crate::layout::kv_names!("rope_kv_qkn_neox", f32),
            (RopeStyle::Normal, true, true) => crate::layout::kv_names!("rope_kv_b_qkn_norm", f32),
            (RopeStyle::Neox, true, true) => crate::layout::kv_names!("rope_kv_b_qkn_neox", f32),
        };
        let name = format.pick(&names);
        let kernel = self.kernel("rope", name)?;
        let heads_per_block = (ROPE_THREADS as usize / (hd / 2)).max(1);
        let grid = (
            to_i32(K, "n_tok", n_tok)? as u32,
            (p.n_head + n_head_kv).div_ceil(heads_per_block) as u32,
            1,
        );
        to_i32(K, "positions", last)?;
        let (n_head, n_kv, hd_i, n_rot) = (
            to_i32(K, "n_head", p.n_head)?,
            to_i32(K, "n_head_kv", n_head_kv)?,
            to_i32(K, "head_dim", hd)?,
            to_i32(K, "n_rot", p.n_rot)?,
        );
        // SAFETY: rope_kv_*_f32(float* q, int n_head, const float* k, const float* v,
        // int n_head_kv, const int* pos, const float* inv_freq, int head_dim, int n_rot,
        // float pos_scale, u16* kpool, u16* vpool, const int* table), and the
        // batched rope_kv_b_*_f32 with const int* tab after them: block (t, c)
        // reads pos[t] (<= max_start + t, or max_start in a batch: the
        // caller's promise), tab[t] (n_tok of them, checked) and
        // table[tab[t] + pos[t] / KV_PAGE] (within `table`, the caller's
        // promise for a batch), rotates heads of token t of q in place, reads
        // k and v rows of token t and writes pool row kv_row(table, pos[t]) of
        // the pages the table names (below the pool's page count, kept so by
        // the caller); inv_freq[..=n_rot/2] (n_rot/2 <= ROPE_MAX_HALF, the shared
        // table); lengths checked above. The *_qkn_* kernels take const
        // float* qn, const float* kn, float eps last (after tab) and read
        // qn and kn [..head_dim] (checked by rope_kv_append_normed, with the
        // head size its one-pair-a-thread blocks need). The others take
        // const float* bias last: (n_head + 2 n_head_kv) head_dim floats
        // (checked by rope_kv_append_biased) or null.
        unsafe {
            let l = stream
                .launch(&kernel)
                .buf_mut(q)
                .scalar(&n_head)
                .view(k)
                .view(v)
                .scalar(&n_kv)
                .view(pos)
                .view(inv_freq)
                .scalar(&hd_i)
                .scalar(&n_rot)
                .scalar(&p.pos_scale)
                .buf_mut(kpool)
                .buf_mut(vpool)
                .view(table);
            let l = match tab {
                Some(tab) => l.view(tab),
                None => l,
            };
            match (&norms, bias) {
                (Some(nm), _) => l
                    .view(nm.q)
                    .view(nm.k)
                    .scalar(&nm.eps)
                    .run(cfg(grid, ROPE_THREADS))?,
                (None, Some(b)) => l.view(b).run(cfg(grid, ROPE_THREADS))?,
                (None, None) => l.null().run(cfg(grid, ROPE_THREADS))?,
            }
        };
        Ok(())
    }
}
