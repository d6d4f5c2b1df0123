//! Reading llama.cpp's logits (JSON) and measuring against them.

use serde_json::Value;

/// The ids of a reference's `token_ids`.
pub fn token_ids(r: &Value) -> Vec<u32> {
    r["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// One position's logits of a reference, as f64.
pub fn row(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

/// ||got - want|| / ||norm_of||, Euclidean.
pub fn rel_err(got: &[f32], want: impl IntoIterator<Item = f64>, norm_of: &[f64]) -> f64 {
    let norm = norm_of.iter().map(|v| v * v).sum::<f64>().sqrt();
    got.iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).powi(2))
        .sum::<f64>()
        .sqrt()
        / norm
}

/// The logits of `backend` at every position of `tokens`: run all at once
/// (a prefill) and one token at a time (decode steps), in that order.
pub fn all_and_one_by_one<B: m40_model::Backend>(backend: &B, tokens: &[u32]) -> [Vec<f32>; 2] {
    use m40_model::Logits;
    let mut cache = backend.new_cache(64).unwrap();
    let all = backend.forward(&mut cache, tokens, Logits::All).unwrap();
    let mut cache = backend.new_cache(64).unwrap();
    let mut one_by_one = Vec::new();
    for &t in tokens {
        one_by_one.extend(backend.forward(&mut cache, &[t], Logits::Last).unwrap());
    }
    [all, one_by_one]
}
