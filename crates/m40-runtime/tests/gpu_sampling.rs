//! The draw on the device (m40-kernels' `sample_draw`, issue 62) against
//! the host's sampler (`draw_selected`, the reference): the same tokens and
//! generator states for every row and step, and a chi-square test of many
//! seeded draws against the softmax they sample. Ignored without
//! `--include-ignored`; fails with it where there is no GPU.

// The GPU kernel tests' fresh random inputs (`Rng`: the seed printed,
// `M40_SEED` repeats a run).
#[path = "../../m40-kernels/tests/gpu_kernels/common/mod.rs"]
mod common;

use common::Rng;
use m40_device::testing::gpu_device;
use m40_kernels::{
    draw_args, select_args, DrawRows, Kernels, Penalties, SelectOut, SelectRows, DRAW_ARGS,
    SELECT_ARGS, SELECT_SCRATCH,
};
use m40_runtime::{draw_selected, SamplingParams};

/// One row's sampling settings.
fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
    let mut p = SamplingParams::default();
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p
}

/// The rows' selections (`select_top_k_rows`, no penalties) of `logits`
/// (rows x n_vocab), k[r] candidates each, then `steps` draws on the
/// device from them, each row's generator starting at its seed.
fn device_draws(
    logits: &[f32],
    n_vocab: usize,
    rows: &[(SamplingParams, u64)],
    steps: usize,
) -> Draws {
    let dev = gpu_device("gpu_sampling");
    let (s, k) = (dev.stream(), Kernels::new(dev.clone()));
    let n = rows.len();
    let k_max = rows
        .iter()
        .map(|(p, _)| p.top_k)
        .max()
        .unwrap()
        .min(n_vocab);
    let sel_args: Vec<i32> = rows
        .iter()
        .flat_map(|(p, _)| select_args(p.top_k.max(1), Penalties::NONE, &[]))
        .collect();
    let d_args: Vec<i32> = rows
        .iter()
        .flat_map(|(p, _)| draw_args(p.top_k.clamp(1, k_max), p.temperature, p.top_p, p.min_p))
        .collect();
    let mut lg = s.upload(logits, "logits").unwrap();
    let sa = s.upload(&sel_args, "select args").unwrap();
    let da = s.upload(&d_args, "draw args").unwrap();
    let mut out = s.alloc::<i32>(n * 2 * k_max, "selection").unwrap();
    let mut scratch = s
        .alloc_zeroed::<i32>(n * SELECT_SCRATCH, "scratch")
        .unwrap();
    let select = SelectRows {
        rows: n,
        n_vocab,
        args_stride: SELECT_ARGS,
        k_max,
    };
    let sel_out = SelectOut {
        out: &mut out,
        scratch: &mut scratch,
    };
    k.select_top_k_rows(&s, &mut lg, &sa.view(), select, None, sel_out)
        .unwrap();
    let seeds: Vec<u64> = rows.iter().map(|&(_, seed)| seed).collect();
    let mut rng = s.upload(&seeds, "generators").unwrap();
    let mut tokens = s.alloc::<i32>(n, "tokens").unwrap();
    let draw = DrawRows {
        rows: n,
        k_max,
        args_stride: DRAW_ARGS,
    };
    let mut picked = Vec::new();
    for _ in 0..steps {
        s.fill_bytes(&mut tokens, 0xFF).unwrap();
        k.sample_draw(&s, &out.view(), &da.view(), draw, &mut rng, &mut tokens)
            .unwrap();
        picked.push(s.download(&tokens).unwrap());
    }
    Draws {
        picked,
        states: s.download(&rng).unwrap(),
        sel: s.download(&out).unwrap(),
        k_max,
    }
}

/// What [`device_draws`] returns: each step's tokens, the generators'
/// states after the steps, the selections and their stride (2 k_max).
struct Draws {
    picked: Vec<Vec<i32>>,
    states: Vec<u64>,
    sel: Vec<i32>,
    k_max: usize,
}

/// Random rows (uniform logits, ties, masked rows with few live tokens, a
/// row all -inf) under every kind of setting (greedy; k from 1 to 1024;
/// top-p, min-p on and off; temperatures from 0.25 to 2), three draws each
/// on the device: every token the host sampler's draw among the same
/// candidates from the same generator state, and the generators left in
/// the host's states.
#[test]
#[ignore = "needs a GPU"]
fn device_draws_are_the_host_samplers() {
    let mut rng = Rng::fresh("device_draws_are_the_host_samplers");
    let (n, n_vocab, steps) = (384usize, 3000usize, 3usize);
    let mut logits = vec![0f32; n * n_vocab];
    let mut rows = Vec::with_capacity(n);
    for r in 0..n {
        let row = &mut logits[r * n_vocab..(r + 1) * n_vocab];
        for v in row.iter_mut() {
            *v = rng.uniform(-6.0, 6.0);
        }
        match r % 8 {
            // Ties: a few values shared by many tokens.
            1 => row.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 2.0),
            // A structured output's mask: all but a few tokens -inf.
            2 | 5 => row.iter_mut().for_each(|v| {
                if rng.below(100) < 97 {
                    *v = f32::NEG_INFINITY;
                }
            }),
            _ => {}
        }
        if r == 3 {
            row.fill(f32::NEG_INFINITY);
        }
        let k = [1, 2, 5, 40, 300, 1024][rng.below(6)];
        let temp = [0.0, 0.25, 0.8, 1.0, 2.0][rng.below(5)];
        let top_p = [1.0, 0.95, 0.5, 0.1][rng.below(4)];
        let min_p = [0.0, 0.05, 0.3][rng.below(3)];
        rows.push((params(temp, k, top_p, min_p), rng.next_u64()));
    }
    let Draws {
        picked,
        states,
        sel,
        k_max,
    } = device_draws(&logits, n_vocab, &rows, steps);
    let mut draws = 0;
    for (r, (p, seed)) in rows.iter().enumerate() {
        let k = p.top_k.min(k_max);
        let row = &sel[r * 2 * k_max..];
        let top: Vec<(u32, f32)> = (0..k)
            .map(|i| (row[i] as u32, f32::from_bits(row[k + i] as u32)))
            .collect();
        let mut state = *seed;
        for (step, got) in picked.iter().enumerate() {
            let want = draw_selected(p, &mut state, &top);
            assert_eq!(
                got[r] as u32,
                want,
                "row {r} step {step}: {p:?}, candidates {:?}",
                &top[..top.len().min(8)]
            );
            draws += 1;
        }
        assert_eq!(
            states[r], state,
            "row {r}: the generator's state after {steps} draws"
        );
    }
    println!("{draws} draws the host's");
}

/// Many seeded draws from one distribution (six candidates, temperature
/// 0.7): the counts against the softmax they sample, a chi-square test
/// with 5 degrees of freedom at p = 1e-6 (36.0).
#[test]
#[ignore = "needs a GPU"]
fn device_draws_follow_the_softmax() {
    let mut rng = Rng::fresh("device_draws_follow_the_softmax");
    let (n, n_vocab, steps) = (4096usize, 64usize, 8usize);
    let head = [2.0f32, 1.5, 1.0, 0.5, 0.0, -0.5];
    let mut row = vec![-20.0f32; n_vocab];
    // The six candidates at scattered ids.
    let ids = [7usize, 50, 3, 21, 63, 0];
    for (&id, &l) in ids.iter().zip(&head) {
        row[id] = l;
    }
    let logits: Vec<f32> = (0..n).flat_map(|_| row.clone()).collect();
    let rows: Vec<_> = (0..n)
        .map(|_| (params(0.7, head.len(), 1.0, 0.0), rng.next_u64()))
        .collect();
    let picked = device_draws(&logits, n_vocab, &rows, steps).picked;
    let mut counts = [0u64; 6];
    for step in &picked {
        for &t in step {
            let i = ids.iter().position(|&id| id as i32 == t);
            let i = i.unwrap_or_else(|| panic!("token {t} is not a candidate"));
            counts[i] += 1;
        }
    }
    let e: Vec<f64> = head.iter().map(|&l| ((l / 0.7) as f64).exp()).collect();
    let total: f64 = e.iter().sum();
    let draws = (n * steps) as f64;
    let chi2: f64 = counts
        .iter()
        .zip(&e)
        .map(|(&c, &ei)| {
            let want = draws * ei / total;
            (c as f64 - want).powi(2) / want
        })
        .sum();
    println!("counts {counts:?}, chi-square {chi2:.2}");
    assert!(
        chi2 < 36.0,
        "chi-square {chi2:.2} over 5 degrees of freedom: {counts:?}"
    );
}
