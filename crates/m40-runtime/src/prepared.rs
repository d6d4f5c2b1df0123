//! A request checked and tokenized once ([`crate::Engine::prepare`]).

use m40_chat::Constraint;

use crate::chat::Plan;
use crate::request::Request;

/// A request tokenized and checked against the context, once: what
/// [`Engine::start`] runs. [`Engine::generate`] is [`Engine::prepare`] and
/// [`Engine::start`]; a server prepares first to refuse a request before
/// queueing it.
///
/// [`Engine::start`]: crate::Engine::start
/// [`Engine::generate`]: crate::Engine::generate
/// [`Engine::prepare`]: crate::Engine::prepare
#[derive(Clone, Debug)]
pub struct Prepared {
    pub(crate) request: Request,
    pub(crate) prompt: Vec<u32>,
    pub(crate) max_tokens: usize,
    /// The request's format (or forced tool calls), compiled.
    pub(crate) constraint: Option<Constraint>,
    /// How the answer is taken apart (thinking, calls).
    pub(crate) plan: Plan,
    /// Messages dropped from the start of the chat to fit the context.
    pub(crate) dropped: usize,
    /// The request's context (where a shifting answer shifts).
    pub(crate) n_ctx: usize,
}

impl Prepared {
    /// The prompt's token ids (after any truncation).
    pub fn prompt_tokens(&self) -> &[u32] {
        &self.prompt
    }

    /// The most new tokens the run may make.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    pub fn request(&self) -> &Request {
        &self.request
    }

    /// How many of the chat's oldest messages were left out to fit the
    /// context ([`Request::drop_old_turns`]).
    pub fn dropped_messages(&self) -> usize {
        self.dropped
    }
}
