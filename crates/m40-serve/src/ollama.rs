//! Ollama's API: `/api/generate`, `/api/chat` (NDJSON streams by default,
//! one object with `"stream": false`), `/api/tags`, `/api/show`, `/api/ps`,
//! `/api/version`. Durations are nanoseconds, as Ollama reports them.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use m40_runtime::{
    Completion, Engine, FinishReason, Message, Prompt, Request, SamplingParams, TokenEvent,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::defaults::Defaults;
use crate::models::{describe, model_entry, modified_at};
use crate::slot::Slot;
use crate::{parse_json, ApiError, AppState, Event, KeepAlive, Running};
use m40_runtime::ModelInfo;

/// Ollama's `options` (the ones m40-llm uses; others are accepted and
/// ignored, as Ollama does). Wrong types are a 400.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Options {
    temperature: Option<f32>,
    top_k: Option<i64>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    repeat_last_n: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<i64>,
    num_predict: Option<i64>,
    stop: Option<Vec<String>>,
    num_ctx: Option<i64>,
}

impl Options {
    /// These options over a model's defaults: what a request leaves out,
    /// its PARAMETERs give.
    fn under(self, d: &Defaults) -> Options {
        Options {
            temperature: self.temperature.or_else(|| d.get("temperature")),
            top_k: self.top_k.or_else(|| d.get("top_k")),
            top_p: self.top_p.or_else(|| d.get("top_p")),
            min_p: self.min_p.or_else(|| d.get("min_p")),
            repeat_penalty: self.repeat_penalty.or_else(|| d.get("repeat_penalty")),
            repeat_last_n: self.repeat_last_n.or_else(|| d.get("repeat_last_n")),
            presence_penalty: self.presence_penalty.or_else(|| d.get("presence_penalty")),
            frequency_penalty: self
                .frequency_penalty
                .or_else(|| d.get("frequency_penalty")),
            seed: self.seed.or_else(|| d.get("seed")),
            num_predict: self.num_predict.or_else(|| d.get("num_predict")),
            stop: self.stop.or_else(|| d.stops()),
            num_ctx: self.num_ctx.or_else(|| d.get("num_ctx")),
        }
    }

    /// The request these options describe, for `prompt` on an engine with
    /// context `n_ctx`.
    /// And the context it asks for (`num_ctx`: at most the loaded one).
    fn request(self, prompt: Prompt, n_ctx: usize) -> Result<(Request, Option<usize>), ApiError> {
        let d = SamplingParams::default();
        let invalid = |e: m40_runtime::InvalidParam| ApiError::bad_request(format!("option {e}"));
        let mut req = Request::new(prompt);
        req.sampling = {
            let mut o = SamplingParams::default();
            o.temperature = self.temperature.unwrap_or(d.temperature);
            o.top_k = self
                .top_k
                .map_or(Ok(d.top_k), |k| SamplingParams::count("top_k", k))
                .map_err(invalid)?;
            o.top_p = self.top_p.unwrap_or(d.top_p);
            o.min_p = self.min_p.unwrap_or(d.min_p);
            o.repeat_penalty = self.repeat_penalty.unwrap_or(d.repeat_penalty);
            o.presence_penalty = self.presence_penalty.unwrap_or(d.presence_penalty);
            o.frequency_penalty = self.frequency_penalty.unwrap_or(d.frequency_penalty);
            // Ollama: -1 is the whole context, 0 disables the penalties.
            o.penalty_last_n = match self.repeat_last_n {
                None => d.penalty_last_n,
                Some(-1) => n_ctx,
                Some(n) => SamplingParams::count("repeat_last_n", n).map_err(invalid)?,
            };
            // Ollama: a negative seed is a random one.
            o.seed = self.seed.filter(|&s| s >= 0).map(|s| s as u64);
            o
        };
        req.sampling.validate().map_err(invalid)?;
        // Ollama: -1 (and -2) generate until the context is full.
        req.max_tokens = self.num_predict.filter(|&n| n >= 0).map(|n| n as usize);
        req.stop = self.stop.unwrap_or_default();
        let ctx = match self.num_ctx {
            Some(c) if c <= 0 => {
                return Err(ApiError::bad_request(format!(
                    "num_ctx must be positive, not {c}"
                )))
            }
            Some(c) if c as usize > n_ctx => {
                return Err(ApiError::bad_request(format!(
                    "num_ctx {c} is more than the {n_ctx} tokens this server loaded the model \
                     with; ask for {n_ctx} or less, or start the server with a larger --ctx"
                )))
            }
            c => c.map(|c| c as usize),
        };
        Ok((req, ctx))
    }
}

#[derive(Debug, Deserialize)]
struct GenerateRequest {
    model: Option<String>,
    prompt: Option<String>,
    system: Option<String>,
    #[serde(default)]
    raw: bool,
    stream: Option<bool>,
    #[serde(default)]
    options: Options,
    #[serde(default)]
    images: Vec<String>,
    /// Structured output: "json" or a JSON schema.
    format: Option<Value>,
    /// Thinking: true, false or an effort.
    think: Option<Value>,
    /// 0 with an empty prompt unloads the model (`ollama stop`); other
    /// values are accepted, the model stays loaded.
    keep_alive: Option<Value>,
    /// Keep generating when the answer fills the context (default true).
    shift: Option<bool>,
    /// The ids a previous answer returned: this prompt continues them.
    context: Option<Vec<i64>>,
    /// Text after the answer: fill in the middle (code models).
    suffix: Option<String>,
    #[serde(flatten)]
    logprobs: Logprobs,
}

/// Ollama's `logprobs` and `top_logprobs` (Ollama 0.12.11 and later).
#[derive(Debug, Default, Deserialize)]
struct Logprobs {
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<i64>,
}

impl Logprobs {
    /// The request's `logprobs`: None, or how many alternatives.
    fn asked(&self) -> Result<Option<usize>, ApiError> {
        match (self.logprobs, self.top_logprobs) {
            (_, Some(n)) if !(0..=20).contains(&n) => Err(ApiError::bad_request(format!(
                "top_logprobs must be 0 to 20, not {n}"
            ))),
            (true, n) => Ok(Some(n.unwrap_or(0) as usize)),
            (false, _) => Ok(None),
        }
    }
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    images: Vec<String>,
    /// An assistant's calls.
    #[serde(default)]
    tool_calls: Vec<Value>,
    /// A tool result's function.
    tool_name: Option<String>,
    /// An assistant's reasoning.
    thinking: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: Option<String>,
    #[serde(default)]
    messages: Vec<ChatMessage>,
    stream: Option<bool>,
    #[serde(default)]
    options: Options,
    format: Option<Value>,
    think: Option<Value>,
    /// Functions the model may call.
    tools: Option<Value>,
    keep_alive: Option<Value>,
    /// Drop the oldest turns of a chat that does not fit (default true).
    truncate: Option<bool>,
    /// Keep generating when the answer fills the context (default true).
    shift: Option<bool>,
    #[serde(flatten)]
    logprobs: Logprobs,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

fn done_reason(r: FinishReason) -> &'static str {
    r.as_str()
}

/// `context`'s ids (negative ones are a 400; ids past the vocabulary are
/// refused when the prompt is tokenized).
fn context_ids(context: Option<&[i64]>) -> Result<Vec<u32>, ApiError> {
    context
        .unwrap_or_default()
        .iter()
        .map(|&i| {
            u32::try_from(i).map_err(|_| {
                ApiError::bad_request(format!("context holds {i}, which is no token id"))
            })
        })
        .collect()
}

fn no_images(images: &[String]) -> Result<(), ApiError> {
    if images.is_empty() {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "images are not supported: the loaded model is text-only",
        ))
    }
}

/// The counts and durations of a finished request, Ollama's names.
fn final_fields(obj: &mut serde_json::Map<String, Value>, done: &Completion, received: Instant) {
    let t = &done.timings;
    let ns = |ms: f64| (ms * 1e6).round() as u64;
    obj.insert("done".into(), json!(true));
    obj.insert("done_reason".into(), json!(done_reason(done.finish_reason)));
    obj.insert(
        "total_duration".into(),
        json!(received.elapsed().as_nanos() as u64),
    );
    obj.insert("load_duration".into(), json!(0));
    obj.insert("prompt_eval_count".into(), json!(t.prompt_tokens));
    obj.insert("prompt_eval_duration".into(), json!(ns(t.prompt_ms)));
    obj.insert(
        "eval_count".into(),
        json!(t.generated_tokens.max(done.token_ids.len())),
    );
    obj.insert("eval_duration".into(), json!(ns(t.generation_ms)));
}

/// How one API shapes its objects: a token's text chunk and the final one.
trait Shape: Send + 'static {
    /// A streamed piece: answer text, thinking, and calls (numbered from
    /// `first_call`).
    fn chunk(&self, t: &TokenEvent, first_call: usize) -> Value;
    /// The last object; `whole` when not streamed (it then carries the
    /// whole answer).
    fn last(&self, done: &Completion, whole: bool, prompt_ids: &[u32]) -> Value;
}

struct GenerateShape {
    model: String,
    received: Instant,
}

impl Shape for GenerateShape {
    fn chunk(&self, t: &TokenEvent, _: usize) -> Value {
        let mut v =
            json!({"model": self.model, "created_at": now(), "response": t.text, "done": false});
        if !t.thinking.is_empty() {
            v["thinking"] = json!(t.thinking);
        }
        v
    }
    fn last(&self, done: &Completion, whole: bool, prompt_ids: &[u32]) -> Value {
        let mut o = serde_json::Map::new();
        o.insert("model".into(), json!(self.model));
        o.insert("created_at".into(), json!(now()));
        o.insert(
            "response".into(),
            json!(if whole { &done.text[..] } else { "" }),
        );
        if whole && !done.thinking.is_empty() {
            o.insert("thinking".into(), json!(done.thinking));
        }
        final_fields(&mut o, done, self.received);
        // The ids to continue from: the prompt, the answer and the token
        // that ended it.
        let context: Vec<u32> = prompt_ids
            .iter()
            .chain(&done.token_ids)
            .chain(&done.end_token)
            .copied()
            .collect();
        o.insert("context".into(), json!(context));
        Value::Object(o)
    }
}

struct ChatShape {
    model: String,
    received: Instant,
}

/// An Ollama chat message of the assistant.
fn assistant(
    content: &str,
    thinking: &str,
    calls: &[m40_runtime::ToolCall],
    first: usize,
) -> Value {
    let mut m = json!({"role": "assistant", "content": content});
    if !thinking.is_empty() {
        m["thinking"] = json!(thinking);
    }
    if !calls.is_empty() {
        m["tool_calls"] = crate::tools::ollama_calls(calls, first);
    }
    m
}

impl Shape for ChatShape {
    fn chunk(&self, t: &TokenEvent, first_call: usize) -> Value {
        json!({"model": self.model, "created_at": now(),
               "message": assistant(&t.text, &t.thinking, &t.tool_calls, first_call), "done": false})
    }
    fn last(&self, done: &Completion, whole: bool, _: &[u32]) -> Value {
        let mut o = serde_json::Map::new();
        o.insert("model".into(), json!(self.model));
        o.insert("created_at".into(), json!(now()));
        let message = if whole {
            assistant(&done.text, &done.thinking, &done.tool_calls, 0)
        } else {
            assistant("", "", &[], 0)
        };
        o.insert("message".into(), message);
        final_fields(&mut o, done, self.received);
        Value::Object(o)
    }
}

fn ndjson_line(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

/// Stream `running` as NDJSON, or collect it into one object.
async fn respond(
    running: Running,
    stream: bool,
    shape: impl Shape,
    logprobs: bool,
) -> Result<Response, ApiError> {
    let engine = running.engine.clone();
    let entries = move |tokens: &[TokenEvent]| -> Value {
        tokens
            .iter()
            .filter(|t| t.logprob.is_some())
            .map(|t| crate::openai::chat_logprob(&engine, t))
            .collect()
    };
    if !stream {
        let prompt_ids = running.prompt_ids.clone();
        let (tokens, done) = running.collect().await?;
        let mut last = shape.last(&done, true, &prompt_ids);
        if logprobs {
            last["logprobs"] = entries(&tokens);
        }
        return Ok(Json(last).into_response());
    }
    // Tokens whose text is held (a split character, a possible marker)
    // give their logprobs with the next line.
    let state = (running, shape, 0, Vec::<TokenEvent>::new());
    let body = futures_util::stream::unfold(Some(state), move |st| {
        let entries = entries.clone();
        async move {
            let (mut running, shape, calls, mut pending) = st?;
            loop {
                let mut line = match running.recv().await? {
                    Event::Token(t)
                        if t.text.is_empty()
                            && t.thinking.is_empty()
                            && t.tool_calls.is_empty() =>
                    {
                        if logprobs {
                            pending.push(t);
                        }
                        continue;
                    }
                    Event::Token(t) => {
                        let mut v = shape.chunk(&t, calls);
                        let calls = calls + t.tool_calls.len();
                        if logprobs {
                            pending.push(t);
                            v["logprobs"] = entries(&std::mem::take(&mut pending));
                        }
                        let l = ndjson_line(&v);
                        return Some((
                            Ok::<_, Infallible>(l),
                            Some((running, shape, calls, pending)),
                        ));
                    }
                    Event::Done(Ok(done)) => shape.last(&done, false, &running.prompt_ids),
                    Event::Done(Err(e)) => json!({ "error": e }),
                };
                if logprobs && !pending.is_empty() {
                    line["logprobs"] = entries(&pending);
                }
                return Some((Ok(ndjson_line(&line)), None));
            }
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(body),
    )
        .into_response())
}

pub(crate) async fn generate(State(s): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let received = Instant::now();
    let r: GenerateRequest = parse_json(&body)?;
    let slot = s.slot_for(r.model.as_deref())?;
    let keep = s.keep_alive_of(r.keep_alive.as_ref())?;
    no_images(&r.images)?;
    let format = crate::format::ollama(r.format.as_ref())?;
    let think = crate::tools::ollama_think(r.think.as_ref())?;
    let model = r.model.clone().unwrap_or_default();
    let defaults = slot.defaults();
    let prompt_text = r.prompt.unwrap_or_default();
    if prompt_text.is_empty() {
        // Ollama: an empty prompt loads the model, or with keep_alive 0
        // unloads it (`ollama stop`).
        let reason = load_or_unload(&s, &slot, keep).await?;
        return Ok(
            Json(json!({"model": model, "created_at": now(), "response": "",
                              "done": true, "done_reason": reason}))
            .into_response(),
        );
    }
    let prompt = if let Some(suffix) = r.suffix.filter(|s| !s.is_empty()) {
        Prompt::Infill {
            prefix: prompt_text,
            suffix,
        }
    } else if r.raw {
        Prompt::Text(prompt_text)
    } else {
        // The request's system prompt, else the model's (then its
        // MESSAGEs, where it was created with some).
        let mut m = Vec::new();
        if let Some(sys) = r.system.filter(|s| !s.is_empty()) {
            m.push(Message::new("system", sys));
        }
        m.push(Message::new("user", prompt_text));
        Prompt::Chat(defaults.chat(m))
    };
    let served = s.open(&slot, keep).await?;
    let (mut req, ctx) = r.options.under(&defaults).request(prompt, served.n_ctx())?;
    req.shift = r.shift.unwrap_or(true);
    req.format = format;
    req.think = think;
    req.prefix = context_ids(r.context.as_deref())?;
    req.logprobs = r.logprobs.asked()?;
    let running = served.start(req, ctx)?;
    respond(
        running,
        r.stream.unwrap_or(true),
        GenerateShape { model, received },
        r.logprobs.logprobs,
    )
    .await
}

pub(crate) async fn chat(State(s): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let received = Instant::now();
    let r: ChatRequest = parse_json(&body)?;
    let slot = s.slot_for(r.model.as_deref())?;
    let keep = s.keep_alive_of(r.keep_alive.as_ref())?;
    let tools = crate::tools::tools(r.tools.as_ref())?;
    let format = crate::format::ollama(r.format.as_ref())?;
    let think = crate::tools::ollama_think(r.think.as_ref())?;
    let model = r.model.clone().unwrap_or_default();
    if r.messages.is_empty() {
        let reason = load_or_unload(&s, &slot, keep).await?;
        return Ok(Json(json!({"model": model, "created_at": now(),
                              "message": {"role": "assistant", "content": ""},
                              "done": true, "done_reason": reason}))
        .into_response());
    }
    let mut messages = Vec::with_capacity(r.messages.len());
    for m in r.messages {
        no_images(&m.images)?;
        if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool") {
            return Err(ApiError::bad_request(format!(
                "unknown message role '{}' (system, user, assistant or tool)",
                m.role
            )));
        }
        let mut msg = Message::new(m.role, m.content);
        msg.tool_calls = crate::tools::history_calls(&m.tool_calls)?;
        msg.name = m.tool_name;
        msg.reasoning_content = m.thinking.clone();
        msg.thinking = m.thinking;
        messages.push(msg);
    }
    crate::tools::link_results(&mut messages);
    let defaults = slot.defaults();
    let messages = defaults.chat(messages);
    let served = s.open(&slot, keep).await?;
    let (mut req, ctx) = r
        .options
        .under(&defaults)
        .request(Prompt::Chat(messages), served.n_ctx())?;
    req.shift = r.shift.unwrap_or(true);
    req.format = format;
    req.tools = tools;
    req.think = think;
    req.drop_old_turns = r.truncate.unwrap_or(true);
    req.logprobs = r.logprobs.asked()?;
    let running = served.start(req, ctx)?;
    respond(
        running,
        r.stream.unwrap_or(true),
        ChatShape { model, received },
        r.logprobs.logprobs,
    )
    .await
}

/// The Ollama version whose API this server answers as: 0.12.11, the
/// release that added `logprobs`, the newest of the request fields served
/// here (tools came in 0.3, `format` schemas in 0.5, `think` in 0.9), so a
/// client that compares the version against the release that brought a
/// feature finds every feature served here. m40-llm's own is `m40_llm`.
pub(crate) const OLLAMA_API_VERSION: &str = "0.12.11";

pub(crate) async fn version() -> Json<Value> {
    Json(json!({ "version": OLLAMA_API_VERSION, "m40_llm": env!("CARGO_PKG_VERSION") }))
}

/// A request without a prompt: unload the model (keep_alive 0) or load it;
/// the `done_reason` Ollama gives.
pub(crate) async fn load_or_unload(
    s: &AppState,
    slot: &Arc<Slot>,
    keep_alive: KeepAlive,
) -> Result<&'static str, ApiError> {
    if keep_alive.is_zero() {
        if !slot.can_unload() {
            return Err(ApiError::bad_request(
                "this server cannot load its model again, so it does not unload it",
            ));
        }
        // Now, or as its requests in flight end.
        slot.reap(Some(keep_alive));
        return Ok("unload");
    }
    // Loaded (Ollama's preload), kept `keep_alive` from now.
    s.open(slot, keep_alive).await?;
    Ok("load")
}

/// `/api/ps`: the models loaded now, most recently loaded first.
pub(crate) async fn ps(State(s): State<AppState>) -> Json<Value> {
    let mut loaded = s.loaded_slots();
    loaded.sort_by_key(|(slot, _)| std::cmp::Reverse(slot.loaded_at()));
    let models: Vec<Value> = loaded.iter().map(|(slot, e)| ps_entry(slot, e)).collect();
    Json(json!({ "models": models }))
}

fn ps_entry(slot: &Slot, engine: &Engine) -> Value {
    let mut m = model_entry(slot, engine.model());
    // When it goes if no request comes; a model kept forever (keep_alive
    // < 0, or a server that cannot load it again) Ollama shows as
    // expiring in the far future.
    let forever = chrono::Duration::days(100 * 365);
    let left = match slot.expires_at() {
        Some(at) => at.saturating_duration_since(std::time::Instant::now()),
        None => forever.to_std().unwrap_or_default(),
    };
    let expires = chrono::Utc::now()
        + chrono::Duration::from_std(left)
            .unwrap_or(forever)
            .min(forever);
    m["expires_at"] = json!(expires.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    // What it holds (weights, KV pool, workspace); Ollama's `ps` derives
    // its PROCESSOR column from the part in GPU memory.
    let mem = engine.memory();
    m["size"] = json!(mem.total());
    m["size_vram"] = json!(engine.memory_on_gpus());
    m["context_length"] = json!(engine.n_ctx());
    m["m40_backend"] = json!(engine.backend_name());
    // What the engine runs now (m40-llm's own fields).
    m["m40_activity"] = json!(engine.activity());
    m
}

#[derive(Deserialize)]
struct ShowRequest {
    model: Option<String>,
    /// Older clients say `name`.
    name: Option<String>,
}

pub(crate) async fn show(State(s): State<AppState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let r: ShowRequest = parse_json(&body)?;
    let requested = r.model.or(r.name);
    let slot = s.slot_for(requested.as_deref());
    // A model served here: the loaded engine says which template it
    // renders (a server may override the model's) and what that allows.
    if let Some((slot, model)) = slot
        .as_ref()
        .ok()
        .and_then(|sl| sl.model().map(|m| (sl, m.clone())))
    {
        let info = match slot.engine() {
            Some(e) => e.info(),
            None => ModelInfo::of(&model),
        };
        let mf = slot.modelfile();
        return Ok(Json(describe(
            &info,
            &slot.loaded_at().to_rfc3339(),
            mf.as_deref(),
        )));
    }
    // Any stored model can be described, loaded or not.
    let stored = match (s.store(), requested.as_deref()) {
        (Some(store), Some(name)) => store.manifest(name.trim()).ok().flatten(),
        _ => None,
    };
    let Some(m) = stored else {
        return Err(slot.err().unwrap_or_else(|| {
            ApiError::new(axum::http::StatusCode::NOT_FOUND, "model not found")
        }));
    };
    let mf = m.modelfile.clone();
    let info = tokio::task::spawn_blocking(move || ModelInfo::read(&m.path))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let modified = modified_at(&info);
    Ok(Json(describe(&info, &modified, mf.as_ref())))
}
