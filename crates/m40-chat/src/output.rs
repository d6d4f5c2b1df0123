//! What a model writes around its answer, taken apart as it streams: the
//! answer itself (content), its reasoning (thinking: `<think>` blocks,
//! harmony's analysis channel) and its tool calls in the family's syntax.
//!
//! The parser sees the text with control tokens written out. It emits
//! content and thinking as soon as they cannot be the start of a marker,
//! and a call once it is whole; a call that does not parse is given back
//! as content, as llama.cpp's server does.

use std::hash::{BuildHasher, Hasher};

use m40_tokenizer::ToolCall;
use serde_json::Value;

use crate::tools::Syntax;

/// What a piece of output holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed {
    pub content: String,
    pub thinking: String,
    pub calls: Vec<ToolCall>,
}

impl Parsed {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.thinking.is_empty() && self.calls.is_empty()
    }

    /// Add `other`'s pieces after these.
    pub fn append(&mut self, other: Parsed) {
        self.content.push_str(&other.content);
        self.thinking.push_str(&other.thinking);
        self.calls.extend(other.calls);
    }
}

/// How a model marks its reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thinking {
    /// `<think>` ... `</think>` (Qwen3, DeepSeek R1, SmolLM3, ...).
    Tags,
    /// `<|START_THINKING|>` ... `<|END_THINKING|>` (Command R7B).
    CommandR,
    /// gpt-oss: the analysis channel.
    Harmony,
}

impl Thinking {
    /// The reasoning format `template` (a chat template's source) uses.
    pub fn detect(template: &str) -> Option<Thinking> {
        if template.contains("<|channel|>") {
            Some(Thinking::Harmony)
        } else if template.contains("<|START_THINKING|>") {
            Some(Thinking::CommandR)
        } else if template.contains("<think>") || template.contains("</think>") {
            Some(Thinking::Tags)
        } else {
            None
        }
    }

    fn markers(self) -> Option<(&'static str, &'static str)> {
        match self {
            Thinking::Tags => Some(("<think>", "</think>")),
            Thinking::CommandR => Some(("<|START_THINKING|>", "<|END_THINKING|>")),
            Thinking::Harmony => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum State {
    Content,
    Thinking,
    /// Inside a call that began with this marker ("" for Llama 3's bare JSON).
    Call(&'static str),
    /// Harmony: a message's header, up to `<|message|>`.
    Header,
    /// Harmony: a message's body.
    Body(Channel),
}

#[derive(Clone, Debug, PartialEq)]
enum Channel {
    Content,
    Thinking,
    Call(String),
}

/// Takes one answer apart as it streams.
pub struct OutputParser {
    calls: Option<Syntax>,
    think: Option<Thinking>,
    state: State,
    buf: String,
    /// Whether anything but whitespace has been emitted.
    started: bool,
    /// Leading whitespace of the content after a thinking block is dropped.
    trim_content: bool,
}

const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const HARMONY_MESSAGE: &str = "<|message|>";
const HARMONY_ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];

impl OutputParser {
    /// A parser for calls in `calls` (`None`: the request has no tools) and
    /// reasoning marked as `think`; `in_thinking` where the prompt already
    /// opened the reasoning block (templates that end in `<think>`).
    pub fn new(calls: Option<Syntax>, think: Option<Thinking>, in_thinking: bool) -> Self {
        let harmony = think == Some(Thinking::Harmony) || calls == Some(Syntax::Harmony);
        let state = if harmony {
            State::Header
        } else if in_thinking && think.and_then(Thinking::markers).is_some() {
            State::Thinking
        } else {
            State::Content
        };
        Self {
            calls: calls.filter(|s| *s != Syntax::Generic),
            think,
            state,
            buf: String::new(),
            started: false,
            trim_content: false,
        }
    }

    /// Feed the next text; returns what became certain.
    pub fn push(&mut self, text: &str) -> Parsed {
        self.buf.push_str(text);
        let mut out = Parsed::default();
        while self.step(&mut out, false) {}
        out
    }

    /// The end of the answer: everything still held.
    pub fn finish(&mut self) -> Parsed {
        let mut out = Parsed::default();
        while self.step(&mut out, true) {}
        out
    }

    /// The markers that leave plain content.
    fn content_markers(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if let Some((open, _)) = self.think.and_then(Thinking::markers) {
            m.push(open);
        }
        match self.calls {
            Some(Syntax::Hermes) => m.push("<tool_call>"),
            Some(Syntax::Llama3) => m.push("<|python_tag|>"),
            Some(Syntax::Mistral | Syntax::MistralArgs) => m.push(MISTRAL_CALLS),
            Some(Syntax::Granite) => m.push("<|tool_call|>"),
            Some(Syntax::CommandR7b) => m.push("<|START_ACTION|>"),
            Some(Syntax::CommandR) => m.push("Action:"),
            _ => {}
        }
        if self.think == Some(Thinking::CommandR) || self.calls == Some(Syntax::CommandR7b) {
            m.extend(["<|START_RESPONSE|>", "<|END_RESPONSE|>"]);
        }
        m
    }

    fn emit_content(&mut self, out: &mut Parsed, mut text: &str) {
        if self.trim_content {
            text = text.trim_start();
            self.trim_content = text.is_empty();
        }
        self.started |= !text.trim().is_empty();
        out.content.push_str(text);
    }

    /// One move of the state machine; false when it needs more text.
    fn step(&mut self, out: &mut Parsed, end: bool) -> bool {
        if self.buf.is_empty() && !end {
            return false;
        }
        match self.state.clone() {
            State::Content => {
                let markers = self.content_markers();
                if let Some((pos, m)) = find_first(&self.buf, &markers) {
                    let before = self.buf[..pos].to_string();
                    self.emit_content(out, &before);
                    self.buf.drain(..pos + m.len());
                    self.state = match m {
                        "<think>" | "<|START_THINKING|>" => State::Thinking,
                        "<|START_RESPONSE|>" | "<|END_RESPONSE|>" => State::Content,
                        call => State::Call(call),
                    };
                    return true;
                }
                if self.calls == Some(Syntax::Llama3) && !self.started {
                    let t = self.buf.trim_start();
                    if t.starts_with('{') {
                        self.buf = t.to_string();
                        self.state = State::Call("");
                        return true;
                    }
                    if t.is_empty() && !end {
                        return false;
                    }
                }
                let keep = if end { 0 } else { held(&self.buf, &markers) };
                let emit: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.emit_content(out, &emit);
                false
            }
            State::Thinking => {
                let close = self.think.and_then(Thinking::markers).map_or("", |m| m.1);
                if let Some(pos) = self.buf.find(close) {
                    out.thinking.extend(self.buf.drain(..pos));
                    self.buf.drain(..close.len());
                    self.state = State::Content;
                    self.trim_content = true;
                    return true;
                }
                let keep = if end { 0 } else { held(&self.buf, &[close]) };
                out.thinking.extend(self.buf.drain(..self.buf.len() - keep));
                false
            }
            State::Call(open) => {
                let close = match self.calls {
                    Some(Syntax::Hermes) => Some("</tool_call>"),
                    Some(Syntax::CommandR7b) => Some("<|END_ACTION|>"),
                    _ => None,
                };
                let body_end = match close {
                    Some(c) => self.buf.find(c).map(|p| (p, p + c.len())),
                    None => None,
                };
                let Some((body_len, consumed)) =
                    body_end.or(end.then_some((self.buf.len(), self.buf.len())))
                else {
                    return false;
                };
                let body = &self.buf[..body_len];
                match self.calls.and_then(|s| parse_calls(s, body)) {
                    Some(calls) => {
                        self.started = true;
                        out.calls.extend(calls);
                    }
                    None => {
                        let raw = format!("{open}{}", &self.buf[..consumed]);
                        self.emit_content(out, &raw);
                    }
                }
                self.buf.drain(..consumed);
                self.state = State::Content;
                !self.buf.is_empty()
            }
            State::Header => {
                if let Some(pos) = self.buf.find(HARMONY_MESSAGE) {
                    let header: String = self.buf.drain(..pos + HARMONY_MESSAGE.len()).collect();
                    self.state = State::Body(harmony_channel(&header[..pos]));
                    return true;
                }
                // A header runs to `<|message|>`; a model that writes
                // none (off its format) is given back as content.
                if end || self.buf.len() > 512 {
                    let all = std::mem::take(&mut self.buf);
                    self.emit_content(out, &all);
                    self.state = State::Body(Channel::Content);
                }
                false
            }
            State::Body(channel) => {
                let found = find_first(&self.buf, &HARMONY_ENDS);
                let (len, consumed) = match found {
                    Some((p, m)) => (p, p + m.len()),
                    None if end => (self.buf.len(), self.buf.len()),
                    None => {
                        if matches!(channel, Channel::Call(_)) {
                            return false;
                        }
                        (self.buf.len() - held(&self.buf, &HARMONY_ENDS), 0)
                    }
                };
                let text: String = self.buf[..len].to_string();
                match &channel {
                    Channel::Content => self.emit_content(out, &text),
                    Channel::Thinking => out.thinking.push_str(&text),
                    Channel::Call(name) => match serde_json::from_str::<Value>(text.trim()) {
                        Ok(args) if self.calls.is_some() => {
                            out.calls.push(new_call(Syntax::Harmony, None, name, args))
                        }
                        _ => self.emit_content(out, &text),
                    },
                }
                if consumed == 0 {
                    self.buf.drain(..len);
                    return false;
                }
                self.buf.drain(..consumed);
                // The next message: `<|start|>assistant` and its header.
                self.state = State::Header;
                !self.buf.is_empty()
            }
        }
    }
}

/// The earliest of `markers` in `s`: its byte position and the marker.
fn find_first<'m>(s: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter_map(|m| s.find(m).map(|p| (p, *m)))
        .min_by_key(|(p, m)| (*p, std::cmp::Reverse(m.len())))
}

/// How many bytes at the end of `s` could begin one of `markers`.
fn held(s: &str, markers: &[&str]) -> usize {
    let mut keep = 0;
    for m in markers {
        for k in (1..m.len().min(s.len() + 1)).rev() {
            if s.is_char_boundary(s.len() - k) && m.starts_with(&s[s.len() - k..]) {
                keep = keep.max(k);
                break;
            }
        }
    }
    keep
}

/// A harmony header's channel: `<|channel|>analysis`, or a call
/// `<|channel|>commentary to=functions.NAME <|constrain|>json` (the
/// recipient may also come before the channel).
fn harmony_channel(header: &str) -> Channel {
    if let Some(at) = header.find("to=functions.") {
        let name: String = header[at + "to=functions.".len()..]
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '<')
            .collect();
        return Channel::Call(name);
    }
    let channel = header
        .split("<|channel|>")
        .nth(1)
        .unwrap_or("")
        .trim_start();
    if channel.starts_with("analysis") {
        Channel::Thinking
    } else {
        Channel::Content
    }
}

/// A call's arguments: an object, or a string holding one.
fn arguments(v: Option<&Value>) -> Option<Value> {
    match v {
        None | Some(Value::Null) => Some(Value::Object(Default::default())),
        Some(Value::String(s)) => serde_json::from_str(s).ok(),
        Some(v @ Value::Object(_)) => Some(v.clone()),
        Some(_) => None,
    }
}

/// One call from a JSON object with these keys.
fn call_from(
    syntax: Syntax,
    v: &Value,
    name_keys: &[&str],
    args_keys: &[&str],
) -> Option<ToolCall> {
    let name = name_keys.iter().find_map(|k| v.get(*k)?.as_str())?;
    let args = arguments(args_keys.iter().find_map(|k| v.get(*k)))?;
    let id = v.get("id").and_then(Value::as_str);
    Some(new_call(syntax, id, name, args))
}

/// Every JSON value in `s`, one after another (separated by whitespace,
/// `;` or `,`).
fn json_values(s: &str) -> Option<Vec<Value>> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = it.next()?.ok()?;
        out.push(v);
        rest = rest[it.byte_offset()..]
            .trim_start_matches(|c: char| c.is_whitespace() || c == ';' || c == ',');
    }
    Some(out)
}

/// The calls in one call region's text (after its opening marker).
pub fn parse_calls(syntax: Syntax, body: &str) -> Option<Vec<ToolCall>> {
    let list = |body: &str, names: &[&str], args: &[&str]| -> Option<Vec<ToolCall>> {
        let v: Value = serde_json::from_str(body.trim()).ok()?;
        let items = match v {
            Value::Array(a) => a,
            o @ Value::Object(_) => vec![o],
            _ => return None,
        };
        let calls: Option<Vec<_>> = items
            .iter()
            .map(|c| call_from(syntax, c, names, args))
            .collect();
        calls.filter(|c| !c.is_empty())
    };
    match syntax {
        Syntax::Hermes if body.trim_start().starts_with("<function=") => xml_call(body),
        Syntax::Hermes => list(body, &["name"], &["arguments", "parameters"]),
        Syntax::Llama3 => {
            let calls: Option<Vec<_>> = json_values(body)?
                .iter()
                .map(|v| {
                    let v = v.get("function").unwrap_or(v);
                    call_from(syntax, v, &["name"], &["parameters", "arguments"])
                })
                .collect();
            calls.filter(|c| !c.is_empty())
        }
        Syntax::Mistral | Syntax::MistralArgs => {
            if body.trim_start().starts_with('[') {
                return list(body, &["name"], &["arguments"]);
            }
            // `name[ARGS]{...}` (or `name[CALL_ID]id[ARGS]{...}`), each
            // after its own `[TOOL_CALLS]`.
            let mut calls = Vec::new();
            for part in body.split(MISTRAL_CALLS).filter(|p| !p.trim().is_empty()) {
                let (head, args) = part.split_once("[ARGS]")?;
                let (name, id) = match head.split_once("[CALL_ID]") {
                    Some((n, id)) => (n, Some(id.trim())),
                    None => (head, None),
                };
                let args = arguments(Some(&serde_json::from_str(args.trim()).ok()?))?;
                calls.push(new_call(syntax, id, name.trim(), args));
            }
            Some(calls).filter(|c| !c.is_empty())
        }
        Syntax::Granite => list(body, &["name"], &["arguments"]),
        Syntax::CommandR7b => list(body, &["tool_name"], &["parameters"]),
        Syntax::CommandR => {
            let b = body.trim();
            let b = b
                .strip_prefix("```json")
                .or_else(|| b.strip_prefix("```"))
                .unwrap_or(b);
            let b = b.trim_end().strip_suffix("```").unwrap_or(b);
            let calls = list(b, &["tool_name"], &["parameters"])?;
            let calls: Vec<_> = calls
                .into_iter()
                .filter(|c| {
                    c.function.name != "directly-answer" && c.function.name != "directly_answer"
                })
                .collect();
            Some(calls).filter(|c| !c.is_empty())
        }
        Syntax::Harmony => None,
        Syntax::Generic => {
            generic(body).and_then(|(calls, _)| Some(calls).filter(|c| !c.is_empty()))
        }
    }
}

/// Qwen3-Coder's and Qwen3.5's call: `<function=NAME>` and a
/// `<parameter=KEY>value</parameter>` per argument; a value is JSON where
/// it parses as JSON, a string otherwise.
fn xml_call(body: &str) -> Option<Vec<ToolCall>> {
    let rest = body.trim().strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let mut args = serde_json::Map::new();
    while let Some(start) = rest.find("<parameter=") {
        let (key, after) = rest[start + "<parameter=".len()..].split_once('>')?;
        let (value, after) = after.split_once("</parameter>")?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let v = serde_json::from_str(value).unwrap_or_else(|_| Value::from(value));
        args.insert(key.to_string(), v);
        rest = after;
    }
    rest.trim().strip_prefix("</function>")?;
    Some(vec![new_call(
        Syntax::Hermes,
        None,
        name.trim(),
        Value::Object(args),
    )])
}

/// A generic-format answer: its calls, or its reply.
pub fn generic(answer: &str) -> Option<(Vec<ToolCall>, Option<String>)> {
    let v: Value = serde_json::from_str(answer.trim()).ok()?;
    if let Some(r) = v.get("response") {
        let text = match r {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        return Some((Vec::new(), Some(text)));
    }
    let items: Vec<Value> = match (v.get("tool_calls"), v.get("tool_call")) {
        (Some(Value::Array(a)), _) => a.clone(),
        (_, Some(c)) => vec![c.clone()],
        _ => return None,
    };
    let calls: Option<Vec<_>> = items
        .iter()
        .map(|c| call_from(Syntax::Generic, c, &["name"], &["arguments", "parameters"]))
        .collect();
    Some((calls?, None))
}

/// The generic format's whole answer taken apart: its calls or reply; an
/// answer that is neither is content as written.
pub fn parse_generic(answer: &str) -> Parsed {
    match generic(answer) {
        Some((calls, reply)) => Parsed {
            content: reply.unwrap_or_default(),
            thinking: String::new(),
            calls,
        },
        // Cut short (max_tokens): the calls it finished, not the JSON.
        None => match salvage(answer) {
            Some(calls) => Parsed {
                calls,
                ..Parsed::default()
            },
            None => Parsed {
                content: answer.to_string(),
                ..Parsed::default()
            },
        },
    }
}

/// The whole calls at the start of a generic answer cut short.
fn salvage(answer: &str) -> Option<Vec<ToolCall>> {
    let mut rest = answer.trim_start().strip_prefix("{\"tool_calls\": [")?;
    let mut calls = Vec::new();
    loop {
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let Some(Ok(v)) = it.next() else { break };
        calls.push(call_from(Syntax::Generic, &v, &["name"], &["arguments"])?);
        rest = rest[it.byte_offset()..].trim_start_matches([',', ' ']);
    }
    Some(calls)
}

fn new_call(syntax: Syntax, id: Option<&str>, name: &str, args: Value) -> ToolCall {
    let id = match id.filter(|i| !i.is_empty()) {
        Some(i) => i.to_string(),
        None => new_id(syntax),
    };
    ToolCall::new(id, name, args)
}

/// A fresh call id: nine letters and digits where Mistral's template wants
/// them, `call_` and 24 otherwise (OpenAI's shape).
pub fn new_id(syntax: Syntax) -> String {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let n = if matches!(syntax, Syntax::Mistral | Syntax::MistralArgs) {
        9
    } else {
        24
    };
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let mut s = String::with_capacity(n + 5);
    if n != 9 {
        s.push_str("call_");
    }
    for i in 0..n {
        h.write_usize(i);
        s.push(ALNUM[(h.finish() % ALNUM.len() as u64) as usize] as char);
    }
    s
}

/// Collects a whole answer's parts (for non-streamed use and tests).
pub fn parse_all(parser: &mut OutputParser, text: &str) -> Parsed {
    let mut p = parser.push(text);
    p.append(parser.finish());
    p
}
