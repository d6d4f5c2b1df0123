//! `m40-llm perplexity MODEL TEXT`: llama-perplexity's figure by default,
//! on the GPU when one is usable.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use m40_device::Device;
use m40_model::cpu::{CpuBackend, CpuMath};
use m40_model::gpu::{GpuBackend, GpuOptions};
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
    /// Force the CPU backend (the default is GPU 0 when one is usable,
    /// else the CPU).
    #[arg(long, conflicts_with = "gpu")]
    pub cpu: bool,
    /// Run on this GPU (CUDA ordinal) or fail.
    #[arg(long, value_name = "N")]
    pub gpu: Option<usize>,
    /// On the CPU: multiply in exact FP32 (the reference) instead of
    /// rounding the inputs of Q4_0/Q4_1/Q8_0 matrices to 8 bits as
    /// llama.cpp's CPU backend (and `run`) does (implies --cpu).
    #[arg(long, conflicts_with = "gpu")]
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

/// The backend a run scores on.
enum Either {
    Cpu(Box<CpuBackend>),
    Gpu(Box<GpuBackend>),
}

/// The GPU when one is usable (or asked for), else the CPU, with a KV pool
/// of one chunk in `a.kv_type` (f16 on a GPU that does not take it for
/// this model, with a warning).
fn pick(model: Arc<Model>, a: &Args) -> Result<Either> {
    let cpu = |model| -> Result<Either> {
        let math = match a.cpu_exact {
            true => CpuMath::Exact,
            false => CpuMath::Quantized,
        };
        Ok(Either::Cpu(Box::new(CpuBackend::within(
            model, math, a.ctx, a.kv_type, None,
        )?)))
    };
    if a.cpu || a.cpu_exact {
        return cpu(model);
    }
    let device = match Device::open(a.gpu.unwrap_or(0)) {
        Ok(d) => d,
        Err(e) if a.gpu.is_none() => {
            eprintln!("no usable GPU ({e}): scoring on the CPU");
            return cpu(model);
        }
        Err(e) => return Err(e).context("opening the GPU"),
    };
    let mut kv_format = a.kv_type;
    if !GpuBackend::takes_kv_format(model.hparams(), kv_format) {
        eprintln!(
            "warning: a {} KV cache on the GPU takes head sizes that are multiples of 64: f16 instead",
            kv_format.name()
        );
        kv_format = m40_runtime::KvFormat::F16;
    }
    let opts = GpuOptions {
        kv_tokens: a.ctx,
        kv_format,
        ..Default::default()
    };
    Ok(Either::Gpu(Box::new(GpuBackend::new(device, model, opts)?)))
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
    // KV pages for one chunk at a time.
    let backend = pick(model, &a)?;
    let start = Instant::now();
    if !a.json {
        eprintln!(
            "perplexity over {} chunks of {} tokens, scoring {} ({})",
            tokens.len() / a.ctx,
            a.ctx,
            if half {
                "the second half of each, as llama-perplexity does"
            } else {
                "every position"
            },
            match &backend {
                Either::Cpu(_) => "CPU".to_string(),
                Either::Gpu(g) => format!("GPU {}", g.device().info().name),
            }
        );
    }
    let progress = |c: usize, _: usize, ppl: f64| {
        if !a.json {
            // llama-perplexity's running figures.
            use std::io::Write;
            print!("[{c}]{ppl:.4},");
            let _ = std::io::stdout().flush();
        }
    };
    let r = match &backend {
        Either::Cpu(b) => perplexity(b.as_ref(), &tokens, a.ctx, scoring, bos, progress)?,
        Either::Gpu(b) => perplexity(b.as_ref(), &tokens, a.ctx, scoring, bos, progress)?,
    };
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
