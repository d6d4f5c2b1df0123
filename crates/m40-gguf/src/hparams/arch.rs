//! The architectures m40-llm runs: each one's name and the traits of its
//! layer that the hyperparameters do not state.

use super::{Activation, NormKind, RopeStyle};
use crate::error::{GgufError, Result};

/// Architectures m40-llm runs (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1/2/3, Mistral, SmolLM, TinyLlama: all say `llama`.
    Llama,
    /// Qwen2: Q/K/V biases, NeoX RoPE.
    Qwen2,
    /// Qwen3 (dense): NeoX RoPE, no biases, an RMSNorm over each query and
    /// key head before RoPE (`attn_q_norm`, `attn_k_norm`), and a head size
    /// of its own (`attention.key_length`).
    Qwen3,
    /// Gemma 2: embeddings times sqrt(n_embd), GELU-gated FFN, RMSNorms of
    /// the attention and FFN outputs (`post_attention_norm`,
    /// `post_ffw_norm`), attention and final logits soft-capped, every
    /// other layer a sliding window; NeoX RoPE, output tied.
    Gemma2,
    /// Gemma 3: Gemma 2's layers with Qwen3's head norms instead of the
    /// attention soft-cap; five sliding-window layers (RoPE base 10,000)
    /// to one global.
    Gemma3,
    /// Qwen3's mixture of experts (30B-A3B, 235B-A22B): Qwen3's attention,
    /// an FFN of `expert_count` experts of which each token takes the
    /// `expert_used_count` its router scores highest.
    Qwen3Moe,
    /// IBM Granite 3.x (dense): llama's layer with four multipliers, of the
    /// embeddings, the attention scores, each residual branch and (divided
    /// by) the logits.
    Granite,
    /// Mistral 3 / Ministral 3 (`mistral3`): llama's layer (dense, or
    /// experts as Mixtral's), YaRN RoPE, and optionally llama 4's attention
    /// temperature (`attention.temperature_scale`).
    Mistral3,
    /// Phi-3 / Phi-4 (`phi3`): llama's layer with Q/K/V in one matrix
    /// (`attn_qkv`) and gate and up in one (`ffn_up`, gate first), NeoX
    /// RoPE, LongRoPE's per-dimension factors (`rope_factors_long` and
    /// `_short`) where the file has them.
    Phi3,
    /// Hugging Face's SmolLM3 (`smollm3`): llama's layer, every fourth
    /// layer without RoPE (NoPE: layers 3, 7, 11, ...).
    SmolLm3,
    /// OpenAI's gpt-oss (`gpt-oss`): biases on Q/K/V and the attention's
    /// output, a learned sink logit per head in each softmax, every other
    /// layer a sliding window (from layer 0), YaRN, NeoX RoPE, and a
    /// mixture of experts with biases everywhere, its router's softmax
    /// over the chosen experts only, and a clamped SwiGLU
    /// ([`Activation::SwigluOai`]); `post_attention_norm` is its FFN norm.
    GptOss,
    /// Cohere's Command-R (`command-r`; Aya 23 too): LayerNorm without
    /// bias instead of RMSNorm, attention and FFN in parallel from one norm
    /// (x + attn(n) + ffn(n)), llama's RoPE, the output tied to the
    /// embedding, logits times `logit_scale`; from 64 layers (Command-R+)
    /// a LayerNorm over each query and key head with weights per head.
    CommandR,
    /// BERT encoders (`bert`: all-minilm, bge, mxbai-embed-large,
    /// snowflake-arctic-embed): learned positions, [`Encoder`] layers,
    /// biases on every matrix, a GELU FFN.
    Bert,
    /// Nomic's BERT (`nomic-bert`: nomic-embed-text): [`Encoder`] layers
    /// with Q/K/V in one matrix (`attn_qkv`), NeoX RoPE, a SwiGLU FFN, no
    /// biases.
    NomicBert,
}

/// What an architecture's layers are beyond what its file states: one
/// row of [`Arch::traits`] per architecture, which the hyperparameters,
/// the tensor list ([`HyperParams::expected_tensors`]) and both backends
/// (through [`HyperParams::block`]) read.
///
/// [`HyperParams::expected_tensors`]: super::HyperParams::expected_tensors
/// [`HyperParams::block`]: super::HyperParams::block
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Traits {
    /// `general.architecture`.
    pub name: &'static str,
    /// How RoPE pairs the dimensions of a head.
    pub rope_style: RopeStyle,
    pub norm: NormKind,
    /// The FFN gate's activation.
    pub act: Activation,
    /// Q/K/V always carry biases (llama files may too: see
    /// [`HyperParams::from_file`](super::HyperParams::from_file)).
    pub qkv_bias: bool,
    /// Each query and key head is normed before RoPE.
    pub qk_norm: bool,
    /// Gemma's layer: embeddings times sqrt(n_embd), RMSNorms of the
    /// attention's and the FFN's outputs before they join the residual.
    pub gemma: bool,
    /// Attention and FFN in parallel from one norm: x + attn(n) + ffn(n).
    pub parallel: bool,
    /// An encoder ([`Encoder`](super::Encoder)): bidirectional, pooled.
    pub encoder: bool,
    /// A bias on the attention's output projection.
    pub out_bias: bool,
    /// A learned sink logit per head in each softmax.
    pub sinks: bool,
    /// Every n-th layer (those with (l + 1) % n == 0) attends without
    /// RoPE (llama.cpp's `n_no_rope_layer_step`); 0: every layer rotates.
    pub no_rope_every: usize,
}

/// What an architecture's row does not state: llama's layer.
const LLAMA: Traits = Traits {
    name: "llama",
    rope_style: RopeStyle::Normal,
    norm: NormKind::Rms,
    act: Activation::Silu,
    qkv_bias: false,
    qk_norm: false,
    gemma: false,
    parallel: false,
    encoder: false,
    out_bias: false,
    sinks: false,
    no_rope_every: 0,
};

impl Arch {
    /// Every architecture, in the order help texts list them.
    pub const ALL: [Arch; 14] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Gemma2,
        Arch::Gemma3,
        Arch::Granite,
        Arch::Mistral3,
        Arch::Phi3,
        Arch::SmolLm3,
        Arch::GptOss,
        Arch::CommandR,
        Arch::Bert,
        Arch::NomicBert,
    ];

    /// The architecture's row: its layer's traits.
    pub const fn traits(self) -> Traits {
        use RopeStyle::Neox;
        let gemma = Traits {
            rope_style: Neox,
            act: Activation::GeluTanh,
            gemma: true,
            ..LLAMA
        };
        match self {
            Arch::Llama => LLAMA,
            Arch::Qwen2 => Traits {
                name: "qwen2",
                rope_style: Neox,
                qkv_bias: true,
                ..LLAMA
            },
            Arch::Qwen3 => Traits {
                name: "qwen3",
                rope_style: Neox,
                qk_norm: true,
                ..LLAMA
            },
            Arch::Qwen3Moe => Traits {
                name: "qwen3moe",
                rope_style: Neox,
                qk_norm: true,
                ..LLAMA
            },
            Arch::Gemma2 => Traits {
                name: "gemma2",
                ..gemma
            },
            Arch::Gemma3 => Traits {
                name: "gemma3",
                qk_norm: true,
                ..gemma
            },
            Arch::Granite => Traits {
                name: "granite",
                ..LLAMA
            },
            Arch::Mistral3 => Traits {
                name: "mistral3",
                ..LLAMA
            },
            Arch::Phi3 => Traits {
                name: "phi3",
                rope_style: Neox,
                ..LLAMA
            },
            Arch::SmolLm3 => Traits {
                name: "smollm3",
                no_rope_every: 4,
                ..LLAMA
            },
            Arch::GptOss => Traits {
                name: "gpt-oss",
                rope_style: Neox,
                act: Activation::SwigluOai,
                qkv_bias: true,
                out_bias: true,
                sinks: true,
                ..LLAMA
            },
            Arch::CommandR => Traits {
                name: "command-r",
                norm: NormKind::Layer,
                parallel: true,
                ..LLAMA
            },
            Arch::Bert => Traits {
                name: "bert",
                norm: NormKind::Layer,
                act: Activation::GeluTanh,
                qkv_bias: true,
                encoder: true,
                out_bias: true,
                ..LLAMA
            },
            Arch::NomicBert => Traits {
                name: "nomic-bert",
                rope_style: Neox,
                norm: NormKind::Layer,
                encoder: true,
                ..LLAMA
            },
        }
    }

    /// Every architecture's `general.architecture` name, comma-separated:
    /// what help texts and errors list.
    pub fn names() -> String {
        Arch::ALL.map(Arch::name).join(", ")
    }

    /// The architecture named `name` (`general.architecture`).
    pub fn parse(name: &str) -> Result<Self> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| GgufError::UnsupportedArchitecture {
                name: name.to_string(),
                known: Arch::names(),
            })
    }

    pub const fn name(self) -> &'static str {
        self.traits().name
    }

    /// How the architecture pairs RoPE's dimensions.
    pub const fn rope_style(self) -> RopeStyle {
        self.traits().rope_style
    }

    /// Whether its Q/K/V always carry biases.
    pub const fn qkv_bias(self) -> bool {
        self.traits().qkv_bias
    }

    /// Whether it is an encoder ([`Encoder`](super::Encoder)).
    pub const fn encoder(self) -> bool {
        self.traits().encoder
    }

    /// Whether each query and key head is normed before RoPE.
    pub const fn qk_norm(self) -> bool {
        self.traits().qk_norm
    }

    /// Gemma's layer: scaled embeddings, GELU gate, post-norms.
    pub const fn gemma(self) -> bool {
        self.traits().gemma
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` holds every variant (a new one breaks this match until it is
    /// listed), once, and each name parses back to it.
    #[test]
    fn every_architecture_is_listed_once_and_named() {
        for (i, a) in Arch::ALL.into_iter().enumerate() {
            let at = match a {
                Arch::Llama => 0,
                Arch::Qwen2 => 1,
                Arch::Qwen3 => 2,
                Arch::Qwen3Moe => 3,
                Arch::Gemma2 => 4,
                Arch::Gemma3 => 5,
                Arch::Granite => 6,
                Arch::Mistral3 => 7,
                Arch::Phi3 => 8,
                Arch::SmolLm3 => 9,
                Arch::GptOss => 10,
                Arch::CommandR => 11,
                Arch::Bert => 12,
                Arch::NomicBert => 13,
            };
            assert_eq!(at, i, "{a:?}");
            assert_eq!(Arch::parse(a.name()).unwrap(), a);
        }
        let e = Arch::parse("mamba").unwrap_err().to_string();
        assert!(e.contains("gpt-oss, command-r, bert, nomic-bert"), "{e}");
    }
}
