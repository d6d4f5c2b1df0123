//! Turning logits into the next token: llama.cpp's order of operations —
//! penalties over a window of recent tokens, then top-k, top-p and min-p on the
//! (penalized) distribution, then temperature, then a seeded draw. A
//! temperature of 0 is greedy (argmax after penalties).

use std::collections::{HashMap, VecDeque};

use m40_model::{argmax, Selection};

/// Sampling settings; the defaults are llama.cpp's. [`SamplingParams::validate`]
/// checks them against [`RANGES`]. More settings will come: start from
/// `SamplingParams::default()` (or [`SamplingParams::greedy`]) and set fields.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SamplingParams {
    /// 0 is greedy. Ranges: [`RANGES`].
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens; 1 is off.
    pub repeat_penalty: f32,
    /// Subtract from the logit of every recent token once.
    pub presence_penalty: f32,
    /// Subtract from the logit of a recent token per occurrence.
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    /// The same seed gives the same output; `None` picks one from the clock.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: None,
        }
    }
}

/// A sampling value out of its range ([`SamplingParams::validate`]):
/// which parameter, its range, and what was given.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{name} must be {range}, not {value}")]
pub struct InvalidParam {
    /// The parameter as the APIs name it (`temperature`, `top_p`, ...).
    pub name: &'static str,
    pub range: &'static str,
    pub value: String,
}

/// Each sampling parameter with its range, as [`SamplingParams::validate`]
/// checks it (the CLI and both HTTP APIs go through it): (name, range).
pub const RANGES: &[(&str, &str)] = &[
    ("temperature", "between 0 and 2 (0 is greedy)"),
    ("top_k", "an integer >= 0 (0 keeps every token)"),
    ("top_p", "between 0 and 1 (1 keeps every token)"),
    ("min_p", "between 0 and 1 (0 keeps every token)"),
    ("repeat_penalty", "above 0 and at most 10 (1 is off)"),
    ("presence_penalty", "between -2 and 2 (0 is off)"),
    ("frequency_penalty", "between -2 and 2 (0 is off)"),
    (
        "repeat_last_n",
        "an integer >= 0 (-1 over HTTP: the whole context)",
    ),
];

fn range_of(name: &'static str) -> &'static str {
    RANGES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("valid", |(_, r)| r)
}

impl InvalidParam {
    fn new(name: &'static str, value: impl std::fmt::Display) -> Self {
        Self {
            name,
            range: range_of(name),
            value: value.to_string(),
        }
    }
}

impl SamplingParams {
    /// An integer parameter a request gives as a signed number (`top_k`):
    /// a count, or an error naming it when negative.
    pub fn count(name: &'static str, v: i64) -> Result<usize, InvalidParam> {
        usize::try_from(v).map_err(|_| InvalidParam::new(name, v))
    }

    /// Checks every value against its range ([`RANGES`]): NaN, infinities
    /// and values that make no sense (a negative temperature, a top_p of 5,
    /// a repeat penalty of 0, which would divide by zero) are errors naming
    /// the parameter.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        let within = |name: &'static str, v: f32, lo: f32, hi: f32, open_lo: bool| {
            let above = if open_lo { v > lo } else { v >= lo };
            if v.is_finite() && above && v <= hi {
                Ok(())
            } else {
                Err(InvalidParam::new(name, v))
            }
        };
        within("temperature", self.temperature, 0.0, 2.0, false)?;
        within("top_p", self.top_p, 0.0, 1.0, false)?;
        within("min_p", self.min_p, 0.0, 1.0, false)?;
        within("repeat_penalty", self.repeat_penalty, 0.0, 10.0, true)?;
        within("presence_penalty", self.presence_penalty, -2.0, 2.0, false)?;
        within(
            "frequency_penalty",
            self.frequency_penalty,
            -2.0,
            2.0,
            false,
        )?;
        Ok(())
    }

    /// Argmax, no penalties.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 1,
            top_p: 1.0,
            min_p: 0.0,
            ..Self::default()
        }
    }
}

/// SplitMix64, enough for sampling and reproducible across platforms.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A sampler for one sequence (it remembers recent tokens for the penalties).
#[derive(Clone, Debug)]
pub(crate) struct Sampler {
    params: SamplingParams,
    rng: Rng,
    recent: VecDeque<u32>,
}

/// A candidate token with its (transformed) logit.
#[derive(Clone, Copy, Debug)]
struct Cand {
    id: u32,
    logit: f32,
}

fn softmax_probs(c: &[Cand]) -> Vec<f64> {
    let max = c.iter().fold(f32::NEG_INFINITY, |m, x| m.max(x.logit));
    let e: Vec<f64> = c.iter().map(|x| ((x.logit - max) as f64).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        Self {
            params,
            rng: Rng(seed),
            recent: VecDeque::new(),
        }
    }

    /// Remember a token (prompt or generated) for the penalties.
    pub fn accept(&mut self, id: u32) {
        if self.params.penalty_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.penalty_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(id);
    }

    /// Apply the repetition, presence and frequency penalties in place.
    pub fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if !self.penalizes() {
            return;
        }
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in &self.recent {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &c) in &counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if *l > 0.0 {
                *l /= p.repeat_penalty;
            } else {
                *l *= p.repeat_penalty;
            }
            *l -= c as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// Whether the penalties change anything.
    fn penalizes(&self) -> bool {
        let p = &self.params;
        p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0
    }

    /// The tokens that survive top-k, top-p and min-p (most likely first),
    /// from already-penalized logits.
    fn candidates(&self, logits: &[f32]) -> Vec<Cand> {
        let p = &self.params;
        let mut c: Vec<Cand> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| Cand {
                id: i as u32,
                logit: l,
            })
            .collect();
        // Most likely first, ties by id: a strict total order, so the top
        // k found by a partial selection and then sorted are exactly the
        // first k of the whole row sorted (a full sort of a 49k-token row
        // took ~1.7 ms a token on the CPU machine, in the step loop).
        let order = |a: &Cand, b: &Cand| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id));
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, order);
            c.truncate(p.top_k);
        }
        c.sort_by(order);
        self.nucleus(c)
    }

    /// Top-p, then min-p, on candidates sorted most likely first. Tokens a
    /// structured output's mask ruled out (-inf) never survive while any
    /// other does.
    fn nucleus(&self, mut c: Vec<Cand>) -> Vec<Cand> {
        let p = &self.params;
        if c.len() > 1 && c[0].logit > f32::NEG_INFINITY {
            c.retain(|x| x.logit > f32::NEG_INFINITY);
        }
        if p.top_p < 1.0 {
            let probs = softmax_probs(&c);
            let mut cum = 0.0;
            let mut keep = c.len();
            for (i, pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let probs = softmax_probs(&c);
            let bar = probs[0] * p.min_p as f64;
            let keep = probs.iter().take_while(|&&pr| pr >= bar).count();
            c.truncate(keep.max(1));
        }
        c
    }

    /// Temperature, then the seeded draw among the final candidates.
    fn draw(&mut self, mut c: Vec<Cand>) -> u32 {
        for x in &mut c {
            x.logit /= self.params.temperature;
        }
        let probs = softmax_probs(&c);
        let r = self.rng.next_f64();
        let mut cum = 0.0;
        let mut pick = c[c.len() - 1].id;
        for (x, pr) in c.iter().zip(&probs) {
            cum += pr;
            if r < cum {
                pick = x.id;
                break;
            }
        }
        pick
    }

    /// Pick the next token from `logits` (modified in place by the penalties)
    /// and remember it.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.apply_penalties(logits);
        let id = if self.params.temperature <= 0.0 {
            argmax(logits)
        } else {
            let c = self.candidates(logits);
            self.draw(c)
        };
        self.accept(id);
        id
    }

    /// What a backend that selects tokens where the logits are
    /// ([`m40_model::Backend::forward_select`], at most `max_k` of them)
    /// must return for [`Sampler::sample_selected`] to pick what
    /// [`Sampler::sample`] would: argmax (k = 1) when greedy, else the
    /// top_k best; None when top-k is off or above `max_k` (the caller
    /// samples from the logits).
    pub fn selection(&self, max_k: usize) -> Option<Selection> {
        let p = &self.params;
        let k = if p.temperature <= 0.0 { 1 } else { p.top_k };
        if k == 0 || k > max_k {
            return None;
        }
        let mut penalties = Vec::new();
        if self.penalizes() {
            let mut counts: HashMap<u32, u32> = HashMap::new();
            for &t in &self.recent {
                *counts.entry(t).or_default() += 1;
            }
            penalties = counts.into_iter().collect();
            penalties.sort_unstable();
        }
        Some(Selection {
            k,
            penalties,
            repeat: p.repeat_penalty,
            frequency: p.frequency_penalty,
            presence: p.presence_penalty,
            mask: None,
        })
    }

    /// Pick the next token from the candidates a backend selected for
    /// [`Sampler::selection`] ((id, penalized logit), best first; fewer
    /// than asked only when the vocabulary is smaller), and remember it.
    pub fn sample_selected(&mut self, top: &[(u32, f32)]) -> u32 {
        let id = if self.params.temperature <= 0.0 {
            top[0].0
        } else {
            let c = top.iter().map(|&(id, logit)| Cand { id, logit }).collect();
            let c = self.nucleus(c);
            self.draw(c)
        };
        self.accept(id);
        id
    }

    /// The ids `sample` may return for these (already penalized) logits
    /// (the tests' oracle).
    #[cfg(test)]
    pub fn allowed(&self, logits: &[f32]) -> Vec<u32> {
        if self.params.temperature <= 0.0 {
            return vec![argmax(logits)];
        }
        self.candidates(logits).into_iter().map(|c| c.id).collect()
    }
}

/// The host's draw among a selection's candidates ((id, penalized logit),
/// best first, as a backend's selection returns them) under `params`, its
/// SplitMix64 generator starting from `state` (advanced as the draw
/// advances it): what [`Sampler::sample_selected`] picks. The reference
/// for draws made on the device (m40-kernels' `sample_draw`).
pub fn draw_selected(params: &SamplingParams, state: &mut u64, top: &[(u32, f32)]) -> u32 {
    let mut s = Sampler {
        params: params.clone(),
        rng: Rng(*state),
        recent: VecDeque::new(),
    };
    let id = s.sample_selected(top);
    *state = s.rng.0;
    id
}

/// Log-probabilities of the model's distribution: the chosen token's and the
/// `top_n` most likely.
pub(crate) fn logprobs(logits: &[f32], chosen: u32, top_n: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let lse = (logits
        .iter()
        .map(|&v| ((v - max) as f64).exp())
        .sum::<f64>())
    .ln() as f32
        + max;
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let n = top_n.min(idx.len());
    if n > 0 {
        idx.select_nth_unstable_by(n - 1, |&a, &b| {
            logits[b as usize].total_cmp(&logits[a as usize])
        });
    }
    let mut top: Vec<(u32, f32)> = idx[..n]
        .iter()
        .map(|&i| (i, logits[i as usize] - lse))
        .collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    (logits[chosen as usize] - lse, top)
}

#[cfg(test)]
mod tests;
