//! Thinking over HTTP on both APIs (issue 57, point 3), with the default
//! model on the CPU under DeepSeek R1's chat template, whose prompt opens
//! a `<think>` block: SmolLM2 never closes it, so everything it writes is
//! reasoning, which the APIs return apart from the answer (Ollama's
//! `thinking`, OpenAI's `reasoning_content`), whole and streamed.

use std::sync::OnceLock;

use m40_runtime::EngineOptions;
use m40_serve::ServerConfig;
use serde_json::{json, Value};

mod common;

use common::*;

/// A server of SmolLM2 under DeepSeek R1's template (None without
/// ../shared/testdata).
fn thinking_server() -> Option<&'static str> {
    static S: OnceLock<Option<String>> = OnceLock::new();
    S.get_or_init(|| {
        let t = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "../../../shared/testdata/templates/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
        );
        let src = std::fs::read_to_string(t).ok()?;
        let e = engine_with({
            let mut o = EngineOptions::default();
            o.chat_template = Some(src);
            o
        });
        Some(start_with(e, ServerConfig::default()))
    })
    .as_deref()
}

#[test]
fn thinking_is_returned_apart_on_both_apis() {
    let Some(base) = thinking_server() else {
        eprintln!("skipped: ../shared/testdata is absent");
        return;
    };
    let msg = json!([{"role": "user", "content": "Why is the sky blue?"}]);
    let post_at = |path: &str, body: Value| -> Value {
        let (s, text) = post_raw_at(base, path, &body.to_string());
        assert_eq!(s, 200, "{text}");
        serde_json::from_str(text.lines().next_back().unwrap()).unwrap()
    };
    let (s, v) = post_raw_at(base, "/api/show", &json!({"model": NAME}).to_string());
    assert_eq!(s, 200);
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(v["capabilities"], json!(["completion", "thinking"]), "{v}");
    // Ollama chat, whole and streamed.
    let whole = post_at(
        "/api/chat",
        json!({"model": NAME, "messages": msg, "think": true, "stream": false, "options": greedy(12)}),
    );
    let thinking = whole["message"]["thinking"].as_str().unwrap();
    assert!(!thinking.is_empty(), "{whole}");
    assert_eq!(whole["message"]["content"], "", "{whole}");
    let (_, text) = post_raw_at(
        base,
        "/api/chat",
        &json!({"model": NAME, "messages": msg, "think": true, "options": greedy(12)}).to_string(),
    );
    let streamed: String = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|l| l["message"]["thinking"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, thinking);
    // Ollama generate: `thinking` beside `response`.
    let g = post_at(
        "/api/generate",
        json!({"model": NAME, "prompt": "Why is the sky blue?", "stream": false, "options": greedy(12)}),
    );
    assert_eq!(g["thinking"], thinking, "{g}");
    // OpenAI: reasoning_content, whole and in deltas.
    let o = post_at(
        "/v1/chat/completions",
        json!({"model": NAME, "messages": msg, "temperature": 0, "max_tokens": 12, "reasoning_effort": "high"}),
    );
    assert_eq!(
        o["choices"][0]["message"]["reasoning_content"], thinking,
        "{o}"
    );
    let (_, text) = post_raw_at(
        base,
        "/v1/chat/completions",
        &json!({"model": NAME, "messages": msg, "temperature": 0, "max_tokens": 12, "stream": true})
            .to_string(),
    );
    let deltas: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["delta"]["reasoning_content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(deltas, thinking);
    // Turned off: no reasoning is returned.
    let off = post_at(
        "/api/chat",
        json!({"model": NAME, "messages": msg, "think": false, "stream": false, "options": greedy(12)}),
    );
    assert!(off["message"].get("thinking").is_none(), "{off}");
}

#[test]
fn thinking_asked_of_a_model_that_does_not_think_is_a_400() {
    let msg = json!([{"role": "user", "content": "x"}]);
    assert_400s(&[
        (
            "/api/chat",
            json!({"model": NAME, "messages": msg, "think": true}),
            "does not think",
        ),
        (
            "/api/generate",
            json!({"model": NAME, "prompt": "x", "think": "high"}),
            "does not think",
        ),
        (
            "/api/chat",
            json!({"model": NAME, "messages": msg, "think": "max"}),
            "effort",
        ),
        (
            "/v1/chat/completions",
            json!({"model": NAME, "messages": msg, "reasoning_effort": "low"}),
            "does not think",
        ),
    ]);
    let (s, text) = post_raw(
        "/api/chat",
        &json!({"model": NAME, "messages": msg, "think": false, "stream": false, "options": greedy(2)})
            .to_string(),
    );
    assert_eq!(s, 200, "{text}");
}
