//! The matmul routing of a step: which kernels compute which of its rows
//! (the packed GEMV, the GEMV of GGUF rows, the GEMM's tiles).

use m40_kernels::{gemm_plan, GemmOpts, GemvOpts, GemvOut, RowSplit};

use super::residual::Input;
use super::tuning::{GEMV_FILL_TOKENS, GEMV_MAX_TOKENS, GEMV_TAIL, GEMV_TAIL_LAUNCH, GEMV_TOKENS};
use super::weights::{Mat, MatView};
use super::{lock, GpuBackend};
use crate::error::Result;

/// The GEMM tiles' tokens (m40-kernels' narrow and large tiles: 32 and 64
/// rows).
const NARROW_ROWS: usize = 32;
const LARGE_ROWS: usize = 64;

/// Of a packed GEMM's `n` rows, those that the GEMV computes after the
/// GEMM's full tiles: past 32 rows (the narrow tile) up to 64, or past a
/// multiple of 64 (the large tile), where they are at most GEMV_TAIL. A
/// tile computes all of its rows whatever the step holds, so a step of 33
/// rows cost the 64-row tile's time, and one of 65 two large tiles'; the
/// GEMV's cost grows with its rows from one pass over the weights.
/// BENCHMARKS.md, issue 33, "Rows past the last full tile".
pub(super) fn gemv_tail(n: usize) -> usize {
    let past = match n {
        0..=NARROW_ROWS => 0,
        _ if n <= LARGE_ROWS => n - NARROW_ROWS,
        _ => n % LARGE_ROWS,
    };
    if past <= GEMV_TAIL {
        past
    } else {
        0
    }
}

impl GpuBackend {
    /// y = W x for `n` rows of x into the parts of `y` (several: a stacked
    /// matrix, always packed), or y += W x with `accumulate` (one part):
    /// the GEMV where `gemv_takes` says, the GEMM otherwise, packed
    /// weights' rows past its last full tile through the GEMV
    /// (`gemv_tail`).
    pub(super) fn gemm_or_gemv(
        &self,
        w: &Mat,
        x: Input<'_>,
        y: RowSplit<'_, '_>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let (k, s) = (&self.kernels, &self.stream);
        let data = w.data.view();
        debug_assert!(
            w.packed || n > 1 || !accumulate,
            "the row GEMV does not accumulate"
        );
        if let (MatView::Packed(m), true) = (w.view(&data), self.gemv_takes(w, n)) {
            let (x, fold) = self.fold_in(x);
            let out = match y.bufs {
                [y] if accumulate => GemvOut::Add(y),
                _ => GemvOut::Parts(y),
            };
            let opts = GemvOpts {
                m: n,
                ksplit: None,
                fold,
            };
            k.gemv_packed_to(s, &m, x, out, opts)?;
            return Ok(());
        }
        let Input::Rows(x) = x else {
            unreachable!("a folded norm goes to packed GEMVs only (see `folds`)")
        };
        let mut part = lock(&self.gemm_part);
        match w.view(&data) {
            MatView::Packed(m) => {
                // The GEMM's full tiles, then the rows past them through
                // the GEMV (`gemv_tail`).
                let tail = gemv_tail(n);
                k.gemm_packed_split(
                    s,
                    &m,
                    x,
                    RowSplit {
                        bufs: &mut *y.bufs,
                        rows: y.rows,
                    },
                    n - tail,
                    GemmOpts {
                        accumulate,
                        scratch: Some(&mut part),
                        splits: None,
                        tile: None,
                    },
                )?;
                for first in (n - tail..n).step_by(GEMV_TAIL_LAUNCH) {
                    let out = match &mut *y.bufs {
                        [y] if accumulate => GemvOut::Add(y),
                        bufs => GemvOut::Parts(RowSplit { bufs, rows: y.rows }),
                    };
                    let rows = GEMV_TAIL_LAUNCH.min(n - first);
                    k.gemv_packed_rows(s, &m, x, out, first, rows)?;
                }
            }
            MatView::Rows(m) => {
                let [y] = y.bufs else {
                    unreachable!("only packed matrices are stacked")
                };
                if n == 1 {
                    k.gemv(s, &m, x, y)?
                } else {
                    k.gemm(
                        s,
                        &m,
                        x,
                        y,
                        n,
                        GemmOpts {
                            accumulate,
                            scratch: Some(&mut part),
                            splits: None,
                            tile: None,
                        },
                    )?
                }
            }
        }
        Ok(())
    }

    /// Whether `n` rows of x go through `w`'s GEMV: one row; packed, up to
    /// GEMV_TOKENS, or up to GEMV_MAX_TOKENS where the GEMM would launch
    /// fewer blocks than the GPU has SMs (from 33 tokens, than half of
    /// them): a small model's matrices on a large GPU. On an H200,
    /// SmolLM2's decode steps of 32 sequences took 5.2 ms through the
    /// GEMM's 24 blocks; on an H100, a 1B's steps of 64 ran 10% slower
    /// through the GEMV where its GEMM has ~120 blocks (BENCHMARKS.md).
    pub(super) fn gemv_takes(&self, w: &Mat, n: usize) -> bool {
        if !w.packed {
            return n == 1;
        }
        let few = || {
            let p = gemm_plan(n, w.rows, w.cols, self.gemm_slots);
            let sms = self.gemm_slots.sms;
            p.blocks(n, w.rows) < if n <= GEMV_FILL_TOKENS { sms } else { sms / 2 }
        };
        n <= GEMV_TOKENS || (n <= GEMV_MAX_TOKENS && few())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gemv_takes_few_rows_past_the_last_full_tile() {
        // Up to the narrow tile: the GEMM alone.
        for n in [2, 25, 32] {
            assert_eq!(gemv_tail(n), 0, "{n}");
        }
        // 33 to 48: the narrow tile's 32, the rest through the GEMV; 49 to
        // 64: the large tile.
        assert_eq!(gemv_tail(33), 1);
        assert_eq!(gemv_tail(48), 16);
        assert_eq!(gemv_tail(49), 0);
        assert_eq!(gemv_tail(64), 0);
        // Past whole large tiles.
        assert_eq!(gemv_tail(65), 1);
        assert_eq!(gemv_tail(80), 16);
        assert_eq!(gemv_tail(81), 0);
        assert_eq!(gemv_tail(128), 0);
        assert_eq!(gemv_tail(512 + 7), 7);
    }
}
