//! kernels/attention.cu: paged attention, every plan, against the CPU.

use super::common::{batch_tables, write_kv};
use super::*;
use m40_kernels::{AttnInputs, AttnShape};

/// The causal attention of one sequence in f64 from FP16-rounded K and V:
/// q (n_tok, n_head, hd), k and v (n_keys, n_kv * hd), query i at position start + i.
fn attention_reference(q: &[f32], k: &[f32], v: &[f32], s: &AttnShape) -> Vec<f32> {
    let (n_tok, start, n_head, n_kv, hd) = (s.n_tok, s.start, s.n_head, s.n_head_kv, s.head_dim);
    let r = |x: f32| half::f16::from_f32(x).to_f32() as f64;
    let kv_dim = n_kv * hd;
    let group = n_head / n_kv;
    let mut out = vec![0f32; n_tok * n_head * hd];
    for i in 0..n_tok {
        let len = start + i + 1;
        for h in 0..n_head {
            let g = h / group;
            let qh = &q[(i * n_head + h) * hd..][..hd];
            let scores: Vec<f64> = (0..len)
                .map(|j| {
                    let kr = &k[j * kv_dim + g * hd..][..hd];
                    qh.iter()
                        .zip(kr)
                        .map(|(a, b)| *a as f64 * r(*b))
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let sum: f64 = p.iter().sum();
            for d in 0..hd {
                let o: f64 = (0..len).map(|j| p[j] * r(v[j * kv_dim + g * hd + d])).sum();
                out[(i * n_head + h) * hd + d] = (o / sum) as f32;
            }
        }
    }
    out
}

/// Attention over a shuffled page table (pages out of order, a pool with
/// spare pages poisoned), for GQA groups of 1 to 16, head sizes from 32 to
/// 256 (not all multiples of 32 or of 8), prefill and decode, with the
/// launcher's plan and with forced key splits. The pools are written on
/// the host (rope_kv_append_matches_cpu checks the kernel that fills them).
#[test]
#[ignore = "needs a GPU"]
fn paged_attention_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("paged_attention_matches_cpu");
    use m40_kernels::{AttnPlan, AttnScratch, KV_PAGE};
    // (n_head, n_kv, hd, start, n_tok)
    // hd 68 and 36 are not multiples of 8: the 4-byte staging path.
    // Prompts of 32 tokens or more with head dimension 64 or 128 run the
    // tile kernel (groups of 3, 4, 1, 8, 32: 30, 32, 32, 32, 32 rows a
    // block; a last block of fewer tokens; keys before the prompt).
    // One-token steps with head dimension 64 or 128 and at most 8 query
    // heads per KV head run the decode kernel (groups of 2, 3, 4, 8, 1, 6:
    // its G of 2, 4, 4, 8, 1, 8), also under a plan made for a later
    // position (a captured decode step's bucket).
    let cases: [(usize, usize, usize, usize, usize); 20] = [
        (4, 2, 64, 0, 1),
        (6, 2, 68, 50, 5),
        (4, 1, 36, 90, 1),
        (9, 3, 64, 0, 37),
        (9, 3, 64, 40, 1),
        (32, 8, 128, 0, 70),
        (32, 8, 128, 1000, 1),
        (32, 8, 128, 300, 17),
        (16, 1, 80, 5, 9),
        (4, 4, 256, 63, 2),
        (14, 2, 32, 100, 3),
        (8, 2, 96, 33, 31),
        (32, 8, 128, 300, 100),
        (8, 8, 64, 17, 64),
        (16, 2, 128, 0, 33),
        (32, 1, 64, 5, 40),
        (16, 2, 128, 200, 1),
        (8, 8, 128, 5, 1),
        (12, 2, 64, 300, 1),
        (4, 4, 64, 31, 1),
    ];
    let (mut tiled, mut decoded) = (0, 0);
    for (n_head, n_kv, hd, start, n_tok) in cases {
        let kv_dim = n_kv * hd;
        let n_keys = start + n_tok;
        let pages = n_keys.div_ceil(KV_PAGE);
        let pool_pages = pages + 3;
        // A shuffled choice of pages.
        let table: Vec<i32> = rng.shuffled(pool_pages)[..pages].to_vec();
        // Past the keys (a bucket's plan covers them): pages no pool has.
        let bucket_start = start + 500;
        let mut table_ext = table.clone();
        table_ext.resize((bucket_start + n_tok).div_ceil(KV_PAGE), i32::MAX / 64);
        let kk = rng.vec(n_keys * kv_dim, -1.0, 1.0);
        let vv = rng.vec(n_keys * kv_dim, -1.0, 1.0);
        let q = rng.vec(n_tok * n_head * hd, -1.0, 1.0);
        // Pools in FP16 at each key's page and slot; spare rows poisoned.
        let mut kp = vec![0xFFFFu16; pool_pages * KV_PAGE * kv_dim];
        let mut vp = kp.clone();
        write_kv(&mut kp, &mut vp, &table, &kk, &vv, kv_dim);
        let kpool = s.upload(&kp, "kpool").unwrap();
        let vpool = s.upload(&vp, "vpool").unwrap();
        let tg = s.upload(&table_ext, "table").unwrap();
        let shape = AttnShape {
            n_tok,
            start,
            n_head,
            n_head_kv: n_kv,
            head_dim: hd,
        };
        let want = attention_reference(&q, &kk, &vv, &shape);
        let qg = s.upload(&q, "q").unwrap();
        let pos = s.upload(&[start as i32], "pos").unwrap();
        let auto = AttnPlan::new(&shape, 132);
        let bucket = AttnShape {
            start: bucket_start,
            ..shape
        };
        let mut plans = vec![(shape, None)];
        for split_pages in [1, 2] {
            let split_len = split_pages * KV_PAGE;
            let forced = AttnPlan {
                split_len,
                splits: n_keys.div_ceil(split_len),
                tile: false,
                ..auto
            };
            plans.push((shape, Some(forced)));
            if auto.dec_warps > 0 {
                // The decode kernel with every query head of a KV head in
                // one block, and with one head a block (head parts).
                let g = (n_head / n_kv).next_power_of_two();
                for dec_heads in [1, g] {
                    plans.push((
                        shape,
                        Some(AttnPlan {
                            dec_heads,
                            ..forced
                        }),
                    ));
                }
                // The warp kernel on the same splits; the decode kernel
                // with one warp a block.
                plans.push((
                    shape,
                    Some(AttnPlan {
                        dec_warps: 0,
                        ..forced
                    }),
                ));
                plans.push((
                    shape,
                    Some(AttnPlan {
                        dec_warps: 1,
                        ..forced
                    }),
                ));
            }
        }
        if auto.dec_warps > 0 {
            // Three warps taking every key in turn, and plans for a later
            // position: the device's, and an M40's 24 SMs.
            // (with 2 heads a block where a KV head has more).
            plans.push((
                shape,
                Some(AttnPlan {
                    dec_warps: 3,
                    split_len: pages * KV_PAGE,
                    splits: 1,
                    dec_heads: auto
                        .dec_heads
                        .max((n_head / n_kv).next_power_of_two().min(2)),
                    ..auto
                }),
            ));
            plans.push((bucket, None));
            plans.push((bucket, Some(AttnPlan::new(&bucket, 24))));
        }
        for (shape, plan) in plans {
            let mut out = s.alloc::<f32>(n_tok * n_head * hd, "out").unwrap();
            s.fill_bytes(&mut out, 0xFF).unwrap();
            let p = plan.unwrap_or_else(|| AttnPlan::new(&shape, _dev.info().sm_count as usize));
            let (np, nml) = p.scratch_len(&shape);
            let mut part = s.alloc::<f32>(np.max(1), "part").unwrap();
            let mut part_ml = s.alloc::<f32>(nml.max(1), "part_ml").unwrap();
            s.fill_bytes(&mut part, 0xFF).unwrap();
            let launched = k
                .attention(
                    &s,
                    &shape,
                    &AttnInputs {
                        q: &qg.view(),
                        kpool: &kpool.view(),
                        vpool: &vpool.view(),
                        table: &tg.view(),
                        pos: &pos.view(),
                    },
                    &mut out,
                    Some(AttnScratch {
                        part: &mut part,
                        part_ml: &mut part_ml,
                    }),
                    plan,
                )
                .unwrap();
            let got = s.download(&out).unwrap();
            tiled += launched.tile as usize;
            decoded += (launched.dec_warps > 0) as usize;
            check(
                &format!("attention {shape:?} {launched:?}"),
                &got,
                &want,
                |_| 2e-5,
            );
        }
    }
    // The 6 cases of 32 or more tokens, under the launcher's plan.
    assert!(tiled >= 6, "{tiled} launches of the tile kernel");
    // 7 one-token cases, 8 launches each but for the warp kernel's 2.
    assert!(decoded >= 7 * 6, "{decoded} launches of the decode kernel");
}

/// The batched decode kernel (one query token of each of up to 50
/// sequences, each at its own position over its own pages of one shared
/// pool) against each sequence's own CPU attention, for head dimensions 64
/// and 128, GQA groups of 1 to 8, batches that fill the GPU (all of a KV
/// head's query heads a block) and that do not (a head a block).
#[test]
#[ignore = "needs a GPU"]
fn batched_decode_attention_matches_cpu() {
    let (dev, s, k, mut rng) = setup("batched_decode_attention_matches_cpu");
    use m40_kernels::KV_PAGE;
    let sm = dev.info().sm_count as usize;
    // (n_head, n_kv, hd, batch)
    let cases = [
        (9, 3, 64, 1),
        (9, 3, 64, 7),
        (9, 3, 64, sm.div_ceil(3) + 1),
        (32, 8, 128, 3),
        (32, 8, 128, sm.div_ceil(8) + 2),
        (8, 8, 128, 5),
        (12, 2, 64, 11),
        (4, 1, 64, 2),
    ];
    for (n_head, n_kv, hd, b) in cases {
        let kv_dim = n_kv * hd;
        let pos: Vec<usize> = (0..b).map(|_| rng.below(600)).collect();
        let keys: Vec<usize> = pos.iter().map(|p| p + 1).collect();
        let (tables, all, tab, pool_pages) = batch_tables(&mut rng, &keys, 3);
        let mut kp = vec![0xFFFFu16; pool_pages * KV_PAGE * kv_dim];
        let mut vp = kp.clone();
        let q = rng.vec(b * n_head * hd, -1.0, 1.0);
        let mut want = Vec::new();
        for (t, table) in tables.iter().enumerate() {
            let kk = rng.vec(keys[t] * kv_dim, -1.0, 1.0);
            let vv = rng.vec(keys[t] * kv_dim, -1.0, 1.0);
            write_kv(&mut kp, &mut vp, table, &kk, &vv, kv_dim);
            let one = AttnShape {
                n_tok: 1,
                start: pos[t],
                n_head,
                n_head_kv: n_kv,
                head_dim: hd,
            };
            let qt = &q[t * n_head * hd..(t + 1) * n_head * hd];
            want.extend(attention_reference(qt, &kk, &vv, &one));
        }
        let shape = AttnShape {
            n_tok: b,
            start: *pos.iter().max().unwrap(),
            n_head,
            n_head_kv: n_kv,
            head_dim: hd,
        };
        let kpool = s.upload(&kp, "kpool").unwrap();
        let vpool = s.upload(&vp, "vpool").unwrap();
        let tg = s.upload(&all, "tables").unwrap();
        let tabg = s.upload(&tab, "tab").unwrap();
        let qg = s.upload(&q, "q").unwrap();
        let pos_i: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
        let pg = s.upload(&pos_i, "pos").unwrap();
        let mut out = s.alloc::<f32>(b * n_head * hd, "out").unwrap();
        s.fill_bytes(&mut out, 0xFF).unwrap();
        k.attention_decode_batch(
            &s,
            &shape,
            &AttnInputs {
                q: &qg.view(),
                kpool: &kpool.view(),
                vpool: &vpool.view(),
                table: &tg.view(),
                pos: &pg.view(),
            },
            &tabg.view(),
            &mut out,
        )
        .unwrap();
        let got = s.download(&out).unwrap();
        check(
            &format!("batched decode attention {b} x {n_head}/{n_kv}x{hd}"),
            &got,
            &want,
            |_| 2e-5,
        );
    }
    // No decode kernel for head dimension 80: an error, not a launch.
    let shape = AttnShape {
        n_tok: 2,
        start: 3,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 80,
    };
    let z = s.upload(&vec![0f32; 2 * 4 * 80], "q").unwrap();
    let p16 = s.upload(&vec![0u16; KV_PAGE * 160], "pool").unwrap();
    let i2 = s.upload(&[0i32, 0], "ints").unwrap();
    let mut out = s.alloc::<f32>(2 * 4 * 80, "out").unwrap();
    let inputs = AttnInputs {
        q: &z.view(),
        kpool: &p16.view(),
        vpool: &p16.view(),
        table: &i2.view(),
        pos: &i2.view(),
    };
    assert!(k
        .attention_decode_batch(&s, &shape, &inputs, &i2.view(), &mut out)
        .is_err());
}
