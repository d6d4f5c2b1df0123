//! `m40-llm bench --cpu`: the CPU backend's prompt and decode speed as
//! llama-bench's CPU build reports them (pp: a prompt of `-p` tokens from an
//! empty cache; tg: `-n` tokens decoded one at a time from an empty cache),
//! median of `-r` repetitions after one warm-up, on `-t` threads.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use m40_model::cpu::{CpuBackend, CpuMath};
use m40_model::{Backend, Logits, Model};
use serde_json::json;

use m40_gguf::synth::token_ids as random_tokens;

use super::bench_args::Args;

/// Median and range of `f`'s tokens/s over `reps` runs after a warm-up.
fn measure(
    reps: usize,
    tokens: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<(f64, f64, f64)> {
    f()?;
    let mut rates = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        f()?;
        rates.push(tokens as f64 / start.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    Ok((rates[rates.len() / 2], rates[0], rates[rates.len() - 1]))
}

pub fn run(path: &Path, label: &str, a: &Args) -> Result<()> {
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("starting the thread pool")?;
    let math = if a.cpu_exact {
        CpuMath::Exact
    } else {
        CpuMath::Quantized
    };
    let model = Arc::new(Model::open(path)?);
    // KV pages for one sequence of the longer test.
    let cpu = CpuBackend::within(model, math, a.n_prompt.max(a.n_gen), a.kv_type, None)?;
    let n_vocab = cpu.hparams().n_vocab;
    let math_name = match math {
        CpuMath::Quantized => "8-bit inputs",
        CpuMath::Exact => "exact",
    };
    if !a.json {
        println!(
            "{label}, CPU, {threads} threads, {math_name}, median of {} runs",
            a.reps.max(1)
        );
        println!("| test | t/s | min | max |");
        println!("|---|---|---|---|");
    }
    // Each row is printed as its test finishes.
    let mut rows = Vec::new();
    let mut row = |name: String, (med, lo, hi): (f64, f64, f64)| {
        if !a.json {
            use std::io::Write;
            println!("| {name} | {med:.1} | {lo:.1} | {hi:.1} |");
            let _ = std::io::stdout().flush();
        }
        rows.push((name, (med, lo, hi)));
    };
    pool.install(|| -> Result<()> {
        if a.n_prompt > 0 {
            let toks = random_tokens(a.n_prompt, n_vocab, 1);
            let r = measure(a.reps, a.n_prompt, || {
                let mut cache = cpu.new_cache(a.n_prompt)?;
                cpu.forward(&mut cache, &toks, Logits::Last)?;
                Ok(())
            })?;
            row(format!("pp{}", a.n_prompt), r);
        }
        if a.n_gen > 0 {
            let toks = random_tokens(a.n_gen, n_vocab, 2);
            let r = measure(a.reps, a.n_gen, || {
                let mut cache = cpu.new_cache(a.n_gen)?;
                for t in &toks {
                    cpu.forward(&mut cache, std::slice::from_ref(t), Logits::Last)?;
                }
                Ok(())
            })?;
            row(format!("tg{}", a.n_gen), r);
        }
        Ok(())
    })?;
    if a.json {
        let tests: Vec<_> = rows
            .iter()
            .map(|(name, (med, lo, hi))| json!({"test": name, "tokens_per_s": med, "min": lo, "max": hi}))
            .collect();
        println!(
            "{}",
            json!({"model": label, "backend": "cpu", "threads": threads, "math": math_name, "tests": tests})
        );
    }
    Ok(())
}
