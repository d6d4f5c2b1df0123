//! kernels/moe.cu and gemv.cu's gemv_id_*: a mixture's routing, experts'
//! GEMVs and weighted sum, against the CPU.

use super::*;

mod router;
mod tiles;
use m40_kernels::MoeShape;

/// Routing (softmax, top k, renormalized; with a router bias every other
/// case) of n tokens over E experts against m40-model's CPU `route`: the
/// same experts in the same order, weights within rounding; the experts'
/// GEMVs of every format (gate/up: slots read their token's row; down:
/// their own) against each chosen expert's CPU product, interleaved gate
/// and up with each activation, with and without gpt-oss's biases; the
/// biased activation of gate and up apart (`moe_glu`); the weighted sum in
/// slot order, with and without the down biases.
#[test]
#[ignore = "needs a GPU"]
fn moe_route_experts_and_combine_match_cpu() {
    let (_dev, s, k, mut rng) = setup("moe_route_experts_and_combine_match_cpu");
    for (ci, (n, e, kk)) in [
        (1, 8, 3),
        (5, 128, 8),
        (37, 4, 2),
        (3, 1000, 16),
        (2, 60, 60),
        (4, 32, 4),
    ]
    .into_iter()
    .enumerate()
    {
        let logits = rng.vec(n * e, -4.0, 4.0);
        let lg = s.upload(&logits, "logits").unwrap();
        let bias = (ci % 2 == 1).then(|| rng.vec(e, -2.0, 2.0));
        let bg = bias.as_ref().map(|b| s.upload(b, "bias").unwrap());
        let bv = bg.as_ref().map(|b| b.view());
        let shape = MoeShape { n, k: kk };
        let mut ids = s.alloc::<i32>(n * kk, "ids").unwrap();
        let mut w = s.alloc::<f32>(n * kk, "w").unwrap();
        s.fill_bytes(&mut ids, 0xFF).unwrap();
        s.fill_bytes(&mut w, 0xFF).unwrap();
        k.moe_route(&s, &lg.view(), bv.as_ref(), e, shape, &mut ids, &mut w)
            .unwrap();
        let (gi, gw) = (s.download(&ids).unwrap(), s.download(&w).unwrap());
        let mut want_w = Vec::new();
        for t in 0..n {
            let mut l = logits[t * e..(t + 1) * e].to_vec();
            if let Some(b) = &bias {
                l.iter_mut().zip(b).for_each(|(l, b)| *l += b);
            }
            let r = m40_model::cpu::route(&l, kk);
            let ids_t: Vec<i32> = r.iter().map(|&(i, _)| i as i32).collect();
            assert_eq!(
                &gi[t * kk..(t + 1) * kk],
                &ids_t[..],
                "route {n}x{e} k {kk}, token {t}"
            );
            want_w.extend(r.iter().map(|&(_, w)| w));
        }
        check(
            &format!("route weights {n}x{e} k {kk}"),
            &gw,
            &want_w,
            |i| 2e-6 * want_w[i].abs() as f64 + 1e-7,
        );
    }
    assert!(k
        .moe_route(
            &s,
            &s.upload(&[0f32; 4], "l").unwrap().view(),
            None,
            4,
            MoeShape { n: 1, k: 5 },
            &mut s.alloc(5, "i").unwrap(),
            &mut s.alloc(5, "w").unwrap()
        )
        .is_err());

    // The experts' GEMVs: n tokens x kk slots over n_mat experts.
    for f in KernelFormat::ALL {
        let (n, kk, n_mat) = (3usize, 2usize, 5usize);
        let (rows, cols) = if f.qk == 256 { (36, 512) } else { (36, 96) };
        let w = random_weights(&mut rng, f.ty, n_mat * rows, cols);
        let wg = s.upload(&w, "experts").unwrap();
        let dense = dequant(f.ty, &w, n_mat * rows, cols);
        let ids: Vec<i32> = (0..n * kk).map(|_| rng.below(n_mat) as i32).collect();
        let idg = s.upload(&ids, "ids").unwrap();
        for x_per in [kk, 1] {
            let x = rng.vec((n * kk).div_ceil(x_per) * cols, -1.0, 1.0);
            let xg = s.upload(&x, "x").unwrap();
            let mut y = s.alloc::<f32>(n * kk * rows, "y").unwrap();
            s.fill_bytes(&mut y, 0xFF).unwrap();
            let m = QMatrix {
                ty: f.ty,
                data: &wg.view(),
                rows: n_mat * rows,
                cols,
            };
            k.gemv_experts(
                &s,
                &m,
                rows,
                &idg.view(),
                &xg.view(),
                x_per,
                &mut y,
                MoeShape { n, k: kk },
                None,
            )
            .unwrap();
            let (want, mag) = experts_reference(&dense, &x, &ids, rows, cols, x_per);
            check(
                &format!("gemv_experts {} x_per {x_per}", f.ty),
                &s.download(&y).unwrap(),
                &want,
                |i| 1e-5 * mag[i] + 1e-30,
            );
            if x_per != kk {
                continue;
            }
            // Each expert's first half of rows as a gate and second as an
            // up, interleaved: one launch gives silu(gate) * up.
            let (half, row_b) = (rows / 2, w.len() / (n_mat * rows));
            let mut glu = Vec::new();
            for e in 0..n_mat {
                let m = &w[e * rows * row_b..(e + 1) * rows * row_b];
                let (g, u) = m.split_at(half * row_b);
                glu.extend(m40_kernels::interleave_glu(g, u, half).unwrap());
            }
            let gg = s.upload(&glu, "interleaved experts").unwrap();
            let m = QMatrix {
                ty: f.ty,
                data: &gg.view(),
                rows: n_mat * rows,
                cols,
            };
            let (gb, ub) = (
                rng.vec(n_mat * half, -8.0, 8.0),
                rng.vec(n_mat * half, -8.0, 8.0),
            );
            let (gbg, ubg) = (s.upload(&gb, "gb").unwrap(), s.upload(&ub, "ub").unwrap());
            let (gbv, ubv) = (gbg.view(), ubg.view());
            use m40_gguf::hparams::Activation;
            for (act, biased) in [
                (Activation::Silu, false),
                (Activation::GeluTanh, false),
                (Activation::SwigluOai, true),
                (Activation::Silu, true),
            ] {
                let mut yg = s.alloc::<f32>(n * kk * half, "y").unwrap();
                s.fill_bytes(&mut yg, 0xFF).unwrap();
                let glu = m40_kernels::ExpertGlu {
                    act,
                    bias: biased.then_some([&gbv, &ubv]),
                };
                k.gemv_experts(
                    &s,
                    &m,
                    rows,
                    &idg.view(),
                    &xg.view(),
                    kk,
                    &mut yg,
                    MoeShape { n, k: kk },
                    Some(glu),
                )
                .unwrap();
                let (want_g, tol) =
                    glu_reference(&want, &mag, &ids, rows, act, biased.then_some((&gb, &ub)));
                check(
                    &format!("gemv_experts glu {} {act:?} biased {biased}", f.ty),
                    &s.download(&yg).unwrap(),
                    &want_g,
                    |i| tol[i],
                );
                // The same from gate and up apart (moe_glu, biased only).
                if !biased {
                    continue;
                }
                let (mut g, mut u) = (Vec::new(), Vec::new());
                for j in 0..n * kk {
                    g.extend(&want[j * rows..j * rows + half]);
                    u.extend(&want[j * rows + half..(j + 1) * rows]);
                }
                let mut g_dev = s.upload(&g, "g").unwrap();
                let u_dev = s.upload(&u, "u").unwrap();
                k.moe_glu(
                    &s,
                    act,
                    &mut g_dev,
                    &u_dev.view(),
                    &idg.view(),
                    [&gbv, &ubv],
                    half,
                    MoeShape { n, k: kk },
                )
                .unwrap();
                check(
                    &format!("moe_glu {} {act:?}", f.ty),
                    &s.download(&g_dev).unwrap(),
                    &want_g,
                    |i| tol[i],
                );
            }
        }
    }

    // The weighted sum, in slot order, each product rounded then added.
    let (n, kk, d) = (7, 3, 300);
    let y = rng.vec(n * kk * d, -2.0, 2.0);
    let wv = rng.vec(n * kk, 0.0, 1.0);
    let want: Vec<f32> = (0..n * d)
        .map(|i| {
            let (t, c) = (i / d, i % d);
            (0..kk).fold(0f32, |acc, j| {
                acc + wv[t * kk + j] * y[(t * kk + j) * d + c]
            })
        })
        .collect();
    let (yg, wg) = (s.upload(&y, "y").unwrap(), s.upload(&wv, "w").unwrap());
    let mut out = s.alloc::<f32>(n * d, "out").unwrap();
    s.fill_bytes(&mut out, 0xFF).unwrap();
    k.moe_combine(
        &s,
        &yg.view(),
        &wg.view(),
        None,
        &mut out,
        d,
        MoeShape { n, k: kk },
    )
    .unwrap();
    check("moe_combine", &s.download(&out).unwrap(), &want, |_| 0.0);
    // With each slot's expert's down bias added to its output first.
    let n_mat = 5;
    let ids: Vec<i32> = (0..n * kk).map(|_| rng.below(n_mat) as i32).collect();
    let b = rng.vec(n_mat * d, -1.0, 1.0);
    let want: Vec<f32> = (0..n * d)
        .map(|i| {
            let (t, c) = (i / d, i % d);
            (0..kk).fold(0f32, |acc, j| {
                let sl = t * kk + j;
                acc + wv[sl] * (y[sl * d + c] + b[ids[sl] as usize * d + c])
            })
        })
        .collect();
    let (ig, bg) = (s.upload(&ids, "ids").unwrap(), s.upload(&b, "b").unwrap());
    s.fill_bytes(&mut out, 0xFF).unwrap();
    k.moe_combine(
        &s,
        &yg.view(),
        &wg.view(),
        Some((&ig.view(), &bg.view())),
        &mut out,
        d,
        MoeShape { n, k: kk },
    )
    .unwrap();
    check(
        "moe_combine biased",
        &s.download(&out).unwrap(),
        &want,
        |_| 0.0,
    );
}

/// act(gate + gb) * (up + ub) of each slot from the experts' exact
/// products (`want`, slots of `rows`: gate rows, then up rows), with the
/// slot's expert's biases where given; and a tolerance from the products'
/// magnitudes (`mag`) through the activation's slope.
/// Each slot j's expert ids[j] (rows of `dense`, `rows` an expert) times
/// x row j / x_per in f64, and the sums of the products' magnitudes.
/// `ids` uploaded and their slots grouped by expert on the device
/// (`moe_tiles`, tiles of up to `cap`): the ids, the order and the tiles.
pub(super) fn grouped_slots(
    s: &Stream,
    k: &Kernels,
    ids: &[i32],
    n_mat: usize,
    cap: usize,
) -> [DeviceBuffer<i32>; 3] {
    let slots = ids.len();
    let idg = s.upload(ids, "ids").unwrap();
    let mut order = s.alloc::<i32>(slots, "order").unwrap();
    let bound = m40_kernels::moe_tile_bound(slots, n_mat, cap);
    let mut tiles = s.alloc::<i32>(1 + 2 * bound, "tiles").unwrap();
    k.moe_tiles(s, &idg.view(), n_mat, cap, &mut order, &mut tiles, None)
        .unwrap();
    [idg, order, tiles]
}

pub(super) fn experts_reference(
    dense: &[f32],
    x: &[f32],
    ids: &[i32],
    rows: usize,
    cols: usize,
    x_per: usize,
) -> (Vec<f32>, Vec<f64>) {
    let (mut want, mut mag) = (Vec::new(), Vec::new());
    for (j, &e) in ids.iter().enumerate() {
        let xr = &x[(j / x_per) * cols..][..cols];
        for r in 0..rows {
            let wr = &dense[(e as usize * rows + r) * cols..][..cols];
            let p = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64);
            want.push(p.clone().sum::<f64>() as f32);
            mag.push(p.map(f64::abs).sum::<f64>());
        }
    }
    (want, mag)
}

fn glu_reference(
    want: &[f32],
    mag: &[f64],
    ids: &[i32],
    rows: usize,
    act: m40_gguf::hparams::Activation,
    bias: Option<(&Vec<f32>, &Vec<f32>)>,
) -> (Vec<f32>, Vec<f64>) {
    let half = rows / 2;
    let (mut out, mut tol) = (Vec::new(), Vec::new());
    for (j, &e) in ids.iter().enumerate() {
        for i in 0..half {
            let (mut g, mut u) = (want[j * rows + i], want[j * rows + half + i]);
            if let Some((gb, ub)) = bias {
                g += gb[e as usize * half + i];
                u += ub[e as usize * half + i];
            }
            let (mut gv, uv) = ([g], [u]);
            m40_model::cpu::ops::glu(act, &mut gv, &uv);
            let (mg, mu) = (mag[j * rows + i], mag[j * rows + half + i]);
            // |d act/dg| <= 1.2 (SwiGLU, GeGLU) and 2.1 (clamped SwiGLU at
            // 7, times up + 1 <= 8); |d act/du| <= |act(g)| (+ 1 bound).
            let slope = (u.abs() as f64 + 1.0) * 2.2;
            tol.push(
                2e-5 * (mg * slope + (gv[0].abs() as f64 + 8.0) * mu)
                    + 1e-6 * gv[0].abs() as f64
                    + 1e-30,
            );
            out.push(gv[0]);
        }
    }
    (out, tol)
}

/// The experts' GEMVs over packed matrices (`gemv_packed_experts`), every
/// packed format: each expert packed on its own, slots reading their
/// token's row and their own, an id past the experts (clamped to the
/// last), against the CPU's product of the dequantized rows; interleaved
/// gate and up with SwiGLU and GeGLU, and with gpt-oss's clamped SwiGLU
/// and biases (in the stack's row order). Each case a slot a block row
/// and grouped by expert (`moe_tiles`: tiles of 1, 2, 3 to 4 and 5 to 8
/// slots, one expert's slots over several tiles in the lopsided case).
/// Outputs poisoned, nothing written past y; shapes it refuses.
#[test]
#[ignore = "needs a GPU"]
fn packed_experts_match_cpu() {
    let (_dev, s, k, mut rng) = setup("packed_experts_match_cpu");
    use m40_gguf::hparams::Activation;
    use m40_kernels::{ExpertTiles, PackFormat, PackedMatrix};
    const TAIL: usize = 8;
    for (f, n) in PackFormat::ALL
        .into_iter()
        .flat_map(|f| [(f, 3usize), (f, 13)])
    {
        let (kk, n_mat, rows) = (2usize, 5usize, 36usize);
        let cols = if f.qk == 256 { 512 } else { 128 };
        assert!(f.takes_experts(rows, cols), "{}", f.ty);
        let w = random_weights(&mut rng, f.ty, n_mat * rows, cols);
        let dense = dequant(f.ty, &w, n_mat * rows, cols);
        let row_b = w.len() / (n_mat * rows);
        // 13 tokens: expert 0 takes 11 or more slots (two tiles).
        let mut ids: Vec<i32> = (0..n * kk)
            .map(|j| match n > 3 && j % 2 == 0 && j < 22 {
                true => 0,
                false => rng.below(n_mat) as i32,
            })
            .collect();
        ids[1] = n_mat as i32 + 3;
        let clamped: Vec<i32> = ids.iter().map(|&e| e.min(n_mat as i32 - 1)).collect();
        let cap = m40_kernels::MOE_GEMV_TILE;
        let [idg, order, tiles] = grouped_slots(&s, &k, &ids, n_mat, cap);
        let (order, tiles) = (order.view(), tiles.view());
        let grouped = ExpertTiles {
            order: &order,
            tiles: &tiles,
            cap,
        };
        // Each expert's matrix packed on its own (optionally its halves
        // interleaved as gate and up first).
        let pack = |glu: bool| -> Vec<u8> {
            let mut out = Vec::new();
            for e in 0..n_mat {
                let m = &w[e * rows * row_b..(e + 1) * rows * row_b];
                let m = match glu {
                    true => {
                        let (g, u) = m.split_at(rows / 2 * row_b);
                        m40_kernels::interleave_glu(g, u, rows / 2).unwrap()
                    }
                    false => m.to_vec(),
                };
                out.extend(pack_gemv(f.ty, &m, rows, cols).unwrap());
            }
            out
        };
        for x_per in [kk, 1] {
            let x = rng.vec((n * kk).div_ceil(x_per) * cols, -1.0, 1.0);
            let xg = s.upload(&x, "x").unwrap();
            let (want, mag) = experts_reference(&dense, &x, &clamped, rows, cols, x_per);
            let acts: &[(Option<Activation>, bool)] = match x_per == kk {
                true => &[
                    (None, false),
                    (Some(Activation::Silu), false),
                    (Some(Activation::GeluTanh), false),
                    (Some(Activation::SwigluOai), true),
                ],
                false => &[(None, false)],
            };
            // Each expert's gate and up biases, and both in the row order
            // of its interleaved stack (gate 2i, 2i + 1, up 2i, 2i + 1).
            let half = rows / 2;
            let (gb, ub) = (
                rng.vec(n_mat * half, -2.0, 2.0),
                rng.vec(n_mat * half, -2.0, 2.0),
            );
            let stacked: Vec<f32> = (0..n_mat * half / 2)
                .flat_map(|p| [gb[2 * p], gb[2 * p + 1], ub[2 * p], ub[2 * p + 1]])
                .collect();
            let bg = s.upload(&stacked, "biases").unwrap();
            for (&(act, biased), tiles) in acts.iter().flat_map(|a| [(a, None), (a, Some(grouped))])
            {
                let wg = s.upload(&pack(act.is_some()), "packed experts").unwrap();
                let m = PackedMatrix {
                    ty: f.ty,
                    data: &wg.view(),
                    rows: n_mat * rows,
                    cols,
                };
                let out = if act.is_some() { rows / 2 } else { rows };
                let mut y = s.alloc::<f32>(n * kk * out + TAIL, "y").unwrap();
                s.fill_bytes(&mut y, 0xFF).unwrap();
                let shape = MoeShape { n, k: kk };
                k.gemv_packed_experts(
                    &s,
                    &m,
                    rows,
                    &idg.view(),
                    &xg.view(),
                    x_per,
                    &mut y,
                    shape,
                    act,
                    biased.then(|| bg.view()).as_ref(),
                    tiles,
                )
                .unwrap();
                let got = s.download(&y).unwrap();
                let what = format!(
                    "gemv_packed_experts {} n {n} x_per {x_per} {act:?} {biased} grouped {}",
                    f.ty,
                    tiles.is_some()
                );
                match act {
                    None => check(&what, &got[..n * kk * rows], &want, |i| {
                        1e-5 * mag[i] + 1e-30
                    }),
                    Some(a) => {
                        let bias = biased.then_some((&gb, &ub));
                        let (want_g, tol) = glu_reference(&want, &mag, &clamped, rows, a, bias);
                        check(&what, &got[..n * kk * out], &want_g, |i| tol[i]);
                    }
                }
                assert!(
                    got[n * kk * out..].iter().all(|v| v.to_bits() == u32::MAX),
                    "{what}: wrote past y"
                );
            }
        }
        // Matrices of rows not in groups of 4: refused.
        let wg = s.upload(&pack(false), "packed experts").unwrap();
        let m = PackedMatrix {
            ty: f.ty,
            data: &wg.view(),
            rows: n_mat * rows,
            cols,
        };
        let x = s.upload(&vec![0f32; n * kk * cols], "x").unwrap();
        let mut y = s.alloc::<f32>(n * kk * rows, "y").unwrap();
        let shape = MoeShape { n, k: kk };
        assert!(k
            .gemv_packed_experts(
                &s,
                &m,
                rows / 2 - 1,
                &idg.view(),
                &x.view(),
                1,
                &mut y,
                shape,
                None,
                None,
                None
            )
            .is_err());
    }
}

/// `moe_gather`: rows gathered by index, each index divided by `div` (a
/// prefill's slots reading their tokens' rows, div k; and back, div 1),
/// an index past x's rows clamped to its last; every element exact, the
/// output poisoned before.
#[test]
#[ignore = "needs a GPU"]
fn moe_gather_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("moe_gather_matches_cpu");
    for (src_rows, d, div, n) in [(7, 64, 3, 21), (40, 2048, 8, 320), (5, 32, 1, 9)] {
        let x = rng.vec(src_rows * d, -4.0, 4.0);
        let mut idx: Vec<i32> = (0..n).map(|_| rng.below(src_rows * div) as i32).collect();
        // One index past x's rows: read as its last row.
        idx[n - 1] = (src_rows * div + 5) as i32;
        let want: Vec<f32> = idx
            .iter()
            .flat_map(|&i| {
                let r = (i as usize / div).min(src_rows - 1);
                x[r * d..(r + 1) * d].to_vec()
            })
            .collect();
        let xg = s.upload(&x, "x").unwrap();
        let ig = s.upload(&idx, "idx").unwrap();
        let mut y = s.alloc::<f32>(n * d, "y").unwrap();
        s.fill_bytes(&mut y, 0xFF).unwrap();
        k.moe_gather(&s, &xg.view(), &ig.view(), div, &mut y, d)
            .unwrap();
        let got = s.download(&y).unwrap();
        check(
            &format!("moe_gather {n} rows of {d}, div {div}"),
            &got,
            &want,
            |_| 0.0,
        );
    }
}

/// `moe_glu_pairs`: gpt-oss's gate and up biases and activation after the
/// grouped GEMMs, in the packed stack's column order (gate 2i, 2i + 1, up
/// 2i, 2i + 1), each row's expert's biases (an id past the experts clamped
/// to the last), every activation, against the CPU's `glu` of the same
/// sums (added in FP32 as the kernel adds them), the output poisoned
/// before, nothing written past it; shapes it refuses.
#[test]
#[ignore = "needs a GPU"]
fn moe_glu_pairs_match_cpu() {
    use m40_gguf::hparams::Activation;
    let (_dev, s, k, mut rng) = setup("moe_glu_pairs_match_cpu");
    for (rows, f, e) in [(7, 4, 3), (40, 768, 128), (33, 2880, 32)] {
        for act in [
            Activation::Silu,
            Activation::GeluTanh,
            Activation::SwigluOai,
        ] {
            let gu = rng.vec(rows * 2 * f, -9.0, 9.0);
            let b = rng.vec(e * 2 * f, -2.0, 2.0);
            let mut ids: Vec<i32> = (0..rows).map(|_| rng.below(e) as i32).collect();
            ids[rows / 2] = (e + 4) as i32;
            let mut want = Vec::with_capacity(rows * f);
            for (r, &id) in ids.iter().enumerate() {
                let eb = &b[(id as usize).min(e - 1) * 2 * f..][..2 * f];
                let g = &gu[r * 2 * f..][..2 * f];
                for i in 0..f {
                    // Column i of the output: pair i / 2, lane i % 2.
                    let (c, l) = (4 * (i / 2), i % 2);
                    let mut gv = [g[c + l] + eb[c + l]];
                    let uv = [g[c + 2 + l] + eb[c + 2 + l]];
                    m40_model::cpu::ops::glu(act, &mut gv, &uv);
                    want.push(gv[0]);
                }
            }
            let (gg, bg, ig) = (
                s.upload(&gu, "gu").unwrap(),
                s.upload(&b, "biases").unwrap(),
                s.upload(&ids, "ids").unwrap(),
            );
            let mut out = s.alloc::<f32>(rows * f + 8, "out").unwrap();
            s.fill_bytes(&mut out, 0xFF).unwrap();
            k.moe_glu_pairs(
                &s,
                act,
                &gg.view(),
                &mut out,
                &ig.view(),
                &bg.view(),
                rows,
                f,
            )
            .unwrap();
            let got = s.download(&out).unwrap();
            let what = format!("moe_glu_pairs {rows} rows of {f}, {e} experts, {act:?}");
            check(&what, &got[..rows * f], &want, |i| {
                1e-5 * (want[i].abs() as f64 + 1.0)
            });
            assert!(
                got[rows * f..].iter().all(|v| v.to_bits() == u32::MAX),
                "{what}: wrote past out"
            );
            // Odd widths and biases not whole rows are refused.
            let short = bg.slice(0..2 * f - 4).unwrap();
            assert!(k
                .moe_glu_pairs(&s, act, &gg.view(), &mut out, &ig.view(), &short, rows, f)
                .is_err());
            assert!(k
                .moe_glu_pairs(
                    &s,
                    act,
                    &gg.view(),
                    &mut out,
                    &ig.view(),
                    &bg.view(),
                    rows,
                    f - 1
                )
                .is_err());
        }
    }
}
