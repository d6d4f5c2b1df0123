//! One launcher per kernel: grid math and precondition checks.

use m40_device::{ArgBlock, DeviceBuffer, DeviceView, KernelArgs, LaunchConfig, Stream};
use m40_gguf::GgmlType;

use crate::attention::KV_PAGE;
use crate::decode::{DecodeOp, DecodeOpHead, FOLD_EMIT, FOLD_NONE, FOLD_TAKE};
use crate::error::{KernelError, Result};
use crate::format::{gemv_chunk_blocks, gemv_shared_bytes, KernelFormat, GEMV_ROWS, GEMV_WARPS};
use crate::pack::{PackFormat, PACK_ROWS};
use crate::{Kernels, MAX_SHARED_PER_BLOCK};

/// Tokens one [`Kernels::gemv_packed_batch`] call takes at most.
pub const PACKED_GEMV_MAX_TOKENS: usize = 16;

/// Tokens one packed GEMV launch takes at most (more run as several).
const GEMV_BATCH: usize = 8;

/// Threads per block of kernels/rmsnorm.cu.
const RMSNORM_THREADS: u32 = 256;
/// Threads per block of kernels/embed.cu (`EMBED_THREADS`).
const EMBED_THREADS: u32 = 128;
/// Threads per block of kernels/elementwise.cu (`ELEMENTWISE_THREADS`).
pub(crate) const ELEMENTWISE_THREADS: u32 = 256;
/// Threads per block of kernels/rope.cu (`ROPE_THREADS`).
const ROPE_THREADS: u32 = 256;
/// Rotated pairs per head at most (kernels/rope.cu `ROPE_MAX_HALF`).
const ROPE_MAX_HALF: usize = 128;
/// Warps per block of kernels/gemv_packed.cu (`PGEMV_WARPS`).
const PACKED_GEMV_WARPS: u32 = 4;
/// Grid-stride kernels launch at most this many blocks per SM.
const BLOCKS_PER_SM: u32 = 16;

/// The x operand of an RMSNorm launch: read, or updated by a residual
/// first.
enum Norm<'x, 'v> {
    Plain(&'x DeviceView<'v, f32>),
    Add(&'x mut DeviceBuffer<f32>, &'x DeviceView<'v, f32>),
}

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

/// A weight matrix on the device in its GGUF format: `rows` rows of `cols`
/// weights, rows back to back.
#[derive(Clone, Copy)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub data: &'a DeviceView<'a, u8>,
    pub rows: usize,
    pub cols: usize,
}

/// Where a matmul's output goes when its weight rows are up to three
/// matrices stacked (a fused Q/K/V or gate/up projection): part `i` takes
/// the next `rows[i]` rows of every token, stored (tokens, rows[i])
/// row-major in `bufs[i]`. One part is an ordinary matmul.
pub struct RowSplit<'a, 'b> {
    pub bufs: &'a mut [&'b mut DeviceBuffer<f32>],
    pub rows: &'a [usize],
}

impl<'a, 'b> RowSplit<'a, 'b> {
    /// The kernels' (r1, r2) part boundaries, after checking the parts
    /// against a matrix of `n` rows and `m` tokens.
    pub(crate) fn bounds(&self, kernel: &'static str, n: usize, m: usize) -> Result<(i32, i32)> {
        let parts = self.rows.len();
        if parts != self.bufs.len() || !(1..=3).contains(&parts) {
            return Err(shape(
                kernel,
                format!(
                    "{parts} row counts for {} output buffers (1 to 3 parts)",
                    self.bufs.len()
                ),
            ));
        }
        let total: usize = self.rows.iter().sum();
        if total != n {
            return Err(shape(
                kernel,
                format!("output parts of {total} rows for a matrix of {n}"),
            ));
        }
        for (b, &r) in self.bufs.iter().zip(self.rows) {
            check_len(kernel, "y", b.len(), m * r)?;
        }
        let r1 = if parts == 1 { n } else { self.rows[0] };
        let r2 = if parts == 3 { r1 + self.rows[1] } else { n };
        Ok((to_i32(kernel, "rows", r1)?, to_i32(kernel, "rows", r2)?))
    }

    /// Push the kernels' `float* y0, float* y1, float* y2` (null where
    /// there is no such part).
    pub(crate) fn push<'l, A: KernelArgs<'l>>(&'l mut self, mut l: A) -> A {
        let parts = self.bufs.len();
        for b in self.bufs.iter_mut() {
            l = l.buf_mut(&mut **b);
        }
        for _ in parts..3 {
            l = l.null();
        }
        l
    }
}

/// Where the packed GEMV writes: the parts of a stack, SwiGLU of an
/// interleaved gate/up stack (y (m, rows / 2)), or added to y (m, rows):
/// the residual connection.
pub enum GemvOut<'a, 'b, 'c> {
    Parts(RowSplit<'a, 'b>),
    Glu(&'c mut DeviceBuffer<f32>),
    Add(&'c mut DeviceBuffer<f32>),
    /// A Q/K/V stack of one token (rows: q_dim, then K and V of n_head_kv
    /// heads each), or the part of one that [`RopeKv::parts`] names, with
    /// RoPE and the KV append folded in: the rotated queries to `q`, K
    /// (rotated) and V to the pools as [`Kernels::rope_kv_append`] would.
    /// The normal (llama) style only.
    RopeKv(RopeKv<'a, 'c>),
}

/// The destinations and parameters of [`GemvOut::RopeKv`].
pub struct RopeKv<'a, 'c> {
    /// Which of Q, K, V (0, 1, 2) the matrix's rows are, in that order:
    /// `0..3` for a whole stack, or a run of them where Q, K and V are not
    /// one stack (a model whose V has another format: `0..2` and `2..3`).
    pub parts: std::ops::Range<usize>,
    /// The queries (written only when `parts` holds Q).
    pub q: &'c mut DeviceBuffer<f32>,
    pub n_head_kv: usize,
    /// pos[0]: the token's position (read on the device, at most `max_start`).
    pub pos: &'a DeviceView<'a, i32>,
    pub inv_freq: &'a DeviceView<'a, f32>,
    pub p: &'a RopeParams,
    pub kpool: &'c mut DeviceBuffer<u16>,
    pub vpool: &'c mut DeviceBuffer<u16>,
    pub table: &'a DeviceView<'a, i32>,
    pub max_start: usize,
}

/// An RMSNorm folded into two one-token packed GEMVs (kernels/gemv_packed.cu
/// `Fold`): the residual GEMV before it emits, the GEMVs after it take.
pub enum Fold<'a, 'b> {
    /// With [`GemvOut::Add`]: also write h = x * weight (x the updated
    /// residual row, `rows` long) and, per block of the launch, the sum of
    /// its rows' x^2 to `part` (as many as [`GemvLaunch::blocks`]).
    Emit {
        weight: &'a DeviceView<'a, f32>,
        h: &'b mut DeviceBuffer<f32>,
        part: &'b mut DeviceBuffer<f32>,
    },
    /// x is such an h: the result is scaled by 1 / sqrt(sum(part[..n_part])
    /// / cols + eps), which makes it W (rmsnorm(residual) * weight).
    Take {
        part: &'a DeviceView<'a, f32>,
        n_part: usize,
        eps: f32,
    },
}

/// The scalar parameters of a packed GEMV launch (see [`push_gemv`]).
struct GemvScalars {
    r1: i32,
    r2: i32,
    nrows: i32,
    nb: i32,
    ks: i32,
    t0: i32,
    m: i32,
    mode: i32,
    n_part: i32,
    rope: [i32; 2],
    rope_scale: f32,
}

/// Zeros for the parameters a GEMV launch does not use.
const ZERO_I32: i32 = 0;
const ZERO_F32: f32 = 0.0;

/// The parameters of gemv_packed_<fmt>_f32[_x<B>|_take|_emit]
/// (kernels/gemv_packed.cu; gemv_packed.cuh's `GemvArgs`, which decode.cu
/// reads from memory, has the same fields):
/// const u8* W, const float* x, float* y, float* y1, float* y2, int r1, int
/// r2, int nrows, int nb, int ksplit, int t0, int m, int mode, const float*
/// nw, float* h, float* part, int n_part, float eps, const int* pos, const
/// float* inv_freq, const int* table, u16* kpool, u16* vpool, int head_dim,
/// int n_rot, float pos_scale (null and zeros where unused); `l` holds W
/// and x already.
fn push_gemv<'l, A: KernelArgs<'l>>(
    l: A,
    out: &'l mut GemvOut<'_, '_, '_>,
    fold: &'l mut Option<Fold<'_, '_>>,
    sc: &'l GemvScalars,
) -> A {
    let (l, rk) = match out {
        GemvOut::Parts(y) => (y.push(l), None),
        GemvOut::Glu(y) | GemvOut::Add(y) => (l.buf_mut(&mut **y).null().null(), None),
        GemvOut::RopeKv(r) => {
            let RopeKv {
                q,
                pos,
                inv_freq,
                table,
                kpool,
                vpool,
                ..
            } = r;
            let l = l.buf_mut(&mut **q).null().null();
            (
                l,
                Some((*pos, *inv_freq, *table, &mut **kpool, &mut **vpool)),
            )
        }
    };
    let l = l
        .scalar(&sc.r1)
        .scalar(&sc.r2)
        .scalar(&sc.nrows)
        .scalar(&sc.nb)
        .scalar(&sc.ks)
        .scalar(&sc.t0)
        .scalar(&sc.m)
        .scalar(&sc.mode);
    let l = match fold {
        Some(Fold::Emit { weight, h, part }) => l
            .view(weight)
            .buf_mut(&mut **h)
            .buf_mut(&mut **part)
            .scalar(&ZERO_I32)
            .scalar(&ZERO_F32),
        Some(Fold::Take { part, eps, .. }) => {
            l.null().null().view(part).scalar(&sc.n_part).scalar(eps)
        }
        None => l.null().null().null().scalar(&ZERO_I32).scalar(&ZERO_F32),
    };
    let l = match rk {
        Some((pos, inv_freq, table, kpool, vpool)) => l
            .view(pos)
            .view(inv_freq)
            .view(table)
            .buf_mut(kpool)
            .buf_mut(vpool),
        None => l.null().null().null().null().null(),
    };
    l.scalar(&sc.rope[0])
        .scalar(&sc.rope[1])
        .scalar(&sc.rope_scale)
}

/// What a packed GEMV launched: warps per row group and blocks (per launch
/// of up to 8 tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvLaunch {
    pub ksplit: u32,
    pub blocks: usize,
}

/// A weight matrix on the device in the packed GEMV layout
/// ([`crate::pack_gemv`]): `rows` x `cols` weights of `ty`.
#[derive(Clone, Copy)]
pub struct PackedMatrix<'a> {
    pub ty: GgmlType,
    pub data: &'a DeviceView<'a, u8>,
    pub rows: usize,
    pub cols: usize,
}

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

/// Warps per block of a one-token packed GEMV with a 3-way split (2 row
/// groups; kernels/gemv_packed.cuh `PGEMV_MAX_WARPS`).
const PACKED_GEMV_SPLIT3_WARPS: usize = 6;

/// How a packed GEMV launch spreads its row groups: `ksplit` warps per
/// group (each taking every ksplit-th run of 8 blocks of the row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PackedSplit {
    ksplit: usize,
}

impl PackedSplit {
    fn of(ksplit: usize) -> Self {
        Self { ksplit }
    }

    /// Warps a block: 4, or 6 for a 3-way split.
    fn warps(self) -> usize {
        match self.ksplit {
            3 => PACKED_GEMV_SPLIT3_WARPS,
            _ => PACKED_GEMV_WARPS as usize,
        }
    }

    /// Blocks for `groups` row groups.
    fn blocks(self, groups: usize) -> usize {
        groups.div_ceil(self.warps() / self.ksplit)
    }

    /// Rounds of loads a lane waits for over a row of `runs` runs of 8
    /// blocks in batches of `u` blocks in flight (a SPLIT3 format's last
    /// batch may be partial: kernels/gemv_packed.cuh).
    fn rounds(self, runs: usize, u: usize) -> usize {
        runs.div_ceil(self.ksplit).div_ceil(u)
    }
}

/// The split of a packed GEMV for `groups` row groups of `nb` blocks (at
/// most the runs of 8 blocks a row has), `u` blocks of loads in flight per
/// lane (`PackFormat::in_flight`), on a GPU that holds `slots[0]` blocks of
/// 4 warps and `slots[1]` of 6 at once (`None`: no 3-way split, as for
/// several tokens and in the persistent decode kernel's 4-warp blocks).
/// Only the formats with `PackFormat::split3` have the 3-way split.
/// `ksplit` forced: lowered to what the row (and `slots`) allows.
/// Otherwise, of 1, 2 and 4, the largest whose blocks all run at once (one
/// wave; a GEMV of few rows is latency-bound, and a second wave starts
/// only as the first drains: on an H100, 4096 x 14336 Q4_0 with 4 warps a
/// group in 1024 blocks, 1.1 waves, measured 1.3x slower than with 2), or
/// no split where none does (the groups then give every resident warp
/// two). A 3-way split replaces it where it also fits in a wave and its
/// lanes wait for fewer rounds of loads (H100, 4096 x 14336 Q6_K: 10
/// rounds instead of 14, 21% faster; 4096 x 4096 with 4 blocks in flight:
/// 2 rounds either way).
fn packed_split(
    groups: usize,
    nb: usize,
    u: usize,
    slots: [Option<usize>; 2],
    ksplit: Option<u32>,
) -> PackedSplit {
    let runs = nb.div_ceil(8);
    let allowed = move || {
        [1, 2, 3, 4]
            .into_iter()
            .filter(move |&k| k <= runs && (k != 3 || slots[1].is_some()))
            .map(PackedSplit::of)
    };
    let fallback = PackedSplit::of(1);
    if let Some(k) = ksplit {
        return allowed()
            .rfind(|p| p.ksplit <= k as usize)
            .unwrap_or(fallback);
    }
    let one_wave = |p: PackedSplit| {
        let n = if p.ksplit == 3 { slots[1] } else { slots[0] };
        n.is_some_and(|n| p.blocks(groups) <= n)
    };
    let pow2 = allowed()
        .rfind(|p| p.ksplit != 3 && one_wave(*p))
        .unwrap_or(fallback);
    match allowed().find(|p| p.ksplit == 3) {
        Some(p3) if one_wave(p3) && p3.rounds(runs, u) < pow2.rounds(runs, u) => p3,
        _ => pow2,
    }
}

pub(crate) fn shape(kernel: &'static str, what: String) -> KernelError {
    KernelError::Shape { kernel, what }
}

/// `buf` must hold at least `need` elements.
pub(crate) fn check_len(kernel: &'static str, name: &str, len: usize, need: usize) -> Result<()> {
    if len < need {
        return Err(shape(
            kernel,
            format!("{name} has {len} elements, {need} needed"),
        ));
    }
    Ok(())
}

pub(crate) fn to_i32(kernel: &'static str, name: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| shape(kernel, format!("{name} = {v} exceeds i32")))
}

/// The gather's grid: a block row per id, `items` threads per row.
fn embed_grid(
    kernel: &'static str,
    n_ids: usize,
    ncols: usize,
    items: usize,
) -> Result<(u32, u32, u32)> {
    let grid_y = items.div_ceil(EMBED_THREADS as usize);
    if grid_y > 65535 {
        return Err(shape(
            kernel,
            format!("{ncols} columns need {grid_y} blocks in y (max 65535)"),
        ));
    }
    Ok((to_i32(kernel, "ids", n_ids)? as u32, grid_y as u32, 1))
}

pub(crate) fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid,
        block: (block, 1, 1),
        shared_bytes: 0,
    }
}

impl Kernels {
    /// Blocks of ELEMENTWISE_THREADS for a grid-stride loop over `n` items.
    pub(crate) fn flat_grid(&self, n: usize) -> u32 {
        let cap = self.device().info().sm_count.max(1) * BLOCKS_PER_SM;
        (n.div_ceil(ELEMENTWISE_THREADS as usize) as u64).clamp(1, cap as u64) as u32
    }

    /// y = x / sqrt(mean(x^2) + eps) * w, row by row. x, y: (rows, n); w: (n).
    pub fn rmsnorm(
        &self,
        stream: &Stream,
        x: &DeviceView<'_, f32>,
        w: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        self.rmsnorm_launch(stream, Norm::Plain(x), w, y, rows, eps)
    }

    /// The residual connection and the next norm in one launch: x += d,
    /// then y = x / sqrt(mean(x^2) + eps) * w. x, d, y: (rows, n); w: (n).
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm(
        &self,
        stream: &Stream,
        x: &mut DeviceBuffer<f32>,
        d: &DeviceView<'_, f32>,
        w: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        self.rmsnorm_launch(stream, Norm::Add(x, d), w, y, rows, eps)
    }

    fn rmsnorm_launch(
        &self,
        stream: &Stream,
        x: Norm<'_, '_>,
        w: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        let (name, x_len, x_aligned) = match &x {
            Norm::Plain(x) => ("rmsnorm_f32", x.len(), x.is_aligned(16)),
            Norm::Add(x, d) => {
                check_len("add_rmsnorm_f32", "d", d.len(), rows * w.len())?;
                ("add_rmsnorm_f32", x.len(), d.is_aligned(16))
            }
        };
        let n = w.len();
        if rows == 0 || n == 0 {
            return Ok(());
        }
        check_len(name, "x", x_len, rows * n)?;
        check_len(name, "y", y.len(), rows * n)?;
        if n.is_multiple_of(4) && !(x_aligned && w.is_aligned(16)) {
            return Err(shape(
                name,
                format!("rows of {n} floats are read with 16-byte loads: x, d and w must be 16-byte aligned"),
            ));
        }
        let kernel = self.kernel("rmsnorm", name)?;
        let n = to_i32(name, "n", n)?;
        let grid = (
            u32::try_from(rows).map_err(|_| shape(name, format!("{rows} rows")))?,
            1,
            1,
        );
        // SAFETY: rmsnorm_f32(const float* x, const float* w, float* y, int n, float eps)
        // and add_rmsnorm_f32(float* x, const float* d, const float* w, float* y, int n,
        // float eps); block r reads (and for add_rmsnorm writes) x[r*n..][..n], reads
        // d[r*n..][..n] and w[..n], writes y[r*n..][..n]: lengths checked above; 16-byte
        // accesses when n % 4 == 0, alignment checked above (y is a whole allocation).
        unsafe {
            let l = stream.launch(&kernel);
            let l = match x {
                Norm::Plain(x) => l.view(x),
                Norm::Add(x, d) => l.buf_mut(x).view(d),
            };
            l.view(w)
                .buf_mut(y)
                .scalar(&n)
                .scalar(&eps)
                .run(cfg(grid, RMSNORM_THREADS))?
        };
        Ok(())
    }

    /// [`Kernels::embed`] from a table in the packed layout (a tied
    /// embedding shares the output matrix's packed copy).
    pub fn embed_packed(
        &self,
        stream: &Stream,
        table: &PackedMatrix<'_>,
        ids: &DeviceView<'_, i32>,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "embed_packed";
        let (ty, w, n_vocab, ncols) = (table.ty, table.data, table.rows, table.cols);
        let f = PackFormat::checked(K, ty, ncols)?;
        let n_ids = ids.len();
        if n_ids == 0 {
            return Ok(());
        }
        check_len(K, "weights", w.len(), f.packed_bytes(n_vocab, ncols))?;
        check_len(K, "out", out.len(), n_ids * ncols)?;
        if !w.is_aligned(16) {
            return Err(shape(
                K,
                "weights must start at a multiple of 16 bytes".into(),
            ));
        }
        let grid = embed_grid(K, n_ids, ncols, ncols / 32 * 4)?; // a thread per 8 weights
        let kernel = self.kernel("embed", f.embed)?;
        let (ncols, n_vocab) = (to_i32(K, "ncols", ncols)?, to_i32(K, "n_vocab", n_vocab)?);
        // SAFETY: embed_packed_<fmt>_f32(const u8* W, const int* ids, float* out, int ncols,
        // int n_vocab): block t reads ids[t] and, for an id < n_vocab, that row's words of
        // the packed W (packed_bytes checked, 16-byte aligned); writes out[t*ncols..][..ncols].
        unsafe {
            stream
                .launch(&kernel)
                .view(w)
                .view(ids)
                .buf_mut(out)
                .scalar(&ncols)
                .scalar(&n_vocab)
                .run(cfg(grid, EMBED_THREADS))?
        };
        Ok(())
    }

    /// out[t] = dequant(table)[ids[t]]: rows of an embedding table (n_vocab
    /// rows). ids: (n_ids); out: (n_ids, cols) FP32. Ids outside [0, n_vocab)
    /// give NaN rows.
    pub fn embed(
        &self,
        stream: &Stream,
        table: &QMatrix<'_>,
        ids: &DeviceView<'_, i32>,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "embed";
        let (ty, w, n_vocab, ncols) = (table.ty, table.data, table.rows, table.cols);
        let f = KernelFormat::of(ty, K)?;
        let row_bytes = f.row_bytes(ncols, K)?;
        let n_ids = ids.len();
        if n_ids == 0 {
            return Ok(());
        }
        check_len(K, "weights", w.len(), n_vocab * row_bytes)?;
        check_len(K, "out", out.len(), n_ids * ncols)?;
        // One thread per 4-weight part.
        let grid = embed_grid(K, n_ids, ncols, f.subs_per_row(ncols) * 8)?;
        let kernel = self.kernel("embed", f.embed)?;
        let (ncols, row_bytes, n_vocab) = (
            to_i32(K, "ncols", ncols)?,
            row_bytes as i64,
            to_i32(K, "n_vocab", n_vocab)?,
        );
        // SAFETY: embed_<fmt>_f32(const u8* W, const int* ids, float* out, int ncols,
        // long long row_bytes, int n_vocab); it reads W rows only for ids in
        // [0, n_vocab) (checked on the device) within n_vocab * row_bytes bytes,
        // and writes n_ids * ncols floats of out, lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .view(w)
                .view(ids)
                .buf_mut(out)
                .scalar(&ncols)
                .scalar(&row_bytes)
                .scalar(&n_vocab)
                .run(cfg(grid, EMBED_THREADS))?
        };
        Ok(())
    }

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
        let smem = gemv_shared_bytes(&f);
        let limit = MAX_SHARED_PER_BLOCK.min(self.device().info().max_shared_per_block);
        if smem > limit {
            return Err(KernelError::SharedMemory {
                kernel: K,
                bytes: smem,
                limit,
            });
        }
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

    /// y = W x for W in the packed layout; x (cols) FP32, 16-byte aligned;
    /// y (rows). `ksplit` forces the warps per row group (1, 2 or 4; lowered
    /// to the runs of 8 blocks a row has); None picks one by `packed_split`.
    /// Returns the split launched.
    pub fn gemv_packed(
        &self,
        stream: &Stream,
        w: &PackedMatrix<'_>,
        x: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        ksplit: Option<u32>,
    ) -> Result<u32> {
        let out = RowSplit {
            bufs: &mut [y],
            rows: &[w.rows],
        };
        self.gemv_packed_batch(stream, w, x, out, 1, ksplit)
    }

    /// Y = X W^T for `m` tokens (1 ..= [`PACKED_GEMV_MAX_TOKENS`]) of X
    /// (m, cols), 16-byte aligned: every weight is loaded once and used for
    /// up to 8 of them (several sequences decoding, a short prompt; more
    /// than 8 run as launches of 8). Y: each part (m, its rows). Returns the
    /// split launched. Stacked matrices (several parts) write each part to
    /// its own buffer.
    pub fn gemv_packed_batch(
        &self,
        stream: &Stream,
        w: &PackedMatrix<'_>,
        x: &DeviceView<'_, f32>,
        y: RowSplit<'_, '_>,
        m: usize,
        ksplit: Option<u32>,
    ) -> Result<u32> {
        self.gemv_packed_to(stream, w, x, None, GemvOut::Parts(y), m, ksplit)
            .map(|l| l.ksplit)
    }

    /// SwiGLU through the packed GEMV: `w` is a gate/up stack interleaved
    /// by [`crate::interleave_glu`] (2f rows: gate 0, gate 1, up 0, up 1,
    /// gate 2, ...), and y (m, f) = silu(gate x) * up x for the m tokens of
    /// x, the gate and up sums never leaving registers. As
    /// [`Self::gemv_packed_batch`] otherwise.
    pub fn gemv_packed_glu(
        &self,
        stream: &Stream,
        w: &PackedMatrix<'_>,
        x: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        m: usize,
        ksplit: Option<u32>,
    ) -> Result<u32> {
        self.gemv_packed_to(stream, w, x, None, GemvOut::Glu(y), m, ksplit)
            .map(|l| l.ksplit)
    }

    /// The packed GEMV in full: `m` tokens of x written as `out` says, and
    /// with `fold` (one token) one half of a folded RMSNorm ([`Fold`]). As
    /// [`Self::gemv_packed_batch`] otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_packed_to(
        &self,
        stream: &Stream,
        w: &PackedMatrix<'_>,
        x: &DeviceView<'_, f32>,
        mut fold: Option<Fold<'_, '_>>,
        mut out: GemvOut<'_, '_, '_>,
        m: usize,
        ksplit: Option<u32>,
    ) -> Result<GemvLaunch> {
        const K: &str = "gemv_packed";
        if !(1..=PACKED_GEMV_MAX_TOKENS).contains(&m) {
            return Err(shape(
                K,
                format!("{m} tokens (1 to {PACKED_GEMV_MAX_TOKENS} per launch)"),
            ));
        }
        if fold.is_some() && m != 1 {
            return Err(shape(K, format!("a folded norm takes 1 token, not {m}")));
        }
        let f = PackFormat::checked(K, w.ty, w.cols)?;
        let (nrows, ncols) = (w.rows, w.cols);
        if nrows == 0 {
            return Ok(GemvLaunch {
                ksplit: 1,
                blocks: 0,
            });
        }
        check_len(K, "weights", w.data.len(), f.packed_bytes(nrows, ncols))?;
        check_len(K, "x", x.len(), m * ncols)?;
        let (r1, r2, mode) = match &out {
            GemvOut::Parts(y) => {
                let (r1, r2) = y.bounds(K, nrows, m)?;
                (r1, r2, 0i32)
            }
            GemvOut::Add(y) => {
                check_len(K, "y", y.len(), m * nrows)?;
                let r = to_i32(K, "rows", nrows)?;
                (r, r, 2i32)
            }
            GemvOut::RopeKv(r) => {
                let (p, hd) = (r.p, r.p.head_dim);
                let (q_dim, kv_dim) = (p.n_head * hd, r.n_head_kv * hd);
                if m != 1 || p.style != RopeStyle::Normal {
                    return Err(shape(
                        K,
                        format!("RoPE folds into one token's GEMV of the normal style, not {m} tokens, {:?}", p.style),
                    ));
                }
                let dims = [q_dim, kv_dim, kv_dim];
                let parts = &r.parts;
                if parts.is_empty() || parts.end > 3 {
                    return Err(shape(K, format!("parts {parts:?} of Q, K, V (0..3)")));
                }
                let want: usize = dims[parts.clone()].iter().sum();
                if nrows != want {
                    return Err(shape(
                        K,
                        format!("{nrows} rows are not parts {parts:?} of Q {q_dim}, K, V {kv_dim}"),
                    ));
                }
                // The kernel's row classes: Q below r1, K below r2, V after.
                let has = |i: usize| parts.contains(&i);
                let r1 = if has(0) { q_dim } else { 0 };
                let r2 = r1 + if has(1) { kv_dim } else { 0 };
                if !hd.is_multiple_of(2)
                    || p.n_rot == 0
                    || !p.n_rot.is_multiple_of(2)
                    || p.n_rot > hd
                {
                    return Err(shape(
                        K,
                        format!(
                            "head_dim {hd}, n_rot {}: both even, n_rot in 2..=head_dim",
                            p.n_rot
                        ),
                    ));
                }
                check_len(K, "q", r.q.len(), r1)?;
                check_len(K, "pos", r.pos.len(), 1)?;
                check_len(K, "inv_freq", r.inv_freq.len(), p.n_rot / 2)?;
                check_len(
                    K,
                    "table",
                    r.table.len(),
                    (r.max_start + 1).div_ceil(KV_PAGE),
                )?;
                to_i32(K, "positions", r.max_start + 1)?;
                let pages = r.kpool.len() / (KV_PAGE * kv_dim).max(1);
                check_len(K, "vpool", r.vpool.len(), pages * KV_PAGE * kv_dim)?;
                (to_i32(K, "rows", r1)?, to_i32(K, "rows", r2)?, 0i32)
            }
            GemvOut::Glu(y) => {
                if !nrows.is_multiple_of(4) {
                    return Err(shape(
                        K,
                        format!("{nrows} rows: a gate/up stack holds groups of 4"),
                    ));
                }
                check_len(K, "y", y.len(), m * nrows / 2)?;
                let r = to_i32(K, "rows", nrows)?;
                (r, r, 1i32)
            }
        };
        if !x.is_aligned(16) || !w.data.is_aligned(16) {
            return Err(shape(
                K,
                "weights and x must start at a multiple of 16 bytes".into(),
            ));
        }
        let name = |m: usize| match (m, &fold) {
            (1, Some(Fold::Emit { .. })) => f.gemv_emit,
            (1, Some(Fold::Take { .. })) => f.gemv_take,
            (1, None) => f.gemv,
            (2, _) => f.gemv_batch[0],
            (3..=4, _) => f.gemv_batch[1],
            _ => f.gemv_batch[2],
        };
        // One token while a decode program records (crate::decode): an op
        // of the persistent kernel, planned for its resident blocks.
        let record = m == 1 && self.recording();
        let kernel = match record {
            true => None,
            false => Some(self.kernel("gemv_packed", name(m.min(GEMV_BATCH)))?),
        };
        let slots = match &kernel {
            Some(k) => {
                let split3 = if m == 1 && f.split3 {
                    Some(self.resident_blocks(k, 32 * PACKED_GEMV_SPLIT3_WARPS as u32, 0)?)
                } else {
                    None
                };
                [
                    Some(self.resident_blocks(k, 32 * PACKED_GEMV_WARPS, 0)?),
                    split3,
                ]
            }
            None => [Some(self.decode_resident()?), None],
        };
        let nb = ncols / 32;
        let groups = nrows.div_ceil(PACK_ROWS);
        let split = packed_split(groups, nb, f.in_flight, slots, ksplit);
        let (ks, block_threads) = (split.ksplit, 32 * split.warps() as u32);
        let blocks = split.blocks(groups);
        match &fold {
            Some(Fold::Emit { weight, h, part }) => {
                if !matches!(out, GemvOut::Add(_)) {
                    return Err(shape(
                        K,
                        "a folded norm is emitted by a residual (Add) GEMV".into(),
                    ));
                }
                check_len(K, "norm weight", weight.len(), nrows)?;
                check_len(K, "h", h.len(), nrows)?;
                check_len(K, "norm partial sums", part.len(), blocks)?;
            }
            Some(Fold::Take { part, n_part, .. }) => {
                if *n_part == 0 {
                    return Err(shape(
                        K,
                        "a folded norm takes at least 1 partial sum".into(),
                    ));
                }
                check_len(K, "norm partial sums", part.len(), *n_part)?;
            }
            None => {}
        }
        let (rope_i, rope_scale) = match &out {
            GemvOut::RopeKv(r) => ([r.p.head_dim as i32, r.p.n_rot as i32], r.p.pos_scale),
            _ => ([0, 0], 0.0f32),
        };
        let n_part_i = match &fold {
            Some(Fold::Take { n_part, .. }) => to_i32(K, "partial sums", *n_part)?,
            _ => 0,
        };
        let grid = (
            u32::try_from(blocks).map_err(|_| shape(K, format!("{nrows} rows")))?,
            1,
            1,
        );
        let (nrows, nb, ks) = (
            to_i32(K, "nrows", nrows)?,
            to_i32(K, "blocks", nb)?,
            ks as i32,
        );
        let fold_kind = match &fold {
            Some(Fold::Emit { .. }) => FOLD_EMIT,
            Some(Fold::Take { .. }) => FOLD_TAKE,
            None => FOLD_NONE,
        };
        for t0 in (0..m).step_by(GEMV_BATCH) {
            let sc = GemvScalars {
                r1,
                r2,
                nrows,
                nb,
                ks,
                t0: t0 as i32,
                m: (m - t0).min(GEMV_BATCH) as i32,
                mode,
                n_part: n_part_i,
                rope: rope_i,
                rope_scale,
            };
            let Some(kernel) = &kernel else {
                // Recorded: the same arguments as the kernel's, in memory.
                let head = DecodeOpHead {
                    kind: DecodeOp::Gemv,
                    blocks,
                    variant: f.decode_index(),
                    fold: fold_kind,
                    grid: [0; 3],
                };
                let args = push_gemv(
                    ArgBlock::new(stream).view(w.data).view(x),
                    &mut out,
                    &mut fold,
                    &sc,
                );
                self.record_op(head, args.into_bytes())?;
                break;
            };
            // SAFETY: gemv_packed_<fmt>_f32[_x<B>|_take|_emit] (see push_gemv
            // for the parameters): reads the
            // packed groups of W (length checked: packed_bytes) and rows t0 ..
            // t0 + m of x (at most the checked m * nb * 32 floats) with 16-byte
            // loads (both aligned, checked), writes row r < nrows of those
            // tokens (m <= B: the kernel was picked for min(m, GEMV_BATCH)) to
            // its part (y, y1, y2 split at r1 <= r2 <= nrows; each part's
            // length checked by `bounds` for all m tokens), or adds it to y (m,
            // nrows; checked), or with glu writes row r / 2 of y (m, nrows / 2;
            // checked above); ksplit in {1, 2, 4} in blocks of 4 warps, or
            // for one token 3 in blocks of 6. _emit (m = 1) also reads nw
            // and writes h at rows < nrows and part at blocks < grid (lengths
            // checked); _take reads part[0 .. n_part) (checked); the others
            // get null pointers and never touch them. With kpool non-null (the
            // RopeKv output, m = 1, checked): the kernel writes q rows < r1
            // (q_dim or 0, checked), reads pos[0] (<= max_start, the
            // caller's promise), table[pos[0] / KV_PAGE] (length checked for
            // max_start) and inv_freq[..n_rot / 2] (checked), and writes
            // rows r1 .. r2 (K) and r2 .. nrows (V; kv_dim each or none,
            // checked) to row kv_row(table, pos[0]) of the pools (pages below
            // the pool's count, kept so by the caller; vpool as long as
            // kpool: checked).
            unsafe {
                push_gemv(
                    stream.launch(kernel).view(w.data).view(x),
                    &mut out,
                    &mut fold,
                    &sc,
                )
                .run(cfg(grid, block_threads))?
            };
        }
        Ok(GemvLaunch {
            ksplit: ks as u32,
            blocks,
        })
    }

    /// RoPE of the queries q (n_tok, p.n_head, head_dim) in place, and of
    /// the keys k (n_tok, n_head_kv, head_dim) into the FP16 pool `kpool`
    /// with the values v beside them into `vpool` (the layout of
    /// kernels/attention.cu): token t at position pos[t] of the sequence
    /// whose pages are `table`; k and v are left as they were. inv_freq:
    /// (n_rot / 2), base^(-2i/n_rot) with any per-dimension factors applied.
    /// pos is read on the device: `max_start` bounds pos[0], positions
    /// after it follow on (pos[t] = pos[0] + t).
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kv_append(
        &self,
        stream: &Stream,
        q: &mut DeviceBuffer<f32>,
        k: &DeviceView<'_, f32>,
        v: &DeviceView<'_, f32>,
        n_head_kv: usize,
        pos: &DeviceView<'_, i32>,
        inv_freq: &DeviceView<'_, f32>,
        p: &RopeParams,
        kpool: &mut DeviceBuffer<u16>,
        vpool: &mut DeviceBuffer<u16>,
        table: &DeviceView<'_, i32>,
        max_start: usize,
    ) -> Result<()> {
        const K: &str = "rope_kv_append";
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
        check_len(K, "inv_freq", inv_freq.len(), p.n_rot / 2)?;
        check_len(
            K,
            "table",
            table.len(),
            (max_start + n_tok).div_ceil(KV_PAGE),
        )?;
        let pages = kpool.len() / (KV_PAGE * kv_dim).max(1);
        check_len(K, "vpool", vpool.len(), pages * KV_PAGE * kv_dim)?;
        let name = match p.style {
            RopeStyle::Normal => "rope_kv_norm_f32",
            RopeStyle::Neox => "rope_kv_neox_f32",
        };
        let kernel = self.kernel("rope", name)?;
        let heads_per_block = (ROPE_THREADS as usize / (hd / 2)).max(1);
        let grid = (
            to_i32(K, "n_tok", n_tok)? as u32,
            (p.n_head + n_head_kv).div_ceil(heads_per_block) as u32,
            1,
        );
        to_i32(K, "positions", max_start + n_tok)?;
        let (n_head, n_kv, hd_i, n_rot) = (
            to_i32(K, "n_head", p.n_head)?,
            to_i32(K, "n_head_kv", n_head_kv)?,
            to_i32(K, "head_dim", hd)?,
            to_i32(K, "n_rot", p.n_rot)?,
        );
        // SAFETY: rope_kv_*_f32(float* q, int n_head, const float* k, const float* v,
        // int n_head_kv, const int* pos, const float* inv_freq, int head_dim, int n_rot,
        // float pos_scale, u16* kpool, u16* vpool, const int* table): block (t, c)
        // reads pos[t] (<= max_start + t, the caller's promise) and
        // table[pos[t] / KV_PAGE], rotates heads of token t of q in place, reads
        // k and v rows of token t and writes pool row kv_row(table, pos[t]) of
        // the pages the table names (below the pool's page count, kept so by
        // the caller); inv_freq[..n_rot/2] (<= ROPE_MAX_HALF, the shared
        // table); lengths checked above.
        unsafe {
            stream
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
                .view(table)
                .run(cfg(grid, ROPE_THREADS))?
        };
        Ok(())
    }

    /// g = silu(g) * u over the first `n` elements.
    pub fn swiglu(
        &self,
        stream: &Stream,
        g: &mut DeviceBuffer<f32>,
        u: &DeviceView<'_, f32>,
        n: usize,
    ) -> Result<()> {
        self.in_place("swiglu_f32", stream, g, u, n)
    }

    /// SwiGLU of an interleaved gate/up projection gu (m, 2f) (the rows of a
    /// stack from [`crate::interleave_glu`]): out (m, f) = silu(gate) * up.
    pub fn swiglu_pairs(
        &self,
        stream: &Stream,
        gu: &DeviceView<'_, f32>,
        out: &mut DeviceBuffer<f32>,
        m: usize,
        f: usize,
    ) -> Result<()> {
        const K: &str = "swiglu_pairs_f32";
        if !f.is_multiple_of(2) {
            return Err(shape(K, format!("{f} columns: pairs")));
        }
        check_len(K, "gu", gu.len(), 2 * m * f)?;
        check_len(K, "out", out.len(), m * f)?;
        if !gu.is_aligned(8) {
            return Err(shape(K, "gu must start at a multiple of 8 bytes".into()));
        }
        let pairs = m * f / 2;
        if pairs == 0 {
            return Ok(());
        }
        let kernel = self.kernel("elementwise", K)?;
        let n = pairs as i64;
        // SAFETY: swiglu_pairs_f32(const float* gu, float* out, long long n):
        // reads gu[..4n] and writes out[..2n] as float2 (gu 8-byte aligned,
        // checked; out a buffer's start); lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .view(gu)
                .buf_mut(out)
                .scalar(&n)
                .run(cfg((self.flat_grid(pairs), 1, 1), ELEMENTWISE_THREADS))?
        };
        Ok(())
    }

    /// y += x over the first `n` elements (the residual connection).
    pub fn add(
        &self,
        stream: &Stream,
        y: &mut DeviceBuffer<f32>,
        x: &DeviceView<'_, f32>,
        n: usize,
    ) -> Result<()> {
        self.in_place("add_f32", stream, y, x, n)
    }

    /// y[r, c] += b[c] for the first `rows` rows of y (rows of b.len()).
    pub fn add_rows(
        &self,
        stream: &Stream,
        y: &mut DeviceBuffer<f32>,
        b: &DeviceView<'_, f32>,
        rows: usize,
    ) -> Result<()> {
        const K: &str = "add_rows_f32";
        let width = b.len();
        let n = rows * width;
        check_len(K, "y", y.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let kernel = self.kernel("elementwise", K)?;
        let grid = (self.flat_grid(n), 1, 1);
        let (n, width) = (n as i64, to_i32(K, "width", width)?);
        // SAFETY: add_rows_f32(float* y, const float* b, long long n, int width):
        // grid-stride over i < n reading b[i % width]; lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(y)
                .view(b)
                .scalar(&n)
                .scalar(&width)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }

    /// The element-wise kernels of the form `k(float* y, const float* x, long long n)`
    /// that update y from x in place (kernels/elementwise.cu).
    fn in_place(
        &self,
        name: &'static str,
        stream: &Stream,
        y: &mut DeviceBuffer<f32>,
        x: &DeviceView<'_, f32>,
        n: usize,
    ) -> Result<()> {
        check_len(name, "output", y.len(), n)?;
        check_len(name, "input", x.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let kernel = self.kernel("elementwise", name)?;
        let grid = (self.flat_grid(n), 1, 1);
        let n = n as i64;
        // SAFETY: swiglu_f32 and add_f32 are (float* y, const float* x, long long n),
        // grid-stride over i < n; lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(y)
                .view(x)
                .scalar(&n)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }

    /// y = fp16(x) (round to nearest even) over the first `n` elements; y
    /// holds FP16 bit patterns.
    pub fn f32_to_f16(
        &self,
        stream: &Stream,
        x: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<u16>,
        n: usize,
    ) -> Result<()> {
        const K: &str = "f32_to_f16";
        check_len(K, "x", x.len(), n)?;
        check_len(K, "y", y.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let kernel = self.kernel("elementwise", K)?;
        let grid = (self.flat_grid(n), 1, 1);
        let n = n as i64;
        // SAFETY: f32_to_f16(const float* x, u16* y, long long n): grid-stride over
        // i < n, lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .view(x)
                .buf_mut(y)
                .scalar(&n)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }
}

/// Benchmark helpers (kernels/bench.cu).
impl Kernels {
    /// Read every byte of `buf` (whole 16-byte vectors) once; one word per
    /// block goes to `out`, which needs `probe_blocks()` elements. The read
    /// bandwidth this reaches is the ceiling GEMV is measured against.
    pub fn read_probe(
        &self,
        stream: &Stream,
        buf: &DeviceView<'_, u8>,
        out: &mut DeviceBuffer<u32>,
    ) -> Result<()> {
        const K: &str = "read_probe";
        if !buf.is_aligned(16) {
            return Err(shape(
                K,
                "buffer must start at a multiple of 16 bytes".into(),
            ));
        }
        let blocks = self.probe_blocks();
        check_len(K, "out", out.len(), blocks)?;
        let kernel = self.kernel("bench", K)?;
        let n_vec = (buf.len() / 16) as i64;
        // SAFETY: read_probe(const uint4* p, long long n_vec, u32* out): reads
        // n_vec whole vectors inside buf, writes out[..grid]; checked above.
        unsafe {
            stream
                .launch(&kernel)
                .view(buf)
                .scalar(&n_vec)
                .buf_mut(out)
                .run(cfg((blocks as u32, 1, 1), 256))?
        };
        Ok(())
    }

    /// FMA chains per thread of `fma_probe` (`FMA_CHAINS` in kernels/bench.cu).
    const FMA_CHAINS: u64 = 8;

    /// Run `iters` rounds of FMA_CHAINS dependent FMAs in every thread of
    /// `probe_blocks()` blocks of 256; `out` needs `probe_blocks() * 256`
    /// floats. Returns the FLOPs done (2 per FMA); the rate this reaches is
    /// the FP32 ceiling prefill is measured against.
    pub fn fma_probe(
        &self,
        stream: &Stream,
        out: &mut DeviceBuffer<f32>,
        iters: u32,
    ) -> Result<u64> {
        const K: &str = "fma_probe";
        let blocks = self.probe_blocks();
        check_len(K, "out", out.len(), blocks * 256)?;
        let kernel = self.kernel("bench", K)?;
        let (iters_i, a, b) = (to_i32(K, "iters", iters as usize)?, 0.999_f32, 0.5_f32);
        // SAFETY: fma_probe(float* out, int iters, float a, float b) writes
        // out[block * 256 + thread] for the grid launched; length checked above.
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(out)
                .scalar(&iters_i)
                .scalar(&a)
                .scalar(&b)
                .run(cfg((blocks as u32, 1, 1), 256))?
        };
        Ok(2 * Self::FMA_CHAINS * iters as u64 * blocks as u64 * 256)
    }

    /// Blocks of a `read_probe` launch: 8 per SM.
    pub fn probe_blocks(&self) -> usize {
        self.device().info().sm_count.max(1) as usize * 8
    }

    /// Fill `buf` with pseudo-random words (whole words; a trailing partial
    /// word is left alone) from `seed`.
    pub fn fill_random(
        &self,
        stream: &Stream,
        buf: &mut DeviceBuffer<u8>,
        seed: u32,
    ) -> Result<()> {
        const K: &str = "fill_random";
        let n = (buf.len() / 4) as i64;
        if n == 0 {
            return Ok(());
        }
        let kernel = self.kernel("bench", K)?;
        let grid = (self.flat_grid(n as usize), 1, 1);
        // SAFETY: fill_random(u32* p, long long n, u32 seed): grid-stride over the
        // n whole words of buf (allocations are 256-byte aligned).
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(buf)
                .scalar(&n)
                .scalar(&seed)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn packed_gemv_block_sizes_match_the_kernels() {
        // `#define NAME n` in gemv_packed.cuh.
        let src = include_str!("../../../kernels/gemv_packed.cuh");
        let define =
            |name: &str| crate::cuda_define(src, name).and_then(|v| v.parse::<usize>().ok());
        assert_eq!(define("PGEMV_WARPS"), Some(PACKED_GEMV_WARPS as usize));
        assert_eq!(define("PGEMV_MAX_WARPS"), Some(PACKED_GEMV_SPLIT3_WARPS));
        // A 3-way split's block holds whole groups of 3 warps.
        assert_eq!(PACKED_GEMV_SPLIT3_WARPS % 3, 0);
    }

    #[test]
    fn packed_splits_fill_the_gpu_within_the_row() {
        // H100 (132 SMs; 7 blocks of 4 warps or 4 of 6 an SM).
        let h100 = [Some(924), Some(528)];
        let split = |g, nb, u, slots: [Option<usize>; 2], k| {
            let p = packed_split(g, nb, u, slots, k);
            assert_eq!(p.warps(), if p.ksplit == 3 { 6 } else { 4 });
            p.ksplit
        };
        // 14336 rows (3584 groups) fill one wave unsplit.
        assert_eq!(split(3584, 128, 4, h100, None), 1);
        // 4096 x 14336 (1024 groups, 56 runs): 2 warps a group fit in a
        // wave, 4 not. 3 (512 blocks of 6): a lane's 19 blocks, 2 in
        // flight, are 10 rounds instead of 14; 4 in flight, 5 against 7.
        assert_eq!(split(1024, 448, 2, h100, None), 3);
        assert_eq!(split(1024, 448, 4, h100, None), 3);
        // Without 6-warp blocks (several tokens, the persistent kernel): 2.
        assert_eq!(split(1024, 448, 2, [Some(924), None], None), 2);
        // 4096 x 4096 (16 runs): with 4 blocks in flight 2 rounds either
        // way, so 2; with 2, 3 rounds against 4.
        assert_eq!(split(1024, 128, 4, h100, None), 2);
        assert_eq!(split(1024, 128, 2, h100, None), 3);
        // Where 4 fits in a wave it wins (1B: 768 groups of 2048).
        assert_eq!(split(768, 64, 4, h100, None), 4);
        assert_eq!(split(1024, 128, 4, [Some(1056), Some(528)], None), 4);
        // 6144 rows (1536 groups): 768 blocks of 2 groups.
        assert_eq!(split(1536, 128, 4, h100, None), 2);
        // Nothing fits in a wave (28672 rows; an M40's 168 slots): no split.
        assert_eq!(split(7168, 128, 4, h100, None), 1);
        assert_eq!(split(1024, 448, 4, [Some(168), Some(96)], None), 1);
        assert_eq!(split(300, 128, 4, [Some(100), Some(60)], None), 1);
        assert_eq!(split(300, 128, 4, [Some(150), Some(60)], None), 2);
        // Too few groups for a big split: the largest the row allows.
        let big = [Some(1320), Some(880)];
        assert_eq!(split(1, 128, 4, big, None), 4);
        assert_eq!(split(1, 9, 4, big, None), 2);
        assert_eq!(split(1, 17, 1, big, None), 3);
        assert_eq!(split(1, 1, 4, big, None), 1);
        // Forced splits are lowered to what the row allows, never raised.
        assert_eq!(split(1, 128, 4, big, Some(4)), 4);
        assert_eq!(split(1, 128, 4, big, Some(3)), 3);
        assert_eq!(split(1, 128, 4, [Some(1320), None], Some(3)), 2);
        assert_eq!(split(1, 12, 4, big, Some(4)), 2);
        assert_eq!(split(1, 8, 4, big, Some(2)), 1);
        assert_eq!(split(9000, 128, 4, [Some(1), Some(1)], Some(1)), 1);
        // Blocks: groups over the groups a block takes.
        assert_eq!(PackedSplit::of(2).blocks(1025), 513);
        assert_eq!(PackedSplit::of(3).blocks(1025), 513);
        assert_eq!(PackedSplit::of(4).blocks(1025), 1025);
    }

    /// The launchers' shared-memory figures match what ptxas reported for the
    /// committed PTX, and all fit in 48 KB.
    #[test]
    fn gemv_shared_memory_matches_ptxas_report() {
        let report = include_str!("../../../kernels/ptx/gemv.sm_52.txt");
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

    /// Every kernel a launcher names is in the committed PTX.
    #[test]
    fn kernel_names_exist_in_ptx() {
        let all: Vec<&str> = crate::MODULES.iter().map(|(_, p)| *p).collect();
        let has = |n: &str| all.iter().any(|p| p.contains(&format!(".entry {n}(")));
        for f in KernelFormat::ALL {
            assert!(has(f.gemv), "{}", f.gemv);
            assert!(has(f.embed), "{}", f.embed);
            for n in crate::attention::gemm_names(&f) {
                assert!(has(n), "{n}");
            }
        }
        for f in PackFormat::ALL {
            for n in [f.gemv, f.gemm, f.gemm_small, f.embed]
                .iter()
                .chain(&f.gemv_batch)
            {
                assert!(has(n), "{n}");
            }
        }
        for n in [
            "read_probe",
            "fill_random",
            "fma_probe",
            "rmsnorm_f32",
            "rope_kv_norm_f32",
            "rope_kv_neox_f32",
            "swiglu_f32",
            "swiglu_pairs_f32",
            "add_f32",
            "add_rows_f32",
            "f32_to_f16",
            "select_top_k_f32",
            "attn_combine_f32",
            "attn_f32_r4",
            "gemm_q4_k_f32",
        ] {
            assert!(has(n), "{n}");
        }
    }
}
