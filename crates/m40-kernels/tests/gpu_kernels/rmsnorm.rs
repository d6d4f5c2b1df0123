//! kernels/rmsnorm.cu: RMSNorm and the residual add with it.

use super::*;
use m40_kernels::AddResidual;

#[test]
#[ignore = "needs a GPU"]
fn rmsnorm_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("rmsnorm_matches_cpu");
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
        k.add_rmsnorm(
            &s,
            AddResidual {
                x: &mut xg,
                d: &dg.view(),
            },
            &wg.view(),
            &mut y,
            rows,
            eps,
        )
        .unwrap();
        let got = s.download(&y).unwrap();
        check(&format!("add_rmsnorm {rows}x{n}"), &got, &want, |i| {
            2e-5 * want[i].abs() as f64 + 1e-7
        });
        let got_x = s.download(&xg).unwrap();
        check(&format!("add_rmsnorm {rows}x{n} x"), &got_x, &sum, |_| 0.0);

        // In place (qwen3's head norms), in a buffer longer than the rows:
        // the tail, poisoned, stays as it was.
        let mut buf = x.clone();
        buf.extend(std::iter::repeat_n(f32::from_bits(0x7fc0_dead), 7));
        let mut xg = s.upload(&buf, "x").unwrap();
        k.rmsnorm_in_place(&s, &mut xg, &wg.view(), rows, eps)
            .unwrap();
        let got = s.download(&xg).unwrap();
        let mut want = x.clone();
        ops::rmsnorm(&mut want, &w, eps);
        check(
            &format!("rmsnorm_in_place {rows}x{n}"),
            &got[..rows * n],
            &want,
            |i| 2e-5 * want[i].abs() as f64 + 1e-7,
        );
        assert!(
            got[rows * n..].iter().all(|v| v.to_bits() == 0x7fc0_dead),
            "rmsnorm_in_place {rows}x{n}: wrote past its rows"
        );
    }
}
