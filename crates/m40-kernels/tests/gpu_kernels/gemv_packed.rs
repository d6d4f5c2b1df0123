//! kernels/gemv_packed.cu: the packed GEMV for 1..16 tokens, stacked,
//! SwiGLU, residual and folded-norm outputs (the RoPE fold: gemv_packed/rope_fold.rs).

use super::*;
use crate::gemv::check_every_split;
use m40_gguf::hparams::Activation;
use m40_kernels::GemvOpts;

mod rope_fold;

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

/// Random weights of `ty` (rows x cols), packed and uploaded, and their
/// dequantized values.
fn packed_random(
    s: &Stream,
    rng: &mut Rng,
    ty: GgmlType,
    rows: usize,
    cols: usize,
) -> (DeviceBuffer<u8>, Vec<f32>) {
    let w = random_weights(rng, ty, rows, cols);
    let wg = s
        .upload(&pack_gemv(ty, &w, rows, cols).unwrap(), "w")
        .unwrap();
    (wg, dequant(ty, &w, rows, cols))
}

/// Several tokens added to y (the batched step's residual connection), for
/// every format and split: y = y0 + W x, token by token (one launch up to
/// 8 tokens, a grid row per chunk of up to 8 up to 128).
#[test]
#[ignore = "needs a GPU"]
fn batched_packed_gemv_adds_to_y() {
    let (_dev, s, k, mut rng) = setup("batched_packed_gemv_adds_to_y");
    const TAIL: usize = 16;
    for f in PackFormat::ALL {
        for (rows, cols) in [(36usize, 2 * f.qk.max(64)), (131, 4096)] {
            let (wg, wd) = packed_random(&s, &mut rng, f.ty, rows, cols);
            let wv = wg.view();
            let pm = PackedMatrix {
                ty: f.ty,
                data: &wv,
                rows,
                cols,
            };
            for m in [2usize, 4, 7, 8, 13, 25, 128] {
                let x = rng.vec(m * cols, -1.0, 1.0);
                let y0 = rng.vec(m * rows + TAIL, -1.0, 1.0);
                let xg = s.upload(&x, "x").unwrap();
                let mut want = vec![0f32; m * rows];
                let mut tol = vec![0f64; m * rows];
                for t in 0..m {
                    let d = dots(
                        &wd,
                        &x[t * cols..(t + 1) * cols]
                            .iter()
                            .map(|&v| v as f64)
                            .collect::<Vec<_>>(),
                    );
                    for (j, (v, mag)) in d.into_iter().enumerate() {
                        let i = t * rows + j;
                        want[i] = (y0[i] as f64 + v) as f32;
                        tol[i] = 1e-5 * (mag + y0[i].abs() as f64) + 1e-30;
                    }
                }
                for ks in [None, Some(1), Some(2), Some(4)] {
                    let mut y = s.upload(&y0, "y").unwrap();
                    let l = k
                        .gemv_packed_to(
                            &s,
                            &pm,
                            &xg.view(),
                            GemvOut::Add(&mut y),
                            GemvOpts::split(m, ks),
                        )
                        .unwrap();
                    let what = format!("add {} {rows}x{cols} m {m} {l:?}", f.ty);
                    let got = s.download(&y).unwrap();
                    check(&what, &got[..m * rows], &want, |i| tol[i]);
                    assert_eq!(&got[m * rows..], &y0[m * rows..], "{what}: wrote past y");
                }
            }
        }
    }
}

/// Tokens `first .. first + m` of a longer x (the rows a step's GEMM leaves
/// past its last full tile) into the same rows of y, stored (two parts)
/// or added: every element checked against f64, the other tokens' rows
/// left as they were (poison, or the values added to).
#[test]
#[ignore = "needs a GPU"]
fn packed_gemv_rows_from_a_first_token() {
    let (_dev, s, k, mut rng) = setup("packed_gemv_rows_from_a_first_token");
    const T: usize = 21;
    for f in PackFormat::ALL {
        for (rows, cols) in [(36usize, 2 * f.qk.max(64)), (131, 4096)] {
            let (wg, wd) = packed_random(&s, &mut rng, f.ty, rows, cols);
            let wv = wg.view();
            let pm = PackedMatrix {
                ty: f.ty,
                data: &wv,
                rows,
                cols,
            };
            let x = rng.vec(T * cols, -1.0, 1.0);
            let xg = s.upload(&x, "x").unwrap();
            let r1 = rows - rows / 3;
            for (first, m) in [(1usize, 1usize), (13, 8), (16, 5)] {
                let y0 = rng.vec(T * rows, -1.0, 1.0);
                let mut want = vec![(0f64, 0f64); T * rows];
                for t in first..first + m {
                    let xt: Vec<f64> = x[t * cols..(t + 1) * cols]
                        .iter()
                        .map(|&v| v as f64)
                        .collect();
                    for (j, d) in dots(&wd, &xt).into_iter().enumerate() {
                        want[t * rows + j] = d;
                    }
                }
                let mine = |i: usize| (first..first + m).contains(&(i / rows));
                // Added to y.
                let mut y = s.upload(&y0, "y").unwrap();
                k.gemv_packed_rows(&s, &pm, &xg.view(), GemvOut::Add(&mut y), first, m)
                    .unwrap();
                let got = s.download(&y).unwrap();
                for (i, (&g, &y0i)) in got.iter().zip(&y0).enumerate() {
                    let what =
                        format!("add {} {rows}x{cols} tokens {first}+{m}, element {i}", f.ty);
                    if mine(i) {
                        let (v, mag) = want[i];
                        let e = (g as f64 - (y0i as f64 + v)).abs();
                        assert!(
                            e <= 1e-5 * (mag + y0i.abs() as f64) + 1e-30,
                            "{what}: {g} against {}",
                            y0i as f64 + v
                        );
                    } else {
                        assert_eq!(
                            g.to_bits(),
                            y0i.to_bits(),
                            "{what}: another token's row changed"
                        );
                    }
                }
                // Stored into two parts, split at row r1.
                let mut ya = s.alloc::<f32>(T * r1, "y0").unwrap();
                let mut yb = s.alloc::<f32>(T * (rows - r1), "y1").unwrap();
                s.fill_bytes(&mut ya, 0xFF).unwrap();
                s.fill_bytes(&mut yb, 0xFF).unwrap();
                let out = GemvOut::Parts(RowSplit {
                    bufs: &mut [&mut ya, &mut yb],
                    rows: &[r1, rows - r1],
                });
                k.gemv_packed_rows(&s, &pm, &xg.view(), out, first, m)
                    .unwrap();
                let (ga, gb) = (s.download(&ya).unwrap(), s.download(&yb).unwrap());
                for t in 0..T {
                    for j in 0..rows {
                        let g = if j < r1 {
                            ga[t * r1 + j]
                        } else {
                            gb[t * (rows - r1) + j - r1]
                        };
                        let what = format!(
                            "store {} {rows}x{cols} tokens {first}+{m}, token {t} row {j}",
                            f.ty
                        );
                        if (first..first + m).contains(&t) {
                            let (v, mag) = want[t * rows + j];
                            assert!(
                                (g as f64 - v).abs() <= 1e-5 * mag + 1e-30,
                                "{what}: {g} against {v}"
                            );
                        } else {
                            assert_eq!(
                                g.to_bits(),
                                u32::MAX,
                                "{what}: another token's row written"
                            );
                        }
                    }
                }
            }
            // Past x, or more than one launch's tokens: an error.
            let mut y = s.upload(&vec![0f32; T * rows], "y").unwrap();
            assert!(k
                .gemv_packed_rows(&s, &pm, &xg.view(), GemvOut::Add(&mut y), T - 2, 3)
                .is_err());
            assert!(k
                .gemv_packed_rows(&s, &pm, &xg.view(), GemvOut::Add(&mut y), 1, 9)
                .is_err());
        }
    }
}
