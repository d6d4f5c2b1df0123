//! kernels/embed.cu: the embedding gather of every format, plain and packed.

use super::*;

#[test]
#[ignore = "needs a GPU"]
fn embed_every_format_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("embed_every_format_matches_cpu");
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
                    // The kernels flush denormals to zero: MXFP4's scales
                    // of e = 0 and 1 (2^-128, 2^-127) read as 0 before the
                    // multiply, so a level (at most 12) times them, below
                    // 8 * 2^-126, reads 0.
                    |i| {
                        (1e-6 * (want[i].abs() as f64 + row_max[i / cols]))
                            .max(8.0 * f32::MIN_POSITIVE as f64)
                    },
                );
            }
        }
    }
}
