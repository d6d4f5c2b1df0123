//! `m40-llm bench --batch 1,8,32 --engine`: batched decode through the
//! engine, as a server runs it (the scheduler, its step loops, sampling on
//! the host, a thread a request): B requests start together, each a prompt
//! of `--npp` random token ids and `--ntg` generated tokens (greedy, past
//! end-of-generation). T_PP: until every request has its first token;
//! T_TG: the rest; S_TG = B (TG - 1) / T_TG. What the backend-level table
//! (`bench_batch.rs`) cannot show: replicas (`--replicas`), a split's
//! steps in flight (`--steps-in-flight`), and the scheduler's own cost.
//!
//! Timing: one warm-up pass at the smallest B, then each B once.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Result};
use m40_gguf::synth::token_ids as random_tokens;
use m40_runtime::{BackendChoice, CancelToken, Engine, Prompt, Request, SamplingParams};

use super::bench_args::Args;

/// The engine `a` asks for, with room for the largest B.
fn engine(path: &Path, a: &Args) -> Result<Engine> {
    let most = a.batch.iter().max().copied().unwrap_or(1);
    let n_ctx = (a.npp + a.ntg + 1).next_multiple_of(m40_kernels::KV_PAGE);
    let mut o = a.placement_options();
    o.n_ctx = Some(n_ctx);
    if a.cpu {
        o.backend = BackendChoice::Cpu;
    }
    o.replicas = a.replicas;
    o.steps_in_flight = a.steps_in_flight;
    o.batch_invariant = a.batch_invariant;
    o.parallel = Some(most);
    // Every sequence's pages at once, on each replica.
    o.kv_tokens = Some(most * n_ctx);
    o.no_prefix_cache = true;
    Ok(Engine::from_path(path, o)?)
}

/// B requests at once: (T_PP, T_TG) in seconds.
fn run_batch(e: &Engine, b: usize, a: &Args) -> Result<(f64, f64)> {
    let n_vocab = e.hparams().n_vocab;
    let start = Instant::now();
    let firsts = std::thread::scope(|s| {
        let hs: Vec<_> = (0..b)
            .map(|i| {
                s.spawn(move || -> Result<f64> {
                    let mut req = Request::new(Prompt::Text(String::new()));
                    req.prefix = random_tokens(a.npp, n_vocab, 1 + i as u64);
                    req.max_tokens = Some(a.ntg);
                    req.ignore_eos = true;
                    req.sampling = SamplingParams::greedy();
                    let mut first = None;
                    let done = e.generate(&req, &CancelToken::new(), |_| {
                        first.get_or_insert_with(|| start.elapsed().as_secs_f64());
                    })?;
                    if done.token_ids.len() != a.ntg {
                        bail!(
                            "a request made {} tokens of {}",
                            done.token_ids.len(),
                            a.ntg
                        );
                    }
                    first.ok_or_else(|| anyhow::anyhow!("a request made no token"))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("a request's thread"))
            .collect::<Result<Vec<f64>>>()
    })?;
    let t = start.elapsed().as_secs_f64();
    let t_pp = firsts.iter().copied().fold(0.0, f64::max);
    Ok((t_pp, t - t_pp))
}

pub fn run(path: &Path, label: &str, a: &Args) -> Result<()> {
    if a.batch.contains(&0) || a.npp == 0 || a.ntg < 2 {
        bail!("--batch sizes and --npp must be at least 1, --ntg at least 2");
    }
    eprintln!("loading {label} ...");
    let e = engine(path, a)?;
    if let Some(p) = e.placement() {
        eprint!("{p}");
    }
    let l = e.activity();
    let smallest = a.batch.iter().min().copied().unwrap_or(1);
    run_batch(&e, smallest, a)?;
    println!(
        "{label} on {} through the engine ({} replica(s), {} step(s) in flight each, {} sequences at once)",
        e.backend_name(),
        l.replicas,
        l.steps_in_flight,
        l.parallel
    );
    println!("|    PP |     TG |    B |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |");
    println!("|-------|--------|------|----------|----------|----------|----------|");
    for &b in &a.batch {
        let (t_pp, t_tg) = run_batch(&e, b, a)?;
        println!(
            "| {:5} | {:6} | {:4} | {:8.3} | {:8.2} | {:8.3} | {:8.2} |",
            a.npp,
            a.ntg,
            b,
            t_pp,
            (b * a.npp) as f64 / t_pp,
            t_tg,
            (b * (a.ntg - 1)) as f64 / t_tg
        );
    }
    Ok(())
}
