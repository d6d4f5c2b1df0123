//! Continuous batching under churn, on the CPU and a random tiny model (fast
//! enough for hundreds of steps): requests whose prompts share heads of
//! several lengths (so later ones take whole and partly shared pages from
//! the prefix cache), of different lengths, past their end of turn or not,
//! greedy or seeded, some cancelled, arriving in waves into KV pools from a
//! third of what they need to ample. No request may fail (a dry pool
//! preempts, it does not fail a step), each gets its solo tokens (the CPU's
//! batched steps and prefix hits are bitwise a cold run's), and the engine
//! ends idle with every page back.

mod support;

use std::sync::Arc;

use support::idle;

use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
use m40_gguf::GgmlType;
use m40_runtime::{
    BackendChoice, CancelToken, Completion, Engine, EngineOptions, FinishReason, Prompt, Request,
    SamplingParams,
};

const N_CTX: usize = 256;

/// The tiny shape with random Q8_0 weights, written to `dir`.
fn tiny_model(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tiny.gguf");
    let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let opts = SynthOptions {
        shape: Shape::find("tiny").unwrap(),
        ty: FileType::All(GgmlType::Q8_0),
        seed: 11,
    };
    write_model(f, &opts, |_, _| {}).unwrap();
    path
}

/// The CPU engine on `model` with a pool of `kv_tokens`, `parallel`
/// sequences at most, steps of `budget` tokens.
fn engine(
    model: &std::path::Path,
    kv_tokens: usize,
    parallel: usize,
    budget: usize,
    cache: bool,
) -> Arc<Engine> {
    let opts = {
        let mut o = EngineOptions::default();
        o.n_ctx = Some(N_CTX);
        o.backend = BackendChoice::Cpu;
        o.kv_tokens = Some(kv_tokens);
        o.parallel = Some(parallel);
        o.max_batch_tokens = Some(budget);
        o.batch_invariant = true;
        o.no_prefix_cache = !cache;
        o
    };
    Arc::new(Engine::from_path(model, opts).unwrap())
}

/// splitmix64: the test's own reproducible choices.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Request `i`: one of three shared heads, then its own words; 1 to 40
/// new tokens; every third past its end of turn; every fourth sampled
/// with its own seed.
fn request(i: usize) -> Request {
    const HEADS: [&str; 3] = [
        "a b c d ",
        "the same words open many of these prompts, ",
        "one long shared opening, as a system prompt would be, for every request that takes it: ",
    ];
    let r = mix(i as u64);
    let words: String = (0..(r % 13) as usize)
        .map(|w| format!("w{} ", mix(r + w as u64) % 50))
        .collect();
    let mut q = Request::new(Prompt::Text(format!(
        "{}{words}({i})",
        HEADS[(r >> 8) as usize % 3]
    )));
    q.max_tokens = Some(1 + (r >> 16) as usize % 40);
    q.ignore_eos = i.is_multiple_of(3);
    q.sampling = if i % 4 == 1 {
        {
            let mut o = SamplingParams::default();
            o.temperature = 0.9;
            o.top_k = 20;
            o.seed = Some(7 + i as u64);
            o
        }
    } else {
        SamplingParams::greedy()
    };
    q
}

/// Requests `ids` in waves of `wave`, each wave's requests on threads of
/// their own, started together; request i cancels itself after
/// `cancel(i)` tokens. Every result must be a completion.
fn churn(
    e: &Arc<Engine>,
    ids: &[usize],
    wave: usize,
    cancel: fn(usize) -> Option<usize>,
) -> Vec<Completion> {
    let mut out = Vec::new();
    for chunk in ids.chunks(wave) {
        let handles: Vec<_> = chunk
            .iter()
            .map(|&i| {
                let e = e.clone();
                std::thread::spawn(move || {
                    let c = CancelToken::new();
                    let mut n = 0;
                    e.generate(&request(i), &c, |_| {
                        n += 1;
                        if Some(n) == cancel(i) {
                            c.cancel();
                        }
                    })
                    .unwrap_or_else(|err| panic!("request {i} failed: {err}"))
                })
            })
            .collect();
        out.extend(handles.into_iter().map(|h| h.join().unwrap()));
    }
    out
}

fn no_cancel(_: usize) -> Option<usize> {
    None
}

fn some_cancel(i: usize) -> Option<usize> {
    (i % 7 == 3).then_some(1 + i % 5)
}

#[test]
fn requests_in_churn_get_their_solo_tokens_in_any_pool() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    const N: usize = 48;
    let ids: Vec<usize> = (0..N).collect();
    // Each alone, cold (no prefix cache).
    let cold = engine(&model, N_CTX, 1, 512, false);
    let alone = churn(&cold, &ids, 1, no_cancel);
    drop(cold);
    assert!(alone.iter().any(|c| c.token_ids.len() >= 30));
    // Pools of one context (a third or less of what a wave needs), two,
    // and ample; waves of 16 and of all 48; steps of 512 tokens, and of
    // 24 and 40 (prompts in chunks, beside up to 16 decodes).
    for (kv, wave, budget) in [
        (N_CTX, 16, 512),
        (N_CTX, N, 24),
        (2 * N_CTX, N, 40),
        (16 * N_CTX, N, 512),
    ] {
        let e = engine(&model, kv, 16, budget, true);
        let got = churn(&e, &ids, wave, some_cancel);
        for (i, (c, a)) in got.iter().zip(&alone).enumerate() {
            match some_cancel(i) {
                Some(n) if a.token_ids.len() > n => {
                    assert_eq!(
                        c.finish_reason,
                        FinishReason::Cancelled,
                        "request {i}, pool {kv}"
                    );
                    assert_eq!(c.token_ids, a.token_ids[..n], "request {i}, pool {kv}");
                }
                _ => {
                    assert_eq!(
                        c.token_ids, a.token_ids,
                        "request {i}, pool {kv}, waves of {wave}"
                    );
                    assert_eq!(c.finish_reason, a.finish_reason, "request {i}, pool {kv}");
                }
            }
        }
        let load = idle(&e);
        if kv == N_CTX {
            assert!(load.preemptions > 0, "pool {kv}: no preemption: {load:?}");
        }
        assert!(load.prefix_hits > 0, "pool {kv}: no prefix hit: {load:?}");
    }
}
