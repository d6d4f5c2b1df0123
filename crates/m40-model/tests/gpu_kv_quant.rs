//! The GPU's quantized KV cache (`GpuOptions::kv_format` Q8_0 and Q4_0:
//! kernels/kvq.cuh) against the CPU backend's pages of the same format:
//! both rotate keys and values and round them the same way, so the pages
//! hold the same blocks and the logits differ by the GPU's FP32 order of
//! operations, and where that moves a value across a rounding boundary by
//! one quantization step of it. Shapes that reach every attention kernel
//! over quantized pages: prefill in register tiles (head size 64; gemma's
//! 256 in the warp kernel), decode in the decode kernel (and its split
//! keys past a page), batched decode (`attn_dec_b_*`), and the RoPE
//! launches that append (plain, biased with sinks, head-normed, NeoX).
//! Every test needs a GPU (ignored without `--include-ignored`).

mod gpu_common;

use gpu_common::{argmax, rel_err, synth, tokens};

use std::sync::Arc;

use m40_device::testing::gpu_device;
use m40_gguf::GgmlType;
use m40_model::cpu::{CpuBackend, CpuMath};
use m40_model::gpu::{GpuBackend, GpuOptions};
use m40_model::{Backend, KvFormat, Logits, Model, SeqStep, StepOut, Want};

/// The relative error allowed against the CPU on the same format: the
/// FP16 tests' 1e-3 with room for a value that rounds to the next step
/// (a Q4_0 step is an eighth of its block's largest value).
fn tol(format: KvFormat) -> f64 {
    match format {
        KvFormat::Q4_0 => 1e-2,
        _ => 3e-3,
    }
}

fn gpu(model: &Arc<Model>, format: KvFormat) -> GpuBackend {
    let opts = GpuOptions {
        kv_tokens: 16384,
        kv_format: format,
        ..Default::default()
    };
    GpuBackend::new(gpu_device("quantized KV"), model.clone(), opts).unwrap()
}

fn cpu(model: &Arc<Model>, format: KvFormat) -> CpuBackend {
    CpuBackend::within(model.clone(), CpuMath::Exact, 16384, format, None).unwrap()
}

/// Prompts of `prompts` tokens then `decode` greedy steps (the CPU's
/// choices fed to both), the worst error and the argmax agreement.
fn check(
    model: &Arc<Model>,
    what: &str,
    format: KvFormat,
    prompts: &[usize],
    decode: usize,
) -> Vec<String> {
    let (c, g) = (cpu(model, format), gpu(model, format));
    let n_vocab = model.hparams().n_vocab;
    let mut failures = Vec::new();
    for &p in prompts {
        let toks = tokens(p, n_vocab, 7 + p as u64);
        let mut cc = c.new_cache(p + decode + 1).unwrap();
        let mut gc = g.new_cache(p + decode + 1).unwrap();
        let mut cl = c.forward(&mut cc, &toks, Logits::Last).unwrap();
        let mut gl = g.forward(&mut gc, &toks, Logits::Last).unwrap();
        let first = rel_err(&gl, &cl);
        let (mut worst, mut agree) = (first, 0);
        for _ in 0..decode {
            let t = argmax(&cl);
            agree += (argmax(&gl) == t) as usize;
            cl = c.forward(&mut cc, &[t], Logits::Last).unwrap();
            gl = g.forward(&mut gc, &[t], Logits::Last).unwrap();
            let e = rel_err(&gl, &cl);
            worst = if e.is_nan() {
                f64::INFINITY
            } else {
                worst.max(e)
            };
        }
        println!(
            "{what} {}: prompt {p}: rel err {first:.2e} after it, {worst:.2e} worst over {decode} steps; argmax {agree}/{decode}",
            format.name()
        );
        if worst.is_nan() || worst > tol(format) || agree + decode / 8 < decode {
            failures.push(format!(
                "{what} {} prompt {p}: rel err {worst:.2e} (allowed {:.0e}), argmax {agree}/{decode}",
                format.name(),
                tol(format)
            ));
        }
    }
    failures
}

/// Every quantized format on shapes that take each path: llama (heads of
/// 64, the tile prefill, one KV head per two query heads), SmolLM2 (3
/// query heads a KV head), qwen2 (biases and NeoX in the RoPE launch),
/// qwen3 (head norms in it), gpt-oss (sinks), gemma3 with heads of 256
/// (the warp kernel's prefill, the decode kernel of 8 values a lane,
/// sliding windows); prompts from one token to past several pages, 40
/// decode steps.
#[test]
#[ignore = "needs a GPU"]
fn quantized_pages_match_the_cpu() {
    gpu_device("quantized_pages_match_the_cpu");
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (shape, ty) in [
        ("tiny", GgmlType::Q8_0),
        ("smollm2-135m", GgmlType::Q4_0),
        ("qwen2-tiny", GgmlType::Q8_0),
        ("qwen3-tiny", GgmlType::Q4_0),
        ("gpt-oss-tiny", GgmlType::Q8_0),
        ("gemma3-tiny-256", GgmlType::Q8_0),
    ] {
        let model = synth(dir.path(), shape, ty);
        for format in [KvFormat::Q8_0, KvFormat::Q4_0] {
            failures.extend(check(&model, shape, format, &[1, 17, 100, 300], 40));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Batched decode steps (`forward_batch`: the RoPE launch over tokens of
/// several sequences, `attn_dec_b_*` over their pages) against each
/// sequence's CPU step, every format.
#[test]
#[ignore = "needs a GPU"]
fn batched_steps_on_quantized_pages_match_the_cpu() {
    gpu_device("batched_steps_on_quantized_pages_match_the_cpu");
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for shape in ["smollm2-135m", "qwen3-tiny"] {
        let model = synth(dir.path(), shape, GgmlType::Q8_0);
        let n_vocab = model.hparams().n_vocab;
        for format in [KvFormat::Q8_0, KvFormat::Q4_0] {
            let (c, g) = (cpu(&model, format), gpu(&model, format));
            assert!(g.batches_decode(), "{shape}: the batched path");
            let b = 9;
            let mut cc = Vec::new();
            let mut gc = Vec::new();
            let mut next = Vec::new();
            for s in 0..b {
                let prompt = tokens(1 + 23 * s, n_vocab, 100 + s as u64);
                let mut ccache = c.new_cache(300).unwrap();
                let mut gcache = g.new_cache(300).unwrap();
                let l = c.forward(&mut ccache, &prompt, Logits::Last).unwrap();
                g.forward(&mut gcache, &prompt, Logits::Last).unwrap();
                next.push(argmax(&l));
                cc.push(ccache);
                gc.push(gcache);
            }
            let mut worst = 0f64;
            for _ in 0..8 {
                let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
                let mut steps: Vec<SeqStep<'_, _>> = gc
                    .iter_mut()
                    .zip(&toks)
                    .map(|(cache, t)| SeqStep {
                        cache,
                        tokens: t.as_slice(),
                        want: Want::Logits,
                    })
                    .collect();
                let outs = g.forward_batch(&mut steps).unwrap();
                for (s, o) in outs.into_iter().enumerate() {
                    let StepOut::Logits(got) = o else {
                        panic!("logits expected")
                    };
                    let want = c.forward(&mut cc[s], &toks[s], Logits::Last).unwrap();
                    let e = rel_err(&got, &want);
                    worst = if e.is_nan() {
                        f64::INFINITY
                    } else {
                        worst.max(e)
                    };
                    next[s] = argmax(&want);
                }
            }
            println!(
                "{shape} {}: batch of {b}, 8 steps: worst rel err {worst:.2e}",
                format.name()
            );
            if worst > tol(format) {
                failures.push(format!(
                    "{shape} {}: batched rel err {worst:.2e}",
                    format.name()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The pool's pages are smaller (Q8_0 17/32 of FP16's bytes, Q4_0 9/32),
/// so the same memory holds more tokens.
#[test]
#[ignore = "needs a GPU"]
fn quantized_pools_are_smaller_and_checked() {
    let dev = gpu_device("quantized_pools_are_smaller_and_checked");
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny", GgmlType::Q8_0);
    let kv = |format| {
        let g = GpuBackend::new(
            dev.clone(),
            model.clone(),
            GpuOptions {
                kv_tokens: 1 << 16,
                kv_format: format,
                ..Default::default()
            },
        )
        .unwrap();
        let mem = g.memory();
        println!("{}: KV {} bytes", format.name(), mem.kv);
        mem.kv
    };
    let (f16, q8, q4) = (kv(KvFormat::F16), kv(KvFormat::Q8_0), kv(KvFormat::Q4_0));
    assert_eq!(q8 * 32, f16 * 17, "Q8_0: 34 bytes a block of 32 against 64");
    assert_eq!(q4 * 32, f16 * 9, "Q4_0: 18 bytes a block of 32 against 64");
}
