//! kernels/rmsnorm.cu: RMSNorm and LayerNorm, and the residual add with
//! them.

use super::*;
use m40_gguf::NormKind;
use m40_kernels::{AddResidual, PostNorm};

#[test]
#[ignore = "needs a GPU"]
fn rmsnorm_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("rmsnorm_matches_cpu");
    for (kind, (rows, n)) in [NormKind::Rms, NormKind::Layer]
        .into_iter()
        .flat_map(|kind| {
            [(1, 1), (3, 31), (17, 576), (5, 4097), (2, 14336)].map(|shape| (kind, shape))
        })
    {
        // LayerNorm's rows sit off zero, so its mean matters.
        let offset = if kind == NormKind::Layer { 3.0 } else { 0.0 };
        let x: Vec<f32> = rng
            .vec(rows * n, -2.0, 2.0)
            .iter()
            .map(|v| v + offset)
            .collect();
        let w = rng.vec(n, -1.5, 1.5);
        let eps = 1e-5;
        // Relative, and absolute for values near 0 (LayerNorm's centered
        // ones carry the rounding of the mean).
        let floor = if kind == NormKind::Layer { 2e-6 } else { 1e-7 };
        let mut want = x.clone();
        ops::norm(kind, &mut want, &w, eps);
        let xg = s.upload(&x, "x").unwrap();
        let wg = s.upload(&w, "w").unwrap();
        let mut y = s.alloc::<f32>(rows * n, "y").unwrap();
        s.fill_bytes(&mut y, 0xFF).unwrap();
        k.norm(&s, kind, &xg.view(), &wg.view(), &mut y, rows, eps)
            .unwrap();
        let got = s.download(&y).unwrap();
        check(&format!("{kind:?} norm {rows}x{n}"), &got, &want, |i| {
            2e-5 * want[i].abs() as f64 + floor
        });

        // The fused residual form: x += d (checked exactly), y = norm(x).
        let d = rng.vec(rows * n, -1.0, 1.0);
        let sum: Vec<f32> = x.iter().zip(&d).map(|(a, b)| a + b).collect();
        let mut want = sum.clone();
        ops::norm(kind, &mut want, &w, eps);
        let mut xg = s.upload(&x, "x").unwrap();
        let dg = s.upload(&d, "d").unwrap();
        s.fill_bytes(&mut y, 0xFF).unwrap();
        k.add_norm(
            &s,
            kind,
            AddResidual {
                x: &mut xg,
                d: &dg.view(),
                post: None,
            },
            &wg.view(),
            &mut y,
            rows,
            eps,
        )
        .unwrap();
        let got = s.download(&y).unwrap();
        check(&format!("{kind:?} add_norm {rows}x{n}"), &got, &want, |i| {
            2e-5 * want[i].abs() as f64 + floor
        });
        let got_x = s.download(&xg).unwrap();
        check(
            &format!("{kind:?} add_norm {rows}x{n} x"),
            &got_x,
            &sum,
            |_| 0.0,
        );

        // With the branch post-normed and scaled first (gemma's post-norms):
        // x += rmsnorm(d) * pw * ps, y = norm(x).
        let pw = rng.vec(n, -1.5, 1.5);
        let ps = 0.75f32;
        let mut dn = d.clone();
        ops::norm(NormKind::Rms, &mut dn, &pw, eps);
        let sum: Vec<f32> = x.iter().zip(&dn).map(|(a, b)| a + b * ps).collect();
        let mut want = sum.clone();
        ops::norm(kind, &mut want, &w, eps);
        let mut xg = s.upload(&x, "x").unwrap();
        let pwg = s.upload(&pw, "pw").unwrap();
        s.fill_bytes(&mut y, 0xFF).unwrap();
        k.add_norm(
            &s,
            kind,
            AddResidual {
                x: &mut xg,
                d: &dg.view(),
                post: Some(PostNorm {
                    w: &pwg.view(),
                    scale: ps,
                }),
            },
            &wg.view(),
            &mut y,
            rows,
            eps,
        )
        .unwrap();
        let got_x = s.download(&xg).unwrap();
        let x_tol = |i: usize| 2e-5 * (dn[i] * ps).abs() as f64 + 1e-6;
        check(
            &format!("{kind:?} add_norm post {rows}x{n} x"),
            &got_x,
            &sum,
            x_tol,
        );
        // y's error: the norm's own, and x's carried through its scale (a
        // sum near zero keeps x's absolute error, not a relative one).
        let row_scale: Vec<f64> = sum
            .chunks(n)
            .map(|r| {
                let c = match kind {
                    NormKind::Layer => r.iter().map(|v| *v as f64).sum::<f64>() / n as f64,
                    NormKind::Rms => 0.0,
                };
                let var = r.iter().map(|v| (*v as f64 - c).powi(2)).sum::<f64>() / n as f64;
                1.0 / (var + eps as f64).sqrt()
            })
            .collect();
        let got = s.download(&y).unwrap();
        check(
            &format!("{kind:?} add_norm post {rows}x{n}"),
            &got,
            &want,
            |i| {
                4e-5 * want[i].abs() as f64
                    + floor
                    + row_scale[i / n] * w[i % n].abs() as f64 * x_tol(i)
            },
        );

        // In place (qwen3's head norms), in a buffer longer than the rows:
        // the tail, poisoned, stays as it was.
        let mut buf = x.clone();
        buf.extend(std::iter::repeat_n(f32::from_bits(0x7fc0_dead), 7));
        let mut xg = s.upload(&buf, "x").unwrap();
        k.norm_in_place(&s, kind, &mut xg, &wg.view(), n, rows, eps)
            .unwrap();
        let got = s.download(&xg).unwrap();
        let mut want = x.clone();
        ops::norm(kind, &mut want, &w, eps);
        check(
            &format!("{kind:?} norm_in_place {rows}x{n}"),
            &got[..rows * n],
            &want,
            |i| 2e-5 * want[i].abs() as f64 + floor,
        );
        assert!(
            got[rows * n..].iter().all(|v| v.to_bits() == 0x7fc0_dead),
            "{kind:?} norm_in_place {rows}x{n}: wrote past its rows"
        );
    }
}

/// The head norms with weights per head (command-r+: (head_dim, heads))
/// and shared (qwen3: one head's), RMS and LayerNorm, against the CPU's
/// head_norm: 5 tokens of 6 heads.
#[test]
#[ignore = "needs a GPU"]
fn head_norm_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("head_norm_matches_cpu");
    let (tokens, heads) = (5, 6);
    for kind in [NormKind::Rms, NormKind::Layer] {
        for hd in [16, 64, 128] {
            for w_heads in [1, heads] {
                let x: Vec<f32> = rng
                    .vec(tokens * heads * hd, -2.0, 2.0)
                    .iter()
                    .map(|v| v + 1.0)
                    .collect();
                let w = rng.vec(w_heads * hd, -1.5, 1.5);
                let eps = 1e-5;
                let mut want = x.clone();
                ops::head_norm(kind, &mut want, &w, hd, eps);
                let mut xg = s.upload(&x, "x").unwrap();
                let wg = s.upload(&w, "w").unwrap();
                k.norm_in_place(&s, kind, &mut xg, &wg.view(), hd, tokens * heads, eps)
                    .unwrap();
                let got = s.download(&xg).unwrap();
                let what = format!("{kind:?} head_norm hd {hd}, weights of {w_heads} heads");
                check(&what, &got, &want, |i| 2e-5 * want[i].abs() as f64 + 2e-6);
            }
        }
    }
}
