//! kernels/elementwise.cu: SwiGLU, GeGLU, add, scale, soft-cap, bias rows,
//! FP32 to FP16.

use super::*;

#[test]
#[ignore = "needs a GPU"]
fn swiglu_add_and_f16_match_cpu() {
    let (_dev, s, k, mut rng) = setup("swiglu_add_and_f16_match_cpu");
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

        let mut want = g.clone();
        ops::geglu(&mut want, &u);
        let mut gg = s.upload(&g, "g").unwrap();
        k.geglu(&s, &mut gg, &ug.view(), n).unwrap();
        check(
            &format!("geglu {n}"),
            &s.download(&gg).unwrap(),
            &want,
            |i| 1e-5 * want[i].abs() as f64 + 2e-5,
        );

        for (c, what) in [(0.37f32, "scale"), (30.0, "softcap"), (0.5, "softcap")] {
            let mut want = g.clone();
            let mut xg = s.upload(&g, "x").unwrap();
            if what == "scale" {
                want.iter_mut().for_each(|v| *v *= c);
                k.scale(&s, &mut xg, n, c).unwrap();
            } else {
                ops::softcap(&mut want, c);
                k.softcap(&s, &mut xg, n, c).unwrap();
            }
            check(
                &format!("{what} {c} {n}"),
                &s.download(&xg).unwrap(),
                &want,
                |i| 1e-6 * want[i].abs().max(1.0) as f64,
            );
        }
        assert!(k.softcap(&s, &mut gg, n, 0.0).is_err());

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
#[ignore = "needs a GPU"]
fn add_rows_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("add_rows_matches_cpu");
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

/// mistral3's attention temperature against `AttnTemperature::at`: one
/// sequence (pos[0] + t) and a batch (pos[t]), positions across several
/// floors; the rows past n_tok (poisoned) must stay as they were.
#[test]
#[ignore = "needs a GPU"]
fn attn_temperature_matches_cpu() {
    use m40_gguf::hparams::AttnTemperature;
    let (_dev, s, k, mut rng) = setup("attn_temperature_matches_cpu");
    for (n_tok, width, floor, per_token) in
        [(1, 128, 4, false), (37, 96, 8, false), (29, 160, 3, true)]
    {
        let t = AttnTemperature {
            scale: rng.uniform(0.05, 0.5),
            floor,
        };
        let pos: Vec<i32> = match per_token {
            true => (0..n_tok).map(|_| rng.uniform(0.0, 100.0) as i32).collect(),
            false => vec![rng.uniform(0.0, 50.0) as i32],
        };
        let x = rng.vec(n_tok * width, -3.0, 3.0);
        let tail = width + 5;
        let mut want = x.clone();
        for (i, v) in want.iter_mut().enumerate() {
            let row = i / width;
            let p = if per_token {
                pos[row]
            } else {
                pos[0] + row as i32
            };
            *v *= t.at(p as usize);
        }
        let mut buf = x.clone();
        buf.extend(std::iter::repeat_n(f32::NAN, tail));
        let mut xg = s.upload(&buf, "x").unwrap();
        let pg = s.upload(&pos, "pos").unwrap();
        k.attn_temperature(
            &s,
            &mut xg,
            &pg.view(),
            per_token,
            n_tok,
            width,
            t.scale,
            t.floor,
        )
        .unwrap();
        let got = s.download(&xg).unwrap();
        let what = format!("attn_temp {n_tok}x{width} floor {floor} per_token {per_token}");
        check(&what, &got[..n_tok * width], &want, |i| {
            2e-6 * want[i].abs() as f64
        });
        assert!(
            got[n_tok * width..].iter().all(|v| v.is_nan()),
            "{what}: wrote past n_tok rows"
        );
        assert!(k
            .attn_temperature(&s, &mut xg, &pg.view(), per_token, n_tok, width, t.scale, 0)
            .is_err());
    }
}
