//! kernels/kvq.cuh: the KV cache's Q8_0 and Q4_0 pages, written by the
//! RoPE launches (rotated, then quantized), read by every attention kernel
//! (dequantized in registers), which turns its output back from the
//! values' rotation.

use super::*;
use m40_gguf::quant;
use m40_kernels::{AttnPlan, KvAppend, KvType, Scores, KV_PAGE};
use m40_model::cpu::kv_rotate;

const FORMATS: [(KvType, GgmlType); 2] = [
    (KvType::Q8_0, GgmlType::Q8_0),
    (KvType::Q4_0, GgmlType::Q4_0),
];

/// The rotation's run for keys and queries: the largest power of two
/// dividing the head size (as the CPU backend's `Rows::rotations`).
fn k_run(hd: usize) -> usize {
    1 << hd.trailing_zeros()
}

/// Where row `slot` of page `page` lies in a pool of `ty` (kvq.cuh): its
/// quants' and its scales' byte offsets.
fn row_at(ty: KvType, kv_dim: usize, page: usize, slot: usize) -> (usize, usize) {
    let base = page * ty.page_bytes(kv_dim);
    let row = if ty == KvType::Q8_0 {
        kv_dim
    } else {
        kv_dim / 2
    };
    (base + slot * row, base + KV_PAGE * row + slot * kv_dim / 16)
}

/// One row of values in `ty`'s layout from ggml's blocks of it.
fn to_layout(ty: KvType, ggml: GgmlType, x: &[f32], pool: &mut [u8], (q, s): (usize, usize)) {
    let blocks = quant::quantize_to_vec(ggml, x).unwrap();
    let bb = if ty == KvType::Q8_0 { 34 } else { 18 };
    for (b, blk) in blocks.chunks_exact(bb).enumerate() {
        pool[s + 2 * b..s + 2 * b + 2].copy_from_slice(&blk[..2]);
        match ty {
            KvType::Q8_0 => pool[q + 32 * b..q + 32 * b + 32].copy_from_slice(&blk[2..]),
            _ => {
                // ggml: byte j = value j low, j + 16 high; here value 2i
                // low, 2i + 1 high.
                let v = |i: usize| {
                    if i < 16 {
                        blk[2 + i] & 15
                    } else {
                        blk[2 + i - 16] >> 4
                    }
                };
                for i in 0..16 {
                    pool[q + 16 * b + i] = v(2 * i) | (v(2 * i + 1) << 4);
                }
            }
        }
    }
}

/// A row of `ty`'s layout as FP32.
fn from_layout(ty: KvType, pool: &[u8], (q, s): (usize, usize), n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let d = half::f16::from_le_bytes([pool[s + 2 * (i / 32)], pool[s + 2 * (i / 32) + 1]])
                .to_f32();
            match ty {
                KvType::Q8_0 => pool[q + i] as i8 as f32 * d,
                _ => (((pool[q + i / 2] >> (4 * (i % 2))) & 15) as i32 - 8) as f32 * d,
            }
        })
        .collect()
}

fn words(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn bytes(words: &[u16]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Attention over quantized pages (written here, on the host) under the
/// launcher's plan and forced ones: the tile kernel (prompts of 32 or
/// more, heads of 64 and 128), the decode kernel (one token, heads of 64,
/// 128 and 256; key splits), the warp kernel (the quants staged as they
/// are, dequantized as read); against the CPU's attention over the same
/// dequantized values. The batched decode
/// kernel in `attention_decode_batch`, each sequence on its own pages.
#[test]
#[ignore = "needs a GPU"]
fn attention_over_quantized_pages_matches_cpu() {
    let (dev, s, k, mut rng) = setup("attention_over_quantized_pages_matches_cpu");
    let sm = dev.info().sm_count as usize;
    // (n_head, n_kv, hd, start, n_tok, window)
    let cases: [(usize, usize, usize, usize, usize, usize); 9] = [
        (4, 2, 64, 0, 1, 0),
        (9, 3, 64, 0, 37, 0),
        (9, 3, 64, 300, 1, 0),
        (32, 8, 128, 100, 40, 0),
        (32, 8, 128, 1000, 1, 0),
        (16, 2, 128, 5, 3, 0),
        (8, 8, 256, 70, 1, 7),
        (4, 4, 256, 63, 20, 0),
        (6, 2, 192, 40, 2, 0),
    ];
    let (mut tiled, mut decoded, mut warp) = (0, 0, 0);
    for (ty, ggml) in FORMATS {
        for (n_head, n_kv, hd, start, n_tok, window) in cases {
            let kv_dim = n_kv * hd;
            let n_keys = start + n_tok;
            let pages = n_keys.div_ceil(KV_PAGE);
            let pool_pages = pages + 2;
            let table: Vec<i32> = rng.shuffled(pool_pages)[..pages].to_vec();
            let kk = rng.vec(n_keys * kv_dim, -1.0, 1.0);
            let vv = rng.vec(n_keys * kv_dim, -1.0, 1.0);
            let q = rng.vec(n_tok * n_head * hd, -1.0, 1.0);
            let mut kp = vec![0xFFu8; pool_pages * ty.page_bytes(kv_dim)];
            let mut vp = kp.clone();
            let (mut kd, mut vd) = (kk.clone(), vv.clone());
            for j in 0..n_keys {
                let at = row_at(ty, kv_dim, table[j / KV_PAGE] as usize, j % KV_PAGE);
                let row = j * kv_dim..(j + 1) * kv_dim;
                to_layout(ty, ggml, &kk[row.clone()], &mut kp, at);
                to_layout(ty, ggml, &vv[row.clone()], &mut vp, at);
                kd[row.clone()].copy_from_slice(&from_layout(ty, &kp, at, kv_dim));
                vd[row.clone()].copy_from_slice(&from_layout(ty, &vp, at, kv_dim));
            }
            let shape = AttnShape {
                n_tok,
                start,
                n_head,
                n_head_kv: n_kv,
                head_dim: hd,
                scores: Scores {
                    window,
                    ..Default::default()
                },
            };
            // The kernels turn the output back from the values' rotation
            // (runs of 64): the reference over the stored values, rotated.
            let mut want = attention_reference_with(&q, &kd, &vd, &shape, None, false);
            kv_rotate(&mut want, 64);
            let (kpool, vpool) = (
                s.upload(&words(&kp), "kp").unwrap(),
                s.upload(&words(&vp), "vp").unwrap(),
            );
            let (qg, tg) = (
                s.upload(&q, "q").unwrap(),
                s.upload(&table, "table").unwrap(),
            );
            let pos = s.upload(&[start as i32], "pos").unwrap();
            let inputs = AttnInputs {
                q: &qg.view(),
                kpool: &kpool.view(),
                vpool: &vpool.view(),
                format: ty,
                table: &tg.view(),
                pos: &pos.view(),
                sinks: None,
            };
            let auto = AttnPlan::new(&shape, sm);
            let split = AttnPlan {
                split_len: KV_PAGE,
                splits: pages,
                tile: false,
                ..auto
            };
            let mut plans = vec![
                None,
                Some(split),
                Some(AttnPlan {
                    dec_warps: 0,
                    ..split
                }),
            ];
            if auto.dec_warps > 0 {
                plans.push(Some(AttnPlan {
                    dec_warps: 1,
                    ..split
                }));
            }
            for plan in plans {
                let p = plan.unwrap_or(auto);
                let (got, launched) = run_attention(&s, &k, &shape, &inputs, p, plan);
                tiled += launched.tile as usize;
                decoded += (launched.dec_warps > 0) as usize;
                warp += (!launched.tile && launched.dec_warps == 0) as usize;
                check(
                    &format!("{ty:?} attention {shape:?} {launched:?}"),
                    &got,
                    &want,
                    |_| 2e-5,
                );
            }
            // The same keys as one-token steps of a batch: each its own
            // sequence over the same pages, at its own position.
            if n_tok > 1 && KvType::Q8_0.takes(hd) && hd != 192 && n_head / n_kv <= 8 {
                let b = n_tok;
                let qb = q.clone();
                let positions: Vec<i32> = (0..b).map(|t| (start + t) as i32).collect();
                let tab = vec![0i32; b];
                let mut want = Vec::new();
                for t in 0..b {
                    let one = AttnShape {
                        n_tok: 1,
                        start: start + t,
                        ..shape
                    };
                    let keys = (start + t + 1) * kv_dim;
                    let mut w = attention_reference_with(
                        &qb[t * n_head * hd..(t + 1) * n_head * hd],
                        &kd[..keys],
                        &vd[..keys],
                        &one,
                        None,
                        false,
                    );
                    kv_rotate(&mut w, 64);
                    want.extend(w);
                }
                let (pg, tabg) = (
                    s.upload(&positions, "pos").unwrap(),
                    s.upload(&tab, "tab").unwrap(),
                );
                let inputs = AttnInputs {
                    pos: &pg.view(),
                    ..inputs
                };
                let mut out = s.alloc::<f32>(b * n_head * hd, "out").unwrap();
                s.fill_bytes(&mut out, 0xFF).unwrap();
                let bs = AttnShape {
                    n_tok: b,
                    start: n_keys - 1,
                    ..shape
                };
                k.attention_decode_batch(&s, &bs, &inputs, &tabg.view(), &mut out)
                    .unwrap();
                let got = s.download(&out).unwrap();
                check(
                    &format!("{ty:?} batched decode {bs:?}"),
                    &got,
                    &want,
                    |_| 2e-5,
                );
            }
        }
    }
    assert!(
        tiled >= 4 && decoded >= 8 && warp >= 9,
        "{tiled} tile, {decoded} decode, {warp} warp launches"
    );
}

/// The RoPE launches into quantized pages: the queries roped and rotated
/// in place, each key rotated over runs of the head size's largest power
/// of two and each value over runs of 64, then quantized into its row of
/// a shuffled table; against the CPU's RoPE, `kv_rotate` and m40-gguf's
/// quantizer. A key whose FP32 RoPE rounds apart from the CPU's may land
/// one step of its block away: every value is within one step, and 99% are
/// exact. Rows no token wrote keep their poison. Plain, biased, head
/// norms; normal and NeoX pairs; one sequence and a batch.
#[test]
#[ignore = "needs a GPU"]
fn rope_append_into_quantized_pages_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("rope_append_into_quantized_pages_matches_cpu");
    use m40_gguf::RopeStyle as Cpu;
    let (mut exact, mut total) = (0usize, 0usize);
    for (ty, ggml) in FORMATS {
        for (style, cpu_style) in [
            (RopeStyle::Normal, Cpu::Normal),
            (RopeStyle::Neox, Cpu::Neox),
        ] {
            // (n_tok, n_head, n_kv, hd, n_rot, start, batch)
            for (n_tok, n_head, n_kv, hd, n_rot, start, batch) in [
                (1, 9, 3, 64, 64, 31, false),
                (7, 32, 8, 128, 128, 4000, false),
                (5, 8, 2, 256, 256, 62, false),
                (3, 6, 2, 192, 128, 5, false),
                (6, 4, 2, 64, 32, 100, true),
            ] {
                let rope = ops::Rope::new(cpu_style, n_rot, 10000.0, 1.0, None);
                let kv_dim = n_kv * hd;
                let pos: Vec<usize> = match batch {
                    false => (start..start + n_tok).collect(),
                    true => (0..n_tok).map(|t| start + 37 * t).collect(),
                };
                let pages = (pos.iter().max().unwrap() + 1).div_ceil(KV_PAGE);
                let pool_pages = pages + 2;
                let table: Vec<i32> = rng.shuffled(pool_pages)[..pages].to_vec();
                let q = rng.vec(n_tok * n_head * hd, -2.0, 2.0);
                let kx = rng.vec(n_tok * kv_dim, -2.0, 2.0);
                let vx = rng.vec(n_tok * kv_dim, -2.0, 2.0);
                let norms = (rng.vec(hd, 0.5, 1.5), rng.vec(hd, 0.5, 1.5));
                let bias = rng.vec((n_head + 2 * n_kv) * hd, -1.0, 1.0);
                for (normed, biased) in [(false, false), (true, false), (false, true)] {
                    let (mut wq, mut wk, mut wv) = (q.clone(), kx.clone(), vx.clone());
                    if normed {
                        ops::rmsnorm(&mut wq, &norms.0, 1e-6);
                        ops::rmsnorm(&mut wk, &norms.1, 1e-6);
                    }
                    if biased {
                        let (bq, rest) = bias.split_at(n_head * hd);
                        let (bk, bv) = rest.split_at(kv_dim);
                        for (x, b) in [(&mut wq, bq), (&mut wk, bk), (&mut wv, bv)] {
                            for row in x.chunks_exact_mut(b.len()) {
                                row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                            }
                        }
                    }
                    for (t, &p) in pos.iter().enumerate() {
                        rope.apply(&mut wq[t * n_head * hd..][..n_head * hd], hd, p);
                        rope.apply(&mut wk[t * kv_dim..][..kv_dim], hd, p);
                    }
                    kv_rotate(&mut wq, k_run(hd));
                    kv_rotate(&mut wk, k_run(hd));
                    kv_rotate(&mut wv, 64);
                    let mut qg = s.upload(&q, "q").unwrap();
                    let (kg, vg) = (s.upload(&kx, "k").unwrap(), s.upload(&vx, "v").unwrap());
                    let pos_i: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
                    let pg = s.upload(&pos_i, "pos").unwrap();
                    let tg = s.upload(&table, "table").unwrap();
                    let tabg = s.upload(&vec![0i32; n_tok], "tab").unwrap();
                    let fg = s.upload(&rope.device_table(), "inv_freq").unwrap();
                    let words_len = pool_pages * ty.page_bytes(kv_dim) / 2;
                    let mut kpool = s.alloc::<u16>(words_len, "kp").unwrap();
                    let mut vpool = s.alloc::<u16>(words_len, "vp").unwrap();
                    s.fill_bytes(&mut kpool, 0xFF).unwrap();
                    s.fill_bytes(&mut vpool, 0xFF).unwrap();
                    let p = RopeParams {
                        style,
                        n_head,
                        head_dim: hd,
                        n_rot,
                        pos_scale: rope.pos_scale,
                    };
                    let kv = KvAppend {
                        n_head_kv: n_kv,
                        pos: &pg.view(),
                        inv_freq: &fg.view(),
                        p: &p,
                        kpool: &mut kpool,
                        vpool: &mut vpool,
                        format: ty,
                        table: &tg.view(),
                        max_start: *pos.iter().max().unwrap() - if batch { 0 } else { n_tok - 1 },
                    };
                    let (kv_k, kv_v) = (kg.view(), vg.view());
                    let tab = batch.then(|| tabg.view());
                    let bg = s.upload(&bias, "bias").unwrap();
                    if normed {
                        let (qn, kn) = (
                            s.upload(&norms.0, "qn").unwrap(),
                            s.upload(&norms.1, "kn").unwrap(),
                        );
                        let hn = m40_kernels::HeadNorms {
                            q: &qn.view(),
                            k: &kn.view(),
                            eps: 1e-6,
                        };
                        k.rope_kv_append_normed(&s, &mut qg, &kv_k, &kv_v, kv, tab.as_ref(), hn)
                            .unwrap();
                    } else if biased {
                        k.rope_kv_append_biased(
                            &s,
                            &mut qg,
                            &kv_k,
                            &kv_v,
                            kv,
                            tab.as_ref(),
                            &bg.view(),
                        )
                        .unwrap();
                    } else if let Some(tab) = &tab {
                        k.rope_kv_append_batch(&s, &mut qg, &kv_k, &kv_v, kv, tab)
                            .unwrap();
                    } else {
                        k.rope_kv_append(&s, &mut qg, &kv_k, &kv_v, kv).unwrap();
                    }
                    let what = format!(
                        "{ty:?} rope {style:?} {n_tok}x{n_head}/{n_kv}x{hd} rot {n_rot} batch {batch} norms {normed} bias {biased}"
                    );
                    let got_q = s.download(&qg).unwrap();
                    check(&format!("{what}: q"), &got_q, &wq, |_| 2e-5);
                    let (kp, vp) = (
                        bytes(&s.download(&kpool).unwrap()),
                        bytes(&s.download(&vpool).unwrap()),
                    );
                    let mut written = vec![false; pool_pages * KV_PAGE];
                    for (t, &p) in pos.iter().enumerate() {
                        let page = table[p / KV_PAGE] as usize;
                        written[page * KV_PAGE + p % KV_PAGE] = true;
                        let at = row_at(ty, kv_dim, page, p % KV_PAGE);
                        for (pool, want, name) in [(&kp, &wk, "k"), (&vp, &wv, "v")] {
                            let row = &want[t * kv_dim..(t + 1) * kv_dim];
                            let mut mine = vec![0u8; ty.page_bytes(kv_dim)];
                            let local = row_at(ty, kv_dim, 0, 0);
                            to_layout(ty, ggml, row, &mut mine, local);
                            let w = from_layout(ty, &mine, local, kv_dim);
                            let g = from_layout(ty, pool, at, kv_dim);
                            for c in 0..kv_dim {
                                let blk = &row[c / 32 * 32..][..32];
                                let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
                                let step = amax / if ty == KvType::Q8_0 { 127.0 } else { 7.0 };
                                total += 1;
                                exact += (g[c] == w[c]) as usize;
                                assert!(
                                    (g[c] - w[c]).abs() <= step * 1.01 + 1e-6,
                                    "{what}: {name} token {t} dim {c}: {} want {}",
                                    g[c],
                                    w[c]
                                );
                            }
                        }
                    }
                    for (r, w) in written.iter().enumerate() {
                        if *w {
                            continue;
                        }
                        let (q0, s0) = row_at(ty, kv_dim, r / KV_PAGE, r % KV_PAGE);
                        let qlen = if ty == KvType::Q8_0 {
                            kv_dim
                        } else {
                            kv_dim / 2
                        };
                        for pool in [&kp, &vp] {
                            assert!(
                                pool[q0..q0 + qlen].iter().all(|&b| b == 0xFF),
                                "{what}: row {r} written"
                            );
                            assert!(
                                pool[s0..s0 + kv_dim / 16].iter().all(|&b| b == 0xFF),
                                "{what}: row {r} scales"
                            );
                        }
                    }
                }
            }
        }
    }
    println!("{exact} of {total} appended values exact");
    assert!(
        exact as f64 >= 0.99 * total as f64,
        "{exact} of {total} exact"
    );
}
