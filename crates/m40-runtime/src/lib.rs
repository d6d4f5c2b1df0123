//! m40-runtime: the library users embed.
//!
//! ```no_run
//! use m40_runtime::{CancelToken, Engine, EngineOptions, Message, Prompt, Request};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A GGUF file; the m40-store crate turns a store name into one (fetched
//! // on first use).
//! let path = m40_store::Store::from_env()?.resolve("smollm2:135m", &mut |m: &str| eprintln!("{m}"))?;
//! let engine = Engine::from_path(&path, EngineOptions::default())?;
//! let mut req = Request::new(Prompt::Chat(vec![Message::new("user", "Name a color.")]));
//! req.sampling.temperature = 0.7;
//! req.sampling.seed = Some(1);
//! req.max_tokens = Some(32);
//! req.stop = vec!["\n\n".into()];
//! let done = engine.generate(&req, &CancelToken::new(), |token| print!("{}", token.text))?;
//! println!("\n{:?} after {} tokens, {:.1} tokens/s", done.finish_reason, done.token_ids.len(), done.timings.generation_tokens_per_s());
//! # Ok(())
//! # }
//! ```
//!
//! - [`Engine`]: load a GGUF model; [`Engine::start`] runs a request as a
//!   [`Generation`] (an iterator of its tokens, a `Stream` with the
//!   `stream` feature), with stop strings, logprobs, structured output,
//!   tools, cancellation and timings; [`Engine::embed`] for embeddings.
//! - [`SamplingParams`]: greedy, temperature, top-k/top-p/min-p, penalties, seeds.
//! - [`perplexity`]: llama.cpp's protocol.
//!
//! The model store (names, the catalog, `pull`) is the m40-store crate, so
//! that inference alone pulls in no HTTP client.
//!
//! Build the engine optimized even in your debug builds (the CPU backend is
//! about 100x slower unoptimized), in your `Cargo.toml`:
//! ```toml
//! [profile.dev.package."*"]
//! opt-level = 3
//! ```
//! The examples (`examples/01_generate.rs`, `02_chat_history.rs`,
//! `03_cancel.rs`) each show one thing.

pub use batcher::Load;
pub use cancel::CancelToken;
pub use embed::{EmbedInput, EmbedRequest, EmbedRun, Embeddings};
pub use engine::{
    BackendChoice, Engine, EngineOptions, KernelProgress, UploadProgress, DEFAULT_CONTEXT,
    DEFAULT_GPU_SEQUENCES, DEFAULT_SEQUENCES,
};
pub use error::{EngineError, Result};
pub use generation::Generation;
pub use info::ModelInfo;
pub use m40_chat::{Format, FormatError, Syntax, Thinking, Tool, ToolCall, ToolChoice, ToolError};
pub use m40_gguf::hparams::Pooling;
pub use m40_tokenizer::Message;
pub use pick::load_backend;
pub use prepared::Prepared;
pub use request::{Completion, FinishReason, Prompt, Request, Think, Timings, TokenEvent};
pub use sampling::{draw_selected, InvalidParam, SamplingParams, RANGES as SAMPLING_RANGES};

// The types this API hands out from the crates below it, so that a program
// needs only m40-runtime in its Cargo.toml.
pub use m40_device::DeviceError;
pub use m40_gguf::{GgufError, GgufFile, HyperParams};
pub use m40_model::cpu::CpuMath;
pub use m40_model::gpu::LoadProgress;
pub use m40_model::{KvFormat, MemoryUse, Model, ModelError};
pub use m40_tokenizer::template::CHATML as DEFAULT_CHAT_TEMPLATE;
pub use m40_tokenizer::{Encode, Tokenizer, TokenizerError};

mod batcher;
mod cancel;
mod chat;
mod embed;
mod engine;
mod error;
mod generation;
mod info;
mod options;
pub mod perplexity;
mod pick;
mod prepared;
mod request;
mod sampling;
mod stop;
