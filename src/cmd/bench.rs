//! `m40-llm bench` (what `cargo xtask bench` runs): a llama-bench-like table
//! for a model file or a random-weight model of a known shape generated on
//! the spot: prompt processing (pp), token generation (tg) from an empty
//! context and at a depth, each as tokens/s and as a share of the ceiling
//! measured in the same run: read bandwidth for decode (the bytes a token
//! must read: every weight once plus the KV cache), the FP32 FMA rate for
//! prefill (2 FLOPs per weight and token, plus attention). With
//! `llama-bench` on PATH it runs the same file there and prints both.
//!
//! Timing: every test runs once to warm up, then `--reps` times; the median
//! counts. A forward pass returns after the device is done (logits are on
//! the host), so host clocks around it measure the device work.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use m40_device::Device;
use m40_gguf::synth::{token_ids as random_tokens, write_model, FileType, Shape, SynthOptions};
use m40_gguf::HyperParams;
use m40_model::gpu::{GpuBackend, GpuOptions};
use m40_model::{AnyBackend, Backend, KvState, Logits, Model, Selection};
use serde_json::{json, Value};

pub use super::bench_args::Args;
use super::ceilings::{ceilings, decode_weight_bytes, median, Ceilings};

/// Matmul weights (elements) a token multiplies, including the output head.
fn matmul_params(hp: &HyperParams) -> f64 {
    let (d, q, kv, ff) = (
        hp.n_embd as f64,
        (hp.n_head * hp.head_dim) as f64,
        (hp.n_head_kv * hp.head_dim) as f64,
        hp.n_ff as f64,
    );
    // A mixture: the router, and the token's experts' FFNs.
    let ffn = match hp.moe {
        Some(m) => d * m.n_expert as f64 + 3.0 * d * (m.n_ff_exp * m.n_expert_used) as f64,
        None => 3.0 * d * ff,
    };
    hp.n_layer as f64 * (d * q * 2.0 + d * kv * 2.0 + ffn) + d * hp.n_vocab as f64
}

struct TestResult {
    name: String,
    tokens_per_s: f64,
    /// Achieved GB/s (tg) or TFLOP/s (pp), and its share of the ceiling.
    achieved: f64,
    unit: &'static str,
    share: f64,
    llama_cpp: Option<f64>,
}

fn pp_test(g: &AnyBackend, n: usize, reps: usize, c: &Ceilings) -> Result<TestResult> {
    let hp = g.hparams().clone();
    let toks = random_tokens(n, hp.n_vocab, 1);
    let mut t = Vec::new();
    for r in 0..=reps {
        let mut cache = g.new_cache(n)?;
        let start = Instant::now();
        g.forward(&mut cache, &toks, Logits::Last)?;
        if r > 0 {
            t.push(start.elapsed().as_secs_f64());
        }
    }
    let secs = median(t);
    // 2 FLOPs per weight and token (the output head for the last token
    // only), plus attention: QK^T and PV over n^2/2 pairs per head.
    let head = 2.0 * (hp.n_embd * hp.n_vocab) as f64;
    let flops = 2.0 * matmul_params(&hp) * n as f64 - head * (n as f64 - 1.0)
        + hp.n_layer as f64 * 2.0 * (hp.n_head * hp.head_dim) as f64 * (n * n) as f64;
    let tflops = flops / secs / 1e12;
    Ok(TestResult {
        name: format!("pp{n}"),
        tokens_per_s: n as f64 / secs,
        achieved: tflops,
        unit: "TFLOP/s",
        share: tflops / c.fp32_tflops,
        llama_cpp: None,
    })
}

fn tg_test(
    g: &AnyBackend,
    model: &Model,
    n: usize,
    depth: usize,
    reps: usize,
    c: &Ceilings,
) -> Result<TestResult> {
    let hp = g.hparams().clone();
    let mut cache = g.new_cache(depth + n + 1)?;
    if depth > 0 {
        g.forward(
            &mut cache,
            &random_tokens(depth, hp.n_vocab, 2),
            Logits::None,
        )?;
    }
    let toks = random_tokens(n, hp.n_vocab, 3);
    let greedy = Selection::greedy();
    let mut t = Vec::new();
    for r in 0..=reps {
        cache.truncate(depth);
        let start = Instant::now();
        // Each step returns its argmax (selected on the GPU), as greedy
        // decoding runs; the logits stay on the device.
        for &tok in &toks {
            g.forward_select(&mut cache, &[tok], &greedy)?;
        }
        if r > 0 {
            t.push(start.elapsed().as_secs_f64());
        }
    }
    let secs = median(t);
    let kv_dim = (hp.n_head_kv * hp.head_dim) as f64;
    // KV bytes read per step: K and V, FP16, every layer, depth + i + 1 positions.
    let mean_ctx = depth as f64 + (n as f64 + 1.0) / 2.0;
    let kv_bytes = hp.n_layer as f64 * mean_ctx * kv_dim * 2.0 * 2.0;
    let bytes = decode_weight_bytes(model) as f64 + kv_bytes;
    let gbps = bytes * n as f64 / secs / 1e9;
    Ok(TestResult {
        name: if depth > 0 {
            format!("tg{n} @ d{depth}")
        } else {
            format!("tg{n}")
        },
        tokens_per_s: n as f64 / secs,
        achieved: gbps,
        unit: "GB/s",
        share: gbps / c.read_gbps,
        llama_cpp: None,
    })
}

/// llama-bench's arguments for the tests `a` runs on the file at `path`:
/// all layers on the GPU and flash attention on (as the issue's llama.cpp
/// figures were taken), JSON out; depth 0 and `a.depth` when it is set.
/// With `ngl`, that many layers on the GPU (the rest on the CPU).
fn llama_bench_args(path: &Path, a: &Args, ngl: Option<usize>) -> Vec<std::ffi::OsString> {
    let mut v: Vec<std::ffi::OsString> = vec!["-m".into(), path.into()];
    for (flag, val) in [
        ("-p", a.n_prompt.to_string()),
        ("-n", a.n_gen.to_string()),
        ("-r", a.reps.to_string()),
        ("-ngl", ngl.map_or("99".into(), |n| n.to_string())),
        ("-fa", "1".into()),
        ("-o", "json".into()),
    ] {
        v.push(flag.into());
        v.push(val.into());
    }
    if a.depth > 0 {
        v.push("-d".into());
        v.push(format!("0,{}", a.depth).into());
    }
    v.extend(a.llama_kv_args());
    v
}

/// llama-bench's figures for the same tests, if it is on PATH and runs.
fn llama_bench(path: &Path, a: &Args, ngl: Option<usize>) -> Option<Vec<(String, f64)>> {
    let out = match Command::new("llama-bench")
        .args(llama_bench_args(path, a, ngl))
        .output()
    {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            eprintln!(
                "llama-bench failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
            return None;
        }
        Err(_) => return None, // not on PATH
    };
    let res = parse_llama_bench(&out.stdout);
    if res.is_none() {
        eprintln!("llama-bench printed no JSON results this bench could read");
    }
    res
}

/// (test name as this bench names it, avg t/s) from llama-bench's `-o json`
/// output: pp<P> (depth 0), tg<N>, tg<N> @ d<D>; other tests (a prompt at
/// depth) are left out. None if it is not that JSON.
fn parse_llama_bench(json: &[u8]) -> Option<Vec<(String, f64)>> {
    let v: Value = serde_json::from_slice(json).ok()?;
    let mut res = Vec::new();
    for r in v.as_array()? {
        let (p, n) = (r["n_prompt"].as_u64()?, r["n_gen"].as_u64()?);
        let d = r["n_depth"].as_u64().unwrap_or(0);
        let ts = r["avg_ts"].as_f64()?;
        let name = match (p, n, d) {
            (p, 0, 0) => format!("pp{p}"),
            (0, n, 0) => format!("tg{n}"),
            (0, n, d) => format!("tg{n} @ d{d}"),
            _ => continue,
        };
        res.push((name, ts));
    }
    Some(res)
}

/// The backend the placement planner gives for `a`'s flags (`run`'s
/// `--gpus`, `--tensor-split`, `--gpu-layers`, `--max-vram`), a pool of
/// `kv_tokens`.
fn placed_backend(model: &Arc<Model>, a: &Args, kv_tokens: usize) -> Result<Placed> {
    let mut o = a.placement_options();
    o.kv_tokens = Some(kv_tokens);
    let (b, _, p) = m40_runtime::load_backend(model, &o, kv_tokens)?;
    Ok((b, p))
}

/// A backend and, where the planner placed it, its placement.
type Placed = (AnyBackend, Option<m40_model::placement::Placement>);

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

pub fn run(a: Args) -> Result<()> {
    let tmp;
    let (path, label) = match (&a.model, &a.shape) {
        (Some(m), None) => (super::resolve_model(Some(m))?, m.clone()),
        (None, Some(shape)) => {
            let shape = Shape::find(shape).ok_or_else(|| anyhow!("unknown shape `{shape}`"))?;
            let ty = FileType::parse(&a.ty).ok_or_else(|| {
                anyhow!(
                    "cannot generate type `{}` (supported: {})",
                    a.ty,
                    FileType::names()
                )
            })?;
            tmp = tempfile::tempdir()?;
            let path = tmp
                .path()
                .join(format!("{}-{}.gguf", shape.name, ty.name()));
            eprintln!(
                "generating a random {} model in {} ...",
                shape.name,
                ty.name()
            );
            let file = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(&path)?);
            write_model(file, &SynthOptions { shape, ty, seed: 0 }, |_, _| {})?;
            (path, format!("{} {} (random)", shape.name, ty.name()))
        }
        // No model: the default model, as `run` does.
        (None, None) => (
            super::resolve_model(None)?,
            m40_store::DEFAULT_MODEL.to_string(),
        ),
        (Some(_), Some(_)) => bail!("name a model, or a shape with --shape, not both"),
    };
    if !a.batch.is_empty() && a.engine {
        return super::bench_engine::run(&path, &label, &a);
    }
    if !a.batch.is_empty() {
        return super::bench_batch::run(&path, &label, &a);
    }
    if a.cpu {
        return super::bench_cpu::run(&path, &label, &a);
    }
    bench(&path, &label, &a)
}

fn bench(path: &PathBuf, label: &str, a: &Args) -> Result<()> {
    let dev = Device::open(a.gpu).context("opening the GPU (bench needs one)")?;
    let info = dev.info().clone();
    eprintln!("measuring the ceilings of {} ...", info.name);
    let c = ceilings(&dev)?;
    let model = std::sync::Arc::new(Model::open(path)?);
    let kv_tokens = a
        .n_prompt
        .max(a.depth + a.n_gen + 1)
        .max(a.n_gen + 1)
        .max(a.ctx);
    eprintln!("loading {label} ...");
    let t0 = Instant::now();
    let (g, placement) = match a.placed() {
        true => placed_backend(&model, a, kv_tokens)?,
        false => {
            let opts = GpuOptions {
                kv_tokens,
                packed: !a.gguf_layout,
                fuse: !a.no_fuse,
                persistent: a.persistent,
                decode_attention: !a.warp_attention,
                group_experts: !a.no_group_experts,
                fold_moe_norm: a.fold_moe_norm,
                kv_format: a.kv_type,
                ..Default::default()
            };
            let g = GpuBackend::new(dev.clone(), model.clone(), opts)?;
            (AnyBackend::Gpu(Box::new(g)), None)
        }
    };
    eprintln!("loaded in {:.1} s", t0.elapsed().as_secs_f64());
    if let Some(p) = &placement {
        print!("{p}");
    }
    let size = model.file().file_size();
    let params = model.file().n_params();
    if !a.json {
        println!(
            "device: {} ({} SMs); ceilings: read {:.0} GB/s, FP32 FMA {:.1} TFLOP/s",
            info.name, info.sm_count, c.read_gbps, c.fp32_tflops
        );
        println!(
            "model: {label}: {:.2} GiB, {:.2} B params, weights {}; decode graph: {}\n",
            gib(size),
            params as f64 / 1e9,
            match (a.gguf_layout, a.no_fuse) {
                (true, _) => "in GGUF rows",
                (false, true) => "packed",
                (false, false) => "packed, Q/K/V and gate/up stacked",
            },
            match (a.persistent, a.warp_attention) {
                (false, false) => "a launch per kernel",
                (false, true) => "a launch per kernel, attention in the warp kernel",
                (true, _) => "the persistent decode kernel",
            }
        );
        println!("| test               |       t/s |        achieved | share of ceiling |");
        println!("| ------------------ | --------: | --------------: | ---------------: |");
    }
    // Each row is printed as its test finishes.
    let mut results = Vec::new();
    let mut row = |r: TestResult| {
        if !a.json {
            use std::io::Write;
            println!(
                "| {:<18} | {:>9.1} | {:>7.2} {:<7} | {:>15.1}% |",
                r.name,
                r.tokens_per_s,
                r.achieved,
                r.unit,
                100.0 * r.share
            );
            let _ = std::io::stdout().flush();
        }
        results.push(r);
    };
    if a.n_prompt > 0 {
        row(pp_test(&g, a.n_prompt, a.reps, &c)?);
    }
    if a.n_gen > 0 {
        row(tg_test(&g, &model, a.n_gen, 0, a.reps, &c)?);
        if a.depth > 0 {
            row(tg_test(&g, &model, a.n_gen, a.depth, a.reps, &c)?);
        }
        // Decode steps launched kernel by kernel instead of replayed from the graph.
        g.set_graphs(false);
        let mut r = tg_test(&g, &model, a.n_gen, 0, a.reps, &c)?;
        r.name = format!("{} (no graph)", r.name);
        row(r);
        g.set_graphs(true);
    }
    if !a.no_llama_bench {
        let ngl = placement.as_ref().map(|p| p.gpu_layers());
        if let Some(lb) = llama_bench(path, a, ngl) {
            for r in &mut results {
                r.llama_cpp = lb.iter().find(|(n, _)| *n == r.name).map(|(_, t)| *t);
            }
        }
    }
    if a.json {
        let v = json!({
            "device": info.name,
            "ceilings": {"read_gbps": c.read_gbps, "fp32_tflops": c.fp32_tflops},
            "model": {"label": label, "path": path, "size_bytes": size, "params": params,
                      "layout": if a.gguf_layout { "gguf" } else { "packed" },
                      "stacked_qkv_gate_up": !a.gguf_layout && !a.no_fuse,
                      "persistent_decode": a.persistent,
                      "decode_attention": if a.warp_attention { "warp" } else { "decode" }},
            "results": results.iter().map(|r| json!({
                "test": r.name,
                "tokens_per_s": r.tokens_per_s,
                "achieved": r.achieved,
                "unit": r.unit,
                "share_of_ceiling": r.share,
                "llama_cpp_tokens_per_s": r.llama_cpp,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    // llama.cpp on the same GPU and file, once llama-bench has run.
    if results.iter().any(|r| r.llama_cpp.is_some()) {
        println!("\n| test               |       t/s | llama.cpp t/s | ratio |");
        println!("| ------------------ | --------: | ------------: | ----: |");
        for r in &results {
            match r.llama_cpp {
                Some(t) => println!(
                    "| {:<18} | {:>9.1} | {t:>13.1} | {:>5.2} |",
                    r.name,
                    r.tokens_per_s,
                    r.tokens_per_s / t
                ),
                None => println!(
                    "| {:<18} | {:>9.1} | {:>13} | {:>5} |",
                    r.name, r.tokens_per_s, "-", "-"
                ),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: Args,
    }

    #[test]
    fn llama_bench_json_is_read_by_test_name() {
        // llama-bench -o json's shape (fields this bench does not read cut).
        let json = br#"[
          {"model_type": "llama 8B Q4_0", "n_prompt": 512, "n_gen": 0, "n_depth": 0,
           "avg_ns": 208000000, "avg_ts": 2461.5, "stddev_ts": 3.2},
          {"model_type": "llama 8B Q4_0", "n_prompt": 0, "n_gen": 128, "n_depth": 0,
           "avg_ts": 336.25, "stddev_ts": 0.4},
          {"model_type": "llama 8B Q4_0", "n_prompt": 512, "n_gen": 0, "n_depth": 4096,
           "avg_ts": 1900.0, "stddev_ts": 2.0},
          {"model_type": "llama 8B Q4_0", "n_prompt": 0, "n_gen": 128, "n_depth": 4096,
           "avg_ts": 290.5, "stddev_ts": 0.3}
        ]"#;
        let got = parse_llama_bench(json).unwrap();
        let want = [
            ("pp512", 2461.5),
            ("tg128", 336.25),
            ("tg128 @ d4096", 290.5),
        ];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for ((n, t), (wn, wt)) in got.iter().zip(want) {
            assert_eq!((n.as_str(), *t), (wn, wt));
        }
        // Older builds print no n_depth: depth 0.
        let old = br#"[{"n_prompt": 0, "n_gen": 64, "avg_ts": 10.0}]"#;
        assert_eq!(
            parse_llama_bench(old).unwrap(),
            vec![("tg64".to_string(), 10.0)]
        );
        // Not its JSON: nothing, and the table goes without the column.
        for bad in [&b"| model | size |"[..], b"{}", br#"[{"n_gen": 1}]"#] {
            assert!(parse_llama_bench(bad).is_none());
        }
    }

    #[test]
    fn llama_bench_runs_the_same_tests() {
        let args = |v: &[&str]| {
            let cli = Cli::parse_from(["bench"].iter().chain(v));
            let ngl = cli.a.gpu_layers;
            llama_bench_args(Path::new("/m/x.gguf"), &cli.a, ngl)
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let a = args(&[
            "/m/x.gguf",
            "-p",
            "256",
            "-n",
            "32",
            "-d",
            "1024",
            "-r",
            "2",
        ]);
        assert_eq!(
            a,
            "-m /m/x.gguf -p 256 -n 32 -r 2 -ngl 99 -fa 1 -o json -d 0,1024"
        );
        let a = args(&["/m/x.gguf", "-d", "0"]);
        assert!(!a.contains(" -d "), "{a}");
        // The layers the planner put on the GPU.
        let a = args(&["/m/x.gguf", "--gpu-layers", "20"]);
        assert!(a.contains("-ngl 20 "), "{a}");
    }
}
