//! Continuous batching end to end on SmolLM2: requests that run together
//! get, token for token, what each gets alone (batch invariance), through
//! shared prompt prefixes, different lengths, seeded sampling,
//! cancellations and a KV cache small enough to force preemption.
//!
//! Each body runs on both backends (`NAME::cpu` in CI, `NAME::gpu` in the
//! GPU pack), as tests/engine.rs.

mod support;

use support::{idle, On};

use std::sync::Arc;

use m40_runtime::{
    BackendChoice, CancelToken, Completion, Engine, EngineOptions, FinishReason, Prompt, Request,
    SamplingParams,
};

const N_CTX: usize = 256;

/// SmolLM2 on `on` with a KV cache of `kv_tokens` for up to `parallel`
/// sequences at once.
fn engine(on: On, kv_tokens: usize, parallel: usize) -> Arc<Engine> {
    engine_with(on, kv_tokens, parallel, |_| {})
}

/// [`engine`] with other options changed by `f`.
fn engine_with(
    on: On,
    kv_tokens: usize,
    parallel: usize,
    f: impl FnOnce(&mut EngineOptions),
) -> Arc<Engine> {
    let backend = match on {
        On::Cpu => BackendChoice::Cpu,
        On::Gpu => {
            m40_device::testing::gpu_device("batching tests");
            BackendChoice::Gpu
        }
    };
    let mut opts = {
        let mut o = EngineOptions::default();
        o.n_ctx = Some(N_CTX);
        o.backend = backend;
        o.kv_tokens = Some(kv_tokens);
        o.parallel = Some(parallel);
        // Bitwise each request's solo tokens on the GPU too (its batched
        // decode is checked against the CPU in crates/m40-model's
        // gpu_batch tests instead), and no prefix cache there: a hit
        // computes a prompt in other chunks than a cold run, which the
        // GPU's kernels do not give bitwise alike
        // (shared_prefixes_reuse_cached_pages turns it on). The CPU's
        // prefix hits are bitwise a cold run's: on.
        o.batch_invariant = true;
        o.no_prefix_cache = matches!(on, On::Gpu);
        o
    };
    f(&mut opts);
    Arc::new(Engine::from_path(&support::smollm2(), opts).unwrap())
}

on_both!(
    concurrent_requests_get_their_solo_tokens,
    preemption_changes_no_token,
    shared_prefixes_reuse_cached_pages,
    lockstep_sequences_fill_the_pool_and_are_preempted,
);

/// Request `i` of a varied set: prompts that share prefixes (a system
/// line, then a topic) and differ in length, 1 to 20 new tokens, greedy
/// or seeded sampling.
fn request(i: usize) -> Request {
    const TOPICS: [&str; 5] = [
        "the sea",
        "a city at night",
        "bread",
        "mountains",
        "a library",
    ];
    const ASKS: [&str; 4] = [
        "Describe it.",
        "Write one sentence about it.",
        "List three things about it, briefly, as a poem would.",
        "Why?",
    ];
    let system = if i.is_multiple_of(3) {
        "You are a careful writer who answers in plain words. "
    } else {
        ""
    };
    let text = format!(
        "{system}Topic: {}. {} ({i})",
        TOPICS[i % TOPICS.len()],
        ASKS[(i / 5) % ASKS.len()]
    );
    let mut r = Request::new(Prompt::Text(text));
    r.max_tokens = Some(1 + (i * 7) % 20);
    r.sampling = if i % 4 == 1 {
        {
            let mut o = SamplingParams::default();
            o.temperature = 0.8;
            o.top_k = 40;
            o.seed = Some(1000 + i as u64);
            o
        }
    } else {
        SamplingParams::greedy()
    };
    r
}

/// Request `i` of the preemption test: [`request`], longer.
fn long_request(i: usize) -> Request {
    let mut r = request(i);
    r.max_tokens = Some(40 + i % 8);
    r
}

/// Request `i` run alone, on an otherwise idle engine.
fn solo(e: &Engine, make: fn(usize) -> Request, i: usize) -> Completion {
    e.generate(&make(i), &CancelToken::new(), |_| {}).unwrap()
}

/// Requests `ids` at once, each on its own thread; those in `cancel_after`
/// cancel themselves after that many tokens.
fn together(
    e: &Arc<Engine>,
    make: fn(usize) -> Request,
    ids: &[usize],
    cancel_after: impl Fn(usize) -> Option<usize>,
) -> Vec<Completion> {
    let handles: Vec<_> = ids
        .iter()
        .map(|&i| {
            let (e, after) = (e.clone(), cancel_after(i));
            std::thread::spawn(move || {
                let cancel = CancelToken::new();
                let mut n = 0;
                e.generate(&make(i), &cancel, |_| {
                    n += 1;
                    if Some(n) == after {
                        cancel.cancel();
                    }
                })
                .unwrap()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn check(i: usize, got: &Completion, alone: &Completion, cancelled_after: Option<usize>) {
    match cancelled_after {
        Some(n) if alone.token_ids.len() > n => {
            assert_eq!(got.finish_reason, FinishReason::Cancelled, "request {i}");
            assert_eq!(got.token_ids, alone.token_ids[..n], "request {i}");
        }
        _ => {
            assert_eq!(got.token_ids, alone.token_ids, "request {i}: tokens");
            assert_eq!(got.text, alone.text, "request {i}: text");
            assert_eq!(got.finish_reason, alone.finish_reason, "request {i}");
        }
    }
}

fn concurrent_requests_get_their_solo_tokens(on: On) {
    const N: usize = 64;
    // Each request alone on an engine without a prefix cache: cold.
    let cold = engine_with(on, N * 64, N, |o| o.no_prefix_cache = true);
    let alone: Vec<Completion> = (0..N).map(|i| solo(&cold, request, i)).collect();
    drop(cold);
    assert!(alone.iter().any(|c| c.token_ids.len() >= 10));
    let e = engine(on, N * 64, N);
    let steps_before = e.activity().steps;
    for n in [2usize, 8, N] {
        let ids: Vec<usize> = (0..n).collect();
        // In the largest batch, every ninth request leaves after 2 tokens.
        let cancel_after = |i: usize| (n == N && i % 9 == 4).then_some(2);
        let got = together(&e, request, &ids, cancel_after);
        for (&i, c) in ids.iter().zip(&got) {
            check(i, c, &alone[i], cancel_after(i));
        }
    }
    // Cancelled sequences leave at the engine's next step.
    let a = idle(&e);
    // On the CPU the requests' shared prefixes came from the prefix cache.
    if matches!(on, On::Cpu) {
        assert!(a.prefix_hits > 0, "{a:?}");
    }
    // The batches ran in fewer steps than their tokens one at a time would.
    let tokens: usize = alone.iter().map(|c| c.token_ids.len()).sum();
    assert!(
        a.steps - steps_before < tokens as u64,
        "{} steps for {tokens} tokens",
        a.steps - steps_before
    );
}

fn preemption_changes_no_token(on: On) {
    // A pool of one context for 16 sequences of up to ~50 tokens each: the
    // pool runs dry mid-decode and the newest sequences are preempted.
    const N: usize = 16;
    let e = engine(on, N_CTX, N);
    let ids: Vec<usize> = (0..N).map(|i| 3 * i).collect();
    let alone: Vec<Completion> = ids.iter().map(|&i| solo(&e, long_request, i)).collect();
    let before = e.activity().preemptions;
    let got = together(&e, long_request, &ids, |_| None);
    for ((&i, c), a) in ids.iter().zip(&got).zip(&alone) {
        check(i, c, a, None);
    }
    assert!(
        e.activity().preemptions > before,
        "no sequence was preempted: the test did not test preemption"
    );
    idle(&e);
}

/// A second request that starts as the first did (a long system prompt)
/// reuses its KV pages (prefix caching) up to the first token they differ
/// in, the last page shared in part (copied before the request writes into
/// it), and answers as an engine without the cache does (on the CPU
/// bitwise); a chat's next turn, which resends the first turn and its
/// answer, reuses those pages too.
fn shared_prefixes_reuse_cached_pages(on: On) {
    // Steps of 64 tokens (chunks of 56 beside 8 decodes): the prompts run
    // in two chunks, and a cached prefix can cover a whole chunk.
    let small_steps = |o: &mut EngineOptions| o.max_batch_tokens = Some(64);
    let e = engine_with(on, 4096, 8, |o| {
        small_steps(o);
        o.no_prefix_cache = false;
    });
    let cold = engine_with(on, 4096, 8, |o| {
        small_steps(o);
        o.no_prefix_cache = true;
    });
    let system = "You answer questions for a small bakery in a quiet town. The bakery sells \
        bread, rolls, cakes and pies, opens at seven in the morning and closes at six in the \
        evening, every day but Sunday. Answer briefly and politely. ";
    let ask = |q: &str| {
        let mut r = Request::new(Prompt::Text(format!(
            "{system}Question: {q}\nAnswer: The bakery"
        )));
        r.sampling = SamplingParams::greedy();
        r.max_tokens = Some(12);
        r.logprobs = Some(1);
        r
    };
    let none = CancelToken::new();
    e.generate(&ask("What do you sell?"), &none, |_| {})
        .unwrap();
    let before = e.activity();
    let mut lw = None;
    let warm = e
        .generate(&ask("When do you open?"), &none, |t| {
            lw = lw.or(t.logprob);
        })
        .unwrap();
    let after = e.activity();
    let mut lc = None;
    let cold_b = cold
        .generate(&ask("When do you open?"), &none, |t| {
            lc = lc.or(t.logprob);
        })
        .unwrap();
    let (hits, saved) = (
        after.prefix_hits - before.prefix_hits,
        after.prefix_tokens_saved - before.prefix_tokens_saved,
    );
    assert_eq!(cold.activity().prefix_hits, 0);
    let page = after.kv_page_tokens as u64;
    assert_eq!(hits, 1, "{after:?}");
    // Every token the two prompts share (system and "Question: "), not
    // only their whole pages.
    let ids = |q: &str| e.prompt_tokens(&ask(q).prompt).unwrap();
    let (a, b) = (ids("What do you sell?"), ids("When do you open?"));
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count() as u64;
    assert!(
        !shared.is_multiple_of(page) && shared > page,
        "the test wants a part page: {shared}"
    );
    assert_eq!(saved, shared, "{saved} tokens saved");
    assert!(after.prefix_cached_pages > 0);
    assert!(!warm.token_ids.is_empty() && !cold_b.token_ids.is_empty());
    let (lw, lc) = (lw.unwrap(), lc.unwrap());
    match on {
        // Every row's arithmetic is its own: the cached rows are the ones
        // a cold run writes.
        On::Cpu => {
            assert_eq!(warm.token_ids, cold_b.token_ids);
            assert_eq!(lw.to_bits(), lc.to_bits(), "{lw} vs {lc}");
        }
        // The cached pages were computed in another chunking: the same
        // first token, its log-probability within rounding.
        On::Gpu => {
            assert_eq!(warm.token_ids[0], cold_b.token_ids[0]);
            assert!((lw - lc).abs() <= 1e-2, "{lw} vs {lc}");
            eprintln!("warm {:?}\ncold {:?}", warm.token_ids, cold_b.token_ids);
        }
    }
    // The next turn of a chat: the first turn and its answer again.
    let mut next = ask("When do you open?");
    next.prompt = Prompt::Text(format!(
        "{system}Question: When do you open?\nAnswer: The bakery{}\nQuestion: And on Sunday?\nAnswer:",
        warm.text
    ));
    let b2 = e.activity();
    e.generate(&next, &none, |_| {}).unwrap();
    let a2 = e.activity();
    assert_eq!(a2.prefix_hits - b2.prefix_hits, 1);
    assert!(a2.prefix_tokens_saved - b2.prefix_tokens_saved >= saved);
    idle(&e);
}

/// Request `i` of the lockstep test: prompts of one length (their chat
/// template and first words shared, so later ones find part of a page
/// cached), 60 tokens each past any end of turn, greedy.
fn lockstep_request(i: usize) -> Request {
    let mut r = Request::new(Prompt::Text(format!(
        "Client {i}, request 0: tell a long story about the number 0."
    )));
    r.max_tokens = Some(60);
    r.ignore_eos = true;
    r.sampling = SamplingParams::greedy();
    r
}

fn lockstep_sequences_fill_the_pool_and_are_preempted(on: On) {
    // Nine sequences that cross their pages' ends in the same steps, in a
    // pool of a third of what they need, with the prefix cache on (on the
    // GPU too: there its hits are not bitwise a cold run's, so only the
    // CPU compares tokens). A partly shared page's copy once took a page
    // the scheduler had not counted, and a step found the pool dry and
    // failed every sequence in it.
    const N: usize = 9;
    let e = engine_with(on, N_CTX, N, |o| o.no_prefix_cache = false);
    let ids: Vec<usize> = (1..=N).collect();
    let alone: Vec<Completion> = ids.iter().map(|&i| solo(&e, lockstep_request, i)).collect();
    let before = e.activity();
    let got = together(&e, lockstep_request, &ids, |_| None);
    for ((&i, c), a) in ids.iter().zip(&got).zip(&alone) {
        assert_eq!(c.token_ids.len(), 60, "request {i}");
        if matches!(on, On::Cpu) {
            check(i, c, a, None);
        }
    }
    let a = idle(&e);
    assert!(a.preemptions > before.preemptions, "no preemption: {a:?}");
    assert!(a.prefix_hits > before.prefix_hits, "no prefix hit: {a:?}");
}
