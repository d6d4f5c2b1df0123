//! What a request asks for and what it gets back.

use m40_chat::{Format, Tool, ToolCall, ToolChoice};
use m40_tokenizer::Message;
use serde::Serialize;

use crate::sampling::SamplingParams;

/// What to generate from.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Raw text, tokenized as is (BOS added if the model asks for it).
    Text(String),
    /// A conversation, rendered with the chat template.
    Chat(Vec<Message>),
    /// Fill in the middle between `prefix` and `suffix` (code models with
    /// FIM tokens; [`crate::EngineError::NoInfill`] otherwise).
    Infill { prefix: String, suffix: String },
}

/// Tokens a context shift keeps from the start ([`Request::shift`]; Ollama's
/// `num_keep` default).
pub const SHIFT_KEEP: usize = 4;
/// A shifting request without `max_tokens` makes at most this many
/// contexts of new tokens (Ollama's is unbounded).
pub const SHIFT_MAX_CONTEXTS: usize = 4;

/// One generation request.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Request {
    pub prompt: Prompt,
    pub sampling: SamplingParams,
    /// At most this many new tokens (default: what the context leaves).
    pub max_tokens: Option<usize>,
    /// Stop before any of these strings; they are never emitted.
    pub stop: Vec<String>,
    /// Return the chosen token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
    /// Added to these tokens' logits before sampling (OpenAI's
    /// `logit_bias`: -100 bans a token, 100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// Drop the prompt's start instead of failing when it does not fit.
    pub truncate_prompt: bool,
    /// A chat that does not fit loses its oldest turns after the system
    /// messages (each user message with the answers and tool results that
    /// follow it) until it fits with room to answer, as Ollama's `truncate`
    /// does; the last user message is always kept.
    pub drop_old_turns: bool,
    /// Token ids to put before the prompt's (Ollama's `context`: the ids a
    /// previous answer returned), which then gets no BOS of its own.
    pub prefix: Vec<u32>,
    /// A smaller context for this request than the engine's (Ollama's
    /// `num_ctx`); None, or more than the engine's: the engine's.
    pub context: Option<usize>,
    /// Lower `max_tokens` to the room the context leaves after the prompt
    /// instead of failing (generation then stops where the context ends,
    /// as Ollama's server does).
    pub fit_max_tokens: bool,
    /// When the answer fills the context, keep going (Ollama's `shift`,
    /// its default): the first [`SHIFT_KEEP`] tokens are kept, the older
    /// half of the rest dropped, and the sequence computed again from what
    /// is left; `max_tokens` may then pass the context (default:
    /// [`SHIFT_MAX_CONTEXTS`] contexts' worth). Off, generation stops
    /// where the context ends.
    pub shift: bool,
    /// Generate past end-of-generation tokens, to `max_tokens` or the end
    /// of the context (vLLM's and llama.cpp's `ignore_eos`: requests of a
    /// fixed length, for benchmarks). Stop strings still stop.
    pub ignore_eos: bool,
    /// A structured output: every token is sampled from those that keep
    /// the answer inside this format (JSON, a JSON schema, a grammar), and
    /// the answer ends when the format is complete
    /// ([`FinishReason::Stop`]; cut short by `max_tokens` it is
    /// [`FinishReason::Length`], and incomplete).
    pub format: Option<Format>,
    /// Functions the model may call (chat prompts only): shown to it
    /// through its chat template, its calls parsed from its own syntax
    /// into [`Completion::tool_calls`] and [`TokenEvent::tool_calls`].
    pub tools: Vec<Tool>,
    /// Whether it must call: `Required` and `Function` constrain the
    /// answer to calls whose arguments are valid under their schemas.
    pub tool_choice: ToolChoice,
    /// Several calls in one answer where the model's syntax allows them
    /// (default true).
    pub parallel_tool_calls: bool,
    /// Thinking on or off, or how hard (models that think; see [`Think`]).
    /// None: the model's default.
    pub think: Option<Think>,
    /// More variables for the chat template (vLLM's and llama.cpp's
    /// `chat_template_kwargs`), over those `think` sets.
    pub template_vars: serde_json::Map<String, serde_json::Value>,
}

/// What a request asks of a model's reasoning (Ollama's `think`, OpenAI's
/// `reasoning_effort`). On or an effort asked of a model that does not
/// think is an error; off is passed to the template (`enable_thinking`:
/// Qwen3) and any reasoning the model writes anyway is dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Think {
    Off,
    On,
    /// "low", "medium", "high": the template's `reasoning_effort` (gpt-oss).
    Effort(String),
}

impl Request {
    pub fn new(prompt: Prompt) -> Self {
        Self {
            prompt,
            sampling: SamplingParams::default(),
            max_tokens: None,
            stop: Vec::new(),
            logprobs: None,
            logit_bias: Vec::new(),
            truncate_prompt: false,
            drop_old_turns: false,
            prefix: Vec::new(),
            context: None,
            fit_max_tokens: false,
            shift: false,
            ignore_eos: false,
            format: None,
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            think: None,
            template_vars: serde_json::Map::new(),
        }
    }
}

/// Why generation ended (more reasons may come: match with a wildcard).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// max_tokens or the context ran out.
    Length,
    Cancelled,
}

impl FinishReason {
    /// Its name, as Ollama's `done_reason` gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// One generated token as it streams.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct TokenEvent {
    pub id: u32,
    /// Answer text that became final with this token (may be empty, or
    /// several tokens' worth when a stop-string prefix, a split character
    /// or a possible marker was held).
    pub text: String,
    /// Reasoning text that became final (models that think).
    pub thinking: String,
    /// Calls that became whole with this token.
    pub tool_calls: Vec<ToolCall>,
    pub logprob: Option<f32>,
    /// (id, piece, logprob), most likely first.
    pub top_logprobs: Vec<(u32, String, f32)>,
}

/// Timings of one request.
#[derive(Clone, Debug, Default, Serialize)]
#[non_exhaustive]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt_ms: f64,
    pub generated_tokens: usize,
    pub generation_ms: f64,
    pub time_to_first_token_ms: f64,
}

impl Timings {
    pub fn prompt_tokens_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / (self.prompt_ms / 1e3).max(1e-9)
    }
    pub fn generation_tokens_per_s(&self) -> f64 {
        self.generated_tokens as f64 / (self.generation_ms / 1e3).max(1e-9)
    }
}

/// The outcome of a request.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct Completion {
    /// The answer (without thinking and calls).
    pub text: String,
    /// The model's reasoning, where it thinks in a format it marks.
    pub thinking: String,
    /// The functions it called.
    pub tool_calls: Vec<ToolCall>,
    pub token_ids: Vec<u32>,
    /// The end-of-generation token that ended it, if one did (not in
    /// `token_ids`; a conversation continued from ids needs it).
    pub end_token: Option<u32>,
    pub finish_reason: FinishReason,
    pub timings: Timings,
}
