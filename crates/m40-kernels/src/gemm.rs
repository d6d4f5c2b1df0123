//! The prefill matmul (kernels/gemm.cu): tiles, the split over K, and its
//! launchers for weights in their GGUF format or packed.

use m40_device::{DeviceBuffer, DeviceView, Stream};

use crate::error::Result;
use crate::format::KernelFormat;
use crate::gemm_rows::{rows_splits, GEMM_ROWS_PER_SM, GEMM_ROWS_THREADS, GEMM_ROWS_TILE};
use crate::launch::{cfg_shared as cfg, check_len, shape, to_i32};
use crate::layout::{PackedMatrix, QMatrix, RowSplit};
use crate::pack::PackFormat;
use crate::Kernels;

/// kernels/gemm.cu: the tiles (tokens x weight rows) of `gemm_*`,
/// `gemm_small_*` and `gemm_narrow_packed_*`, and their threads (8 x 8
/// outputs each in the large tile, 4 x 4 in the small one, 8 x 4 in the
/// narrow one); kernels/gemm_rows.cuh: `gemm_rows_packed_*` (4 rows x 32
/// tokens a lane, a warp on each of 4 strips of 128 rows).
const GEMM_TILE: (usize, usize) = (64, 128);
const GEMM_SMALL_TILE: (usize, usize) = (64, 64);
const GEMM_NARROW_TILE: (usize, usize) = (32, 128);
const GEMM_THREADS: u32 = (GEMM_TILE.0 * GEMM_TILE.1 / 64) as u32;
const GEMM_SMALL_THREADS: u32 = 256;
const GEMM_NARROW_THREADS: u32 = (GEMM_NARROW_TILE.0 * GEMM_NARROW_TILE.1 / 32) as u32;
/// The large-tile kernel whose occupancy [`Kernels::gemm_slots`] reads
/// (every large-tile kernel has the same shared memory and 147-167
/// registers on sm_52, all under the 170 that three blocks per SM allow).
const GEMM_SLOTS_KERNEL: &str = "gemm_packed_q4_0_f32";
/// The same for the small tile (63-64 registers, 32 KB of shared memory)
/// and the narrow one (40 KB).
const GEMM_SMALL_SLOTS_KERNEL: &str = "gemm_small_packed_q4_0_f32";
const GEMM_NARROW_SLOTS_KERNEL: &str = "gemm_narrow_packed_q4_0_f32";
/// And the rows tile's, whose slots are [`GEMM_ROWS_PER_SM`]: its own
/// module (kernels/gemm_rows.cu) is loaded only where a plan takes it
/// (gemm_rows.rs).
const GEMM_ROWS_SLOTS_KERNEL: &str = "gemm_rows_packed_q4_0_f32";
/// Tokens up to which GGUF-layout weights take the small tile (the large
/// one would mostly compute rows of zeros); matrices too small to give the
/// large tile one block per two SMs take it too.
const GEMM_SMALL_MAX_M: usize = 64;
/// Tokens up to which packed weights take the narrow tile (a batched
/// decode step of up to 32 sequences: the 64-token tiles would compute as
/// many rows of zeros as of tokens).
const GEMM_NARROW_MAX_M: usize = 32;
/// Splits over K at most (8: short and medium prompts' small grids; 4 was
/// slower, BENCHMARKS.md, "Measurements behind constants"), and
/// k-steps (of 32) a split keeps at least: 16, or 128 where the unsplit
/// grid fills half the slots already.
const GEMM_MAX_SPLITS: usize = 8;
const GEMM_MIN_SPLIT_STEPS: usize = 16;
const GEMM_MIN_SPLIT_STEPS_FULL: usize = 128;

/// Where a prefill GEMM's tiles run: the GPU's SMs and the blocks of the
/// large and of the small tile one SM holds at once (the occupancy
/// calculator's figures; [`Kernels::gemm_slots`]). The H100: 132 x 3
/// large (registers), x 4 small; the M40: 24 x 2 large (its 96 KB of
/// shared memory a SM, 48 KB a block), x 3 small.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmSlots {
    pub sms: usize,
    pub per_sm: usize,
    pub small_per_sm: usize,
    /// Narrow-tile blocks an SM holds; 0 where the format has no narrow
    /// kernel (GGUF-layout weights).
    pub narrow_per_sm: usize,
    /// Rows-tile blocks an SM holds; 0 where the format has none.
    pub rows_per_sm: usize,
}

impl GemmSlots {
    /// Large-tile blocks the whole GPU holds at once.
    pub fn blocks(&self) -> usize {
        self.sms.max(1) * self.per_sm.max(1)
    }
}

/// The splits over K of a prefill GEMM of `m` tokens by a matrix of `n`
/// rows and `k` columns on `gpu`: 1 (no split) unless the tile's blocks
/// would fill the GPU's block slots badly and a split fills them better by
/// a tenth of the slots. A launch's waves are its blocks over the slots;
/// where an SM holds several blocks and the grid fills half of them, a
/// split must keep 128 k-steps. Prompts of up to 64 tokens take the small
/// tile (GGUF-layout weights) or, packed, the narrow tile up to 32 tokens
/// and the large one above, split over their own slots. Grids of fewer large tiles than half
/// the SMs take the large tile only where a split keeps three quarters of
/// its slots busy, else the small one, split over its slots ([`gemm_plan`]). Examples
/// at 512 tokens: an H100 (132 SMs, 3 large blocks each) runs 8B's Q/K/V
/// whole (384 tiles of 64 x 128, 97% of the 396 slots) and o (256 tiles,
/// 65%; 128 k-steps), splits its down (256 tiles, 448 k-steps) in 3 (97%)
/// and 1B's o (128 tiles, 32%) in 3; the M40 (24 SMs, 2 blocks each) runs
/// 8B's Q/K/V as 8 full waves. At 40 tokens the H100 splits 8B's Q/K/V
/// (96 small tiles on 528 slots, 18%) in 5 (91%).
pub(crate) fn gemm_k_splits(m: usize, n: usize, k: usize, gpu: GemmSlots) -> usize {
    gemm_plan(m, n, k, gpu).splits
}

/// A GEMM tile (tokens x weight rows): kernels/gemm.cu.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmTile {
    /// 64 x 128.
    Large,
    /// 64 x 64.
    Small,
    /// 32 x 128, packed weights only.
    Narrow,
    /// 32 x 512 (the rows tile), packed weights only.
    Rows,
}

impl GemmTile {
    fn shape(self) -> ((usize, usize), u32) {
        match self {
            GemmTile::Large => (GEMM_TILE, GEMM_THREADS),
            GemmTile::Small => (GEMM_SMALL_TILE, GEMM_SMALL_THREADS),
            GemmTile::Narrow => (GEMM_NARROW_TILE, GEMM_NARROW_THREADS),
            GemmTile::Rows => (GEMM_ROWS_TILE, GEMM_ROWS_THREADS),
        }
    }

    /// Its tiles over `m` tokens by `n` rows.
    pub(crate) fn tiles(self, m: usize, n: usize) -> usize {
        let ((bm, bn), _) = self.shape();
        m.div_ceil(bm) * n.div_ceil(bn)
    }
}

/// A prefill GEMM's tile and splits over K ([`gemm_k_splits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmPlan {
    pub tile: GemmTile,
    pub splits: usize,
}

impl GemmPlan {
    /// The blocks it launches for `m` tokens by `n` rows.
    pub fn blocks(&self, m: usize, n: usize) -> usize {
        self.tile.tiles(m, n) * self.splits
    }
}

/// The tile and splits of a GEMM of `m` tokens by an `n` x `k` matrix on
/// `gpu`: where the format has a narrow tile (packed weights), it for up
/// to 32 tokens and the large one above; else the small tile for up to 64
/// tokens; and the small one where the large tile's grid is under half the
/// SMs and no split fills three quarters of its slots; each split over
/// its own tile's slots.
pub fn gemm_plan(m: usize, n: usize, k: usize, gpu: GemmSlots) -> GemmPlan {
    let sms = gpu.sms.max(1);
    let over = |tile: GemmTile, per_sm: usize| {
        let per_sm = per_sm.max(1);
        GemmPlan {
            tile,
            splits: best_split(tile.tiles(m, n), k, sms * per_sm, per_sm).0,
        }
    };
    let small = || over(GemmTile::Small, gpu.small_per_sm);
    if m <= GEMM_NARROW_MAX_M && gpu.narrow_per_sm > 0 {
        let splits = narrow_split(GemmTile::Narrow.tiles(m, n), k / 32, sms, gpu.narrow_per_sm);
        let rows = (sms, gpu.rows_per_sm);
        return match rows_splits(n, k, rows, splits, NARROW_MIN_SPLIT_STEPS) {
            Some(s) => GemmPlan {
                tile: GemmTile::Rows,
                splits: s,
            },
            None => GemmPlan {
                tile: GemmTile::Narrow,
                splits,
            },
        };
    }
    if m <= GEMM_SMALL_MAX_M {
        // Packed weights (those with a narrow tile) take the large one
        // from 33 tokens, split over its slots: on an H200, 8B Q4_0 decode
        // steps of 40 to 64 sequences ran 1.33-1.36x faster than with the
        // small tile (BENCHMARKS.md).
        return match gpu.narrow_per_sm {
            0 => small(),
            _ => over(GemmTile::Large, gpu.per_sm),
        };
    }
    let tiles = gemm_large_tiles(m, n);
    let (splits, fill) = best_split(tiles, k, gpu.blocks(), gpu.per_sm);
    // Under one large block per two SMs the small tile runs unless a split
    // keeps three quarters of the slots busy with the large one.
    if 2 * tiles < sms && fill < 0.75 {
        return small();
    }
    GemmPlan {
        tile: GemmTile::Large,
        splits,
    }
}

/// The splits (and the share of `slots` they fill) of `tiles` blocks over
/// K = `k`, on a GPU of `per_sm` blocks an SM.
fn best_split(tiles: usize, k: usize, slots: usize, per_sm: usize) -> (usize, f64) {
    let fill = |s: usize| {
        let blocks = tiles * s;
        blocks as f64 / (blocks.div_ceil(slots) * slots) as f64
    };
    // Where an SM holds several blocks, one with a block fewer still runs
    // near its full rate, and a grid over half the slots splits only where
    // K is long enough for the reduce to cost little (BENCHMARKS.md, "Measurements behind constants").
    let min_steps = if per_sm > 1 && fill(1) >= 0.5 {
        GEMM_MIN_SPLIT_STEPS_FULL
    } else {
        GEMM_MIN_SPLIT_STEPS
    };
    let mut best = 1;
    for s in 2..=GEMM_MAX_SPLITS {
        if k / 32 / s < min_steps {
            break;
        }
        if fill(s) > fill(best) + 0.1 {
            best = s;
        }
    }
    (best, fill(best))
}

/// The splits over K of the narrow tile's `tiles` blocks of `steps`
/// k-steps each on `sms` SMs holding `per_sm` blocks each: the fewest that
/// give the busiest SM the least time, and none unless they beat the
/// unsplit grid's by a tenth (the reduce's share); more splits than
/// another count only where they beat it by [`NARROW_SPLIT_GAIN`]. The
/// busiest SM runs
/// `ceil(tiles * s / sms)` blocks of `ceil(steps / s)` k-steps, in waves
/// of `per_sm`; a last wave of fewer blocks than the SM holds runs each
/// slower ([`narrow_rate`]). Splits go up to [`NARROW_MAX_SPLITS`] and
/// down to [`NARROW_MIN_SPLIT_STEPS`] k-steps. An H100 at 32 tokens, 8B
/// Q4_0 (BENCHMARKS.md, issue 33, sixteenth session): o in 8 splits (2
/// blocks an SM) 42.3 us, in 12 41.0, in 16 (4 an SM, 8 k-steps each)
/// 40.5; down 125.4, 117.5, 117.3; Q/K/V in 8 55.6, in 16 (6 an SM: a
/// second wave of 2) 65.3; gate/up in 4 226.3, in 8 232.8, in 16 248.2
/// (a reduce of 16 planes of 28672 rows). The thirteenth session's rule
/// (blocks of 16 k-steps at least, 8 splits at most, only one block an SM
/// counted slower) took 8 for o and down.
fn narrow_split(tiles: usize, steps: usize, sms: usize, per_sm: usize) -> usize {
    let per_sm = per_sm.max(1);
    let cost = |s: usize| {
        let on_sm = (tiles * s).div_ceil(sms.max(1));
        let (full, last) = (on_sm / per_sm, on_sm % per_sm);
        let blocks = (full * per_sm) as f64 + last as f64 * narrow_rate(last, per_sm);
        blocks * steps.div_ceil(s) as f64
    };
    let best = (2..=NARROW_MAX_SPLITS)
        .take_while(|&s| steps / s >= NARROW_MIN_SPLIT_STEPS)
        .fold(1, |best, s| {
            if cost(s) < NARROW_SPLIT_GAIN * cost(best) {
                s
            } else {
                best
            }
        });
    if cost(best) <= 0.9 * cost(1) {
        best
    } else {
        1
    }
}

/// Splits over K of the narrow tile at most, and k-steps a split keeps at
/// least (8B's o: 16 splits of 8 measured fastest; above).
const NARROW_MAX_SPLITS: usize = 16;
pub(crate) const NARROW_MIN_SPLIT_STEPS: usize = 8;
/// The share of the time a count of splits must leave of a smaller
/// count's to be taken: the reduce adds a plane a split (gate/up's 4
/// splits and 16 both put 224 block-steps on the busiest SM; 16 ran 10%
/// slower, above).
const NARROW_SPLIT_GAIN: f64 = 0.98;

/// How much slower each of `b` narrow blocks runs on an SM that holds
/// `per_sm` when they are all it has: one alone 1.18x (H200, 8B's Q/K/V at
/// 32 tokens: 96 blocks of 64 k-steps, one an SM, 90.7 us; 192 of 32, two
/// an SM, 75.9), two 1.05x (H100: down's 8 splits, 2 an SM, 1.07x the
/// time of a k-step of 16 splits, 4 an SM; o's 1.04x; an H200's o 1.02x);
/// a full SM, or three, 1.
fn narrow_rate(b: usize, per_sm: usize) -> f64 {
    match b {
        _ if b >= per_sm => 1.0,
        1 => 1.18,
        2 => 1.05,
        _ => 1.0,
    }
}

/// Large tiles of a GEMM of `m` tokens by a matrix of `n` rows.
pub fn gemm_large_tiles(m: usize, n: usize) -> usize {
    GemmTile::Large.tiles(m, n)
}

/// Floats of scratch the GEMM of `m` tokens by an `n` x `k` matrix takes
/// on `gpu` ([`Kernels::gemm_packed_split`]'s `scratch`): one (m, n) plane
/// per split, none unsplit.
pub fn gemm_scratch_len(m: usize, n: usize, k: usize, gpu: GemmSlots) -> usize {
    match gemm_k_splits(m, n, k, gpu) {
        1 => 0,
        s => s * m * n,
    }
}

/// How a GEMM writes, and the room it may use.
#[derive(Default)]
pub struct GemmOpts<'s> {
    /// Y += X W^T instead of Y = X W^T.
    pub accumulate: bool,
    /// Room for a split over K ([`gemm_scratch_len`] floats): without it,
    /// or with less, a launch is not split.
    pub scratch: Option<&'s mut DeviceBuffer<f32>>,
    /// Splits over K instead of [`gemm_plan`]'s (a benchmark's sweep; at
    /// most [`GEMM_SPLITS_LIMIT`], and 1 without the scratch for them).
    pub splits: Option<usize>,
    /// The tile instead of [`gemm_plan`]'s (a benchmark's or a test's):
    /// the narrow and rows tiles take packed weights and at most 32 tokens.
    pub tile: Option<GemmTile>,
}

/// The most splits over K a caller may force ([`GemmOpts::splits`]).
pub const GEMM_SPLITS_LIMIT: usize = 64;

impl Kernels {
    /// Y = X W^T, or Y += X W^T with `opts.accumulate`: W (n rows x k cols) in its
    /// format, X (m, k) FP32 16-byte aligned, Y (m, n) FP32. k must be a
    /// multiple of 32. With `opts.scratch` of at least [`gemm_scratch_len`]
    /// floats, a launch that would fill the GPU badly is split over K (the
    /// partial tiles summed in a fixed order: the same bits every run);
    /// without it, or with less, it is not.
    pub fn gemm(
        &self,
        stream: &Stream,
        w: &QMatrix<'_>,
        x: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        m: usize,
        opts: GemmOpts<'_>,
    ) -> Result<()> {
        const K: &str = "gemm";
        let f = KernelFormat::of(w.ty, K)?;
        let row_bytes = f.row_bytes(w.cols, K)?;
        if !w.data.is_aligned(2) {
            return Err(shape(K, "weights must start at an even byte".into()));
        }
        let g = GemmArgs {
            kernels: gemm_names(&f),
            data: w.data,
            need: w.rows * row_bytes,
            n: w.rows,
            k: w.cols,
            row_bytes,
        };
        let y = RowSplit {
            bufs: &mut [y],
            rows: &[w.rows],
        };
        self.gemm_launch(stream, g, x, y, m, opts)
    }

    /// [`Kernels::gemm`] over weights in the packed layout
    /// ([`crate::pack_gemv`]): the prefill reads the decode GEMV's copy.
    pub fn gemm_packed(
        &self,
        stream: &Stream,
        w: &PackedMatrix<'_>,
        x: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        m: usize,
        opts: GemmOpts<'_>,
    ) -> Result<()> {
        let y = RowSplit {
            bufs: &mut [y],
            rows: &[w.rows],
        };
        self.gemm_packed_split(stream, w, x, y, m, opts)
    }

    /// [`Kernels::gemm_packed`] of stacked matrices into their own outputs.
    pub fn gemm_packed_split(
        &self,
        stream: &Stream,
        w: &PackedMatrix<'_>,
        x: &DeviceView<'_, f32>,
        y: RowSplit<'_, '_>,
        m: usize,
        opts: GemmOpts<'_>,
    ) -> Result<()> {
        const K: &str = "gemm_packed";
        let f = PackFormat::checked(K, w.ty, w.cols)?;
        if !w.data.is_aligned(16) {
            return Err(shape(
                K,
                "weights must start at a multiple of 16 bytes".into(),
            ));
        }
        let g = GemmArgs {
            kernels: packed_names(&f),
            data: w.data,
            need: f.packed_bytes(w.rows, w.cols),
            n: w.rows,
            k: w.cols,
            row_bytes: 0,
        };
        self.gemm_launch(stream, g, x, y, m, opts)
    }

    /// [`gemm_k_splits`] on this device.
    pub fn gemm_splits(&self, m: usize, n: usize, k: usize) -> Result<usize> {
        Ok(gemm_k_splits(m, n, k, self.gemm_slots()?))
    }

    /// This device's SMs and the GEMM tiles' blocks per SM (the occupancy
    /// calculator's, looked up once), read from Q4_0's packed kernels.
    pub fn gemm_slots(&self) -> Result<GemmSlots> {
        self.slots_of([
            GEMM_SLOTS_KERNEL,
            GEMM_SMALL_SLOTS_KERNEL,
            GEMM_NARROW_SLOTS_KERNEL,
            GEMM_ROWS_SLOTS_KERNEL,
        ])
    }

    /// [`Kernels::gemm_slots`] read from the kernels that multiply `ty` (its
    /// packed kernels where `packed`), so that a model need not load another
    /// format's (on a first run the driver JIT-compiles every module loaded).
    /// Every large-tile kernel has the same shared memory and a register
    /// count under the cap of its launch bounds, every small-tile one too:
    /// the slots are the same for every format (a GPU test checks).
    pub fn gemm_slots_for(&self, ty: m40_gguf::GgmlType, packed: bool) -> Result<GemmSlots> {
        let names = match PackFormat::of(ty).filter(|_| packed) {
            Some(f) => packed_names(&f),
            None => gemm_names(&KernelFormat::of(ty, "gemm")?),
        };
        self.slots_of(names)
    }

    /// The slots of a format's large, small, narrow and rows kernels (none:
    /// an empty name).
    fn slots_of(&self, [large, small, narrow, rows]: [&'static str; 4]) -> Result<GemmSlots> {
        let sms = self.device().info().sm_count.max(1) as usize;
        let per_sm = |name, threads| -> Result<usize> {
            let kernel = self.handle("gemm", name)?;
            Ok((self.resident_blocks(&kernel, threads, 0)? / sms).max(1))
        };
        Ok(GemmSlots {
            sms,
            per_sm: per_sm(large, GEMM_THREADS)?,
            small_per_sm: per_sm(small, GEMM_SMALL_THREADS)?,
            narrow_per_sm: match narrow {
                "" => 0,
                n => per_sm(n, GEMM_NARROW_THREADS)?,
            },
            rows_per_sm: if rows.is_empty() { 0 } else { GEMM_ROWS_PER_SM },
        })
    }

    fn gemm_launch(
        &self,
        stream: &Stream,
        w: GemmArgs<'_, '_>,
        x: &DeviceView<'_, f32>,
        mut y: RowSplit<'_, '_>,
        m: usize,
        opts: GemmOpts<'_>,
    ) -> Result<()> {
        let GemmOpts {
            accumulate,
            scratch,
            splits: forced,
            tile: forced_tile,
        } = opts;
        const K: &str = "gemm";
        let (n, k) = (w.n, w.k);
        if !k.is_multiple_of(32) {
            return Err(shape(K, format!("{k} columns is not a multiple of 32")));
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        check_len(K, "weights", w.data.len(), w.need)?;
        check_len(K, "x", x.len(), m * k)?;
        let (r1, r2) = y.bounds(K, n, m)?;
        if !x.is_aligned(16) {
            return Err(shape(K, "x must start at a multiple of 16 bytes".into()));
        }
        // The tile and splits of `gemm_plan`: the large tile where it gives
        // at least one block per two SMs, or where a split over K fills its
        // slots; else the small one (a few large blocks leave most SMs
        // idle: BENCHMARKS.md, "Measurements behind constants").
        let gpu = self.slots_of(w.kernels)?;
        let mut plan = gemm_plan(m, n, k, gpu);
        if let Some(t) = forced_tile {
            let packed_only = matches!(t, GemmTile::Narrow | GemmTile::Rows);
            if packed_only && (m > GEMM_NARROW_MAX_M || w.kernels[tile_index(t)].is_empty()) {
                return Err(shape(
                    K,
                    format!("{t:?} tile for {m} tokens of these weights (packed, 32 at most)"),
                ));
            }
            plan.tile = t;
        }
        let s = match forced {
            Some(f) if f == 0 || f > GEMM_SPLITS_LIMIT => {
                return Err(shape(
                    K,
                    format!("{f} splits over K (1 to {GEMM_SPLITS_LIMIT})"),
                ))
            }
            Some(f) => f,
            None => plan.splits,
        };
        let splits = scratch
            .filter(|p| s > 1 && p.len() >= s * m * n)
            .map(|p| (p, s));
        // Without the scratch, a large tile chosen for its split falls back
        // to the small one.
        let tile = match plan.tile {
            GemmTile::Large if splits.is_none() && 2 * gemm_large_tiles(m, n) < gpu.sms => {
                GemmTile::Small
            }
            t => t,
        };
        let ((bm, bn), threads) = tile.shape();
        let name = w.kernels[tile_index(tile)];
        let kernel = match tile {
            GemmTile::Rows => self.kernel("gemm_rows", name)?,
            _ => self.kernel("gemm", name)?,
        };
        let grid = (
            n.div_ceil(bn) as u32,
            u32::try_from(m.div_ceil(bm)).map_err(|_| shape(K, format!("{m} rows")))?,
            splits.as_ref().map_or(1, |&(_, s)| s as u32),
        );
        if grid.1 > 65535 {
            return Err(shape(
                K,
                format!("{m} rows of X need over 65535 blocks in y"),
            ));
        }
        let (mi, ni, ki) = (to_i32(K, "m", m)?, to_i32(K, "n", n)?, to_i32(K, "k", k)?);
        let row_bytes = w.row_bytes as i64;
        let Some((p, s)) = splits else {
            let acc = accumulate as i32;
            // SAFETY: gemm_<fmt>_f32 and gemm_packed_<fmt>_f32(const u8* W, const float* X,
            // float* Y, float* Y1, float* Y2, int r1, int r2, int M, int N, int K, long
            // long row_bytes, int accumulate): read rows < N of W (whole sub-blocks, K a
            // multiple of 32; `need` bytes: N rows of row_bytes, or the packed size),
            // X[..M*K] (16-byte loads, aligned), read and write M rows of each output
            // part (Y, Y1, Y2 split at r1 <= r2 <= N); lengths checked above and by
            // `bounds`.
            unsafe {
                y.push(stream.launch(&kernel).view(w.data).view(x))
                    .scalar(&r1)
                    .scalar(&r2)
                    .scalar(&mi)
                    .scalar(&ni)
                    .scalar(&ki)
                    .scalar(&row_bytes)
                    .scalar(&acc)
                    .run(cfg(grid, threads, 0))?
            };
            return Ok(());
        };
        let (zero, si) = (0i32, s as i32);
        // SAFETY: as above, with gridDim.z = s splits writing plane z of the one part
        // Y = p (r1 = r2 = N: rows of N floats), s * M * N floats: p holds at least
        // s * m * n (checked above); accumulate 0.
        unsafe {
            stream
                .launch(&kernel)
                .view(w.data)
                .view(x)
                .buf_mut(&mut *p)
                .null()
                .null()
                .scalar(&ni)
                .scalar(&ni)
                .scalar(&mi)
                .scalar(&ni)
                .scalar(&ki)
                .scalar(&row_bytes)
                .scalar(&zero)
                .run(cfg(grid, threads, 0))?
        };
        let reduce = self.kernel("gemm", "gemm_reduce_f32")?;
        let total = m * n;
        let blocks = total.div_ceil(256).min(gpu.sms * 8) as u32;
        let acc = accumulate as i32;
        // SAFETY: gemm_reduce_f32(const float* P, int S, float* Y, float* Y1, float* Y2,
        // int r1, int r2, int M, int N, int accumulate): reads s planes of M * N floats
        // of P (written above, s * m * n <= p.len()), reads and writes M rows of each
        // output part, as the GEMM would (checked by `bounds`).
        unsafe {
            y.push(stream.launch(&reduce).view(&p.view()).scalar(&si))
                .scalar(&r1)
                .scalar(&r2)
                .scalar(&mi)
                .scalar(&ni)
                .scalar(&acc)
                .run(cfg((blocks, 1, 1), 256, 0))?
        };
        Ok(())
    }
}

/// Slots a tile of the grouped expert GEMMs holds at most
/// ([`Kernels::gemm_packed_experts`]): the narrow tile's and the large one's
/// tokens.
pub const MOE_GEMM_TILES: [usize; 2] = [GEMM_NARROW_TILE.0, GEMM_TILE.0];

impl Kernels {
    /// A mixture's experts over a step's `slots` slots grouped by expert:
    /// y (slots, rows) row j = W_e x row j / x_per, e = ids[j], where `w`
    /// stacks the experts' packed matrices of `rows` rows each. `tiles`
    /// ([`Kernels::moe_tiles`] of these ids) has tiles of at most
    /// `tiles.cap` slots, which picks the GEMM's tile: the narrow one (32
    /// slots) up to 32, else the large one (64). One launch: each expert's
    /// weights are read once per tile, with the dense GEMM's sums
    /// (kernels/gemm.cu `gemm_grp_*`). Nothing is read on the host:
    /// capturable.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_packed_experts(
        &self,
        stream: &Stream,
        w: &PackedMatrix<'_>,
        rows: usize,
        ids: &DeviceView<'_, i32>,
        x: &DeviceView<'_, f32>,
        x_per: usize,
        y: &mut DeviceBuffer<f32>,
        slots: usize,
        tiles: crate::ExpertTiles<'_, '_>,
    ) -> Result<()> {
        const K: &str = "gemm_packed_experts";
        let f = PackFormat::checked(K, w.ty, w.cols)?;
        if rows == 0 || !w.rows.is_multiple_of(rows) || x_per == 0 || !f.takes_experts(rows, w.cols)
        {
            return Err(shape(
                K,
                format!("{} rows are not experts of {rows} (groups of 4)", w.rows),
            ));
        }
        let tile = MOE_GEMM_TILES.iter().position(|&t| tiles.cap <= t);
        let Some(tile) = tile.filter(|_| tiles.cap > 0) else {
            return Err(shape(K, format!("tiles of {} slots (1 to 64)", tiles.cap)));
        };
        let (n_mat, mat_bytes) = (w.rows / rows, f.packed_bytes(rows, w.cols));
        let bound = crate::moe_tile_bound(slots, n_mat, tiles.cap);
        check_len(K, "weights", w.data.len(), n_mat * mat_bytes)?;
        check_len(K, "ids", ids.len(), slots)?;
        check_len(K, "order", tiles.order.len(), slots)?;
        check_len(K, "tiles", tiles.tiles.len(), 1 + 2 * bound)?;
        check_len(K, "x", x.len(), slots.div_ceil(x_per) * w.cols)?;
        check_len(K, "y", y.len(), slots * rows)?;
        if !x.is_aligned(16) || !w.data.is_aligned(16) {
            return Err(shape(
                K,
                "weights and x must start at multiples of 16 bytes".into(),
            ));
        }
        if slots == 0 {
            return Ok(());
        }
        let grid_y = u32::try_from(bound)
            .ok()
            .filter(|&b| b <= 65535)
            .ok_or_else(|| shape(K, format!("{slots} slots: grid too large")))?;
        let ((_, bn), threads) = [GemmTile::Narrow, GemmTile::Large][tile].shape();
        let kernel = self.kernel("gemm", f.gemm_grp[tile])?;
        let grid = (rows.div_ceil(bn) as u32, grid_y, 1);
        let (mat_bytes, n_mat) = (mat_bytes as i64, to_i32(K, "experts", n_mat)?);
        let (x_per, ni, ki) = (
            to_i32(K, "x_per", x_per)?,
            to_i32(K, "rows", rows)?,
            to_i32(K, "k", w.cols)?,
        );
        // SAFETY: gemm_grp_[narrow_]packed_<fmt>_f32(const u8* W, long long
        // mat_bytes, int n_mat, const int* ids, const int* order, const int*
        // tiles, int x_per, const float* X, float* Y, int N, int K): block
        // (b, i) returns past tiles[0] (at most `bound`, the grid's rows:
        // moe_tiles's tiles of at most cap slots, cap within the tile's BM),
        // else reads tile i's first position and slots from tiles (1 + 2
        // bound entries, checked), order at those positions (< slots,
        // checked) and ids at those slots (checked), clamps the expert below
        // n_mat and reads its packed matrix (n_mat of mat_bytes, checked,
        // 16-byte aligned) at rows < N, X row slot / x_per (checked, 16-byte
        // aligned, K floats) and writes Y row slot (N floats, slots rows
        // checked).
        unsafe {
            stream
                .launch(&kernel)
                .view(w.data)
                .scalar(&mat_bytes)
                .scalar(&n_mat)
                .view(ids)
                .view(tiles.order)
                .view(tiles.tiles)
                .scalar(&x_per)
                .view(x)
                .buf_mut(y)
                .scalar(&ni)
                .scalar(&ki)
                .run(cfg(grid, threads, 0))?
        };
        Ok(())
    }
}

/// The weights of a GEMM launch: the kernel, its buffer and the bytes it
/// reads.
struct GemmArgs<'a, 'v> {
    /// The large-, small-, narrow- and rows-tile kernels (none: "").
    kernels: [&'static str; 4],
    data: &'a DeviceView<'v, u8>,
    need: usize,
    n: usize,
    k: usize,
    row_bytes: usize,
}

/// The index of `tile`'s kernel in [`GemmArgs::kernels`].
fn tile_index(tile: GemmTile) -> usize {
    match tile {
        GemmTile::Large => 0,
        GemmTile::Small => 1,
        GemmTile::Narrow => 2,
        GemmTile::Rows => 3,
    }
}

/// A packed format's GEMM kernels, in [`GemmArgs::kernels`]' order.
fn packed_names(f: &PackFormat) -> [&'static str; 4] {
    [f.gemm, f.gemm_small, f.gemm_narrow, f.gemm_rows]
}

/// The large- and small-tile GEMM kernels of a format in its GGUF layout
/// (no narrow or rows one: ""), in [`GemmArgs::kernels`]' order.
pub(crate) fn gemm_names(f: &KernelFormat) -> [&'static str; 4] {
    GEMM_KERNELS
        .iter()
        .find(|(ty, _)| *ty == f.symbol)
        .map(|(_, n)| *n)
        .expect("every KernelFormat has a gemm kernel")
}

macro_rules! gemm_names {
    ($($s:literal),*) => {
        [$(($s, [concat!("gemm_", $s, "_f32"), concat!("gemm_small_", $s, "_f32"), "", ""])),*]
    };
}
const GEMM_KERNELS: [(&str, [&str; 4]); 16] = gemm_names!(
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k",
    "q6_k", "iq4_nl", "iq4_xs", "mxfp4"
);

#[cfg(test)]
mod tests;
