use super::*;
use crate::MAX_SHARED_PER_BLOCK;

#[test]
fn attention_plans_cover_every_key() {
    for (n_head, n_head_kv) in [(9, 3), (32, 8), (4, 2), (16, 1), (14, 2), (32, 32)] {
        for n_tok in [1, 2, 7, 512] {
            for start in [0, 1, 31, 32, 4095, 8000] {
                for sm in [1, 24, 132] {
                    let s = AttnShape {
                        n_tok,
                        start,
                        n_head,
                        n_head_kv,
                        head_dim: 64,
                        scores: Default::default(),
                    };
                    let p = AttnPlan::new(&s, sm);
                    let what = format!("{s:?} {sm}: {p:?}");
                    let group = n_head / n_head_kv;
                    assert!(p.gw * p.hparts >= group, "{what}");
                    assert!(p.tpb * p.gw <= ATT_MAX_WARPS && p.tpb >= 1, "{what}");
                    assert!(
                        p.split_len.is_multiple_of(KV_PAGE) && p.split_len > 0,
                        "{what}"
                    );
                    assert!(p.splits * p.split_len >= start + n_tok, "{what}");
                    assert!((p.splits - 1) * p.split_len < start + n_tok, "{what}");
                }
            }
        }
    }
    // Decode at depth 4096 with 8 KV heads on 132 SMs: the decode
    // kernel's 8 warps a block, splits toward 2 blocks an SM (33) but
    // a pass of 16 keys for each warp at least: 32 splits of 4 pages.
    let s = AttnShape {
        n_tok: 1,
        start: 4095,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        scores: Default::default(),
    };
    let p = AttnPlan::new(&s, 132);
    assert_eq!((p.splits, p.split_len, p.dec_warps), (32, 4 * KV_PAGE, 8));
    // Split keys: a block takes all 4 query heads of its KV head.
    assert_eq!(p.dec_heads, 4);
    // Without the decode kernel: the warp kernel's 128 splits of a page.
    let w = AttnPlan::choose(&s, 132, false);
    assert_eq!((w.splits, w.split_len, w.dec_warps), (128, KV_PAGE, 0));
    // On an M40's 24 SMs: 2 * 24 / 8 = 6 splits of 22 pages.
    let p = AttnPlan::new(&s, 24);
    assert_eq!((p.splits, p.split_len), (6, 22 * KV_PAGE));
    // Up to 256 keys the warps of one block take them all (2 passes
    // each at most): no split, no combine; a context of 40 keys takes
    // 3 warps.
    let at = |start| AttnPlan::new(&AttnShape { start, ..s }, 132);
    assert_eq!((at(255).splits, at(255).dec_warps), (1, 8));
    assert_eq!((at(39).splits, at(39).dec_warps), (1, 3));
    // Not split: a block a query head (32 blocks, not 8).
    assert_eq!((at(255).dec_heads, at(39).dec_heads), (1, 1));
    assert_eq!(at(256).splits, 2);
    // Head dimension 96, or 16 query heads a KV head: the warp kernel.
    let warp = |n_head, head_dim| {
        let p = AttnPlan::new(
            &AttnShape {
                n_head,
                head_dim,
                ..s
            },
            132,
        );
        p.dec_warps == 0 && !p.tile
    };
    assert!(warp(32, 96));
    assert!(warp(128, 128));
    assert!(!warp(64, 128));
    // Head dimension 256 (gemma): the decode kernel up to 2 query heads a
    // KV head.
    assert!(!warp(16, 256));
    assert!(warp(32, 256));
    assert!(attn_decodes(256, 2) && !attn_decodes(256, 4) && attn_decodes(128, 8));
    assert!(!attn_decodes(96, 1) && !attn_decodes(64, 9));
    // Prefill in register tiles: 512-token prompts (8B on an H100: no
    // split; SmolLM2: 16 pages), a 512-token chunk at 1536; not a
    // 50-token turn after 4000 tokens (the warp kernel splits its 127
    // pages), nor decode.
    let tile = |n_head, n_head_kv, head_dim, start, n_tok| {
        let s = AttnShape {
            n_tok,
            start,
            n_head,
            n_head_kv,
            head_dim,
            scores: Default::default(),
        };
        AttnPlan::new(&s, 132).tile
    };
    assert!(tile(32, 8, 128, 0, 512));
    assert!(tile(32, 8, 128, 1536, 512));
    assert!(tile(9, 3, 64, 0, 512));
    assert!(tile(32, 8, 64, 0, 40));
    assert!(!tile(32, 8, 128, 4000, 50));
    assert!(!tile(32, 8, 128, 4095, 1));
    assert!(!tile(32, 8, 96, 0, 512));
}

#[test]
fn attention_shared_memory_fits() {
    assert!(attn_shared_bytes(MAX_HEAD_DIM) <= MAX_SHARED_PER_BLOCK);
    assert!(attn_tile_shared_bytes(128) <= MAX_SHARED_PER_BLOCK);
    assert!(attn_dec_shared_bytes(128, 8) <= MAX_SHARED_PER_BLOCK);
    assert!(attn_dec_shared_bytes(256, 2) <= MAX_SHARED_PER_BLOCK);
}
