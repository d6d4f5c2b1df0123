//! The routers of kernels/moe.cu: an F32 router of few rows a block a row,
//! for one token (`moe_router_f32`, with the FFN norm and the routing in
//! its launch) and for several (`moe_router_n_f32`).

use m40_device::{DeviceBuffer, DeviceView, Stream};

use crate::error::Result;
use crate::launch::{cfg, check_len, shape, to_i32};
use crate::layout::QMatrix;
use crate::Kernels;

/// The FFN norm [`Kernels::moe_router`] computes for the experts: x's
/// RMSNorm times `weight` into `h`.
pub struct RouterNorm<'a, 'v> {
    pub weight: &'a DeviceView<'v, f32>,
    pub eps: f32,
    pub h: &'a mut DeviceBuffer<f32>,
}

/// The routing [`Kernels::moe_router`]'s last block does: `k` experts'
/// ids and weights from the logits plus `bias` (gpt-oss), counted in
/// `done` (one u32, zero before the first launch; each launch leaves it
/// zero).
pub struct RouterRoute<'a, 'v> {
    pub done: &'a mut DeviceBuffer<u32>,
    pub bias: Option<&'a DeviceView<'v, f32>>,
    pub ids: &'a mut DeviceBuffer<i32>,
    pub w: &'a mut DeviceBuffer<f32>,
    pub k: usize,
}

/// Rows at most of a router [`Kernels::moe_router`] takes (a block each).
pub const MOE_ROUTER_MAX_ROWS: usize = 1024;

/// Tokens a block of moe_router_n_f32 takes (`MOE_ROUTER_TOKENS`).
pub const MOE_ROUTER_TOKENS: usize = 8;

/// Threads per block of moe_router_f32 (`MOE_ROUTER_THREADS`).
pub(super) const MOE_ROUTER_THREADS: u32 = 128;

impl Kernels {
    /// Whether [`Self::moe_router`] takes `w`: F32, at most
    /// [`MOE_ROUTER_MAX_ROWS`] rows of a multiple of 4, 16-byte aligned.
    pub fn moe_router_takes(&self, w: &QMatrix<'_>) -> bool {
        w.ty == m40_gguf::GgmlType::F32
            && (1..=MOE_ROUTER_MAX_ROWS).contains(&w.rows)
            && w.cols > 0
            && w.cols.is_multiple_of(4)
            && w.data.is_aligned(16)
    }

    /// `kernel`'s refusal of a router `moe_router_takes` does not take, or
    /// of too few bytes for its shape.
    fn router_check(&self, kernel: &'static str, w: &QMatrix<'_>) -> Result<()> {
        if !self.moe_router_takes(w) {
            return Err(shape(
                kernel,
                format!(
                    "a {} router of {} x {} (F32, at most {MOE_ROUTER_MAX_ROWS} rows of a multiple of 4, 16-byte aligned)",
                    w.ty, w.rows, w.cols
                ),
            ));
        }
        check_len(kernel, "weights", w.data.len(), w.rows * w.cols * 4)
    }

    /// y (w.rows) = W x for one token through an F32 router (at most
    /// [`MOE_ROUTER_MAX_ROWS`] rows, a row length that is a multiple of 4,
    /// W and x 16-byte aligned): a block a row, so a router of 32 or 128
    /// rows is not the 8 latency-bound blocks the GEMV of GGUF rows gives
    /// it. With `norm`, x is the residual row and the router reads its
    /// RMSNorm (also written to `norm.h` for the experts); with `route`, the
    /// last block routes the token as [`Self::moe_route`] does (the
    /// experts: w.rows). Each is a launch fewer.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_router(
        &self,
        stream: &Stream,
        w: &QMatrix<'_>,
        x: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        norm: Option<RouterNorm<'_, '_>>,
        route: Option<RouterRoute<'_, '_>>,
    ) -> Result<()> {
        const K: &str = "moe_router_f32";
        self.router_check(K, w)?;
        check_len(K, "x", x.len(), w.cols)?;
        check_len(K, "y", y.len(), w.rows)?;
        if !x.is_aligned(16) {
            return Err(shape(K, "x must start at a multiple of 16 bytes".into()));
        }
        if let Some(n) = &norm {
            check_len(K, "norm weights", n.weight.len(), w.cols)?;
            check_len(K, "h", n.h.len(), w.cols)?;
            if !n.weight.is_aligned(16) {
                return Err(shape(
                    K,
                    "norm weights must start at a multiple of 16 bytes".into(),
                ));
            }
        }
        let k = match &route {
            Some(r) => {
                if r.k == 0 || r.k > w.rows {
                    return Err(shape(K, format!("{} of {} experts", r.k, w.rows)));
                }
                check_len(K, "done", r.done.len(), 1)?;
                check_len(K, "ids", r.ids.len(), r.k)?;
                check_len(K, "w", r.w.len(), r.k)?;
                if let Some(b) = r.bias {
                    check_len(K, "bias", b.len(), w.rows)?;
                }
                to_i32(K, "k", r.k)?
            }
            None => 0,
        };
        let kernel = self.kernel("moe", K)?;
        let ncols = to_i32(K, "ncols", w.cols)?;
        let eps = norm.as_ref().map_or(0.0f32, |n| n.eps);
        // SAFETY: moe_router_f32(const float* W, const float* x, float* y,
        // int ncols, const float* nw, float eps, float* h, unsigned* done,
        // const float* bias, int* ids, float* wts, int K): block r < rows
        // reads W[r ncols..][..ncols], x[..ncols] and nw[..ncols] as float4s
        // (16-byte aligned, ncols a multiple of 4: checked; h a buffer's
        // start) and writes y[r]; block 0 writes h[..ncols]; the last block
        // reads y[..rows] and bias[..rows] and writes ids[..K] and wts[..K],
        // done one counter (zero before and after, set by the caller once);
        // null pointers for what is not given; lengths checked above.
        unsafe {
            let l = stream
                .launch(&kernel)
                .view(w.data)
                .view(x)
                .buf_mut(y)
                .scalar(&ncols);
            let l = match norm {
                Some(n) => l.view(n.weight).scalar(&eps).buf_mut(n.h),
                None => l.null().scalar(&eps).null(),
            };
            let l = match route {
                Some(r) => {
                    let l = l.buf_mut(r.done);
                    let l = match r.bias {
                        Some(b) => l.view(b),
                        None => l.null(),
                    };
                    l.buf_mut(r.ids).buf_mut(r.w)
                }
                None => l.null().null().null().null(),
            };
            l.scalar(&k)
                .run(cfg((w.rows as u32, 1, 1), MOE_ROUTER_THREADS))?
        };
        Ok(())
    }

    /// y (n, w.rows) = x W^T for `n` tokens x (n, w.cols) through an F32
    /// router [`Self::moe_router`] takes (`moe_router_takes`): a block a
    /// row and [`MOE_ROUTER_TOKENS`] tokens, each float4 of W loaded once for
    /// them; no norm, no routing (a step of several tokens norms before and
    /// routes with [`Self::moe_route`]).
    pub fn moe_router_tokens(
        &self,
        stream: &Stream,
        w: &QMatrix<'_>,
        x: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        n: usize,
    ) -> Result<()> {
        const K: &str = "moe_router_n_f32";
        self.router_check(K, w)?;
        check_len(K, "x", x.len(), n * w.cols)?;
        check_len(K, "y", y.len(), n * w.rows)?;
        if !x.is_aligned(16) {
            return Err(shape(K, "x must start at a multiple of 16 bytes".into()));
        }
        if n == 0 {
            return Ok(());
        }
        let chunks = to_i32(K, "tokens", n.div_ceil(MOE_ROUTER_TOKENS))?;
        if chunks > 65_535 {
            return Err(shape(K, format!("{n} tokens")));
        }
        let kernel = self.kernel("moe", K)?;
        let (ncols, nt) = (to_i32(K, "ncols", w.cols)?, to_i32(K, "tokens", n)?);
        // SAFETY: moe_router_n_f32(const float* W, const float* x, float* y,
        // int ncols, int n): block (r, c), r < rows, c < ceil(n / T), reads
        // W[r ncols..][..ncols] and x[t ncols..][..ncols] for its tokens t <
        // n as float4s (16-byte aligned, ncols a multiple of 4: checked) and
        // writes y[t rows + r]; lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .view(w.data)
                .view(x)
                .buf_mut(y)
                .scalar(&ncols)
                .scalar(&nt)
                .run(cfg((w.rows as u32, chunks as u32, 1), MOE_ROUTER_THREADS))?
        };
        Ok(())
    }
}
