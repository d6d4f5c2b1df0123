//! Sampling: sets are respected, seeds reproduce, penalties as worked by hand.

use m40_runtime::sampling::{logprobs, Sampler, SamplingParams};
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
