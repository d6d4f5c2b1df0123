//! Embeddings over HTTP (issue 57, point 4): Ollama's `/api/embed` and
//! `/api/embeddings`, OpenAI's `/v1/embeddings`, with the default model
//! (a chat model: mean pooling) and an encoder (bert) written by `synth`.

use std::sync::Arc;

use base64::Engine as _;
use m40_runtime::{BackendChoice, CancelToken, EmbedInput, EmbedRequest, Engine, EngineOptions};
use m40_serve::ServerConfig;
use serde_json::{json, Value};

mod common;

use common::*;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    dot / (norm(a) * norm(b))
}

fn ok(path: &str, body: Value) -> Value {
    let (s, v) = post(path, body);
    assert_eq!(s, 200, "{path}: {v}");
    v
}

#[test]
fn ollama_embed_returns_normalized_vectors_in_order() {
    let one = ok(
        "/api/embed",
        json!({"model": NAME, "input": "Why is the sky blue?"}),
    );
    let v = floats(&one["embeddings"][0]);
    assert_eq!(v.len(), 576);
    assert!((norm(&v) - 1.0).abs() < 1e-5);
    assert!(one["prompt_eval_count"].as_u64().unwrap() > 3);
    assert!(one["total_duration"].as_u64().unwrap() > 0);
    let texts = [
        "Why is the sky blue?",
        "Cats sleep a lot.",
        "Rust is a language.",
    ];
    let many = ok("/api/embed", json!({"model": NAME, "input": texts}));
    let all = many["embeddings"].as_array().unwrap();
    assert_eq!(all.len(), 3);
    // The first matches the single request; each is what the engine gives.
    assert!(cosine(&floats(&all[0]), &v) > 0.99999);
    let inputs = texts
        .iter()
        .map(|t| EmbedInput::Text(t.to_string()))
        .collect();
    let direct = engine()
        .embed(&EmbedRequest::new(inputs), &CancelToken::new())
        .unwrap();
    for (h, d) in all.iter().zip(&direct.vectors) {
        assert!(cosine(&floats(h), d) > 0.99999);
    }
    assert!(cosine(&floats(&all[0]), &floats(&all[1])) < 0.9999);
    // Matryoshka: the first dimensions, normalized again.
    let short = ok(
        "/api/embed",
        json!({"model": NAME, "input": "Why is the sky blue?", "dimensions": 64}),
    );
    let s = floats(&short["embeddings"][0]);
    assert_eq!(s.len(), 64);
    assert!((norm(&s) - 1.0).abs() < 1e-5);
    assert!(cosine(&s, &v[..64]) > 0.99999);
    // Nothing to embed: no vectors.
    let none = ok("/api/embed", json!({"model": NAME, "input": ""}));
    assert_eq!(none["embeddings"], json!([]));
}

#[test]
fn ollama_embeddings_is_the_older_unnormalized_route() {
    let old = ok(
        "/api/embeddings",
        json!({"model": NAME, "prompt": "Hello there"}),
    );
    let e = floats(&old["embedding"]);
    let new = ok("/api/embed", json!({"model": NAME, "input": "Hello there"}));
    assert!(cosine(&e, &floats(&new["embeddings"][0])) > 0.99999);
    assert!((norm(&e) - 1.0).abs() > 1e-3, "as pooled: {}", norm(&e));
    let empty = ok("/api/embeddings", json!({"model": NAME, "prompt": ""}));
    assert_eq!(empty["embedding"], json!([]));
}

#[test]
fn openai_embeddings_take_text_and_token_arrays_in_float_or_base64() {
    let r = ok(
        "/v1/embeddings",
        json!({"model": NAME, "input": ["first text", "second text"]}),
    );
    assert_eq!(r["object"], "list");
    let data = r["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["index"], i);
    }
    let usage = &r["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() >= 4);
    assert_eq!(usage["prompt_tokens"], usage["total_tokens"]);
    let first = floats(&data[0]["embedding"]);
    // base64: the same floats, little-endian.
    let b = ok(
        "/v1/embeddings",
        json!({"model": NAME, "input": "first text", "encoding_format": "base64"}),
    );
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(cosine(&decoded, &first) > 0.99999);
    // Token ids, one list or several.
    let ids = engine()
        .tokenizer()
        .encode("first text", m40_runtime::Encode::default())
        .unwrap();
    let by_ids = ok("/v1/embeddings", json!({"model": NAME, "input": ids}));
    assert_eq!(by_ids["usage"]["prompt_tokens"], ids.len());
    let lists = ok(
        "/v1/embeddings",
        json!({"model": NAME, "input": [ids, [1, 2, 3]]}),
    );
    assert_eq!(lists["data"].as_array().unwrap().len(), 2);
    let d = ok(
        "/v1/embeddings",
        json!({"model": NAME, "input": "first text", "dimensions": 32}),
    );
    assert_eq!(d["data"][0]["embedding"].as_array().unwrap().len(), 32);
}

#[test]
fn bad_embedding_requests_are_clear_errors() {
    let long = "word ".repeat(2000);
    assert_400s(&[
        (
            "/api/embed",
            json!({"model": NAME, "input": 5}),
            "input must be",
        ),
        (
            "/api/embed",
            json!({"model": NAME, "input": "x", "dimensions": 0}),
            "dimensions",
        ),
        (
            "/api/embed",
            json!({"model": NAME, "input": "x", "dimensions": 9999}),
            "dimensions 9999",
        ),
        (
            "/api/embed",
            json!({"model": NAME, "input": long, "truncate": false}),
            "at most 512",
        ),
        (
            "/api/embed",
            json!({"model": NAME, "input": "x", "keep_alive": "soon"}),
            "keep_alive",
        ),
        (
            "/v1/embeddings",
            json!({"model": NAME, "input": ""}),
            "must not be empty",
        ),
        (
            "/v1/embeddings",
            json!({"model": NAME, "input": [1, 99999999]}),
            "99999999",
        ),
        (
            "/v1/embeddings",
            json!({"model": NAME, "input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
    ]);
    // OpenAI's error shape; the model is checked.
    let (s, v) = post("/v1/embeddings", json!({"model": NAME, "input": []}));
    assert_eq!(s, 400);
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let (s, _) = post("/api/embed", json!({"model": "other", "input": "x"}));
    assert_eq!(s, 404);
    // Truncated by default: the context's tokens.
    let cut = ok("/api/embed", json!({"model": NAME, "input": long}));
    assert_eq!(cut["prompt_eval_count"], N_CTX);
}

#[test]
fn an_encoder_embeds_and_does_not_generate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bert.gguf");
    let shape = m40_gguf::synth::Shape::find("bert-tiny").unwrap();
    let opts = m40_gguf::synth::SynthOptions {
        shape,
        ty: m40_gguf::synth::FileType::parse("F16").unwrap(),
        seed: 1,
    };
    let f = std::fs::File::create(&path).unwrap();
    m40_gguf::synth::write_model(std::io::BufWriter::new(f), &opts, |_, _| {}).unwrap();
    let opts = {
        let mut o = EngineOptions::default();
        o.backend = BackendChoice::Cpu;
        o
    };
    let e = Arc::new(Engine::from_path(&path, opts).unwrap());
    let base = start_with(e, ServerConfig::default());
    let at = |p: &str, b: Value| {
        let (s, t) = post_raw_at(&base, p, &b.to_string());
        (s, serde_json::from_str::<Value>(&t).unwrap())
    };
    let (s, v) = at(
        "/api/embed",
        json!({"model": NAME, "input": ["a cat", "a dog"]}),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(floats(&v["embeddings"][1]).len(), 128);
    let (s, v) = at(
        "/api/generate",
        json!({"model": NAME, "prompt": "hi", "stream": false}),
    );
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("embedding model"),
        "{v}"
    );
    let (s, v) = at("/api/show", json!({"model": NAME}));
    assert_eq!(s, 200);
    assert_eq!(v["capabilities"], json!(["embedding"]));
}
