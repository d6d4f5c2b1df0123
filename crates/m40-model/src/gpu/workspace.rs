//! The activations of a forward step (for up to max_batch tokens), the
//! step's inputs on the device, the attention and GEMM split scratch, and
//! the token selection's buffers.

use m40_device::{DeviceBuffer, Stream};
use m40_gguf::HyperParams;
use m40_kernels::{
    gemm_scratch_len, GemmSlots, SelectMasks, SelectOut, SelectRows, PACK_ROWS, SELECT_ARGS,
    SELECT_MAX_K, SELECT_SCRATCH,
};

use super::moe::MoeBufs;
use super::tuning::{GEMV_MAX_TOKENS, GEMV_TOKENS};
use super::GpuBackend;
use crate::error::Result;
use crate::Backend;

/// A token selection to run after a step's logits: its encoded arguments
/// (`select_args`) and k; the k ids and the bits of their logits land in
/// `out`.
pub(super) struct Select<'a> {
    pub(super) args: &'a [i32],
    pub(super) k: usize,
    pub(super) out: &'a mut Vec<i32>,
    /// A structured output's token mask (the args say masked).
    pub(super) mask: Option<&'a crate::MaskSlot>,
}

/// Rows of logits computed per output matmul when all are asked for.
pub(super) const LOGIT_ROWS: usize = 64;

/// Activations for `max_batch` tokens, and the attention split scratch.
pub(super) struct Workspace {
    /// A step's inputs: token ids (max_batch), positions (max_batch), the
    /// block table (the pool's page count: one sequence's, or a batched
    /// decode step's sequences' one after another), where each token's
    /// table starts in a batched decode step (max_batch), then a
    /// selection's arguments (SELECT_ARGS + 2 n_vocab: see `select_args`),
    /// uploaded in one copy.
    pub(super) inputs: DeviceBuffer<i32>,
    pub(super) x: DeviceBuffer<f32>,
    pub(super) h: DeviceBuffer<f32>,
    pub(super) q: DeviceBuffer<f32>,
    pub(super) k: DeviceBuffer<f32>,
    pub(super) v: DeviceBuffer<f32>,
    pub(super) att: DeviceBuffer<f32>,
    /// The output projections of up to GEMV_MAX_TOKENS tokens before they join
    /// the residual (decode, short steps).
    pub(super) proj: DeviceBuffer<f32>,
    /// A folded norm's partial sums of squares, one per block of the
    /// residual GEMV that emits them (at most n_embd / 4).
    pub(super) norm_part: DeviceBuffer<f32>,
    pub(super) gate: DeviceBuffer<f32>,
    pub(super) up: DeviceBuffer<f32>,
    pub(super) logits: DeviceBuffer<f32>,
    /// Token selection: the k ids and the bits of their logits (a batched
    /// step's rows: LOGIT_ROWS of 2 SELECT_MAX_K).
    pub(super) sel_out: DeviceBuffer<i32>,
    /// The selection's scratch, a row's SELECT_SCRATCH for each of
    /// LOGIT_ROWS (zeroed once; each selection leaves it zero).
    pub(super) sel_scratch: DeviceBuffer<i32>,
    /// Structured outputs' token masks, a row's `mask_words(n_vocab)` for
    /// each of LOGIT_ROWS, uploaded just before the selection.
    pub(super) masks: DeviceBuffer<u32>,
    pub(super) part: DeviceBuffer<f32>,
    pub(super) part_ml: DeviceBuffer<f32>,
    /// A mixture's step buffers (one element each for a dense model).
    pub(super) moe: MoeBufs,
}

impl Workspace {
    /// The workspace of a backend of `hp` for steps of up to `b` tokens
    /// over a pool of `n_pages`; the attention scratch sized for `dec`
    /// (the decode plan at the pool's last position: see
    /// [`GpuBackend::scratch`]).
    pub(super) fn new(
        stream: &Stream,
        hp: &HyperParams,
        b: usize,
        n_pages: usize,
        (dec_part, dec_ml): (usize, usize),
    ) -> Result<Workspace> {
        let (q_dim, kv_dim) = (hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim);
        let a = |n: usize, what: &str| stream.alloc::<f32>(n.max(1), what);
        Ok(Workspace {
            inputs: stream.alloc_zeroed::<i32>(
                3 * b + n_pages + SELECT_ARGS + 2 * hp.n_vocab,
                "step inputs",
            )?,
            x: a(b * hp.n_embd, "activations")?,
            h: a(b * hp.n_embd, "activations")?,
            q: a(b * q_dim, "activations")?,
            k: a(b * kv_dim, "activations")?,
            v: a(b * kv_dim, "activations")?,
            att: a(b * q_dim, "activations")?,
            proj: a(proj_rows(hp, b) * hp.n_embd, "activations")?,
            norm_part: a(hp.n_embd.div_ceil(PACK_ROWS), "activations")?,
            gate: a(b * hp.n_ff, "activations")?,
            up: a(2 * b * hp.n_ff, "activations")?,
            logits: a(LOGIT_ROWS * hp.n_vocab, "logits")?,
            sel_out: stream.alloc::<i32>(LOGIT_ROWS * 2 * SELECT_MAX_K, "token selection")?,
            sel_scratch: stream
                .alloc_zeroed::<i32>(LOGIT_ROWS * SELECT_SCRATCH, "token selection scratch")?,
            masks: stream.alloc::<u32>(LOGIT_ROWS * mask_words(hp.n_vocab), "token masks")?,
            part: a(dec_part, "attention scratch")?,
            part_ml: a(dec_ml, "attention scratch")?,
            moe: MoeBufs::new(stream, hp, b)?,
        })
    }

    /// Bytes [`Workspace::new`] allocates but the attention scratch (with
    /// the GEMM scratch of [`gemm_scratch`]), for [`super::memory_needed`].
    pub(super) fn bytes(hp: &HyperParams, b: usize, n_pages: usize, gpu: GemmSlots) -> u64 {
        let (d, q, ff) = (
            hp.n_embd as u64,
            (hp.n_head * hp.head_dim) as u64,
            hp.n_ff as u64,
        );
        let kv_dim = (hp.n_head_kv * hp.head_dim) as u64;
        let (bb, pages) = (b as u64, n_pages as u64);
        // x, h, q, att, k, v, gate, up (twice: a gate/up stack's output) per
        // token; the pending projections (`proj_rows`); a folded norm's partial sums;
        // LOGIT_ROWS rows of logits; the step inputs (ids, positions, block
        // table, a selection's arguments); the token selection's results.
        4 * (bb * (2 * d + 2 * q + 2 * kv_dim + 3 * ff + 3)
            + proj_rows(hp, b) as u64 * d
            + d.div_ceil(PACK_ROWS as u64)
            + LOGIT_ROWS as u64 * hp.n_vocab as u64
            + pages
            + (SELECT_ARGS
                + 2 * hp.n_vocab
                + LOGIT_ROWS * (2 * SELECT_MAX_K + SELECT_SCRATCH + mask_words(hp.n_vocab)))
                as u64
            + gemm_scratch(hp, b.max(1), gpu) as u64
            + MoeBufs::floats(hp, b))
    }
}

/// Words of one token mask over `n_vocab` tokens.
pub(super) fn mask_words(n_vocab: usize) -> usize {
    n_vocab.div_ceil(32)
}

/// Rows of `proj`: GEMV_MAX_TOKENS (only the GEMV's outputs wait there)
/// or, where the outputs are normed or scaled before they join x (gemma's
/// post-norms, granite's multiplier) or come from a mixture's combine,
/// the whole step's.
fn proj_rows(hp: &HyperParams, b: usize) -> usize {
    if hp.residual_transformed() || hp.moe.is_some() {
        b
    } else {
        b.min(GEMV_MAX_TOKENS)
    }
}

/// The [`Norm`] buffers of a workspace (a macro: it borrows three fields,
/// not the whole workspace).
macro_rules! norm_bufs {
    ($w:expr) => {
        $crate::gpu::workspace::Norm {
            x: &mut $w.x,
            proj: &$w.proj,
            h: &mut $w.h,
        }
    };
}

/// The buffers of a norm: the residual stream x, the pending one-row
/// residual, and the output.
pub(super) struct Norm<'a> {
    pub(super) x: &'a mut DeviceBuffer<f32>,
    pub(super) proj: &'a DeviceBuffer<f32>,
    pub(super) h: &'a mut DeviceBuffer<f32>,
}

/// The buffers of a residual connection: the residual stream x, the
/// pending projection, a folded norm's h and partial sums (a macro builds
/// it: it borrows four fields, not the whole workspace).
pub(super) struct Res<'a> {
    pub(super) x: &'a mut DeviceBuffer<f32>,
    pub(super) proj: &'a mut DeviceBuffer<f32>,
    pub(super) h: &'a mut DeviceBuffer<f32>,
    pub(super) part: &'a mut DeviceBuffer<f32>,
}

macro_rules! res_bufs {
    ($w:expr) => {
        $crate::gpu::workspace::Res {
            x: &mut $w.x,
            proj: &mut $w.proj,
            h: &mut $w.h,
            part: &mut $w.norm_part,
        }
    };
}
pub(super) use {norm_bufs, res_bufs};

/// Floats of scratch the prefill GEMMs of `hp`'s matrices take split over
/// K (m40_kernels::gemm_scratch_len) on `gpu`, for any step of
/// up to `max_batch` tokens (the GEMV takes steps of GEMV_TOKENS or fewer;
/// the output matrix, LOGIT_ROWS rows at most).
pub(super) fn gemm_scratch(hp: &HyperParams, max_batch: usize, gpu: GemmSlots) -> usize {
    let (d, q, kv, ff) = (
        hp.n_embd,
        hp.n_head * hp.head_dim,
        hp.n_head_kv * hp.head_dim,
        hp.n_ff,
    );
    // (rows, cols, most tokens): Q/K/V stacked or not, o, gate/up stacked
    // or not, down, the output.
    let mats = [
        (q + 2 * kv, d, max_batch),
        (q, d, max_batch),
        (kv, d, max_batch),
        (d, q, max_batch),
        (2 * ff, d, max_batch),
        (ff, d, max_batch),
        (d, ff, max_batch),
        (hp.n_vocab, d, LOGIT_ROWS.min(max_batch)),
    ];
    mats.iter()
        .flat_map(|&(n, k, most)| {
            (GEMV_TOKENS + 1..=most).map(move |m| gemm_scratch_len(m, n, k, gpu))
        })
        .max()
        .unwrap_or(0)
}

impl GpuBackend {
    /// Upload a step's token ids, positions, block table and a selection's
    /// arguments (one copy).
    pub(super) fn upload_inputs(
        &self,
        w: &mut Workspace,
        tokens: &[u32],
        start: usize,
        pages: &[u32],
        sel: Option<&[i32]>,
    ) -> Result<()> {
        let b = self.max_batch;
        let mut v = vec![0i32; 2 * b + pages.len()];
        for (i, &t) in tokens.iter().enumerate() {
            v[i] = t as i32;
            v[b + i] = (start + i) as i32;
        }
        for (i, &p) in pages.iter().enumerate() {
            v[2 * b + i] = p as i32;
        }
        if let Some(args) = sel {
            v.resize(self.sel_at(), 0);
            v.extend_from_slice(args);
        }
        self.stream.copy_to_device(&v, &mut w.inputs)?;
        Ok(())
    }

    /// Where a selection's arguments start in the step inputs.
    pub(super) fn sel_at(&self) -> usize {
        3 * self.max_batch + self.pages.pages()
    }

    /// Where a batched decode step's table offsets start in the step inputs.
    pub(super) fn tab_at(&self) -> usize {
        2 * self.max_batch + self.pages.pages()
    }

    /// Upload a batched step's inputs: each row's token and position, the
    /// sequences' block tables one after another (`tables` must fit the
    /// pool's page count) with where row i's (`of[i]`) starts, then the
    /// sequences' selection arguments `sel` (`select_rows`).
    pub(super) fn upload_batch(
        &self,
        w: &mut Workspace,
        tokens: &[u32],
        pos: &[usize],
        tables: &[&[u32]],
        of: &[usize],
        sel: &[i32],
    ) -> Result<()> {
        let b = self.max_batch;
        let mut v = vec![0i32; self.sel_at()];
        // The tables one after another, and where each starts.
        let mut at = 2 * b;
        let mut starts = Vec::with_capacity(tables.len());
        for table in tables {
            starts.push((at - 2 * b) as i32);
            for &page in *table {
                v[at] = page as i32;
                at += 1;
            }
        }
        debug_assert!(at <= self.tab_at(), "the tables fit the pool's page count");
        for (i, ((&t, &p), &j)) in tokens.iter().zip(pos).zip(of).enumerate() {
            v[i] = t as i32;
            v[b + i] = p as i32;
            v[self.tab_at() + i] = starts[j];
        }
        v.extend_from_slice(sel);
        self.stream.copy_to_device(&v, &mut w.inputs)?;
        Ok(())
    }

    /// Select on the device from the logits in `w.logits` (row 0) with the
    /// arguments uploaded with the step's inputs (capturable); with row 0's
    /// token mask where they say masked ([`GpuBackend::upload_masks`]).
    pub(super) fn select(&self, w: &mut Workspace) -> Result<()> {
        let args = w.inputs.slice(self.sel_at()..w.inputs.len())?;
        let n_vocab = self.model.hparams().n_vocab;
        let words = mask_words(n_vocab);
        let rows = SelectRows {
            rows: 1,
            n_vocab,
            args_stride: args.len(),
            k_max: self.select_max_k(),
        };
        let mv = w.masks.slice(0..words)?;
        self.kernels.select_top_k_rows(
            &self.stream,
            &mut w.logits,
            &args,
            rows,
            Some(SelectMasks { masks: &mv, words }),
            SelectOut {
                out: &mut w.sel_out,
                scratch: &mut w.sel_scratch,
            },
        )?;
        Ok(())
    }

    /// Upload the token masks of rows 0.. (`masks[r]`: None leaves row r's
    /// words as they are; its arguments do not say masked), each waited
    /// for here: the host computes them while the device runs the step
    /// queued before. A mask that failed is the caller's to report (it
    /// reads the slot too); its row is left unmasked.
    pub(super) fn upload_masks(
        &self,
        w: &mut Workspace,
        masks: &[Option<&crate::MaskSlot>],
    ) -> Result<()> {
        let words = mask_words(self.model.hparams().n_vocab);
        let Some(last) = masks.iter().rposition(Option::is_some) else {
            return Ok(());
        };
        // Rows up to the last masked one, in one copy (an unmasked row's
        // words are never read).
        let mut v = vec![u32::MAX; (last + 1) * words];
        for (r, slot) in masks.iter().enumerate() {
            let Some(Ok(m)) = slot.map(|s| s.wait()) else {
                continue;
            };
            let row = &mut v[r * words..(r + 1) * words];
            row.fill(0);
            let n = m.len().min(words);
            row[..n].copy_from_slice(&m[..n]);
        }
        self.stream.copy_to_device(&v, &mut w.masks)?;
        Ok(())
    }

    /// Copy a finished selection's k ids and logit bits to `sel.out`.
    pub(super) fn fetch_selection(&self, w: &Workspace, sel: Select<'_>) -> Result<()> {
        sel.out.resize(2 * sel.k, 0);
        self.stream
            .copy_to_host(&w.sel_out.slice(0..2 * sel.k)?, sel.out)?;
        Ok(())
    }
}
