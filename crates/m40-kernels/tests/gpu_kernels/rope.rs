//! kernels/rope.cu: RoPE with the append to the paged KV pools.

use super::common::batch_tables;
use super::*;
use m40_kernels::KvAppend;

/// The pools after an append: pool row r holds token `rows[r]`'s roped key
/// (within one FP16 step of the CPU's, or 2^-21 near zero: the FP32
/// rotations may round apart)
/// and value (exact), or, written by no token, its poison.
fn check_pools(
    what: &str,
    (kp, vp): (&[u16], &[u16]),
    rows: &[Option<usize>],
    (want_k, vx): (&[f32], &[f32]),
    kv_dim: usize,
) {
    for (r, tok) in rows.iter().enumerate() {
        for c in 0..kv_dim {
            let (gk, gv) = (kp[r * kv_dim + c], vp[r * kv_dim + c]);
            let Some(t) = *tok else {
                assert_eq!((gk, gv), (0xFFFF, 0xFFFF), "{what}: pool row {r} written");
                continue;
            };
            let wk = half::f16::from_f32(want_k[t * kv_dim + c]);
            let wv = half::f16::from_f32(vx[t * kv_dim + c]).to_bits();
            let gkf = half::f16::from_bits(gk).to_f32();
            // One FP16 step, or where the rotation cancels to near zero a
            // few FP32 roundings of its O(1) operands (2^-21: the GPU's
            // double-precision angles and fused norms round apart from the
            // CPU's; a magnitude scale of 1.25 made 2^-24 fail 1 run in 7).
            let step = (wk.to_f32().abs() * 2f32.powi(-10)).max(2f32.powi(-21));
            assert!(
                (gkf - wk.to_f32()).abs() <= step,
                "{what}: k token {t} dim {c}: {gkf} want {}",
                wk.to_f32()
            );
            assert_eq!(gv, wv, "{what}: v token {t} dim {c}");
        }
    }
}

/// RoPE of Q in place and of K into the paged FP16 cache with V, in one
/// launch: q against the CPU rope, the pools against the FP16 of the CPU's
/// roped K (within one FP16 step: the FP32 rotations may round apart) and
/// of V (exact) at the pages of a shuffled table; every other pool row
/// keeps its poison. Plain, with head norms, and with Q/K/V biases added
/// first (the queries' pass-through dimensions too).
#[test]
#[ignore = "needs a GPU"]
fn rope_kv_append_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("rope_kv_append_matches_cpu");
    use m40_gguf::RopeStyle as Cpu;
    use m40_kernels::KV_PAGE;
    for (style, cpu_style) in [
        (RopeStyle::Normal, Cpu::Normal),
        (RopeStyle::Neox, Cpu::Neox),
    ] {
        // Full and partial rotation, linear scaling, positions up to 30k, GQA
        // groups of 1 to 8, head sizes 2 to 256:
        // (n_tok, n_head, n_kv, head_dim, n_rot, start, factor).
        let cases: [(usize, usize, usize, usize, usize, usize, f32); 11] = [
            (1, 1, 1, 2, 2, 0, 1.0),
            (1, 32, 8, 128, 128, 4000, 1.0),
            (1, 9, 3, 64, 64, 31, 1.0),
            (7, 3, 1, 64, 64, 30000, 1.0),
            (5, 9, 3, 128, 64, 1000, 4.0),
            (17, 4, 4, 64, 32, 0, 1.0),
            (33, 2, 2, 80, 80, 5, 1.0),
            (40, 14, 2, 64, 64, 100, 1.0),
            (3, 40, 8, 128, 128, 2, 1.0),
            (3, 5, 1, 256, 256, 62, 1.0),
            (5, 8, 2, 80, 48, 7, 1.0),
        ];
        for (n_tok, n_head, n_kv, hd, n_rot, start, factor) in cases {
            let mut rope = ops::Rope::new(cpu_style, n_rot, 10000.0, factor, None);
            // Every other case with a magnitude scale (YaRN's, or
            // rope.scaling.attn_factor's): the rotated dimensions only.
            rope.mscale = [1.0, 1.25][n_tok % 2];
            let kv_dim = n_kv * hd;
            let pages = (start + n_tok).div_ceil(KV_PAGE);
            let pool_pages = pages + 2;
            let table: Vec<i32> = rng.shuffled(pool_pages)[..pages].to_vec();
            let q = rng.vec(n_tok * n_head * hd, -2.0, 2.0);
            let kx = rng.vec(n_tok * kv_dim, -2.0, 2.0);
            let vx = rng.vec(n_tok * kv_dim, -2.0, 2.0);
            let pos: Vec<i32> = (0..n_tok).map(|t| (start + t) as i32).collect();
            let kg = s.upload(&kx, "k").unwrap();
            let vg = s.upload(&vx, "v").unwrap();
            let pg = s.upload(&pos, "pos").unwrap();
            let tg = s.upload(&table, "table").unwrap();
            let fg = s.upload(&rope.device_table(), "inv_freq").unwrap();
            let p = RopeParams {
                style,
                n_head,
                head_dim: hd,
                n_rot,
                pos_scale: rope.pos_scale,
            };
            let mut rows = vec![None; pool_pages * KV_PAGE];
            for t in 0..n_tok {
                let p = start + t;
                rows[table[p / KV_PAGE] as usize * KV_PAGE + p % KV_PAGE] = Some(t);
            }
            // Plain, and (head sizes that are multiples of 64) with each
            // query and key head RMS-normed first in the same launch.
            let norms = hd
                .is_multiple_of(64)
                .then(|| (rng.vec(hd, 0.5, 1.5), rng.vec(hd, 0.5, 1.5)));
            let bias = rng.vec((n_head + 2 * n_kv) * hd, -1.0, 1.0);
            let (bq, rest) = bias.split_at(n_head * hd);
            let (bk, bv) = rest.split_at(kv_dim);
            for (normed, biased) in [(None, false), (norms.as_ref(), false), (None, true)] {
                let (mut want_q, mut want_k, mut want_v) = (q.clone(), kx.clone(), vx.clone());
                if let Some((qn, kn)) = normed {
                    ops::rmsnorm(&mut want_q, qn, 1e-6);
                    ops::rmsnorm(&mut want_k, kn, 1e-6);
                }
                if biased {
                    let add = |x: &mut [f32], b: &[f32]| {
                        for row in x.chunks_exact_mut(b.len()) {
                            row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                        }
                    };
                    add(&mut want_q, bq);
                    add(&mut want_k, bk);
                    add(&mut want_v, bv);
                }
                for t in 0..n_tok {
                    let p = start + t;
                    rope.apply(&mut want_q[t * n_head * hd..][..n_head * hd], hd, p);
                    rope.apply(&mut want_k[t * kv_dim..][..kv_dim], hd, p);
                }
                let mut qg = s.upload(&q, "q").unwrap();
                let mut kpool = s.alloc::<u16>(pool_pages * KV_PAGE * kv_dim, "kp").unwrap();
                let mut vpool = s.alloc::<u16>(pool_pages * KV_PAGE * kv_dim, "vp").unwrap();
                s.fill_bytes(&mut kpool, 0xFF).unwrap();
                s.fill_bytes(&mut vpool, 0xFF).unwrap();
                let kv = KvAppend {
                    n_head_kv: n_kv,
                    pos: &pg.view(),
                    inv_freq: &fg.view(),
                    p: &p,
                    kpool: &mut kpool,
                    vpool: &mut vpool,
                    format: m40_kernels::KvType::F16,
                    table: &tg.view(),
                    max_start: start,
                };
                let (kv_k, kv_v) = (kg.view(), vg.view());
                let bg = s.upload(&bias, "bias").unwrap();
                match normed {
                    None if biased => k
                        .rope_kv_append_biased(&s, &mut qg, &kv_k, &kv_v, kv, None, &bg.view())
                        .unwrap(),
                    None => k.rope_kv_append(&s, &mut qg, &kv_k, &kv_v, kv).unwrap(),
                    Some((qn, kn)) => {
                        let (qn, kn) = (s.upload(qn, "qn").unwrap(), s.upload(kn, "kn").unwrap());
                        let norms = m40_kernels::HeadNorms {
                            q: &qn.view(),
                            k: &kn.view(),
                            eps: 1e-6,
                        };
                        k.rope_kv_append_normed(&s, &mut qg, &kv_k, &kv_v, kv, None, norms)
                            .unwrap()
                    }
                }
                let what = format!(
                    "rope_kv {style:?} {n_tok}x{n_head}/{n_kv}x{hd} rot {n_rot} at {start}, head norms {}, biased {biased}",
                    normed.is_some()
                );
                let got_q = s.download(&qg).unwrap();
                check(&format!("{what}: q"), &got_q, &want_q, |i| {
                    2e-6 * want_q[i].abs().max(2.0) as f64 + 1e-7
                });
                let (kp, vp) = (s.download(&kpool).unwrap(), s.download(&vpool).unwrap());
                check_pools(&what, (&kp, &vp), &rows, (&want_k, &want_v), kv_dim);
            }
        }
    }
}

/// The batched append: tokens of different sequences, each at its own
/// position, into the pages of its own block table (the tables one after
/// another, `tab[t]` where token t's starts): q against the CPU rope, the
/// pools as in rope_kv_append_matches_cpu, every other row poisoned.
#[test]
#[ignore = "needs a GPU"]
fn rope_kv_append_batch_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("rope_kv_append_batch_matches_cpu");
    use m40_gguf::RopeStyle as Cpu;
    use m40_kernels::KV_PAGE;
    for (style, cpu_style) in [
        (RopeStyle::Normal, Cpu::Normal),
        (RopeStyle::Neox, Cpu::Neox),
    ] {
        // (batch, n_head, n_kv, head_dim, n_rot)
        for (b, n_head, n_kv, hd, n_rot) in
            [(1, 9, 3, 64, 64), (5, 32, 8, 128, 128), (33, 4, 2, 80, 48)]
        {
            let mut rope = ops::Rope::new(cpu_style, n_rot, 10000.0, 1.0, None);
            rope.mscale = [1.0, 1.2][b % 2];
            let kv_dim = n_kv * hd;
            let pos: Vec<usize> = (0..b).map(|_| rng.below(3000)).collect();
            // Each sequence's pages: disjoint, shuffled, in one pool.
            let keys: Vec<usize> = pos.iter().map(|p| p + 1).collect();
            let (_, tables, tab, pool_pages) = batch_tables(&mut rng, &keys, 2);
            let q = rng.vec(b * n_head * hd, -2.0, 2.0);
            let kx = rng.vec(b * kv_dim, -2.0, 2.0);
            let vx = rng.vec(b * kv_dim, -2.0, 2.0);
            let (mut want_q, mut want_k) = (q.clone(), kx.clone());
            for (t, &p) in pos.iter().enumerate() {
                rope.apply(&mut want_q[t * n_head * hd..][..n_head * hd], hd, p);
                rope.apply(&mut want_k[t * kv_dim..][..kv_dim], hd, p);
            }
            let mut qg = s.upload(&q, "q").unwrap();
            let kg = s.upload(&kx, "k").unwrap();
            let vg = s.upload(&vx, "v").unwrap();
            let pos_i: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
            let pg = s.upload(&pos_i, "pos").unwrap();
            let tg = s.upload(&tables, "tables").unwrap();
            let tabg = s.upload(&tab, "tab").unwrap();
            let fg = s.upload(&rope.device_table(), "inv_freq").unwrap();
            let mut kpool = s.alloc::<u16>(pool_pages * KV_PAGE * kv_dim, "kp").unwrap();
            let mut vpool = s.alloc::<u16>(pool_pages * KV_PAGE * kv_dim, "vp").unwrap();
            s.fill_bytes(&mut kpool, 0xFF).unwrap();
            s.fill_bytes(&mut vpool, 0xFF).unwrap();
            let p = RopeParams {
                style,
                n_head,
                head_dim: hd,
                n_rot,
                pos_scale: rope.pos_scale,
            };
            k.rope_kv_append_batch(
                &s,
                &mut qg,
                &kg.view(),
                &vg.view(),
                KvAppend {
                    n_head_kv: n_kv,
                    pos: &pg.view(),
                    inv_freq: &fg.view(),
                    p: &p,
                    kpool: &mut kpool,
                    vpool: &mut vpool,
                    format: m40_kernels::KvType::F16,
                    table: &tg.view(),
                    max_start: *pos.iter().max().unwrap(),
                },
                &tabg.view(),
            )
            .unwrap();
            let what = format!("rope_kv batch {style:?} {b}x{n_head}/{n_kv}x{hd} rot {n_rot}");
            let got_q = s.download(&qg).unwrap();
            check(&format!("{what}: q"), &got_q, &want_q, |_| {
                2e-6 * 2.0 + 1e-7
            });
            let (kp, vp) = (s.download(&kpool).unwrap(), s.download(&vpool).unwrap());
            let mut rows = vec![None; pool_pages * KV_PAGE];
            for (t, &p) in pos.iter().enumerate() {
                let page = tables[tab[t] as usize + p / KV_PAGE] as usize;
                rows[page * KV_PAGE + p % KV_PAGE] = Some(t);
            }
            check_pools(&what, (&kp, &vp), &rows, (&want_k, &vx), kv_dim);
        }
    }
}
