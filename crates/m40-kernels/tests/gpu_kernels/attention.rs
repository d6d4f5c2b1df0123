//! kernels/attention.cu: paged attention, every plan, against the CPU.

use super::common::{batch_tables, write_kv};
use super::*;
use m40_kernels::{AttnInputs, AttnShape};

// Pages of Q8_0 and Q4_0 (kernels/kvq.cuh, included by attention.cuh).
mod kvq;

/// The causal attention of one sequence in f64 from FP16-rounded K and V:
/// q (n_tok, n_head, hd), k and v (n_keys, n_kv * hd), query i at position
/// start + i; scores as `s.scores` says (scale, soft-cap, window); each
/// query head's sink logit in the denominator where `sinks`.
fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: &AttnShape,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    attention_reference_with(q, k, v, s, sinks, true)
}

/// [`attention_reference`], K and V as they are where `!fp16` (the tile
/// and decode kernels' dequantized pages).
pub(super) fn attention_reference_with(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: &AttnShape,
    sinks: Option<&[f32]>,
    fp16: bool,
) -> Vec<f32> {
    let (n_tok, start, n_head, n_kv, hd) = (s.n_tok, s.start, s.n_head, s.n_head_kv, s.head_dim);
    let scale = s
        .scores
        .scale
        .map_or(1.0 / (hd as f64).sqrt(), |v| v as f64);
    let cap = s.scores.softcap as f64;
    let r = |x: f32| match fp16 {
        true => half::f16::from_f32(x).to_f32() as f64,
        false => x as f64,
    };
    let kv_dim = n_kv * hd;
    let group = n_head / n_kv;
    let mut out = vec![0f32; n_tok * n_head * hd];
    for i in 0..n_tok {
        let len = start + i + 1;
        let lo = match s.scores.window {
            0 => 0,
            w => len.saturating_sub(w),
        };
        for h in 0..n_head {
            let g = h / group;
            let qh = &q[(i * n_head + h) * hd..][..hd];
            let scores: Vec<f64> = (0..len)
                .map(|j| {
                    let kr = &k[j * kv_dim + g * hd..][..hd];
                    let s = qh
                        .iter()
                        .zip(kr)
                        .map(|(a, b)| *a as f64 * r(*b))
                        .sum::<f64>()
                        * scale;
                    let s = if cap > 0.0 { cap * (s / cap).tanh() } else { s };
                    if j < lo {
                        f64::NEG_INFINITY
                    } else {
                        s
                    }
                })
                .collect();
            let sink = sinks.map(|sk| sk[h] as f64);
            let mx = scores
                .iter()
                .cloned()
                .fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
            let p: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let sum: f64 = p.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - mx).exp());
            for d in 0..hd {
                let o: f64 = (0..len).map(|j| p[j] * r(v[j * kv_dim + g * hd + d])).sum();
                out[(i * n_head + h) * hd + d] = (o / sum) as f32;
            }
        }
    }
    out
}

/// One attention launch under `plan` (None: the launcher's; `p` is the
/// plan it will take, for the scratch): its output (poisoned before) and
/// the plan it ran.
pub(super) fn run_attention(
    s: &Stream,
    k: &Kernels,
    shape: &AttnShape,
    inputs: &AttnInputs<'_, '_>,
    p: m40_kernels::AttnPlan,
    plan: Option<m40_kernels::AttnPlan>,
) -> (Vec<f32>, m40_kernels::AttnPlan) {
    let mut out = s
        .alloc::<f32>(shape.n_tok * shape.n_head * shape.head_dim, "out")
        .unwrap();
    s.fill_bytes(&mut out, 0xFF).unwrap();
    let (np, nml) = p.scratch_len(shape);
    let mut part = s.alloc::<f32>(np.max(1), "part").unwrap();
    let mut part_ml = s.alloc::<f32>(nml.max(1), "part_ml").unwrap();
    s.fill_bytes(&mut part, 0xFF).unwrap();
    let scratch = m40_kernels::AttnScratch {
        part: &mut part,
        part_ml: &mut part_ml,
    };
    let launched = k
        .attention(s, shape, inputs, &mut out, Some(scratch), plan)
        .unwrap();
    (s.download(&out).unwrap(), launched)
}

/// Attention over a shuffled page table (pages out of order, a pool with
/// spare pages poisoned), for GQA groups of 1 to 16, head sizes from 32 to
/// 256 (not all multiples of 32 or of 8), prefill and decode, plain and
/// gemma's scores (windows, soft-caps, scales), gpt-oss's sinks (every
/// other case: a logit per query head in [-1, 3), the scores' range), with
/// the launcher's plan and with forced key splits. The pools are written on
/// the host (rope_kv_append_matches_cpu checks the kernel that fills them).
#[test]
#[ignore = "needs a GPU"]
fn paged_attention_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("paged_attention_matches_cpu");
    use m40_kernels::{AttnPlan, Scores, KV_PAGE};
    // (n_head, n_kv, hd, start, n_tok)
    // hd 68 and 36 are not multiples of 8: the 4-byte staging path.
    // Prompts of 32 tokens or more with head dimension 64 or 128 run the
    // tile kernel (groups of 3, 4, 1, 8, 32: 30, 32, 32, 32, 32 rows a
    // block; a last block of fewer tokens; keys before the prompt).
    // One-token steps with head dimension 64 or 128 and at most 8 query
    // heads per KV head run the decode kernel (groups of 2, 3, 4, 8, 1, 6:
    // its G of 2, 4, 4, 8, 1, 8), also under a plan made for a later
    // position (a captured decode step's bucket); so do those of head
    // dimension 256 with at most 2.
    // Then gemma's scores: sliding windows (the tile kernel skipping pages
    // before them, decode passes partly before them, splits wholly before
    // them; the warp kernel at hd 256 and 96), soft-caps, scales of their
    // own.
    let plain = Scores::default();
    let sc = |window, softcap, scale| Scores {
        scale,
        softcap,
        window,
    };
    let cases: [(usize, usize, usize, usize, usize, Scores); 33] = [
        (4, 2, 64, 0, 1, plain),
        (6, 2, 68, 50, 5, plain),
        (4, 1, 36, 90, 1, plain),
        (9, 3, 64, 0, 37, plain),
        (9, 3, 64, 40, 1, plain),
        (32, 8, 128, 0, 70, plain),
        (32, 8, 128, 1000, 1, plain),
        (32, 8, 128, 300, 17, plain),
        (16, 1, 80, 5, 9, plain),
        (4, 4, 256, 63, 2, plain),
        (14, 2, 32, 100, 3, plain),
        (8, 2, 96, 33, 31, plain),
        (32, 8, 128, 300, 100, plain),
        (8, 8, 64, 17, 64, plain),
        (16, 2, 128, 0, 33, plain),
        (32, 1, 64, 5, 40, plain),
        (16, 2, 128, 200, 1, plain),
        (8, 8, 128, 5, 1, plain),
        (12, 2, 64, 300, 1, plain),
        (4, 4, 64, 31, 1, plain),
        (4, 2, 64, 0, 40, sc(5, 0.0, None)),
        (32, 8, 128, 300, 70, sc(100, 0.7, Some(0.05))),
        (8, 8, 64, 17, 64, sc(0, 0.5, None)),
        (9, 3, 64, 200, 1, sc(40, 0.0, None)),
        (16, 2, 128, 1000, 1, sc(33, 1.5, Some(0.0625))),
        (4, 2, 64, 90, 1, sc(1, 0.0, None)),
        (4, 4, 256, 63, 20, sc(7, 0.8, Some(0.0625))),
        (6, 2, 96, 90, 3, sc(1, 0.0, None)),
        (4, 2, 64, 500, 1, sc(4096, 2.0, None)),
        (32, 8, 128, 40, 33, sc(32, 0.0, None)),
        // Head dimension 256 (gemma): the decode kernel at groups of 2 and
        // 1, a short context and a split one, with gemma's scores.
        (16, 8, 256, 300, 1, plain),
        (8, 8, 256, 40, 1, sc(7, 0.8, Some(0.0625))),
        (16, 8, 256, 1500, 1, sc(1024, 0.0, Some(0.0625))),
    ];
    let (mut tiled, mut decoded) = (0, 0);
    for (ci, (n_head, n_kv, hd, start, n_tok, scores)) in cases.into_iter().enumerate() {
        let sinks = (ci % 2 == 1).then(|| rng.vec(n_head, -1.0, 3.0));
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
            scores,
        };
        let want = attention_reference(&q, &kk, &vv, &shape, sinks.as_deref());
        let sg = sinks.as_ref().map(|v| s.upload(v, "sinks").unwrap());
        let sv = sg.as_ref().map(|b| b.view());
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
        let inputs = AttnInputs {
            q: &qg.view(),
            kpool: &kpool.view(),
            vpool: &vpool.view(),
            format: m40_kernels::KvType::F16,
            table: &tg.view(),
            pos: &pos.view(),
            sinks: sv.as_ref(),
        };
        for (shape, plan) in plans {
            let p = plan.unwrap_or_else(|| AttnPlan::new(&shape, _dev.info().sm_count as usize));
            let (got, launched) = run_attention(&s, &k, &shape, &inputs, p, plan);
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
    // 10 one-token cases, 8 launches each but for the warp kernel's 2.
    assert!(decoded >= 10 * 6, "{decoded} launches of the decode kernel");
}

/// The batched decode kernel (one query token of each of up to 50
/// sequences, each at its own position over its own pages of one shared
/// pool) against each sequence's own CPU attention, for head dimensions 64
/// and 128 (GQA groups of 1 to 8) and 256 (1 and 2), batches that fill the GPU (all of a KV
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
        (16, 8, 256, 3),
        (8, 8, 256, sm.div_ceil(8) + 2),
    ];
    for (n_head, n_kv, hd, b) in cases {
        let heads = (n_head, n_kv, hd);
        batched_decode_case(&s, &k, &mut rng, heads, b, 600, Default::default());
    }
    // gemma's scores: each sequence's window from its own position.
    for (n_head, n_kv, hd, b, window, softcap) in [
        (9, 3, 64, 7, 20, 0.0f32),
        (32, 8, 128, 5, 50, 1.0),
        (4, 2, 64, 40, 1, 0.6),
        (16, 8, 256, 6, 30, 0.8),
    ] {
        let scores = m40_kernels::Scores {
            scale: None,
            softcap,
            window,
        };
        batched_decode_case(&s, &k, &mut rng, (n_head, n_kv, hd), b, 300, scores);
    }
    // No decode kernel for head dimension 80: an error, not a launch.
    let shape = AttnShape {
        n_tok: 2,
        start: 3,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 80,
        scores: Default::default(),
    };
    let z = s.upload(&vec![0f32; 2 * 4 * 80], "q").unwrap();
    let p16 = s.upload(&vec![0u16; KV_PAGE * 160], "pool").unwrap();
    let i2 = s.upload(&[0i32, 0], "ints").unwrap();
    let mut out = s.alloc::<f32>(2 * 4 * 80, "out").unwrap();
    let inputs = AttnInputs {
        q: &z.view(),
        kpool: &p16.view(),
        vpool: &p16.view(),
        format: m40_kernels::KvType::F16,
        table: &i2.view(),
        pos: &i2.view(),
        sinks: None,
    };
    assert!(k
        .attention_decode_batch(&s, &shape, &inputs, &i2.view(), &mut out)
        .is_err());
}

/// The batched decode kernel over `b` sequences of `heads` (query heads,
/// KV heads, head size), each at a position below `max_pos` over its own
/// shuffled pages of one pool, against each one's CPU attention; odd
/// batches with attention sinks.
fn batched_decode_case(
    s: &Stream,
    k: &Kernels,
    rng: &mut Rng,
    (n_head, n_kv, hd): (usize, usize, usize),
    b: usize,
    max_pos: usize,
    scores: m40_kernels::Scores,
) {
    use m40_kernels::KV_PAGE;
    let kv_dim = n_kv * hd;
    let pos: Vec<usize> = (0..b).map(|_| rng.below(max_pos)).collect();
    let keys: Vec<usize> = pos.iter().map(|p| p + 1).collect();
    let (tables, all, tab, pool_pages) = batch_tables(rng, &keys, 3);
    let mut kp = vec![0xFFFFu16; pool_pages * KV_PAGE * kv_dim];
    let mut vp = kp.clone();
    let q = rng.vec(b * n_head * hd, -1.0, 1.0);
    let sinks = (b % 2 == 1).then(|| rng.vec(n_head, -1.0, 3.0));
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
            scores,
        };
        let qt = &q[t * n_head * hd..(t + 1) * n_head * hd];
        want.extend(attention_reference(qt, &kk, &vv, &one, sinks.as_deref()));
    }
    let shape = AttnShape {
        n_tok: b,
        start: *pos.iter().max().unwrap(),
        n_head,
        n_head_kv: n_kv,
        head_dim: hd,
        scores,
    };
    let pos_i: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
    let (kpool, vpool) = (
        s.upload(&kp, "kpool").unwrap(),
        s.upload(&vp, "vpool").unwrap(),
    );
    let (tg, tabg) = (
        s.upload(&all, "tables").unwrap(),
        s.upload(&tab, "tab").unwrap(),
    );
    let (qg, pg) = (s.upload(&q, "q").unwrap(), s.upload(&pos_i, "pos").unwrap());
    let mut out = s.alloc::<f32>(b * n_head * hd, "out").unwrap();
    s.fill_bytes(&mut out, 0xFF).unwrap();
    let sg = sinks.as_ref().map(|v| s.upload(v, "sinks").unwrap());
    let sv = sg.as_ref().map(|b| b.view());
    let inputs = AttnInputs {
        q: &qg.view(),
        kpool: &kpool.view(),
        vpool: &vpool.view(),
        format: m40_kernels::KvType::F16,
        table: &tg.view(),
        pos: &pg.view(),
        sinks: sv.as_ref(),
    };
    k.attention_decode_batch(s, &shape, &inputs, &tabg.view(), &mut out)
        .unwrap();
    check(
        &format!(
            "batched decode attention {b} x {n_head}/{n_kv}x{hd} {scores:?} sinks {}",
            sinks.is_some()
        ),
        &s.download(&out).unwrap(),
        &want,
        |_| 2e-5,
    );
}
