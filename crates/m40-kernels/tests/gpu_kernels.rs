//! Every kernel against its CPU reference on fresh random inputs, outputs
//! poisoned (all bytes 0xFF: NaN) before the launch, every element checked,
//! sizes that are not multiples of the block sizes. Skips (printing why)
//! without a GPU; fails instead when M40_REQUIRE_GPU=1.

mod common;

use std::sync::Arc;

use common::{check, dequant, random_weights, Rng};
use m40_device::testing::test_device;
use m40_device::{Device, DeviceBuffer, DeviceView, Stream};
use m40_gguf::GgmlType;
use m40_kernels::{
    gemm_large_tiles, gemm_plan, gemm_scratch_len, interleave_glu, pack_gemv, select_args, Fold,
    GemvOut, KernelError, KernelFormat, Kernels, PackFormat, PackedMatrix, Penalties, QMatrix,
    RopeParams, RopeStyle, RowSplit, PACKED_GEMV_MAX_TOKENS, SELECT_ARGS, SELECT_MAX_K,
    SELECT_SCRATCH,
};
use m40_model::cpu::ops;

fn setup(test: &str) -> Option<(Arc<Device>, Stream, Kernels, Rng)> {
    let dev = test_device(test)?;
    let stream = dev.stream();
    let k = Kernels::new(dev.clone());
    Some((dev, stream, k, Rng::fresh(test)))
}

/// (rows, cols) for a format: tiny, a partial chunk, 4 warps + 3, the decode
/// shape 4096 x 4096 with rows not a multiple of the warps per block, and
/// 9001 short rows (several rows per warp, an uneven last round).
fn gemv_shapes(f: &KernelFormat) -> Vec<(usize, usize)> {
    if f.float {
        vec![
            (1, 1),
            (3, 33),
            (7, 1001),
            (131, 4097),
            (4099, 4096),
            (9001, 65),
        ]
    } else if f.qk == 256 {
        vec![
            (1, 256),
            (5, 768),
            (19, 9 * 256),
            (131, 4096),
            (4099, 4096),
            (9001, 512),
        ]
    } else {
        vec![
            (1, 32),
            (5, 96),
            (19, 65 * 32),
            (131, 4096),
            (4099, 4096),
            (9001, 64),
        ]
    }
}

/// W x in f64 from the CPU dequantization of W, and per row sum |w_i x_i|
/// (the scale of the rounding error a correct FP32 kernel may make).
fn gemv_reference(
    ty: GgmlType,
    w: &[u8],
    x: &[f32],
    rows: usize,
    cols: usize,
) -> (Vec<f32>, Vec<f64>) {
    dequant(ty, w, rows, cols)
        .chunks_exact(cols)
        .map(|r| {
            let dot: f64 = r.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let mag: f64 = r
                .iter()
                .zip(x)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            (dot as f32, mag)
        })
        .unzip()
}

/// Runs `launch` (weights `upload`: `w` in the layout the launcher reads)
/// with the launcher's own split (None) and 1, 2 and 4 warps per row group
/// forced, y poisoned before each, and checks every output against the CPU
/// reference of `w`; `launch` returns what it launched, for messages.
fn check_every_split(
    s: &Stream,
    ty: GgmlType,
    w: &[u8],
    upload: &[u8],
    x: &[f32],
    rows: usize,
    mut launch: impl FnMut(
        &DeviceView<'_, u8>,
        &DeviceView<'_, f32>,
        &mut DeviceBuffer<f32>,
        Option<u32>,
    ) -> String,
) {
    let cols = x.len();
    let (want, mag) = gemv_reference(ty, w, x, rows, cols);
    let wg = s.upload(upload, "weights").unwrap();
    let xg = s.upload(x, "x").unwrap();
    let mut y = s.alloc::<f32>(rows, "y").unwrap();
    for ksplit in [None, Some(1), Some(2), Some(3), Some(4)] {
        s.fill_bytes(&mut y, 0xFF).unwrap();
        let what = launch(&wg.view(), &xg.view(), &mut y, ksplit);
        let got = s.download(&y).unwrap();
        check(&what, &got, &want, |i| 1e-5 * mag[i] + 1e-30);
    }
}

#[test]
fn gemv_every_format_matches_cpu() {
    let Some((_dev, s, k, mut rng)) = setup("gemv_every_format_matches_cpu") else {
        return;
    };
    for f in KernelFormat::ALL {
        for (rows, cols) in gemv_shapes(&f) {
            let w = random_weights(&mut rng, f.ty, rows, cols);
            let x = rng.vec(cols, -1.0, 1.0);
            // The launcher's own plan, then each split of a row's chunks over
            // 1, 2, 3 and 4 warps (lowered where a row has fewer chunks, and
            // 3 to 2 where the kernel has no 3-way split).
            check_every_split(&s, f.ty, &w, &w, &x, rows, |wv, xv, y, ksplit| {
                let m = QMatrix {
                    ty: f.ty,
                    data: wv,
                    rows,
                    cols,
                };
                let plan = k.gemv_split(&s, &m, xv, y, ksplit).unwrap();
                format!("gemv {} {rows}x{cols} {plan:?}", f.ty)
            });
        }
    }
}

#[test]
fn packed_gemv_matches_cpu() {
    let Some((_dev, s, k, mut rng)) = setup("packed_gemv_matches_cpu") else {
        return;
    };
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
fn packed_gemv_folded_norm_matches_cpu() {
    let Some((_dev, s, k, mut rng)) = setup("packed_gemv_folded_norm_matches_cpu") else {
        return;
    };
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
                    .gemv_packed_to(&s, &pm, &ag.view(), Some(fold), GemvOut::Add(&mut x), 1, ks)
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
                        .gemv_packed_to(&s, &cm, &h.view(), Some(take()), out, 1, kc)
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
                        Some(take()),
                        GemvOut::Glu(&mut y),
                        1,
                        ks,
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
            bad.push(k.gemv_packed_to(&s, &pm, &av, Some(emit), GemvOut::Add(&mut x), 1, None));
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
            bad.push(k.gemv_packed_to(&s, &pm, &av, Some(emit), out, 1, None));
            bad.push(k.gemv_packed_to(&s, &pm, &av, take(1), GemvOut::Add(&mut x), 2, None));
            bad.push(k.gemv_packed_to(&s, &pm, &av, take(0), GemvOut::Add(&mut x), 1, None));
            bad.push(k.gemv_packed_to(
                &s,
                &pm,
                &av,
                take(n_groups + TAIL + 1),
                GemvOut::Add(&mut x),
                1,
                None,
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
/// positions, shuffled pages; the whole stack and the runs of Q, K, V a
/// model with several formats has (Q/K and V, Q and K/V, each alone).
#[test]
fn qkv_gemv_with_rope_kv_matches_the_unfolded_path() {
    let Some((_dev, s, k, mut rng)) = setup("qkv_gemv_with_rope_kv_matches_the_unfolded_path")
    else {
        return;
    };
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
            let mut ids: Vec<i32> = (0..pool_pages as i32).collect();
            for i in (1..ids.len()).rev() {
                ids.swap(i, rng.below(i + 1));
            }
            let table = s.upload(&ids[..pages], "table").unwrap();
            let pos = s.upload(&[start as i32], "pos").unwrap();
            let inv: Vec<f32> = (0..n_rot / 2)
                .map(|i| 10000f32.powf(-2.0 * i as f32 / n_rot as f32))
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
                    n_kv,
                    &pos.view(),
                    &inv.view(),
                    &p,
                    &mut kp0,
                    &mut vp0,
                    &table.view(),
                    start,
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
                            n_head_kv: n_kv,
                            pos: &pv,
                            inv_freq: &iv,
                            p: &p,
                            kpool: &mut kp,
                            vpool: &mut vp,
                            table: &tv,
                            max_start: start,
                        });
                        let l = k
                            .gemv_packed_to(&s, &pm, &x.view(), None, out, 1, ks)
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
                    n_head_kv: n_kv,
                    pos: &pv,
                    inv_freq: &iv,
                    p: &p,
                    kpool: &mut kp,
                    vpool: &mut vp,
                    table: &tv,
                    max_start: start,
                });
                assert!(
                    k.gemv_packed_to(&s, &pm, &x2.view(), None, out, m, None)
                        .is_err(),
                    "{style:?} m {m} heads {nh} parts {parts:?}"
                );
            }
        }
    }
}

#[test]
fn embed_every_format_matches_cpu() {
    let Some((_dev, s, k, mut rng)) = setup("embed_every_format_matches_cpu") else {
        return;
    };
    for f in KernelFormat::ALL {
        let colss: &[usize] = if f.float {
            &[1, 33, 4097, 64]
        } else if f.qk == 256 {
            &[256, 9 * 256]
        } else {
            &[32, 65 * 32]
        };
        for &cols in colss {
            let n_vocab = 37;
            let w = random_weights(&mut rng, f.ty, n_vocab, cols);
            let table = dequant(f.ty, &w, n_vocab, cols);
            // Repeats, both ends of the table, and one id out of range (a NaN row).
            let mut ids: Vec<i32> = (0..11).map(|_| rng.below(n_vocab) as i32).collect();
            ids.extend([0, n_vocab as i32 - 1, ids[0], n_vocab as i32]);
            let wg = s.upload(&w, "table").unwrap();
            let ig = s.upload(&ids, "ids").unwrap();
            let mut out = s.alloc::<f32>(ids.len() * cols, "rows").unwrap();
            s.fill_bytes(&mut out, 0xFF).unwrap();
            let wv = wg.view();
            let qt = QMatrix {
                ty: f.ty,
                data: &wv,
                rows: n_vocab,
                cols,
            };
            k.embed(&s, &qt, &ig.view(), &mut out).unwrap();
            let mut got = vec![s.download(&out).unwrap()];
            // The same rows from the packed layout, where the format has one.
            if PackFormat::of(f.ty).is_some_and(|p| cols % p.qk == 0) {
                let pg = s
                    .upload(&pack_gemv(f.ty, &w, n_vocab, cols).unwrap(), "packed")
                    .unwrap();
                let pv = pg.view();
                let pm = PackedMatrix {
                    ty: f.ty,
                    data: &pv,
                    rows: n_vocab,
                    cols,
                };
                s.fill_bytes(&mut out, 0xFF).unwrap();
                k.embed_packed(&s, &pm, &ig.view(), &mut out).unwrap();
                got.push(s.download(&out).unwrap());
            }
            for (got, kind) in got.iter().zip(["", " packed"]) {
                let last = ids.len() - 1;
                assert!(
                    got[last * cols..].iter().all(|v| v.is_nan()),
                    "embed{kind} {}: out-of-range id must give NaN",
                    f.ty
                );
                let mut want = Vec::with_capacity(last * cols);
                for &id in &ids[..last] {
                    want.extend_from_slice(&table[id as usize * cols..][..cols]);
                }
                let row_max: Vec<f64> = ids[..last]
                    .iter()
                    .map(|&id| {
                        table[id as usize * cols..][..cols]
                            .iter()
                            .fold(0.0f64, |m, v| m.max(v.abs() as f64))
                    })
                    .collect();
                check(
                    &format!("embed{kind} {} cols {cols}", f.ty),
                    &got[..last * cols],
                    &want,
                    |i| 1e-6 * (want[i].abs() as f64 + row_max[i / cols]),
                );
            }
        }
    }
}

#[test]
fn rmsnorm_matches_cpu() {
    let Some((_dev, s, k, mut rng)) = setup("rmsnorm_matches_cpu") else {
        return;
    };
    for (rows, n) in [(1, 1), (3, 31), (17, 576), (5, 4097), (2, 14336)] {
        let x = rng.vec(rows * n, -2.0, 2.0);
        let w = rng.vec(n, -1.5, 1.5);
        let eps = 1e-5;
        let mut want = x.clone();
        ops::rmsnorm(&mut want, &w, eps);
        let xg = s.upload(&x, "x").unwrap();
        let wg = s.upload(&w, "w").unwrap();
        let mut y = s.alloc::<f32>(rows * n, "y").unwrap();
        s.fill_bytes(&mut y, 0xFF).unwrap();
        k.rmsnorm(&s, &xg.view(), &wg.view(), &mut y, rows, eps)
            .unwrap();
        let got = s.download(&y).unwrap();
        check(&format!("rmsnorm {rows}x{n}"), &got, &want, |i| {
            2e-5 * want[i].abs() as f64 + 1e-7
        });

        // The fused residual form: x += d (checked exactly), y = norm(x).
        let d = rng.vec(rows * n, -1.0, 1.0);
        let sum: Vec<f32> = x.iter().zip(&d).map(|(a, b)| a + b).collect();
        let mut want = sum.clone();
        ops::rmsnorm(&mut want, &w, eps);
        let mut xg = s.upload(&x, "x").unwrap();
        let dg = s.upload(&d, "d").unwrap();
        s.fill_bytes(&mut y, 0xFF).unwrap();
        k.add_rmsnorm(&s, &mut xg, &dg.view(), &wg.view(), &mut y, rows, eps)
            .unwrap();
        let got = s.download(&y).unwrap();
        check(&format!("add_rmsnorm {rows}x{n}"), &got, &want, |i| {
            2e-5 * want[i].abs() as f64 + 1e-7
        });
        let got_x = s.download(&xg).unwrap();
        check(&format!("add_rmsnorm {rows}x{n} x"), &got_x, &sum, |_| 0.0);
    }
}

/// RoPE of Q in place and of K into the paged FP16 cache with V, in one
/// launch: q against the CPU rope, the pools against the FP16 of the CPU's
/// roped K (within one FP16 step: the FP32 rotations may round apart) and
/// of V (exact) at the pages of a shuffled table; every other pool row
/// keeps its poison.
#[test]
fn rope_kv_append_matches_cpu() {
    let Some((_dev, s, k, mut rng)) = setup("rope_kv_append_matches_cpu") else {
        return;
    };
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
            let rope = ops::Rope::new(cpu_style, n_rot, 10000.0, factor, None);
            let kv_dim = n_kv * hd;
            let pages = (start + n_tok).div_ceil(KV_PAGE);
            let pool_pages = pages + 2;
            let mut ids: Vec<i32> = (0..pool_pages as i32).collect();
            for i in (1..ids.len()).rev() {
                ids.swap(i, rng.below(i + 1));
            }
            let table: Vec<i32> = ids[..pages].to_vec();
            let q = rng.vec(n_tok * n_head * hd, -2.0, 2.0);
            let kx = rng.vec(n_tok * kv_dim, -2.0, 2.0);
            let vx = rng.vec(n_tok * kv_dim, -2.0, 2.0);
            let pos: Vec<i32> = (0..n_tok).map(|t| (start + t) as i32).collect();
            let (mut want_q, mut want_k) = (q.clone(), kx.clone());
            for t in 0..n_tok {
                let p = start + t;
                rope.apply(&mut want_q[t * n_head * hd..][..n_head * hd], hd, p);
                rope.apply(&mut want_k[t * kv_dim..][..kv_dim], hd, p);
            }
            let mut qg = s.upload(&q, "q").unwrap();
            let kg = s.upload(&kx, "k").unwrap();
            let vg = s.upload(&vx, "v").unwrap();
            let pg = s.upload(&pos, "pos").unwrap();
            let tg = s.upload(&table, "table").unwrap();
            let fg = s.upload(&rope.inv_freq, "inv_freq").unwrap();
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
            k.rope_kv_append(
                &s,
                &mut qg,
                &kg.view(),
                &vg.view(),
                n_kv,
                &pg.view(),
                &fg.view(),
                &p,
                &mut kpool,
                &mut vpool,
                &tg.view(),
                start,
            )
            .unwrap();
            let what =
                format!("rope_kv {style:?} {n_tok}x{n_head}/{n_kv}x{hd} rot {n_rot} at {start}");
            let got_q = s.download(&qg).unwrap();
            check(&format!("{what}: q"), &got_q, &want_q, |_| {
                2e-6 * 2.0 + 1e-7
            });
            let (kp, vp) = (s.download(&kpool).unwrap(), s.download(&vpool).unwrap());
            let mut rows = vec![None; pool_pages * KV_PAGE];
            for t in 0..n_tok {
                let p = start + t;
                rows[table[p / KV_PAGE] as usize * KV_PAGE + p % KV_PAGE] = Some(t);
            }
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
                    let step = (wk.to_f32().abs() * 2f32.powi(-10)).max(2f32.powi(-24));
                    assert!(
                        (gkf - wk.to_f32()).abs() <= step,
                        "{what}: k token {t} dim {c}: {gkf} want {}",
                        wk.to_f32()
                    );
                    assert_eq!(gv, wv, "{what}: v token {t} dim {c}");
                }
            }
        }
    }
}

#[test]
fn swiglu_add_and_f16_match_cpu() {
    let Some((_dev, s, k, mut rng)) = setup("swiglu_add_and_f16_match_cpu") else {
        return;
    };
    for n in [1, 255, 256 * 1000 + 3] {
        let g = rng.vec(n, -20.0, 20.0);
        let u = rng.vec(n, -3.0, 3.0);
        let mut want = g.clone();
        ops::swiglu(&mut want, &u);
        let mut gg = s.upload(&g, "g").unwrap();
        let ug = s.upload(&u, "u").unwrap();
        k.swiglu(&s, &mut gg, &ug.view(), n).unwrap();
        check(
            &format!("swiglu {n}"),
            &s.download(&gg).unwrap(),
            &want,
            |i| 1e-5 * want[i].abs() as f64 + 1e-12,
        );

        let want: Vec<f32> = g.iter().zip(&u).map(|(a, b)| a + b).collect();
        let mut yg = s.upload(&g, "y").unwrap();
        k.add(&s, &mut yg, &ug.view(), n).unwrap();
        check(
            &format!("add {n}"),
            &s.download(&yg).unwrap(),
            &want,
            |_| 0.0,
        );

        // Values across FP16's range: normals, subnormals, overflow to inf.
        let x: Vec<f32> = (0..n)
            .map(|i| match i % 4 {
                0 => rng.uniform(-70000.0, 70000.0),
                1 => rng.uniform(-1e-5, 1e-5),
                2 => rng.uniform(-1e-7, 1e-7),
                _ => rng.uniform(-2.0, 2.0),
            })
            .collect();
        let want: Vec<u16> = x
            .iter()
            .map(|v| half::f16::from_f32(*v).to_bits())
            .collect();
        let xg = s.upload(&x, "x").unwrap();
        let mut hg = s.alloc::<u16>(n, "f16").unwrap();
        s.fill_bytes(&mut hg, 0xFF).unwrap();
        k.f32_to_f16(&s, &xg.view(), &mut hg, n).unwrap();
        let got = s.download(&hg).unwrap();
        let bad: Vec<usize> = (0..n).filter(|&i| got[i] != want[i]).take(5).collect();
        assert!(
            bad.is_empty(),
            "f32_to_f16 {n}: differs at {bad:?}: {:?}",
            bad.iter()
                .map(|&i| (x[i], got[i], want[i]))
                .collect::<Vec<_>>()
        );
    }
}

#[test]
fn launchers_refuse_bad_shapes() {
    let Some((_dev, s, k, _rng)) = setup("launchers_refuse_bad_shapes") else {
        return;
    };
    let w = s.upload(&[0u8; 18 * 4], "w").unwrap();
    let wv = w.view();
    let x = s.upload(&[0f32; 64], "x").unwrap();
    let mut y = s.alloc::<f32>(8, "y").unwrap();
    let m = |ty, rows, cols| QMatrix {
        ty,
        data: &wv,
        rows,
        cols,
    };
    let shape_err = |r: m40_kernels::Result<()>| matches!(r, Err(KernelError::Shape { .. }));
    // 4 rows of 32 Q4_0 fit in 72 bytes; 5 rows do not.
    k.gemv(&s, &m(GgmlType::Q4_0, 4, 32), &x.view(), &mut y)
        .unwrap();
    assert!(shape_err(k.gemv(
        &s,
        &m(GgmlType::Q4_0, 5, 32),
        &x.view(),
        &mut y
    )));
    // Not a whole number of K-quant blocks.
    assert!(shape_err(k.gemv(
        &s,
        &m(GgmlType::Q4_K, 1, 100),
        &x.view(),
        &mut y
    )));
    // Misaligned x.
    let xv = x.slice(1..64).unwrap();
    assert!(shape_err(k.gemv(&s, &m(GgmlType::F32, 1, 8), &xv, &mut y)));
    // y too short.
    assert!(shape_err(k.gemv(
        &s,
        &m(GgmlType::F32, 9, 2),
        &x.view(),
        &mut y
    )));
    // No kernel for this format.
    let r = k.gemv(&s, &m(GgmlType::Q8_K, 1, 256), &x.view(), &mut y);
    assert!(matches!(r, Err(KernelError::Unsupported { .. })));
    s.synchronize().unwrap();
}

/// A kernel reads mapped (zero-copy) host memory directly and writes another
/// mapped buffer the host then reads: the path the decode ring buffers take.
#[test]
fn kernels_read_and_write_mapped_host_memory() {
    let Some((_dev, s, k, mut rng)) = setup("kernels_read_and_write_mapped_host_memory") else {
        return;
    };
    let n = 100_003usize;
    let x = rng.vec(n, -1.0, 1.0);
    let y0 = rng.vec(n, -1.0, 1.0);
    let mut mx = s.alloc_mapped::<f32>(n, "mapped x").unwrap();
    mx.as_mut_slice().unwrap().copy_from_slice(&x);
    let mut y = s.upload(&y0, "y").unwrap();
    let add = k.kernel("elementwise", "add_f32").unwrap();
    let n64 = n as i64;
    let cfg = m40_device::LaunchConfig {
        grid: (n.div_ceil(256) as u32, 1, 1),
        block: (256, 1, 1),
        shared_bytes: 0,
    };
    // SAFETY: add_f32(float* y, const float* x, long long n): y has n floats on
    // the device, x is a mapped host buffer of n floats.
    unsafe {
        s.launch(&add)
            .buf_mut(&mut y)
            .mapped(&mx)
            .scalar(&n64)
            .run(cfg)
            .unwrap()
    };
    let want: Vec<f32> = x.iter().zip(&y0).map(|(a, b)| a + b).collect();
    check("add from mapped x", &s.download(&y).unwrap(), &want, |_| {
        0.0
    });

    // Now the output is mapped: the kernel writes host memory.
    let mut my = s.alloc_mapped::<f32>(n, "mapped y").unwrap();
    my.as_mut_slice().unwrap().copy_from_slice(&y0);
    let xg = s.upload(&x, "x").unwrap();
    let xv = xg.view();
    // SAFETY: as above, with y a mapped host buffer of n floats.
    unsafe {
        s.launch(&add)
            .mapped(&my)
            .view(&xv)
            .scalar(&n64)
            .run(cfg)
            .unwrap()
    };
    s.synchronize().unwrap();
    check("add into mapped y", my.as_slice().unwrap(), &want, |_| 0.0);
}

/// Kernels captured into a graph on a second stream replay with the buffers
/// they were captured with; the default stream refuses capture.
#[test]
fn graph_capture_replays_kernels() {
    let Some((dev, s0, k, mut rng)) = setup("graph_capture_replays_kernels") else {
        return;
    };
    let n = 10_007usize;
    let x = rng.vec(n, -1.0, 1.0);
    let u = rng.vec(n, -2.0, 2.0);
    let s = dev.new_stream().unwrap();
    let xg = s.upload(&x, "x").unwrap();
    let ug = s.upload(&u, "u").unwrap();
    let mut y = s.upload(&x, "y").unwrap();
    // One replay: y += x, then y = silu(y) * u.
    let graph = s
        .capture(|s| {
            k.add(s, &mut y, &xg.view(), n)?;
            k.swiglu(s, &mut y, &ug.view(), n)
        })
        .unwrap();
    for _ in 0..3 {
        // SAFETY: x, u and y, which the graph uses, live to the end of the test.
        unsafe { graph.launch().unwrap() };
    }
    let mut want = x.clone();
    for _ in 0..3 {
        for (w, xv) in want.iter_mut().zip(&x) {
            *w += xv;
        }
        ops::swiglu(&mut want, &u);
    }
    let got = s.download(&y).unwrap();
    check("graph replays", &got, &want, |i| {
        1e-5 * want[i].abs() as f64 + 1e-6
    });
    let refused = s0.capture(|s| k.add(s, &mut y, &xg.view(), n));
    assert!(matches!(
        refused,
        Err(KernelError::Device(m40_device::DeviceError::Capture(_)))
    ));
}

/// gemm (prefill matmul, dequantizing in the tile loader) against the CPU
/// dequantization in f64, for every format, with and without accumulation,
/// through both tiles, on shapes that are not multiples of either.
/// One GEMM case: random weights of `ty` (n x kk), X (m x kk); `launch`
/// gets the uploaded weights (`prepare` turns the GGUF bytes into what the
/// kernel reads), X, Y (poisoned, or holding y0 when accumulating) and the
/// accumulate flag.
#[allow(clippy::too_many_arguments)]
fn gemm_case(
    s: &Stream,
    rng: &mut Rng,
    ty: GgmlType,
    (m, n, kk): (usize, usize, usize),
    what: &str,
    prepare: impl Fn(&[u8]) -> Vec<u8>,
    launch: impl Fn(&DeviceView<'_, u8>, &DeviceView<'_, f32>, &mut DeviceBuffer<f32>, bool),
) {
    let w = random_weights(rng, ty, n, kk);
    let x = rng.vec(m * kk, -1.0, 1.0);
    let y0 = rng.vec(m * n, -1.0, 1.0);
    let wd = dequant(ty, &w, n, kk);
    let mut want = vec![0f32; m * n];
    let mut mag = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let (xr, wr) = (&x[i * kk..(i + 1) * kk], &wd[j * kk..(j + 1) * kk]);
            let dot: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
            want[i * n + j] = dot as f32;
            mag[i * n + j] = xr
                .iter()
                .zip(wr)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
        }
    }
    let wg = s.upload(&prepare(&w), "w").unwrap();
    let xg = s.upload(&x, "x").unwrap();
    let mut y = s.alloc::<f32>(m * n, "y").unwrap();
    s.fill_bytes(&mut y, 0xFF).unwrap();
    launch(&wg.view(), &xg.view(), &mut y, false);
    let got = s.download(&y).unwrap();
    let what = format!("{what} {ty} {m}x{n}x{kk}");
    check(&what, &got, &want, |i| 1e-5 * mag[i] + 1e-30);
    // Accumulate onto y0.
    let mut y = s.upload(&y0, "y0").unwrap();
    launch(&wg.view(), &xg.view(), &mut y, true);
    let got = s.download(&y).unwrap();
    let want: Vec<f32> = want.iter().zip(&y0).map(|(a, b)| a + b).collect();
    check(&format!("{what} accumulate"), &got, &want, |i| {
        1e-5 * mag[i] + 1e-6
    });
}

/// [`gemm_case`] for the packed GEMM of `ty`; with `part`, a split-K
/// scratch, poisoned before each launch.
fn packed_gemm_case(
    s: &Stream,
    k: &Kernels,
    rng: &mut Rng,
    ty: GgmlType,
    (m, n, kk): (usize, usize, usize),
    part: Option<&std::cell::RefCell<DeviceBuffer<f32>>>,
) {
    let prepare = |w: &[u8]| pack_gemv(ty, w, n, kk).unwrap();
    let what = if part.is_some() {
        "gemm_packed split"
    } else {
        "gemm_packed"
    };
    gemm_case(s, rng, ty, (m, n, kk), what, prepare, |wv, xv, y, acc| {
        let pm = PackedMatrix {
            ty,
            data: wv,
            rows: n,
            cols: kk,
        };
        let mut p = part.map(|p| p.borrow_mut());
        if let Some(p) = p.as_deref_mut() {
            s.fill_bytes(p, 0xFF).unwrap();
        }
        k.gemm_packed(s, &pm, xv, y, m, acc, p.as_deref_mut())
            .unwrap();
    });
}

#[test]
fn gemm_every_format_matches_cpu() {
    let Some((_dev, s, k, mut rng)) = setup("gemm_every_format_matches_cpu") else {
        return;
    };
    // Up to 64 tokens, or matrices too small to give the 128 x 128 tile a
    // block per two SMs, run the 64 x 64 tile; the last shape runs the large
    // one on any GPU of up to 268 SMs (2 x 67 blocks).
    let shapes = |qk: usize| -> [(usize, usize, usize); 6] {
        if qk == 256 {
            [
                (1, 1, 256),
                (2, 67, 512),
                (40, 200, 256),
                (65, 130, 768),
                (200, 64, 256),
                (150, 8500, 256),
            ]
        } else {
            [
                (1, 1, 32),
                (2, 67, 96),
                (40, 200, 64),
                (65, 130, 256),
                (200, 64, 1024),
                (150, 8500, 64),
            ]
        }
    };
    for f in KernelFormat::ALL {
        for mnk in shapes(f.qk) {
            let (m, n, kk) = mnk;
            gemm_case(
                &s,
                &mut rng,
                f.ty,
                mnk,
                "gemm",
                |w| w.to_vec(),
                |wv, xv, y, acc| {
                    let qm = QMatrix {
                        ty: f.ty,
                        data: wv,
                        rows: n,
                        cols: kk,
                    };
                    k.gemm(&s, &qm, xv, y, m, acc, None).unwrap();
                },
            );
        }
    }
    // The packed layout (rows not a multiple of 4: a padded group).
    for f in PackFormat::ALL {
        for mnk in shapes(f.qk) {
            packed_gemm_case(&s, &k, &mut rng, f.ty, mnk, None);
        }
    }
    // Split over K: 130 tokens (two tiles, the second partial) and rows (not
    // a multiple of 4) whose large tiles fill this GPU's SMs badly, found
    // with the launcher's own rule, so the launch splits: fewer tiles than
    // half the SMs (the large tile only because it splits), then at least
    // that many. The scratch poisoned first. The row-major GEMM shares the
    // launcher: one format.
    let (m, kk) = (130, 1024);
    let gpu = k.gemm_slots().unwrap();
    println!(
        "GEMM slots: {} SMs x {} large-tile / {} small-tile blocks",
        gpu.sms, gpu.per_sm, gpu.small_per_sm
    );
    // The same slots from every format's kernels (the GPU backend reads them
    // from its model's format, so as not to load another's).
    for f in KernelFormat::ALL {
        for packed in [false, true] {
            let other = k.gemm_slots_for(f.ty, packed).unwrap();
            assert_eq!(
                (other.per_sm, other.small_per_sm),
                (gpu.per_sm, gpu.small_per_sm),
                "{} packed {packed}",
                f.symbol
            );
        }
    }
    let splitting = |m: usize, few: bool| {
        (1..512).map(|t| 128 * t - 3).find(|&n| {
            k.gemm_splits(m, n, kk).unwrap() > 1 && (2 * gemm_large_tiles(m, n) < gpu.sms) == few
        })
    };
    // Grids under half the SMs split only where that fills three quarters
    // of the slots: none can where an SM holds 3 or more large blocks.
    let few = splitting(m, true);
    if few.is_none() {
        println!("no grid of fewer large tiles than half the SMs splits on this GPU");
    }
    // (tokens, rows): the large tile's split shapes, then the small tile's
    // (40 tokens: a short prompt).
    let shapes: Vec<(usize, usize)> = few
        .into_iter()
        .chain(Some(
            splitting(m, false).expect("a shape that splits over K"),
        ))
        .map(|n| (m, n))
        .chain(Some((
            40,
            splitting(40, true).expect("a small-tile shape that splits"),
        )))
        .collect();
    // Deep splits (5 to 8) need long rows: 4096 columns (128 k-steps), the
    // 8B model's o at 128 tokens (large tile) and at 40 (small tile).
    let deep = 4096;
    let deep_shapes: Vec<(usize, usize)> = [(128, false), (40, true)]
        .into_iter()
        .filter_map(|(m, small)| {
            let n = (1..64).map(|t| 128 * t - 3).find(|&n| {
                let plan = gemm_plan(m, n, deep, gpu);
                plan.small == small && plan.splits >= 5
            });
            if n.is_none() {
                println!("no {m}-token shape of {deep} columns splits 5 ways or more on this GPU");
            }
            n.map(|n| (m, n))
        })
        .collect();
    let most = shapes
        .iter()
        .map(|&(m, n)| gemm_scratch_len(m, n, kk, gpu))
        .chain(
            deep_shapes
                .iter()
                .map(|&(m, n)| gemm_scratch_len(m, n, deep, gpu)),
        )
        .max()
        .unwrap();
    let part = std::cell::RefCell::new(s.alloc::<f32>(most, "scratch").unwrap());
    let poisoned = |p: &mut DeviceBuffer<f32>| s.fill_bytes(p, 0xFF).unwrap();
    for &(m, n) in &shapes {
        let splits = k.gemm_splits(m, n, kk).unwrap();
        println!("split over K: {m}x{n}x{kk} in {splits}");
        assert_eq!(gemm_scratch_len(m, n, kk, gpu), splits * m * n);
        for f in PackFormat::ALL {
            packed_gemm_case(&s, &k, &mut rng, f.ty, (m, n, kk), Some(&part));
        }
    }
    for &(m, n) in &deep_shapes {
        let splits = k.gemm_splits(m, n, deep).unwrap();
        println!("split over K: {m}x{n}x{deep} in {splits}");
        assert!(splits >= 5);
        for f in PackFormat::ALL {
            packed_gemm_case(&s, &k, &mut rng, f.ty, (m, n, deep), Some(&part));
        }
    }
    // The large tile's last split shape.
    let n = shapes[shapes.len() - 2].1;
    gemm_case(
        &s,
        &mut rng,
        GgmlType::Q5_K,
        (m, n, kk),
        "gemm split",
        |w| w.to_vec(),
        |wv, xv, y, acc| {
            let qm = QMatrix {
                ty: GgmlType::Q5_K,
                data: wv,
                rows: n,
                cols: kk,
            };
            let mut p = part.borrow_mut();
            poisoned(&mut p);
            k.gemm(&s, &qm, xv, y, m, acc, Some(&mut p)).unwrap();
        },
    );
    // The split's reduce into stacked parts: the same bits as into one
    // output (checked above), nothing written past a part.
    let ty = GgmlType::Q4_0;
    let w = random_weights(&mut rng, ty, n, kk);
    let wg = s.upload(&pack_gemv(ty, &w, n, kk).unwrap(), "w").unwrap();
    let wv = wg.view();
    let pm = PackedMatrix {
        ty,
        data: &wv,
        rows: n,
        cols: kk,
    };
    let x = s.upload(&rng.vec(m * kk, -1.0, 1.0), "x").unwrap();
    let mut one = s.alloc::<f32>(m * n, "y").unwrap();
    let mut p = part.borrow_mut();
    k.gemm_packed(&s, &pm, &x.view(), &mut one, m, false, Some(&mut p))
        .unwrap();
    let one = s.download(&one).unwrap();
    const TAIL: usize = 16;
    let rows = [n - 300, 150, 150];
    let mut bufs: Vec<DeviceBuffer<f32>> = rows
        .iter()
        .map(|&r| s.alloc::<f32>(m * r + TAIL, "y").unwrap())
        .collect();
    for b in bufs.iter_mut() {
        s.fill_bytes(b, 0xFF).unwrap();
    }
    let mut refs: Vec<&mut DeviceBuffer<f32>> = bufs.iter_mut().collect();
    let out = RowSplit {
        bufs: &mut refs,
        rows: &rows,
    };
    k.gemm_packed_split(&s, &pm, &x.view(), out, m, false, Some(&mut p))
        .unwrap();
    let mut first = 0;
    for (i, (&r, b)) in rows.iter().zip(&bufs).enumerate() {
        let got = s.download(b).unwrap();
        for t in 0..m {
            for j in 0..r {
                let (g, o) = (got[t * r + j], one[t * n + first + j]);
                assert_eq!(
                    g.to_bits(),
                    o.to_bits(),
                    "split part {i} token {t} row {j}: {g} vs {o}"
                );
            }
        }
        assert!(
            got[m * r..].iter().all(|v| v.to_bits() == u32::MAX),
            "split part {i}: wrote past its part"
        );
        first += r;
    }
    // Columns that are not whole sub-blocks are refused.
    let w = s.alloc::<u8>(64 * 40, "w").unwrap();
    let wv = w.view();
    let x = s.alloc::<f32>(40, "x").unwrap();
    let mut y = s.alloc::<f32>(1, "y").unwrap();
    let qm = QMatrix {
        ty: GgmlType::F16,
        data: &wv,
        rows: 1,
        cols: 40,
    };
    assert!(k.gemm(&s, &qm, &x.view(), &mut y, 1, false, None).is_err());
}

/// Stacked matrices (a fused Q/K/V or gate/up) through the packed GEMV (1
/// to 16 tokens, each split of a group's blocks over warps) and the GEMM (3
/// and 70): each part's rows land in its own buffer, every element checked
/// against the CPU reference, the buffers poisoned before each launch and 16
/// floats past each part left untouched.
/// SwiGLU of an interleaved gate/up stack: the GEMV's fused epilogue (1 to
/// 16 tokens, every split) and the GEMM followed by swiglu_pairs (more
/// tokens), against silu(gate x) * up x in f64 from the dequantized rows;
/// outputs poisoned, every element checked, nothing written past y.
#[test]
fn glu_gemv_and_gemm_match_cpu() {
    let Some((_dev, s, k, mut rng)) = setup("glu_gemv_and_gemm_match_cpu") else {
        return;
    };
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
            for m in [1usize, 2, 5, 8, 16, 20, 70] {
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
                        let silu = g / (1.0 + (-g).exp());
                        want[t * ff + j] = (silu * u) as f32;
                        tol[t * ff + j] = 1e-5 * (1.1 * u.abs() * mg + silu.abs() * mu)
                            + 1e-5 * (silu * u).abs()
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
                            .gemv_packed_glu(&s, &pm, &xg.view(), &mut y, m, ks)
                            .unwrap();
                        format!("glu gemv ksplit {got}")
                    } else {
                        let mut gu = s.alloc::<f32>(m * 2 * ff, "gu").unwrap();
                        s.fill_bytes(&mut gu, 0xFF).unwrap();
                        let mut refs = [&mut gu];
                        let rows = [2 * ff];
                        let out = RowSplit {
                            bufs: &mut refs,
                            rows: &rows,
                        };
                        k.gemm_packed_split(&s, &pm, &xg.view(), out, m, false, None)
                            .unwrap();
                        k.swiglu_pairs(&s, &gu.view(), &mut y, m, ff).unwrap();
                        "glu gemm + swiglu_pairs".to_string()
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

#[test]
fn stacked_and_batched_matmuls_write_each_part() {
    let Some((_dev, s, k, mut rng)) = setup("stacked_and_batched_matmuls_write_each_part") else {
        return;
    };
    const TAIL: usize = 16;
    for f in PackFormat::ALL {
        let small = 2 * f.qk.max(64);
        let cases: [(&[usize], usize); 4] = [
            (&[24, 8, 8], small),
            (&[36, 20], small),
            (&[9, 3, 1], small),
            (&[131], 4096),
        ];
        for (parts, cols) in cases {
            let rows: usize = parts.iter().sum();
            let w = random_weights(&mut rng, f.ty, rows, cols);
            let packed = pack_gemv(f.ty, &w, rows, cols).unwrap();
            let wg = s.upload(&packed, "w").unwrap();
            let wv = wg.view();
            let pm = PackedMatrix {
                ty: f.ty,
                data: &wv,
                rows,
                cols,
            };
            let wd = dequant(f.ty, &w, rows, cols);
            for m in [1usize, 2, 3, 5, 8, 13, 16, 70] {
                let x = rng.vec(m * cols, -1.0, 1.0);
                let xg = s.upload(&x, "x").unwrap();
                let mut bufs: Vec<DeviceBuffer<f32>> = parts
                    .iter()
                    .map(|&r| s.alloc::<f32>(m * r + TAIL, "y").unwrap())
                    .collect();
                // Some(split): the GEMV (split None: the launcher's own),
                // for up to 16 tokens; None: the GEMM, for 3 and 70.
                let mut runs: Vec<Option<Option<u32>>> = Vec::new();
                if m <= PACKED_GEMV_MAX_TOKENS {
                    runs.extend([None, Some(1), Some(2), Some(3), Some(4)].map(Some));
                }
                if m == 3 || m == 70 {
                    runs.push(None);
                }
                for (li, run) in runs.iter().enumerate() {
                    for b in bufs.iter_mut() {
                        s.fill_bytes(b, 0xFF).unwrap();
                    }
                    let mut refs: Vec<&mut DeviceBuffer<f32>> = bufs.iter_mut().collect();
                    let out = RowSplit {
                        bufs: &mut refs,
                        rows: parts,
                    };
                    let what = match run {
                        Some(ks) => {
                            let got = k
                                .gemv_packed_batch(&s, &pm, &xg.view(), out, m, *ks)
                                .unwrap();
                            format!("gemv ksplit {got}")
                        }
                        None => {
                            k.gemm_packed_split(&s, &pm, &xg.view(), out, m, false, None)
                                .unwrap();
                            "gemm".to_string()
                        }
                    };
                    let mut first = 0;
                    for (p, (&r, b)) in parts.iter().zip(&bufs).enumerate() {
                        let got = s.download(b).unwrap();
                        let (mut want, mut mag) = (vec![0f32; m * r], vec![0f64; m * r]);
                        for t in 0..m {
                            let xr = &x[t * cols..(t + 1) * cols];
                            for j in 0..r {
                                let wr = &wd[(first + j) * cols..(first + j + 1) * cols];
                                want[t * r + j] =
                                    xr.iter()
                                        .zip(wr)
                                        .map(|(a, b)| *a as f64 * *b as f64)
                                        .sum::<f64>() as f32;
                                mag[t * r + j] = xr
                                    .iter()
                                    .zip(wr)
                                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                                    .sum();
                            }
                        }
                        let what =
                            format!("{what} ({li}) {} {parts:?}x{cols} m {m} part {p}", f.ty);
                        check(&what, &got[..m * r], &want, |i| 1e-5 * mag[i] + 1e-30);
                        assert!(
                            got[m * r..].iter().all(|v| v.to_bits() == u32::MAX),
                            "{what}: wrote past its part"
                        );
                        first += r;
                    }
                }
            }
        }
    }
    // Parts that do not add up to the matrix are refused.
    let wg = s
        .alloc::<u8>(
            PackFormat::of(GgmlType::F16).unwrap().packed_bytes(8, 64),
            "w",
        )
        .unwrap();
    let wv = wg.view();
    let pm = PackedMatrix {
        ty: GgmlType::F16,
        data: &wv,
        rows: 8,
        cols: 64,
    };
    let x = s.alloc::<f32>(64, "x").unwrap();
    let (mut a, mut b) = (
        s.alloc::<f32>(4, "a").unwrap(),
        s.alloc::<f32>(4, "b").unwrap(),
    );
    let out = RowSplit {
        bufs: &mut [&mut a, &mut b],
        rows: &[4, 3],
    };
    assert!(k
        .gemv_packed_batch(&s, &pm, &x.view(), out, 1, None)
        .is_err());
    // More tokens than one launch takes, or none, are refused.
    for m in [0, PACKED_GEMV_MAX_TOKENS + 1] {
        let out = RowSplit {
            bufs: &mut [&mut a],
            rows: &[8],
        };
        assert!(k
            .gemv_packed_batch(&s, &pm, &x.view(), out, m, None)
            .is_err());
    }
}

/// The causal attention of one sequence in f64 from FP16-rounded K and V:
/// q (n_tok, n_head, hd), k and v (n_keys, n_kv * hd), query i at position start + i.
#[allow(clippy::too_many_arguments)]
fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_tok: usize,
    start: usize,
    n_head: usize,
    n_kv: usize,
    hd: usize,
) -> Vec<f32> {
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
fn paged_attention_matches_cpu() {
    let Some((_dev, s, k, mut rng)) = setup("paged_attention_matches_cpu") else {
        return;
    };
    use m40_kernels::{AttnPlan, AttnScratch, AttnShape, KV_PAGE};
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
        let mut ids: Vec<i32> = (0..pool_pages as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        let table: Vec<i32> = ids[..pages].to_vec();
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
        for j in 0..n_keys {
            let at = (table[j / KV_PAGE] as usize * KV_PAGE + j % KV_PAGE) * kv_dim;
            for c in 0..kv_dim {
                kp[at + c] = half::f16::from_f32(kk[j * kv_dim + c]).to_bits();
                vp[at + c] = half::f16::from_f32(vv[j * kv_dim + c]).to_bits();
            }
        }
        let kpool = s.upload(&kp, "kpool").unwrap();
        let vpool = s.upload(&vp, "vpool").unwrap();
        let tg = s.upload(&table_ext, "table").unwrap();
        let want = attention_reference(&q, &kk, &vv, n_tok, start, n_head, n_kv, hd);
        let shape = AttnShape {
            n_tok,
            start,
            n_head,
            n_head_kv: n_kv,
            head_dim: hd,
        };
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
                    &qg.view(),
                    &kpool.view(),
                    &vpool.view(),
                    &tg.view(),
                    &pos.view(),
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

#[test]
fn add_rows_matches_cpu() {
    let Some((_dev, s, k, mut rng)) = setup("add_rows_matches_cpu") else {
        return;
    };
    for (rows, width) in [(1, 1), (3, 896), (17, 131)] {
        let y0 = rng.vec(rows * width + 5, -1.0, 1.0);
        let b = rng.vec(width, -1.0, 1.0);
        let mut y = s.upload(&y0, "y").unwrap();
        let bg = s.upload(&b, "b").unwrap();
        k.add_rows(&s, &mut y, &bg.view(), rows).unwrap();
        let got = s.download(&y).unwrap();
        let want: Vec<f32> = (0..y0.len())
            .map(|i| {
                if i < rows * width {
                    y0[i] + b[i % width]
                } else {
                    y0[i]
                }
            })
            .collect();
        check(&format!("add_rows {rows}x{width}"), &got, &want, |_| 0.0);
    }
}

/// The CPU sampler's view of selection: penalties in f32 (as
/// m40-runtime's Sampler applies them), then the k highest logits by IEEE
/// total order, lower ids first on ties.
fn select_reference(logits: &mut [f32], pen: &[(u32, u32)], p: Penalties, k: usize) -> Vec<u32> {
    for &(id, c) in pen {
        let l = &mut logits[id as usize];
        if *l > 0.0 {
            *l /= p.repeat;
        } else {
            *l *= p.repeat;
        }
        *l -= c as f32 * p.frequency + p.presence;
    }
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    idx.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx
}

#[test]
fn select_top_k_matches_cpu() {
    let Some((_dev, s, k, mut rng)) = setup("select_top_k_matches_cpu") else {
        return;
    };
    let mut cases = 0;
    // One scratch for every selection: each leaves it zero for the next.
    let mut scratch = s.alloc_zeroed::<i32>(SELECT_SCRATCH, "scratch").unwrap();
    for n_vocab in [1usize, 7, 1000, 4097, 32000, 49152, 128256, 151936] {
        // Distinct values, heavy ties (a few levels), and -inf entries.
        for style in 0..3 {
            let mut logits: Vec<f32> = rng.vec(n_vocab, -12.0, 12.0);
            if style == 1 {
                for l in &mut logits {
                    *l = (*l * 0.5).round();
                }
            }
            if style == 2 {
                for l in logits.iter_mut().step_by(3) {
                    *l = f32::NEG_INFINITY;
                }
            }
            // Greedy selections without penalties (style 0 and every
            // third other case) take the many-block argmax.
            let n_pen = if style == 0 || rng.below(3) == 0 {
                0
            } else {
                rng.below(65.min(n_vocab) + 1).min(n_vocab)
            };
            let mut pen_ids: Vec<u32> = (0..n_vocab as u32).collect();
            for i in 0..n_pen {
                let j = i + rng.below(n_vocab - i);
                pen_ids.swap(i, j);
            }
            let pen: Vec<(u32, u32)> = pen_ids[..n_pen]
                .iter()
                .map(|&id| (id, 1 + rng.below(5) as u32))
                .collect();
            let p = Penalties {
                repeat: 1.0 + rng.uniform(0.0, 0.5),
                frequency: rng.uniform(0.0, 0.3),
                presence: rng.uniform(0.0, 0.3),
            };
            for kk in [1usize, 2, 40, 1000, 1024] {
                if kk > n_vocab {
                    continue;
                }
                let mut want_l = logits.clone();
                let want = select_reference(&mut want_l, &pen, p, kk);
                let mut lg = s.upload(&logits, "logits").unwrap();
                // Room for more pairs than given: the kernel reads n_pen.
                let mut args = select_args(kk, p, &pen);
                args.resize(args.len() + 2 * rng.below(8), -1);
                let ag = s.upload(&args, "args").unwrap();
                // k_max above k (the kernel reads k), or exactly k.
                let k_max = if style == 0 {
                    SELECT_MAX_K.min(n_vocab)
                } else {
                    kk
                };
                let mut out = s.alloc::<i32>(2 * k_max, "out").unwrap();
                s.fill_bytes(&mut out, 0xFF).unwrap();
                k.select_top_k(
                    &s,
                    &mut lg,
                    n_vocab,
                    &ag.view(),
                    k_max,
                    &mut out,
                    &mut scratch,
                )
                .unwrap();
                let what = format!("select n_vocab {n_vocab} style {style} k {kk}");
                let got = s.download(&out).unwrap();
                let got_ids: Vec<u32> = got[..kk].iter().map(|&i| i as u32).collect();
                assert_eq!(got_ids, want, "{what}: ids");
                let want_top: Vec<u32> =
                    want.iter().map(|&i| want_l[i as usize].to_bits()).collect();
                let got_top: Vec<u32> = got[kk..2 * kk].iter().map(|&b| b as u32).collect();
                assert_eq!(got_top, want_top, "{what}: logits");
                let got_l = s.download(&lg).unwrap();
                assert!(
                    got_l
                        .iter()
                        .zip(&want_l)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: penalized row"
                );
                cases += 1;
            }
        }
    }
    eprintln!("select_top_k: {cases} cases, ids and logits bit-exact");
    // Greedy over many blocks: the first of equal maxima in different
    // blocks' slices wins, a row of -inf gives id 0, and each launch
    // leaves the scratch as it found it (the same answer twice in a row).
    let n_vocab = 128256;
    let greedy = s.upload(&select_args(1, p0(), &[]), "a").unwrap();
    let mut out = s.alloc::<i32>(2, "o").unwrap();
    let mut row = vec![f32::NEG_INFINITY; n_vocab];
    for (ids, want) in [
        (vec![], 0),
        (vec![n_vocab - 1], n_vocab - 1),
        (vec![n_vocab - 1, 70000, 4096], 4096),
        (vec![5000, 4095], 4095),
    ] {
        for &i in &ids {
            row[i] = 3.5;
        }
        let mut lg = s.upload(&row, "logits").unwrap();
        for _ in 0..2 {
            s.fill_bytes(&mut out, 0xFF).unwrap();
            k.select_top_k(
                &s,
                &mut lg,
                n_vocab,
                &greedy.view(),
                1,
                &mut out,
                &mut scratch,
            )
            .unwrap();
            let got = s.download(&out).unwrap();
            assert_eq!(got[0] as usize, want, "argmax of 3.5 at {ids:?}");
            assert_eq!(got[1] as u32, row[want].to_bits(), "its logit");
        }
        for &i in &ids {
            row[i] = f32::NEG_INFINITY;
        }
    }
    let tail = s.download(&scratch).unwrap();
    assert_eq!(
        tail[SELECT_SCRATCH - 32],
        0,
        "the arrival counter is left zero"
    );
    // k_max out of range is refused.
    let mut lg = s.alloc::<f32>(10, "l").unwrap();
    let ag = s.upload(&select_args(1, p0(), &[]), "a").unwrap();
    let mut out = s.alloc::<i32>(4096, "o").unwrap();
    for bad in [0, 11, 2048] {
        assert!(k
            .select_top_k(&s, &mut lg, 10, &ag.view(), bad, &mut out, &mut scratch)
            .is_err());
    }
    // Arguments too short for their header, out too short for k_max, a
    // scratch too short.
    let short = s.alloc::<i32>(SELECT_ARGS - 1, "a").unwrap();
    assert!(k
        .select_top_k(&s, &mut lg, 10, &short.view(), 1, &mut out, &mut scratch)
        .is_err());
    let mut small = s.alloc::<i32>(3, "o").unwrap();
    assert!(k
        .select_top_k(&s, &mut lg, 10, &ag.view(), 2, &mut small, &mut scratch)
        .is_err());
    let mut short_scratch = s.alloc_zeroed::<i32>(SELECT_SCRATCH - 1, "s").unwrap();
    assert!(k
        .select_top_k(&s, &mut lg, 10, &ag.view(), 1, &mut out, &mut short_scratch)
        .is_err());
}

fn p0() -> Penalties {
    Penalties {
        repeat: 1.0,
        frequency: 0.0,
        presence: 0.0,
    }
}
