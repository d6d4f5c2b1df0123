//! Interactive chat with a model: `cargo run --release --example chat [MODEL]`.
//!
//! MODEL is a GGUF path or a store name; without one, the default model
//! (SmolLM2-135M-Instruct) is fetched on first use.

use anyhow::Result;
use m40_llm::chat::{run, ChatOptions};
use m40_runtime::{Engine, EngineOptions};

fn main() -> Result<()> {
    let model = std::env::args()
        .nth(1)
        .unwrap_or_else(|| m40_store::DEFAULT_MODEL.to_string());
    let path = m40_store::Store::from_env()?.resolve(&model, &mut |m: &str| eprintln!("{m}"))?;
    let engine = Engine::from_path(&path, EngineOptions::default())?;
    eprintln!(
        "{model}: {} layers, context {}",
        engine.hparams().n_layer,
        engine.n_ctx()
    );
    run(&engine, &ChatOptions::default())
}
