//! One decoder layer as both backends run it: the architecture's traits
//! ([`super::Traits`]) and the file's hyperparameters resolved for layer
//! `l`. The tensor list, the CPU forward pass and the GPU's weights and
//! queued kernels all read it, so a layer's shape is described here once.

use super::{HyperParams, Moe};

/// Which RoPE a layer's queries and keys take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerRope {
    /// The model's (its base, scaling and frequency factors).
    Model,
    /// A sliding-window layer's: its own base and linear scaling where the
    /// model states them (gemma3), else the model's.
    Window,
    /// None: the layer attends to unrotated queries and keys (SmolLM3's
    /// every fourth layer).
    None,
}

/// Decoder layer `l`: norm -> attention -> residual -> norm -> FFN ->
/// residual, with what this layer adds or leaves out. (Encoders' layers
/// are [`super::Encoder`]'s.)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Block {
    /// Biases on Q, K and V (`attn_q.bias`, ...).
    pub qkv_bias: bool,
    /// A norm over each query and key head before RoPE (`attn_q_norm`,
    /// `attn_k_norm`).
    pub head_norms: bool,
    pub rope: LayerRope,
    /// The sliding window: a token attends to this many newest keys, its
    /// own included; 0: to every earlier one.
    pub window: usize,
    /// A learned sink logit per head (`attn_sinks`).
    pub sinks: bool,
    /// A bias on the attention's output (`attn_output.bias`).
    pub out_bias: bool,
    /// Attention and FFN read the same normed input (no FFN norm); their
    /// outputs join the residual together.
    pub parallel: bool,
    /// RMSNorms of the attention's and FFN's outputs before they join the
    /// residual (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// The FFN: a mixture of these experts, or (None) one gated FFN.
    pub experts: Option<Moe>,
}

impl Block {
    /// Whether the layer has an FFN norm (`ffn_norm`).
    pub fn ffn_norm(&self) -> bool {
        !self.parallel
    }
}

impl HyperParams {
    /// Decoder layer `l` (see [`Block`]).
    pub fn block(&self, l: usize) -> Block {
        let window = match &self.sliding_window {
            Some(w) if self.is_swa(l) => w.window,
            _ => 0,
        };
        let every = self.arch.traits().no_rope_every;
        let rope = if every > 0 && (l + 1).is_multiple_of(every) {
            LayerRope::None
        } else if window > 0 {
            LayerRope::Window
        } else {
            LayerRope::Model
        };
        Block {
            qkv_bias: self.qkv_bias,
            head_norms: self.qk_norm,
            rope,
            window,
            sinks: self.attn_sinks,
            out_bias: self.out_bias,
            parallel: self.parallel,
            post_norms: self.post_norms,
            experts: self.moe,
        }
    }

    /// Every decoder layer, in order.
    pub fn blocks(&self) -> Vec<Block> {
        (0..self.n_layer).map(|l| self.block(l)).collect()
    }
}
