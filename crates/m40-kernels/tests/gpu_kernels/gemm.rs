//! kernels/gemm.cu: the prefill matmul of every format, tiles, splits over K,
//! stacked outputs.

use super::*;
use m40_kernels::GemmOpts;

/// gemm (prefill matmul, dequantizing in the tile loader) against the CPU
/// dequantization in f64, for every format, with and without accumulation,
/// through both tiles, on shapes that are not multiples of either.
/// One GEMM case: random weights of `ty` (n x kk), X (m x kk); `launch`
/// gets the uploaded weights (`prepare` turns the GGUF bytes into what the
/// kernel reads), X, Y (poisoned, or holding y0 when accumulating) and the
/// accumulate flag.
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
pub(super) fn packed_gemm_case(
    s: &Stream,
    k: &Kernels,
    rng: &mut Rng,
    ty: GgmlType,
    mnk: (usize, usize, usize),
    part: Option<&std::cell::RefCell<DeviceBuffer<f32>>>,
) {
    packed_gemm_forced(s, k, rng, ty, mnk, part, (None, None));
}

/// [`packed_gemm_case`] with the tile and the splits over K forced where
/// given (`GemmOpts::tile`, `GemmOpts::splits`).
pub(super) fn packed_gemm_forced(
    s: &Stream,
    k: &Kernels,
    rng: &mut Rng,
    ty: GgmlType,
    (m, n, kk): (usize, usize, usize),
    part: Option<&std::cell::RefCell<DeviceBuffer<f32>>>,
    (tile, splits): (Option<GemmTile>, Option<usize>),
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
        k.gemm_packed(
            s,
            &pm,
            xv,
            y,
            m,
            GemmOpts {
                accumulate: acc,
                scratch: p.as_deref_mut(),
                splits,
                tile,
            },
        )
        .unwrap();
    });
}

#[test]
#[ignore = "needs a GPU"]
fn gemm_every_format_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("gemm_every_format_matches_cpu");
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
                    k.gemm(
                        &s,
                        &qm,
                        xv,
                        y,
                        m,
                        GemmOpts {
                            accumulate: acc,
                            scratch: None,
                            splits: None,
                            tile: None,
                        },
                    )
                    .unwrap();
                },
            );
        }
    }
    // The packed layout (rows not a multiple of 4: a padded group), and the
    // narrow tile's batched decode steps of 17 and 32 tokens.
    for f in PackFormat::ALL {
        let narrow = [(17, 130, 2 * f.qk), (32, 301, 16 * f.qk)];
        for mnk in shapes(f.qk).into_iter().chain(narrow) {
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
    // 8B model's o at 128 tokens (large tile), at 40 (small tile) and at 24
    // (narrow tile: a batched decode step).
    let deep = 4096;
    let deep_shapes: Vec<(usize, usize)> = [
        (128, GemmTile::Large),
        (40, GemmTile::Small),
        (24, GemmTile::Narrow),
    ]
    .into_iter()
    .filter_map(|(m, tile)| {
        let n = (1..64).map(|t| 128 * t - 3).find(|&n| {
            let plan = gemm_plan(m, n, deep, gpu);
            plan.tile == tile && plan.splits >= 5
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
            k.gemm(
                &s,
                &qm,
                xv,
                y,
                m,
                GemmOpts {
                    accumulate: acc,
                    scratch: Some(&mut p),
                    splits: None,
                    tile: None,
                },
            )
            .unwrap();
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
    k.gemm_packed(
        &s,
        &pm,
        &x.view(),
        &mut one,
        m,
        GemmOpts {
            accumulate: false,
            scratch: Some(&mut p),
            splits: None,
            tile: None,
        },
    )
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
    k.gemm_packed_split(
        &s,
        &pm,
        &x.view(),
        out,
        m,
        GemmOpts {
            accumulate: false,
            scratch: Some(&mut p),
            splits: None,
            tile: None,
        },
    )
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
    assert!(k
        .gemm(
            &s,
            &qm,
            &x.view(),
            &mut y,
            1,
            GemmOpts {
                accumulate: false,
                scratch: None,
                splits: None,
                tile: None,
            }
        )
        .is_err());
}

#[test]
#[ignore = "needs a GPU"]
fn stacked_and_batched_matmuls_write_each_part() {
    let (_dev, s, k, mut rng) = setup("stacked_and_batched_matmuls_write_each_part");
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
            for m in [1usize, 2, 3, 5, 8, 13, 16, 40, 70] {
                let x = rng.vec(m * cols, -1.0, 1.0);
                let xg = s.upload(&x, "x").unwrap();
                let mut bufs: Vec<DeviceBuffer<f32>> = parts
                    .iter()
                    .map(|&r| s.alloc::<f32>(m * r + TAIL, "y").unwrap())
                    .collect();
                // Some(split): the GEMV (split None: the launcher's own),
                // for up to PACKED_GEMV_MAX_TOKENS (chunks of 8 past 8); None: the
                // GEMM, for 3 and 70.
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
                            k.gemm_packed_split(
                                &s,
                                &pm,
                                &xg.view(),
                                out,
                                m,
                                GemmOpts {
                                    accumulate: false,
                                    scratch: None,
                                    splits: None,
                                    tile: None,
                                },
                            )
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

/// The grouped expert GEMMs (`gemm_grp_*`, [`Kernels::gemm_packed_experts`])
/// against the CPU's product of the dequantized rows, in every packed
/// format: a step's slots grouped by expert (`moe_tiles`) in tiles of up to
/// 32 (the narrow tile) and 64 (the large one), lopsided routings (one
/// expert over several tiles beside experts of one slot), an id past the
/// experts (clamped to the last), x a token's row (x_per = k) or the
/// slot's own; 132 rows (a partial block of 128). Outputs poisoned,
/// nothing written past y; shapes it refuses.
#[test]
#[ignore = "needs a GPU"]
fn grouped_expert_gemms_match_cpu() {
    let (_dev, s, k, mut rng) = setup("grouped_expert_gemms_match_cpu");
    use m40_kernels::ExpertTiles;
    const TAIL: usize = 8;
    let rows = 132;
    for f in PackFormat::ALL {
        let cols = if f.qk == 256 { 512 } else { 256 };
        assert!(f.takes_experts(rows, cols), "{}", f.ty);
        for (n, kk, n_mat, cap) in [
            (40usize, 4usize, 6usize, 32usize),
            (70, 2, 3, 64),
            (5, 2, 9, 32),
            (9, 8, 128, 64),
        ] {
            let slots = n * kk;
            let w = random_weights(&mut rng, f.ty, n_mat * rows, cols);
            let dense = dequant(f.ty, &w, n_mat * rows, cols);
            let row_b = w.len() / (n_mat * rows);
            let packed: Vec<u8> = (0..n_mat)
                .flat_map(|e| {
                    let m = &w[e * rows * row_b..(e + 1) * rows * row_b];
                    pack_gemv(f.ty, m, rows, cols).unwrap()
                })
                .collect();
            let mut ids: Vec<i32> = (0..slots)
                .map(|j| match j % 2 == 0 {
                    true => 0,
                    false => rng.below(n_mat) as i32,
                })
                .collect();
            ids[1] = n_mat as i32 + 3;
            let clamped: Vec<i32> = ids.iter().map(|&e| e.min(n_mat as i32 - 1)).collect();
            let [idg, order, tiles] = super::moe::grouped_slots(&s, &k, &ids, n_mat, cap);
            let (order, tiles_v) = (order.view(), tiles.view());
            let grouped = ExpertTiles {
                order: &order,
                tiles: &tiles_v,
                cap,
            };
            let wg = s.upload(&packed, "packed experts").unwrap();
            let m = PackedMatrix {
                ty: f.ty,
                data: &wg.view(),
                rows: n_mat * rows,
                cols,
            };
            for x_per in [kk, 1] {
                let x = rng.vec(slots.div_ceil(x_per) * cols, -1.0, 1.0);
                let xg = s.upload(&x, "x").unwrap();
                let (want, mag) =
                    super::moe::experts_reference(&dense, &x, &clamped, rows, cols, x_per);
                let mut y = s.alloc::<f32>(slots * rows + TAIL, "y").unwrap();
                s.fill_bytes(&mut y, 0xFF).unwrap();
                k.gemm_packed_experts(
                    &s,
                    &m,
                    rows,
                    &idg.view(),
                    &xg.view(),
                    x_per,
                    &mut y,
                    slots,
                    grouped,
                )
                .unwrap();
                let got = s.download(&y).unwrap();
                let what = format!(
                    "gemm_packed_experts {} {slots} slots of {n_mat} experts, cap {cap}, x_per {x_per}",
                    f.ty
                );
                check(&what, &got[..slots * rows], &want, |i| 1e-5 * mag[i] + 1e-6);
                assert!(
                    got[slots * rows..].iter().all(|v| v.to_bits() == u32::MAX),
                    "{what}: wrote past y"
                );
            }
            // Refused: tiles wider than the large tile, or than the
            // grouped GEMV's 8; rows not experts of groups of 4; too few
            // tile entries.
            let xg = s.upload(&vec![0f32; slots * cols], "x").unwrap();
            let mut y = s.alloc::<f32>(slots * rows, "y").unwrap();
            let mut run = |rows: usize, t: ExpertTiles<'_, '_>| {
                k.gemm_packed_experts(&s, &m, rows, &idg.view(), &xg.view(), 1, &mut y, slots, t)
                    .is_err()
            };
            assert!(run(rows, ExpertTiles { cap: 65, ..grouped }));
            assert!(run(rows, ExpertTiles { cap: 0, ..grouped }));
            assert!(run(rows / 2 - 1, grouped));
            let short = tiles.slice(0..1).unwrap();
            assert!(run(
                rows,
                ExpertTiles {
                    tiles: &short,
                    ..grouped
                }
            ));
            let wide = ExpertTiles { cap: 32, ..grouped };
            let shape = m40_kernels::MoeShape { n, k: kk };
            assert!(k
                .gemv_packed_experts(
                    &s,
                    &m,
                    rows,
                    &idg.view(),
                    &xg.view(),
                    1,
                    &mut y,
                    shape,
                    None,
                    None,
                    Some(wide)
                )
                .is_err());
        }
    }
}
