//! Thinking end to end (issue 57, point 3) on SmolLM2 with the chat
//! templates of models that think: Qwen3's (`<think>` blocks, turned off
//! by `enable_thinking`) and DeepSeek R1's (its prompt opens the block).
//! SmolLM2 does not think by itself, so a grammar makes it write the
//! blocks; what is checked is that the engine separates them from the
//! answer as they stream, on both backends.

mod support;

use m40_runtime::{
    CancelToken, Completion, Engine, EngineError, Format, Message, Prompt, Request, Think,
};
use support::On;

on_both!(
    think_blocks_are_separated_as_they_stream,
    a_prompt_that_opens_the_block,
    thinking_turned_off_or_asked_of_a_model_that_cannot,
);

fn ask(think: Option<Think>, grammar: &str) -> Request {
    let mut r = Request::new(Prompt::Chat(vec![Message::new(
        "user",
        "Why is the sky blue?",
    )]));
    r.think = think;
    r.format = Some(Format::Lark(grammar.to_string()));
    r.max_tokens = Some(80);
    r
}

/// Runs `r`, checking that the streamed pieces add up to the completion.
fn run(e: &Engine, r: &Request) -> Completion {
    let (mut text, mut thinking) = (String::new(), String::new());
    let done = e
        .generate(r, &CancelToken::new(), |t| {
            text.push_str(&t.text);
            thinking.push_str(&t.thinking);
        })
        .unwrap();
    assert_eq!((text, thinking), (done.text.clone(), done.thinking.clone()));
    done
}

fn lower(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c == ' ')
}

const QWEN3: &str = "Qwen-Qwen3-0.6B.jinja";

fn think_blocks_are_separated_as_they_stream(on: On) {
    if support::testdata().is_none() {
        return;
    }
    let e = support::templated_engine(on, QWEN3);
    assert_eq!(e.thinking(), Some(m40_runtime::Thinking::Tags));
    let g = r#"start: "<think>\n" /[a-z ]{3,40}/ "\n</think>\n\n" /[A-Z][a-z ]{3,40}/"#;
    for think in [None, Some(Think::On)] {
        let d = run(e, &ask(think.clone(), g));
        assert!(lower(d.thinking.trim()), "{think:?}: {d:?}");
        assert!(
            d.text.starts_with(|c: char| c.is_ascii_uppercase()),
            "{think:?}: {d:?}"
        );
        assert!(
            !d.text.contains("think>") && !d.thinking.contains("think>"),
            "{d:?}"
        );
    }
}

fn a_prompt_that_opens_the_block(on: On) {
    if support::testdata().is_none() {
        return;
    }
    let e = support::templated_engine(on, "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja");
    let r = ask(None, r#"start: /[a-z ]{3,40}/ "</think>" /[a-z ]{3,20}/"#);
    let prepared = e.prepare(r.clone()).unwrap();
    let prompt = e
        .tokenizer()
        .decode_with_special(prepared.prompt_tokens())
        .unwrap();
    assert!(prompt.trim_end().ends_with("<think>"), "{prompt:?}");
    let d = run(e, &r);
    assert!(lower(&d.thinking) && lower(&d.text), "{d:?}");
}

fn thinking_turned_off_or_asked_of_a_model_that_cannot(on: On) {
    if support::testdata().is_none() {
        return;
    }
    // Qwen3 off: the template closes an empty block in the prompt, and
    // what the model writes as reasoning anyway is dropped.
    let e = support::templated_engine(on, QWEN3);
    let g = r#"start: "<think>" /[a-z ]{3,40}/ "</think>" /[A-Z][a-z ]{3,40}/"#;
    let r = ask(Some(Think::Off), g);
    let prepared = e.prepare(r.clone()).unwrap();
    let prompt = e
        .tokenizer()
        .decode_with_special(prepared.prompt_tokens())
        .unwrap();
    assert!(prompt.ends_with("<think>\n\n</think>\n\n"), "{prompt:?}");
    let d = run(e, &r);
    assert_eq!(d.thinking, "");
    assert!(
        d.text.starts_with(|c: char| c.is_ascii_uppercase()),
        "{d:?}"
    );
    // SmolLM2's own template marks no reasoning: on is an error, off is not.
    let plain = support::smollm2_engine(on, 1024);
    assert_eq!(plain.thinking(), None);
    for t in [Think::On, Think::Effort("high".into())] {
        let err = plain.prepare(ask(Some(t), "start: \"x\"")).unwrap_err();
        assert!(matches!(err, EngineError::NoThinking), "{err}");
    }
    plain
        .prepare(ask(Some(Think::Off), "start: \"x\""))
        .unwrap();
}
