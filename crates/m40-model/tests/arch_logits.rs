//! The CPU engine against llama.cpp on each architecture's tiny synthetic
//! model: `m40-llm synth` writes it (seed 0), and llama.cpp's logits for the
//! same file at every position of a 16-token sequence are committed in
//! tests/data (scripts/arch-references.sh made them: llama.cpp from the PyPI
//! sdist of llama-cpp-python, CPU). Here the test writes the same model
//! again, byte for byte, and compares.

use std::sync::Arc;

use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
use m40_gguf::GgmlType;
use m40_model::cpu::CpuBackend;
use m40_model::{Backend, Model};
use serde_json::Value;

mod reference;

/// ||ours - llama.cpp|| / ||llama.cpp|| over each position's logits, at most.
/// llama.cpp rounds F16 models' activations to F16 before each matmul.
/// Quantized files (gpt-oss's MXFP4 experts, Q8_0 elsewhere): llama.cpp
/// rounds the activations to 8 bits per block before those matmuls.
fn tolerance(ty: FileType) -> f64 {
    match ty {
        FileType::All(GgmlType::F32) => 1e-3,
        FileType::All(GgmlType::F16) => 5e-3,
        _ => 3e-2,
    }
}

/// The CPU engine's logits against `llamacpp-{shape}-{ty}{suffix}.json`,
/// the model run with the reference's context (llama.cpp's driver records
/// it; 64 where it does not).
fn check_file(shape: &str, ty: impl Into<FileType>, suffix: &str) {
    let ty = ty.into();
    let path = format!(
        "{}/tests/data/llamacpp-{shape}-{}{suffix}.json",
        env!("CARGO_MANIFEST_DIR"),
        ty.name()
    );
    let reference: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let tokens = reference::token_ids(&reference);
    let opts = SynthOptions {
        shape: Shape::find(shape).unwrap(),
        ty,
        seed: 0,
    };
    let bytes = write_model(Vec::new(), &opts, |_, _| {}).unwrap();
    let file = m40_gguf::GgufFile::from_bytes(bytes).unwrap();
    let n_ctx = reference["n_ctx"].as_u64().unwrap_or(64) as usize;
    let model = Arc::new(Model::from_file(file).unwrap().with_context(n_ctx));
    let cpu = CpuBackend::new(model).unwrap();
    let n_vocab = cpu.hparams().n_vocab;
    assert_eq!(reference["n_vocab"].as_u64(), Some(n_vocab as u64));
    // The whole sequence at once, and one token at a time.
    let [all, one_by_one] = reference::all_and_one_by_one(&cpu, &tokens);
    let mut worst = 0f64;
    for (pos, want) in reference["logits"].as_array().unwrap().iter().enumerate() {
        let want = reference::row(want);
        for got in [&all, &one_by_one] {
            let got = &got[pos * n_vocab..(pos + 1) * n_vocab];
            worst = worst.max(reference::rel_err(got, want.iter().copied(), &want));
        }
    }
    eprintln!("{shape} {ty}{suffix}: worst relative error {worst:.2e}");
    assert!(worst <= tolerance(ty), "{shape} {ty}{suffix}: {worst:.2e}");
}
// What each architecture's references exercise:
// gemma2: Soft-capped scores and logits, GeGLU, post-norms, a sliding window of 5 keys on
//   layer 0 (of 2), scaled embeddings.
// gemma3: Gemma 2's layers with head norms: two window layers (RoPE base 10,000, unscaled) and
//   one global (base 1e6, positions / 8).
// granite: Granite's multipliers: embeddings x 12, scores x 1/64 (not 1/8), each residual
//   branch x 0.22, logits / 8.
// mistral3: YaRN (factor 16 over 8 positions, the file's betas and log multiplier:
//   the ramp over pairs 0-25 and the magnitude scale 1.1218) and the attention temperature,
//   which scales positions 8-15's queries.
// phi3: Q/K/V and gate/up each one matrix in the file, NeoX RoPE, LongRoPE's short
//   factors at a context of 64 (within its original context of 256) and its long ones at 512,
//   its attention factor 1.2.
// qwen3moe: 8 experts, 3 a token (each token's router, softmax, top 3 renormalized),
//   Qwen3's attention.
// mixtral: a llama file with 4 experts, 2 a token.
// gpt-oss: Q/K/V and output biases, a sink per head, layer 0 through a window of 5
//   keys, YaRN, 8 experts (3 a token) with biases, the router's softmax over the chosen, the
//   clamped SwiGLU; and its published format, MXFP4 experts.
// command-r: LayerNorm, attention and FFN in parallel from one norm, the tied
//   output times logit_scale (1/16); at 64 layers (Command-R+'s) a LayerNorm over each query and
//   key head with weights per head.

/// The committed references: (shape, file type, suffix) from each
/// `llamacpp-{shape}-{type}{suffix}.json` in tests/data (the suffix a
/// context, `-ctx512`).
fn references() -> Vec<(String, FileType, String)> {
    let dir = format!("{}/tests/data", env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        let Some(stem) = name
            .strip_prefix("llamacpp-")
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let (stem, suffix) = match stem.rfind("-ctx") {
            Some(at) => (&stem[..at], &stem[at..]),
            None => (stem, ""),
        };
        let at = stem.rfind('-').unwrap();
        let ty = FileType::parse(&stem[at + 1..]).unwrap_or_else(|| panic!("{name}: its type"));
        out.push((stem[..at].to_string(), ty, suffix.to_string()));
    }
    out.sort_by_key(|(s, t, x)| (s.clone(), t.name(), x.clone()));
    out
}

/// Every committed reference, each architecture's tiny shapes in each type
/// llama.cpp ran them (the list is the data directory: a reference is
/// tested by being committed).
#[test]
fn every_reference_matches_llama_cpp() {
    let refs = references();
    assert!(refs.len() >= 20, "{refs:?}");
    for (shape, ty, suffix) in refs {
        check_file(&shape, ty, &suffix);
    }
}

/// Every architecture m40-llm runs (`Arch::ALL`) has llama.cpp logits
/// here, or is checked against llama.cpp elsewhere, said below.
#[test]
fn every_architecture_is_checked_against_llama_cpp() {
    use m40_gguf::hparams::Arch;
    let elsewhere = [
        // Encoders: pooled vectors against llama.cpp's (tests/embeddings.rs).
        (Arch::Bert, "tests/embeddings.rs"),
        (Arch::NomicBert, "tests/embeddings.rs"),
    ];
    let refs = references();
    for arch in Arch::ALL {
        let here = refs
            .iter()
            .any(|(s, _, _)| Shape::find(s).is_some_and(|sh| sh.arch == arch));
        let other = elsewhere.iter().any(|(a, _)| *a == arch);
        assert!(here || other, "{}: no llama.cpp reference", arch.name());
        assert!(
            !(here && other),
            "{}: listed as checked elsewhere",
            arch.name()
        );
    }
}
