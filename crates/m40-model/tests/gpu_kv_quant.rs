//! The GPU's quantized KV cache (`GpuOptions::kv_format` Q8_0 and Q4_0:
//! kernels/kvq.cuh) against the CPU backend's pages of the same format:
//! both rotate keys and values and round them the same way (the kernel
//! tests check the blocks one by one), so the logits differ by the GPU's
//! FP32 order of operations, and where that moves a value across a
//! rounding boundary, by one quantization step of it, which the layers
//! after it carry on (a Q4_0 step is an eighth of its block's largest
//! value: over SmolLM2's 30 layers such steps compound). The bound is
//! therefore the quantization's own: the GPU's logits are no further from
//! the CPU's on the same format than the CPU's are from its FP16 cache
//! (and within 1e-3 where that is smaller), the greedy tokens agree. Shapes that reach every attention kernel
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

/// The FP16 tests' bound, allowed where the quantization moves the
/// logits less than it.
const TOL: f64 = 1e-3;

/// `e`, or infinity where it is NaN.
fn finite(e: f64) -> f64 {
    if e.is_nan() {
        f64::INFINITY
    } else {
        e
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
/// choices fed to all three: the CPU and the GPU on `format`, the CPU on
/// FP16), the worst error against the CPU and the argmax agreement.
fn check(
    model: &Arc<Model>,
    what: &str,
    format: KvFormat,
    prompts: &[usize],
    decode: usize,
) -> Vec<String> {
    let (c, g, f) = (
        cpu(model, format),
        gpu(model, format),
        cpu(model, KvFormat::F16),
    );
    let n_vocab = model.hparams().n_vocab;
    let mut failures = Vec::new();
    for &p in prompts {
        let toks = tokens(p, n_vocab, 7 + p as u64);
        let n = p + decode + 1;
        let (mut cc, mut gc, mut fc) = (
            c.new_cache(n).unwrap(),
            g.new_cache(n).unwrap(),
            f.new_cache(n).unwrap(),
        );
        let mut cl = c.forward(&mut cc, &toks, Logits::Last).unwrap();
        let mut gl = g.forward(&mut gc, &toks, Logits::Last).unwrap();
        let mut fl = f.forward(&mut fc, &toks, Logits::Last).unwrap();
        let first = finite(rel_err(&gl, &cl));
        let (mut worst, mut quant, mut agree) = (first, finite(rel_err(&cl, &fl)), 0);
        for _ in 0..decode {
            let t = argmax(&cl);
            agree += (argmax(&gl) == t) as usize;
            cl = c.forward(&mut cc, &[t], Logits::Last).unwrap();
            gl = g.forward(&mut gc, &[t], Logits::Last).unwrap();
            fl = f.forward(&mut fc, &[t], Logits::Last).unwrap();
            worst = worst.max(finite(rel_err(&gl, &cl)));
            quant = quant.max(finite(rel_err(&cl, &fl)));
        }
        println!(
            "{what} {}: prompt {p}: GPU against CPU {first:.2e} after it, {worst:.2e} worst over {decode} steps \
             (CPU {} against its f16 cache: {quant:.2e}); argmax {agree}/{decode}",
            format.name(),
            format.name()
        );
        if worst > TOL.max(quant) || agree + decode / 8 < decode {
            failures.push(format!(
                "{what} {} prompt {p}: rel err {worst:.2e} (the quantization's own {quant:.2e}), argmax {agree}/{decode}",
                format.name()
            ));
        }
    }
    failures
}

/// Every quantized format on shapes that take each path: llama (heads of
/// 64, the tile prefill, one KV head per two query heads), SmolLM2 (3
/// query heads a KV head, 30 layers), mistral3 (YaRN, temperature),
/// qwen3 (head norms and NeoX in the RoPE launch), gpt-oss (sinks,
/// biases, NeoX heads in the model's order: over FP16 pages the GPU
/// uploads their pairs adjacent, which would quantize other blocks than
/// the CPU's), gemma3 with heads of 256 (the warp kernel's prefill, the
/// decode kernel of 8 values a lane, sliding windows); prompts from one
/// token (the warp kernel) to past several pages (the tile kernel), 40
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
        ("mistral3-tiny", GgmlType::Q8_0),
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
            let (c, g, f) = (
                cpu(&model, format),
                gpu(&model, format),
                cpu(&model, KvFormat::F16),
            );
            assert!(g.batches_decode(), "{shape}: the batched path");
            let b = 9;
            let (mut cc, mut gc, mut fc) = (Vec::new(), Vec::new(), Vec::new());
            let mut next = Vec::new();
            for s in 0..b {
                let prompt = tokens(1 + 23 * s, n_vocab, 100 + s as u64);
                let mut caches = (
                    c.new_cache(300).unwrap(),
                    g.new_cache(300).unwrap(),
                    f.new_cache(300).unwrap(),
                );
                let l = c.forward(&mut caches.0, &prompt, Logits::Last).unwrap();
                g.forward(&mut caches.1, &prompt, Logits::Last).unwrap();
                f.forward(&mut caches.2, &prompt, Logits::Last).unwrap();
                next.push(argmax(&l));
                cc.push(caches.0);
                gc.push(caches.1);
                fc.push(caches.2);
            }
            let (mut worst, mut quant) = (0f64, 0f64);
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
                    let f16 = f.forward(&mut fc[s], &toks[s], Logits::Last).unwrap();
                    worst = worst.max(finite(rel_err(&got, &want)));
                    quant = quant.max(finite(rel_err(&want, &f16)));
                    next[s] = argmax(&want);
                }
            }
            println!(
                "{shape} {}: batch of {b}, 8 steps: GPU against CPU worst {worst:.2e} (CPU against its f16 cache: {quant:.2e})",
                format.name()
            );
            if worst > TOL.max(quant) {
                failures.push(format!(
                    "{shape} {}: batched rel err {worst:.2e} (quantization's {quant:.2e})",
                    format.name()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The pool's pages are smaller (Q8_0 17/32 of FP16's bytes, Q4_0 9/32),
/// so the same memory holds more tokens; heads the rotation does not take
/// are refused with the reason.
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
    // The pools' bytes (KvLayout's), and what the device's allocator adds
    // to each of the 4 pools (2 layers, K and V): under 256 bytes.
    let layout = |format| m40_model::KvLayout::new(model.hparams(), m40_kernels::KV_PAGE, format);
    for (format, got) in [
        (KvFormat::F16, f16),
        (KvFormat::Q8_0, q8),
        (KvFormat::Q4_0, q4),
    ] {
        let want = layout(format).pool_bytes((1 << 16) / m40_kernels::KV_PAGE);
        assert!(
            (want..want + 1024).contains(&got),
            "{format:?}: {got} bytes for pools of {want}"
        );
    }
    // qwen2-tiny's heads of 32 are not a multiple of the rotation's 64: a
    // clear error (the engine warns and keeps FP16: m40-runtime).
    let odd = synth(dir.path(), "qwen2-tiny", GgmlType::Q8_0);
    assert_eq!(odd.hparams().head_dim, 32);
    let opts = GpuOptions {
        kv_format: KvFormat::Q4_0,
        ..Default::default()
    };
    let err = GpuBackend::new(dev.clone(), odd, opts)
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("q4_0 KV cache on the GPU"),
        "{err}"
    );
}
