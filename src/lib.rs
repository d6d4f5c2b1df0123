//! The `m40-llm` package's shared front-end code: the interactive chat loop
//! used by `m40-llm run` and `cargo run --example chat`, and the client of a
//! running server that `run` and `ps` use.

pub mod chat;
pub mod client;
