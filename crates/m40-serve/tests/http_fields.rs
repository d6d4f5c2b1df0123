//! The rest of Ollama's and OpenAI's request fields (issue 57, point 5),
//! with the default model on the CPU: `context` continues a conversation,
//! `logprobs` on the Ollama routes, `suffix`, `num_ctx`, `keep_alive`,
//! `logit_bias`, and unknown `/v1` routes in OpenAI's error shape.

use serde_json::{json, Value};

mod common;

use common::*;

fn generate(body: Value) -> Value {
    let (s, v) = post("/api/generate", body);
    assert_eq!(s, 200, "{v}");
    v
}

#[test]
fn context_continues_a_conversation() {
    let first = generate(
        json!({"model": NAME, "prompt": "My name is Zebulon.", "stream": false,
                                "options": greedy(40)}),
    );
    let context = first["context"].as_array().unwrap().clone();
    assert!(context.len() > first["prompt_eval_count"].as_u64().unwrap() as usize);
    let ask = |ctx: Option<&Vec<Value>>| {
        let mut b = json!({"model": NAME, "prompt": "What is my name?", "stream": false,
                           "options": greedy(30)});
        if let Some(c) = ctx {
            b["context"] = json!(c);
        }
        generate(b)
    };
    let with = ask(Some(&context));
    let without = ask(None);
    assert!(
        with["response"].as_str().unwrap().contains("Zebulon"),
        "{with}"
    );
    assert!(
        !without["response"].as_str().unwrap().contains("Zebulon"),
        "{without}"
    );
    assert!(with["prompt_eval_count"].as_u64() > without["prompt_eval_count"].as_u64());
    let (s, text) = post_raw(
        "/api/generate",
        &json!({"model": NAME, "prompt": "x", "context": [1, -2]}).to_string(),
    );
    assert_eq!(s, 400, "{text}");
}

#[test]
fn ollama_logprobs_whole_and_streamed() {
    let body = json!({"model": NAME, "prompt": "The sky is", "raw": true, "stream": false,
                      "logprobs": true, "top_logprobs": 3, "options": greedy(8)});
    let v = generate(body.clone());
    let lps = v["logprobs"].as_array().unwrap();
    assert_eq!(lps.len() as u64, v["eval_count"].as_u64().unwrap(), "{v}");
    for lp in lps {
        let top = lp["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{lp}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], lp["token"], "{lp}");
        assert!(lp["logprob"].as_f64().unwrap() <= 0.0);
    }
    let text: String = lps.iter().map(|l| l["token"].as_str().unwrap()).collect();
    assert_eq!(text, v["response"].as_str().unwrap());
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let lines = ndjson("/api/generate", streamed);
    let n: usize = lines
        .iter()
        .filter_map(|l| l["logprobs"].as_array())
        .map(Vec::len)
        .sum();
    assert_eq!(n, lps.len());
    let (s, text) = post_raw(
        "/api/chat",
        &json!({"model": NAME, "messages": [{"role": "user", "content": "x"}], "logprobs": true,
                "top_logprobs": 21})
        .to_string(),
    );
    assert_eq!(s, 400, "{text}");
}

#[test]
fn fields_that_cannot_be_honoured_are_400s() {
    let msg = json!([{"role": "user", "content": "x"}]);
    assert_400s(&[
        // SmolLM2 has no fill-in-the-middle tokens.
        (
            "/api/generate",
            json!({"model": NAME, "prompt": "def f(", "suffix": "return x"}),
            "fill-in-the-middle",
        ),
        // A larger context than the server loaded.
        (
            "/api/chat",
            json!({"model": NAME, "messages": msg, "options": {"num_ctx": 4096}}),
            "512",
        ),
        (
            "/api/generate",
            json!({"model": NAME, "prompt": "x", "keep_alive": "forever"}),
            "keep_alive",
        ),
        (
            "/api/chat",
            json!({"model": NAME, "messages": msg, "keep_alive": "5 minutes"}),
            "keep_alive",
        ),
        (
            "/v1/chat/completions",
            json!({"model": NAME, "messages": msg, "logit_bias": {"x": 1}}),
            "token id",
        ),
        (
            "/v1/chat/completions",
            json!({"model": NAME, "messages": msg, "logit_bias": {"5": 101}}),
            "-100 to 100",
        ),
        (
            "/v1/completions",
            json!({"model": NAME, "prompt": "x", "logit_bias": {"999999": 5}}),
            "999999",
        ),
    ]);
    for ka in [
        json!("5m"),
        json!(-1),
        json!("-1"),
        json!("1h30m"),
        json!(300),
    ] {
        let (s, text) = post_raw(
            "/api/generate",
            &json!({"model": NAME, "prompt": "x", "keep_alive": ka, "stream": false, "options": greedy(1)})
                .to_string(),
        );
        assert_eq!(s, 200, "{ka}: {text}");
    }
    let (s, text) = post_raw(
        "/api/chat",
        &json!({"model": NAME, "messages": msg, "stream": false, "options": {"num_ctx": 256, "num_predict": 1}})
            .to_string(),
    );
    assert_eq!(s, 200, "a smaller context is fine: {text}");
    // Unknown OpenAI routes: OpenAI's error shape.
    let (s, text) = post_raw("/v1/embeddings/nope", "{}");
    assert_eq!(s, 404);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
}

#[test]
fn logit_bias_bans_and_forces_tokens() {
    let body = |bias: Value| {
        json!({"model": NAME, "prompt": "The capital of France is", "temperature": 0,
               "max_tokens": 4, "logprobs": 1, "logit_bias": bias})
    };
    let first_token = |v: &Value| {
        v["choices"][0]["logprobs"]["tokens"][0]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (s, free) = post("/v1/completions", body(json!({})));
    assert_eq!(s, 200, "{free}");
    let top = first_token(&free);
    // Banning the greedy first token changes it.
    let id = engine()
        .tokenizer()
        .token_id(&top.replace(' ', "Ġ"))
        .expect("the token's id");
    let (_, banned) = post("/v1/completions", body(json!({ id.to_string(): -100 })));
    assert_ne!(first_token(&banned), top, "{banned}");
    // A large bias forces a token everywhere.
    let x = engine().tokenizer().token_id("x").unwrap();
    let (_, forced) = post("/v1/completions", body(json!({ x.to_string(): 100 })));
    assert_eq!(forced["choices"][0]["text"], "xxxx", "{forced}");
}

/// Ollama's `shift` (default on): an answer that fills the context goes
/// on past it; off, it stops there with done_reason "length".
#[test]
fn shift_goes_past_the_context_and_off_stops_there() {
    let body = |shift: Option<bool>| {
        // A schema the answer cannot finish in 100 tokens: no early end.
        let format = json!({"type": "array", "items": {"type": "integer"}, "minItems": 80});
        let mut b = json!({"model": NAME, "prompt": "Count: one, two, three,", "stream": false,
                           "format": format,
                           "options": {"num_ctx": 64, "num_predict": 100, "temperature": 0}});
        if let Some(s) = shift {
            b["shift"] = json!(s);
        }
        b
    };
    let on = generate(body(None));
    assert_eq!(
        (on["eval_count"].as_u64(), on["done_reason"].as_str()),
        (Some(100), Some("length"))
    );
    let off = generate(body(Some(false)));
    let prompt = off["prompt_eval_count"].as_u64().unwrap();
    assert_eq!(off["eval_count"].as_u64(), Some(64 - prompt));
    assert_eq!(off["done_reason"], "length");
}
