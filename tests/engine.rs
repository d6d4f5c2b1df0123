//! The engine end to end on SmolLM2: greedy matches llama.cpp, seeds
//! reproduce, stop strings, max tokens, cancellation, context limits, logprobs,
//! a CPU KV cache the machine cannot hold.
//!
//! Each test body runs on both backends (as candle's `test_device!`):
//! `NAME::cpu` in CI, `NAME::gpu` ignored without a GPU and run by the GPU
//! pack (which needs the model at `M40_SMOLLM2`: the device has no network).

mod support;

use support::On;

use m40_runtime::{
    BackendChoice, CancelToken, Engine, EngineError, EngineOptions, FinishReason, Message, Prompt,
    Request, SamplingParams,
};

/// SmolLM2 on `on`, loaded once per backend.
fn engine(on: On) -> &'static Engine {
    support::smollm2_engine(on, 256)
}

on_both!(
    greedy_raw_prompt_matches_llama_cpp,
    seeds_reproduce_and_differ,
    stop_strings_end_generation_and_are_not_emitted,
    chat_prompts_use_the_template_and_stop_at_end_of_turn,
    cancellation_from_another_thread,
    context_limits,
    logprobs_are_reported,
);

fn raw(text: &str, sampling: SamplingParams, max_tokens: usize) -> Request {
    let mut r = Request::new(Prompt::Text(text.into()));
    r.sampling = sampling;
    r.max_tokens = Some(max_tokens);
    r
}

fn greedy_raw_prompt_matches_llama_cpp(on: On) {
    let e = engine(on);
    let mut events = Vec::new();
    let c = e
        .generate(
            &raw("The capital of France is", SamplingParams::greedy(), 5),
            &CancelToken::new(),
            |ev| events.push(ev.clone()),
        )
        .unwrap();
    // llama.cpp's greedy ids for this prompt (reference.json), all with top-2 gaps > 0.8.
    assert_eq!(c.token_ids, vec![7042, 30, 198, 198, 504]);
    assert_eq!(c.finish_reason, FinishReason::Length);
    assert_eq!(c.text, " Paris.\n\nThe");
    assert_eq!(
        events.iter().map(|e| e.text.as_str()).collect::<String>(),
        c.text
    );
    assert_eq!(c.timings.prompt_tokens, 5);
    assert_eq!(c.timings.generated_tokens, 5);
    assert!(c.timings.time_to_first_token_ms > 0.0);
}

fn seeds_reproduce_and_differ(on: On) {
    let e = engine(on);
    let s = |seed| {
        let mut o = SamplingParams::default();
        o.temperature = 1.0;
        o.seed = Some(seed);
        o
    };
    let run = |seed| {
        e.generate(
            &raw("Once upon a time", s(seed), 24),
            &CancelToken::new(),
            |_| {},
        )
        .unwrap()
        .token_ids
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

fn stop_strings_end_generation_and_are_not_emitted(on: On) {
    let e = engine(on);
    let mut r = raw("1, 2, 3, 4, 5,", SamplingParams::greedy(), 30);
    r.stop = vec![" 8".into()];
    let mut streamed = String::new();
    let c = e
        .generate(&r, &CancelToken::new(), |ev| streamed.push_str(&ev.text))
        .unwrap();
    assert_eq!(c.finish_reason, FinishReason::Stop);
    assert_eq!(c.text, " 6, 7,");
    assert_eq!(streamed, c.text);
}

fn chat_prompts_use_the_template_and_stop_at_end_of_turn(on: On) {
    let e = engine(on);
    let p = Prompt::Chat(vec![Message::new("user", "Say hi.")]);
    let ids = e.prompt_tokens(&p).unwrap();
    let im_start = e.tokenizer().token_id("<|im_start|>").unwrap();
    assert_eq!(ids[0], im_start);
    let mut r = Request::new(p);
    r.sampling = SamplingParams::greedy();
    r.max_tokens = Some(60);
    let c = e.generate(&r, &CancelToken::new(), |_| {}).unwrap();
    assert_eq!(c.finish_reason, FinishReason::Stop, "{:?}", c.text);
    assert!(!c.text.contains("<|im_end|>") && !c.text.is_empty());
    // ignore_eos: the same tokens, the end of turn, then on to max_tokens.
    r.ignore_eos = true;
    let long = e.generate(&r, &CancelToken::new(), |_| {}).unwrap();
    assert_eq!(long.finish_reason, FinishReason::Length, "{:?}", long.text);
    assert_eq!(long.token_ids.len(), 60);
    let n = c.token_ids.len();
    assert_eq!(long.token_ids[..n], c.token_ids[..]);
    assert!(e.tokenizer().is_eog(long.token_ids[n]));
    assert!(long.text.starts_with(&c.text) && !long.text.contains("<|im_end|>"));
}

fn cancellation_from_another_thread(on: On) {
    let e = engine(on);
    let cancel = CancelToken::new();
    let c2 = cancel.clone();
    let mut n = 0;
    let c = e
        .generate(
            &raw("Write a long story.", SamplingParams::greedy(), 200),
            &cancel,
            |_| {
                n += 1;
                if n == 3 {
                    let c3 = c2.clone();
                    std::thread::spawn(move || c3.cancel()).join().unwrap();
                }
            },
        )
        .unwrap();
    assert_eq!(c.finish_reason, FinishReason::Cancelled);
    assert_eq!(c.token_ids.len(), 3);
}

fn context_limits(on: On) {
    let e = engine(on);
    let long = "word ".repeat(400);
    let err = e
        .generate(
            &raw(&long, SamplingParams::greedy(), 10),
            &CancelToken::new(),
            |_| {},
        )
        .unwrap_err();
    assert!(
        matches!(err, EngineError::ContextOverflow { n_ctx: 256, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("256"));
    let mut r = raw(&long, SamplingParams::greedy(), 10);
    r.truncate_prompt = true;
    let c = e.generate(&r, &CancelToken::new(), |_| {}).unwrap();
    assert_eq!(c.timings.prompt_tokens, 246);
    assert_eq!(c.token_ids.len(), 10);
    assert!(matches!(
        e.generate(
            &raw("", SamplingParams::greedy(), 1),
            &CancelToken::new(),
            |_| {}
        ),
        Err(EngineError::EmptyPrompt)
    ));
}

fn logprobs_are_reported(on: On) {
    let e = engine(on);
    let mut r = raw("The capital of France is", SamplingParams::greedy(), 3);
    r.logprobs = Some(5);
    let mut events = Vec::new();
    e.generate(&r, &CancelToken::new(), |ev| events.push(ev.clone()))
        .unwrap();
    assert_eq!(events.len(), 3);
    for ev in &events {
        let lp = ev.logprob.unwrap();
        assert!(lp <= 0.0);
        assert_eq!(ev.top_logprobs.len(), 5);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(ev.top_logprobs[0].0, ev.id);
        assert!((ev.top_logprobs[0].2 - lp).abs() < 1e-6);
        assert!(ev.top_logprobs.windows(2).all(|w| w[0].2 >= w[1].2));
    }
    assert_eq!(events[0].top_logprobs[0].1, "ĠParis");
}

/// A CPU KV cache (`--kv-tokens`) larger than the machine holds is refused
/// at load with an error that says so, not an abort on a later request.
#[test]
fn a_cpu_kv_cache_beyond_the_machine_is_a_clear_error() {
    let opts = {
        let mut o = EngineOptions::default();
        o.n_ctx = Some(256);
        o.backend = BackendChoice::Cpu;
        o.kv_tokens = Some(1 << 40);
        o
    };
    let e = Engine::from_path(&support::smollm2(), opts)
        .err()
        .expect("no machine holds 2^40 tokens of KV cache");
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            EngineError::Model(m40_model::ModelError::HostMemory { .. })
        ),
        "{msg}"
    );
    assert!(msg.contains("KV cache of 1099511627776 tokens"), "{msg}");
}
