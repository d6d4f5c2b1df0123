//! Token selection on the device (kernels/sample.cu): the sampling penalties
//! and the k highest logits, so a decode step returns k candidates, not the
//! vocabulary.

use m40_device::{DeviceBuffer, DeviceView, Stream};

use crate::error::Result;
use crate::ops::{cfg, check_len, shape, to_i32};
use crate::Kernels;

/// The most candidates one selection returns (`SAMPLE_MAX_K`).
pub const SELECT_MAX_K: usize = 1024;
/// Threads of the selection block (`SAMPLE_THREADS`).
const SAMPLE_THREADS: u32 = 1024;

/// llama.cpp's penalties, as the CPU sampler applies them: a logit l of a
/// token seen c times in the window becomes (l > 0 ? l / repeat : l *
/// repeat) - (c * frequency + presence).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    pub repeat: f32,
    pub frequency: f32,
    pub presence: f32,
}

impl Kernels {
    /// Penalize `logits[..n_vocab]` in place for the tokens of `pen`
    /// ((id, count) pairs, ids distinct; `n_pen` of them), then write the
    /// `k` highest logits, sorted (logit descending, id ascending on ties;
    /// IEEE total order): their ids to `out[..k]` and the bits of their
    /// logits to `out[k..2k]` (one buffer, one copy). k = 1 is argmax.
    #[allow(clippy::too_many_arguments)]
    pub fn select_top_k(
        &self,
        stream: &Stream,
        logits: &mut DeviceBuffer<f32>,
        n_vocab: usize,
        pen: &DeviceView<'_, i32>,
        n_pen: usize,
        p: Penalties,
        k: usize,
        out: &mut DeviceBuffer<i32>,
    ) -> Result<()> {
        const K: &str = "select_top_k_f32";
        if k == 0 || k > SELECT_MAX_K || k > n_vocab {
            return Err(shape(
                K,
                format!("k = {k}: must be 1 ..= {SELECT_MAX_K} and at most the {n_vocab} tokens"),
            ));
        }
        check_len(K, "logits", logits.len(), n_vocab)?;
        check_len(K, "penalties", pen.len(), 2 * n_pen)?;
        check_len(K, "out", out.len(), 2 * k)?;
        let kernel = self.kernel("sample", K)?;
        let (nv, np, ki) = (
            to_i32(K, "n_vocab", n_vocab)?,
            to_i32(K, "n_pen", n_pen)?,
            k as i32,
        );
        // SAFETY: select_top_k_f32(float* logits, int n_vocab, const int* pen, int n_pen,
        // float repeat, float freq, float presence, int k, int* out_ids, float* out_logits):
        // one block reads and writes logits[..n_vocab], reads pen[..2*n_pen], writes
        // out_ids[..k] and out_logits[..k] (k <= SAMPLE_MAX_K, the shared arrays);
        // lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(logits)
                .scalar(&nv)
                .view(pen)
                .scalar(&np)
                .scalar(&p.repeat)
                .scalar(&p.frequency)
                .scalar(&p.presence)
                .scalar(&ki)
                .buf_mut(out)
                .run(cfg((1, 1, 1), SAMPLE_THREADS))?
        };
        Ok(())
    }
}
