//! m40-runtime: the library users embed.
//!
//! - [`engine::Engine`]: load a model (path or store name), generate with
//!   streaming tokens, stop strings, logprobs, cancellation and timings.
//! - [`sampling`]: greedy, temperature, top-k/top-p/min-p, penalties, seeds.
//! - [`store`]: the model store; [`perplexity`]: llama.cpp's protocol.

pub use engine::{
    BackendChoice, CancelToken, Completion, Engine, EngineError, EngineOptions, FinishReason,
    Prompt, Request, TokenEvent,
};
pub use m40_tokenizer::Message;
pub use sampling::SamplingParams;

pub mod engine;
pub mod perplexity;
pub mod sampling;
pub mod store;
