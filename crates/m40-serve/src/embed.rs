//! Embeddings over HTTP: Ollama's `/api/embed` and older `/api/embeddings`,
//! OpenAI's `/v1/embeddings`. A request's inputs run together in the
//! engine's steps (`Engine::embed`).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use m40_runtime::{CancelToken, EmbedInput, EmbedRequest, Embeddings, EngineError};

use crate::ollama::load_or_unload;
use crate::openai::OaiError;
use crate::slot::Slot;
use crate::KeepAlive;
use crate::{parse_json, ApiError, AppState};

/// A refusal of the request itself is a 400; a failed step is the server's.
fn embed_error(e: EngineError) -> ApiError {
    match e {
        EngineError::Step(_)
        | EngineError::Thread(_)
        | EngineError::Cancelled
        | EngineError::Stopped => ApiError::internal(e.to_string()),
        e => ApiError::bad_request(e.to_string()),
    }
}

impl AppState {
    /// Run `req` on `slot`'s model (loading it where it is not loaded); a
    /// 503 while the queue is full, the request cancelled when its client
    /// goes or its time runs out.
    pub(crate) async fn embed(
        &self,
        slot: &Arc<Slot>,
        req: EmbedRequest,
        keep_alive: KeepAlive,
    ) -> Result<Embeddings, ApiError> {
        let served = self.open(slot, keep_alive).await?;
        let engine = served.engine.clone();
        self.check_queue(&engine)?;
        let cancel = CancelToken::new();
        let timer = {
            let (c, timeout) = (cancel.clone(), self.inner.config.request_timeout);
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                c.cancel();
            })
        };
        let metrics = self.metrics().clone();
        // Awaited on the request's task (no thread of its own); the inputs
        // are cancelled if the client goes (this future is dropped, and
        // the run with it).
        let got = match engine.embed_start(&req, &cancel) {
            Ok(run) => run.wait_async().await,
            Err(e) => Err(e),
        };
        timer.abort();
        let got = got.map_err(embed_error)?;
        metrics.started(got.prompt_tokens());
        metrics.finished(0, got.prompt_tokens());
        Ok(got)
    }
}

/// A string, or an array of strings (Ollama), or of token ids (OpenAI).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    One(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

impl Input {
    fn into_inputs(self) -> Vec<EmbedInput> {
        match self {
            Input::One(t) => vec![EmbedInput::Text(t)],
            Input::Texts(t) => t.into_iter().map(EmbedInput::Text).collect(),
            Input::Tokens(ids) => vec![EmbedInput::Tokens(ids)],
            Input::TokenLists(l) => l.into_iter().map(EmbedInput::Tokens).collect(),
        }
    }
}

fn parse_input(v: Option<Value>, field: &str) -> Result<Vec<EmbedInput>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let input: Input = serde_json::from_value(v).map_err(|_| {
        ApiError::bad_request(format!(
            "{field} must be a string, an array of strings, or token ids"
        ))
    })?;
    Ok(input.into_inputs())
}

fn dimensions(d: Option<i64>) -> Result<Option<usize>, ApiError> {
    match d {
        None => Ok(None),
        Some(n) if n > 0 => Ok(Some(n as usize)),
        Some(n) => Err(ApiError::bad_request(format!(
            "dimensions must be positive, not {n}"
        ))),
    }
}

#[derive(Debug, Deserialize)]
struct EmbedBody {
    model: Option<String>,
    input: Option<Value>,
    /// Cut inputs longer than the context (default true).
    truncate: Option<bool>,
    dimensions: Option<i64>,
    keep_alive: Option<Value>,
    #[allow(dead_code)]
    options: Option<Value>,
}

/// Ollama's `/api/embed`: `{"model", "embeddings": [[...]], "total_duration",
/// "load_duration", "prompt_eval_count"}`; an empty input embeds nothing.
pub(crate) async fn ollama_embed(
    State(s): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let r: EmbedBody = parse_json(&body)?;
    let slot = s.slot_for(r.model.as_deref())?;
    let keep = s.keep_alive_of(r.keep_alive.as_ref())?;
    let mut inputs = parse_input(r.input, "input")?;
    // Ollama skips a lone empty string (an empty array of embeddings).
    if matches!(inputs.as_slice(), [EmbedInput::Text(t)] if t.is_empty()) {
        inputs.clear();
    }
    let model = r.model.unwrap_or_default();
    let got = if inputs.is_empty() {
        // As an empty generate: loads the model, or with keep_alive 0
        // unloads it.
        load_or_unload(&s, &slot, keep).await?;
        Embeddings::default()
    } else {
        let mut req = EmbedRequest::new(inputs);
        req.truncate = r.truncate.unwrap_or(true);
        req.dimensions = dimensions(r.dimensions)?;
        s.embed(&slot, req, keep).await?
    };
    Ok(Json(json!({
        "model": model,
        "embeddings": got.vectors,
        "total_duration": received.elapsed().as_nanos() as u64,
        "load_duration": 0,
        "prompt_eval_count": got.prompt_tokens(),
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
struct EmbeddingsBody {
    model: Option<String>,
    prompt: Option<String>,
    keep_alive: Option<Value>,
    #[allow(dead_code)]
    options: Option<Value>,
}

/// Ollama's older `/api/embeddings`: one `prompt`, `{"embedding": [...]}`
/// as pooled (not normalized, as Ollama returns it); an empty prompt gives
/// an empty embedding.
pub(crate) async fn ollama_embeddings(
    State(s): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let r: EmbeddingsBody = parse_json(&body)?;
    let slot = s.slot_for(r.model.as_deref())?;
    let keep = s.keep_alive_of(r.keep_alive.as_ref())?;
    let prompt = r.prompt.unwrap_or_default();
    if prompt.is_empty() {
        return Ok(Json(json!({ "embedding": [] })).into_response());
    }
    let mut req = EmbedRequest::new(vec![EmbedInput::Text(prompt)]);
    req.normalize = false;
    let mut got = s.embed(&slot, req, keep).await?;
    Ok(Json(json!({ "embedding": got.vectors.remove(0) })).into_response())
}

#[derive(Debug, Deserialize)]
struct OaiBody {
    model: Option<String>,
    input: Option<Value>,
    /// "float" (the default) or "base64" (little-endian f32s).
    encoding_format: Option<String>,
    dimensions: Option<i64>,
    #[allow(dead_code)]
    user: Option<String>,
}

/// OpenAI's `/v1/embeddings`: `{"object": "list", "data": [{"object":
/// "embedding", "embedding", "index"}], "model", "usage"}`.
pub(crate) async fn openai_embeddings(
    State(s): State<AppState>,
    body: Bytes,
) -> Result<Response, OaiError> {
    let r: OaiBody = parse_json(&body)?;
    let slot = s.slot_for(r.model.as_deref())?;
    let base64 = match r.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "encoding_format must be \"float\" or \"base64\", not {other:?}"
            ))
            .into())
        }
    };
    let inputs = parse_input(r.input, "input")?;
    let empty = |i: &EmbedInput| match i {
        EmbedInput::Text(t) => t.is_empty(),
        EmbedInput::Tokens(ids) => ids.is_empty(),
    };
    if inputs.is_empty() || inputs.iter().any(empty) {
        return Err(ApiError::bad_request("input must not be empty (nor any of its items)").into());
    }
    let mut req = EmbedRequest::new(inputs);
    req.dimensions = dimensions(r.dimensions)?;
    let got = s.embed(&slot, req, s.default_keep_alive()).await?;
    let n = got.prompt_tokens();
    let data: Vec<Value> = got
        .vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "embedding": embedding, "index": index})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": r.model.unwrap_or_default(),
        "usage": {"prompt_tokens": n, "total_tokens": n},
    }))
    .into_response())
}
