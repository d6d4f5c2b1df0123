//! m40-runtime: the library users embed.
//!
//! Today: the model store ([`store`]) and perplexity measurement
//! ([`perplexity`]); the engine, requests and sampling follow.

pub mod perplexity;
pub mod store;
