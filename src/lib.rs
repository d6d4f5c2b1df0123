//! The `m40-llm` package's shared front-end code: the interactive chat loop
//! used by `m40-llm run` and `cargo run --example chat`.

pub mod chat;
