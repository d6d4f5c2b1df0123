//! How a packed GEMV launch spreads its row groups over warps and blocks.

use super::PACKED_GEMV_WARPS;

/// Warps per block of a one-token packed GEMV with a 3-way split (2 row
/// groups; kernels/gemv_packed.cuh `PGEMV_MAX_WARPS`).
pub(super) const PACKED_GEMV_SPLIT3_WARPS: usize = 6;

/// How a packed GEMV launch spreads its row groups: `ksplit` warps per
/// group (each taking every ksplit-th run of 8 blocks of the row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PackedSplit {
    pub(super) ksplit: usize,
}

impl PackedSplit {
    fn of(ksplit: usize) -> Self {
        Self { ksplit }
    }

    /// Warps a block: 4, or 6 for a 3-way split.
    pub(super) fn warps(self) -> usize {
        match self.ksplit {
            3 => PACKED_GEMV_SPLIT3_WARPS,
            _ => PACKED_GEMV_WARPS as usize,
        }
    }

    /// Blocks for `groups` row groups.
    pub(super) fn blocks(self, groups: usize) -> usize {
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
/// only as the first drains); where none does, the one whose waves, each
/// as long as a lane's rounds of loads and one more (a block's fixed
/// cost), take least, the smaller on a tie: no split, unless its last wave
/// is nearly empty (a 12B's gate/up, 7680 groups of 15 runs: 2.08 waves
/// unsplit, 4.16 split in 2, which measured 1.2% faster a token on an
/// H100, and 4 ways 1.7% slower: BENCHMARKS.md). A 3-way split replaces it where it also
/// fits in a wave and its lanes wait for fewer rounds of loads (BENCHMARKS.md, "Measurements behind constants").
pub(super) fn packed_split(
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
    let waves = |p: PackedSplit| slots[0].map(|n| p.blocks(groups).div_ceil(n.max(1)));
    let pow2 = allowed()
        .rfind(|p| p.ksplit != 3 && one_wave(*p))
        .or_else(|| {
            allowed()
                .filter(|p| p.ksplit != 3)
                .min_by_key(|p| waves(*p).map(|w| w * (p.rounds(runs, u) + 1)))
        })
        .unwrap_or(fallback);
    match allowed().find(|p| p.ksplit == 3) {
        Some(p3) if one_wave(p3) && p3.rounds(runs, u) < pow2.rounds(runs, u) => p3,
        _ => pow2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(split(7168, 128, 2, h100, None), 1);
        // Unless the unsplit last wave is nearly empty (gemma3-12b's gate/up
        // stack, 7680 groups of 15 runs: 3 waves unsplit, 5 split in 2).
        assert_eq!(split(7680, 120, 2, h100, None), 2);
        assert_eq!(split(7680, 120, 2, [Some(168), Some(96)], None), 1);
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
}
