//! Mixture-of-experts kernels (kernels/moe.cu, and gemv.cu's
//! `gemv_id_*`): the router's choice of experts, their GEMVs, the
//! weighted sum of their outputs.

use m40_device::{DeviceBuffer, DeviceView, Stream};

use crate::elementwise::{act_id, ELEMENTWISE_THREADS};
use crate::error::Result;
use crate::format::{gemv_shared_bytes, KernelFormat, GEMV_WARPS};
use crate::gemv::GemvPlan;
use crate::launch::{cfg, check_len, shape, to_i32};
use crate::layout::QMatrix;
use crate::Kernels;

mod router;
pub use router::{RouterNorm, RouterRoute, MOE_ROUTER_MAX_ROWS, MOE_ROUTER_TOKENS};

/// Warps (tokens) per block of moe_route_f32 (`MOE_WARPS`), and the most
/// experts it takes (32 lanes x `MOE_MAX_PER_LANE`).
const MOE_WARPS: u32 = 4;
pub const MOE_MAX_EXPERTS: usize = 32 * 32;

/// The gate activation and gate/up biases of the experts' GEMV over
/// interleaved gate and up matrices ([`Kernels::gemv_experts`]).
#[derive(Clone, Copy)]
pub struct ExpertGlu<'a, 'v> {
    pub act: m40_gguf::hparams::Activation,
    /// The experts' gate and up biases, (n_expert, rows / 2) each.
    pub bias: Option<[&'a DeviceView<'v, f32>; 2]>,
}

/// Threads per block of moe_combine_fold_f32 (`MOE_FOLD_THREADS`).
const MOE_FOLD_THREADS: u32 = 256;

/// The norm [`Kernels::moe_combine_fold`] folds: its weight, and where h
/// and the partial sums of squares go.
pub struct CombineFold<'a, 'b> {
    pub weight: &'a DeviceView<'a, f32>,
    pub h: &'b mut DeviceBuffer<f32>,
    pub part: &'b mut DeviceBuffer<f32>,
}

/// A mixture's step: `n` tokens, each taking `k` of the experts.
#[derive(Clone, Copy, Debug)]
pub struct MoeShape {
    pub n: usize,
    pub k: usize,
}

/// The threads of [`Kernels::moe_tiles`]'s one block
/// (`MOE_TILES_THREADS`: the most experts).
const MOE_TILES_THREADS: usize = 1024;

/// Slots a tile holds at most for the grouped GEMVs
/// ([`Kernels::gemv_packed_experts`]: their widest kernel takes 8 tokens).
pub const MOE_GEMV_TILE: usize = 8;

/// The most tiles [`Kernels::moe_tiles`] makes of `slots` slots over
/// `n_expert` experts in tiles of at most `cap`: each of at most
/// min(n_expert, slots) chosen experts with c slots makes ceil(c / cap) <=
/// (c + cap - 1) / cap tiles.
pub fn moe_tile_bound(slots: usize, n_expert: usize, cap: usize) -> usize {
    let cap = cap.max(1);
    (slots + (cap - 1) * n_expert.min(slots)) / cap
}

/// A step's slots grouped by expert on the device ([`Kernels::moe_tiles`]),
/// for [`Kernels::gemv_packed_experts`] and [`Kernels::gemm_packed_experts`]:
/// `order` the slots sorted by expert, `tiles` their count and each tile's
/// first sorted position and slots (1 + 2 [`moe_tile_bound`] entries), in
/// tiles of at most `cap` slots.
#[derive(Clone, Copy)]
pub struct ExpertTiles<'a, 'v> {
    pub order: &'a DeviceView<'v, i32>,
    pub tiles: &'a DeviceView<'v, i32>,
    pub cap: usize,
}

impl Kernels {
    /// The `ids.len()` slots' experts (of `n_expert`, at most 1024; ids
    /// outside them clamped in) grouped on the device: `order` gets the
    /// slots sorted by expert (stable), `tiles` the tiles of up to `cap`
    /// slots of one expert, each expert's slots split as evenly as can be, the
    /// experts of one slot last (kernels/moe.cu `moe_tiles_i32`). One
    /// launch of one block, nothing read on the host: capturable. With
    /// `seen` (a buffer and an index in it), the number of experts with a
    /// slot is added to that entry.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_tiles(
        &self,
        stream: &Stream,
        ids: &DeviceView<'_, i32>,
        n_expert: usize,
        cap: usize,
        order: &mut DeviceBuffer<i32>,
        tiles: &mut DeviceBuffer<i32>,
        seen: Option<(&mut DeviceBuffer<u64>, usize)>,
    ) -> Result<()> {
        const K: &str = "moe_tiles_i32";
        let slots = ids.len();
        if n_expert == 0 || n_expert > MOE_TILES_THREADS {
            return Err(shape(
                K,
                format!("{n_expert} experts (at most {MOE_TILES_THREADS})"),
            ));
        }
        if cap == 0 || cap > 1 << 16 {
            return Err(shape(K, format!("tiles of {cap} slots")));
        }
        check_len(K, "order", order.len(), slots)?;
        check_len(
            K,
            "tiles",
            tiles.len(),
            1 + 2 * moe_tile_bound(slots, n_expert, cap),
        )?;
        let kernel = self.kernel("moe", K)?;
        let (n, e, cap) = (to_i32(K, "slots", slots)?, n_expert as i32, cap as i32);
        let seen = match seen {
            Some((buf, at)) => {
                check_len(K, "seen", buf.len(), at + 1)?;
                Some(buf.device_ptr(stream).offset(at * 8))
            }
            None => None,
        };
        // SAFETY: moe_tiles_i32(const int* ids, int* order, int* tiles, int
        // slots, int E, int cap, unsigned long long* seen): one block of
        // MOE_TILES_THREADS (>= E, checked) reads ids[..slots], writes
        // order[..slots] (a permutation of 0..slots) and tiles[0] and
        // tiles[1..1 + 2 T], T <= moe_tile_bound (lengths checked above),
        // and adds to the one u64 at seen (within its buffer) or null.
        unsafe {
            let l = stream
                .launch(&kernel)
                .view(ids)
                .buf_mut(order)
                .buf_mut(tiles)
                .scalar(&n)
                .scalar(&e)
                .scalar(&cap);
            match &seen {
                Some(p) => l.ptr(p),
                None => l.null(),
            }
            .run(cfg((1, 1, 1), MOE_TILES_THREADS as u32))?
        };
        Ok(())
    }

    /// Each of `s.n` tokens' experts from its router logits (n, n_expert):
    /// softmax, the `s.k` most probable (ties: the lower index) into ids
    /// (n, k) in order, their probabilities renormalized to sum 1 into w
    /// (n, k). As m40-model's CPU `route`; the logits plus `bias`
    /// (n_expert: gpt-oss's) where given.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_route(
        &self,
        stream: &Stream,
        logits: &DeviceView<'_, f32>,
        bias: Option<&DeviceView<'_, f32>>,
        n_expert: usize,
        s: MoeShape,
        ids: &mut DeviceBuffer<i32>,
        w: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "moe_route_f32";
        if n_expert == 0 || n_expert > MOE_MAX_EXPERTS || s.k == 0 || s.k > n_expert {
            return Err(shape(
                K,
                format!("{} of {n_expert} experts (at most {MOE_MAX_EXPERTS})", s.k),
            ));
        }
        check_len(K, "logits", logits.len(), s.n * n_expert)?;
        if let Some(b) = bias {
            check_len(K, "bias", b.len(), n_expert)?;
        }
        check_len(K, "ids", ids.len(), s.n * s.k)?;
        check_len(K, "w", w.len(), s.n * s.k)?;
        if s.n == 0 {
            return Ok(());
        }
        let kernel = self.kernel("moe", K)?;
        let grid = (
            to_i32(K, "tokens", s.n.div_ceil(MOE_WARPS as usize))? as u32,
            1,
            1,
        );
        let (n, e, k) = (s.n as i32, n_expert as i32, s.k as i32);
        // SAFETY: moe_route_f32(const float* logits, const float* bias, int*
        // ids, float* w, int n, int E, int K): warp t < n reads logits[t
        // E..][..E] and bias[..E] (or null) and writes ids and w [t
        // K..][..K]; lengths checked above, E <= 32 * 32.
        unsafe {
            let l = stream.launch(&kernel).view(logits);
            let l = match bias {
                Some(b) => l.view(b),
                None => l.null(),
            };
            l.buf_mut(ids)
                .buf_mut(w)
                .scalar(&n)
                .scalar(&e)
                .scalar(&k)
                .run(cfg(grid, 32 * MOE_WARPS))?
        };
        Ok(())
    }

    /// The experts' GEMVs of a step: for each slot j < n k (token j / k's
    /// (j % k)-th expert), y[j] = W[ids[j]] x[j / x_per], W a 3-D tensor
    /// of `w.rows / rows` matrices of `rows` rows (ids outside them are
    /// clamped in: a bad id reads a wrong expert, never out of bounds).
    /// `x_per`: k where the slots read their token's row (gate, up), 1
    /// where each reads its own (down). With `glu`, each matrix is an
    /// expert's gate and up interleaved ([`crate::interleave_glu`]; rows a
    /// multiple of 4) and y[j] (rows / 2) = act(gate + gate bias) * (up +
    /// up bias), the biases of expert ids[j] where given.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_experts(
        &self,
        stream: &Stream,
        w: &QMatrix<'_>,
        rows: usize,
        ids: &DeviceView<'_, i32>,
        x: &DeviceView<'_, f32>,
        x_per: usize,
        y: &mut DeviceBuffer<f32>,
        s: MoeShape,
        glu: Option<ExpertGlu<'_, '_>>,
    ) -> Result<()> {
        const K: &str = "gemv_experts";
        let (ty, ncols) = (w.ty, w.cols);
        let f = KernelFormat::of(ty, K)?;
        let row_bytes = f.row_bytes(ncols, K)?;
        if rows == 0 || !w.rows.is_multiple_of(rows) || x_per == 0 {
            return Err(shape(
                K,
                format!("{} rows are not matrices of {rows}", w.rows),
            ));
        }
        if glu.is_some() && !rows.is_multiple_of(4) {
            return Err(shape(
                K,
                format!("{rows} interleaved gate/up rows: groups of 4"),
            ));
        }
        let n_mat = w.rows / rows;
        let out_rows = if glu.is_some() { rows / 2 } else { rows };
        if let Some(ExpertGlu { bias: Some(b), .. }) = glu {
            check_len(K, "gate bias", b[0].len(), n_mat * out_rows)?;
            check_len(K, "up bias", b[1].len(), n_mat * out_rows)?;
        }
        let slots = s.n * s.k;
        if slots == 0 {
            return Ok(());
        }
        check_len(K, "weights", w.data.len(), w.rows * row_bytes)?;
        check_len(K, "ids", ids.len(), slots)?;
        check_len(K, "x", x.len(), slots.div_ceil(x_per) * ncols)?;
        check_len(K, "y", y.len(), slots * out_rows)?;
        if !x.is_aligned(16) || !(ncols * 4).is_multiple_of(16) {
            return Err(shape(
                K,
                "x rows must start at multiples of 16 bytes".into(),
            ));
        }
        if !w.data.is_aligned(2) || !(rows * row_bytes).is_multiple_of(2) {
            return Err(shape(K, "matrices must start at even byte offsets".into()));
        }
        self.check_shared(K, gemv_shared_bytes(&f))?;
        let name = if glu.is_some() {
            f.gemv_idglu
        } else {
            f.gemv_id
        };
        let kernel = self.kernel("gemv", name)?;
        let resident = self.resident_blocks(&kernel, 32 * GEMV_WARPS, 0)?;
        // The resident blocks shared by the slots (at least one a slot).
        let plan = GemvPlan::new(&f, rows, ncols, resident.div_ceil(slots), None);
        let grid = (plan.blocks, to_i32(K, "slots", slots)? as u32, 1);
        if slots > 65535 {
            return Err(shape(K, format!("{slots} slots: grid too large")));
        }
        let (cb, ks) = (plan.chunk_blocks as i32, plan.ksplit as i32);
        let (nrows, ncols, row_bytes) = (
            to_i32(K, "rows", rows)?,
            to_i32(K, "ncols", ncols)?,
            row_bytes as i64,
        );
        let (n_mat, mat_bytes, x_per) = (
            to_i32(K, "matrices", n_mat)?,
            (rows as i64) * row_bytes,
            to_i32(K, "x_per", x_per)?,
        );
        let act = glu.map_or(0, |g| act_id(g.act));
        // SAFETY: gemv_id(glu)_<fmt>_f32(const u8* W, const float* x,
        // float* y, int nrows, int ncols, long long row_bytes, int cb, int
        // ksplit, const int* ids, int n_mat, long long mat_bytes, int
        // x_per): block (_, j) reads ids[j] (slots of them, checked), clamps
        // it below n_mat (the whole tensor, checked) and runs
        // gemv_<fmt>_f32's reads of that matrix (up to 15 bytes past a
        // row's end: the next matrix or the buffer's TAIL_SLACK), of x row
        // j / x_per (checked, 16-byte aligned) and its writes of y row j
        // (out_rows each, checked; glu: nrows a multiple of 4, checked),
        // and gemv_idglu's const float* gb, const float* ub, int act: the
        // biases of expert e at [e out_rows..][..out_rows] (n_mat rows of
        // them, checked; or null).
        unsafe {
            let l = stream
                .launch(&kernel)
                .view(w.data)
                .view(x)
                .buf_mut(y)
                .scalar(&nrows)
                .scalar(&ncols)
                .scalar(&row_bytes)
                .scalar(&cb)
                .scalar(&ks)
                .view(ids)
                .scalar(&n_mat)
                .scalar(&mat_bytes)
                .scalar(&x_per);
            match glu {
                None => l.run(cfg(grid, 32 * GEMV_WARPS))?,
                Some(g) => {
                    let l = match g.bias {
                        Some([gb, ub]) => l.view(gb).view(ub),
                        None => l.null().null(),
                    };
                    l.scalar(&act).run(cfg(grid, 32 * GEMV_WARPS))?
                }
            }
        };
        Ok(())
    }

    /// g (n K rows of `width`) = act(g + gb[e]) * (u + ub[e]) over the
    /// first rows, e = ids[r] the expert of row r (gpt-oss's gate and up
    /// biases, gb and ub (n_expert, width), where its experts' gate and up
    /// are not interleaved; ids from [`Self::moe_route`], below n_expert).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_glu(
        &self,
        stream: &Stream,
        act: m40_gguf::hparams::Activation,
        g: &mut DeviceBuffer<f32>,
        u: &DeviceView<'_, f32>,
        ids: &DeviceView<'_, i32>,
        [gb, ub]: [&DeviceView<'_, f32>; 2],
        width: usize,
        s: MoeShape,
    ) -> Result<()> {
        const K: &str = "moe_glu_f32";
        let rows = s.n * s.k;
        check_len(K, "g", g.len(), rows * width)?;
        check_len(K, "u", u.len(), rows * width)?;
        check_len(K, "ids", ids.len(), rows)?;
        if width == 0 || gb.len() != ub.len() || !gb.len().is_multiple_of(width) {
            return Err(shape(
                K,
                format!(
                    "biases of {} and {} for rows of {width}",
                    gb.len(),
                    ub.len()
                ),
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        let kernel = self.kernel("moe", K)?;
        let n = (rows * width) as i64;
        let grid = (self.flat_grid(rows * width), 1, 1);
        let (w, act) = (to_i32(K, "width", width)?, act_id(act));
        // SAFETY: moe_glu_f32(float* g, const float* u, const int* ids, const
        // float* gb, const float* ub, long long n, int width, int act):
        // grid-stride over i < n = rows * width (g's and u's lengths,
        // checked), reading ids[i / width] (rows, checked) and the biases
        // at that id's row: ids come from moe_route, below n_expert, and
        // the biases hold whole rows of width (checked; the caller passes
        // n_expert of them).
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(g)
                .view(u)
                .view(ids)
                .view(gb)
                .view(ub)
                .scalar(&n)
                .scalar(&w)
                .scalar(&act)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }

    /// out (rows, f) = act(gate + gb, up + ub) of gu (rows, 2 f) in the
    /// packed gate/up stack's order ([`Kernels::glu_pairs`]'s), with the
    /// biases `b` (n_expert, 2 f, in the same order) of each row's expert
    /// `ids[r]` (ids outside the experts clamped in): gpt-oss's gate and
    /// up biases after [`Kernels::gemm_packed_experts`].
    #[allow(clippy::too_many_arguments)]
    pub fn moe_glu_pairs(
        &self,
        stream: &Stream,
        act: m40_gguf::hparams::Activation,
        gu: &DeviceView<'_, f32>,
        out: &mut DeviceBuffer<f32>,
        ids: &DeviceView<'_, i32>,
        b: &DeviceView<'_, f32>,
        rows: usize,
        f: usize,
    ) -> Result<()> {
        const K: &str = "moe_glu_pairs_f32";
        if f == 0 || !f.is_multiple_of(2) || b.is_empty() || !b.len().is_multiple_of(2 * f) {
            return Err(shape(
                K,
                format!(
                    "{f} columns (pairs), biases of {} (rows of {})",
                    b.len(),
                    2 * f
                ),
            ));
        }
        check_len(K, "gu", gu.len(), 2 * rows * f)?;
        check_len(K, "out", out.len(), rows * f)?;
        check_len(K, "ids", ids.len(), rows)?;
        if !gu.is_aligned(8) || !b.is_aligned(16) {
            return Err(shape(
                K,
                "gu and the biases must start at multiples of 8 and 16 bytes".into(),
            ));
        }
        let pairs = rows * f / 2;
        if pairs == 0 {
            return Ok(());
        }
        let kernel = self.kernel("moe", K)?;
        let (e, n) = (to_i32(K, "experts", b.len() / (2 * f))?, pairs as i64);
        let (half, act) = (to_i32(K, "columns", f / 2)?, act_id(act));
        // SAFETY: moe_glu_pairs_f32(const float* gu, float* out, const int*
        // ids, const float* b, int E, long long n, int half, int act):
        // grid-stride over pairs i < n = rows f / 2, reading gu's float2s 2i
        // and 2i + 1 (2 rows f floats, checked, 8-byte aligned), ids[i /
        // half] (rows, checked), clamped below E, and that expert's float4
        // i % half of b (E rows of 4 half floats: b's length, 16-byte
        // aligned), writing out's float2 i (rows f floats, checked).
        unsafe {
            stream
                .launch(&kernel)
                .view(gu)
                .buf_mut(out)
                .view(ids)
                .view(b)
                .scalar(&e)
                .scalar(&n)
                .scalar(&half)
                .scalar(&act)
                .run(cfg((self.flat_grid(pairs), 1, 1), ELEMENTWISE_THREADS))?
        };
        Ok(())
    }

    /// out (n, d) = the sum over each token's k slots of w[t, j] y[t k +
    /// j] (y: (n k, d)), in slot order.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(
        &self,
        stream: &Stream,
        y: &DeviceView<'_, f32>,
        w: &DeviceView<'_, f32>,
        bias: Option<(&DeviceView<'_, i32>, &DeviceView<'_, f32>)>,
        out: &mut DeviceBuffer<f32>,
        d: usize,
        s: MoeShape,
    ) -> Result<()> {
        const K: &str = "moe_combine_f32";
        let nd = s.n * d;
        check_len(K, "y", y.len(), nd * s.k)?;
        check_len(K, "w", w.len(), s.n * s.k)?;
        check_len(K, "out", out.len(), nd)?;
        if let Some((ids, b)) = bias {
            check_len(K, "ids", ids.len(), s.n * s.k)?;
            if d == 0 || !b.len().is_multiple_of(d) {
                return Err(shape(K, format!("a bias of {} for rows of {d}", b.len())));
            }
        }
        if nd == 0 {
            return Ok(());
        }
        let kernel = self.kernel("moe", K)?;
        let grid = (self.flat_grid(nd), 1, 1);
        let (nd, d, k) = (nd as i64, to_i32(K, "d", d)?, to_i32(K, "k", s.k)?);
        // SAFETY: moe_combine_f32(const float* y, const float* w, const int*
        // ids, const float* b, float* out, long long nd, int d, int K):
        // grid-stride over i < nd reading w[(i / d) K ..][..K] and y rows
        // (i / d) K + j, and with b, ids at those slots (checked) and b's
        // row of each id (moe_route's, below n_expert; b holds whole rows
        // of d, the caller passes n_expert); lengths checked.
        unsafe {
            let l = stream.launch(&kernel).view(y).view(w);
            let l = match bias {
                Some((ids, b)) => l.view(ids).view(b),
                None => l.null().null(),
            };
            l.buf_mut(out)
                .scalar(&nd)
                .scalar(&d)
                .scalar(&k)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }

    /// One token's [`Self::moe_combine`] (its k slots of y, weights w,
    /// gpt-oss's down biases by id) added to the residual row x (d) in
    /// place, with the RMSNorm that follows folded for the packed GEMVs
    /// after it: h = x * `fold.weight` and each block's sum of x^2 in
    /// `fold.part` (`Fold::Emit`'s half; the GEMVs take it as `Fold::Take`
    /// of the returned number of parts).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine_fold(
        &self,
        stream: &Stream,
        y: &DeviceView<'_, f32>,
        w: &DeviceView<'_, f32>,
        bias: Option<(&DeviceView<'_, i32>, &DeviceView<'_, f32>)>,
        x: &mut DeviceBuffer<f32>,
        fold: CombineFold<'_, '_>,
        d: usize,
        k: usize,
    ) -> Result<usize> {
        const K: &str = "moe_combine_fold_f32";
        let blocks = d.div_ceil(MOE_FOLD_THREADS as usize);
        check_len(K, "y", y.len(), k * d)?;
        check_len(K, "w", w.len(), k)?;
        check_len(K, "x", x.len(), d)?;
        check_len(K, "norm weights", fold.weight.len(), d)?;
        check_len(K, "h", fold.h.len(), d)?;
        check_len(K, "partial sums", fold.part.len(), blocks)?;
        if let Some((ids, b)) = bias {
            check_len(K, "ids", ids.len(), k)?;
            if d == 0 || !b.len().is_multiple_of(d) {
                return Err(shape(K, format!("a bias of {} for rows of {d}", b.len())));
            }
        }
        if d == 0 || k == 0 {
            return Err(shape(K, format!("{k} slots of {d}")));
        }
        let kernel = self.kernel("moe", K)?;
        let (di, ki) = (to_i32(K, "d", d)?, to_i32(K, "k", k)?);
        let grid = (to_i32(K, "blocks", blocks)? as u32, 1, 1);
        // SAFETY: moe_combine_fold_f32(const float* y, const float* w, const
        // int* ids, const float* b, float* x, const float* nw, float* h,
        // float* part, int d, int K): thread c < d reads w[..K], y[j d + c]
        // for j < K and with b, ids[..K] and b[ids[j] d + c] (moe_route's ids,
        // below n_expert; b holds whole rows of d, the caller passes
        // n_expert), reads and writes x[c], reads nw[c], writes h[c]; block
        // i writes part[i], i < blocks; lengths checked above.
        unsafe {
            let l = stream.launch(&kernel).view(y).view(w);
            let l = match bias {
                Some((ids, b)) => l.view(ids).view(b),
                None => l.null().null(),
            };
            l.buf_mut(x)
                .view(fold.weight)
                .buf_mut(fold.h)
                .buf_mut(fold.part)
                .scalar(&di)
                .scalar(&ki)
                .run(cfg(grid, MOE_FOLD_THREADS))?
        };
        Ok(blocks)
    }

    /// y (idx.len(), d): row r = x row idx[r] / div (x: rows of d; an
    /// index past x's rows reads its last). A prefill's slots gathered by
    /// expert (div k: each reads its token's row), and back (div 1).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gather(
        &self,
        stream: &Stream,
        x: &DeviceView<'_, f32>,
        idx: &DeviceView<'_, i32>,
        div: usize,
        y: &mut DeviceBuffer<f32>,
        d: usize,
    ) -> Result<()> {
        const K: &str = "moe_gather_f32";
        let rows = idx.len();
        let nd = rows * d;
        check_len(K, "y", y.len(), nd)?;
        if nd == 0 {
            return Ok(());
        }
        if div == 0 || !x.len().is_multiple_of(d) || x.is_empty() {
            return Err(shape(
                K,
                format!("x of {} for rows of {d}, div {div}", x.len()),
            ));
        }
        let kernel = self.kernel("moe", K)?;
        let grid = (self.flat_grid(nd), 1, 1);
        let src_rows = to_i32(K, "rows of x", x.len() / d)?;
        let (nd, d, div) = (nd as i64, to_i32(K, "d", d)?, to_i32(K, "div", div)?);
        // SAFETY: moe_gather_f32(const float* x, const int* idx, float* y,
        // long long nd, int d, int div, int src_rows): grid-stride over i <
        // nd = idx.len() d writing y[i] (checked) and reading idx[i / d] and
        // x's row idx / div clamped into [0, src_rows) (src_rows d = x.len()).
        unsafe {
            stream
                .launch(&kernel)
                .view(x)
                .view(idx)
                .buf_mut(y)
                .scalar(&nd)
                .scalar(&d)
                .scalar(&div)
                .scalar(&src_rows)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moe_constants_match_the_kernels() {
        let src = include_str!("../../../kernels/moe.cu");
        let define =
            |name: &str| crate::cuda_define(src, name).and_then(|v| v.parse::<usize>().ok());
        assert_eq!(define("MOE_WARPS"), Some(MOE_WARPS as usize));
        assert_eq!(
            define("MOE_ROUTER_THREADS"),
            Some(router::MOE_ROUTER_THREADS as usize)
        );
        assert_eq!(define("MOE_ROUTER_MAX_ROWS"), Some(MOE_ROUTER_MAX_ROWS));
        assert_eq!(define("MOE_ROUTER_TOKENS"), Some(MOE_ROUTER_TOKENS));
        assert_eq!(define("MOE_FOLD_THREADS"), Some(MOE_FOLD_THREADS as usize));
        assert_eq!(
            define("MOE_MAX_PER_LANE").map(|p| 32 * p),
            Some(MOE_MAX_EXPERTS)
        );
    }
}
