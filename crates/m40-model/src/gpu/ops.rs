//! Each layer's op list: which kernels its steps queue and what they fold,
//! decided once at load from its [`Block`](m40_gguf::hparams::Block), the
//! model's norm and head size, its weights' formats and the options.
//! `enqueue` (forward.rs) walks it; what still depends on a step — its
//! token count, how the last residual connection was left — is asked
//! there, and only there.

use m40_gguf::{HyperParams, NormKind};
use m40_kernels::{Kernels, RopeStyle};

use super::weights::{Ffn, Mat, MatView, Weights};

/// Where a layer's query and key head norms run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HeadNorms {
    None,
    /// In the RoPE launch: RMSNorms shared by the heads, of a head size
    /// the launch takes (a multiple of 64, at most 256).
    InRope,
    /// Apart, before the RoPE launch (LayerNorms, command-r+'s per-head
    /// weights, other head sizes).
    Apart,
}

/// How a branch (the attention's or the FFN's output) joins the residual.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Join {
    /// Added as it is: by the GEMM or packed GEMV in place, or left pending
    /// for the next norm's launch (`matmul_res`).
    Plain,
    /// Post-normed (gemma) or scaled (granite) first (`transformed_res`).
    Transformed,
    /// The attention's branch of a parallel layer (command-r): added at
    /// once, since the FFN reads the attention's input.
    Parallel,
}

/// One layer's ops (see the module's doc). The `one_token_*` fusions apply
/// to steps of one token only.
#[derive(Clone, Copy, Debug)]
pub(super) struct LayerOps {
    /// Q/K/V biases added apart (before head norms) rather than in the
    /// RoPE launch.
    pub(super) bias_apart: bool,
    pub(super) head_norms: HeadNorms,
    /// The Q/K/V GEMVs add the biases, rotate and append to the cache
    /// (packed stacks, no head norms, llama's pairing, FP16 pages).
    pub(super) one_token_rope: bool,
    pub(super) attn_join: Join,
    pub(super) ffn_join: Join,
    /// The attention's output GEMV emits the FFN norm, which the gate/up
    /// GEMV takes folded (a dense FFN).
    pub(super) one_token_ffn_norm: bool,
    /// The router takes the FFN norm (a mixture whose router kernel does).
    pub(super) one_token_router_norm: bool,
    /// The down GEMV (a mixture: the weighted sum of its experts) emits the
    /// norm that follows: the next layer's attention norm, or after the
    /// last layer the output norm (when the step's logits follow).
    pub(super) one_token_next_norm: bool,
}

impl LayerOps {
    /// Every layer's ops. `fuse`: `GpuOptions::fuse` and
    /// `GpuOptions::fold_moe_norm`; `style`: the pairing
    /// the RoPE kernels are given (NeoX heads uploaded adjacent rotate as
    /// llama's); `quant_kv`: the pool's pages are quantized (appended by
    /// the RoPE launch, which rotates and quantizes whole heads).
    pub(super) fn plan(
        hp: &HyperParams,
        weights: &Weights,
        kernels: &Kernels,
        (fuse, fold_moe_norm): (bool, bool),
        style: RopeStyle,
        quant_kv: bool,
    ) -> Vec<LayerOps> {
        let hd = hp.head_dim;
        // A norm folds into the GEMVs after it (and the GEMV before it
        // emits it) where both are packed and it is an RMSNorm (the fold
        // computes an RMS scale).
        let folds = |producer: &Mat, mats: Vec<&Mat>| {
            fuse && hp.norm == NormKind::Rms && producer.packed && mats.iter().all(|m| m.packed)
        };
        let layers = &weights.layers;
        layers
            .iter()
            .enumerate()
            .map(|(l, layer)| {
                let b = &layer.block;
                let head_norms = match b.head_norms {
                    false => HeadNorms::None,
                    true if hd.is_multiple_of(64)
                        && hd <= 256
                        && hp.norm == NormKind::Rms
                        && hp.qk_norm_len(true) == hd =>
                    {
                        HeadNorms::InRope
                    }
                    true => HeadNorms::Apart,
                };
                let transformed = b.post_norms || hp.residual_scale != 1.0;
                let attn_join = match (b.parallel, transformed) {
                    (true, _) => Join::Parallel,
                    (false, true) => Join::Transformed,
                    (false, false) => Join::Plain,
                };
                let ffn_join = match transformed {
                    true => Join::Transformed,
                    false => Join::Plain,
                };
                let plain = attn_join == Join::Plain;
                // The GEMVs after the FFN's norm: the next layer's, or the
                // output's in the last stage (none to fold into at the end
                // of an earlier one).
                let next: Option<Vec<&Mat>> = match layers.get(l + 1) {
                    Some(next) => Some(next.qkv.iter().map(|s| &s.mat).collect()),
                    None => weights.output().map(|o| vec![o]),
                };
                let (ffn_norm, router_norm, next_norm) = match &layer.ffn {
                    Ffn::Dense { gate_up, down } => {
                        let gate_up = gate_up.iter().map(|s| &s.mat).collect();
                        (
                            plain && folds(&layer.wo, gate_up),
                            false,
                            ffn_join == Join::Plain && next.is_some_and(|n| folds(down, n)),
                        )
                    }
                    Ffn::Moe(mats) => {
                        let data = mats.router.data.view();
                        let takes = matches!(mats.router.view(&data),
                            MatView::Rows(q) if kernels.moe_router_takes(&q));
                        let router = fuse && takes && hp.norm == NormKind::Rms;
                        // The weighted sum of the experts' outputs emits the
                        // next norm (`moe_combine_fold`) where its GEMVs are
                        // packed.
                        let combine = fuse
                            && fold_moe_norm
                            && hp.norm == NormKind::Rms
                            && ffn_join == Join::Plain
                            && next.is_some_and(|n| n.iter().all(|m| m.packed));
                        (false, router && layer.ffn_norm.is_some(), combine)
                    }
                };
                LayerOps {
                    bias_apart: b.qkv_bias && b.head_norms,
                    head_norms,
                    one_token_rope: fuse
                        && layer.qkv.iter().all(|st| st.mat.packed)
                        && !b.head_norms
                        && style == RopeStyle::Normal
                        && !quant_kv,
                    attn_join,
                    ffn_join,
                    one_token_ffn_norm: ffn_norm,
                    one_token_router_norm: router_norm,
                    one_token_next_norm: next_norm,
                }
            })
            .collect()
    }
}
