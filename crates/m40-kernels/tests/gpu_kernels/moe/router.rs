//! kernels/moe.cu's routers: one token's (`moe_router_f32`, with the FFN
//! norm and the routing in its launch) and several tokens'
//! (`moe_router_n_f32`), against f64 products; and the weighted sum that
//! folds the next norm (`moe_combine_fold_f32`).

use super::super::*;
use m40_kernels::{RouterNorm, RouterRoute, MOE_ROUTER_TOKENS};

/// W x for token t of x (n, cols) and W (rows, cols): each row's f64 sum
/// (as f32) and the sum of its products' magnitudes (for the tolerance).
fn router_cpu(w: &[f32], x: &[f32], rows: usize, cols: usize) -> (Vec<f32>, Vec<f64>) {
    let n = x.len() / cols;
    (0..n * rows)
        .map(|i| {
            let (t, r) = (i / rows, i % rows);
            let (row, xt) = (&w[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
            let d: f64 = row.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
            let m: f64 = row
                .iter()
                .zip(xt)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            (d as f32, m)
        })
        .unzip()
}

/// A random F32 router of rows x cols: its values and the uploaded bytes.
fn random_router(
    s: &Stream,
    rng: &mut Rng,
    rows: usize,
    cols: usize,
) -> (Vec<f32>, DeviceBuffer<u8>) {
    let w = rng.vec(rows * cols, -1.0, 1.0);
    let wg = s
        .upload(bytemuck::cast_slice::<f32, u8>(&w), "router")
        .unwrap();
    (w, wg)
}

/// An F32 router's matrix over `data`.
fn router_matrix<'a>(data: &'a DeviceView<'a, u8>, rows: usize, cols: usize) -> QMatrix<'a> {
    QMatrix {
        ty: GgmlType::F32,
        data,
        rows,
        cols,
    }
}

/// The router of one token (`moe_router`: a block a row) against an f64
/// product: routers of 1 to 1024 rows, row lengths of 4 to 4100 (a last
/// round of partial float4s), output poisoned before (what it refuses:
/// with the router of several tokens below).
/// Then with the FFN norm and the routing in the launch (the one-token
/// path): h against the CPU's RMSNorm, the logits against W h, the routing
/// against the CPU's `route` of the logits the GPU wrote (biased every
/// other case), three launches in a row on one counter.
#[test]
#[ignore = "needs a GPU"]
fn moe_router_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("moe_router_matches_cpu");
    for (rows, cols) in [
        (32, 2880),
        (128, 2048),
        (1, 4),
        (8, 4100),
        (1024, 64),
        (60, 1028),
    ] {
        let (w, wg) = random_router(&s, &mut rng, rows, cols);
        let x = rng.vec(cols, -1.0, 1.0);
        let xg = s.upload(&x, "x").unwrap();
        let mut y = s.alloc::<f32>(rows, "y").unwrap();
        s.fill_bytes(&mut y, 0xFF).unwrap();
        let wv = wg.view();
        let m = router_matrix(&wv, rows, cols);
        k.moe_router(&s, &m, &xg.view(), &mut y, None, None)
            .unwrap();
        let (want, mag) = router_cpu(&w, &x, rows, cols);
        check(
            &format!("moe_router {rows} x {cols}"),
            &s.download(&y).unwrap(),
            &want,
            |i| 1e-6 * mag[i] + 1e-30,
        );
    }
    let mut done = s.alloc_zeroed::<u32>(1, "done").unwrap();
    for (ci, (rows, cols, kk)) in [(128, 2048, 8), (32, 2880, 4), (8, 4100, 2), (1024, 64, 16)]
        .into_iter()
        .enumerate()
    {
        let (w, wg) = random_router(&s, &mut rng, rows, cols);
        let wv = wg.view();
        let m = router_matrix(&wv, rows, cols);
        let bias = (ci % 2 == 1).then(|| rng.vec(rows, -0.5, 0.5));
        let bg = bias.as_ref().map(|b| s.upload(b, "bias").unwrap());
        let bv = bg.as_ref().map(|b| b.view());
        let nw = rng.vec(cols, 0.5, 1.5);
        let nwg = s.upload(&nw, "norm").unwrap();
        let eps = 1e-6f32;
        for round in 0..3 {
            let x = rng.vec(cols, -2.0, 2.0);
            let xg = s.upload(&x, "x").unwrap();
            let mut h = s.alloc::<f32>(cols, "h").unwrap();
            let mut y = s.alloc::<f32>(rows, "y").unwrap();
            let mut ids = s.alloc::<i32>(kk, "ids").unwrap();
            let mut wts = s.alloc::<f32>(kk, "w").unwrap();
            s.fill_bytes(&mut h, 0xFF).unwrap();
            s.fill_bytes(&mut y, 0xFF).unwrap();
            s.fill_bytes(&mut ids, 0xFF).unwrap();
            s.fill_bytes(&mut wts, 0xFF).unwrap();
            let norm = RouterNorm {
                weight: &nwg.view(),
                eps,
                h: &mut h,
            };
            let route = RouterRoute {
                done: &mut done,
                bias: bv.as_ref(),
                ids: &mut ids,
                w: &mut wts,
                k: kk,
            };
            k.moe_router(&s, &m, &xg.view(), &mut y, Some(norm), Some(route))
                .unwrap();
            let what = format!("moe_router {rows} x {cols} normed and routed, round {round}");
            let mut want_h = x.clone();
            m40_model::cpu::ops::norm(m40_gguf::NormKind::Rms, &mut want_h, &nw, eps);
            let got_h = s.download(&h).unwrap();
            check(&format!("{what}: h"), &got_h, &want_h, |i| {
                2e-5 * want_h[i].abs() as f64 + 1e-7
            });
            let (want, mag) = router_cpu(&w, &want_h, rows, cols);
            let got = s.download(&y).unwrap();
            check(&format!("{what}: logits"), &got, &want, |i| {
                3e-5 * mag[i] + 1e-30
            });
            let mut l = got.clone();
            if let Some(b) = &bias {
                l.iter_mut().zip(b).for_each(|(l, b)| *l += b);
            }
            let r = m40_model::cpu::route(&l, kk);
            let want_ids: Vec<i32> = r.iter().map(|&(i, _)| i as i32).collect();
            assert_eq!(s.download(&ids).unwrap(), want_ids, "{what}: ids");
            let want_w: Vec<f32> = r.iter().map(|&(_, w)| w).collect();
            check(
                &format!("{what}: weights"),
                &s.download(&wts).unwrap(),
                &want_w,
                |i| 2e-6 * want_w[i].abs() as f64 + 1e-7,
            );
            assert_eq!(s.download(&done).unwrap(), [0], "{what}: the counter");
        }
    }
}

/// The router of several tokens (`moe_router_tokens`: a block a row and
/// MOE_ROUTER_TOKENS tokens) against f64 products: qwen3moe's and
/// gpt-oss's shapes and odd ones (one row, a last round of partial
/// float4s, 1024 rows), 1 to 130 tokens (chunks full, partial and one), y
/// poisoned with room past n tokens that must stay poisoned; what it
/// refuses.
#[test]
#[ignore = "needs a GPU"]
fn moe_router_of_several_tokens_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("moe_router_of_several_tokens_matches_cpu");
    assert_eq!(MOE_ROUTER_TOKENS, 8);
    for (rows, cols) in [(128, 2048), (32, 2880), (1, 4), (8, 4100), (1024, 64)] {
        let (w, wg) = random_router(&s, &mut rng, rows, cols);
        let wv = wg.view();
        let m = router_matrix(&wv, rows, cols);
        for n in [1usize, 2, 4, 7, 8, 9, 17, 32, 130] {
            let x = rng.vec(n * cols, -2.0, 2.0);
            let xg = s.upload(&x, "x").unwrap();
            let mut y = s.alloc::<f32>((n + 1) * rows, "y").unwrap();
            s.fill_bytes(&mut y, 0xFF).unwrap();
            k.moe_router_tokens(&s, &m, &xg.view(), &mut y, n).unwrap();
            let (want, mag) = router_cpu(&w, &x, rows, cols);
            let got = s.download(&y).unwrap();
            let what = format!("moe_router_tokens {rows} x {cols}, {n} tokens");
            check(&what, &got[..n * rows], &want, |i| 1e-6 * mag[i] + 1e-30);
            assert!(
                got[n * rows..].iter().all(|v| v.to_bits() == u32::MAX),
                "{what}: wrote past its tokens"
            );
        }
    }
    // Not F32, too many rows, a row length not a multiple of 4, x or y
    // short: refused.
    let z = s.upload(&vec![0u8; 4 * 1025 * 8], "w").unwrap();
    let x = s.upload(&[0f32; 16], "x").unwrap();
    let mut y = s.alloc::<f32>(1025, "y").unwrap();
    for (ty, rows, cols, n) in [
        (GgmlType::F16, 4, 8, 1),
        (GgmlType::F32, 1025, 8, 1),
        (GgmlType::F32, 4, 6, 1),
        (GgmlType::F32, 4, 8, 3),
        (GgmlType::F32, 1024, 8, 2),
    ] {
        let m = QMatrix {
            ty,
            data: &z.view(),
            rows,
            cols,
        };
        assert!(
            k.moe_router_tokens(&s, &m, &x.view(), &mut y, n).is_err(),
            "{ty} {rows} x {cols}, {n} tokens"
        );
        // The one-token router refuses the same matrices.
        assert!(
            n > 1 || k.moe_router(&s, &m, &x.view(), &mut y, None, None).is_err(),
            "moe_router: {ty} {rows} x {cols}"
        );
    }
}

/// One token's weighted sum joined to the residual with the next norm
/// folded (`moe_combine_fold`): x + sum_j w_j (y_j + b[ids_j]) in slot
/// order bit for bit (the CPU's f32 operations), h = x * weight bit for
/// bit, and the blocks' partial sums of x^2 adding up to the f64 sum
/// within rounding; rows of 2048, 2880 and 100 (a partial block), with and
/// without gpt-oss's down biases; h and the partial sums poisoned first,
/// nothing written past them; short buffers refused.
#[test]
#[ignore = "needs a GPU"]
fn moe_combine_fold_matches_cpu() {
    use m40_kernels::CombineFold;
    let (_dev, s, k, mut rng) = setup("moe_combine_fold_matches_cpu");
    for (d, kk, biased) in [
        (2048, 8, false),
        (2880, 4, true),
        (100, 3, true),
        (2048, 1, false),
    ] {
        let n_mat = 6;
        let x0 = rng.vec(d, -3.0, 3.0);
        let y = rng.vec(kk * d, -1.0, 1.0);
        let wv = rng.vec(kk, 0.0, 1.0);
        let nw = rng.vec(d, 0.5, 1.5);
        let ids: Vec<i32> = (0..kk).map(|_| rng.below(n_mat) as i32).collect();
        let b = rng.vec(n_mat * d, -1.0, 1.0);
        let want_x: Vec<f32> = (0..d)
            .map(|c| {
                let acc = (0..kk).fold(0f32, |acc, j| {
                    let v = match biased {
                        true => y[j * d + c] + b[ids[j] as usize * d + c],
                        false => y[j * d + c],
                    };
                    acc + wv[j] * v
                });
                x0[c] + acc
            })
            .collect();
        let want_h: Vec<f32> = want_x.iter().zip(&nw).map(|(x, w)| x * w).collect();
        let want_ss: f64 = want_x.iter().map(|&v| v as f64 * v as f64).sum();
        let mut xg = s.upload(&x0, "x").unwrap();
        let (yg, wg, nwg) = (
            s.upload(&y, "y").unwrap(),
            s.upload(&wv, "w").unwrap(),
            s.upload(&nw, "nw").unwrap(),
        );
        let (ig, bg) = (s.upload(&ids, "ids").unwrap(), s.upload(&b, "b").unwrap());
        let mut h = s.alloc::<f32>(d + 4, "h").unwrap();
        let mut part = s.alloc::<f32>(64, "part").unwrap();
        s.fill_bytes(&mut h, 0xFF).unwrap();
        s.fill_bytes(&mut part, 0xFF).unwrap();
        let nv = nwg.view();
        let fold = CombineFold {
            weight: &nv,
            h: &mut h,
            part: &mut part,
        };
        let (iv, bv) = (ig.view(), bg.view());
        let bias = biased.then_some((&iv, &bv));
        let parts = k
            .moe_combine_fold(&s, &yg.view(), &wg.view(), bias, &mut xg, fold, d, kk)
            .unwrap();
        let what = format!("moe_combine_fold d {d}, k {kk}, biased {biased}");
        assert_eq!(parts, d.div_ceil(256), "{what}: parts");
        check(
            &format!("{what}: x"),
            &s.download(&xg).unwrap(),
            &want_x,
            |_| 0.0,
        );
        let got_h = s.download(&h).unwrap();
        check(&format!("{what}: h"), &got_h[..d], &want_h, |_| 0.0);
        assert!(
            got_h[d..].iter().all(|v| v.to_bits() == u32::MAX),
            "{what}: past h"
        );
        let got_p = s.download(&part).unwrap();
        assert!(
            got_p[parts..].iter().all(|v| v.to_bits() == u32::MAX),
            "{what}: past the parts"
        );
        let ss: f64 = got_p[..parts].iter().map(|&v| v as f64).sum();
        assert!(
            (ss - want_ss).abs() <= 1e-5 * want_ss,
            "{what}: sum of squares {ss} against {want_ss}"
        );
    }
    // Too few partial sums, a short h: refused.
    let d = 1000;
    let z = s.upload(&vec![0f32; 8 * d], "z").unwrap();
    let mut x = s.upload(&vec![0f32; d], "x").unwrap();
    for (h_len, parts) in [(d, 3), (d - 1, 4)] {
        let mut h = s.alloc::<f32>(h_len, "h").unwrap();
        let mut part = s.alloc::<f32>(parts, "part").unwrap();
        let zv = z.view();
        let fold = CombineFold {
            weight: &zv,
            h: &mut h,
            part: &mut part,
        };
        assert!(
            k.moe_combine_fold(&s, &zv, &zv, None, &mut x, fold, d, 2)
                .is_err(),
            "h {h_len}, {parts} parts"
        );
    }
}
