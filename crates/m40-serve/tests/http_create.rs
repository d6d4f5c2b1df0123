//! Customised models (issue 59 point 4): `/api/create` from a Modelfile's
//! text or its fields, `/api/copy`, their instructions applied beneath
//! each request's own (SYSTEM, PARAMETERs, MESSAGEs, a Jinja TEMPLATE),
//! and shown by `/api/show`; against a real server over a store that holds
//! the default model (named in place: no copy).

mod common;

use common::*;
use serde_json::{json, Value};

fn post_json(base: &str, path: &str, body: Value) -> (u16, Value) {
    let (s, text) = post_raw_at(base, path, &body.to_string());
    let v = serde_json::from_str(&text).unwrap_or_else(|_| json!({ "text": text }));
    (s, v)
}

/// A create that succeeds: one NDJSON line when streamed (the default),
/// else one object.
fn create(base: &str, body: Value) {
    let (s, text) = post_raw_at(base, "/api/create", &body.to_string());
    assert_eq!(s, 200, "{text}");
    let streamed = body.get("stream") != Some(&json!(false));
    let want = if streamed {
        "{\"status\":\"success\"}\n"
    } else {
        "{\"status\":\"success\"}"
    };
    assert_eq!(text, want);
}

fn generate(base: &str, body: Value) -> Value {
    let (s, v) = post_json(base, "/api/generate", body);
    assert_eq!(s, 200, "{v}");
    v
}

fn chat(base: &str, path: &str, body: Value) -> String {
    let (s, v) = post_json(base, path, body);
    assert_eq!(s, 200, "{v}");
    match path {
        "/api/chat" => v["message"]["content"].as_str().unwrap().to_string(),
        _ => v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
    }
}

#[test]
fn a_created_model_applies_its_instructions_beneath_the_request() {
    let (base, store) = store_server();
    let modelfile = "FROM smollm2:135m\nSYSTEM You are a pirate.\n\
                     PARAMETER num_predict 3\nPARAMETER temperature 0\n";
    create(&base, json!({"model": "pirate", "modelfile": modelfile}));
    // A manifest that points at the same file, with its instructions.
    let m = store.manifest("pirate").unwrap().unwrap();
    let base_m = store.manifest(NAME).unwrap().unwrap();
    assert_eq!((&m.path, &m.sha256), (&base_m.path, &base_m.sha256));
    // Its SYSTEM and PARAMETERs: as the base model with them in the request.
    let own = generate(
        &base,
        json!({"model": "pirate", "prompt": "Hi", "stream": false}),
    );
    assert_eq!(own["eval_count"], 3, "{own}");
    let spelled = generate(
        &base,
        json!({"model": NAME, "prompt": "Hi", "system": "You are a pirate.", "stream": false,
               "options": {"num_predict": 3, "temperature": 0}}),
    );
    assert_eq!(own["response"], spelled["response"]);
    assert_ne!(
        own["response"],
        generate(
            &base,
            json!({"model": NAME, "prompt": "Hi", "stream": false, "options": greedy(3)})
        )["response"],
        "the system prompt changes the answer"
    );
    // The request's own options and system win.
    let longer = generate(
        &base,
        json!({"model": "pirate", "prompt": "Hi", "stream": false, "options": {"num_predict": 5}}),
    );
    assert_eq!(longer["eval_count"], 5, "{longer}");
    // The same through both chat APIs.
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    let a = chat(
        &base,
        "/api/chat",
        json!({"model": "pirate", "messages": msgs, "stream": false}),
    );
    let b = chat(
        &base,
        "/v1/chat/completions",
        json!({"model": "pirate", "messages": msgs}),
    );
    assert_eq!(a, b);
    // Shown as Ollama shows a created model.
    let (s, show) = post_json(&base, "/api/show", json!({"model": "pirate"}));
    assert_eq!(s, 200, "{show}");
    assert_eq!(show["system"], "You are a pirate.");
    let params = show["parameters"].as_str().unwrap();
    assert!(
        params
            .lines()
            .any(|l| l.starts_with("num_predict") && l.ends_with(" 3")),
        "{params}"
    );
    let text = show["modelfile"].as_str().unwrap();
    assert!(
        text.starts_with("FROM smollm2:135m\n") && text.contains("SYSTEM"),
        "{text}"
    );
    assert!(show["capabilities"]
        .as_array()
        .unwrap()
        .contains(&json!("completion")));
    // Listed by tags with the base's size and digest.
    let mut r = agent().get(&format!("{base}/api/tags")).call().unwrap();
    let tags: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    let entry = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "pirate")
        .unwrap()
        .clone();
    assert_eq!(entry["digest"], json!(base_m.sha256));
    // A copy carries them; one over it (JSON fields, no modelfile text)
    // builds on them.
    let (s, _) = post_json(
        &base,
        "/api/copy",
        json!({"source": "pirate", "destination": "pirate2:latest"}),
    );
    assert_eq!(s, 200);
    let (_, show2) = post_json(&base, "/api/show", json!({"model": "pirate2"}));
    assert_eq!(show2["system"], "You are a pirate.");
    create(
        &base,
        json!({"model": "primed", "from": "pirate", "parameters": {"num_predict": 4},
               "messages": [{"role": "user", "content": "Who are you?"},
                            {"role": "assistant", "content": "A pirate."}]}),
    );
    let primed = chat(
        &base,
        "/api/chat",
        json!({"model": "primed", "messages": msgs, "stream": false}),
    );
    let spelled = chat(
        &base,
        "/api/chat",
        json!({"model": NAME, "stream": false, "options": {"num_predict": 4, "temperature": 0},
               "messages": [{"role": "system", "content": "You are a pirate."},
                            {"role": "user", "content": "Who are you?"},
                            {"role": "assistant", "content": "A pirate."},
                            {"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(primed, spelled);
}

#[test]
fn a_created_template_is_the_engines() {
    let (base, _store) = store_server();
    let template =
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:";
    create(
        &base,
        json!({"model": "plain", "from": NAME, "template": template, "stream": false}),
    );
    let (_, show) = post_json(&base, "/api/show", json!({"model": "plain"}));
    assert_eq!(show["template"], template);
    // Its chats are rendered by it: the same as that text sent raw.
    let a = chat(
        &base,
        "/api/chat",
        json!({"model": "plain", "messages": [{"role": "user", "content": "Hi"}],
               "stream": false, "options": greedy(6)}),
    );
    let raw = generate(
        &base,
        json!({"model": NAME, "prompt": "user: Hi\nassistant:", "raw": true,
               "stream": false, "options": greedy(6)}),
    );
    assert_eq!(a, raw["response"].as_str().unwrap());
}

#[test]
fn mistakes_in_a_create_or_copy_are_clear_errors() {
    let (base, _store) = store_server();
    for (body, status, needle) in [
        (json!({"from": NAME}), 400, "model is required"),
        (json!({"model": "x"}), 400, "from is required"),
        (
            json!({"model": "x", "from": "nothing:here"}),
            404,
            "not found",
        ),
        (
            json!({"model": "x", "modelfile": "FROM smollm2:135m\nPARAMETER warmth 3"}),
            400,
            "unknown parameter 'warmth'",
        ),
        (
            json!({"model": "x", "from": NAME, "parameters": {"temperature": "hot"}}),
            400,
            "temperature hot",
        ),
        (
            json!({"model": "x", "from": NAME, "template": "{{ .System }} {{ .Prompt }}"}),
            400,
            "Go template",
        ),
        (
            json!({"model": "x", "from": NAME, "quantize": "q4_K_M"}),
            400,
            "quantize",
        ),
        (
            json!({"model": "x", "from": "/etc/passwd"}),
            404,
            "stored model",
        ),
        (json!({"model": "../x", "from": NAME}), 400, "NAME[:TAG]"),
        (
            json!({"model": "x", "from": NAME, "messages": [{"role": "tool", "content": "1"}]}),
            400,
            "role 'tool'",
        ),
    ] {
        let (s, text) = post_raw_at(&base, "/api/create", &body.to_string());
        assert_eq!(s, status, "{body}: {text}");
        assert!(text.contains(needle), "{body}: {text}");
    }
    for (body, status, needle) in [
        (
            json!({"source": "nope", "destination": "y"}),
            404,
            "not found",
        ),
        (json!({"source": NAME}), 400, "destination is required"),
    ] {
        let (s, text) = post_raw_at(&base, "/api/copy", &body.to_string());
        assert_eq!(s, status, "{body}: {text}");
        assert!(text.contains(needle), "{body}: {text}");
    }
}
