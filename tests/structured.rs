//! Structured outputs end to end on SmolLM2 (issue 57, point 1): answers
//! under a JSON schema, JSON mode, GBNF and regex grammars parse and
//! validate, greedy and sampled, alone and batched beside free requests;
//! one cut by max_tokens says so; a grammar the engine cannot use is an
//! error before anything runs.
//!
//! Each body runs on both backends: `NAME::cpu` in CI, `NAME::gpu` (the
//! masked selection kernel) in the GPU pack.

mod support;

use support::On;

use m40_runtime::{
    CancelToken, Engine, EngineError, FinishReason, Format, Message, Prompt, Request,
    SamplingParams,
};
use serde_json::{json, Value};

fn engine(on: On) -> &'static Engine {
    support::smollm2_engine(on, 512)
}

on_both!(
    schema_answers_validate_greedy_and_sampled,
    grammars_and_json_mode,
    batched_constrained_and_free_requests,
    a_cut_answer_is_length_and_a_bad_schema_an_error,
);

fn person() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        },
        "required": ["name", "age", "colors"],
        "additionalProperties": false,
    })
}

/// Whether `v` is valid under [`person`].
fn is_person(v: &Value) -> bool {
    let o = v.as_object().expect("an object");
    o.len() == 3
        && o["name"].as_str().is_some_and(|s| s.chars().count() <= 20)
        && o["age"].as_i64().is_some_and(|a| (0..=150).contains(&a))
        && o["colors"].as_array().is_some_and(|c| {
            c.len() <= 3
                && c.iter()
                    .all(|x| ["red", "green", "blue"].contains(&x.as_str().unwrap_or("")))
        })
}

fn chat(text: &str, format: Format, sampling: SamplingParams, max_tokens: usize) -> Request {
    let mut r = Request::new(Prompt::Chat(vec![Message::new("user", text)]));
    r.format = Some(format);
    r.sampling = sampling;
    r.max_tokens = Some(max_tokens);
    r
}

fn run(e: &Engine, r: &Request) -> m40_runtime::Completion {
    e.generate(r, &CancelToken::new(), |_| {}).unwrap()
}

fn schema_answers_validate_greedy_and_sampled(on: On) {
    let e = engine(on);
    let ask = "Describe a person as JSON with their name, age and favourite colors.";
    let mut greedy = None;
    for seed in [None, Some(1), Some(2), Some(3)] {
        let sampling = match seed {
            None => SamplingParams::greedy(),
            Some(s) => {
                let mut o = SamplingParams::default();
                o.temperature = 1.0;
                o.seed = Some(s);
                o
            }
        };
        let done = run(e, &chat(ask, Format::JsonSchema(person()), sampling, 200));
        assert_eq!(done.finish_reason, FinishReason::Stop, "{:?}", done.text);
        let v: Value =
            serde_json::from_str(&done.text).unwrap_or_else(|err| panic!("{:?}: {err}", done.text));
        assert!(is_person(&v), "{v}");
        if seed.is_none() {
            greedy = Some(done.text);
        }
    }
    // Greedy is reproducible.
    let again = run(
        e,
        &chat(
            ask,
            Format::JsonSchema(person()),
            SamplingParams::greedy(),
            200,
        ),
    );
    assert_eq!(Some(again.text), greedy);
}

fn grammars_and_json_mode(on: On) {
    let e = engine(on);
    let g = SamplingParams::greedy();
    let done = run(
        e,
        &chat(
            "Give me a JSON object about cats.",
            Format::Json,
            g.clone(),
            300,
        ),
    );
    if done.finish_reason == FinishReason::Stop {
        let v: Value =
            serde_json::from_str(&done.text).unwrap_or_else(|err| panic!("{:?}: {err}", done.text));
        assert!(v.is_object());
    } else {
        // A free-form object may run past the limit: it is a prefix of one.
        assert_eq!(done.finish_reason, FinishReason::Length);
        assert!(done.text.starts_with('{'), "{:?}", done.text);
    }
    let gbnf = Format::Gbnf("root ::= (\"yes\" | \"no\") \", because \" [a-z ]{1,40} \".\"".into());
    let done = run(e, &chat("Is the sky blue?", gbnf, g.clone(), 100));
    assert_eq!(done.finish_reason, FinishReason::Stop, "{:?}", done.text);
    let t = &done.text;
    assert!(
        t.starts_with("yes, because ") || t.starts_with("no, because "),
        "{t:?}"
    );
    assert!(
        t.ends_with('.') && t.len() <= "no, because .".len() + 41,
        "{t:?}"
    );
    let done = run(
        e,
        &chat(
            "What is 6 times 7?",
            Format::Regex("[0-9]{1,3}".into()),
            g,
            10,
        ),
    );
    assert!(
        done.text.chars().all(|c| c.is_ascii_digit()) && !done.text.is_empty(),
        "{:?}",
        done.text
    );
}

/// Constrained and free requests in the same steps: each constrained
/// answer validates, and each free one is what it gets alone.
fn batched_constrained_and_free_requests(on: On) {
    // Its own engine: the others' requests would keep the shared one busy
    // when it checks that nothing is left running.
    let own = support::own_smollm2_engine(on, 512);
    let e = &own;
    let free = |i: u64| {
        let mut r = Request::new(Prompt::Text(format!("Once upon a time, number {i},")));
        r.sampling = {
            let mut o = SamplingParams::default();
            o.seed = Some(i);
            o
        };
        r.max_tokens = Some(24);
        r
    };
    let solo: Vec<String> = (0..3).map(|i| run(e, &free(i)).text).collect();
    let ask = "Describe a person as JSON.";
    std::thread::scope(|s| {
        let constrained: Vec<_> = (0..5u64)
            .map(|i| {
                s.spawn(move || {
                    let sampling = {
                        let mut o = SamplingParams::default();
                        o.seed = Some(10 + i);
                        o
                    };
                    run(e, &chat(ask, Format::JsonSchema(person()), sampling, 200))
                })
            })
            .collect();
        let frees: Vec<_> = (0..3u64)
            .map(|i| s.spawn(move || run(e, &free(i)).text))
            .collect();
        for h in constrained {
            let done = h.join().unwrap();
            assert_eq!(done.finish_reason, FinishReason::Stop, "{:?}", done.text);
            let v: Value = serde_json::from_str(&done.text).unwrap();
            assert!(is_person(&v), "{v}");
        }
        for (i, h) in frees.into_iter().enumerate() {
            let text = h.join().unwrap();
            if let On::Cpu = on {
                assert_eq!(text, solo[i], "free request {i}");
            }
        }
    });
    support::idle(e);
}

fn a_cut_answer_is_length_and_a_bad_schema_an_error(on: On) {
    let e = engine(on);
    let done = run(
        e,
        &chat(
            "Describe a person as JSON.",
            Format::JsonSchema(person()),
            SamplingParams::greedy(),
            5,
        ),
    );
    assert_eq!(done.finish_reason, FinishReason::Length);
    assert!(
        serde_json::from_str::<Value>(&done.text).is_err(),
        "{:?}",
        done.text
    );
    let bad = chat(
        "x",
        Format::JsonSchema(json!({"type": "array", "uniqueItems": true})),
        SamplingParams::greedy(),
        5,
    );
    match e.prepare(bad) {
        Err(EngineError::Format(err)) => assert!(err.to_string().contains("uniqueItems"), "{err}"),
        other => panic!("{other:?}"),
    }
}
