//! The architectures m40-llm runs: each one's name and the traits of its
//! layer that the hyperparameters do not state.

use super::RopeStyle;
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

impl Arch {
    /// Every architecture, in the order help texts list them.
    pub const ALL: [Arch; 13] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Gemma2,
        Arch::Gemma3,
        Arch::Granite,
        Arch::Mistral3,
        Arch::Phi3,
        Arch::GptOss,
        Arch::CommandR,
        Arch::Bert,
        Arch::NomicBert,
    ];

    /// Every architecture's `general.architecture` name, comma-separated:
    /// what help texts and errors list.
    pub fn names() -> String {
        Arch::ALL.map(Arch::name).join(", ")
    }

    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "qwen3moe" => Ok(Arch::Qwen3Moe),
            "gemma2" => Ok(Arch::Gemma2),
            "gemma3" => Ok(Arch::Gemma3),
            "granite" => Ok(Arch::Granite),
            "mistral3" => Ok(Arch::Mistral3),
            "phi3" => Ok(Arch::Phi3),
            "gpt-oss" => Ok(Arch::GptOss),
            "command-r" => Ok(Arch::CommandR),
            "bert" => Ok(Arch::Bert),
            "nomic-bert" => Ok(Arch::NomicBert),
            other => Err(GgufError::UnsupportedArchitecture {
                name: other.to_string(),
                known: Arch::names(),
            }),
        }
    }

    /// How the architecture pairs RoPE's dimensions.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Llama | Arch::Granite | Arch::Mistral3 | Arch::CommandR | Arch::Bert => {
                RopeStyle::Normal
            }
            Arch::NomicBert
            | Arch::Qwen2
            | Arch::Qwen3
            | Arch::Qwen3Moe
            | Arch::Gemma2
            | Arch::Gemma3
            | Arch::Phi3
            | Arch::GptOss => RopeStyle::Neox,
        }
    }

    /// Whether its Q/K/V always carry biases (llama files may too: see
    /// [`HyperParams::from_file`]).
    pub fn qkv_bias(self) -> bool {
        matches!(self, Arch::Qwen2 | Arch::GptOss | Arch::Bert)
    }

    /// Whether it is an encoder ([`Encoder`]).
    pub fn encoder(self) -> bool {
        matches!(self, Arch::Bert | Arch::NomicBert)
    }

    /// Whether each query and key head is RMS-normed before RoPE.
    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3)
    }

    /// Gemma's layer: scaled embeddings, GELU gate, post-norms.
    pub fn gemma(self) -> bool {
        matches!(self, Arch::Gemma2 | Arch::Gemma3)
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Granite => "granite",
            Arch::Mistral3 => "mistral3",
            Arch::Phi3 => "phi3",
            Arch::GptOss => "gpt-oss",
            Arch::CommandR => "command-r",
            Arch::Bert => "bert",
            Arch::NomicBert => "nomic-bert",
        }
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
                Arch::GptOss => 9,
                Arch::CommandR => 10,
                Arch::Bert => 11,
                Arch::NomicBert => 12,
            };
            assert_eq!(at, i, "{a:?}");
            assert_eq!(Arch::parse(a.name()).unwrap(), a);
        }
        let e = Arch::parse("mamba").unwrap_err().to_string();
        assert!(e.contains("gpt-oss, command-r, bert, nomic-bert"), "{e}");
    }
}
