//! kernels/moe.cu and gemv.cu's gemv_id_*: a mixture's routing, experts'
//! GEMVs and weighted sum, against the CPU.

use super::*;
use m40_kernels::MoeShape;

/// Routing (softmax, top k, renormalized) of n tokens over E experts
/// against m40-model's CPU `route`: the same experts in the same order,
/// weights within rounding; the experts' GEMVs of every format (gate/up:
/// slots read their token's row; down: their own) against each chosen
/// expert's CPU product; the weighted sum in slot order.
#[test]
#[ignore = "needs a GPU"]
fn moe_route_experts_and_combine_match_cpu() {
    let (_dev, s, k, mut rng) = setup("moe_route_experts_and_combine_match_cpu");
    for (n, e, kk) in [
        (1, 8, 3),
        (5, 128, 8),
        (37, 4, 2),
        (3, 1000, 16),
        (2, 60, 60),
    ] {
        let logits = rng.vec(n * e, -4.0, 4.0);
        let lg = s.upload(&logits, "logits").unwrap();
        let shape = MoeShape { n, k: kk };
        let mut ids = s.alloc::<i32>(n * kk, "ids").unwrap();
        let mut w = s.alloc::<f32>(n * kk, "w").unwrap();
        s.fill_bytes(&mut ids, 0xFF).unwrap();
        s.fill_bytes(&mut w, 0xFF).unwrap();
        k.moe_route(&s, &lg.view(), e, shape, &mut ids, &mut w)
            .unwrap();
        let (gi, gw) = (s.download(&ids).unwrap(), s.download(&w).unwrap());
        let mut want_w = Vec::new();
        for t in 0..n {
            let r = m40_model::cpu::route(&logits[t * e..(t + 1) * e], kk);
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
                false,
            )
            .unwrap();
            let (mut want, mut mag) = (Vec::new(), Vec::new());
            for (j, &e) in ids.iter().enumerate() {
                let xr = &x[(j / x_per) * cols..][..cols];
                for r in 0..rows {
                    let wr = &dense[(e as usize * rows + r) * cols..][..cols];
                    want.push(
                        wr.iter()
                            .zip(xr)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>() as f32,
                    );
                    mag.push(
                        wr.iter()
                            .zip(xr)
                            .map(|(a, b)| (*a as f64 * *b as f64).abs())
                            .sum::<f64>(),
                    );
                }
            }
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
            let mut yg = s.alloc::<f32>(n * kk * half, "y").unwrap();
            s.fill_bytes(&mut yg, 0xFF).unwrap();
            let m = QMatrix {
                ty: f.ty,
                data: &gg.view(),
                rows: n_mat * rows,
                cols,
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
                true,
            )
            .unwrap();
            let silu = |v: f64| v / (1.0 + (-v).exp());
            let (mut want_g, mut tol) = (Vec::new(), Vec::new());
            for j in 0..n * kk {
                for i in 0..half {
                    let (g, u) = (want[j * rows + i] as f64, want[j * rows + half + i] as f64);
                    let (mg, mu) = (mag[j * rows + i], mag[j * rows + half + i]);
                    want_g.push((silu(g) * u) as f32);
                    tol.push(2e-5 * (mg * u.abs() * 1.2 + silu(g).abs() * mu) + 1e-30);
                }
            }
            check(
                &format!("gemv_experts glu {}", f.ty),
                &s.download(&yg).unwrap(),
                &want_g,
                |i| tol[i],
            );
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
        &mut out,
        d,
        MoeShape { n, k: kk },
    )
    .unwrap();
    check("moe_combine", &s.download(&out).unwrap(), &want, |_| 0.0);
}
