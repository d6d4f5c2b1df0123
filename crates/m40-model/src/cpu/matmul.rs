//! Matrix products directly on GGUF blocks: rows of the weight are dequantized
//! a few at a time into a small per-task buffer (L1/L2 sized, never the whole
//! matrix), then dotted with every input vector; rayon splits the rows.

use m40_gguf::quant::dequantize;
use m40_gguf::TensorView;
use rayon::prelude::*;

use super::fused;
use super::simd::{dot1, dot4};
use crate::error::Result;

/// Output rows per rayon task on the fused path.
const DECODE_ROWS: usize = 64;

/// Bytes of dequantized rows one task keeps hot.
const ROW_BUDGET: usize = 64 << 10;

/// `out[t * n_out + r] = out_t[r * n_tok + t]`: a product computed row by
/// row (each task owning a run of output rows, every token's value of
/// each) put back token by token, in tiles of rows so that both sides stay
/// in cache (a row at a time writes one value to each of `n_tok` lines).
pub fn untranspose(out_t: &[f32], n_tok: usize, n_out: usize, out: &mut [f32]) {
    const TILE: usize = 32;
    assert_eq!(out_t.len(), n_tok * n_out, "transposed product shape");
    assert_eq!(out.len(), n_tok * n_out, "product shape");
    for r0 in (0..n_out).step_by(TILE) {
        let r1 = (r0 + TILE).min(n_out);
        for (t, o) in out.chunks_exact_mut(n_out).enumerate() {
            for (r, v) in o[r0..r1].iter_mut().enumerate() {
                *v = out_t[(r0 + r) * n_tok + t];
            }
        }
    }
}

/// `out[t * n_out + r] = W[r, :] . x[t * n_in ..][..n_in]` for every token `t`
/// and output row `r` (`W` is `n_out` rows of `n_in`).
/// x: (n_tok, n_in); out: (n_tok, n_out).
pub fn matmul(w: &TensorView<'_>, x: &[f32], n_tok: usize, out: &mut [f32]) -> Result<()> {
    let n_in = w.info.row_len();
    let n_out = w.info.n_rows();
    assert_eq!(x.len(), n_tok * n_in, "matmul input shape");
    assert_eq!(out.len(), n_tok * n_out, "matmul output shape");
    if fused::supported(w.info.ty) {
        // Unpack blocks in registers. For every number of tokens, so that a
        // token's row is the same arithmetic alone or in a batch (batch
        // invariance: a sequence's output must not depend on what else
        // runs).
        let sums: Vec<Vec<f32>> = x.chunks_exact(n_in).map(fused::block_sums).collect();
        let mut out_t = vec![0f32; n_tok * n_out];
        out_t
            .par_chunks_mut(DECODE_ROWS * n_tok)
            .enumerate()
            .for_each(|(task, dst)| {
                let xt = |t: usize| &x[t * n_in..(t + 1) * n_in];
                for (r, o) in dst.chunks_exact_mut(n_tok).enumerate() {
                    let row = w.row(task * DECODE_ROWS + r);
                    // Four tokens per unpacking of the row, the rest one
                    // by one: each token's sum is the same either way.
                    let mut t = 0;
                    while t + 4 <= n_tok {
                        let xs = std::array::from_fn(|i| xt(t + i));
                        let ss = std::array::from_fn(|i| &sums[t + i][..]);
                        o[t..t + 4].copy_from_slice(&fused::dot_rows::<4>(w.info.ty, row, xs, ss));
                        t += 4;
                    }
                    for (t, o) in o.iter_mut().enumerate().skip(t) {
                        *o = fused::dot_row(w.info.ty, row, xt(t), &sums[t]);
                    }
                }
            });
        untranspose(&out_t, n_tok, n_out, out);
        return Ok(());
    }
    let rows_per_task = (ROW_BUDGET / (n_in * 4)).clamp(1, 64);
    // Transposed result: each task owns a contiguous run of rows.
    let mut out_t = if n_tok == 1 {
        Vec::new()
    } else {
        vec![0f32; n_tok * n_out]
    };
    let dst: &mut [f32] = if n_tok == 1 { out } else { &mut out_t };
    dst.par_chunks_mut(rows_per_task * n_tok)
        .enumerate()
        .try_for_each_init(
            || vec![0f32; rows_per_task * n_in],
            |scratch, (task, dst)| -> Result<()> {
                let r0 = task * rows_per_task;
                let rows = dst.len() / n_tok;
                for r in 0..rows {
                    dequantize(
                        w.info.ty,
                        w.row(r0 + r),
                        &mut scratch[r * n_in..(r + 1) * n_in],
                    )?;
                }
                let mut t = 0;
                while t + 4 <= n_tok {
                    let xs = [
                        &x[t * n_in..(t + 1) * n_in],
                        &x[(t + 1) * n_in..(t + 2) * n_in],
                        &x[(t + 2) * n_in..(t + 3) * n_in],
                        &x[(t + 3) * n_in..(t + 4) * n_in],
                    ];
                    for r in 0..rows {
                        let d = dot4(&scratch[r * n_in..(r + 1) * n_in], xs);
                        dst[r * n_tok + t..r * n_tok + t + 4].copy_from_slice(&d);
                    }
                    t += 4;
                }
                // The last tokens by the same arithmetic as four (dot1 is
                // one lane of dot4), so that no token's result depends on
                // how many share the step.
                for t in t..n_tok {
                    let xt = &x[t * n_in..(t + 1) * n_in];
                    for r in 0..rows {
                        dst[r * n_tok + t] = dot1(&scratch[r * n_in..(r + 1) * n_in], xt);
                    }
                }
                Ok(())
            },
        )?;
    if n_tok > 1 {
        untranspose(&out_t, n_tok, n_out, out);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn untranspose_puts_every_value_back() {
        for (n_tok, n_out) in [(1usize, 5usize), (3, 70), (64, 33), (7, 32)] {
            let t: Vec<f32> = (0..n_tok * n_out).map(|i| i as f32).collect();
            let mut out = vec![f32::NAN; n_tok * n_out];
            super::untranspose(&t, n_tok, n_out, &mut out);
            for tok in 0..n_tok {
                for r in 0..n_out {
                    assert_eq!(out[tok * n_out + r], t[r * n_tok + tok], "{n_tok}x{n_out}");
                }
            }
        }
    }
}
