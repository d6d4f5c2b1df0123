//! Tool calling over HTTP on both APIs (issue 57, point 2), with the
//! default model on the CPU: SmolLM2's template does not show tools, so
//! it gets them in the generic format (a JSON call or reply).

use serde_json::{json, Value};

mod common;

use common::*;

fn weather() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city", "maxLength": 30}},
            "required": ["city"]}}}])
}

/// A call in OpenAI's shape: an id, type function, arguments a JSON string
/// of an object with a short city.
fn openai_call_ok(c: &Value) -> bool {
    let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
    c["id"].as_str().is_some_and(|i| !i.is_empty())
        && c["type"] == "function"
        && c["function"]["name"] == "get_weather"
        && args["city"]
            .as_str()
            .is_some_and(|s| s.chars().count() <= 30)
}

#[test]
fn openai_tool_calls_whole_streamed_and_in_history() {
    let msg = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let body = json!({"model": NAME, "messages": msg, "tools": weather(),
                      "tool_choice": "required", "temperature": 0, "max_tokens": 100});
    let (s, v) = post("/v1/chat/completions", body.clone());
    assert_eq!(s, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert!(!calls.is_empty() && calls.iter().all(openai_call_ok), "{v}");
    // Streamed: the same calls as deltas with indexes, then tool_calls.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events: Vec<Value> = sse("/v1/chat/completions", streamed)
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let deltas: Vec<&Value> = events
        .iter()
        .flat_map(|e| {
            e["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .collect();
    assert_eq!(deltas.len(), calls.len(), "{events:?}");
    for (i, d) in deltas.iter().enumerate() {
        assert_eq!(d["index"], i);
        assert_eq!(d["function"], calls[i]["function"]);
    }
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    // The next turn: the call and its result in the history.
    let mut history = msg.as_array().unwrap().clone();
    history.push(json!({"role": "assistant", "content": null, "tool_calls": [calls[0]]}));
    history.push(json!({"role": "tool", "tool_call_id": calls[0]["id"], "content": "21 C, clear"}));
    let (s, v) = post(
        "/v1/chat/completions",
        json!({"model": NAME, "messages": history, "tools": weather(), "temperature": 0, "max_tokens": 60}),
    );
    assert_eq!(s, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert!(
        m["tool_calls"].is_array() || m["content"].as_str().is_some_and(|c| !c.is_empty()),
        "{v}"
    );
}

#[test]
fn ollama_tool_calls_whole_and_streamed() {
    let msg =
        json!([{"role": "user", "content": "What is the weather in Paris? Call get_weather."}]);
    let body = json!({"model": NAME, "messages": msg, "tools": weather(), "stream": false,
                      "options": greedy(100)});
    let (s, v) = post("/api/chat", body.clone());
    assert_eq!(s, 200, "{v}");
    let m = &v["message"];
    let calls = m["tool_calls"].as_array().cloned().unwrap_or_default();
    if calls.is_empty() {
        // The model answered instead: text, not the generic format's JSON.
        let c = m["content"].as_str().unwrap();
        assert!(!c.is_empty() && !c.starts_with('{'), "{v}");
    }
    for c in &calls {
        assert_eq!(c["function"]["name"], "get_weather");
        assert!(c["function"]["arguments"]["city"].is_string(), "{v}");
    }
    // Streamed: the same message in pieces.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let lines = ndjson("/api/chat", streamed);
    let s_calls: Vec<Value> = lines
        .iter()
        .flat_map(|l| {
            l["message"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let s_text: String = lines
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect();
    assert_eq!(s_calls.len(), calls.len());
    for (a, b) in s_calls.iter().zip(&calls) {
        assert_eq!(a["function"], b["function"]);
    }
    assert_eq!(s_text, m["content"].as_str().unwrap());
    // The result goes back with tool_name; the next turn runs.
    let call = json!({"function": {"name": "get_weather", "arguments": {"city": "Paris"}}});
    let history = json!([msg[0], {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_name": "get_weather", "content": "21 C, clear"}]);
    let (s, v) = post(
        "/api/chat",
        json!({"model": NAME, "messages": history, "tools": weather(), "stream": false, "options": greedy(60)}),
    );
    assert_eq!(s, 200, "{v}");
}

#[test]
fn tool_requests_that_cannot_run_are_400s() {
    let msg = json!([{"role": "user", "content": "x"}]);
    assert_400s(&[
        (
            "/api/chat",
            json!({"model": NAME, "messages": msg, "tools": {"a": 1}}),
            "tools",
        ),
        (
            "/api/chat",
            json!({"model": NAME, "messages": msg, "tools": [{"type": "function", "function": {}}]}),
            "name",
        ),
        (
            "/v1/chat/completions",
            json!({"model": NAME, "messages": msg, "tools": weather(), "tool_choice": "always"}),
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            json!({"model": NAME, "messages": msg, "tools": weather(),
                   "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "nope",
        ),
        (
            "/v1/chat/completions",
            json!({"model": NAME, "messages": msg, "tools": weather(), "tool_choice": "required",
                   "response_format": {"type": "json_object"}}),
            "tools",
        ),
        (
            "/v1/completions",
            json!({"model": NAME, "prompt": "x", "tools": weather()}),
            "chat",
        ),
        (
            "/v1/chat/completions",
            json!({"model": NAME, "messages": msg, "tool_choice": "required"}),
            "no tools",
        ),
        (
            "/v1/chat/completions",
            json!({"model": NAME, "messages": [{"role": "assistant", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}),
            "arguments",
        ),
    ]);
    // What asks for nothing still works: empty format, no tools, text.
    for (path, body) in [
        (
            "/api/generate",
            json!({"model": NAME, "prompt": "x", "format": "", "stream": false, "options": greedy(2)}),
        ),
        (
            "/api/chat",
            json!({"model": NAME, "messages": msg, "tools": [], "stream": false, "options": greedy(2)}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": NAME, "messages": msg, "tools": weather(), "tool_choice": "none", "max_tokens": 2}),
        ),
    ] {
        let (s, text) = post_raw(path, &body.to_string());
        assert_eq!(s, 200, "{path} {body}: {text}");
    }
    // SmolLM2's template shows no tools, and it does not think.
    let (s, v) = post("/api/show", json!({"model": NAME}));
    assert_eq!(s, 200);
    assert_eq!(v["capabilities"], json!(["completion"]), "{v}");
}
