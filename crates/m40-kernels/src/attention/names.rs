//! The attention kernels' names: per head size, query heads a block and
//! page format (kernels/attention.cu).

use super::{attn_dec_group, AttnShape};
use crate::layout::KvType;

const ATTN_KERNELS: [&str; 8] = [
    "attn_f32_r1",
    "attn_f32_r2",
    "attn_f32_r3",
    "attn_f32_r4",
    "attn_f32_r5",
    "attn_f32_r6",
    "attn_f32_r7",
    "attn_f32_r8",
];
/// The warp kernel over quantized pages (head dimensions a multiple of
/// 64: R = 2, 4, 6, 8).
const ATTN_KERNELS_Q: [[&str; 3]; 4] = [
    crate::layout::kv_names!("attn_f32_r2"),
    crate::layout::kv_names!("attn_f32_r4"),
    crate::layout::kv_names!("attn_f32_r6"),
    crate::layout::kv_names!("attn_f32_r8"),
];

/// The warp kernel for heads of `hd` over pages of `format`.
pub(super) fn attn_warp_kernel(hd: usize, format: KvType) -> &'static str {
    match format {
        KvType::F16 => ATTN_KERNELS[hd.div_ceil(32) - 1],
        f => f.pick(&ATTN_KERNELS_Q[hd / 64 - 1]),
    }
}

/// The decode kernel for `s` with `g` query heads a block (at most
/// [`attn_dec_group`]'s, a power of two) over pages of `format`; with
/// `batch`, its batched variant (`attn_dec_b_f32_*`).
pub(super) fn attn_dec_kernel(
    s: &AttnShape,
    g: usize,
    batch: bool,
    format: KvType,
) -> Option<&'static str> {
    use crate::layout::kv_names;
    const NAMES: [[&[[&str; 3]]; 3]; 2] = [
        [
            &[
                kv_names!("attn_dec_f32_d2_g1"),
                kv_names!("attn_dec_f32_d2_g2"),
                kv_names!("attn_dec_f32_d2_g4"),
                kv_names!("attn_dec_f32_d2_g8"),
            ],
            &[
                kv_names!("attn_dec_f32_d4_g1"),
                kv_names!("attn_dec_f32_d4_g2"),
                kv_names!("attn_dec_f32_d4_g4"),
                kv_names!("attn_dec_f32_d4_g8"),
            ],
            &[
                kv_names!("attn_dec_f32_d8_g1"),
                kv_names!("attn_dec_f32_d8_g2"),
            ],
        ],
        [
            &[
                kv_names!("attn_dec_b_f32_d2_g1"),
                kv_names!("attn_dec_b_f32_d2_g2"),
                kv_names!("attn_dec_b_f32_d2_g4"),
                kv_names!("attn_dec_b_f32_d2_g8"),
            ],
            &[
                kv_names!("attn_dec_b_f32_d4_g1"),
                kv_names!("attn_dec_b_f32_d4_g2"),
                kv_names!("attn_dec_b_f32_d4_g4"),
                kv_names!("attn_dec_b_f32_d4_g8"),
            ],
            &[
                kv_names!("attn_dec_b_f32_d8_g1"),
                kv_names!("attn_dec_b_f32_d8_g2"),
            ],
        ],
    ];
    let max = attn_dec_group(s)?;
    if !g.is_power_of_two() || g > max {
        return None;
    }
    let dpt = (s.head_dim / 64).trailing_zeros() as usize;
    NAMES[batch as usize][dpt]
        .get(g.trailing_zeros() as usize)
        .map(|n| format.pick(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::Scores;

    /// Every name these tables give, for every page format, is a kernel
    /// of the committed PTX.
    #[test]
    fn every_named_attention_kernel_is_in_the_ptx() {
        let has = |n: &str| {
            crate::INDEX
                .lines()
                .any(|l| l.split(' ').skip(1).any(|e| e == n))
        };
        for f in [KvType::F16, KvType::Q8_0, KvType::Q4_0] {
            for hd in [64, 128, 192, 256] {
                if f.takes(hd) {
                    assert!(has(attn_warp_kernel(hd, f)), "{f:?} {hd}");
                }
                for group in [1, 2, 3, 4, 8] {
                    let s = AttnShape {
                        n_tok: 1,
                        start: 0,
                        n_head: group,
                        n_head_kv: 1,
                        head_dim: hd,
                        scores: Scores::default(),
                    };
                    for g in [1, 2, 4, 8] {
                        for batch in [false, true] {
                            if let Some(n) = attn_dec_kernel(&s, g, batch, f) {
                                assert!(has(n), "{n}");
                            }
                        }
                    }
                }
            }
        }
    }
}
