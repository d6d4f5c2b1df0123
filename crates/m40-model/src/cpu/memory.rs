//! The CPU backend's memory: what a KV cache and a step's activations
//! take, checked against the machine's before anything is allocated.

use m40_gguf::HyperParams;

use super::kv;
use crate::error::{ModelError, Result};
use crate::host::human_bytes;
use crate::KvFormat;

/// Host memory a [`CpuBackend`] of `hp` takes beyond its (memory-mapped)
/// weights, bytes: (a KV cache of `n_ctx` tokens in halves, the
/// activations of one forward of `batch` tokens with its logits).
pub fn memory_needed(hp: &HyperParams, n_ctx: usize, batch: usize) -> (u64, u64) {
    memory_needed_in(hp, n_ctx, batch, KvFormat::F16)
}

/// As [`memory_needed`], the KV cache in `format`.
pub fn memory_needed_in(
    hp: &HyperParams,
    n_ctx: usize,
    batch: usize,
    format: KvFormat,
) -> (u64, u64) {
    let kv = kv_bytes_per_token(hp, format).saturating_mul(n_ctx as u64);
    let (b, d, ff) = (batch as u64, hp.n_embd as u64, hp.n_ff as u64);
    let (q, kvd) = (
        (hp.n_head * hp.head_dim) as u64,
        (hp.n_head_kv * hp.head_dim) as u64,
    );
    // x, h, proj; q, att; k, v; gate, up; logits (f32).
    let act = 4 * b * (3 * d + 2 * q + 2 * kvd + 2 * ff + hp.n_vocab as u64);
    (kv, act)
}

/// The K and V of every layer for one token.
fn kv_bytes_per_token(hp: &HyperParams, format: KvFormat) -> u64 {
    crate::KvLayout::new(hp, kv::PAGE_TOKENS, format).token_bytes()
}

/// Checks that a KV cache of `n_ctx` tokens (over all sequences) and
/// forwards of `batch` tokens fit in the memory this machine has available
/// (where it can be read), before anything is allocated; the error says
/// what would fit.
pub fn check_memory(hp: &HyperParams, n_ctx: usize, batch: usize) -> Result<()> {
    check_memory_within(hp, n_ctx, batch, KvFormat::F16, None)
}

/// As [`check_memory`], the KV cache in `format`, within `room` bytes too
/// where given (what a memory limit leaves beside the weights).
pub fn check_memory_within(
    hp: &HyperParams,
    n_ctx: usize,
    batch: usize,
    format: KvFormat,
    room: Option<u64>,
) -> Result<()> {
    let available = match (crate::host::available_memory(), room) {
        (Some(a), Some(r)) => a.min(r),
        (a, r) => match a.or(r) {
            Some(x) => x,
            None => return Ok(()),
        },
    };
    let (kv, act) = memory_needed_in(hp, n_ctx, batch, format);
    if kv.saturating_add(act) <= available {
        return Ok(());
    }
    let fits = available.saturating_sub(act) / kv_bytes_per_token(hp, format).max(1);
    Err(ModelError::HostMemory {
        what: format!("a KV cache of {n_ctx} tokens (with the activations)"),
        need: format!(
            "{} ({} KV cache, {} activations)",
            human_bytes(kv.saturating_add(act)),
            human_bytes(kv),
            human_bytes(act)
        ),
        available: human_bytes(available),
        hint: if fits > 0 {
            format!("use a context (and --kv-tokens) of at most {fits} tokens")
        } else {
            "free some memory or use a smaller model".into()
        },
    })
}

pub(super) fn kv_too_big(hp: &HyperParams, n_ctx: usize, format: KvFormat) -> ModelError {
    let kv = kv_bytes_per_token(hp, format).saturating_mul(n_ctx as u64);
    ModelError::HostMemory {
        what: format!("a KV cache of {n_ctx} tokens"),
        need: human_bytes(kv),
        available: crate::host::available_memory().map_or_else(|| "less".into(), human_bytes),
        hint: "use a smaller context or --kv-tokens".into(),
    }
}

/// What `model`'s parts take on the CPU with a KV cache in `format` and
/// steps of `batch` tokens (the placement planner's costs): each layer's
/// tensors as the file holds them (mapped, and read every step), the
/// embedding with the first layer, the output with the last.
pub fn costs(model: &crate::Model, format: KvFormat, batch: usize) -> crate::placement::Costs {
    let hp = model.hparams();
    let mut c = crate::placement::Costs {
        layers: vec![0; hp.n_layer],
        kv_token: crate::KvLayout::new(hp, kv::PAGE_TOKENS, format)
            .of_layers(1)
            .token_bytes(),
        first: 0,
        last: 0,
        fixed: memory_needed_in(hp, 0, batch, format).1,
        both: 0,
    };
    let embd = m40_gguf::hparams::TOKEN_EMBD;
    for t in model.file().tensors() {
        match (crate::span::layer_of(&t.name), t.name.as_str()) {
            (Some(l), _) if l < hp.n_layer => c.layers[l] += t.n_bytes,
            (Some(_), _) => {}
            (None, n) if n == embd && hp.tied_output => {
                c.first += t.n_bytes;
                c.last += t.n_bytes;
                c.both += t.n_bytes;
            }
            (None, n) if n == embd => c.first += t.n_bytes,
            (None, _) => c.last += t.n_bytes,
        }
    }
    c
}
