//! Encoders' hyperparameters (bert, nomic-bert) and embedding models'
//! pooling.

use super::{bad, Arch, HyperParams};
use crate::error::Result;
use crate::metadata::Metadata;

/// An encoder's layer (bert, nomic-bert), as llama.cpp's `build_bert`:
/// token type 0's embedding added to every token's (and the learned
/// position's, bert), then a LayerNorm with bias (`token_embd_norm`); in
/// each layer the attention over every token of the sequence (not causal),
/// x = LN(x + attn(x)) (`attn_output_norm`), x = LN(x + ffn(x))
/// (`layer_output_norm`), each with a bias; no output norm, no logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Encoder {
    /// `position_embd` added at the input (bert); else RoPE (nomic-bert).
    pub learned_pos: bool,
    /// Biases on the FFN's matrices (bert: `ffn_up.bias`, `ffn_down.bias`).
    pub ffn_bias: bool,
    /// The FFN: act(gate) * up (nomic-bert's SwiGLU), or act(up) with no
    /// gate (bert's GELU).
    pub gated: bool,
    /// Rows of `token_types` (`tokenizer.ggml.token_type_count`, 2 unless
    /// the file says).
    pub n_token_types: usize,
}

/// How an embedding pools its tokens' hidden states (llama.cpp's
/// `pooling_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's own.
    None = 0,
    /// Their mean.
    Mean = 1,
    /// The first token's, `[CLS]`.
    Cls = 2,
    /// The last token's (qwen3-embedding).
    Last = 3,
    /// A reranker's score.
    Rank = 4,
}

impl Pooling {
    /// llama.cpp's id; an unknown one is an error.
    pub fn from_id(id: usize) -> Option<Pooling> {
        Some(match id {
            0 => Pooling::None,
            1 => Pooling::Mean,
            2 => Pooling::Cls,
            3 => Pooling::Last,
            4 => Pooling::Rank,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
        }
    }
}

/// An encoder's input tensors.
pub const TOKEN_TYPES: &str = "token_types.weight";
pub const POSITION_EMBD: &str = "position_embd.weight";
pub const TOKEN_EMBD_NORM: &str = "token_embd_norm.weight";
pub const TOKEN_EMBD_NORM_B: &str = "token_embd_norm.bias";

/// The encoder (for an encoder's architecture) and the pooling `md` says.
pub(super) fn read(md: &Metadata, arch: Arch) -> Result<(Option<Encoder>, Option<Pooling>)> {
    let a = arch.name();
    let key = |k: &str| format!("{a}.{k}");
    let encoder = arch.encoder().then(|| -> Result<Encoder> {
        Ok(Encoder {
            learned_pos: arch == Arch::Bert,
            ffn_bias: arch == Arch::Bert,
            gated: arch != Arch::Bert,
            n_token_types: md
                .opt_usize("tokenizer.ggml.token_type_count")?
                .unwrap_or(2)
                .max(1),
        })
    });
    let pooling = match md.opt_usize(&key("pooling_type"))? {
        None => None,
        Some(id) => Some(
            Pooling::from_id(id).ok_or_else(|| bad(format!("unknown {a}.pooling_type {id}")))?,
        ),
    };
    Ok((encoder.transpose()?, pooling))
}

impl HyperParams {
    /// An encoder's tensors after the token embedding (llama.cpp's order).
    pub(super) fn encoder_tensors(&self, e: Encoder, out: &mut Vec<(String, Vec<u64>)>) {
        let (d, q, ff) = (
            self.n_embd as u64,
            (self.n_head * self.head_dim) as u64,
            self.n_ff as u64,
        );
        if e.learned_pos {
            out.push((POSITION_EMBD.into(), vec![d, self.n_ctx_train as u64]));
        }
        out.push((TOKEN_TYPES.into(), vec![d, e.n_token_types as u64]));
        out.push((TOKEN_EMBD_NORM.into(), vec![d]));
        out.push((TOKEN_EMBD_NORM_B.into(), vec![d]));
        for l in 0..self.n_layer {
            let n = self.layer_names(l);
            for (w, b) in [(n.wq, n.bq), (n.wk, n.bk), (n.wv, n.bv)] {
                out.push((w, vec![d, q]));
                if self.qkv_bias {
                    out.push((b, vec![q]));
                }
            }
            out.push((n.wo, vec![q, d]));
            if self.out_bias {
                out.push((n.bo, vec![d]));
            }
            out.push((n.attn_out_norm, vec![d]));
            out.push((n.attn_out_norm_b, vec![d]));
            if e.gated {
                out.push((n.ffn_gate, vec![d, ff]));
            }
            out.push((n.ffn_up, vec![d, ff]));
            if e.ffn_bias {
                out.push((n.ffn_up_b, vec![ff]));
            }
            out.push((n.ffn_down, vec![ff, d]));
            if e.ffn_bias {
                out.push((n.ffn_down_b, vec![d]));
            }
            out.push((n.out_norm, vec![d]));
            out.push((n.out_norm_b, vec![d]));
        }
    }
}
