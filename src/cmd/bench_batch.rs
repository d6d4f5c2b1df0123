//! `m40-llm bench --batch 1,4,16,32,64`: llama-batched-bench's table for a
//! model or a random-weight shape (prompts not shared): B sequences each
//! prefill `--npp` tokens (T_PP: until every sequence's first logits), then
//! decode `--ntg` tokens together, one batched step per token (T_TG: the
//! backend's `forward_batch`, each sequence's greedy choice back on the
//! host each step: selected on the GPU, from the logits on the CPU). N_KV = B (PP + TG). With `llama-batched-bench` on PATH it runs
//! the same file there and prints its S_TG beside ours.
//!
//! With `--json-schema FILE` every sequence is constrained by the schema
//! as a structured output is in the engine: its mask computed on another
//! thread while the step runs, applied in the selection (the GPU's
//! selection kernel, or the logits on the CPU), the chosen token accepted;
//! a sequence whose document is complete starts a new one.
//!
//! Timing: one warm-up pass at the smallest B, then each B once (as
//! llama-batched-bench); host clocks around calls that return after the
//! device is done.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use m40_chat::{Constraint, Format, Grammars};
use m40_model::cpu::{CpuBackend, CpuMath};
use m40_model::gpu::{GpuBackend, GpuOptions};
use m40_model::{apply_mask, Backend, Logits, MaskSlot, Model, Selection, SeqStep, StepOut, Want};
use serde_json::json;

use m40_gguf::synth::token_ids as random_tokens;

use super::bench_args::Args;

/// One row of the table.
struct Row {
    b: usize,
    t_pp: f64,
    t_tg: f64,
    /// Bytes a decode step read (weights and KV; a mixture's distinct
    /// experts as counted on the device), where known (the GPU).
    step_bytes: Option<f64>,
}

/// A mixture's experts read so far per layer (`GpuBackend::experts_read`),
/// or None.
type ExpertsRead<'a> = &'a dyn Fn() -> Result<Option<Vec<u64>>>;

/// B sequences: prompts of `npp`, then `ntg` batched decode steps, each
/// constrained by `schema`'s grammar where given; (T_PP, T_TG) in seconds,
/// and the experts `seen` counted over the decode steps, per layer (where
/// `seen` is given and counted them).
fn run_batch<B: Backend>(
    be: &B,
    b: usize,
    npp: usize,
    ntg: usize,
    schema: Option<&Schema>,
    seen: Option<ExpertsRead<'_>>,
) -> Result<(f64, f64, Option<Vec<u64>>)> {
    let count = || Ok::<_, anyhow::Error>(seen.map(|f| f()).transpose()?.flatten());
    let n_vocab = be.hparams().n_vocab;
    let mut caches = (0..b)
        .map(|_| be.new_cache(npp + ntg + 1))
        .collect::<m40_model::Result<Vec<_>>>()?;
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|s| random_tokens(npp, n_vocab, 1 + s as u64))
        .collect();
    let mut constraints: Vec<Constraint> = match schema {
        Some(s) => (0..b).map(|_| s.fresh()).collect::<Result<_>>()?,
        None => Vec::new(),
    };
    let t0 = Instant::now();
    for (c, p) in caches.iter_mut().zip(&prompts) {
        be.forward(c, p, Logits::Last)?;
    }
    let t_pp = t0.elapsed().as_secs_f64();
    let toks: Vec<[u32; 1]> = (0..b)
        .map(|s| [(s * 7 + 1) as u32 % n_vocab as u32])
        .collect();
    // What the engine asks for a greedy request: the argmax where the
    // backend selects (the GPU), else the logits.
    let selects = be.select_max_k() > 0;
    let before = count()?;
    let t1 = Instant::now();
    for _ in 0..ntg {
        let slots: Vec<MaskSlot> = constraints.iter().map(|_| MaskSlot::new()).collect();
        let want = |i: usize| match (selects, slots.get(i)) {
            (false, _) => Want::Logits,
            (true, slot) => Want::Select(Selection {
                mask: slot.cloned(),
                ..Selection::greedy()
            }),
        };
        let mut steps: Vec<SeqStep<'_, B::Cache>> = caches
            .iter_mut()
            .zip(&toks)
            .enumerate()
            .map(|(i, (cache, t))| SeqStep {
                cache,
                tokens: t,
                want: want(i),
            })
            .collect();
        let fillers: Vec<_> = slots.iter().map(MaskSlot::filler).collect();
        let cons = &mut constraints;
        let outs = std::thread::scope(|scope| {
            if !cons.is_empty() {
                scope.spawn(move || {
                    for (c, f) in cons.iter_mut().zip(fillers) {
                        f.fill(
                            c.mask()
                                .map(|m| Arc::new(m.into_words()))
                                .map_err(|e| e.to_string()),
                        );
                    }
                });
            }
            be.forward_batch(&mut steps)
        })?;
        for (i, out) in outs.into_iter().enumerate() {
            let Some(c) = constraints.get_mut(i) else {
                break;
            };
            let mask = slots[i].wait().map_err(anyhow::Error::msg)?;
            let tok = match out {
                StepOut::Top(top) => top[0].0,
                StepOut::Logits(mut l) => {
                    apply_mask(&mask, &mut l);
                    m40_model::argmax(&l)
                }
                StepOut::Nothing | StepOut::Hidden(_) => bail!("a decode step returned no logits"),
            };
            // A token the mask did not allow fails to be accepted.
            let complete = schema.is_some_and(|s| s.eog.contains(&tok))
                || c.accept(tok).is_err()
                || c.is_done();
            if complete {
                *c = schema.expect("constrained").fresh()?;
            }
        }
    }
    let t_tg = t1.elapsed().as_secs_f64();
    let read = match (before, count()?) {
        (Some(a), Some(z)) => Some(z.iter().zip(&a).map(|(z, a)| z - a).collect()),
        _ => None,
    };
    Ok((t_pp, t_tg, read))
}

/// Bytes a decode step of `b` sequences at mean context `ctx` read: every
/// weight once (a mixture's experts: `n_expert_used` a layer at B = 1,
/// else the distinct experts the device counted over `steps` steps; None
/// where it did not count them) and each sequence's K and V (FP16 bytes,
/// as `bench`'s tg test counts them).
fn step_bytes(
    model: &Model,
    b: usize,
    ctx: f64,
    steps: usize,
    seen: Option<&[u64]>,
) -> Option<f64> {
    let hp = model.hparams();
    let per_expert = super::ceilings::expert_bytes(model);
    let used = hp.moe.map_or(0, |m| m.n_expert_used) as u64;
    let dense = super::ceilings::decode_weight_bytes(model) - used * per_expert.iter().sum::<u64>();
    let experts: f64 = match (b, seen) {
        _ if used == 0 => 0.0,
        (1, _) => (used * per_expert.iter().sum::<u64>()) as f64,
        (_, None) => return None,
        (_, Some(seen)) => per_expert
            .iter()
            .zip(seen)
            .map(|(&e, &n)| e as f64 * n as f64 / steps as f64)
            .sum(),
    };
    let kv = hp.n_layer as f64 * ctx * (hp.n_head_kv * hp.head_dim) as f64 * 4.0;
    Some(dense as f64 + experts + b as f64 * kv)
}

/// A JSON schema compiled for the model's vocabulary: a fresh constraint
/// per document.
struct Schema {
    grammars: Grammars,
    format: Format,
    eog: Vec<u32>,
}

impl Schema {
    fn fresh(&self) -> Result<Constraint> {
        Ok(self.grammars.compile(&self.format)?)
    }
}

fn table<B: Backend>(
    be: &B,
    model: &Model,
    a: &Args,
    schema: Option<&Schema>,
    seen: Option<ExpertsRead<'_>>,
) -> Result<Vec<Row>> {
    let (npp, ntg) = (a.npp, a.ntg);
    // Warm-up: kernels loaded and compiled, graphs captured.
    run_batch(be, a.batch[0], npp.min(32), ntg.min(8), schema, seen)?;
    let mut rows = Vec::new();
    for &b in &a.batch {
        let (t_pp, t_tg, read) = run_batch(be, b, npp, ntg, schema, seen)?;
        let ctx = npp as f64 + (ntg as f64 + 1.0) / 2.0;
        let step_bytes = seen.and_then(|_| step_bytes(model, b, ctx, ntg, read.as_deref()));
        rows.push(Row {
            b,
            t_pp,
            t_tg,
            step_bytes,
        });
    }
    Ok(rows)
}

pub fn run(path: &Path, label: &str, a: &Args) -> Result<()> {
    if a.batch.contains(&0) || a.npp == 0 || a.ntg == 0 {
        bail!("--batch sizes, --npp and --ntg must be at least 1");
    }
    let model = Arc::new(Model::open(path)?);
    let schema = match &a.json_schema {
        None => None,
        Some(f) => {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", f.display()))?;
            let tok = m40_tokenizer::Tokenizer::from_gguf(model.file())?;
            let s = Schema {
                grammars: Grammars::new(&tok)?,
                format: Format::JsonSchema(v),
                eog: tok.eog_ids().collect(),
            };
            s.fresh()?;
            Some(s)
        }
    };
    let most = a.batch.iter().max().copied().unwrap_or(1);
    let kv_tokens = most * (a.npp + a.ntg + 1).next_multiple_of(m40_kernels::KV_PAGE);
    let (device, rows, read_gbps) = if a.cpu {
        let math = if a.cpu_exact {
            CpuMath::Exact
        } else {
            CpuMath::Quantized
        };
        let cpu = CpuBackend::within(model.clone(), math, kv_tokens, a.kv_type, None)?;
        let rows = table(&cpu, &model, a, schema.as_ref(), None)?;
        ("CPU".to_string(), rows, None)
    } else {
        let dev = m40_device::Device::open(a.gpu).context("opening the GPU (or use --cpu)")?;
        let name = dev.info().name.clone();
        eprintln!("measuring the read ceiling of {name} ...");
        let read_gbps = super::ceilings::ceilings(&dev)?.read_gbps;
        eprintln!("loading {label} ...");
        let g = GpuBackend::new(
            dev,
            model.clone(),
            GpuOptions {
                kv_tokens,
                batch_decode: !a.batch_invariant,
                group_experts: !a.no_group_experts,
                fold_moe_norm: a.fold_moe_norm,
                kv_format: a.kv_type,
                ..Default::default()
            },
        )?;
        let seen = || Ok(g.experts_read()?);
        let rows = table(&g, &model, a, schema.as_ref(), Some(&seen))?;
        (name, rows, Some(read_gbps))
    };
    // A decode step's bytes per second against the read ceiling.
    let share = |r: &Row| -> Option<(f64, f64)> {
        let bytes = r.step_bytes?;
        Some((
            bytes / 1e9,
            bytes * a.ntg as f64 / r.t_tg / 1e9 / read_gbps?,
        ))
    };
    let theirs = match a.no_llama_bench || a.cpu {
        true => None,
        false => llama_batched_bench(path, a, kv_tokens),
    };
    let mode = match (a.batch_invariant, &a.json_schema) {
        (true, _) => "batch-invariant (each sequence's own decode step)".to_string(),
        (false, None) => "batched decode".to_string(),
        (false, Some(f)) => format!(
            "batched decode, every sequence constrained by {}",
            f.display()
        ),
    };
    if a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                let n_kv = r.b * (a.npp + a.ntg);
                json!({"pp": a.npp, "tg": a.ntg, "b": r.b, "n_kv": n_kv,
                       "t_pp": r.t_pp, "s_pp": (r.b * a.npp) as f64 / r.t_pp,
                       "t_tg": r.t_tg, "s_tg": (r.b * a.ntg) as f64 / r.t_tg,
                       "gb_per_step": share(r).map(|s| s.0),
                       "share_of_read": share(r).map(|s| s.1),
                       "llama_cpp_s_tg": theirs.as_ref().and_then(|t| find(t, r.b))})
            })
            .collect();
        println!(
            "{}",
            json!({"model": label, "device": device, "mode": mode,
                   "read_gbps": read_gbps, "rows": v})
        );
        return Ok(());
    }
    println!("{label} on {device}, {mode}");
    if let Some(r) = read_gbps {
        println!("read ceiling {r:.0} GB/s; GB/step: the weights and KV a decode step reads (a mixture's distinct experts, counted on the device)");
    }
    println!(
        "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s | GB/step | read share | llama.cpp S_TG |"
    );
    println!(
        "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|---------|------------|----------------|"
    );
    for r in &rows {
        let n_kv = r.b * (a.npp + a.ntg);
        let t = r.t_pp + r.t_tg;
        let lc = theirs
            .as_ref()
            .and_then(|t| find(t, r.b))
            .map_or("".to_string(), |s| format!("{s:.2}"));
        let (gb, sh) = share(r).map_or((String::new(), String::new()), |(gb, sh)| {
            (format!("{gb:.3}"), format!("{:.1}%", 100.0 * sh))
        });
        println!(
            "| {:5} | {:6} | {:4} | {:6} | {:8.3} | {:8.2} | {:8.3} | {:8.2} | {:8.3} | {:8.2} | {:>7} | {:>10} | {:>14} |",
            a.npp,
            a.ntg,
            r.b,
            n_kv,
            r.t_pp,
            (r.b * a.npp) as f64 / r.t_pp,
            r.t_tg,
            (r.b * a.ntg) as f64 / r.t_tg,
            t,
            n_kv as f64 / t,
            gb,
            sh,
            lc
        );
    }
    Ok(())
}

/// llama-batched-bench's S_TG for batch `b`.
fn find(rows: &[(usize, f64)], b: usize) -> Option<f64> {
    rows.iter().find(|(n, _)| *n == b).map(|(_, s)| *s)
}

/// llama-batched-bench's (B, S_TG) rows for the same test, if it is on PATH
/// and runs (all layers on the GPU, flash attention).
fn llama_batched_bench(path: &Path, a: &Args, ctx: usize) -> Option<Vec<(usize, f64)>> {
    let npl: Vec<String> = a.batch.iter().map(usize::to_string).collect();
    let out = Command::new("llama-batched-bench")
        .arg("-m")
        .arg(path)
        .args([
            "-c",
            &ctx.to_string(),
            "-b",
            "2048",
            "-ub",
            "512",
            "-ngl",
            "99",
            "-fa",
            "1",
        ])
        .args(["-npp", &a.npp.to_string(), "-ntg", &a.ntg.to_string()])
        .args(["-npl", &npl.join(",")])
        .args(a.llama_kv_args())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("llama-batched-bench failed ({})", out.status);
        return None;
    }
    let rows = parse_table(&String::from_utf8_lossy(&out.stdout));
    if rows.is_empty() {
        eprintln!("llama-batched-bench printed no table this bench could read");
        return None;
    }
    Some(rows)
}

/// (B, S_TG) from llama-batched-bench's markdown table (columns PP, TG, B,
/// N_KV, T_PP, S_PP, T_TG, S_TG, T, S).
fn parse_table(text: &str) -> Vec<(usize, f64)> {
    text.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            if cells.len() < 10 {
                return None;
            }
            Some((cells[2].parse().ok()?, cells[7].parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_batched_bench_tables_are_read() {
        let text = "\
main: n_kv_max = 16384
|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   128 |    128 |    1 |    256 |    0.108 |  1186.64 |    3.079 |    41.57 |    3.187 |    80.32 |
|   128 |    128 |   16 |   4096 |    1.570 |  1304.68 |    8.455 |   242.23 |   10.024 |   408.60 |
";
        assert_eq!(parse_table(text), vec![(1, 41.57), (16, 242.23)]);
    }
}
