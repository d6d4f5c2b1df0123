//! Tool calling on both APIs: the `tools` and `tool_choice` of a request,
//! the calls and results in its history, and the calls of an answer in
//! each API's shape (Ollama: arguments as an object; OpenAI: as a JSON
//! string, with ids, `finish_reason: "tool_calls"`).

use m40_runtime::{Message, Think, Tool, ToolCall, ToolChoice};
use serde_json::{json, Value};

use crate::ApiError;

/// A request's `tools` (absent, null or empty: none).
pub(crate) fn tools(v: Option<&Value>) -> Result<Vec<Tool>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => {
            Tool::parse_all(a).map_err(|e| ApiError::bad_request(e.to_string()))
        }
        Some(_) => Err(ApiError::bad_request("tools must be an array")),
    }
}

/// OpenAI's `tool_choice`: "auto", "none", "required" or
/// `{"type": "function", "function": {"name": ...}}`.
pub(crate) fn choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "tool_choice must be \"auto\", \"none\", \"required\" or \
             {\"type\": \"function\", \"function\": {\"name\": ...}}",
        )
    };
    match v {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            _ => Err(bad()),
        },
        Some(o) => o
            .pointer("/function/name")
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Function(n.to_string()))
            .ok_or_else(bad),
    }
}

/// Calls in a history message: `[{"id", "function": {"name",
/// "arguments"}}]`, the arguments an object (Ollama) or a string of one
/// (OpenAI).
pub(crate) fn history_calls(v: &[Value]) -> Result<Vec<ToolCall>, ApiError> {
    v.iter()
        .enumerate()
        .map(|(i, c)| {
            let f = c.get("function").ok_or_else(|| {
                ApiError::bad_request(format!("tool_calls[{i}] needs a \"function\""))
            })?;
            let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::bad_request(format!("tool_calls[{i}].function needs a \"name\""))
            })?;
            let args = match f.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                    ApiError::bad_request(format!(
                        "tool_calls[{i}].function.arguments is not JSON: {e}"
                    ))
                })?,
                Some(a) => a.clone(),
            };
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .map_or_else(|| format!("call_{i}"), str::to_string);
            Ok(ToolCall::new(id, name, args))
        })
        .collect()
}

/// Gives tool results the function name and call id the templates read:
/// from the call they answer (OpenAI's `tool_call_id`), or the calls
/// before them in order (Ollama's results carry only the name, if that).
pub(crate) fn link_results(messages: &mut [Message]) {
    let mut calls: Vec<ToolCall> = Vec::new();
    let mut next = 0;
    for m in messages.iter_mut() {
        if !m.tool_calls.is_empty() {
            calls = m.tool_calls.clone();
            next = 0;
            continue;
        }
        if m.role != "tool" {
            continue;
        }
        let call = match &m.tool_call_id {
            Some(id) => calls.iter().find(|c| &c.id == id),
            None => match &m.name {
                Some(n) => calls.iter().find(|c| &c.function.name == n),
                None => calls.get(next),
            },
        };
        if let Some(c) = call {
            m.name.get_or_insert_with(|| c.function.name.clone());
            m.tool_call_id.get_or_insert_with(|| c.id.clone());
        }
        next += 1;
    }
}

/// Ollama's shape of an answer's calls.
pub(crate) fn ollama_calls(calls: &[ToolCall], first: usize) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"id": c.id, "function": {"index": first + i, "name": c.function.name,
                                            "arguments": c.function.arguments}})
        })
        .collect()
}

/// OpenAI's shape (`index` for stream deltas).
pub(crate) fn openai_calls(calls: &[ToolCall], first: Option<usize>) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({"id": c.id, "type": "function",
                               "function": {"name": c.function.name,
                                            "arguments": c.function.arguments.to_string()}});
            if let Some(f) = first {
                v["index"] = json!(f + i);
            }
            v
        })
        .collect()
}

/// Ollama's `think`: true, false, or an effort ("low", "medium", "high").
pub(crate) fn ollama_think(v: Option<&Value>) -> Result<Option<Think>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(Think::On)),
        Some(Value::Bool(false)) => Ok(Some(Think::Off)),
        Some(Value::String(s)) => effort(s).map(Some),
        Some(_) => Err(ApiError::bad_request(
            "think must be true, false, \"low\", \"medium\" or \"high\"",
        )),
    }
}

/// OpenAI's `reasoning_effort` ("none" turns thinking off).
pub(crate) fn reasoning_effort(v: Option<&str>) -> Result<Option<Think>, ApiError> {
    match v {
        None => Ok(None),
        Some("none") => Ok(Some(Think::Off)),
        Some(s) => effort(s).map(Some),
    }
}

fn effort(s: &str) -> Result<Think, ApiError> {
    match s {
        "low" | "medium" | "high" => Ok(Think::Effort(s.to_string())),
        "minimal" => Ok(Think::Effort("low".into())),
        _ => Err(ApiError::bad_request(format!(
            "the reasoning effort must be \"low\", \"medium\" or \"high\", not {s:?}"
        ))),
    }
}
