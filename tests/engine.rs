//! The engine end to end on SmolLM2: greedy matches llama.cpp, seeds
//! reproduce, stop strings, max tokens, cancellation, context limits, logprobs.

mod support;

use std::sync::OnceLock;

use m40_runtime::{
    CancelToken, Engine, EngineError, EngineOptions, FinishReason, Message, Prompt, Request,
    SamplingParams,
};

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        Engine::from_path(
            &support::smollm2(),
            EngineOptions {
                n_ctx: Some(256),
                ..Default::default()
            },
        )
        .unwrap()
    })
}

fn raw(text: &str, sampling: SamplingParams, max_tokens: usize) -> Request {
    let mut r = Request::new(Prompt::Text(text.into()));
    r.sampling = sampling;
    r.max_tokens = Some(max_tokens);
    r
}

#[test]
fn greedy_raw_prompt_matches_llama_cpp() {
    let e = engine();
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

#[test]
fn seeds_reproduce_and_differ() {
    let e = engine();
    let s = |seed| SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ..Default::default()
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

#[test]
fn stop_strings_end_generation_and_are_not_emitted() {
    let e = engine();
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

#[test]
fn chat_prompts_use_the_template_and_stop_at_end_of_turn() {
    let e = engine();
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
}

#[test]
fn cancellation_from_another_thread() {
    let e = engine();
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

#[test]
fn context_limits() {
    let e = engine();
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

#[test]
fn logprobs_are_reported() {
    let e = engine();
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
