//! kernels/sample.cu: top-k selection with penalties.

use super::*;
use m40_kernels::{select_masked, SelectMasks, SelectOut};

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
#[ignore = "needs a GPU"]
fn select_top_k_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("select_top_k_matches_cpu");
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
                    SelectOut {
                        out: &mut out,
                        scratch: &mut scratch,
                    },
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
                SelectOut {
                    out: &mut out,
                    scratch: &mut scratch,
                },
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
            .select_top_k(
                &s,
                &mut lg,
                10,
                &ag.view(),
                bad,
                SelectOut {
                    out: &mut out,
                    scratch: &mut scratch
                }
            )
            .is_err());
    }
    // Arguments too short for their header, out too short for k_max, a
    // scratch too short.
    let short = s.alloc::<i32>(SELECT_ARGS - 1, "a").unwrap();
    assert!(k
        .select_top_k(
            &s,
            &mut lg,
            10,
            &short.view(),
            1,
            SelectOut {
                out: &mut out,
                scratch: &mut scratch
            }
        )
        .is_err());
    let mut small = s.alloc::<i32>(3, "o").unwrap();
    assert!(k
        .select_top_k(
            &s,
            &mut lg,
            10,
            &ag.view(),
            2,
            SelectOut {
                out: &mut small,
                scratch: &mut scratch
            }
        )
        .is_err());
    let mut short_scratch = s.alloc_zeroed::<i32>(SELECT_SCRATCH - 1, "s").unwrap();
    assert!(k
        .select_top_k(
            &s,
            &mut lg,
            10,
            &ag.view(),
            1,
            SelectOut {
                out: &mut out,
                scratch: &mut short_scratch
            }
        )
        .is_err());
}

fn p0() -> Penalties {
    Penalties {
        repeat: 1.0,
        frequency: 0.0,
        presence: 0.0,
    }
}

/// Many rows at once: each row with its own penalties and k (greedy rows
/// without penalties take the many-block argmax), some with a token mask
/// (a structured output's: a few percent of the tokens, or fewer tokens
/// than k; the other rows' mask words are random and must be ignored),
/// against the CPU, ids and logits bit-exact, every row's masked and
/// penalized logits as the CPU leaves them; twice, so each row's scratch
/// is left as it was found.
#[test]
#[ignore = "needs a GPU"]
fn select_top_k_rows_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("select_top_k_rows_matches_cpu");
    use m40_kernels::SelectRows;
    for (rows, n_vocab) in [(1usize, 1000usize), (7, 49152), (64, 128256), (3, 5)] {
        let k_max = 40.min(n_vocab);
        let max_pen = 20.min(n_vocab);
        let stride = SELECT_ARGS + 2 * max_pen;
        let mut logits = Vec::new();
        let mut args = Vec::new();
        let mut want = Vec::new();
        let words = n_vocab.div_ceil(32) + 1; // a row's mask, and a spare word
        let mut masks: Vec<u32> = Vec::new();
        for r in 0..rows {
            let mut row = rng.vec(n_vocab, -12.0, 12.0);
            let mut mask: Vec<u32> = (0..words)
                .map(|_| rng.below(1 << 16) as u32 * 65537)
                .collect();
            let masked = rows > 1 && matches!(r % 5, 2 | 3);
            if masked {
                // A few percent of the tokens, or just three.
                mask.fill(0);
                let allow = if r % 5 == 2 { 1 + n_vocab / 30 } else { 3 };
                for _ in 0..allow {
                    let t = rng.below(n_vocab);
                    mask[t / 32] |= 1 << (t % 32);
                }
            }
            masks.extend_from_slice(&mask);
            if r % 3 == 1 {
                for l in &mut row {
                    *l = (*l * 0.5).round(); // ties
                }
            }
            let kk = if r % 2 == 0 { 1 } else { 1 + rng.below(k_max) };
            let n_pen = if r % 4 == 0 {
                0
            } else {
                rng.below(max_pen + 1)
            };
            let mut ids: Vec<u32> = (0..n_vocab as u32).collect();
            for i in 0..n_pen {
                let j = i + rng.below(n_vocab - i);
                ids.swap(i, j);
            }
            let pen: Vec<(u32, u32)> = ids[..n_pen]
                .iter()
                .map(|&id| (id, 1 + rng.below(4) as u32))
                .collect();
            let p = Penalties {
                repeat: 1.1,
                frequency: 0.2,
                presence: 0.3,
            };
            let mut a = select_args(kk, p, &pen);
            if masked {
                a = select_masked(a);
            }
            a.resize(stride, -1);
            args.extend(a);
            // The reference masks its copy; the GPU gets the row unmasked.
            let mut wl = row.clone();
            if masked {
                for (i, l) in wl.iter_mut().enumerate() {
                    if mask[i / 32] >> (i % 32) & 1 == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            let w = select_reference(&mut wl, &pen, p, kk);
            logits.extend(row);
            want.push((kk, w, wl));
        }
        let mut lg = s.upload(&logits, "logits").unwrap();
        let ag = s.upload(&args, "args").unwrap();
        let mg = s.upload(&masks, "masks").unwrap();
        let mut out = s.alloc::<i32>(rows * 2 * k_max, "out").unwrap();
        let mut scratch = s
            .alloc_zeroed::<i32>(rows * SELECT_SCRATCH, "scratch")
            .unwrap();
        for pass in 0..2 {
            if pass == 1 {
                // The same rows again, from the unpenalized logits.
                lg = s.upload(&logits, "logits").unwrap();
            }
            s.fill_bytes(&mut out, 0xFF).unwrap();
            let shape = SelectRows {
                rows,
                n_vocab,
                args_stride: stride,
                k_max,
            };
            let o = SelectOut {
                out: &mut out,
                scratch: &mut scratch,
            };
            let mv = mg.view();
            let m = SelectMasks { masks: &mv, words };
            k.select_top_k_rows(&s, &mut lg, &ag.view(), shape, Some(m), o)
                .unwrap();
            let got = s.download(&out).unwrap();
            let got_l = s.download(&lg).unwrap();
            for (r, (kk, w, wl)) in want.iter().enumerate() {
                let what = format!("rows {rows} x {n_vocab}, row {r} (k {kk}), pass {pass}");
                let o = &got[r * 2 * k_max..];
                let ids: Vec<u32> = o[..*kk].iter().map(|&i| i as u32).collect();
                assert_eq!(&ids, w, "{what}: ids");
                let bits: Vec<u32> = o[*kk..2 * kk].iter().map(|&b| b as u32).collect();
                let want_bits: Vec<u32> = w.iter().map(|&i| wl[i as usize].to_bits()).collect();
                assert_eq!(bits, want_bits, "{what}: logits");
                assert!(
                    got_l[r * n_vocab..(r + 1) * n_vocab]
                        .iter()
                        .zip(wl)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: penalized row"
                );
            }
        }
    }
}
