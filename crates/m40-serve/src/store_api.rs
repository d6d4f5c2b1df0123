//! The model store over Ollama's API: `/api/tags` (every stored model and
//! the loaded one), `/api/pull` (NDJSON progress), `/api/delete`.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use m40_runtime::ModelInfo;
use m40_store::{same_model, ModelRef, Progress, PullOptions, Store, StoreError};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::models::{details, model_entry, modified_at};
use crate::{parse_json, ApiError, AppState};

/// A store error as an HTTP error.
fn store_error(e: StoreError) -> ApiError {
    let status = match &e {
        StoreError::UnknownModel(..) | StoreError::NotStored(_) => StatusCode::NOT_FOUND,
        StoreError::BadRef(..) | StoreError::HfSelect { .. } | StoreError::Unverified { .. } => {
            StatusCode::BAD_REQUEST
        }
        StoreError::NotAllowedRemotely(_) => StatusCode::FORBIDDEN,
        StoreError::Busy(_) => StatusCode::CONFLICT,
        StoreError::Http { .. }
        | StoreError::Unreachable { .. }
        | StoreError::Checksum { .. }
        | StoreError::NotGguf { .. } => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(status, e.to_string())
}

fn no_store() -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "this server was started without a model store",
    )
}

pub(crate) fn store(s: &AppState) -> Result<Store, ApiError> {
    s.store().cloned().ok_or_else(no_store)
}

pub(crate) async fn tags(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let mut models = Vec::new();
    if let Some(store) = s.store().cloned() {
        models = tokio::task::spawn_blocking(move || {
            let list = store.list()?;
            Ok::<_, StoreError>(
                list.into_iter()
                    .map(|m| {
                        let info = ModelInfo::read(&m.path).ok();
                        let details = info
                            .as_ref()
                            .map_or_else(|| json!({"format": "gguf"}), details);
                        json!({"name": m.name, "model": m.name,
                               "modified_at": info.as_ref().map(modified_at).unwrap_or_default(),
                               "size": m.size, "digest": m.sha256, "details": details})
                    })
                    .collect::<Vec<_>>(),
            )
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(store_error)?;
    }
    // The models served here that the store does not hold (a path).
    for slot in s.slots().iter().rev() {
        let stored = |m: &Value| {
            m["name"]
                .as_str()
                .is_some_and(|n| same_model(n, &slot.name))
        };
        if let (Some(model), false) = (slot.model(), models.iter().any(stored)) {
            models.insert(0, model_entry(slot, model));
        }
    }
    Ok(Json(json!({ "models": models })))
}

#[derive(Deserialize)]
struct PullRequest {
    model: Option<String>,
    /// Older clients say `name`.
    name: Option<String>,
    /// Ollama's "insecure": here, accept a file whose sha256 nothing
    /// states (HTTPS is always verified).
    insecure: Option<bool>,
    stream: Option<bool>,
}

/// Pull progress as Ollama's NDJSON objects; byte counts at most every
/// 100 ms. The pull stops (keeping its bytes) once the client is gone.
struct Reporter {
    tx: mpsc::UnboundedSender<Value>,
    last: Option<Instant>,
}

impl Progress for Reporter {
    fn status(&mut self, msg: &str) {
        let _ = self.tx.send(json!({ "status": msg }));
    }

    fn bytes(&mut self, digest: &str, completed: u64, total: Option<u64>) {
        let due = self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(100));
        if due || total == Some(completed) {
            self.last = Some(Instant::now());
            let short: String = digest
                .trim_start_matches("sha256:")
                .chars()
                .take(12)
                .collect();
            let _ = self.tx.send(json!({
                "status": format!("pulling {short}"),
                "digest": digest,
                "total": total,
                "completed": completed,
            }));
        }
    }

    fn cancelled(&self) -> bool {
        self.tx.is_closed()
    }
}

pub(crate) async fn pull(State(s): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let r: PullRequest = parse_json(&body)?;
    let reference = r
        .model
        .or(r.name)
        .filter(|m| !m.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("model is required"))?;
    let store = store(&s)?;
    // A reference that cannot be read fails before any streaming starts.
    // Over HTTP, names only: a path would let a client probe the server's
    // disk, a URL make it fetch anything, unless the operator allows it.
    let reference = reference.trim();
    let mref = if s.inner.config.allow_any_pull {
        ModelRef::parse(reference)
    } else {
        ModelRef::parse_remote(reference)
    }
    .map_err(store_error)?;
    let opts = PullOptions {
        allow_unverified: r.insecure.unwrap_or(false),
        ..Default::default()
    };
    mref.check_verifiable(&opts).map_err(store_error)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let mut reporter = Reporter {
        tx: tx.clone(),
        last: None,
    };
    let task = tokio::task::spawn_blocking(move || {
        let result = store.pull_ref(&mref, &opts, &mut reporter);
        if let Err(e) = &result {
            let _ = tx.send(json!({ "error": e.to_string() }));
        }
        result
    });
    if r.stream == Some(false) {
        // Holding `rx` until the pull ends: a client that leaves drops this
        // future and with it `rx`, which cancels the pull.
        let result = task.await.map_err(|e| ApiError::internal(e.to_string()))?;
        drop(rx);
        return match result {
            Ok(_) => Ok(Json(json!({ "status": "success" })).into_response()),
            Err(e) => Err(store_error(e)),
        };
    }
    let lines = futures_util::stream::unfold(rx, |mut rx| async move {
        let mut line = rx.recv().await?.to_string();
        line.push('\n');
        Some((Ok::<_, Infallible>(Bytes::from(line)), rx))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

#[derive(Deserialize)]
struct DeleteRequest {
    model: Option<String>,
    name: Option<String>,
}

pub(crate) async fn delete(State(s): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let r: DeleteRequest = parse_json(&body)?;
    let name = r
        .model
        .or(r.name)
        .filter(|m| !m.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("model is required"))?;
    let store = store(&s)?;
    let n = name.trim().to_string();
    let removed = tokio::task::spawn_blocking(move || store.remove(&n))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    match removed {
        Ok(_) => {
            // No longer served by that name (requests in flight finish).
            s.forget(&name);
            Ok(StatusCode::OK.into_response())
        }
        Err(StoreError::NotStored(_)) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("model '{name}' not found"),
        )),
        Err(e) => Err(store_error(e)),
    }
}
