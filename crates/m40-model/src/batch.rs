//! Batched steps: one forward over several sequences at once, each with its
//! own cache and positions, logits (or the device's selection) only where
//! asked. The scheduler (m40-sched, through m40-runtime's engine) hands a
//! backend one such step at a time.

use crate::error::Result;
use crate::{Backend, Logits, Selection};

/// What one sequence of a step wants back for its last token.
#[derive(Clone, Debug, PartialEq)]
pub enum Want {
    /// Nothing (a prompt chunk that does not end the prompt).
    Nothing,
    /// The last token's logits (n_vocab).
    Logits,
    /// The backend's selection from the last token's logits
    /// ([`Backend::forward_select`]).
    Select(Selection),
    /// Every token's final hidden state ([`Logits::Hidden`]).
    Hidden,
}

/// One sequence's part of a step: `tokens` at positions `cache.len()..`.
pub struct SeqStep<'a, C> {
    pub cache: &'a mut C,
    pub tokens: &'a [u32],
    pub want: Want,
}

/// What one step of [`Backend::forward_batch`] takes at most
/// ([`Backend::step_limits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLimits {
    /// Tokens (rows), over all the step's sequences.
    pub tokens: usize,
    /// Sequences.
    pub seqs: usize,
}

/// What one sequence of a step gets back, as its [`Want`] asked.
#[derive(Clone, Debug, PartialEq)]
pub enum StepOut {
    Nothing,
    Logits(Vec<f32>),
    Top(Vec<(u32, f32)>),
    /// The step's tokens' final hidden states (n_tokens, n_embd).
    Hidden(Vec<f32>),
}

/// A step run as each sequence's own forward in turn: what a backend
/// without a batched forward does (no sequence's result depends on the
/// others', trivially).
pub fn forward_each<B: Backend + ?Sized>(
    backend: &B,
    seqs: &mut [SeqStep<'_, B::Cache>],
) -> Result<Vec<StepOut>> {
    seqs.iter_mut()
        .map(|s| {
            Ok(match &s.want {
                Want::Nothing => {
                    backend.forward(s.cache, s.tokens, Logits::None)?;
                    StepOut::Nothing
                }
                Want::Logits => {
                    StepOut::Logits(backend.forward(s.cache, s.tokens, Logits::Last)?)
                }
                Want::Select(sel) => StepOut::Top(backend.forward_select(s.cache, s.tokens, sel)?),
                Want::Hidden => {
                    StepOut::Hidden(backend.forward(s.cache, s.tokens, Logits::Hidden)?)
                }
            })
        })
        .collect()
}
