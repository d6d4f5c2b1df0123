//! OpenAI's API: `/v1/chat/completions`, `/v1/completions` (SSE streams
//! ending in `data: [DONE]`; usage; finish_reason; logprobs), `/v1/models`.
//! Errors are `{"error": {"message", "type", "code"}}` as OpenAI sends them.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use m40_runtime::{
    Completion, Engine, FinishReason, Message, Prompt, Request, SamplingParams, TokenEvent,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::slot::Slot;
use crate::{parse_json, ApiError, AppState, Event, Running};

/// OpenAI's error body.
pub(crate) struct OaiError(ApiError);

impl From<ApiError> for OaiError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for OaiError {
    fn into_response(self) -> Response {
        let kind = match self.0.status {
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::SERVICE_UNAVAILABLE => "server_busy",
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        };
        let status = self.0.status;
        let retry = self.0.retry_after;
        let mut r = (
            status,
            Json(json!({"error": {"message": self.0.message, "type": kind, "code": status.as_u16()}})),
        )
            .into_response();
        if let Some(s) = retry {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        r
    }
}

/// A string or a list of strings (`stop`, `prompt`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// Fields both endpoints share.
#[derive(Debug, Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// llama.cpp's extensions, accepted here too.
    top_k: Option<i64>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<u64>,
    stop: Option<OneOrMany>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    n: Option<u64>,
    /// `text`, `json_object` or `json_schema` (structured outputs).
    response_format: Option<Value>,
    /// llama.cpp's extensions: a JSON schema, or a GBNF grammar.
    json_schema: Option<Value>,
    grammar: Option<String>,
    /// Functions the model may call (chat), whether it must, and whether
    /// it may make several calls at once.
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    /// How hard a reasoning model thinks ("none" turns it off).
    reasoning_effort: Option<String>,
    /// vLLM's and llama.cpp's extension: variables for the chat template
    /// (`{"enable_thinking": false}`).
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Token id (as a string) to a bias from -100 to 100 added to its logit.
    logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    /// vLLM's and llama.cpp's extension: generate past the end-of-turn
    /// token to `max_tokens` (fixed-length requests, for benchmarks).
    #[serde(default)]
    ignore_eos: bool,
}

/// OpenAI's `logit_bias`: token ids (JSON keys) to biases in [-100, 100];
/// ids past the vocabulary are refused when the request is prepared.
fn logit_bias(
    map: Option<&std::collections::BTreeMap<String, f32>>,
) -> Result<Vec<(u32, f32)>, ApiError> {
    map.into_iter()
        .flatten()
        .map(|(k, &v)| {
            let id = k.trim().parse::<u32>().map_err(|_| {
                ApiError::bad_request(format!("logit_bias: {k:?} is not a token id"))
            })?;
            if !(-100.0..=100.0).contains(&v) {
                return Err(ApiError::bad_request(format!(
                    "logit_bias: {v} for token {id} is outside -100 to 100"
                )));
            }
            Ok((id, v))
        })
        .collect()
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

impl Common {
    fn request(
        &self,
        s: &AppState,
        prompt: Prompt,
        logprobs: Option<usize>,
    ) -> Result<(Arc<Slot>, Request), ApiError> {
        let slot = s.slot_for(self.model.as_deref())?;
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad_request("only n = 1 is supported"));
        }
        let format = crate::format::openai(
            self.response_format.as_ref(),
            self.json_schema.as_ref(),
            self.grammar.as_deref(),
        )?;
        let tools = crate::tools::tools(self.tools.as_ref())?;
        if !tools.is_empty() && matches!(prompt, Prompt::Text(_)) {
            return Err(ApiError::bad_request(
                "tools are for chat: use /v1/chat/completions",
            ));
        }
        let d = SamplingParams::default();
        // What the request leaves out, a created model's PARAMETERs give;
        // its SYSTEM and MESSAGEs go before a chat's.
        let m = slot.defaults();
        let prompt = match prompt {
            Prompt::Chat(messages) => Prompt::Chat(m.chat(messages)),
            p => p,
        };
        let mut req = Request::new(prompt);
        req.sampling = {
            let mut o = SamplingParams::default();
            o.temperature =
                (self.temperature.or_else(|| m.get("temperature"))).unwrap_or(d.temperature);
            o.top_p = self.top_p.or_else(|| m.get("top_p")).unwrap_or(d.top_p);
            o.top_k = (self.top_k.or_else(|| m.get("top_k")))
                .map_or(Ok(d.top_k), |k| SamplingParams::count("top_k", k))
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            o.min_p = self.min_p.or_else(|| m.get("min_p")).unwrap_or(d.min_p);
            o.repeat_penalty = (self.repeat_penalty.or_else(|| m.get("repeat_penalty")))
                .unwrap_or(d.repeat_penalty);
            o.presence_penalty = (self.presence_penalty.or_else(|| m.get("presence_penalty")))
                .unwrap_or(d.presence_penalty);
            o.frequency_penalty = (self
                .frequency_penalty
                .or_else(|| m.get("frequency_penalty")))
            .unwrap_or(d.frequency_penalty);
            o.penalty_last_n = m
                .get::<i64>("repeat_last_n")
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(d.penalty_last_n);
            o.seed = self.seed.or_else(|| m.get("seed"));
            o
        };
        req.sampling
            .validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        req.max_tokens = (self.max_completion_tokens.or(self.max_tokens))
            .map(|m| m as usize)
            .or_else(|| {
                (m.get::<i64>("num_predict"))
                    .filter(|&n| n >= 0)
                    .map(|n| n as usize)
            });
        req.stop = match self.stop.clone() {
            Some(s) => s.into_vec(),
            None => m.stops().unwrap_or_default(),
        };
        if self.stop.as_ref().is_some_and(|_| req.stop.len() > 4) {
            return Err(ApiError::bad_request("at most 4 stop sequences"));
        }
        req.logprobs = logprobs;
        req.logit_bias = logit_bias(self.logit_bias.as_ref())?;
        req.ignore_eos = self.ignore_eos;
        req.format = format;
        req.tools = tools;
        req.tool_choice = crate::tools::choice(self.tool_choice.as_ref())?;
        if req.tools.is_empty()
            && matches!(
                req.tool_choice,
                m40_runtime::ToolChoice::Required | m40_runtime::ToolChoice::Function(_)
            )
        {
            return Err(ApiError::bad_request(
                "tool_choice asks for a call, but the request has no tools",
            ));
        }
        req.parallel_tool_calls = self.parallel_tool_calls.unwrap_or(true);
        req.think = crate::tools::reasoning_effort(self.reasoning_effort.as_deref())?;
        req.template_vars = self.chat_template_kwargs.clone().unwrap_or_default();
        Ok((slot, req))
    }
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    content: Option<Content>,
    /// An assistant's calls.
    #[serde(default)]
    tool_calls: Vec<Value>,
    /// The call a tool result answers, and its function.
    tool_call_id: Option<String>,
    name: Option<String>,
    /// An assistant's reasoning (llama.cpp's and vLLM's field).
    reasoning_content: Option<String>,
}

/// `content`: a string, or a list of parts of which only text is supported.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    messages: Vec<ChatMessage>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<u64>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    prompt: OneOrMany,
    logprobs: Option<u64>,
    #[serde(default)]
    echo: bool,
    #[serde(flatten)]
    common: Common,
}

/// A request with the shared fields flattened in: serde reports errors in
/// flattened fields without their names, so [`Common`] is read on its own
/// first (its errors name the field), then the whole.
fn parse_flattened<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    parse_json::<Common>(body)?;
    parse_json(body)
}

fn finish_reason(r: FinishReason, called: bool) -> &'static str {
    match r {
        FinishReason::Stop if called => "tool_calls",
        FinishReason::Stop => "stop",
        // Length, Cancelled and any reason to come: OpenAI has no other
        // name for an answer cut short.
        _ => "length",
    }
}

fn usage(prompt: usize, done: &Completion) -> Value {
    let n = done.token_ids.len();
    json!({"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n})
}

fn token_text(e: &Engine, id: u32) -> String {
    e.tokenizer().decode(&[id]).unwrap_or_default()
}

/// Chat's logprobs entry for one token (Ollama's is the same).
pub(crate) fn chat_logprob(e: &Engine, t: &TokenEvent) -> Value {
    let entry = |id: u32, lp: f32| {
        let text = token_text(e, id);
        json!({"token": text, "logprob": lp, "bytes": text.as_bytes()})
    };
    let mut v = entry(t.id, t.logprob.unwrap_or(0.0));
    v["top_logprobs"] = t
        .top_logprobs
        .iter()
        .map(|&(id, _, lp)| entry(id, lp))
        .collect();
    v
}

/// Completions' logprobs (the legacy shape) over all tokens.
fn completion_logprobs(e: &Engine, tokens: &[TokenEvent]) -> Value {
    let mut offset = 0;
    let (mut toks, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for t in tokens {
        let text = token_text(e, t.id);
        offsets.push(offset);
        offset += text.len();
        toks.push(json!(text));
        lps.push(json!(t.logprob));
        let top: serde_json::Map<String, Value> = t
            .top_logprobs
            .iter()
            .map(|&(id, _, lp)| (token_text(e, id), json!(lp)))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

fn id(prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}-{n:x}")
}

fn created() -> i64 {
    chrono::Utc::now().timestamp()
}

/// The parts of a response both endpoints share.
struct Meta {
    id: String,
    object: &'static str,
    model: String,
    chat: bool,
    include_usage: bool,
    want_logprobs: bool,
}

impl Meta {
    fn wrap(&self, choice: Value, usage: Option<Value>) -> Value {
        let mut v = json!({"id": self.id, "object": self.object, "created": created(),
                           "model": self.model, "choices": [choice]});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }
}

async fn respond(
    s: AppState,
    running: Running,
    stream: bool,
    meta: Meta,
) -> Result<Response, OaiError> {
    let prompt_len = running.prompt_ids.len();
    if !stream {
        let e = running.engine.clone();
        let e = &*e;
        let (tokens, done) = running.collect().await?;
        let choice = if meta.chat {
            let lp = meta.want_logprobs.then(|| {
                json!({"content": tokens.iter().map(|t| chat_logprob(e, t)).collect::<Vec<_>>()})
            });
            let called = !done.tool_calls.is_empty();
            let mut m = json!({"role": "assistant",
                               "content": if called && done.text.is_empty() { None } else { Some(&done.text) }});
            if !done.thinking.is_empty() {
                m["reasoning_content"] = json!(done.thinking);
            }
            if called {
                m["tool_calls"] = crate::tools::openai_calls(&done.tool_calls, None);
            }
            json!({"index": 0, "message": m, "logprobs": lp,
                   "finish_reason": finish_reason(done.finish_reason, called)})
        } else {
            let lp = meta.want_logprobs.then(|| completion_logprobs(e, &tokens));
            json!({"index": 0, "text": done.text, "logprobs": lp,
                   "finish_reason": finish_reason(done.finish_reason, false)})
        };
        return Ok(Json(meta.wrap(choice, Some(usage(prompt_len, &done)))).into_response());
    }
    let first = meta.chat.then(|| {
        let c = json!({"index": 0, "delta": {"role": "assistant", "content": ""},
                       "logprobs": null, "finish_reason": null});
        SseEvent::default().data(meta.wrap(c, None).to_string())
    });
    // Each step yields the events of one engine event.
    let events = futures_util::stream::unfold(Some((running, s, meta, 0)), |st| async move {
        let (mut running, s, meta, calls) = st?;
        let ev = running.recv().await?;
        let data = |v: Value| SseEvent::default().data(v.to_string());
        match ev {
            Event::Token(t)
                if meta.chat
                    && t.text.is_empty()
                    && t.thinking.is_empty()
                    && t.tool_calls.is_empty()
                    && !meta.want_logprobs =>
            {
                Some((Vec::new(), Some((running, s, meta, calls))))
            }
            Event::Token(t) => {
                let e = &*running.engine;
                let lp = meta.want_logprobs.then(|| {
                    if meta.chat {
                        json!({"content": [chat_logprob(e, &t)]})
                    } else {
                        completion_logprobs(e, std::slice::from_ref(&t))
                    }
                });
                let c = if meta.chat {
                    let mut delta = json!({});
                    if !t.text.is_empty() || (t.thinking.is_empty() && t.tool_calls.is_empty()) {
                        delta["content"] = json!(t.text);
                    }
                    if !t.thinking.is_empty() {
                        delta["reasoning_content"] = json!(t.thinking);
                    }
                    if !t.tool_calls.is_empty() {
                        delta["tool_calls"] =
                            crate::tools::openai_calls(&t.tool_calls, Some(calls));
                    }
                    json!({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": null})
                } else {
                    json!({"index": 0, "text": t.text, "logprobs": lp, "finish_reason": null})
                };
                let out = vec![data(meta.wrap(c, None))];
                let calls = calls + t.tool_calls.len();
                Some((out, Some((running, s, meta, calls))))
            }
            Event::Done(Ok(done)) => {
                let reason = finish_reason(done.finish_reason, !done.tool_calls.is_empty());
                let c = if meta.chat {
                    json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": reason})
                } else {
                    json!({"index": 0, "text": "", "logprobs": null, "finish_reason": reason})
                };
                let mut out = vec![data(meta.wrap(c, None))];
                if meta.include_usage {
                    let mut u =
                        meta.wrap(json!(null), Some(usage(running.prompt_ids.len(), &done)));
                    u["choices"] = json!([]);
                    out.push(data(u));
                }
                out.push(SseEvent::default().data("[DONE]"));
                Some((out, None))
            }
            Event::Done(Err(e)) => {
                let err = json!({"error": {"message": e, "type": "server_error", "code": 500}});
                Some((vec![data(err), SseEvent::default().data("[DONE]")], None))
            }
        }
    });
    use futures_util::StreamExt;
    let all = futures_util::stream::iter(first)
        .chain(events.flat_map(futures_util::stream::iter))
        .map(Ok::<_, Infallible>);
    Ok(Sse::new(all).into_response())
}

pub(crate) async fn chat_completions(
    State(s): State<AppState>,
    body: Bytes,
) -> Result<Response, OaiError> {
    let r: ChatRequest = parse_flattened(&body)?;
    if r.messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty").into());
    }
    let mut messages = Vec::with_capacity(r.messages.len());
    for m in r.messages {
        if !matches!(
            m.role.as_str(),
            "system" | "developer" | "user" | "assistant" | "tool"
        ) {
            return Err(ApiError::bad_request(format!("unknown message role '{}'", m.role)).into());
        }
        let text = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut t = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return Err(ApiError::bad_request(format!(
                            "content parts of type '{}' are not supported (text only)",
                            p.kind
                        ))
                        .into());
                    }
                    t.push_str(&p.text.unwrap_or_default());
                }
                t
            }
        };
        let role = if m.role == "developer" {
            "system".to_string()
        } else {
            m.role
        };
        let mut msg = Message::new(role, text);
        msg.tool_calls = crate::tools::history_calls(&m.tool_calls)?;
        msg.tool_call_id = m.tool_call_id;
        msg.name = m.name;
        msg.thinking = m.reasoning_content.clone();
        msg.reasoning_content = m.reasoning_content;
        messages.push(msg);
    }
    crate::tools::link_results(&mut messages);
    let top = r.top_logprobs.unwrap_or(0);
    if top > 20 {
        return Err(ApiError::bad_request("top_logprobs must be at most 20").into());
    }
    let logprobs = r.logprobs.then_some(top as usize);
    let (slot, req) = r.common.request(&s, Prompt::Chat(messages), logprobs)?;
    let running = s
        .open(&slot, s.default_keep_alive())
        .await?
        .start(req, None)?;
    let meta = Meta {
        id: id("chatcmpl"),
        object: if r.common.stream {
            "chat.completion.chunk"
        } else {
            "chat.completion"
        },
        model: r.common.model.clone().unwrap_or_default(),
        chat: true,
        include_usage: r
            .common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
        want_logprobs: r.logprobs,
    };
    respond(s, running, r.common.stream, meta).await
}

pub(crate) async fn completions(
    State(s): State<AppState>,
    body: Bytes,
) -> Result<Response, OaiError> {
    let r: CompletionRequest = parse_flattened(&body)?;
    let prompts = r.prompt.into_vec();
    let [prompt] = <[String; 1]>::try_from(prompts).map_err(|_| {
        ApiError::bad_request("prompt must be one string (batches are not supported)")
    })?;
    if r.echo {
        return Err(ApiError::bad_request("echo is not supported").into());
    }
    let top = r.logprobs.unwrap_or(0);
    if top > 5 {
        return Err(ApiError::bad_request("logprobs must be at most 5").into());
    }
    // OpenAI's default for this endpoint is 16 tokens.
    let (slot, mut req) =
        r.common
            .request(&s, Prompt::Text(prompt), r.logprobs.map(|n| n as usize))?;
    if req.max_tokens.is_none() {
        req.max_tokens = Some(16);
    }
    let running = s
        .open(&slot, s.default_keep_alive())
        .await?
        .start(req, None)?;
    let meta = Meta {
        id: id("cmpl"),
        object: "text_completion",
        model: r.common.model.clone().unwrap_or_default(),
        chat: false,
        include_usage: r
            .common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
        want_logprobs: r.logprobs.is_some(),
    };
    respond(s, running, r.common.stream, meta).await
}

fn model_object(name: &str, created: i64) -> Value {
    json!({"id": name, "object": "model", "created": created, "owned_by": "m40-llm"})
}

/// `/v1/models`: the models loaded now and those the store holds.
pub(crate) async fn models(State(s): State<AppState>) -> Json<Value> {
    let mut data: Vec<Value> = s
        .slots()
        .iter()
        .filter(|slot| slot.model().is_some())
        .map(|slot| model_object(&slot.name, slot.loaded_at().timestamp()))
        .collect();
    if let Some(store) = s.store().cloned() {
        let stored = tokio::task::spawn_blocking(move || store.list())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        for m in stored {
            if !data.iter().any(|d| {
                d["id"]
                    .as_str()
                    .is_some_and(|n| m40_store::same_model(n, &m.name))
            }) {
                // The file's time: when it was pulled.
                let created = std::fs::metadata(&m.path)
                    .and_then(|md| md.modified())
                    .map_or(0, |t| chrono::DateTime::<chrono::Utc>::from(t).timestamp());
                data.push(model_object(&m.name, created));
            }
        }
    }
    Json(json!({"object": "list", "data": data}))
}

/// `/v1/models/{id}` (the openai client's `models.retrieve`).
pub(crate) async fn model(
    State(s): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, OaiError> {
    let slot = s.slot_for(Some(&id))?;
    Ok(Json(model_object(&slot.name, slot.loaded_at().timestamp())))
}
