//! The optional parts of a model a file declares: its sliding window and
//! its mixture of experts.

use super::{bad, Arch, Moe, SlidingWindow};
use crate::error::Result;
use crate::metadata::{Array, Metadata, Value};

/// The sliding window of a gemma2/3 or gpt-oss file, as llama.cpp reads
/// it: `attention.sliding_window` (gemma2: 4096 when absent; gemma3: none
/// when absent or 0; gpt-oss: required) and
/// `attention.sliding_window_pattern`, a per-layer array of flags or a
/// period n (layers with l % n < n - 1 slide; gemma2 and gpt-oss 2,
/// gemma3 6). gpt-oss's window layers share the global RoPE (YaRN
/// included) unless `rope.freq_base_swa` says otherwise.
pub(super) fn sliding_window(
    md: &Metadata,
    arch: Arch,
    n_layer: usize,
    rope_freq_base: f32,
    rope_linear: f32,
) -> Result<Option<SlidingWindow>> {
    let a = arch.name();
    let key = |k: &str| format!("{a}.{k}");
    let (default_window, period, swa_base, swa_linear) = match arch {
        Arch::Gemma2 => (Some(4096), 2, rope_freq_base, rope_linear),
        Arch::Gemma3 => (None, 6, 10000.0, 1.0),
        Arch::GptOss => {
            if md.opt_usize(&key("attention.sliding_window"))?.is_none() {
                return Err(bad(format!("{a}.attention.sliding_window is missing")));
            }
            (None, 2, rope_freq_base, rope_linear)
        }
        _ => return Ok(None),
    };
    let window = match md.opt_usize(&key("attention.sliding_window"))? {
        Some(0) => None,
        Some(w) => Some(w),
        None => default_window,
    };
    let Some(window) = window else {
        return Ok(None);
    };
    let pattern_key = key("attention.sliding_window_pattern");
    let layers = match md.get(&pattern_key) {
        Some(Value::Array(Array::Bool(flags))) => {
            if flags.len() != n_layer {
                return Err(bad(format!(
                    "{pattern_key} has {} flags for {n_layer} layers",
                    flags.len()
                )));
            }
            flags.clone()
        }
        _ => {
            let n = md.opt_usize(&pattern_key)?.unwrap_or(period);
            (0..n_layer).map(|l| n == 0 || l % n < n - 1).collect()
        }
    };
    let rope_freq_base = md
        .opt_f64(&key("rope.freq_base_swa"))?
        .map_or(swa_base, |v| v as f32);
    Ok(Some(SlidingWindow {
        window,
        layers,
        rope_freq_base,
        rope_linear: swa_linear,
    }))
}

/// The mixture of experts of a file, as llama.cpp reads it:
/// `expert_count` (none: a dense FFN; qwen3moe must have experts),
/// `expert_used_count`, and the experts' FFN size (qwen3moe:
/// `expert_feed_forward_length`, else n_ff / used; llama: n_ff). Both run
/// with their expert weights renormalized and unscaled.
pub(super) fn moe(md: &Metadata, arch: Arch, n_ff: usize) -> Result<Option<Moe>> {
    let a = arch.name();
    let key = |k: &str| format!("{a}.{k}");
    let n_expert = md.opt_usize(&key("expert_count"))?.unwrap_or(0);
    if n_expert == 0 {
        if matches!(arch, Arch::Qwen3Moe | Arch::GptOss) {
            return Err(bad(format!("{a}.expert_count is missing or 0")));
        }
        return Ok(None);
    }
    if !matches!(
        arch,
        Arch::Llama | Arch::Qwen3Moe | Arch::Mistral3 | Arch::GptOss
    ) {
        return Err(bad(format!("{a} with experts is not supported")));
    }
    let used = md.opt_usize(&key("expert_used_count"))?.unwrap_or(0);
    if used == 0 || used > n_expert {
        return Err(bad(format!(
            "{used} experts used of {n_expert} (must be 1..={n_expert})"
        )));
    }
    let n_ff_exp = match arch {
        Arch::Qwen3Moe => md
            .opt_usize(&key("expert_feed_forward_length"))?
            .unwrap_or(n_ff / used),
        Arch::GptOss => md
            .opt_usize(&key("expert_feed_forward_length"))?
            .unwrap_or(n_ff),
        _ => n_ff,
    };
    if n_ff_exp == 0 {
        return Err(bad("experts with a zero FFN size".into()));
    }
    Ok(Some(Moe {
        n_expert,
        n_expert_used: used,
        n_ff_exp,
        bias: arch == Arch::GptOss,
    }))
}
