//! The streaming library API on SmolLM2: `Engine::start` gives a
//! `Generation` whose tokens are those `generate` calls back with, which
//! cancels its request when dropped, which streams the same tokens to async
//! code (`recv`, the `stream` feature), and which ends with an error, not a
//! hang, when its engine goes away.
//!
//! Each body runs on both backends (`NAME::cpu` in CI, `NAME::gpu` in the
//! GPU pack).

mod support;

use std::time::{Duration, Instant};

use support::On;

use m40_runtime::{
    BackendChoice, CancelToken, Engine, EngineError, EngineOptions, FinishReason, Prompt, Request,
    SamplingParams,
};

on_both!(
    the_iterator_gives_what_generate_calls_back_with,
    dropping_a_generation_frees_its_sequence,
    async_code_gets_the_same_tokens,
    a_generation_outliving_its_engine_ends_in_an_error,
);

fn engine(on: On) -> &'static Engine {
    support::smollm2_engine(on, 256)
}

fn story(max_tokens: usize) -> Request {
    let mut r = Request::new(Prompt::Text("Once upon a time, in a small town,".into()));
    r.sampling = SamplingParams::greedy();
    r.max_tokens = Some(max_tokens);
    r.stop = vec!["\n\n".into()];
    r
}

fn the_iterator_gives_what_generate_calls_back_with(on: On) {
    let e = engine(on);
    let mut called = Vec::new();
    let want = e
        .generate(&story(40), &CancelToken::new(), |t| called.push(t.clone()))
        .unwrap();
    let prepared = e.prepare(story(40)).unwrap();
    let mut run = e.start(&prepared, &CancelToken::new());
    let events: Vec<_> = (&mut run).collect();
    let got = run.finish().unwrap();
    assert_eq!(got.token_ids, want.token_ids);
    assert_eq!(got.text, want.text);
    assert_eq!(got.finish_reason, want.finish_reason);
    assert_eq!(
        events.iter().map(|t| (t.id, &t.text)).collect::<Vec<_>>(),
        called.iter().map(|t| (t.id, &t.text)).collect::<Vec<_>>()
    );
    assert_eq!(
        events.iter().map(|t| t.text.as_str()).collect::<String>(),
        got.text
    );
    // finish() without iterating runs it to the end all the same.
    let whole = e.start(&prepared, &CancelToken::new()).finish().unwrap();
    assert_eq!(whole.token_ids, want.token_ids);
    assert_eq!(whole.text, want.text);
}

/// Waits (up to a minute) until the engine runs and queues nothing.
fn wait_idle(e: &Engine) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let load = e.activity();
        if load.running == 0 && load.waiting == 0 {
            return;
        }
        assert!(
            Instant::now() < until,
            "the engine still runs {} and queues {}",
            load.running,
            load.waiting
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn dropping_a_generation_frees_its_sequence(on: On) {
    let e = engine(on);
    wait_idle(e);
    let prepared = e.prepare(story(200)).unwrap();
    let mut run = e.start(&prepared, &CancelToken::new());
    let first: Vec<_> = run.by_ref().take(3).collect();
    assert_eq!(first.len(), 3);
    assert!(e.activity().running + e.activity().waiting >= 1);
    drop(run);
    wait_idle(e);
    // Cancelled through its own token: the iteration ends, finish says so.
    let mut run = e.start(&prepared, &CancelToken::new());
    assert!(run.next().is_some());
    run.cancel_token().cancel();
    assert!(run.next().is_none());
    let done = run.finish().unwrap();
    assert_eq!(done.finish_reason, FinishReason::Cancelled);
    assert_eq!(done.token_ids.len(), 1);
    // And through the caller's token, its parent.
    let caller = CancelToken::new();
    let mut run = e.start(&prepared, &caller);
    assert!(run.next().is_some());
    caller.cancel();
    assert!(run.next().is_none());
    assert_eq!(run.finish().unwrap().finish_reason, FinishReason::Cancelled);
    wait_idle(e);
}

fn async_code_gets_the_same_tokens(on: On) {
    let e = engine(on);
    let prepared = e.prepare(story(40)).unwrap();
    let want = e.start(&prepared, &CancelToken::new()).finish().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (ids, text, done) = rt.block_on(async {
        let mut run = e.start(&prepared, &CancelToken::new());
        let (mut ids, mut text) = (Vec::new(), String::new());
        while let Some(t) = run.recv().await {
            ids.push(t.id);
            text.push_str(&t.text);
        }
        (ids, text, run.finish().unwrap())
    });
    assert_eq!(ids, want.token_ids);
    assert_eq!(text, want.text);
    assert_eq!(done.token_ids, want.token_ids);
}

fn a_generation_outliving_its_engine_ends_in_an_error(on: On) {
    if matches!(on, On::Gpu) {
        m40_device::testing::gpu_device("a generation outliving its engine");
    }
    let opts = {
        let mut o = EngineOptions::default();
        o.n_ctx = Some(256);
        o.backend = match on {
            On::Cpu => BackendChoice::Cpu,
            On::Gpu => BackendChoice::Gpu,
        };
        o
    };
    let e = Engine::from_path(&support::smollm2(), opts).unwrap();
    let prepared = e.prepare(story(200)).unwrap();
    let mut run = e.start(&prepared, &CancelToken::new());
    assert!(run.next().is_some());
    drop(e);
    // Whatever was sampled before the engine went may still come; then
    // the end, as an error.
    while run.next().is_some() {}
    assert!(matches!(run.finish(), Err(EngineError::Stopped)));
}
