//! An encoder's kernels (kernels/encoder.cu): attention over every key of
//! a token's sequence, and bert's ungated GELU.

use m40_device::{DeviceBuffer, DeviceView, Stream};

use crate::error::Result;
use crate::launch::{cfg, check_len, shape, to_i32};
use crate::layout::KV_PAGE;
use crate::Kernels;

/// Threads per block of kernels/encoder.cu (`ENC_THREADS`).
const ENC_THREADS: u32 = 128;
/// Keys a sequence may have in [`Kernels::attention_encoder`]
/// (`ENC_MAX_KEYS`: its scores are in shared memory).
pub const ENC_MAX_KEYS: usize = 2048;
/// The largest head dimension it takes (`qs` in shared memory).
const ENC_MAX_HEAD_DIM: usize = 256;

/// What [`Kernels::attention_encoder`] reads: the step's queries, a layer's
/// pools, the block tables, each row's table start and position.
pub struct EncAttnInputs<'x, 'v> {
    pub q: &'x DeviceView<'v, f32>,
    pub kpool: &'x DeviceView<'v, u16>,
    pub vpool: &'x DeviceView<'v, u16>,
    pub table: &'x DeviceView<'v, i32>,
    pub tab: &'x DeviceView<'v, i32>,
    pub pos: &'x DeviceView<'v, i32>,
}

/// The heads of [`Kernels::attention_encoder`].
#[derive(Clone, Copy, Debug)]
pub struct EncHeads {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
}

impl Kernels {
    /// out (n_tok, n_head * hd) = softmax(scale q k^T) v with each token
    /// attending to every key of its own sequence (an encoder's attention,
    /// not causal). The step's `n_tok` rows are whole sequences, each at
    /// positions 0, 1, ... (`pos`), whose keys and values are already in the
    /// pools; row r's block table starts at `table[tab[r]]`. A sequence
    /// has at most [`ENC_MAX_KEYS`] tokens (checked on the host only
    /// through `pos`'s length: the caller's sequences are at most its step).
    pub fn attention_encoder(
        &self,
        stream: &Stream,
        h: EncHeads,
        inputs: &EncAttnInputs<'_, '_>,
        n_tok: usize,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "attn_enc_f32";
        if n_tok == 0 {
            return Ok(());
        }
        if n_tok > ENC_MAX_KEYS {
            return Err(shape(
                K,
                format!("{n_tok} tokens: a step of at most {ENC_MAX_KEYS}"),
            ));
        }
        let hd = h.head_dim;
        if hd == 0 || hd > ENC_MAX_HEAD_DIM {
            return Err(shape(K, format!("head dimension {hd} (1 to 256)")));
        }
        if h.n_head_kv == 0 || !h.n_head.is_multiple_of(h.n_head_kv) {
            return Err(shape(
                K,
                format!("{} query heads over {} KV heads", h.n_head, h.n_head_kv),
            ));
        }
        let rows = n_tok * h.n_head * hd;
        check_len(K, "q", inputs.q.len(), rows)?;
        check_len(K, "out", out.len(), rows)?;
        check_len(K, "pos", inputs.pos.len(), n_tok)?;
        check_len(K, "tab", inputs.tab.len(), n_tok)?;
        check_len(K, "vpool", inputs.vpool.len(), inputs.kpool.len())?;
        let kv_dim = h.n_head_kv * hd;
        if !inputs.kpool.len().is_multiple_of(KV_PAGE * kv_dim) {
            return Err(shape(K, "pools of whole pages".into()));
        }
        let grid = (
            to_i32(K, "tokens", n_tok)? as u32,
            to_i32(K, "heads", h.n_head)? as u32,
            1,
        );
        if h.n_head > 65535 {
            return Err(shape(K, format!("{} heads (max 65535)", h.n_head)));
        }
        let kernel = self.kernel("encoder", K)?;
        let (n, nh, nkv, hd) = (n_tok as i32, h.n_head as i32, h.n_head_kv as i32, hd as i32);
        // SAFETY: attn_enc_f32(const float* q, const u16* kpool, const u16* vpool,
        // const int* table, const int* tab, const int* pos, float* out, int n_tok,
        // int n_head, int n_head_kv, int hd, float scale): block (r, h) reads q and
        // writes out at row r, head h (lengths checked), and reads the pools at the
        // pages of row r's sequence through its table (the caller's sequences are
        // in the pools, their tables in `table`).
        unsafe {
            stream
                .launch(&kernel)
                .view(inputs.q)
                .view(inputs.kpool)
                .view(inputs.vpool)
                .view(inputs.table)
                .view(inputs.tab)
                .view(inputs.pos)
                .buf_mut(out)
                .scalar(&n)
                .scalar(&nh)
                .scalar(&nkv)
                .scalar(&hd)
                .scalar(&h.scale)
                .run(cfg(grid, ENC_THREADS))?
        };
        Ok(())
    }

    /// x = gelu(x) (tanh approximation) over the first `n` elements.
    pub fn gelu(&self, stream: &Stream, x: &mut DeviceBuffer<f32>, n: usize) -> Result<()> {
        const K: &str = "gelu_f32";
        check_len(K, "x", x.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let kernel = self.kernel("encoder", K)?;
        let grid = (self.flat_grid(n), 1, 1);
        let n = n as i64;
        // SAFETY: gelu_f32(float* x, long long n), grid-stride over i < n; the
        // length is checked above.
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(x)
                .scalar(&n)
                .run(cfg(grid, ENC_THREADS))?
        };
        Ok(())
    }
}
