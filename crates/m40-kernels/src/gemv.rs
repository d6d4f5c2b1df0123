//! The GEMV of a matrix in its GGUF format (kernels/gemv.cu).

use m40_device::{DeviceBuffer, DeviceView, Stream};

use crate::error::Result;
use crate::format::{gemv_chunk_blocks, gemv_shared_bytes, KernelFormat, GEMV_ROWS, GEMV_WARPS};
use crate::launch::{cfg, check_len, shape, to_i32};
use crate::layout::QMatrix;
use crate::Kernels;

/// How a GEMV launch divides the work (kernels/gemv.cu): rows in groups of
/// GEMV_ROWS, each row in chunks of `chunk_blocks` format blocks, `ksplit`
/// warps per group taking every ksplit-th chunk, and `blocks` blocks of
/// GEMV_WARPS warps looping over sets of GEMV_WARPS / ksplit groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvPlan {
    pub blocks: u32,
    pub ksplit: u32,
    pub chunk_blocks: u32,
}

impl GemvPlan {
    /// The plan for a `nrows` x `ncols` matrix of format `f` on a GPU that
    /// holds `resident` GEMV blocks at once. `ksplit` forces a split (it is
    /// lowered to what the row's chunks allow); None picks the one that
    /// finishes in the fewest rounds of chunks, counting a partly filled
    /// wave of blocks as a full one (the smaller split on ties).
    pub fn new(
        f: &KernelFormat,
        nrows: usize,
        ncols: usize,
        resident: usize,
        ksplit: Option<u32>,
    ) -> GemvPlan {
        let nb = ncols.div_ceil(f.qk).max(1);
        let most = gemv_chunk_blocks(f);
        // Even chunks: as few as the cap allows, blocks spread evenly over
        // them (a multiple of 8 where lanes take 8 blocks per round).
        let align = if f.subs == 8 { 1 } else { 8 };
        let cb = nb
            .div_ceil(nb.div_ceil(most))
            .next_multiple_of(align)
            .min(most);
        let n_chunks = nb.div_ceil(cb);
        let groups = nrows.div_ceil(GEMV_ROWS).max(1);
        let resident = resident.max(1);
        let warps = GEMV_WARPS as usize;
        let sets = |k: usize| groups.div_ceil(warps / k);
        let cost = |k: usize| sets(k).div_ceil(resident) * n_chunks.div_ceil(k);
        let allowed = |k: usize| k <= n_chunks;
        let k = match ksplit {
            Some(k) => [4, 2, 1]
                .into_iter()
                .find(|&c| c <= k as usize && allowed(c))
                .unwrap_or(1),
            None => [1, 2, 4]
                .into_iter()
                .filter(|&k| allowed(k))
                .min_by_key(|&k| cost(k))
                .unwrap_or(1),
        };
        GemvPlan {
            blocks: sets(k).min(resident) as u32,
            ksplit: k as u32,
            chunk_blocks: cb as u32,
        }
    }
}

impl Kernels {
    /// y = W x for one vector: W (rows, cols); x (cols) FP32, starting
    /// 16-byte aligned; y (rows) FP32.
    pub fn gemv(
        &self,
        stream: &Stream,
        w: &QMatrix<'_>,
        x: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        self.gemv_split(stream, w, x, y, None).map(|_| ())
    }

    /// [`Kernels::gemv`] with a forced split of each row's chunks over
    /// `ksplit` warps (benches compare them); returns the plan launched.
    pub fn gemv_split(
        &self,
        stream: &Stream,
        w: &QMatrix<'_>,
        x: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        ksplit: Option<u32>,
    ) -> Result<GemvPlan> {
        const K: &str = "gemv";
        let (ty, nrows, ncols) = (w.ty, w.rows, w.cols);
        let w = w.data;
        let f = KernelFormat::of(ty, K)?;
        let row_bytes = f.row_bytes(ncols, K)?;
        if nrows == 0 {
            return Ok(GemvPlan {
                blocks: 0,
                ksplit: 1,
                chunk_blocks: 0,
            });
        }
        check_len(K, "weights", w.len(), nrows * row_bytes)?;
        to_i32(K, "row bytes", row_bytes)?;
        check_len(K, "x", x.len(), ncols)?;
        check_len(K, "y", y.len(), nrows)?;
        if !x.is_aligned(16) {
            return Err(shape(K, "x must start at a multiple of 16 bytes".into()));
        }
        if !w.is_aligned(2) {
            return Err(shape(K, "weights must start at an even byte offset".into()));
        }
        self.check_shared(K, gemv_shared_bytes(&f))?;
        let kernel = self.kernel("gemv", f.gemv)?;
        let resident = self.resident_blocks(&kernel, 32 * GEMV_WARPS, 0)?;
        let plan = GemvPlan::new(&f, nrows, ncols, resident, ksplit);
        let grid = (plan.blocks, 1, 1);
        let (cb, ks) = (plan.chunk_blocks as i32, plan.ksplit as i32);
        let (nrows, ncols, row_bytes) = (
            to_i32(K, "nrows", nrows)?,
            to_i32(K, "ncols", ncols)?,
            row_bytes as i64,
        );
        // SAFETY: gemv_<fmt>_f32(const u8* W, const float* x, float* y, int nrows,
        // int ncols, long long row_bytes, int cb, int ksplit): reads rows < nrows
        // of W (up to 15 bytes past a row's end, inside the buffer's TAIL_SLACK
        // or the next row) and x[..ncols] with 16-byte loads (alignment
        // checked), and writes y[r] for r < nrows; lengths checked above; the
        // plan keeps 1 <= cb <= GemvChunk::BLOCKS and ksplit in {1, 2, 4}, at
        // most the chunks per row.
        unsafe {
            stream
                .launch(&kernel)
                .view(w)
                .view(x)
                .buf_mut(y)
                .scalar(&nrows)
                .scalar(&ncols)
                .scalar(&row_bytes)
                .scalar(&cb)
                .scalar(&ks)
                .run(cfg(grid, 32 * GEMV_WARPS))?
        };
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_SHARED_PER_BLOCK;
    use m40_gguf::GgmlType;

    /// Every plan covers each row with chunks the kernel can stage, splits
    /// rows only as far as they have chunks, and launches 1..=resident blocks;
    /// a GPU starved of row groups gets split rows.
    #[test]
    fn gemv_plans_are_within_the_kernel_limits() {
        for f in KernelFormat::ALL {
            for rows in [1, 3, 4, 5, 1000, 4096, 4099, 14336] {
                for cols in [f.qk, 3 * f.qk, 4096, 14336, 65 * f.qk] {
                    for resident in [1, 96, 660] {
                        for ksplit in [None, Some(1), Some(2), Some(4), Some(3)] {
                            let p = GemvPlan::new(&f, rows, cols, resident, ksplit);
                            let nb = cols.div_ceil(f.qk);
                            let cb = p.chunk_blocks as usize;
                            let n_chunks = nb.div_ceil(cb);
                            let what = format!("{} {rows}x{cols} on {resident}: {p:?}", f.ty);
                            assert!(cb >= 1 && cb <= gemv_chunk_blocks(&f), "{what}");
                            assert!([1, 2, 4].contains(&p.ksplit), "{what}");
                            assert!(p.ksplit as usize <= n_chunks, "{what}");
                            if let Some(k) = ksplit {
                                assert!(p.ksplit <= k, "{what}");
                            }
                            assert!(p.blocks >= 1 && p.blocks as usize <= resident, "{what}");
                        }
                    }
                }
            }
        }
        let q4 = KernelFormat::of(GgmlType::Q4_0, "test").unwrap();
        // 1024 row groups on 660 resident blocks of 4 warps: split in two.
        assert_eq!(GemvPlan::new(&q4, 4096, 14336, 660, None).ksplit, 2);
        // Enough groups on a small GPU: no split.
        assert_eq!(GemvPlan::new(&q4, 4096, 4096, 96, None).ksplit, 1);
        // Q4_0 rows of 4096: 128 blocks in 3 even chunks of 48 (a multiple of 8).
        assert_eq!(GemvPlan::new(&q4, 1, 4096, 1, None).chunk_blocks, 48);
    }

    /// The launchers' shared-memory figures match what ptxas reported for the
    /// committed PTX, and all fit in 48 KB.
    #[test]
    fn gemv_shared_memory_matches_ptxas_report() {
        let report = include_str!("../ptx/gemv.sm_52.txt");
        for f in KernelFormat::ALL {
            let name = f.gemv;
            let at = report
                .find(&format!("Function properties for {name}\n"))
                .unwrap_or_else(|| panic!("{name} missing from the report"));
            let line = report[at..].lines().nth(2).expect("resource line");
            let smem: usize = line
                .split(", ")
                .find_map(|p| p.strip_suffix(" bytes smem"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no smem figure in {line:?}"));
            assert_eq!(smem, gemv_shared_bytes(&f), "{name}");
            assert!(smem <= MAX_SHARED_PER_BLOCK, "{name}");
        }
    }
}
