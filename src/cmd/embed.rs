//! `m40-llm embed MODEL TEXT...`: each text's embedding, printed as JSON in
//! the shape of Ollama's `/api/embed` answer.

use std::io::{BufRead, IsTerminal};

use anyhow::{bail, Result};
use m40_runtime::{CancelToken, EmbedInput, EmbedRequest, Engine};

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF path or a store name: an embedding model (bert, nomic-bert,
    /// qwen3-embedding) or any chat model (mean of its final hidden states).
    pub model: String,
    /// The texts to embed; none: each line of stdin (when it is not a
    /// terminal) is one.
    pub texts: Vec<String>,
    /// Keep each vector's first N dimensions (normalized again).
    #[arg(long, value_name = "N")]
    pub dimensions: Option<usize>,
    /// Refuse a text longer than the model takes instead of cutting it.
    #[arg(long)]
    pub no_truncate: bool,
    /// Context length (default: the model's, at most 4096).
    #[arg(long, value_name = "N")]
    pub ctx: Option<usize>,
    #[command(flatten)]
    pub device: super::DeviceArgs,
}

pub fn run(a: Args) -> Result<()> {
    let mut texts = a.texts;
    if texts.is_empty() {
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            bail!("no text to embed: give texts as arguments, or lines on stdin");
        }
        for line in stdin.lock().lines() {
            texts.push(line?);
        }
        if texts.is_empty() {
            bail!("no text to embed: stdin was empty");
        }
    }
    let path = super::resolve_model(Some(&a.model))?;
    let engine = Engine::from_path(&path, a.device.engine_options(a.ctx))?;
    let req = EmbedRequest {
        inputs: texts.into_iter().map(EmbedInput::Text).collect(),
        truncate: !a.no_truncate,
        dimensions: a.dimensions,
        normalize: true,
    };
    let got = engine.embed(&req, &CancelToken::new())?;
    let out = serde_json::json!({
        "model": a.model,
        "embeddings": got.vectors,
        "total_duration": (got.total_ms * 1e6) as u64,
        "prompt_eval_count": got.prompt_tokens(),
    });
    println!("{out}");
    Ok(())
}
