//! The GEMV over the packed layout (kernels/gemv_packed.cu): one to 16
//! tokens, stacked outputs, SwiGLU, the residual add, folded RMSNorm and
//! RoPE with the KV append.

use m40_device::{DeviceBuffer, DeviceView, KernelArgs, Stream};

use m40_gguf::hparams::Activation;

use crate::decode::{DecodeOp, DecodeOpHead, Exec, OpArgs, FOLD_EMIT, FOLD_NONE, FOLD_TAKE};
use crate::elementwise::act_id;
use crate::error::Result;
use crate::launch::{cfg, check_len, shape, to_i32};
use crate::layout::{PackedMatrix, RowSplit, KV_PAGE};
use crate::pack::{PackFormat, PACK_ROWS};
use crate::rope::{KvAppend, RopeStyle};
use crate::Kernels;

mod split;

use split::{packed_split, PACKED_GEMV_SPLIT3_WARPS};

/// Tokens one [`Kernels::gemv_packed_batch`] call takes at most (one
/// launch, chunks of up to 8).
pub const PACKED_GEMV_MAX_TOKENS: usize = 128;

/// Tokens a block of a packed GEMV takes at most (more run in chunks of
/// the chunked kernel, a chunk a grid row).
const GEMV_BATCH: usize = 8;
/// Warps per block of kernels/gemv_packed.cu (`PGEMV_WARPS`).
const PACKED_GEMV_WARPS: u32 = 4;
/// The kernels' `mode`s (kernels/gemv_packed.cuh): stored, added, the gate
/// of gate/up pairs (plus the activation's number).
const PGEMV_STORE: i32 = 0;
const PGEMV_ADD: i32 = 2;
const PGEMV_GLU: i32 = 3;

/// Where the packed GEMV writes: the parts of a stack, the gate (SwiGLU,
/// GeGLU, ...) of an interleaved gate/up stack (y (m, rows / 2)), or added
/// to y (m, rows): the residual connection.
pub enum GemvOut<'a, 'b, 'c> {
    Parts(RowSplit<'a, 'b>),
    Glu(&'c mut DeviceBuffer<f32>, Activation),
    Add(&'c mut DeviceBuffer<f32>),
    /// A Q/K/V stack of one token (rows: q_dim, then K and V of n_head_kv
    /// heads each), or the part of one that [`RopeKv::parts`] names, with
    /// RoPE and the KV append folded in: the rotated queries to `q`, K
    /// (rotated) and V to the pools as [`Kernels::rope_kv_append`] (with
    /// [`RopeKv::bias`]: [`Kernels::rope_kv_append_biased`]) would. The
    /// normal (llama) style only: a NeoX model's heads fold when uploaded
    /// with each pair's rows adjacent (m40-model's GPU weights).
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
    /// Where K and V go (one token: pos[0] only).
    pub kv: KvAppend<'a, 'c>,
    /// The matrix's rows' biases (as many as it has rows: its parts' of
    /// Q's, K's and V's), added to the sums before the rotation (qwen2,
    /// gpt-oss), or None.
    pub bias: Option<&'a DeviceView<'a, f32>>,
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

/// How many tokens a packed GEMV takes, how it splits its rows, and the
/// half of a folded norm it does.
pub struct GemvOpts<'a, 'b> {
    /// Tokens of x (1 ..= [`PACKED_GEMV_MAX_TOKENS`]).
    pub m: usize,
    /// Warps per row group (1, 2 or 4; lowered to what the row allows);
    /// None: [`packed_split`]'s choice.
    pub ksplit: Option<u32>,
    /// One token only.
    pub fold: Option<Fold<'a, 'b>>,
}

impl GemvOpts<'_, '_> {
    /// `m` tokens, the split chosen by the launcher, no fold.
    pub fn tokens(m: usize) -> Self {
        Self::split(m, None)
    }

    /// `m` tokens, `ksplit` forced (see [`GemvOpts::ksplit`]), no fold.
    pub fn split(m: usize, ksplit: Option<u32>) -> Self {
        GemvOpts {
            m,
            ksplit,
            fold: None,
        }
    }
}

/// The scalar parameters of a packed GEMV launch (see [`push_gemv`]).
struct GemvScalars {
    r1: i32,
    r2: i32,
    nrows: i32,
    nb: i32,
    ks: i32,
    /// The first token (0), or for the chunked kernel a chunk's tokens.
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
/// int n_rot, float pos_scale (null and zeros where unused; with RopeKv,
/// nw is its biases or null); `l` holds W and x already.
fn push_gemv<'l, A: KernelArgs<'l>>(
    l: A,
    out: &'l mut GemvOut<'_, '_, '_>,
    fold: &'l mut Option<Fold<'_, '_>>,
    sc: &'l GemvScalars,
) -> A {
    let (l, rk, bias) = match out {
        GemvOut::Parts(y) => (y.push(l), None, None),
        GemvOut::Glu(y, _) | GemvOut::Add(y) => (l.buf_mut(&mut **y).null().null(), None, None),
        GemvOut::RopeKv(r) => {
            let RopeKv {
                q,
                kv:
                    KvAppend {
                        pos,
                        inv_freq,
                        table,
                        kpool,
                        vpool,
                        ..
                    },
                bias,
                ..
            } = r;
            let l = l.buf_mut(&mut **q).null().null();
            (
                l,
                Some((*pos, *inv_freq, *table, &mut **kpool, &mut **vpool)),
                *bias,
            )
        }
    };
    // The RoPE fold's biases ride in nw, which only FOLD_EMIT (never
    // with RopeKv: checked) otherwise reads.
    let nw = |l: A| match bias {
        Some(b) => l.view(b),
        None => l.null(),
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
            nw(l).null().view(part).scalar(&sc.n_part).scalar(eps)
        }
        None => nw(l).null().null().scalar(&ZERO_I32).scalar(&ZERO_F32),
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

/// A packed GEMV's arguments (see [`push_gemv`]), for
/// [`Kernels::submit`].
struct GemvArgs<'r, 'a, 'b, 'c, 'd, 'e> {
    w: &'r DeviceView<'r, u8>,
    x: &'r DeviceView<'r, f32>,
    out: &'r mut GemvOut<'a, 'b, 'c>,
    fold: &'r mut Option<Fold<'d, 'e>>,
    sc: &'r GemvScalars,
}

impl OpArgs for GemvArgs<'_, '_, '_, '_, '_, '_> {
    fn push<'l, A: KernelArgs<'l>>(&'l mut self, a: A) -> A {
        push_gemv(a.view(self.w).view(self.x), self.out, self.fold, self.sc)
    }
}

/// What a packed GEMV launched: warps per row group and blocks (per launch
/// of up to 8 tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvLaunch {
    pub ksplit: u32,
    pub blocks: usize,
}

impl Kernels {
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
    /// than 8 run in chunks of up to 8, one launch). Y: each part (m, its
    /// rows). Returns the
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
        self.gemv_packed_to(stream, w, x, GemvOut::Parts(y), GemvOpts::split(m, ksplit))
            .map(|l| l.ksplit)
    }

    /// A mixture's experts' GEMVs over packed matrices (one token a
    /// slot): for slot j < s.n s.k, y[j] = W[ids[j]] x[j / x_per], `w` the
    /// experts' packed matrices of `rows` rows each, one after another
    /// (ids clamped into them); with `act`, each an expert's gate and up
    /// interleaved ([`crate::interleave_glu`]) and y[j] (rows / 2) =
    /// act(gate + gate bias, up + up bias), `bias` (with `act` only) each
    /// expert's `rows` biases in its stack's row order (gpt-oss), or none.
    /// As [`crate::Kernels::gemv_experts`] over GGUF rows. With `tiles`
    /// (the slots grouped by expert: [`Self::moe_tiles`] of these ids),
    /// a block row takes a tile, each weight read once for its slots.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_packed_experts(
        &self,
        stream: &Stream,
        w: &PackedMatrix<'_>,
        rows: usize,
        ids: &DeviceView<'_, i32>,
        x: &DeviceView<'_, f32>,
        x_per: usize,
        y: &mut DeviceBuffer<f32>,
        s: crate::MoeShape,
        act: Option<Activation>,
        bias: Option<&DeviceView<'_, f32>>,
        tiles: Option<crate::ExpertTiles<'_, '_>>,
    ) -> Result<()> {
        const K: &str = "gemv_packed_experts";
        let f = PackFormat::checked(K, w.ty, w.cols)?;
        if rows == 0
            || !rows.is_multiple_of(PACK_ROWS)
            || !w.rows.is_multiple_of(rows)
            || x_per == 0
        {
            return Err(shape(
                K,
                format!("{} rows are not matrices of {rows} (groups of 4)", w.rows),
            ));
        }
        let (n_mat, slots) = (w.rows / rows, s.n * s.k);
        let out_rows = if act.is_some() { rows / 2 } else { rows };
        let mat_bytes = f.packed_bytes(rows, w.cols);
        check_len(K, "weights", w.data.len(), n_mat * mat_bytes)?;
        check_len(K, "ids", ids.len(), slots)?;
        check_len(K, "x", x.len(), slots.div_ceil(x_per) * w.cols)?;
        check_len(K, "y", y.len(), slots * out_rows)?;
        if let Some(b) = bias {
            if act.is_none() {
                return Err(shape(K, "biases go with a GLU only".into()));
            }
            check_len(K, "bias", b.len(), n_mat * rows)?;
        }
        if !x.is_aligned(16) || !w.data.is_aligned(16) {
            return Err(shape(
                K,
                "weights and x must start at multiples of 16 bytes".into(),
            ));
        }
        if slots == 0 {
            return Ok(());
        }
        // Block rows: a slot each, or a tile each.
        let block_rows = match tiles {
            Some(t) => {
                if t.cap == 0 || t.cap > crate::MOE_GEMV_TILE {
                    return Err(shape(K, format!("tiles of {} slots (1 to 8)", t.cap)));
                }
                check_len(K, "order", t.order.len(), slots)?;
                let bound = crate::moe_tile_bound(slots, n_mat, t.cap);
                check_len(K, "tiles", t.tiles.len(), 1 + 2 * bound)?;
                bound
            }
            None => slots,
        };
        if block_rows > 65535 {
            return Err(shape(K, format!("{slots} slots: grid too large")));
        }
        let name = if tiles.is_some() {
            f.gemv_grp
        } else {
            f.gemv_id
        };
        let kernel = self.kernel("gemv_packed", name)?;
        let groups = rows / PACK_ROWS;
        let grid = (
            groups.div_ceil(PACKED_GEMV_WARPS as usize) as u32,
            block_rows as u32,
            1,
        );
        let mode = act.map_or(PGEMV_STORE, |a| PGEMV_GLU + act_id(a));
        let (nrows, nb, n_mat) = (
            to_i32(K, "rows", rows)?,
            to_i32(K, "blocks", w.cols / 32)?,
            to_i32(K, "experts", n_mat)?,
        );
        let (ks, mat_bytes, x_per) = (1i32, mat_bytes as i64, to_i32(K, "x_per", x_per)?);
        // SAFETY: gemv_packed_id_<fmt>_f32(const u8* W, const float* x, float*
        // y, int nrows, int nb, int ksplit, int mode, const int* ids, int n_mat,
        // long long mat_bytes, int x_per, const float* bias): block (b, j)
        // reads ids[j] (slots of them, checked), clamps it below n_mat and
        // reads that expert's packed matrix (n_mat of mat_bytes each,
        // checked, 16-byte aligned) at the row groups 4 b .. 4 b + 3 (< rows
        // / 4: the grid), with a GLU its biases (rows of n_mat, checked) or
        // null, x row j / x_per (checked, 16-byte aligned), and writes y row
        // j (out_rows each, checked); blocks of PACKED_GEMV_WARPS warps, one
        // group a warp. gemv_packed_grp_<fmt>_f32(W, x, y, nrows, nb, mode,
        // ids, const int* order, const int* tiles, n_mat, mat_bytes, x_per,
        // bias): block (b, i) with i < tiles[0] reads tile i (tiles[1 + 2
        // i], tiles[2 + 2 i]: moe_tiles's, within its bound, checked) and
        // its slots order[start ..][..m] (< slots: a permutation), then as
        // above for each of those slots j.
        unsafe {
            let l = stream
                .launch(&kernel)
                .view(w.data)
                .view(x)
                .buf_mut(y)
                .scalar(&nrows)
                .scalar(&nb);
            let l = match tiles {
                Some(t) => l.scalar(&mode).view(ids).view(t.order).view(t.tiles),
                None => l.scalar(&ks).scalar(&mode).view(ids),
            };
            let l = l.scalar(&n_mat).scalar(&mat_bytes).scalar(&x_per);
            match bias {
                Some(b) => l.view(b),
                None => l.null(),
            }
            .run(cfg(grid, 32 * PACKED_GEMV_WARPS))?
        };
        Ok(())
    }

    /// A GLU through the packed GEMV: `w` is a gate/up stack interleaved
    /// by [`crate::interleave_glu`] (2f rows: gate 0, gate 1, up 0, up 1,
    /// gate 2, ...), and y (m, f) = act(gate x) * up x for the m tokens of
    /// x, the gate and up sums never leaving registers. As
    /// [`Self::gemv_packed_batch`] otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_packed_glu(
        &self,
        stream: &Stream,
        act: Activation,
        w: &PackedMatrix<'_>,
        x: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        m: usize,
        ksplit: Option<u32>,
    ) -> Result<u32> {
        self.gemv_packed_to(
            stream,
            w,
            x,
            GemvOut::Glu(y, act),
            GemvOpts::split(m, ksplit),
        )
        .map(|l| l.ksplit)
    }

    /// The packed GEMV in full: `opts.m` tokens of x written as `out` says,
    /// and with `opts.fold` (one token) one half of a folded RMSNorm. As
    /// [`Self::gemv_packed_batch`] otherwise.
    pub fn gemv_packed_to(
        &self,
        stream: &Stream,
        w: &PackedMatrix<'_>,
        x: &DeviceView<'_, f32>,
        out: GemvOut<'_, '_, '_>,
        opts: GemvOpts<'_, '_>,
    ) -> Result<GemvLaunch> {
        self.gemv_packed_at(stream, w, x, out, opts, 0)
    }

    /// [`Self::gemv_packed_to`] of tokens `first .. first + m` of x and of
    /// `out` (`Parts` or `Add`; m <= 8): the rows a step's GEMM leaves
    /// after its last full tile.
    pub fn gemv_packed_rows(
        &self,
        stream: &Stream,
        w: &PackedMatrix<'_>,
        x: &DeviceView<'_, f32>,
        out: GemvOut<'_, '_, '_>,
        first: usize,
        m: usize,
    ) -> Result<GemvLaunch> {
        self.gemv_packed_at(stream, w, x, out, GemvOpts::tokens(m), first)
    }

    fn gemv_packed_at(
        &self,
        stream: &Stream,
        w: &PackedMatrix<'_>,
        x: &DeviceView<'_, f32>,
        mut out: GemvOut<'_, '_, '_>,
        opts: GemvOpts<'_, '_>,
        first: usize,
    ) -> Result<GemvLaunch> {
        const K: &str = "gemv_packed";
        let GemvOpts {
            m,
            ksplit,
            mut fold,
        } = opts;
        if !(1..=PACKED_GEMV_MAX_TOKENS).contains(&m) {
            return Err(shape(
                K,
                format!("{m} tokens (1 to {PACKED_GEMV_MAX_TOKENS} per launch)"),
            ));
        }
        if fold.is_some() && m != 1 {
            return Err(shape(K, format!("a folded norm takes 1 token, not {m}")));
        }
        // From token `first` on: the plain kernels' t0 (one launch of at
        // most GEMV_BATCH tokens, not the one-token kernel, which takes
        // token 0), into outputs of a row per token (stored or added).
        let rows_out = matches!(out, GemvOut::Parts(_) | GemvOut::Add(_));
        if first > 0 && (m > GEMV_BATCH || fold.is_some() || !rows_out) {
            return Err(shape(
                K,
                format!("tokens from {first}: at most {GEMV_BATCH} into Parts or Add, not {m}"),
            ));
        }
        let to = first + m;
        to_i32(K, "tokens", to)?;
        let f = PackFormat::checked(K, w.ty, w.cols)?;
        let (nrows, ncols) = (w.rows, w.cols);
        if nrows == 0 {
            return Ok(GemvLaunch {
                ksplit: 1,
                blocks: 0,
            });
        }
        check_len(K, "weights", w.data.len(), f.packed_bytes(nrows, ncols))?;
        check_len(K, "x", x.len(), to * ncols)?;
        let (r1, r2, mode) = match &out {
            GemvOut::Parts(y) => {
                let (r1, r2) = y.bounds(K, nrows, to)?;
                (r1, r2, PGEMV_STORE)
            }
            GemvOut::Add(y) => {
                check_len(K, "y", y.len(), to * nrows)?;
                let r = to_i32(K, "rows", nrows)?;
                (r, r, PGEMV_ADD)
            }
            GemvOut::RopeKv(r) => {
                let (p, hd) = (r.kv.p, r.kv.p.head_dim);
                let (q_dim, kv_dim) = (p.n_head * hd, r.kv.n_head_kv * hd);
                if m != 1 || p.style != RopeStyle::Normal {
                    return Err(shape(
                        K,
                        format!("RoPE folds into one token's GEMV of the normal style, not {m} tokens, {:?}", p.style),
                    ));
                }
                if r.kv.format != crate::KvType::F16 {
                    return Err(shape(
                        K,
                        format!(
                            "RoPE folds into a GEMV over FP16 pages, not {:?}",
                            r.kv.format
                        ),
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
                if let Some(b) = r.bias {
                    check_len(K, "bias", b.len(), nrows)?;
                }
                check_len(K, "pos", r.kv.pos.len(), 1)?;
                // The frequencies and the magnitude scale after them.
                check_len(K, "inv_freq", r.kv.inv_freq.len(), p.n_rot / 2 + 1)?;
                check_len(
                    K,
                    "table",
                    r.kv.table.len(),
                    (r.kv.max_start + 1).div_ceil(KV_PAGE),
                )?;
                to_i32(K, "positions", r.kv.max_start + 1)?;
                let pages = r.kv.kpool.len() / (KV_PAGE * kv_dim).max(1);
                check_len(K, "vpool", r.kv.vpool.len(), pages * KV_PAGE * kv_dim)?;
                (to_i32(K, "rows", r1)?, to_i32(K, "rows", r2)?, 0i32)
            }
            GemvOut::Glu(y, act) => {
                if !nrows.is_multiple_of(4) {
                    return Err(shape(
                        K,
                        format!("{nrows} rows: a gate/up stack holds groups of 4"),
                    ));
                }
                check_len(K, "y", y.len(), to * nrows / 2)?;
                let r = to_i32(K, "rows", nrows)?;
                (r, r, PGEMV_GLU + act_id(*act))
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
            (1, None) if first == 0 => f.gemv,
            (1, None) => f.gemv_batch[0],
            (2, _) => f.gemv_batch[0],
            (3..=4, _) => f.gemv_batch[1],
            (5..=GEMV_BATCH, _) => f.gemv_batch[2],
            _ => f.gemv_chunked,
        };
        // More than GEMV_BATCH tokens run in `chunks` of `chunk` (the last
        // may be shorter) through the chunked kernel, one launch: grid row y
        // takes chunk y (a kernel computes all of its B tokens, repeating a
        // chunk's last for fewer).
        let chunks = m.div_ceil(GEMV_BATCH);
        let chunk = m.div_ceil(chunks);
        // One token is an op the persistent kernel has (crate::decode),
        // planned then for its resident blocks.
        let exec = self.exec(m == 1 && first == 0, || self.kernel("gemv_packed", name(m)))?;
        let slots = match &exec {
            Exec::Launch(k) => {
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
            Exec::Record { resident } => [Some(*resident), None],
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
            GemvOut::RopeKv(r) => (
                [r.kv.p.head_dim as i32, r.kv.p.n_rot as i32],
                r.kv.p.pos_scale,
            ),
            _ => ([0, 0], 0.0f32),
        };
        let n_part_i = match &fold {
            Some(Fold::Take { n_part, .. }) => to_i32(K, "partial sums", *n_part)?,
            _ => 0,
        };
        let grid = (
            u32::try_from(blocks).map_err(|_| shape(K, format!("{nrows} rows")))?,
            chunks as u32,
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
        let sc = GemvScalars {
            r1,
            r2,
            nrows,
            nb,
            ks,
            t0: if chunks > 1 {
                chunk as i32
            } else {
                first as i32
            },
            m: m as i32,
            mode,
            n_part: n_part_i,
            rope: rope_i,
            rope_scale,
        };
        let head = DecodeOpHead {
            kind: DecodeOp::Gemv,
            blocks,
            variant: f.decode_index(),
            fold: fold_kind,
            grid: [0; 3],
        };
        let mut args = GemvArgs {
            w: w.data,
            x,
            out: &mut out,
            fold: &mut fold,
            sc: &sc,
        };
        // SAFETY: gemv_packed_<fmt>_f32[_x<B>|_take|_emit] (see push_gemv
        // for the parameters): reads the
        // packed groups of W (length checked: packed_bytes) and rows first
        // .. first + m of x (at most the checked (first + m) * nb * 32
        // floats; first > 0 only with m <= GEMV_BATCH, unchunked, t0 =
        // first, checked) with 16-byte
        // loads (both aligned, checked; a chunk of fewer than the kernel's B
        // tokens reads its last again for the rest), writes row r < nrows of
        // those tokens (m <= B: the kernel was picked for m; chunked, grid
        // row y the tokens y * chunk .. min(m, (y + 1) * chunk), chunk <= 8,
        // chunks * chunk >= m and (chunks - 1) * chunk < m) to
        // its part (y, y1, y2 split at r1 <= r2 <= nrows; each part's
        // length checked by `bounds` for first + m tokens), or adds it to y
        // (first + m, nrows; checked), or with glu writes row r / 2 of y
        // (first + m, nrows / 2; checked above); ksplit in {1, 2, 4} in blocks of 4 warps, or
        // for one token 3 in blocks of 6. _emit (m = 1) also reads nw
        // and writes h at rows < nrows and part at blocks < grid (lengths
        // checked); _take reads part[0 .. n_part) (checked); the others
        // get null pointers and never touch them. With kpool non-null (the
        // RopeKv output, m = 1, checked): the kernel writes q rows < r1
        // (q_dim or 0, checked), reads pos[0] (<= max_start, the
        // caller's promise), table[pos[0] / KV_PAGE] (length checked for
        // max_start) and inv_freq[..=n_rot / 2] (checked), and writes
        // rows r1 .. r2 (K) and r2 .. nrows (V; kv_dim each or none,
        // checked) to row kv_row(table, pos[0]) of the pools (pages below
        // the pool's count, kept so by the caller; vpool as long as
        // kpool: checked); nw is then RopeKv's biases (nrows, checked) or
        // null, read at rows < nrows. Recorded (one token), the
        // persistent kernel's virtual blocks do the same with the same
        // arguments.
        unsafe { self.submit(stream, &exec, cfg(grid, block_threads), head, &mut args)? };
        Ok(GemvLaunch {
            ksplit: ks as u32,
            blocks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::split::PACKED_GEMV_SPLIT3_WARPS;
    use super::*;

    #[test]
    fn packed_gemv_block_sizes_match_the_kernels() {
        // `#define NAME n` in gemv_packed.cuh.
        let src = include_str!("../../../kernels/gemv_packed.cuh");
        let define =
            |name: &str| crate::cuda_define(src, name).and_then(|v| v.parse::<usize>().ok());
        assert_eq!(define("PGEMV_WARPS"), Some(PACKED_GEMV_WARPS as usize));
        assert_eq!(define("PGEMV_MAX_WARPS"), Some(PACKED_GEMV_SPLIT3_WARPS));
        assert_eq!(define("PGEMV_STORE"), Some(PGEMV_STORE as usize));
        assert_eq!(define("PGEMV_ADD"), Some(PGEMV_ADD as usize));
        assert_eq!(define("PGEMV_GLU"), Some(PGEMV_GLU as usize));
        for (name, v) in [
            ("FOLD_NONE", FOLD_NONE),
            ("FOLD_TAKE", FOLD_TAKE),
            ("FOLD_EMIT", FOLD_EMIT),
        ] {
            assert_eq!(define(name), Some(v as usize), "{name}");
        }
        // A 3-way split's block holds whole groups of 3 warps.
        assert_eq!(PACKED_GEMV_SPLIT3_WARPS % 3, 0);
    }
}
