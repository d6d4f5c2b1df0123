//! kernels/gemv_packed.cu: the packed GEMV for 1..16 tokens, stacked,
//! SwiGLU, residual, folded-norm and RoPE/KV outputs.

use super::*;
use crate::gemv::check_every_split;
use m40_gguf::hparams::Activation;
use m40_kernels::{GemvOpts, KvAppend};

#[test]
#[ignore = "needs a GPU"]
fn packed_gemv_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("packed_gemv_matches_cpu");
    for f in PackFormat::ALL {
        // Rows not a multiple of 4 (a padded group), blocks not a multiple
        // of 8 (lanes without a block), remainders of the unrolled loop.
        let shapes: &[(usize, usize)] = if f.qk == 256 {
            &[
                (1, 256),
                (5, 768),
                (19, 9 * 256),
                (131, 4096),
                (4099, 4096),
                (9001, 512),
                (64, 14336),
            ]
        } else {
            &[
                (1, 32),
                (5, 96),
                (19, 65 * 32),
                (131, 4096),
                (4099, 4096),
                (9001, 64),
                (64, 14336),
            ]
        };
        for &(rows, cols) in shapes {
            let w = random_weights(&mut rng, f.ty, rows, cols);
            let x = rng.vec(cols, -1.0, 1.0);
            let packed = pack_gemv(f.ty, &w, rows, cols).unwrap();
            check_every_split(&s, f.ty, &w, &packed, &x, rows, |wv, xv, y, ksplit| {
                let m = PackedMatrix {
                    ty: f.ty,
                    data: wv,
                    rows,
                    cols,
                };
                let ks = k.gemv_packed(&s, &m, xv, y, ksplit).unwrap();
                format!("packed gemv {} {rows}x{cols} ksplit {ks}", f.ty)
            });
        }
    }
}

/// Per row of `w` (rows x cols, dequantized) the dot with x in f64 and the
/// sum of |w x| (the scale of a correct FP32 kernel's rounding).
fn dots(w: &[f32], x: &[f64]) -> Vec<(f64, f64)> {
    w.chunks_exact(x.len())
        .map(|r| {
            let it = r.iter().zip(x).map(|(a, b)| *a as f64 * b);
            (it.clone().sum(), it.map(f64::abs).sum())
        })
        .collect()
}

/// The residual GEMV (y += W a) and an RMSNorm folded across it and the
/// GEMVs after it, every split: the residual GEMV emits h = x * nw and its
/// blocks' partial sums of x^2, and a consumer GEMV (plain, and the SwiGLU
/// of a gate/up stack) takes them: its result must be W (rmsnorm(x) * nw)
/// of the CPU's x. Outputs poisoned (or random, to add to), nothing written
/// past them; bad combinations refused.
#[test]
#[ignore = "needs a GPU"]
fn packed_gemv_folded_norm_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("packed_gemv_folded_norm_matches_cpu");
    const TAIL: usize = 16;
    let eps = 1e-5f32;
    for f in PackFormat::ALL {
        for (d, c, r) in [
            (f.qk.max(64), 2 * f.qk, 4099),
            (4096, 4 * f.qk.max(128), 132),
        ] {
            // The residual GEMV: x (d) += Wp (d x c) a.
            let wp = random_weights(&mut rng, f.ty, d, c);
            let wpd = dequant(f.ty, &wp, d, c);
            let wpg = s
                .upload(&pack_gemv(f.ty, &wp, d, c).unwrap(), "wp")
                .unwrap();
            let (wpv, a, x0, nw) = (
                wpg.view(),
                rng.vec(c, -1.0, 1.0),
                rng.vec(d + TAIL, -2.0, 2.0),
                rng.vec(d, 0.5, 1.5),
            );
            let pm = PackedMatrix {
                ty: f.ty,
                data: &wpv,
                rows: d,
                cols: c,
            };
            let a64: Vec<f64> = a.iter().map(|&v| v as f64).collect();
            let pd = dots(&wpd, &a64);
            let x_cpu: Vec<f64> = (0..d).map(|i| x0[i] as f64 + pd[i].0).collect();
            let x_tol: Vec<f64> = (0..d)
                .map(|i| 2e-5 * pd[i].1 + 1e-6 * x_cpu[i].abs())
                .collect();
            // The consumer: Wc (r x d), and a gate/up stack of r / 2 pairs.
            let wc = random_weights(&mut rng, f.ty, r, d);
            let wcd = dequant(f.ty, &wc, r, d);
            let wcg = s
                .upload(&pack_gemv(f.ty, &wc, r, d).unwrap(), "wc")
                .unwrap();
            let ff = 66;
            let (gate, up) = (
                random_weights(&mut rng, f.ty, ff, d),
                random_weights(&mut rng, f.ty, ff, d),
            );
            let stack = interleave_glu(&gate, &up, ff).unwrap();
            let wgg = s
                .upload(&pack_gemv(f.ty, &stack, 2 * ff, d).unwrap(), "wg")
                .unwrap();
            let (gd, ud) = (dequant(f.ty, &gate, ff, d), dequant(f.ty, &up, ff, d));
            let rms =
                1.0 / (x_cpu.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps as f64).sqrt();
            let hn: Vec<f64> = (0..d).map(|i| x_cpu[i] * rms * nw[i] as f64).collect();
            let (cw, gw, uw) = (dots(&wcd, &hn), dots(&gd, &hn), dots(&ud, &hn));
            // Rounding of x and of the scale reach the result through every
            // term: 1e-5 of the magnitude on top.
            let (ag, xg) = (s.upload(&a, "a").unwrap(), s.upload(&x0, "x").unwrap());
            let nwg = s.upload(&nw, "nw").unwrap();
            let nwv = nwg.view();
            let mut x = s.alloc::<f32>(d + TAIL, "x").unwrap();
            let mut h = s.alloc::<f32>(d + TAIL, "h").unwrap();
            let n_groups = d.div_ceil(4);
            let mut part = s.alloc::<f32>(n_groups + TAIL, "part").unwrap();
            let mut y = s.alloc::<f32>(r + TAIL, "y").unwrap();
            for ks in [None, Some(1), Some(2), Some(3), Some(4)] {
                s.copy_device(&xg.view(), &mut x).unwrap();
                s.fill_bytes(&mut h, 0xFF).unwrap();
                s.fill_bytes(&mut part, 0xFF).unwrap();
                let fold = Fold::Emit {
                    weight: &nwv,
                    h: &mut h,
                    part: &mut part,
                };
                let l = k
                    .gemv_packed_to(
                        &s,
                        &pm,
                        &ag.view(),
                        GemvOut::Add(&mut x),
                        GemvOpts {
                            m: 1,
                            ksplit: ks,
                            fold: Some(fold),
                        },
                    )
                    .unwrap();
                let what = format!("emit {} {d}x{c} {l:?}", f.ty);
                let (xr, hr, pr) = (
                    s.download(&x).unwrap(),
                    s.download(&h).unwrap(),
                    s.download(&part).unwrap(),
                );
                let xw: Vec<f32> = x_cpu.iter().map(|&v| v as f32).collect();
                check(&what, &xr[..d], &xw, |i| x_tol[i]);
                assert_eq!(&xr[d..], &x0[d..], "{what}: wrote past x");
                let hw: Vec<f32> = (0..d).map(|i| (x_cpu[i] * nw[i] as f64) as f32).collect();
                check(&format!("{what} h"), &hr[..d], &hw, |i| {
                    1.5 * x_tol[i] * nw[i] as f64 + 1e-30
                });
                assert!(
                    hr[d..].iter().all(|v| v.to_bits() == u32::MAX),
                    "{what}: wrote past h"
                );
                assert!(l.blocks <= n_groups, "{what}");
                let ss: f64 = pr[..l.blocks].iter().map(|&v| v as f64).sum();
                let ss_cpu: f64 = x_cpu.iter().map(|v| v * v).sum();
                let ss_tol: f64 =
                    (0..d).map(|i| 2.0 * x_cpu[i].abs() * x_tol[i]).sum::<f64>() + 1e-6 * ss_cpu;
                assert!(
                    (ss - ss_cpu).abs() <= ss_tol,
                    "{what}: sum of squares {ss} vs {ss_cpu}"
                );
                assert!(
                    pr[l.blocks..].iter().all(|v| v.to_bits() == u32::MAX),
                    "{what}: wrote past part"
                );
                // The consumers take the norm from h and the partial sums.
                let pv = part.view();
                let take = || Fold::Take {
                    part: &pv,
                    n_part: l.blocks,
                    eps,
                };
                let wcv = wcg.view();
                let cm = PackedMatrix {
                    ty: f.ty,
                    data: &wcv,
                    rows: r,
                    cols: d,
                };
                for kc in [None, Some(1), Some(2), Some(3), Some(4)] {
                    s.fill_bytes(&mut y, 0xFF).unwrap();
                    let out = GemvOut::Parts(RowSplit {
                        bufs: &mut [&mut y],
                        rows: &[r],
                    });
                    let lc = k
                        .gemv_packed_to(
                            &s,
                            &cm,
                            &h.view(),
                            out,
                            GemvOpts {
                                m: 1,
                                ksplit: kc,
                                fold: Some(take()),
                            },
                        )
                        .unwrap();
                    let what = format!("{what} take {r}x{d} {lc:?}");
                    let want: Vec<f32> = cw.iter().map(|v| v.0 as f32).collect();
                    let g = s.download(&y).unwrap();
                    check(&what, &g[..r], &want, |i| {
                        2e-5 * cw[i].1 + 1e-5 * cw[i].0.abs() + 1e-30
                    });
                    assert!(
                        g[r..].iter().all(|v| v.to_bits() == u32::MAX),
                        "{what}: wrote past y"
                    );
                }
                let wgv = wgg.view();
                let gm = PackedMatrix {
                    ty: f.ty,
                    data: &wgv,
                    rows: 2 * ff,
                    cols: d,
                };
                s.fill_bytes(&mut y, 0xFF).unwrap();
                let lc = k
                    .gemv_packed_to(
                        &s,
                        &gm,
                        &h.view(),
                        GemvOut::Glu(&mut y, Activation::Silu),
                        GemvOpts {
                            m: 1,
                            ksplit: ks,
                            fold: Some(take()),
                        },
                    )
                    .unwrap();
                let what = format!("{what} take + glu {ff}x{d} {lc:?}");
                let (mut want, mut tol) = (vec![0f32; ff], vec![0f64; ff]);
                for j in 0..ff {
                    let ((g, mg), (u, mu)) = (gw[j], uw[j]);
                    let silu = g / (1.0 + (-g).exp());
                    want[j] = (silu * u) as f32;
                    tol[j] = 2e-5 * (1.1 * u.abs() * mg + silu.abs() * mu)
                        + 2e-5 * (silu * u).abs()
                        + 1e-30;
                }
                let g = s.download(&y).unwrap();
                check(&what, &g[..ff], &want, |i| tol[i]);
                assert!(
                    g[ff..].iter().all(|v| v.to_bits() == u32::MAX),
                    "{what}: wrote past y"
                );
            }
            // Refused: an emit that does not add, one with too few partial
            // sums, a fold of 2 tokens, a take of none or of more than part
            // holds.
            let mut small = s.alloc::<f32>(1, "part").unwrap();
            let pv = part.view();
            let av = ag.view();
            let take = |n_part| {
                Some(Fold::Take {
                    part: &pv,
                    n_part,
                    eps,
                })
            };
            let mut bad = vec![];
            let emit = Fold::Emit {
                weight: &nwv,
                h: &mut h,
                part: &mut small,
            };
            bad.push(k.gemv_packed_to(
                &s,
                &pm,
                &av,
                GemvOut::Add(&mut x),
                GemvOpts {
                    m: 1,
                    ksplit: None,
                    fold: Some(emit),
                },
            ));
            let mut h2 = s.alloc::<f32>(d, "h").unwrap();
            let mut p2 = s.alloc::<f32>(n_groups, "part").unwrap();
            let emit = Fold::Emit {
                weight: &nwv,
                h: &mut h2,
                part: &mut p2,
            };
            let out = GemvOut::Parts(RowSplit {
                bufs: &mut [&mut y],
                rows: &[d],
            });
            bad.push(k.gemv_packed_to(
                &s,
                &pm,
                &av,
                out,
                GemvOpts {
                    m: 1,
                    ksplit: None,
                    fold: Some(emit),
                },
            ));
            bad.push(k.gemv_packed_to(
                &s,
                &pm,
                &av,
                GemvOut::Add(&mut x),
                GemvOpts {
                    m: 2,
                    ksplit: None,
                    fold: take(1),
                },
            ));
            bad.push(k.gemv_packed_to(
                &s,
                &pm,
                &av,
                GemvOut::Add(&mut x),
                GemvOpts {
                    m: 1,
                    ksplit: None,
                    fold: take(0),
                },
            ));
            bad.push(k.gemv_packed_to(
                &s,
                &pm,
                &av,
                GemvOut::Add(&mut x),
                GemvOpts {
                    m: 1,
                    ksplit: None,
                    fold: take(n_groups + TAIL + 1),
                },
            ));
            assert!(bad.iter().all(|r| r.is_err()));
        }
    }
}

/// The one-token Q/K/V GEMV with RoPE and the KV append folded in
/// (GemvOut::RopeKv) against the same GEMV into q, k, v followed by
/// rope_kv_append (both checked against the CPU by their own tests): q
/// within FP32 rounding, every K element within one FP16 step, V equal
/// (within one FP16 step where V is a matrix of its own, whose launch may
/// split its rows differently), every other pool row still poisoned; every
/// packed format and split, full and partial rotation, GQA, scaled
/// positions, magnitude scales (1 and 1.15), shuffled pages; the whole stack and the runs of Q, K, V a
/// model with several formats has (Q/K and V, Q and K/V, each alone).
#[test]
#[ignore = "needs a GPU"]
fn qkv_gemv_with_rope_kv_matches_the_unfolded_path() {
    let (_dev, s, k, mut rng) = setup("qkv_gemv_with_rope_kv_matches_the_unfolded_path");
    use m40_kernels::{RopeKv, KV_PAGE};
    // (n_head, n_kv, head_dim, n_rot, position, pos_scale)
    let cases = [
        (4usize, 2usize, 64usize, 64usize, 37usize, 1.0f32),
        (8, 2, 128, 128, 3001, 1.0),
        (3, 1, 64, 32, 500, 0.25),
        (6, 6, 80, 48, 95, 1.0),
    ];
    for f in PackFormat::ALL {
        for (n_head, n_kv, hd, n_rot, start, pos_scale) in cases {
            let cols = 2 * f.qk.max(128);
            let (q_dim, kv_dim) = (n_head * hd, n_kv * hd);
            let rows = q_dim + 2 * kv_dim;
            let w = random_weights(&mut rng, f.ty, rows, cols);
            let wg = s
                .upload(&pack_gemv(f.ty, &w, rows, cols).unwrap(), "w")
                .unwrap();
            let wv = wg.view();
            let pm = PackedMatrix {
                ty: f.ty,
                data: &wv,
                rows,
                cols,
            };
            // Runs of parts Q, K, V (0, 1, 2) as matrices of their own.
            let dims = [q_dim, kv_dim, kv_dim];
            let row_bytes = f.ty.row_bytes(cols as u64).unwrap() as usize;
            #[allow(clippy::single_range_in_vec_init)]
            let layouts = [
                vec![0..3],
                vec![0..2, 2..3],
                vec![0..1, 1..3],
                vec![0..1, 1..2, 2..3],
            ];
            let mut runs = Vec::new();
            for r in layouts.iter().flatten() {
                let from: usize = dims[..r.start].iter().sum();
                let n: usize = dims[r.clone()].iter().sum();
                let bytes = &w[from * row_bytes..(from + n) * row_bytes];
                let g = s
                    .upload(&pack_gemv(f.ty, bytes, n, cols).unwrap(), "w run")
                    .unwrap();
                runs.push((r.clone(), n, g));
            }
            let x = s.upload(&rng.vec(cols, -1.0, 1.0), "x").unwrap();
            let pages = (start + 1).div_ceil(KV_PAGE);
            let pool_pages = pages + 2;
            let ids = rng.shuffled(pool_pages);
            let table = s.upload(&ids[..pages], "table").unwrap();
            let pos = s.upload(&[start as i32], "pos").unwrap();
            // The frequencies, then the magnitude scale (YaRN's, or
            // rope.scaling.attn_factor's), 1 or not by case.
            let inv: Vec<f32> = (0..n_rot / 2)
                .map(|i| 10000f32.powf(-2.0 * i as f32 / n_rot as f32))
                .chain([[1.0, 1.15][start % 2]])
                .collect();
            let inv = s.upload(&inv, "inv_freq").unwrap();
            let p = RopeParams {
                style: RopeStyle::Normal,
                n_head,
                head_dim: hd,
                n_rot,
                pos_scale,
            };
            let pool = pool_pages * KV_PAGE * kv_dim;
            let row = ids[start / KV_PAGE] as usize * KV_PAGE + start % KV_PAGE;
            for ks in [None, Some(1), Some(2), Some(3), Some(4)] {
                // The unfolded path, with the same split (the sums' order).
                let mut q = s.alloc::<f32>(q_dim, "q").unwrap();
                let mut kb = s.alloc::<f32>(kv_dim, "k").unwrap();
                let mut vb = s.alloc::<f32>(kv_dim, "v").unwrap();
                let (mut kp0, mut vp0) = (
                    s.alloc::<u16>(pool, "kp").unwrap(),
                    s.alloc::<u16>(pool, "vp").unwrap(),
                );
                s.fill_bytes(&mut kp0, 0xFF).unwrap();
                s.fill_bytes(&mut vp0, 0xFF).unwrap();
                let out = RowSplit {
                    bufs: &mut [&mut q, &mut kb, &mut vb],
                    rows: &[q_dim, kv_dim, kv_dim],
                };
                k.gemv_packed_batch(&s, &pm, &x.view(), out, 1, ks).unwrap();
                k.rope_kv_append(
                    &s,
                    &mut q,
                    &kb.view(),
                    &vb.view(),
                    KvAppend {
                        n_head_kv: n_kv,
                        pos: &pos.view(),
                        inv_freq: &inv.view(),
                        p: &p,
                        kpool: &mut kp0,
                        vpool: &mut vp0,
                        table: &table.view(),
                        max_start: start,
                    },
                )
                .unwrap();
                let (want_q, want_k, want_v) = (
                    s.download(&q).unwrap(),
                    s.download(&kp0).unwrap(),
                    s.download(&vp0).unwrap(),
                );
                for layout in &layouts {
                    let mut q2 = s.alloc::<f32>(q_dim + 8, "q").unwrap();
                    let (mut kp, mut vp) = (
                        s.alloc::<u16>(pool, "kp").unwrap(),
                        s.alloc::<u16>(pool, "vp").unwrap(),
                    );
                    s.fill_bytes(&mut q2, 0xFF).unwrap();
                    s.fill_bytes(&mut kp, 0xFF).unwrap();
                    s.fill_bytes(&mut vp, 0xFF).unwrap();
                    let (iv, pv, tv) = (inv.view(), pos.view(), table.view());
                    let mut launches = Vec::new();
                    for parts in layout {
                        let (_, n, g) = runs.iter().find(|(r, ..)| r == parts).unwrap();
                        let gv = g.view();
                        let pm = PackedMatrix {
                            ty: f.ty,
                            data: &gv,
                            rows: *n,
                            cols,
                        };
                        let out = GemvOut::RopeKv(RopeKv {
                            parts: parts.clone(),
                            q: &mut q2,
                            kv: KvAppend {
                                n_head_kv: n_kv,
                                pos: &pv,
                                inv_freq: &iv,
                                p: &p,
                                kpool: &mut kp,
                                vpool: &mut vp,
                                table: &tv,
                                max_start: start,
                            },
                        });
                        let l = k
                            .gemv_packed_to(
                                &s,
                                &pm,
                                &x.view(),
                                out,
                                GemvOpts {
                                    m: 1,
                                    ksplit: ks,
                                    fold: None,
                                },
                            )
                            .unwrap();
                        launches.push(l);
                    }
                    let what = format!(
                        "{} {n_head}/{n_kv}x{hd} rot {n_rot} at {start} parts {layout:?} {launches:?}",
                        f.ty
                    );
                    let (gq, gk, gv) = (
                        s.download(&q2).unwrap(),
                        s.download(&kp).unwrap(),
                        s.download(&vp).unwrap(),
                    );
                    // The pair's magnitude bounds a rotation's rounding (the
                    // two kernels may contract its products differently).
                    check(&what, &gq[..q_dim], &want_q, |i| {
                        1e-6 * (want_q[i].abs() + want_q[i ^ 1].abs()) as f64 + 1e-30
                    });
                    assert!(
                        gq[q_dim..].iter().all(|v| v.to_bits() == u32::MAX),
                        "{what}: wrote past q"
                    );
                    let v_exact = layout.len() == 1;
                    for i in 0..pool {
                        let in_row = i / kv_dim == row;
                        if !in_row {
                            assert!(
                                gk[i] == 0xFFFF && gv[i] == 0xFFFF,
                                "{what}: pool element {i} outside the token's row written"
                            );
                            continue;
                        }
                        let f16 = |b: u16| half::f16::from_bits(b).to_f32();
                        let (a, b, pair) = (f16(gk[i]), f16(want_k[i]), f16(want_k[i ^ 1]));
                        let tol = b.abs() / 1024.0 + 1e-6 * (b.abs() + pair.abs()) + 1e-7;
                        assert!((a - b).abs() <= tol, "{what}: K[{i}] {a} vs {b}");
                        if v_exact {
                            assert_eq!(gv[i], want_v[i], "{what}: V[{i}]");
                        } else {
                            let (a, b) = (f16(gv[i]), f16(want_v[i]));
                            let tol = b.abs() / 1024.0 + 1e-7;
                            assert!((a - b).abs() <= tol, "{what}: V[{i}] {a} vs {b}");
                        }
                    }
                }
            }
            // Refused: NeoX, two tokens, rows that are not Q + 2 KV, rows
            // that are not the parts named, no parts, parts past V.
            for (style, m, nh, parts) in [
                (RopeStyle::Neox, 1, n_head, 0..3),
                (RopeStyle::Normal, 2, n_head, 0..3),
                (RopeStyle::Normal, 1, n_head + 1, 0..3),
                (RopeStyle::Normal, 1, n_head, 0..2),
                (RopeStyle::Normal, 1, n_head, 1..1),
                (RopeStyle::Normal, 1, n_head, 1..4),
            ] {
                let p = RopeParams {
                    style,
                    n_head: nh,
                    ..p
                };
                let (iv, pv, tv) = (inv.view(), pos.view(), table.view());
                let (mut kp, mut vp) = (
                    s.alloc::<u16>(pool, "kp").unwrap(),
                    s.alloc::<u16>(pool, "vp").unwrap(),
                );
                let mut q2 = s.alloc::<f32>(2 * (q_dim + hd), "q").unwrap();
                let x2 = s.alloc::<f32>(2 * cols, "x").unwrap();
                let out = GemvOut::RopeKv(RopeKv {
                    parts: parts.clone(),
                    q: &mut q2,
                    kv: KvAppend {
                        n_head_kv: n_kv,
                        pos: &pv,
                        inv_freq: &iv,
                        p: &p,
                        kpool: &mut kp,
                        vpool: &mut vp,
                        table: &tv,
                        max_start: start,
                    },
                });
                assert!(
                    k.gemv_packed_to(
                        &s,
                        &pm,
                        &x2.view(),
                        out,
                        GemvOpts {
                            m,
                            ksplit: None,
                            fold: None
                        }
                    )
                    .is_err(),
                    "{style:?} m {m} heads {nh} parts {parts:?}"
                );
            }
        }
    }
}

/// Stacked matrices (a fused Q/K/V or gate/up) through the packed GEMV (1
/// to 16 tokens, each split of a group's blocks over warps) and the GEMM (3
/// and 70): each part's rows land in its own buffer, every element checked
/// against the CPU reference, the buffers poisoned before each launch and 16
/// floats past each part left untouched.
/// SwiGLU and GeGLU of an interleaved gate/up stack: the GEMV's fused
/// epilogue (1 to 16 tokens, every split) and the GEMM followed by
/// glu_pairs (more tokens), against act(gate x) * up x in f64 from the
/// dequantized rows;
/// outputs poisoned, every element checked, nothing written past y.
#[test]
#[ignore = "needs a GPU"]
fn glu_gemv_and_gemm_match_cpu() {
    let (_dev, s, k, mut rng) = setup("glu_gemv_and_gemm_match_cpu");
    const TAIL: usize = 16;
    for f in PackFormat::ALL {
        for (ff, cols) in [(2usize, 2 * f.qk.max(64)), (50, 512), (132, 4096)] {
            let gate = random_weights(&mut rng, f.ty, ff, cols);
            let up = random_weights(&mut rng, f.ty, ff, cols);
            let stack = interleave_glu(&gate, &up, ff).unwrap();
            let wg = s
                .upload(&pack_gemv(f.ty, &stack, 2 * ff, cols).unwrap(), "w")
                .unwrap();
            let wv = wg.view();
            let pm = PackedMatrix {
                ty: f.ty,
                data: &wv,
                rows: 2 * ff,
                cols,
            };
            let (gd, ud) = (dequant(f.ty, &gate, ff, cols), dequant(f.ty, &up, ff, cols));
            for (m, act) in [1usize, 2, 5, 8, 16, 20, 70]
                .into_iter()
                .flat_map(|m| [(m, Activation::Silu), (m, Activation::GeluTanh)])
            {
                let x = rng.vec(m * cols, -1.0, 1.0);
                let xg = s.upload(&x, "x").unwrap();
                let (mut want, mut tol) = (vec![0f32; m * ff], vec![0f64; m * ff]);
                for t in 0..m {
                    let xr = &x[t * cols..(t + 1) * cols];
                    for j in 0..ff {
                        let dot = |w: &[f32]| {
                            let wr = &w[j * cols..(j + 1) * cols];
                            let v: f64 =
                                xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                            let mag: f64 = xr
                                .iter()
                                .zip(wr)
                                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                                .sum();
                            (v, mag)
                        };
                        let ((g, mg), (u, mu)) = (dot(&gd), dot(&ud));
                        let a = match act {
                            Activation::GeluTanh => {
                                let c = (2.0 / std::f64::consts::PI).sqrt();
                                0.5 * g * (1.0 + (c * g * (1.0 + 0.044715 * g * g)).tanh())
                            }
                            _ => g / (1.0 + (-g).exp()),
                        };
                        want[t * ff + j] = (a * u) as f32;
                        // Both gates' slopes stay below 1.2.
                        tol[t * ff + j] = 1e-5 * (1.2 * u.abs() * mg + a.abs() * mu)
                            + 1e-5 * (a * u).abs()
                            + 1e-30;
                    }
                }
                let mut y = s.alloc::<f32>(m * ff + TAIL, "y").unwrap();
                let mut runs: Vec<Option<u32>> = vec![None];
                if m <= PACKED_GEMV_MAX_TOKENS {
                    runs.extend([Some(1), Some(2), Some(3), Some(4)]);
                }
                for ks in runs {
                    s.fill_bytes(&mut y, 0xFF).unwrap();
                    let what = if m <= PACKED_GEMV_MAX_TOKENS {
                        let got = k
                            .gemv_packed_glu(&s, act, &pm, &xg.view(), &mut y, m, ks)
                            .unwrap();
                        format!("{act:?} gemv ksplit {got}")
                    } else {
                        let mut gu = s.alloc::<f32>(m * 2 * ff, "gu").unwrap();
                        s.fill_bytes(&mut gu, 0xFF).unwrap();
                        let mut refs = [&mut gu];
                        let rows = [2 * ff];
                        let out = RowSplit {
                            bufs: &mut refs,
                            rows: &rows,
                        };
                        k.gemm_packed_split(&s, &pm, &xg.view(), out, m, Default::default())
                            .unwrap();
                        k.glu_pairs(&s, act, &gu.view(), &mut y, m, ff).unwrap();
                        format!("{act:?} gemm + glu_pairs")
                    };
                    let what = format!("{what} {} {ff}x{cols} m {m}", f.ty);
                    let got = s.download(&y).unwrap();
                    check(&what, &got[..m * ff], &want, |i| tol[i]);
                    assert!(
                        got[m * ff..].iter().all(|v| v.to_bits() == u32::MAX),
                        "{what}: wrote past y"
                    );
                }
            }
        }
    }
    // Odd row counts are refused.
    assert!(interleave_glu(&[0; 6], &[0; 6], 3).is_err());
}
