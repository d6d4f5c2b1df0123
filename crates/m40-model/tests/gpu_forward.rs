//! The GPU backend against the CPU reference: logits at every position of
//! the quant zoo, random-weight models of real shapes, greedy
//! continuations, and the paged KV cache under interleaving, freeing and
//! reuse. Every test needs a GPU: the harness lists them as ignored
//! without `--include-ignored`, and with it they fail where there is none;
//! the 1B and 8B shapes take minutes (run.sh runs them with
//! M40_GPU_LARGE=1). The zoo comes from ../shared/testdata or
//! M40_TESTDATA (the device runs carry a copy).

#[path = "../../m40-gguf/tests/common/mod.rs"]
mod common;
mod gpu_common;

use gpu_common::{argmax, rel_err, synth, tokens};

use std::sync::Arc;

use m40_device::testing::gpu_device;
use m40_gguf::synth::FileType;
use m40_gguf::GgmlType;
use m40_model::cpu::CpuBackend;
use m40_model::gpu::{GpuBackend, GpuOptions};
use m40_model::{Backend, KvState, Logits, Model, ModelError};

/// The relative error the issue allows between GPU and CPU logits.
const TOL: f64 = 1e-3;

/// Top logit minus the runner-up.
fn margin(v: &[f32]) -> f32 {
    let b = argmax(v) as usize;
    let second = v
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != b)
        .map(|(_, x)| *x)
        .fold(f32::NEG_INFINITY, f32::max);
    v[b] - second
}

fn gpu(model: &Arc<Model>, kv_tokens: usize, max_batch: usize) -> GpuBackend {
    gpu_with(
        model,
        GpuOptions {
            kv_tokens,
            max_batch,
            ..Default::default()
        },
    )
}

fn gpu_with(model: &Arc<Model>, opts: GpuOptions) -> GpuBackend {
    let dev = gpu_device("gpu backend");
    GpuBackend::new(dev, model.clone(), opts).unwrap()
}

/// Per-position errors of `got` against `want` (rows of n_vocab); returns
/// the worst and the positions over TOL.
fn compare_rows(got: &[f32], want: &[f32], n_vocab: usize) -> (f64, Vec<usize>) {
    assert_eq!(got.len(), want.len());
    let mut worst = 0f64;
    let mut bad = Vec::new();
    for (i, (g, w)) in got
        .chunks_exact(n_vocab)
        .zip(want.chunks_exact(n_vocab))
        .enumerate()
    {
        let e = rel_err(g, w);
        if e.is_nan() || e > TOL {
            bad.push(i);
        }
        worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
    }
    (worst, bad)
}

/// Greedy continuations of `n` tokens after `prompt`, each backend on its own
/// choices; returns (cpu tokens, gpu tokens, cpu logits per step).
fn greedy<C: Backend, G: Backend>(
    cpu: &C,
    gpu: &G,
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, Vec<u32>, Vec<Vec<f32>>) {
    let run = |b: &dyn Fn(&[u32], bool) -> Vec<f32>| {
        let mut out = Vec::new();
        let mut steps = Vec::new();
        let mut logits = b(prompt, true);
        for _ in 0..n {
            let t = argmax(&logits);
            out.push(t);
            steps.push(logits.clone());
            logits = b(&[t], false);
        }
        (out, steps)
    };
    let mut cc = cpu.new_cache(prompt.len() + n + 1).unwrap();
    let cc = std::cell::RefCell::new(&mut cc);
    let (c_toks, c_steps) =
        run(&|t, _| cpu.forward(&mut cc.borrow_mut(), t, Logits::Last).unwrap());
    let mut gc = gpu.new_cache(prompt.len() + n + 1).unwrap();
    let gc = std::cell::RefCell::new(&mut gc);
    let (g_toks, _) = run(&|t, _| gpu.forward(&mut gc.borrow_mut(), t, Logits::Last).unwrap());
    (c_toks, g_toks, c_steps)
}

/// Where the greedy sequences first differ, the CPU's top two logits must be
/// nearly tied (within what TOL allows of the logits' scale).
fn check_greedy(what: &str, c: &[u32], g: &[u32], steps: &[Vec<f32>]) -> Option<String> {
    let at = c.iter().zip(g).position(|(a, b)| a != b)?;
    let l = &steps[at];
    let norm = (l.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / l.len() as f64).sqrt();
    let m = margin(l) as f64;
    if m > 4.0 * TOL * norm * (l.len() as f64).sqrt() / 8.0 {
        Some(format!(
            "{what}: greedy tokens differ at step {at} ({} vs {}) where the CPU's margin is {m:.3e} (logit rms {norm:.3e})",
            c[at], g[at]
        ))
    } else {
        println!("{what}: greedy differs at step {at}, a near tie (margin {m:.2e})");
        None
    }
}

#[test]
#[ignore = "needs a GPU"]
fn zoo_gpu_logits_match_cpu() {
    gpu_device("zoo_gpu_logits_match_cpu");
    let td = common::testdata().expect("the quant zoo is needed (M40_TESTDATA)");
    let mut files: Vec<_> = std::fs::read_dir(td.join("quant-zoo"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 15);
    let mut failures = Vec::new();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let model = Arc::new(Model::open(&path).unwrap());
        let cpu = CpuBackend::new(model.clone()).unwrap();
        let n_vocab = cpu.hparams().n_vocab;
        let toks = tokens(300, n_vocab, 7);
        let mut cc = cpu.new_cache(400).unwrap();
        let want = cpu.forward(&mut cc, &toks, Logits::All).unwrap();
        // All 300 at once (GEMM), then in steps of 64 with the last 20 in
        // steps of 1, 3 and 16 (GEMV, decode attention), kernel by kernel and with Q/K/V
        // and gate/up as separate matrices; the greedy continuation below
        // replays the captured decode graph (stacked matrices).
        let g = gpu(&model, 1024, 512);
        let mut gc = g.new_cache(400).unwrap();
        let all = g.forward(&mut gc, &toks, Logits::All).unwrap();
        let (w1, bad1) = compare_rows(&all, &want, n_vocab);
        let g64 = gpu_with(
            &model,
            GpuOptions {
                kv_tokens: 1024,
                max_batch: 64,
                fuse: false,
                ..Default::default()
            },
        );
        g64.set_graphs(false);
        let mut gc = g64.new_cache(400).unwrap();
        let mut stepped = g64.forward(&mut gc, &toks[..280], Logits::All).unwrap();
        // The last 20 in steps of 1 (GEMV) and 2 to 16 (the batched GEMV).
        let mut at = 280;
        for n in [1, 3, 16] {
            stepped.extend(
                g64.forward(&mut gc, &toks[at..at + n], Logits::All)
                    .unwrap(),
            );
            at += n;
        }
        assert_eq!(at, 300);
        let (w2, bad2) = compare_rows(&stepped, &want, n_vocab);
        println!(
            "{name}: max rel err {w1:.2e} (one batch), {w2:.2e} (steps of 64, then of 1, 3 and 16)"
        );
        if !bad1.is_empty() || !bad2.is_empty() {
            failures.push(format!(
                "{name}: positions over {TOL}: {:?} / {:?} (worst {w1:.2e} / {w2:.2e})",
                &bad1[..bad1.len().min(8)],
                &bad2[..bad2.len().min(8)]
            ));
        }
        let (c, gt, steps) = greedy(&cpu, &g, &toks, 64);
        if let Some(f) = check_greedy(&name, &c, &gt, &steps) {
            failures.push(f);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A random-weight model of `shape` in `ty`, written to a temp dir.
/// GPU vs CPU on a random model: the last position's logits after prompts
/// of the given lengths, then every step of `decode` greedy steps (both fed
/// the CPU's tokens), on a backend with `opts` (its KV tokens and batch
/// set here).
fn check_synth(
    model: &Arc<Model>,
    what: &str,
    prompts: &[usize],
    decode: usize,
    opts: GpuOptions,
) -> Vec<String> {
    let cpu = CpuBackend::new(model.clone()).unwrap();
    let n_vocab = cpu.hparams().n_vocab;
    let longest = prompts.iter().max().unwrap() + decode + 1;
    let g = gpu_with(
        model,
        GpuOptions {
            kv_tokens: longest.next_multiple_of(32) * 2,
            max_batch: 512,
            ..opts
        },
    );
    let mut failures = Vec::new();
    for &p in prompts {
        let toks = tokens(p, n_vocab, p as u64);
        let mut cc = cpu.new_cache(p + decode + 1).unwrap();
        let mut gc = g.new_cache(p + decode + 1).unwrap();
        let mut c = cpu.forward(&mut cc, &toks, Logits::Last).unwrap();
        let mut gl = g.forward(&mut gc, &toks, Logits::Last).unwrap();
        let mut worst = rel_err(&gl, &c);
        let prompt_err = worst;
        let mut agree = 0;
        for _ in 0..decode {
            let t = argmax(&c);
            agree += (argmax(&gl) == t) as usize;
            c = cpu.forward(&mut cc, &[t], Logits::Last).unwrap();
            gl = g.forward(&mut gc, &[t], Logits::Last).unwrap();
            let e = rel_err(&gl, &c);
            worst = if e.is_nan() {
                f64::INFINITY
            } else {
                worst.max(e)
            };
        }
        println!(
            "{what} prompt {p}: rel err {prompt_err:.2e} after the prompt, {worst:.2e} worst over {decode} decode steps; argmax agrees {agree}/{decode}"
        );
        if worst.is_nan() || worst > TOL {
            failures.push(format!("{what} prompt {p}: rel err {worst:.2e} > {TOL}"));
        }
    }
    failures
}

/// GPU vs CPU on random models of `shape` in each of `types`.
fn check_shape(shape: &str, types: &[FileType], prompts: &[usize], decode: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for &ty in types {
        let model = synth(dir.path(), shape, ty);
        let what = format!("{shape} {ty}");
        failures.extend(check_synth(
            &model,
            &what,
            prompts,
            decode,
            Default::default(),
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The four types: on this shape (rows of 576) Q4_K falls back to
/// Q5_0 wherever rows are not whole super-blocks, as llama-quantize does;
/// ffn_down (rows of 1536) stays Q4_K.
const SYNTH_TYPES: [FileType; 4] = [
    FileType::All(GgmlType::Q4_0),
    FileType::All(GgmlType::Q4_K),
    FileType::All(GgmlType::Q8_0),
    FileType::All(GgmlType::F16),
];

#[test]
#[ignore = "needs a GPU"]
fn synth_smollm2_shape_gpu_matches_cpu() {
    gpu_device("synth_smollm2_shape_gpu_matches_cpu");
    check_shape("smollm2-135m", &SYNTH_TYPES, &[1, 5, 17, 512, 2048], 64);
}

/// llama-quantize's Q4_K_M mix on the tiny shape (rows of 256: nothing
/// falls back): layer 1's V and down projection are Q6_K, so its Q/K stack
/// and its V are two one-token GEMVs, each rotating and appending its rows
/// to the KV cache itself; layer 0 is one Q4_K stack.
#[test]
#[ignore = "needs a GPU"]
fn synth_tiny_q4_k_m_gpu_matches_cpu() {
    gpu_device("synth_tiny_q4_k_m_gpu_matches_cpu");
    check_shape("tiny", &[FileType::Q4KM], &[1, 5, 17, 512], 64);
}

/// qwen2: Q/K/V biases and NeoX RoPE (on the GPU its heads' pairs are
/// uploaded adjacent, and one token's Q/K/V GEMV adds the biases, rotates
/// and appends them). qwen3: each query and key head RMS-normed before
/// RoPE (NeoX style), a head size (64) that is not n_embd / n_head (128 /
/// 4).
#[test]
#[ignore = "needs a GPU"]
fn synth_qwen_gpu_matches_cpu() {
    gpu_device("synth_qwen_gpu_matches_cpu");
    let types = [
        FileType::All(GgmlType::F32),
        FileType::All(GgmlType::F16),
        FileType::All(GgmlType::Q8_0),
        FileType::All(GgmlType::Q4_0),
    ];
    for shape in ["qwen2-tiny", "qwen3-tiny"] {
        check_shape(shape, &types, &[1, 5, 17, 100], 32);
    }
}

/// gemma2 and gemma3: scaled embeddings, GeGLU, post-norms, soft-capped
/// scores (gemma2) and logits, a sliding window of 5 keys on some layers
/// (their own RoPE base on gemma3): prompts of 1 to 100 tokens (the
/// prefill tile kernel skips whole pages before the window) and 32 decode
/// steps (the decode kernel masks within a pass).
#[test]
#[ignore = "needs a GPU"]
fn synth_gemma_gpu_matches_cpu() {
    gpu_device("synth_gemma_gpu_matches_cpu");
    let types = [
        FileType::All(GgmlType::F32),
        FileType::All(GgmlType::F16),
        FileType::All(GgmlType::Q8_0),
        FileType::All(GgmlType::Q4_0),
    ];
    check_shape("gemma2-tiny", &types, &[1, 5, 17, 100], 32);
    check_shape("gemma3-tiny", &types, &[1, 5, 17, 100], 32);
    // Head size 256: the decode attention kernel's widest heads.
    check_shape("gemma3-tiny-256", &types, &[1, 17, 100], 32);
}

/// Mixtures of experts: qwen3moe (8 experts, 3 a token) and Mixtral (4, 2):
/// routing on the device, the chosen experts' GEMVs, their weighted sum;
/// prompts of 1 to 100 tokens and 32 decode steps.
#[test]
#[ignore = "needs a GPU"]
fn synth_moe_gpu_matches_cpu() {
    gpu_device("synth_moe_gpu_matches_cpu");
    let types = [
        FileType::All(GgmlType::F32),
        FileType::All(GgmlType::F16),
        FileType::All(GgmlType::Q8_0),
        FileType::All(GgmlType::Q4_0),
    ];
    check_shape("qwen3moe-tiny", &types, &[1, 5, 17, 100], 32);
    check_shape("mixtral-tiny", &[FileType::Q4KM], &[1, 17, 100], 32);
}

/// The mixtures' one-token steps with the next norm folded into the
/// experts' weighted sum (`GpuOptions::fold_moe_norm`): qwen3moe, Mixtral
/// and gpt-oss (its down biases in the sum), 32 decode steps after prompts
/// of 1 and 17 tokens (the output GEMV takes the last fold where packed).
#[test]
#[ignore = "needs a GPU"]
fn synth_moe_folded_norm_gpu_matches_cpu() {
    gpu_device("synth_moe_folded_norm_gpu_matches_cpu");
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (shape, ty) in [
        ("qwen3moe-tiny", FileType::All(GgmlType::Q8_0)),
        ("mixtral-tiny", FileType::Q4KM),
        ("gpt-oss-tiny", FileType::Mxfp4Moe),
    ] {
        let model = synth(dir.path(), shape, ty);
        let opts = GpuOptions {
            fold_moe_norm: true,
            ..Default::default()
        };
        let what = format!("{shape} {ty} folded");
        failures.extend(check_synth(&model, &what, &[1, 17], 32, opts));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// granite: embedding, score, residual and logit multipliers (the residual
/// branches leave the folded one-token path for the scaled one).
#[test]
#[ignore = "needs a GPU"]
fn synth_granite_gpu_matches_cpu() {
    gpu_device("synth_granite_gpu_matches_cpu");
    let types = [
        FileType::All(GgmlType::F16),
        FileType::All(GgmlType::Q8_0),
        FileType::All(GgmlType::Q4_K),
    ];
    check_shape("granite-tiny", &types, &[1, 5, 17, 100], 32);
}

/// mistral3: YaRN's frequencies and magnitude scale, and the attention
/// temperature (from position 8: every prompt past 8 tokens and every
/// decode step after the first prompt's 8th token), one sequence at a time.
#[test]
#[ignore = "needs a GPU"]
fn synth_mistral3_gpu_matches_cpu() {
    gpu_device("synth_mistral3_gpu_matches_cpu");
    let types = [
        FileType::All(GgmlType::F32),
        FileType::All(GgmlType::Q8_0),
        FileType::All(GgmlType::Q4_0),
    ];
    check_shape("mistral3-tiny", &types, &[1, 5, 17, 100], 32);
}

/// smollm3: every fourth layer without RoPE (layer 3 of 4): the identity
/// table in the RoPE-and-append kernels and in the one-token GEMVs that
/// rotate and append (packed Q4_0), beside rotating layers.
#[test]
#[ignore = "needs a GPU"]
fn synth_smollm3_gpu_matches_cpu() {
    gpu_device("synth_smollm3_gpu_matches_cpu");
    let types = [
        FileType::All(GgmlType::F32),
        FileType::All(GgmlType::Q8_0),
        FileType::All(GgmlType::Q4_0),
    ];
    check_shape("smollm3-tiny", &types, &[1, 5, 17, 100], 32);
}

/// phi3: the fused Q/K/V and gate/up read as their parts (row ranges of
/// one upload), NeoX RoPE with LongRoPE's factors and its magnitude scale
/// in the RoPE kernels (not in the one-token GEMVs: the launch apart).
#[test]
#[ignore = "needs a GPU"]
fn synth_phi3_gpu_matches_cpu() {
    gpu_device("synth_phi3_gpu_matches_cpu");
    let types = [
        FileType::All(GgmlType::F16),
        FileType::All(GgmlType::Q8_0),
        FileType::Q4KM,
    ];
    check_shape("phi3-tiny", &types, &[1, 5, 17, 100], 32);
}

/// gpt-oss: Q/K/V and output biases, attention sinks in every attention
/// kernel (prefill tiles, decode, key splits), a window on layer 0, YaRN,
/// experts with biases and the clamped SwiGLU; MXFP4 experts (the
/// experts' GEMV by id) and MXFP4 everywhere (the GEMV of GGUF rows and
/// the GEMM over 17-byte blocks at odd addresses).
#[test]
#[ignore = "needs a GPU"]
fn synth_gpt_oss_gpu_matches_cpu() {
    gpu_device("synth_gpt_oss_gpu_matches_cpu");
    let types = [
        FileType::All(GgmlType::F32),
        FileType::Mxfp4Moe,
        FileType::All(GgmlType::MXFP4),
    ];
    check_shape("gpt-oss-tiny", &types, &[1, 5, 17, 100], 32);
}

/// command-r: LayerNorm everywhere (the norm kernels' LayerNorm forms, the
/// norms never folded into the GEMVs), attention and FFN in parallel from
/// one norm, the tied output times logit_scale; Command-R+'s per-head Q/K
/// LayerNorms (weights per head) at 64 layers; Q4_K_M as published.
#[test]
#[ignore = "needs a GPU"]
fn synth_command_r_gpu_matches_cpu() {
    gpu_device("synth_command_r_gpu_matches_cpu");
    let types = [
        FileType::All(GgmlType::F32),
        FileType::Q4KM,
        FileType::All(GgmlType::Q8_0),
    ];
    check_shape("command-r-tiny", &types, &[1, 5, 17, 100], 32);
    check_shape("command-r-plus-tiny", &types[..1], &[1, 17], 8);
}

/// The persistent decode kernel (`GpuOptions::persistent`) gives the
/// logits of the launch-per-kernel graph: SmolLM2's shape (3 query heads
/// per KV head, head dim 64) in Q4_0, Q8_0, F16, MXFP4 (every op in the
/// program) and Q4_K (its Q5_0 matrices have no packed GEMV: the program
/// is cut around their launches), over 48 decode steps after prompts of 40 tokens
/// (the 512-key graph bucket) and 600 (the 1024-key one: more key splits).
#[test]
#[ignore = "needs a GPU"]
fn persistent_decode_matches_kernel_by_kernel() {
    gpu_device("persistent_decode_matches_kernel_by_kernel");
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::F16,
        GgmlType::MXFP4,
        GgmlType::Q4_K,
    ] {
        let model = synth(dir.path(), "smollm2-135m", ty);
        let what = format!("{ty}: persistent vs per kernel");
        let set = |o: &mut GpuOptions, on| o.persistent = on;
        failures.extend(decode_agreement(&model, set, &[40, 600], 5, &what));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Two backends over `model`, `set` switching an option off in `a` (the
/// reference) and on in `b`, decode 48 greedy steps (`a`'s choices) after
/// each of `prompts` (random tokens from `seed`): the worst relative error
/// of `b`'s logits must stay within 1e-4 and the argmax agree wherever
/// `a`'s top two are not nearly tied. Returns the failures.
fn decode_agreement(
    model: &Arc<Model>,
    set: impl Fn(&mut GpuOptions, bool),
    prompts: &[usize],
    seed: u64,
    what: &str,
) -> Vec<String> {
    let opts = |on| {
        let mut o = GpuOptions {
            kv_tokens: 1024,
            max_batch: 512,
            ..Default::default()
        };
        set(&mut o, on);
        o
    };
    let (a, b) = (gpu_with(model, opts(false)), gpu_with(model, opts(true)));
    let mut failures = Vec::new();
    let n_vocab = a.hparams().n_vocab;
    for &prompt in prompts {
        let toks = tokens(prompt, n_vocab, seed);
        let (mut ca, mut cb) = (a.new_cache(700).unwrap(), b.new_cache(700).unwrap());
        let mut la = a.forward(&mut ca, &toks, Logits::Last).unwrap();
        b.forward(&mut cb, &toks, Logits::Last).unwrap();
        let (mut worst, mut agree) = (0.0f64, 0);
        for _ in 0..48 {
            let t = argmax(&la);
            la = a.forward(&mut ca, &[t], Logits::Last).unwrap();
            let lb = b.forward(&mut cb, &[t], Logits::Last).unwrap();
            let e = rel_err(&lb, &la);
            worst = if e.is_nan() {
                f64::INFINITY
            } else {
                worst.max(e)
            };
            agree += (argmax(&lb) == argmax(&la) || margin(&la) < 1e-3) as usize;
        }
        println!("{what}, prompt {prompt}: worst rel err {worst:.2e} over 48 steps, argmax agrees {agree}/48");
        if worst > 1e-4 || agree != 48 {
            failures.push(format!(
                "{what}, prompt {prompt}: rel err {worst:.2e}, argmax {agree}/48"
            ));
        }
    }
    failures
}

/// One-token steps' attention in the decode kernel (`attn_dec_f32_*`, the
/// default) gives the warp kernel's logits (`decode_attention: false`):
/// SmolLM2's shape (3 query heads a KV head, head dimension 64), 48 decode
/// steps after prompts of 40 tokens (no split: a block a query head), 240
/// (crossing 256 keys, where the decode kernel starts to split) and 600
/// (split, with the combine).
#[test]
#[ignore = "needs a GPU"]
fn decode_attention_kernel_matches_warp_kernel() {
    gpu_device("decode_attention_kernel_matches_warp_kernel");
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for ty in [GgmlType::Q8_0, GgmlType::F16] {
        let model = synth(dir.path(), "smollm2-135m", ty);
        let what = format!("{ty}: decode vs warp attention kernel");
        let set = |o: &mut GpuOptions, on| o.decode_attention = on;
        failures.extend(decode_agreement(&model, set, &[40, 240, 600], 7, &what));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs a GPU and minutes (run.sh: M40_GPU_LARGE=1)"]
fn synth_1b_shape_gpu_matches_cpu() {
    gpu_device("synth_1b_shape_gpu_matches_cpu");
    let mut types = SYNTH_TYPES.to_vec();
    types.push(FileType::Q4KM);
    check_shape("llama-1b", &types, &[1, 5, 17, 512, 2048], 64);
}

/// The 8B shape, shorter (the CPU reference takes ~1 s a token there).
#[test]
#[ignore = "needs a GPU and minutes (run.sh: M40_GPU_LARGE=1)"]
fn synth_8b_shape_gpu_matches_cpu() {
    gpu_device("synth_8b_shape_gpu_matches_cpu");
    let types = match std::env::var("M40_GPU_8B_TYPES") {
        Ok(v) => v
            .split(',')
            .map(|t| FileType::parse(t).expect("M40_GPU_8B_TYPES: unknown type"))
            .collect(),
        Err(_) => SYNTH_TYPES.to_vec(),
    };
    check_shape("llama-8b", &types, &[1, 17], 16);
}

/// Sequences that grow over many pages, interleaved, freed, truncated and
/// reused give the CPU's (contiguous cache) logits; a full pool and a full
/// context are errors, and a failed forward leaves the cache as it was.
#[test]
#[ignore = "needs a GPU"]
fn paged_kv_cache_interleaved_freed_and_reused() {
    gpu_device("paged_kv_cache_interleaved_freed_and_reused");
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny", GgmlType::Q8_0);
    let cpu = CpuBackend::new(model.clone()).unwrap();
    let n_vocab = cpu.hparams().n_vocab;
    // 16 pages of 32 tokens.
    let g = gpu(&model, 512, 64);
    assert_eq!(g.kv_pages(), (16, 16));
    // The same ops on a CPU cache and a GPU cache, logits compared.
    struct Pair {
        c: m40_model::cpu::CpuCache,
        g: m40_model::gpu::GpuCache,
    }
    let step = |p: &mut Pair, toks: &[u32], what: &str| {
        let want = cpu.forward(&mut p.c, toks, Logits::All).unwrap();
        let got = g.forward(&mut p.g, toks, Logits::All).unwrap();
        let (worst, bad) = compare_rows(&got, &want, n_vocab);
        assert!(bad.is_empty(), "{what}: worst {worst:.2e} at {bad:?}");
        assert_eq!(p.g.len(), p.c.len());
    };
    let new = |n| Pair {
        c: cpu.new_cache(n).unwrap(),
        g: g.new_cache(n).unwrap(),
    };
    let mut a = new(400);
    let mut b = new(400);
    step(&mut a, &tokens(40, n_vocab, 1), "a 40");
    step(&mut b, &tokens(70, n_vocab, 2), "b 70");
    step(&mut a, &tokens(30, n_vocab, 3), "a +30");
    for (i, t) in tokens(10, n_vocab, 4).into_iter().enumerate() {
        step(&mut a, &[t], &format!("a decode {i}"));
        step(&mut b, &[t], &format!("b decode {i}"));
    }
    // a: 80 tokens (3 pages), b: 80 tokens (3 pages).
    assert_eq!(g.kv_pages().1, 10);
    drop(b);
    assert_eq!(g.kv_pages().1, 13);
    // c reuses b's pages (taken last-freed first), grows past many pages.
    let mut c = new(600);
    step(&mut c, &tokens(100, n_vocab, 5), "c 100");
    step(&mut c, &tokens(150, n_vocab, 6), "c +150");
    // Truncate a into its second page and continue differently.
    a.c.truncate(50);
    a.g.truncate(50);
    assert_eq!(a.g.pages().len(), 2);
    step(&mut a, &tokens(33, n_vocab, 7), "a truncated to 50, +33");
    // The pool: a 3 pages, c 8 pages: 5 free. 200 tokens more for c (7
    // pages) fail cleanly, and c is unchanged.
    assert_eq!(g.kv_pages().1, 5);
    let before = c.g.len();
    let err = g
        .forward(&mut c.g, &tokens(200, n_vocab, 8), Logits::Last)
        .unwrap_err();
    assert!(matches!(err, ModelError::KvFull { .. }), "{err}");
    assert!(err.to_string().contains("KV cache is full"), "{err}");
    assert_eq!(c.g.len(), before);
    step(&mut c, &tokens(20, n_vocab, 9), "c after a failed forward");
    // The context limit.
    let mut d = g.new_cache(10).unwrap();
    let err = g
        .forward(&mut d, &tokens(11, n_vocab, 10), Logits::Last)
        .unwrap_err();
    assert!(matches!(err, ModelError::ContextFull { .. }), "{err}");
    // A bad token id is an error, not NaNs.
    let err = g
        .forward(&mut d, &[n_vocab as u32], Logits::Last)
        .unwrap_err();
    assert!(matches!(err, ModelError::BadToken { .. }), "{err}");
    assert_eq!(d.len(), 0);
}

/// Sequences that share a prefix's pages (`GpuCache::share_prefix`) give
/// the CPU's logits for their own continuations, the sequence they share
/// with is unchanged by them, and a truncation into a shared page copies
/// it before writing (`GpuCache::unshare_tail`).
#[test]
#[ignore = "needs a GPU"]
fn shared_prefix_pages_give_the_same_logits() {
    gpu_device("shared_prefix_pages_give_the_same_logits");
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny", GgmlType::Q4_0);
    let cpu = CpuBackend::new(model.clone()).unwrap();
    let n_vocab = cpu.hparams().n_vocab;
    let g = gpu(&model, 512, 64);
    let pool = g.page_pool().clone();
    let check = |gc: &mut m40_model::gpu::GpuCache,
                 cc: &mut m40_model::cpu::CpuCache,
                 toks: &[u32],
                 what: &str| {
        let want = cpu.forward(cc, toks, Logits::All).unwrap();
        let got = g.forward(gc, toks, Logits::All).unwrap();
        let (worst, bad) = compare_rows(&got, &want, n_vocab);
        assert!(bad.is_empty(), "{what}: worst {worst:.2e} at {bad:?}");
    };
    let prefix = tokens(70, n_vocab, 11);
    let (mut ga, mut ca) = (g.new_cache(400).unwrap(), cpu.new_cache(400).unwrap());
    check(&mut ga, &mut ca, &prefix, "a 70");
    // b shares a's first two pages (64 tokens), then goes its own way.
    let mut gb = ga.share_prefix(70, 400);
    assert_eq!((gb.len(), gb.pages()), (64, &ga.pages()[..2]));
    assert!(gb.pages().iter().all(|&p| pool.holders(p) == 2));
    let mut cb = cpu.new_cache(400).unwrap();
    cpu.forward(&mut cb, &prefix[..64], Logits::None).unwrap();
    check(
        &mut gb,
        &mut cb,
        &tokens(40, n_vocab, 12),
        "b: shared 64 + 40",
    );
    for (i, t) in tokens(5, n_vocab, 13).into_iter().enumerate() {
        check(&mut gb, &mut cb, &[t], &format!("b decode {i}"));
        check(&mut ga, &mut ca, &[t], &format!("a decode {i}"));
    }
    // b back into its second (shared) page: it takes a copy and writes
    // there; a, which still reads that page, is unchanged.
    let shared = gb.pages()[1];
    gb.truncate(50);
    cb.truncate(50);
    check(
        &mut gb,
        &mut cb,
        &tokens(20, n_vocab, 14),
        "b truncated to 50, +20",
    );
    assert_ne!(gb.pages()[1], shared, "b copied the shared page");
    assert_eq!(pool.holders(shared), 1);
    check(
        &mut ga,
        &mut ca,
        &tokens(3, n_vocab, 15),
        "a after b's copy",
    );
    let free = pool.free_pages();
    drop(gb);
    assert!(pool.free_pages() > free);
    assert!(ga.pages().iter().all(|&p| pool.holders(p) == 1));
}

/// `forward_select` keeps the logits on the GPU and returns the k best after
/// the penalties: the same ids and (bit for bit) logits as applying the
/// penalties and sorting the logits `forward` returns for the same tokens,
/// for a prompt and for decode steps on the graph and off it.
#[test]
#[ignore = "needs a GPU"]
fn forward_select_equals_selecting_from_logits() {
    gpu_device("forward_select_equals_selecting_from_logits");
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "smollm2-135m", GgmlType::Q4_0);
    let g = gpu(&model, 512, 64);
    let n_vocab = g.hparams().n_vocab;
    assert_eq!(g.select_max_k(), 1024);
    let prompt = tokens(40, n_vocab, 11);
    let mut cases = 0;
    for graphs in [true, false] {
        g.set_graphs(graphs);
        for (k, pen) in [
            (1, vec![]),
            (40, vec![]),
            (1024, vec![(prompt[0], 2), (prompt[5], 1), (7, 3)]),
            (1, vec![(prompt[1], 1)]),
        ] {
            let sel = m40_model::Selection {
                k,
                penalties: pen.clone(),
                repeat: 1.3,
                frequency: 0.2,
                presence: 0.1,
                mask: None,
            };
            let (mut a, mut b) = (g.new_cache(128).unwrap(), g.new_cache(128).unwrap());
            let mut next = prompt.clone();
            for step in 0..4 {
                let mut l = g.forward(&mut a, &next, Logits::Last).unwrap();
                let top = g.forward_select(&mut b, &next, &sel).unwrap();
                for &(id, c) in &pen {
                    let v = &mut l[id as usize];
                    *v = if *v > 0.0 {
                        *v / sel.repeat
                    } else {
                        *v * sel.repeat
                    };
                    *v -= c as f32 * sel.frequency + sel.presence;
                }
                let mut idx: Vec<u32> = (0..n_vocab as u32).collect();
                idx.sort_by(|&x, &y| l[y as usize].total_cmp(&l[x as usize]).then(x.cmp(&y)));
                let want: Vec<(u32, u32)> = idx[..k]
                    .iter()
                    .map(|&i| (i, l[i as usize].to_bits()))
                    .collect();
                let got: Vec<(u32, u32)> = top.iter().map(|&(i, v)| (i, v.to_bits())).collect();
                assert_eq!(got, want, "k {k} graphs {graphs} step {step}");
                assert_eq!(a.len(), b.len());
                next = vec![top[0].0];
                cases += 1;
            }
        }
    }
    eprintln!("forward_select: {cases} steps equal to selecting from the logits");
}
