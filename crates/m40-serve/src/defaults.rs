//! A created model's instructions (its Modelfile's SYSTEM, MESSAGEs and
//! PARAMETERs; its TEMPLATE is the engine's, given at load) applied to each
//! request beneath what the request itself says, as Ollama applies them.

use std::str::FromStr;
use std::sync::Arc;

use m40_runtime::Message;
use m40_store::Modelfile;

/// A model's defaults (none for a model that was not created).
#[derive(Clone, Default)]
pub(crate) struct Defaults(pub(crate) Option<Arc<Modelfile>>);

impl Defaults {
    /// A parameter's value (checked when the model was created; one that
    /// does not parse, from a manifest edited by hand, is left out).
    pub(crate) fn get<T: FromStr>(&self, name: &str) -> Option<T> {
        let v = self.0.as_ref()?.parameter(name)?;
        let parsed = v.parse().ok();
        if parsed.is_none() {
            tracing::warn!("the model's PARAMETER {name} {v} is not a valid value; left out");
        }
        parsed
    }

    /// Its stop sequences, where the request gives none.
    pub(crate) fn stops(&self) -> Option<Vec<String>> {
        let s = self.0.as_ref()?.stops();
        (!s.is_empty()).then_some(s)
    }

    /// A chat with the model's MESSAGEs before the request's, and its
    /// SYSTEM first where the chat has no system message.
    pub(crate) fn chat(&self, messages: Vec<Message>) -> Vec<Message> {
        let Some(mf) = &self.0 else {
            return messages;
        };
        let mut out: Vec<Message> = (mf.messages.iter())
            .map(|(role, text)| Message::new(role.clone(), text.clone()))
            .collect();
        out.extend(messages);
        if let Some(system) = &mf.system {
            if !out.iter().any(|m| m.role == "system") {
                out.insert(0, Message::new("system", system.clone()));
            }
        }
        out
    }
}
