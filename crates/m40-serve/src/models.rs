//! How the server describes a model to Ollama's clients (`/api/tags`,
//! `/api/ps`, `/api/show`), from [`ModelInfo`]: the server never opens a
//! GGUF file itself.

use m40_runtime::ModelInfo;
use m40_store::Modelfile;
use serde_json::{json, Value};

use crate::slot::Slot;

/// A model's `details`, as Ollama describes a model.
pub(crate) fn details(m: &ModelInfo) -> Value {
    let arch = &m.architecture;
    json!({"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
           "parameter_size": m.parameter_size(), "quantization_level": m.quantization})
}

/// The file's modification time (RFC 3339), or "" where unknown.
pub(crate) fn modified_at(m: &ModelInfo) -> String {
    m.modified
        .map(|t| chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339())
        .unwrap_or_default()
}

/// A model served here as `/api/tags` and `/api/ps` list it.
pub(crate) fn model_entry(slot: &Slot, model: &m40_runtime::Model) -> Value {
    let info = ModelInfo::of(model);
    json!({"name": slot.name, "model": slot.name,
           "modified_at": slot.loaded_at().to_rfc3339(),
           "size": info.file_size, "digest": "", "details": details(&info)})
}

/// `/api/show`'s answer: the file's description, and a created model's
/// instructions.
pub(crate) fn describe(m: &ModelInfo, modified_at: &str, mf: Option<&Modelfile>) -> Value {
    let arch = &m.architecture;
    let h = &m.hparams;
    let mut info = serde_json::Map::new();
    info.insert("general.architecture".into(), json!(arch));
    info.insert("general.parameter_count".into(), json!(m.n_params));
    for (k, v) in [
        ("block_count", h.n_layer),
        ("embedding_length", h.n_embd),
        ("attention.head_count", h.n_head),
        ("attention.head_count_kv", h.n_head_kv),
        ("feed_forward_length", h.n_ff),
        ("context_length", h.n_ctx_train),
    ] {
        info.insert(format!("{arch}.{k}"), json!(v));
    }
    info.insert("tokenizer.ggml.vocab_size".into(), json!(h.n_vocab));
    let mut v = json!({
        "modelfile": mf.map_or_else(|| format!("FROM {}\n", m.path.display()), Modelfile::to_text),
        "parameters": mf.map(Modelfile::parameters_text).unwrap_or_default(),
        // The chat template m40-llm renders (Jinja, as transformers and
        // llama.cpp use it; Ollama's own are Go templates).
        "template": m.chat_template,
        "details": details(m),
        "model_info": info,
        "capabilities": m.capabilities,
        "modified_at": modified_at,
    });
    if let Some(mf) = mf {
        if let Some(t) = &mf.template {
            v["template"] = json!(t);
        }
        if let Some(s) = &mf.system {
            v["system"] = json!(s);
        }
        if !mf.license.is_empty() {
            v["license"] = json!(mf.license.join("\n\n"));
        }
        if !mf.messages.is_empty() {
            v["messages"] = mf
                .messages
                .iter()
                .map(|(role, content)| json!({"role": role, "content": content}))
                .collect();
        }
    }
    v
}
