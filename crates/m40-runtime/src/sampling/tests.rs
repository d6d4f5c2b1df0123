//! Sampling: sets are respected, seeds reproduce, penalties as worked by hand.

use super::{logprobs, Sampler, SamplingParams};
use proptest::prelude::*;

fn logits_strategy() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-10f32..10.0, 2..200)
}

fn probs(l: &[f32]) -> Vec<f64> {
    let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let e: Vec<f64> = l.iter().map(|&v| ((v - m) as f64).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

proptest! {
    #[test]
    fn top_k_never_samples_outside_the_k_best(l in logits_strategy(), k in 1usize..10, seed in any::<u64>()) {
        let mut s = Sampler::new(SamplingParams { temperature: 1.5, top_k: k, top_p: 1.0, min_p: 0.0, seed: Some(seed), ..Default::default() });
        let id = s.sample(&mut l.clone());
        let better = l.iter().filter(|&&v| v > l[id as usize]).count();
        prop_assert!(better < k, "picked rank {} with k {}", better, k);
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p(l in logits_strategy(), p in 0.05f32..0.99, seed in any::<u64>()) {
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: p, min_p: 0.0, seed: Some(seed), ..Default::default() });
        let id = s.sample(&mut l.clone());
        let pr = probs(&l);
        // Mass strictly more likely than the pick must be below p.
        let above: f64 = pr.iter().filter(|&&x| x > pr[id as usize]).sum();
        prop_assert!(above < p as f64 + 1e-9, "mass above the pick {} >= p {}", above, p);
    }

    #[test]
    fn min_p_never_samples_below_the_bar(l in logits_strategy(), mp in 0.01f32..1.0, seed in any::<u64>()) {
        let mut s = Sampler::new(SamplingParams { temperature: 2.0, top_k: 0, top_p: 1.0, min_p: mp, seed: Some(seed), ..Default::default() });
        let id = s.sample(&mut l.clone());
        let pr = probs(&l);
        let max = pr.iter().cloned().fold(0.0, f64::max);
        prop_assert!(pr[id as usize] >= max * mp as f64 - 1e-12);
    }

    #[test]
    fn same_seed_same_tokens(l in logits_strategy(), seed in any::<u64>()) {
        let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: Some(seed), ..Default::default() };
        let (mut a, mut b) = (Sampler::new(params.clone()), Sampler::new(params));
        for _ in 0..20 {
            prop_assert_eq!(a.sample(&mut l.clone()), b.sample(&mut l.clone()));
        }
    }

    #[test]
    fn allowed_set_contains_every_sample(l in logits_strategy(), seed in any::<u64>()) {
        let mut s = Sampler::new(SamplingParams { seed: Some(seed), ..Default::default() });
        let allowed = s.allowed(&l);
        let id = s.sample(&mut l.clone());
        prop_assert!(allowed.contains(&id));
    }
}

#[test]
fn greedy_is_argmax() {
    let mut s = Sampler::new(SamplingParams::greedy());
    assert_eq!(s.sample(&mut [0.1, 3.0, -2.0, 2.9]), 1);
}

#[test]
fn seeded_draws_follow_the_distribution() {
    // Two tokens with probabilities 0.75 / 0.25.
    let l = [0.0f32, -(3f32.ln())];
    let mut s = Sampler::new(SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(42),
        ..Default::default()
    });
    let n = 20_000;
    let zeros = (0..n).filter(|_| s.sample(&mut l.to_vec()) == 0).count();
    let share = zeros as f64 / n as f64;
    assert!((share - 0.75).abs() < 0.015, "{share}");
}

#[test]
fn penalties_by_hand() {
    let params = SamplingParams {
        temperature: 0.0,
        repeat_penalty: 2.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        penalty_last_n: 3,
        ..Default::default()
    };
    let mut s = Sampler::new(params);
    for t in [0, 1, 1, 2] {
        s.accept(t); // the window keeps the last 3: [1, 1, 2]
    }
    let mut l = vec![4.0, 4.0, -1.0, 4.0];
    s.apply_penalties(&mut l);
    // token 0: out of the window, untouched.
    // token 1: 4 / 2 - 2 * 0.25 - 0.5 = 1.0
    // token 2: -1 * 2 - 1 * 0.25 - 0.5 = -2.75
    assert_eq!(l, vec![4.0, 1.0, -2.75, 4.0]);
    // Greedy after penalties: 0 and 3 tie at 4.0; the first wins.
    assert_eq!(s.sample(&mut [4.0, 4.0, -1.0, 4.0]), 0);
}

#[test]
fn logprobs_are_log_softmax() {
    let l = [1.0f32, 2.0, 3.0];
    let (lp, top) = logprobs(&l, 1, 2);
    let z = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
    assert!((lp as f64 - (2.0 - z)).abs() < 1e-5);
    assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
    assert!((top[0].1 as f64 - (3.0 - z)).abs() < 1e-5);
}

/// What a selecting backend returns for `sel`: the penalties applied as the
/// kernel applies them, then the k best by total order, lower ids first.
fn select_like_a_backend(logits: &[f32], sel: &m40_model::Selection) -> Vec<(u32, f32)> {
    let mut l = logits.to_vec();
    for &(id, c) in &sel.penalties {
        let v = &mut l[id as usize];
        *v = if *v > 0.0 {
            *v / sel.repeat
        } else {
            *v * sel.repeat
        };
        *v -= c as f32 * sel.frequency + sel.presence;
    }
    let mut idx: Vec<u32> = (0..l.len() as u32).collect();
    idx.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
    idx.into_iter()
        .take(sel.k)
        .map(|i| (i, l[i as usize]))
        .collect()
}

proptest! {
    // A backend that selects the k best (after penalties) where the logits
    // are lets the sampler pick exactly what it picks from the whole row:
    // same seed, same token sequence, with penalties, ties and greedy.
    #[test]
    fn sampling_selected_candidates_equals_sampling_logits(
        rows in prop::collection::vec(prop::collection::vec(-4f32..4.0, 50), 1..12),
        k in 1usize..60, temp in 0f32..2.0, top_p in 0.3f32..1.0, min_p in 0f32..0.2,
        rp in 1f32..1.5, fp in 0f32..0.5, pp in 0f32..0.5, ties in any::<bool>(), seed in any::<u64>(),
    ) {
        let params = SamplingParams {
            temperature: if temp < 0.2 { 0.0 } else { temp },
            top_k: k, top_p, min_p,
            repeat_penalty: rp, frequency_penalty: fp, presence_penalty: pp,
            penalty_last_n: 8, seed: Some(seed),
        };
        let (mut a, mut b) = (Sampler::new(params.clone()), Sampler::new(params));
        for t in [3u32, 3, 7] {
            a.accept(t);
            b.accept(t);
        }
        for row in rows {
            let row: Vec<f32> = if ties { row.iter().map(|v| v.round()).collect() } else { row };
            let ida = a.sample(&mut row.clone());
            match b.selection(1024) {
                Some(sel) => {
                    let top = select_like_a_backend(&row, &sel);
                    prop_assert_eq!(ida, b.sample_selected(&top));
                }
                None => prop_assert_eq!(ida, b.sample(&mut row.clone())),
            }
        }
    }
}

#[test]
fn selection_needs_top_k_within_the_backend_limit() {
    let s = Sampler::new(SamplingParams {
        top_k: 0,
        ..Default::default()
    });
    assert!(s.selection(1024).is_none());
    let s = Sampler::new(SamplingParams {
        top_k: 2000,
        ..Default::default()
    });
    assert!(s.selection(1024).is_none());
    let s = Sampler::new(SamplingParams::greedy());
    assert_eq!(s.selection(1024).unwrap().k, 1);
    // No penalties: nothing to send.
    assert!(s.selection(1024).unwrap().penalties.is_empty());
}
