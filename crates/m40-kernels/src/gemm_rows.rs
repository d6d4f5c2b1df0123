//! The rows tile (kernels/gemm_rows.cu, gemm_rows.cuh): where the GEMM
//! plan takes it and its blocks an SM. Its launches go through gemm.rs's
//! launcher (`GemmTile::Rows`, the same arguments as the other tiles).

/// The tile: 32 tokens x 4 strips of 128 rows, a warp on each.
pub(crate) const GEMM_ROWS_TILE: (usize, usize) = (32, 512);
pub(crate) const GEMM_ROWS_THREADS: u32 = 128;

/// Rows-tile blocks an SM holds on every GPU of sm_52 or later: 128
/// threads of 225-247 registers (at most 255: 2 blocks fit the 64K
/// registers every such SM has, 3 do not above 170) and 32 KB of shared
/// memory (2 fit the M40's 96 KB). A constant, so that the plan needs no
/// occupancy query, which would JIT-compile the module on a first run.
pub(crate) const GEMM_ROWS_PER_SM: usize = 2;

/// The splits over K of the rows tile where one wave of its blocks fills
/// the GPU of `sms` SMs holding `per_sm` blocks each, else None: the fewest
/// (equal ones: whole chunks of 4 k-steps, `min_steps` at least, no more
/// than the narrow tile's `narrow_splits`, whose reduce traffic it would
/// otherwise add) whose blocks fill [`ROWS_FILL`] of the slots without
/// going over; elsewhere the narrow tile. Its blocks (2 an SM, 4 warps each) are so few that a
/// second wave would run a quarter or more of the time with SMs idle. An
/// H100 at 32 tokens through the engine's PTX (BENCHMARKS.md, issue 33,
/// sixteenth session): an 8B's output matrix (Q6_K, 251 blocks, 95% of 264
/// slots) 919.8 us against the narrow tile's 1116.3; gate/up (56 blocks in
/// 4 splits, 85%) 224.8 against 219.9; Q/K/V, o and down (12 and 8 blocks
/// in 16 splits) 64.3, 43.7, 122.0 against 51.7, 37.3, 111.4.
pub(crate) fn rows_splits(
    n: usize,
    k: usize,
    (sms, per_sm): (usize, usize),
    narrow_splits: usize,
    min_steps: usize,
) -> Option<usize> {
    if per_sm == 0 {
        return None;
    }
    let slots = sms.max(1) * per_sm;
    let (blocks, steps) = (n.div_ceil(GEMM_ROWS_TILE.1), k / 32);
    (1..=narrow_splits)
        .take_while(|&s| blocks * s <= slots && (s == 1 || steps / s >= min_steps))
        .find(|&s| steps.is_multiple_of(4 * s) && (blocks * s) as f64 >= ROWS_FILL * slots as f64)
}

/// The share of the rows tile's slots one wave must fill for it to run.
const ROWS_FILL: f64 = 0.9;
