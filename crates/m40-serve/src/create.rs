//! Customised models over Ollama's API: `/api/create` (a Modelfile's text,
//! or its instructions as fields, over a stored model) and `/api/copy`. A
//! created model is a manifest in the store pointing at the same file; the
//! server applies its instructions (`defaults.rs`).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use m40_store::{same_model, Modelfile, StoreError};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{parse_json, ApiError, AppState};

#[derive(Deserialize)]
struct CreateRequest {
    model: Option<String>,
    /// Older clients say `name`.
    name: Option<String>,
    from: Option<String>,
    /// A Modelfile's text; the fields below override its instructions.
    modelfile: Option<String>,
    system: Option<String>,
    template: Option<String>,
    /// Parameter name to a value (an array of strings for `stop`).
    parameters: Option<serde_json::Map<String, Value>>,
    license: Option<Value>,
    messages: Option<Vec<CreateMessage>>,
    stream: Option<bool>,
    quantize: Option<String>,
    files: Option<Value>,
    adapters: Option<Value>,
}

#[derive(Deserialize)]
struct CreateMessage {
    role: String,
    content: String,
}

impl CreateRequest {
    /// The Modelfile it describes (400s name the mistake).
    fn modelfile(self) -> Result<Modelfile, ApiError> {
        let bad = |m: String| ApiError::bad_request(m);
        if let Some(q) = self.quantize {
            return Err(bad(format!(
                "quantize {q}: m40-llm does not quantize models here; pull the quantization you want (hf.co/OWNER/REPO:QUANT)"
            )));
        }
        if self.files.is_some() || self.adapters.is_some() {
            return Err(bad(
                "files and adapters: create a model FROM a stored one (pull it first); m40-llm has no blob upload or LoRA adapters".into(),
            ));
        }
        let mut m = match &self.modelfile {
            Some(text) => Modelfile::parse(text).map_err(|e| bad(e.to_string()))?,
            None => Modelfile::default(),
        };
        if let Some(from) = self.from {
            m.from = from;
        }
        if m.from.trim().is_empty() {
            return Err(bad("from is required (or a modelfile with FROM)".into()));
        }
        m.system = self.system.or(m.system);
        m.template = self.template.or(m.template);
        for (name, v) in self.parameters.unwrap_or_default() {
            if !m40_store::PARAMETERS.contains(&name.as_str()) {
                return Err(bad(format!(
                    "unknown parameter '{name}' (known: {})",
                    m40_store::PARAMETERS.join(", ")
                )));
            }
            m.parameters.retain(|(n, _)| *n != name);
            let values = match v {
                Value::Array(a) => a,
                v => vec![v],
            };
            for v in values {
                let text = match v {
                    Value::String(s) => s,
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    other => return Err(bad(format!("parameters.{name}: {other} is not a value"))),
                };
                m.parameters.push((name.clone(), text));
            }
        }
        match self.license {
            None => {}
            Some(Value::String(s)) => m.license = vec![s],
            Some(Value::Array(a)) => {
                m.license = a
                    .into_iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s),
                        other => Err(bad(format!("license: {other} is not a string"))),
                    })
                    .collect::<Result<_, _>>()?;
            }
            Some(other) => return Err(bad(format!("license: {other} is not a string"))),
        }
        if let Some(msgs) = self.messages {
            m.messages = Vec::with_capacity(msgs.len());
            for msg in msgs {
                if !matches!(msg.role.as_str(), "system" | "user" | "assistant") {
                    return Err(bad(format!(
                        "messages: role '{}' (system, user or assistant)",
                        msg.role
                    )));
                }
                m.messages.push((msg.role, msg.content));
            }
        }
        m.check_values().map_err(bad)?;
        Ok(m)
    }
}

/// `/api/create`: `{"status": "success"}` (as one NDJSON line when
/// streamed, Ollama's default).
pub(crate) async fn create(State(s): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let r: CreateRequest = parse_json(&body)?;
    let name = (r.model.clone().or(r.name.clone()))
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request("model is required"))?;
    let stream = r.stream.unwrap_or(true);
    let modelfile = r.modelfile()?;
    let store = crate::store_api::store(&s)?;
    // Over HTTP a FROM names a stored model: a path would let a client
    // probe the server's disk, unless the operator allows it.
    let stored = store
        .manifest(modelfile.from.trim())
        .ok()
        .flatten()
        .is_some();
    if !stored && !s.inner.config.allow_any_pull {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "model '{}' not found: create from a stored model (pull it first)",
                modelfile.from
            ),
        ));
    }
    let (n, mf) = (name.clone(), modelfile.clone());
    let created = tokio::task::spawn_blocking(move || store.create(&n, &mf))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(create_error)?;
    // A model served under this name takes its new instructions; a new
    // template needs a new engine, so an idle one is unloaded (the next
    // request loads it).
    if let Some(slot) = s.slots().iter().find(|sl| same_model(&sl.name, &name)) {
        let template_changed = slot.modelfile().and_then(|m| m.template.clone())
            != created.modelfile.as_ref().and_then(|m| m.template.clone());
        slot.set_modelfile(created.modelfile.clone());
        if template_changed {
            slot.unload_if_idle();
        }
    }
    tracing::info!("created {} from {}", created.name, modelfile.from);
    let done = json!({ "status": "success" });
    Ok(if stream {
        (
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            format!("{done}\n"),
        )
            .into_response()
    } else {
        Json(done).into_response()
    })
}

fn create_error(e: StoreError) -> ApiError {
    match e {
        StoreError::NotStored(m) => {
            ApiError::new(StatusCode::NOT_FOUND, format!("model '{m}' not found"))
        }
        e @ (StoreError::BadRef(..) | StoreError::NotGguf { .. }) => {
            ApiError::bad_request(e.to_string())
        }
        e => ApiError::internal(e.to_string()),
    }
}

#[derive(Deserialize)]
struct CopyRequest {
    source: Option<String>,
    destination: Option<String>,
}

/// `/api/copy`: 200 with no body, as Ollama answers.
pub(crate) async fn copy(State(s): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let r: CopyRequest = parse_json(&body)?;
    let field = |v: Option<String>, what: &str| {
        v.map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiError::bad_request(format!("{what} is required")))
    };
    let (src, dst) = (
        field(r.source, "source")?,
        field(r.destination, "destination")?,
    );
    let store = crate::store_api::store(&s)?;
    tokio::task::spawn_blocking(move || store.copy(&src, &dst))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(create_error)?;
    Ok(StatusCode::OK.into_response())
}
