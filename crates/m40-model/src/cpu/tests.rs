//! The CPU backend's unit tests.

use super::*;
use m40_gguf::hparams::{Activation, Arch, RopeScaling, RopeStyle};

/// An 8B-like shape: 32 layers, 8 KV heads of 128 (128 KiB a token).
fn hp() -> HyperParams {
    HyperParams {
        arch: Arch::Llama,
        n_layer: 32,
        n_embd: 4096,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 14336,
        n_vocab: 128256,
        n_ctx_train: 131072,
        n_ctx_orig: 131072,
        rope_freq_base: 500000.0,
        rope_dim: 128,
        rope_style: RopeStyle::Normal,
        rope_scaling: RopeScaling::None,
        rms_eps: 1e-5,
        tied_output: false,
        qkv_bias: false,
        qk_norm: false,
        act: Activation::Silu,
        embd_scale: 1.0,
        attn_scale: 128f32.powf(-0.5),
        attn_softcap: None,
        final_softcap: None,
        post_norms: false,
        sliding_window: None,
        residual_scale: 1.0,
        logit_scale: 1.0,
        norm: m40_gguf::NormKind::Rms,
        parallel: false,
        moe: None,
        attn_temp: None,
        rope_attn_factor: 1.0,
        out_bias: false,
        attn_sinks: false,
        causal: true,
        encoder: None,
        pooling: None,
    }
}

#[test]
fn memory_is_counted_and_checked_before_allocation() {
    let hp = hp();
    let (kv, act) = memory_needed(&hp, 4096, 512);
    assert_eq!(kv, 4096 * 128 * 1024);
    assert!(act > 0);
    // Far beyond any machine: an error that says what would fit.
    let e = check_memory(&hp, 1 << 40, 512).unwrap_err().to_string();
    assert!(e.contains("KV cache of 1099511627776 tokens"), "{e}");
    assert!(
        e.contains("use a context (and --kv-tokens) of at most") || e.contains("free some memory"),
        "{e}"
    );
    if let Some(avail) = crate::host::available_memory() {
        if avail > 1 << 30 {
            check_memory(&hp, 1024, 16).unwrap();
        }
    }
}

/// Batch invariance of the matmuls: each token's row of a product
/// over n tokens is bitwise its product alone, for every format with a
/// kernel of its own and by both maths, on fresh inputs.
#[test]
fn a_tokens_product_is_the_same_alone_or_in_a_batch() {
    use m40_gguf::GgmlType;
    let seed = super::fresh_seed(7);
    let mut calls = 0;
    let mut values = |n: usize| -> Vec<f32> {
        calls += 1;
        super::test_values(n, seed.wrapping_add(calls))
    };
    let (rows, cols) = (70usize, 512usize);
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::MXFP4,
    ] {
        let file = matrix_file(ty, rows, cols, &values(rows * cols));
        let view = file.tensor("w").unwrap();
        for q8 in [false, true] {
            if q8 && !q8::supported(ty) {
                continue;
            }
            let mul = |x: &[f32], n: usize| {
                let mut out = vec![f32::NAN; n * rows];
                if q8 {
                    q8::matmul_q8(&view, x, n, &mut out);
                } else {
                    matmul(&view, x, n, &mut out).unwrap();
                }
                out
            };
            for n in [2usize, 3, 4, 5, 8, 9] {
                let x = values(n * cols);
                let all = mul(&x, n);
                for t in 0..n {
                    let alone = mul(&x[t * cols..(t + 1) * cols], 1);
                    for r in 0..rows {
                        assert_eq!(
                            all[t * rows + r].to_bits(),
                            alone[r].to_bits(),
                            "{ty} (8-bit inputs: {q8}) token {t} of {n}, row {r}: seed {seed}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn an_impossible_cache_is_an_error_not_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir, 1);
    for tokens in [usize::MAX / 2, 1 << 50] {
        let e = CpuBackend::with_kv(model.clone(), CpuMath::Exact, tokens)
            .err()
            .expect("no machine holds this");
        assert!(matches!(e, ModelError::HostMemory { .. }), "{e}");
    }
    let cpu = CpuBackend::with_kv(model.clone(), CpuMath::Exact, 64).unwrap();
    let (layout, pages) = cpu.kv_pool();
    assert_eq!((layout.page_tokens, pages), (PAGE_TOKENS, 64 / PAGE_TOKENS));
    assert_eq!(cpu.new_cache(64).unwrap().n_ctx(), 64);
    // A memory limit: what it reports must fit it; a byte less refuses.
    let total = cpu.memory().total();
    CpuBackend::within(
        model.clone(),
        CpuMath::Exact,
        64,
        KvFormat::F16,
        Some(total),
    )
    .unwrap();
    let e = CpuBackend::within(model, CpuMath::Exact, 64, KvFormat::F16, Some(total - 1))
        .err()
        .expect("a byte short");
    assert!(matches!(e, ModelError::HostMemory { .. }), "{e}");
}
