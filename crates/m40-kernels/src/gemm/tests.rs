//! The GEMM plan's tiles and splits over K on an H100 and an M40 (gemm.rs).

use super::*;

/// An H100's and an M40's GEMM slots for GGUF-layout weights (no narrow or
/// rows tile); the tests below add the packed tiles' slots.
const H100_GGUF: GemmSlots = GemmSlots {
    sms: 132,
    per_sm: 3,
    small_per_sm: 4,
    narrow_per_sm: 0,
    rows_per_sm: 0,
};
const M40_GGUF: GemmSlots = GemmSlots {
    sms: 24,
    per_sm: 2,
    small_per_sm: 3,
    narrow_per_sm: 0,
    rows_per_sm: 0,
};

/// The same with the narrow tile: an H100 holds 4 blocks an SM (118
/// registers on sm_90), the M40 2 (shared memory).
const H100_NARROW: GemmSlots = GemmSlots {
    narrow_per_sm: 4,
    ..H100_GGUF
};
const M40_NARROW: GemmSlots = GemmSlots {
    narrow_per_sm: 2,
    ..M40_GGUF
};

/// An 8B's Q/K/V, gate/up, o and down at 17 to 32 tokens, (tokens, rows,
/// columns), and the narrow tile's splits on an H100: gate/up's 224 tiles
/// in 4 (7 blocks of 32 k-steps on the busiest SM, against 2 of 128
/// whole; 16 splits, 28 blocks of 8, tie and the fewer win); Q/K/V's 48
/// in 8 (3 blocks of 16 an SM; 16 splits would make a second wave); o's
/// 32 in 16 (4 blocks of 8 k-steps an SM: 8 splits left 2), down's in 12
/// (3 of 38; 16, 4 of 28, are under 2% less).
const H100_8B_NARROW: [((usize, usize, usize), usize); 4] = [
    ((32, 28672, 4096), 4),
    ((17, 6144, 4096), 8),
    ((32, 4096, 4096), 16),
    ((32, 4096, 14336), 12),
];

fn plan(tile: GemmTile, splits: usize) -> GemmPlan {
    GemmPlan { tile, splits }
}

#[test]
fn gemm_splits_over_k_where_the_tiles_fill_the_sms_badly() {
    const H100: GemmSlots = H100_GGUF;
    const M40: GemmSlots = M40_GGUF;
    // An H100 (396 slots), 512 tokens, 8B: the Q/K/V stack's 384 tiles
    // fill 97%; o and down (256 tiles, 65%: over half) split only with
    // 128 k-steps a split: down's 448 in 3 (97%), not o's 128; gate/up
    // (1792 tiles, 90%; 3 splits: 97%, of 42 steps) stays whole.
    assert_eq!(gemm_k_splits(512, 6144, 4096, H100), 1);
    assert_eq!(gemm_scratch_len(512, 6144, 4096, H100), 0);
    assert_eq!(gemm_k_splits(512, 4096, 4096, H100), 1);
    assert_eq!(gemm_k_splits(512, 4096, 14336, H100), 3);
    assert_eq!(gemm_scratch_len(512, 4096, 14336, H100), 3 * 512 * 4096);
    assert_eq!(gemm_k_splits(512, 28672, 4096, H100), 1);
    // The M40 (48 slots) runs the Q/K/V's 384 tiles as 8 full waves,
    // o's 256 as 5.3 (89%; down's split in 3 would fill 100%).
    assert_eq!(gemm_k_splits(512, 6144, 4096, M40), 1);
    assert_eq!(gemm_k_splits(512, 4096, 4096, M40), 1);
    assert_eq!(gemm_k_splits(512, 4096, 14336, M40), 3);
    // 1B's Q/K/V (192 tiles, 48%): 2 splits (384 blocks, 97%); its o
    // (128 tiles, 32%): 3 (97%; 4 would be 65%); gate/up (1024 tiles,
    // 86%) stays whole.
    assert_eq!(gemm_k_splits(512, 3072, 2048, H100), 2);
    assert_eq!(gemm_scratch_len(512, 3072, 2048, H100), 2 * 512 * 3072);
    assert_eq!(gemm_k_splits(512, 2048, 2048, H100), 3);
    assert_eq!(gemm_k_splits(512, 16384, 2048, H100), 1);
    // One block per SM: 192 tiles on 132 slots fill 73%, split in 2
    // 97%.
    let one = GemmSlots {
        per_sm: 1,
        small_per_sm: 1,
        narrow_per_sm: 1,
        ..H100
    };
    assert_eq!(gemm_k_splits(512, 3072, 4096, one), 2);
    assert_eq!(gemm_k_splits(512, 4096, 4096, one), 1);
    // Too few k-steps to split (16 per split at least): 512 columns
    // none, 1024 columns 2 at most.
    assert_eq!(gemm_k_splits(512, 2048, 512, H100), 1);
    assert_eq!(gemm_k_splits(512, 2048, 1024, H100), 2);
    // Prompts of up to 64 tokens take the 64 x 64 tile, split over its
    // slots (528 on the H100): 8B's Q/K/V at 40 tokens, 96 tiles (18%)
    // in 5 (91%); its o, 64 tiles, in 8 (97%); gate/up, 448 tiles
    // (85%), whole; SmolLM2's Q/K/V (960 rows, 576 columns: 18 k-steps)
    // cannot split.
    assert_eq!(gemm_k_splits(40, 6144, 4096, H100), 5);
    assert_eq!(gemm_scratch_len(40, 6144, 4096, H100), 5 * 40 * 6144);
    assert_eq!(gemm_k_splits(40, 4096, 4096, H100), 8);
    assert_eq!(gemm_k_splits(64, 28672, 4096, H100), 1);
    assert_eq!(gemm_k_splits(40, 960, 576, H100), 1);
    // Under half the SMs' worth of large tiles: the large tile only
    // where a split fills three quarters of its slots, else the small
    // tile, split over its own. On the H100: 8B's o at 128 tokens, 64
    // large tiles, in 6 splits (97%); 512 rows at 512 tokens, 32 large
    // tiles (7 splits: 57%), run as 64 small ones in 8 (97%). On the
    // M40, 10 large tiles in 4 splits fill 83%, 8 in 6 all 48 slots; 4
    // (7 splits: 58%) run as 8 small ones in 8 (89% of 72). SmolLM2's
    // 576 columns are too few k-steps to split.
    assert_eq!(gemm_plan(128, 4096, 4096, H100), plan(GemmTile::Large, 6));
    assert_eq!(gemm_plan(512, 512, 4096, H100), plan(GemmTile::Small, 8));
    assert_eq!(gemm_plan(128, 640, 4096, M40), plan(GemmTile::Large, 4));
    assert_eq!(gemm_plan(128, 512, 4096, M40), plan(GemmTile::Large, 6));
    assert_eq!(gemm_plan(128, 256, 4096, M40), plan(GemmTile::Small, 8));
    assert_eq!(gemm_plan(512, 576, 576, H100), plan(GemmTile::Small, 1));
    assert_eq!(gemm_plan(512, 6144, 4096, H100), plan(GemmTile::Large, 1));
    let none = GemmSlots {
        sms: 0,
        per_sm: 0,
        small_per_sm: 0,
        ..M40
    };
    assert_eq!(gemm_k_splits(512, 6144, 4096, none), 1);
}

#[test]
fn packed_weights_take_the_narrow_tile_then_the_large_one() {
    const H100: GemmSlots = H100_NARROW;
    for ((m, n, k), splits) in H100_8B_NARROW {
        assert_eq!(gemm_plan(m, n, k, H100), plan(GemmTile::Narrow, splits));
    }
    assert_eq!(gemm_scratch_len(32, 4096, 14336, H100), 12 * 32 * 4096);
    // The M40 (24 SMs, 2 narrow blocks each): Q/K/V's 48 tiles are 2 an
    // SM already; o's and down's 32 leave 16 SMs half idle, 3 splits
    // make 4 blocks an SM; gate/up's best (8 splits, 75 blocks of 16
    // k-steps against 10 of 128) gains under a tenth: whole.
    const M40: GemmSlots = M40_NARROW;
    assert_eq!(gemm_plan(32, 6144, 4096, M40), plan(GemmTile::Narrow, 1));
    assert_eq!(gemm_plan(32, 4096, 4096, M40), plan(GemmTile::Narrow, 3));
    assert_eq!(gemm_plan(32, 4096, 14336, M40), plan(GemmTile::Narrow, 3));
    assert_eq!(gemm_plan(32, 28672, 4096, M40), plan(GemmTile::Narrow, 1));
    // Too few k-steps to split further (8 a split at least): 1B's o
    // (2048 columns, 64 k-steps) in 8 at most; 256 columns not at all.
    assert_eq!(gemm_plan(32, 2048, 2048, H100), plan(GemmTile::Narrow, 8));
    assert_eq!(gemm_plan(32, 2048, 256, H100), plan(GemmTile::Narrow, 1));
    // 33 to 64 tokens: the large tile, split over its slots (gate/up:
    // 224 tiles, 57% of 396 slots, over half: whole, its 128 k-steps
    // too few to split; Q/K/V: 48 tiles, 12%, in 8 splits, 97%).
    // Without a split and under half the SMs' worth of tiles, the
    // launcher runs the small one (SmolLM2's Q/K/V: 18 k-steps).
    assert_eq!(gemm_plan(64, 28672, 4096, H100), plan(GemmTile::Large, 1));
    assert_eq!(gemm_plan(40, 6144, 4096, H100), plan(GemmTile::Large, 8));
    assert_eq!(gemm_plan(40, 576, 576, H100), plan(GemmTile::Large, 1));
}

#[test]
fn decode_batches_take_the_rows_tile_where_one_wave_fills_the_gpu() {
    // An H100 with the rows tile (2 blocks an SM: 264 slots).
    const H100: GemmSlots = GemmSlots {
        rows_per_sm: 2,
        ..H100_NARROW
    };
    // 8B and 1B at 17 to 32 tokens: the output matrix (128256 rows) as
    // 251 blocks of 512 rows, whole (95%); gate/up's 56 (85% in 4
    // splits), Q/K/V's, o's and down's 12 and 8 keep the narrow tile.
    assert_eq!(gemm_plan(32, 128256, 4096, H100), plan(GemmTile::Rows, 1));
    assert_eq!(gemm_plan(17, 128256, 2048, H100), plan(GemmTile::Rows, 1));
    for ((m, n, k), splits) in H100_8B_NARROW {
        assert_eq!(gemm_plan(m, n, k, H100), plan(GemmTile::Narrow, splits));
    }
    assert_eq!(gemm_plan(32, 16384, 2048, H100).tile, GemmTile::Narrow);
    // 30720 rows: 60 blocks fill the slots only split in 4 (91%), and
    // the narrow tile does not split (no split gains a tenth): narrow.
    assert_eq!(gemm_plan(32, 30720, 4096, H100), plan(GemmTile::Narrow, 1));
    // The M40 (24 SMs, 2 blocks each): the output matrix is 5.2 waves;
    // Q/K/V's 12 blocks would need 4 splits where the narrow tile
    // takes none.
    const M40: GemmSlots = GemmSlots {
        rows_per_sm: 2,
        ..M40_NARROW
    };
    assert_eq!(gemm_plan(32, 128256, 4096, M40).tile, GemmTile::Narrow);
    assert_eq!(gemm_plan(32, 6144, 4096, M40), plan(GemmTile::Narrow, 1));
    // Past 32 tokens, the large tile as before.
    assert_eq!(gemm_plan(33, 128256, 4096, H100).tile, GemmTile::Large);
}
