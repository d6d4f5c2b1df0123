//! `m40-llm perplexity MODEL TEXT`: llama-perplexity's figure by default.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use m40_model::cpu::{CpuBackend, CpuMath};
use m40_model::Model;
use m40_runtime::perplexity::{perplexity, Scoring};
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
    /// Which predictions count: `half` (llama-perplexity's protocol: the
    /// second half of each chunk, each chunk led by BOS where the model adds
    /// one) or `all` (every position, no BOS: the protocol of
    /// ../shared/testdata/smollm2's reference).
    #[arg(long, value_enum, default_value = "half")]
    pub score: Score,
    /// Multiply in exact FP32 (the reference) instead of rounding the
    /// inputs of Q4_0/Q4_1/Q8_0 matrices to 8 bits as llama.cpp's CPU
    /// backend (and `run`) does.
    #[arg(long)]
    pub cpu_exact: bool,
    /// How the KV cache stores K and V: f16, q8_0 or q4_0 (llama-perplexity's
    /// -ctk/-ctv; Ollama's OLLAMA_KV_CACHE_TYPE).
    #[arg(long, value_name = "TYPE", env = "M40_KV_CACHE_TYPE", default_value = "f16",
          value_parser = m40_runtime::KvFormat::parse)]
    pub kv_type: m40_runtime::KvFormat,
    /// Print one JSON object (ppl, ppl_err, mean_nll, n_chunks,
    /// scored_tokens, scoring, running, argmax).
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Score {
    Half,
    All,
}

pub fn run(a: Args) -> Result<()> {
    if a.ctx < 2 {
        bail!("--ctx must be at least 2");
    }
    let scoring = match a.score {
        Score::Half => Scoring::SecondHalf,
        Score::All => Scoring::All,
    };
    let path = super::resolve_model(Some(&a.model))?;
    let text = std::fs::read_to_string(&a.text)
        .with_context(|| format!("reading {}", a.text.display()))?;
    let model = Arc::new(Model::open(&path)?);
    if a.ctx > model.hparams().max_context() {
        eprintln!(
            "warning: --ctx {} is beyond the {} tokens the model was made for",
            a.ctx,
            model.hparams().max_context()
        );
    }
    let tok = Tokenizer::from_gguf(model.file())?;
    // llama-perplexity tokenizes with the model's BOS (and puts one at the
    // start of every chunk); the whole-chunk protocol uses the text alone.
    let adds_bos = tok.vocab().add_bos;
    let half = scoring == Scoring::SecondHalf;
    let tokens = tok.encode(
        &text,
        Encode {
            parse_special: false,
            add_special: half,
        },
    )?;
    if tokens.len() < scoring.min_tokens(a.ctx) {
        bail!(
            "the text has {} tokens, fewer than {} (with --ctx {} this protocol needs {}{})",
            tokens.len(),
            scoring.min_tokens(a.ctx),
            a.ctx,
            if half { "two chunks" } else { "one chunk" },
            if half {
                ", as llama-perplexity does; or use --score all"
            } else {
                ""
            }
        );
    }
    let bos = if half && adds_bos { tok.bos() } else { None };
    let math = if a.cpu_exact {
        CpuMath::Exact
    } else {
        CpuMath::Quantized
    };
    // KV pages for one chunk at a time.
    let backend = CpuBackend::within(model, math, a.ctx, a.kv_type, None)?;
    let start = Instant::now();
    if !a.json {
        eprintln!(
            "perplexity over {} chunks of {} tokens, scoring {} (CPU)",
            tokens.len() / a.ctx,
            a.ctx,
            if half {
                "the second half of each, as llama-perplexity does"
            } else {
                "every position"
            }
        );
    }
    let r = perplexity(&backend, &tokens, a.ctx, scoring, bos, |c, _, ppl| {
        if !a.json {
            // llama-perplexity's running figures.
            use std::io::Write;
            print!("[{c}]{ppl:.4},");
            let _ = std::io::stdout().flush();
        }
    })?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!();
        println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.ppl_err);
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "mean NLL {:.5} over {} tokens; {:.1} s, {:.0} tokens/s",
            r.mean_nll,
            r.scored_tokens,
            secs,
            (r.n_chunks * a.ctx) as f64 / secs
        );
    }
    Ok(())
}
