use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use m40_model::cpu::CpuBackend;
use m40_model::Model;
use m40_runtime::perplexity::perplexity;
use m40_tokenizer::{Encode, Tokenizer};

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF path or a store name.
    pub model: String,
    /// The text to score (UTF-8).
    pub text: PathBuf,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Print one JSON object (ppl, mean_nll, n_chunks, scored_tokens, argmax).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<()> {
    if a.ctx < 2 {
        bail!("--ctx must be at least 2");
    }
    let path = super::resolve_model(Some(&a.model))?;
    let text = std::fs::read_to_string(&a.text)
        .with_context(|| format!("reading {}", a.text.display()))?;
    let model = Arc::new(Model::open(&path)?);
    if a.ctx > model.hparams().n_ctx_train {
        eprintln!(
            "warning: --ctx {} is beyond the {} tokens the model was trained on",
            a.ctx,
            model.hparams().n_ctx_train
        );
    }
    let tok = Tokenizer::from_gguf(model.file())?;
    let tokens = tok.encode(
        &text,
        Encode {
            parse_special: false,
            add_special: false,
        },
    )?;
    if tokens.len() < a.ctx {
        bail!(
            "the text has {} tokens, fewer than one chunk of {}",
            tokens.len(),
            a.ctx
        );
    }
    let backend = CpuBackend::new(model)?;
    let start = Instant::now();
    let r = perplexity(&backend, &tokens, a.ctx, |c, n, ppl| {
        if !a.json {
            eprintln!(
                "[{c}/{n}] ppl {ppl:.4} ({:.1} s)",
                start.elapsed().as_secs_f64()
            );
        }
    })?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        let secs = start.elapsed().as_secs_f64();
        println!(
            "ppl = {:.4}, mean NLL = {:.5} over {} tokens in {} chunks of {}",
            r.ppl, r.mean_nll, r.scored_tokens, r.n_chunks, a.ctx
        );
        eprintln!(
            "{:.1} s, {:.0} tokens/s",
            secs,
            (r.n_chunks * a.ctx) as f64 / secs
        );
    }
    Ok(())
}
