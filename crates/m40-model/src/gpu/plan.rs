//! The GPU backend's memory plan: what a model's weights, a KV pool and
//! the workspace take ([`memory_needed`]), the largest pool that fits a
//! limit, what to say when nothing fits, and a step's default size.

use m40_gguf::hparams::TOKEN_EMBD;
use m40_gguf::HyperParams;
use m40_kernels::{AttnPlan, GemmSlots};

use super::forward::attn_shape;
use super::tuning::{GEMM_SHARE, KV_FIT_HEADROOM, MIN_STEP_TOKENS, STEP_TARGET_S};
use super::weights::device_bytes;
use super::workspace::Workspace;
use super::{GpuOptions, KV_PAGE};
use crate::placement::Costs;
use crate::span::layer_of;
use crate::{KvLayout, Model, Span};

pub(super) fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// Device memory a [`GpuBackend`] for `span` of `model` with `opts` and a
/// KV pool of `kv_tokens` allocates on `gpu` (its GEMM slots size the
/// split-K scratch), bytes: (weights, KV pool, workspace).
pub(crate) fn memory_needed(
    model: &Model,
    opts: &GpuOptions,
    span: &Span,
    gpu: GemmSlots,
    sm_count: usize,
    kv_tokens: usize,
) -> (u64, u64, u64) {
    let hp = model.hparams();
    let file = model.file();
    let weights: u64 = hp
        .expected_tensors()
        .iter()
        .filter(|(name, _)| span.holds(name, hp))
        .filter_map(|(name, _)| file.tensor_info(name))
        .map(|t| uploaded_bytes(opts, hp, t))
        .sum::<u64>()
        + file
            .tensor_info("rope_freqs.weight")
            .map_or(0, |t| t.n_bytes);
    let layout = KvLayout::new(hp, KV_PAGE, opts.kv_format).of_layers(span.len());
    let pages = layout.pages_for(kv_tokens);
    let kv = layout.pool_bytes(pages);
    let (part, ml) = dec_scratch(hp, pages.max(1), sm_count, opts.decode_attention);
    let work = Workspace::bytes(hp, opts.max_batch.max(1), pages, gpu) + 4 * (part + ml) as u64;
    (weights, kv, work)
}

/// What tensor `t` takes on the device: `device_bytes`, but an untied
/// token embedding, which is only gathered and stays in GGUF rows.
fn uploaded_bytes(opts: &GpuOptions, hp: &HyperParams, t: &m40_gguf::TensorInfo) -> u64 {
    match t.name == TOKEN_EMBD && !hp.tied_output {
        true => t.n_bytes,
        false => device_bytes(opts, hp, t),
    }
}

/// The attention scratch of a one-token step at the last position of a
/// pool of `n_pages`: the most any decode graph's plan needs, so captures
/// never reallocate it (see `Workspace::scratch`).
pub(super) fn dec_scratch(
    hp: &HyperParams,
    n_pages: usize,
    sm_count: usize,
    decode_attention: bool,
) -> (usize, usize) {
    let full = attn_shape(hp, 1, n_pages * KV_PAGE - 1);
    AttnPlan::choose(&full, sm_count, decode_attention).scratch_len(&full)
}

/// The largest KV pool, in whole pages and at most `asked` tokens, whose
/// total memory (`total(tokens)`, growing with tokens) is within `limit`;
/// 0 when not even one page fits.
pub(super) fn max_kv_tokens(asked: usize, limit: u64, total: impl Fn(usize) -> u64) -> usize {
    let (mut lo, mut hi) = (0, asked.div_ceil(KV_PAGE));
    // Invariant: lo pages fit (0 trivially); more than hi do not matter.
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if total(mid * KV_PAGE) <= limit {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo * KV_PAGE
}

/// The KV pool's tokens for `asked` within `limit` bytes in all
/// (`total(tokens)`): `asked` where it fits, else, where `min` is given,
/// the whole pages that fit `limit` less [`KV_FIT_HEADROOM`] if they are
/// at least `min` tokens; `Err(tokens that would fit)` when it cannot be
/// had.
pub(super) fn kv_pool_tokens(
    asked: usize,
    min: Option<usize>,
    limit: u64,
    total: impl Fn(usize) -> u64,
) -> std::result::Result<usize, usize> {
    if total(asked) <= limit {
        return Ok(asked);
    }
    match min {
        Some(min) => {
            let fits = max_kv_tokens(asked, limit.saturating_sub(KV_FIT_HEADROOM), total);
            if fits > 0 && fits >= min {
                Ok(fits)
            } else {
                Err(fits)
            }
        }
        None => Err(max_kv_tokens(asked, limit, total)),
    }
}

/// The default tokens of a batched step (`Backend::step_tokens`): the
/// largest power of two whose rows take at most STEP_TARGET_S at
/// GEMM_SHARE of `peak_flops`, `flops_per_token` each, within
/// MIN_STEP_TOKENS..=`max_step`. On an H100 or H200 that is 512 (the
/// workspace's most) up to 8B models; on an M40 (6.8 TFLOP/s), 512 for
/// SmolLM2, 256 for a 1B model and 128 for an 8B one, whose 512-token
/// steps would hold running streams back ~2.4 s.
pub fn default_step_tokens(peak_flops: f64, flops_per_token: f64, max_step: usize) -> usize {
    let fits = (peak_flops * GEMM_SHARE * STEP_TARGET_S / flops_per_token.max(1.0)) as usize;
    let pow2 = match fits {
        0 => 0,
        n => 1 << (usize::BITS - 1 - n.leading_zeros()),
    };
    pow2.clamp(MIN_STEP_TOKENS.min(max_step), max_step)
}

/// A token's FLOPs in `model`'s matrices (two a weight it multiplies):
/// every matrix but a token embedding that is only gathered, the experts'
/// scaled to the share a token uses.
pub(super) fn flops_per_token(model: &Model) -> f64 {
    let hp = model.hparams();
    let expert_share = hp
        .moe
        .map_or(1.0, |m| m.n_expert_used as f64 / m.n_expert.max(1) as f64);
    model
        .file()
        .tensors()
        .iter()
        .filter(|t| t.shape.len() >= 2 && (t.name != TOKEN_EMBD || hp.tied_output))
        .map(|t| {
            let share = if t.name.contains("_exps") {
                expert_share
            } else {
                1.0
            };
            2.0 * t.n_elements() as f64 * share
        })
        .sum()
}

/// What to do about a model that does not fit: the KV pool that would fit
/// (`fits` tokens, of `asked`), or, when none does, the weights' size.
pub(super) fn fit_hint(fits: usize, asked: usize, weights: u64) -> String {
    if fits == 0 {
        format!(
            "not even one {KV_PAGE}-token page of KV cache fits beside the {} of weights: use a smaller quantization, or run on the CPU",
            gib(weights)
        )
    } else {
        format!(
            "a KV cache of {fits} tokens fits (of the {asked} asked): use a context of at most {fits} tokens (fewer parallel sequences), a smaller quantization, or run on the CPU"
        )
    }
}

/// GEMM slots for a plan made before any kernel is loaded (the placement
/// planner's): generous, so the split-K scratch it counts is no less than
/// the backend's (whose own plan, made with the loaded kernels', decides).
fn estimated_slots(sms: usize) -> GemmSlots {
    GemmSlots {
        sms,
        per_sm: 4,
        small_per_sm: 8,
        narrow_per_sm: 8,
        rows_per_sm: 8,
    }
}

/// What `model`'s parts take on a GPU of `sm_count` SMs with `opts`, a pool
/// of up to `kv_tokens` (the placement planner's costs: a stage's
/// workspace is counted at that pool, the most it holds).
pub fn costs(model: &Model, opts: &GpuOptions, sm_count: usize, kv_tokens: usize) -> Costs {
    let hp = model.hparams();
    let file = model.file();
    let mut c = Costs {
        layers: vec![0; hp.n_layer],
        kv_token: 0,
        first: 0,
        last: 0,
        fixed: file
            .tensor_info("rope_freqs.weight")
            .map_or(0, |t| t.n_bytes),
        both: 0,
    };
    for (name, _) in hp.expected_tensors() {
        let Some(t) = file.tensor_info(&name) else {
            continue;
        };
        let bytes = uploaded_bytes(opts, hp, t);
        match (layer_of(&name), name.as_str()) {
            (Some(l), _) => c.layers[l] += bytes,
            (None, TOKEN_EMBD) if !hp.tied_output => c.first += bytes,
            // The embedding is the output too: with both ends.
            (None, TOKEN_EMBD) => {
                c.first += bytes;
                c.last += bytes;
                c.both += bytes;
            }
            (None, _) => c.last += bytes,
        }
    }
    c.kv_token = KvLayout::new(hp, KV_PAGE, opts.kv_format)
        .of_layers(1)
        .token_bytes();
    let pages = KvLayout::new(hp, KV_PAGE, opts.kv_format).pages_for(kv_tokens);
    let (part, ml) = dec_scratch(hp, pages.max(1), sm_count, opts.decode_attention);
    let slots = estimated_slots(sm_count);
    c.fixed += Workspace::bytes(hp, opts.max_batch.max(1), pages, slots) + 4 * (part + ml) as u64;
    c
}
