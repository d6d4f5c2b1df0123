//! Tool calling end to end on SmolLM2 (issue 57, point 2). Its own
//! template (ChatML) does not show tools, so it gets the generic format:
//! the tools in a system message, the answer a JSON call or reply. With
//! Qwen3's template instead, it gets them as Qwen3 does and must write
//! `<tool_call>` blocks. Either way a required or named call is
//! constrained: its arguments are valid under the function's schema.
//!
//! Each body runs on both backends: `NAME::cpu` in CI, `NAME::gpu` in the
//! GPU pack.

mod support;

use m40_runtime::{
    CancelToken, Completion, Engine, EngineError, Format, Message, Prompt, Request, Tool, ToolCall,
    ToolChoice,
};
use serde_json::{json, Value};
use support::On;

on_both!(
    generic_format_calls_validate,
    generic_format_history_and_auto,
    qwen3_template_calls_validate,
    tool_requests_that_cannot_run_are_errors,
);

fn tools() -> Vec<Tool> {
    Tool::parse_all(&[
        json!({"type": "function", "function": {
            "name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "The city", "maxLength": 30},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"}},
                "required": ["city", "unit"]}}}),
        json!({"type": "function", "function": {
            "name": "get_time", "description": "The time in a time zone",
            "parameters": {"type": "object", "properties": {
                "zone": {"type": "string", "description": "IANA zone", "maxLength": 30}},
                "required": ["zone"]}}}),
    ])
    .unwrap()
}

/// Whether `call` is a valid call of one of [`tools`].
fn valid(call: &ToolCall) -> bool {
    let a = call.function.arguments.as_object().expect("an object");
    let short = |v: &Value| v.as_str().is_some_and(|s| s.chars().count() <= 30);
    match call.function.name.as_str() {
        "get_weather" => {
            a.len() == 2
                && short(&a["city"])
                && ["celsius", "fahrenheit"].contains(&a["unit"].as_str().unwrap_or(""))
        }
        "get_time" => a.len() == 1 && short(&a["zone"]),
        _ => false,
    }
}

fn request(messages: Vec<Message>, choice: ToolChoice) -> Request {
    let mut r = Request::new(Prompt::Chat(messages));
    r.tools = tools();
    r.tool_choice = choice;
    r.max_tokens = Some(120);
    r
}

fn ask(text: &str, choice: ToolChoice) -> Request {
    request(vec![Message::new("user", text)], choice)
}

/// Runs `r`, checking that the streamed pieces add up to the completion.
fn run(e: &Engine, r: &Request) -> Completion {
    let (mut text, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
    let done = e
        .generate(r, &CancelToken::new(), |t| {
            text.push_str(&t.text);
            thinking.push_str(&t.thinking);
            calls.extend(t.tool_calls.iter().cloned());
        })
        .unwrap();
    assert_eq!(text, done.text);
    assert_eq!(thinking, done.thinking);
    assert_eq!(calls, done.tool_calls);
    done
}

fn generic_format_calls_validate(on: On) {
    let e = support::smollm2_engine(on, 1024);
    assert!(!e.native_tools(), "ChatML does not show tools");
    let d = run(
        e,
        &ask("What is the weather in Paris?", ToolChoice::Required),
    );
    assert!(!d.tool_calls.is_empty(), "{d:?}");
    assert!(d.tool_calls.iter().all(valid), "{:?}", d.tool_calls);
    assert_eq!(d.text, "");
    // A named function is the one called, once without parallel calls.
    let mut r = ask(
        "What is the weather in Paris?",
        ToolChoice::Function("get_time".into()),
    );
    r.parallel_tool_calls = false;
    let d = run(e, &r);
    assert_eq!(d.tool_calls.len(), 1, "{d:?}");
    assert_eq!(d.tool_calls[0].function.name, "get_time");
    assert!(valid(&d.tool_calls[0]));
    // Sampled calls validate too (one each: sampled parallel calls may run
    // on to max_tokens, which ends them as length).
    for seed in 0..3 {
        let mut r = ask(
            "Weather in Oslo and the time in Tokyo?",
            ToolChoice::Required,
        );
        r.sampling.temperature = 1.0;
        r.sampling.seed = Some(seed);
        r.parallel_tool_calls = false;
        let d = run(e, &r);
        assert!(
            d.tool_calls.iter().all(valid),
            "seed {seed}: {:?}",
            d.tool_calls
        );
        assert_eq!(d.tool_calls.len(), 1, "seed {seed}: {d:?}");
        assert_eq!(d.finish_reason, m40_runtime::FinishReason::Stop);
    }
    // Ids are unique.
    let ids: std::collections::HashSet<_> = d.tool_calls.iter().map(|c| &c.id).collect();
    assert_eq!(ids.len(), d.tool_calls.len());
}

fn generic_format_history_and_auto(on: On) {
    let e = support::smollm2_engine(on, 1024);
    // The model decides: a call or a reply, never raw JSON as the answer.
    let d = run(e, &ask("Say hello.", ToolChoice::Auto));
    assert!(d.tool_calls.iter().all(valid), "{d:?}");
    assert!(!d.text.trim_start().starts_with('{'), "{:?}", d.text);
    assert!(!d.tool_calls.is_empty() || !d.text.is_empty(), "{d:?}");
    // A second turn after a call and its result.
    let mut asst = Message::new("assistant", "");
    asst.tool_calls = vec![ToolCall::new(
        "call_1",
        "get_weather",
        json!({"city": "Paris", "unit": "celsius"}),
    )];
    let mut result = Message::new("tool", "{\"temperature\": 21, \"sky\": \"clear\"}");
    result.name = Some("get_weather".into());
    result.tool_call_id = Some("call_1".into());
    let r = request(
        vec![
            Message::new("user", "What is the weather in Paris?"),
            asst,
            result,
        ],
        ToolChoice::Auto,
    );
    let d = run(e, &r);
    assert!(d.tool_calls.iter().all(valid), "{d:?}");
    assert!(!d.tool_calls.is_empty() || !d.text.is_empty(), "{d:?}");
    // tool_choice none: the tools are not shown, the answer is free text.
    let mut r = ask("Say hello.", ToolChoice::None);
    r.max_tokens = Some(8);
    let d = run(e, &r);
    assert!(d.tool_calls.is_empty());
    assert!(!d.text.is_empty());
}

fn qwen3_template_calls_validate(on: On) {
    if support::testdata().is_none() {
        return;
    }
    let e = support::templated_engine(on, "Qwen-Qwen3-0.6B.jinja");
    assert!(e.native_tools());
    assert_eq!(e.thinking(), Some(m40_runtime::Thinking::Tags));
    let r = ask("What is the weather in Paris?", ToolChoice::Required);
    // The tools are in the prompt, as Qwen3's template shows them.
    let plain = e.prompt_tokens(&r.prompt).unwrap();
    let prepared = e.prepare(r.clone()).unwrap();
    let shown = e
        .tokenizer()
        .decode_with_special(prepared.prompt_tokens())
        .unwrap();
    assert!(
        shown.contains("<tools>") && shown.contains("get_weather"),
        "{shown}"
    );
    assert!(plain.len() < prepared.prompt_tokens().len());
    let d = run(e, &r);
    assert!(!d.tool_calls.is_empty(), "{d:?}");
    assert!(d.tool_calls.iter().all(valid), "{:?}", d.tool_calls);
    assert_eq!(d.text.trim(), "", "{d:?}");
    let mut r = ask(
        "What is the time in Tokyo?",
        ToolChoice::Function("get_time".into()),
    );
    r.sampling.temperature = 0.8;
    r.sampling.seed = Some(7);
    let d = run(e, &r);
    assert!(!d.tool_calls.is_empty());
    assert!(d
        .tool_calls
        .iter()
        .all(|c| c.function.name == "get_time" && valid(c)));
}

fn tool_requests_that_cannot_run_are_errors(on: On) {
    let e = support::smollm2_engine(on, 1024);
    let r = ask("Hi", ToolChoice::Function("no_such_function".into()));
    let err = e.prepare(r).unwrap_err();
    assert!(matches!(err, EngineError::Format(_)), "{err}");
    assert!(err.to_string().contains("no_such_function"), "{err}");
    let mut r = ask("Hi", ToolChoice::Required);
    r.format = Some(Format::Json);
    let err = e.prepare(r).unwrap_err();
    assert!(err.to_string().contains("tools"), "{err}");
}
