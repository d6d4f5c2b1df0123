//! kernels/gemv_packed.cuh's RoPE fold: the one-token Q/K/V GEMV that
//! rotates and appends to the KV cache itself.

use crate::*;
use m40_kernels::{GemvOpts, KvAppend};

/// The one-token Q/K/V GEMV with RoPE and the KV append folded in
/// (GemvOut::RopeKv), with and without biases, against the same GEMV into
/// q, k, v followed by rope_kv_append or rope_kv_append_biased (each
/// checked against the CPU by its own test): q
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
            let bias = s.upload(&rng.vec(rows, -0.5, 0.5), "bias").unwrap();
            let splits = [None, Some(1), Some(2), Some(3), Some(4)];
            for (ks, biased) in splits.into_iter().flat_map(|k| [(k, false), (k, true)]) {
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
                let kv = KvAppend {
                    n_head_kv: n_kv,
                    pos: &pos.view(),
                    inv_freq: &inv.view(),
                    p: &p,
                    kpool: &mut kp0,
                    vpool: &mut vp0,
                    format: m40_kernels::KvType::F16,
                    table: &table.view(),
                    max_start: start,
                };
                let (kv_k, kv_v) = (kb.view(), vb.view());
                match biased {
                    true => {
                        k.rope_kv_append_biased(&s, &mut q, &kv_k, &kv_v, kv, None, &bias.view())
                    }
                    false => k.rope_kv_append(&s, &mut q, &kv_k, &kv_v, kv),
                }
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
                        // The run's rows' biases.
                        let from: usize = dims[..parts.start].iter().sum();
                        let bv = bias.slice(from..from + n).unwrap();
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
                                format: m40_kernels::KvType::F16,
                                table: &tv,
                                max_start: start,
                            },
                            bias: biased.then_some(&bv),
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
                        "{} {n_head}/{n_kv}x{hd} rot {n_rot} at {start} biased {biased} parts {layout:?} {launches:?}",
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
                        format: m40_kernels::KvType::F16,
                        table: &tv,
                        max_start: start,
                    },
                    bias: None,
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
