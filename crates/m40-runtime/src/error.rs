//! The one error type of the library.

use std::sync::Arc;

use m40_model::ModelError;

use crate::chat::RenderError;

/// Errors from loading a model or running a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] m40_model::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] m40_tokenizer::TokenizerError),
    #[error("the prompt ({prompt} tokens) plus max_tokens ({max_tokens}) exceeds the context of {n_ctx} tokens; shorten the prompt, lower max_tokens, or allow truncation")]
    ContextOverflow {
        prompt: usize,
        max_tokens: usize,
        n_ctx: usize,
    },
    #[error("a context of {asked} tokens is more than the {max} this model was made for; use {max} or less (0 means {max})")]
    ContextTooLong { asked: usize, max: usize },
    #[error(transparent)]
    InvalidParam(#[from] crate::sampling::InvalidParam),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt is {prompt} tokens but the context holds {n_ctx} (room is needed for at least one generated token)")]
    PromptTooLong { prompt: usize, n_ctx: usize },
    #[error("the model fits neither the GPU nor the CPU: {gpu}; and on the CPU, {cpu}")]
    NoRoom {
        gpu: Box<ModelError>,
        cpu: Box<ModelError>,
    },
    #[error("no usable GPU ({0}); run on the CPU instead (--cpu)")]
    NoGpu(m40_device::DeviceError),
    #[error("the step running this request failed: {0}")]
    Step(Arc<ModelError>),
    #[error("the engine was dropped while the request ran")]
    Stopped,
    #[error("the engine's step loop could not start: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    Format(#[from] m40_chat::FormatError),
    #[error("this model has no fill-in-the-middle tokens, so it cannot complete between a prompt and a suffix; leave out suffix")]
    NoInfill,
    #[error("this model does not think: its chat template marks no reasoning (leave out think or reasoning_effort, or set it to false/none)")]
    NoThinking,
    #[error("this is an embedding model ({0}): it cannot generate text; ask it for embeddings (/api/embed, /v1/embeddings, m40-llm embed)")]
    EmbeddingOnly(&'static str),
    #[error("input {index} is {tokens} tokens; this model embeds at most {max} at once (allow truncation to cut it)")]
    InputTooLong {
        index: usize,
        tokens: usize,
        max: usize,
    },
    #[error("dimensions {asked}: this model's embeddings have {max}; ask for 1 to {max}")]
    BadDimensions { asked: usize, max: usize },
    #[error("this model cannot give embeddings: {0}")]
    NoEmbeddings(&'static str),
    #[error("the request was cancelled")]
    Cancelled,
}

impl From<RenderError> for EngineError {
    fn from(e: RenderError) -> Self {
        match e {
            RenderError::Template(e) => Self::Tokenizer(e),
            RenderError::Format(e) => Self::Format(e),
            RenderError::NoThinking => Self::NoThinking,
        }
    }
}

impl EngineError {
    /// Whether loading failed for lack of memory (GPU or host): a load
    /// that may fit once something else is unloaded.
    pub fn is_out_of_memory(&self) -> bool {
        use m40_model::ModelError as M;
        let oom = |m: &M| {
            matches!(
                m,
                M::GpuMemory { .. }
                    | M::HostMemory { .. }
                    | M::Device(m40_device::DeviceError::OutOfMemory { .. })
            )
        };
        match self {
            EngineError::Model(m) => oom(m),
            EngineError::NoRoom { .. } => true,
            _ => false,
        }
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
