//! What an encoder's forward (bert, nomic-bert: `m40_gguf::hparams::Encoder`)
//! adds to the decoder's on the CPU: the input's token type, position and
//! LayerNorm, the LayerNorms with bias after each residual add, the FFN's
//! biases and its ungated activation.

use m40_gguf::hparams::{
    LayerNames, POSITION_EMBD, TOKEN_EMBD_NORM, TOKEN_EMBD_NORM_B, TOKEN_TYPES,
};
use m40_gguf::quant::dequantize;

use super::ops::{add_rows, gelu_tanh, layernorm};
use super::{vec_f32, CpuBackend};
use crate::error::{ModelError, Result};
use crate::Model;

/// An encoder's per-model vectors: type 0's embedding (with the learned
/// positions' matrix read per token) and the input's LayerNorm.
pub(super) struct EncoderInput {
    type0: Vec<f32>,
    norm: [Vec<f32>; 2],
}

/// An encoder layer's LayerNorms (weight, bias) after the attention's and
/// the FFN's residual adds, and its FFN's biases (up, down) where it has
/// them.
pub(super) struct EncoderLayer {
    pub attn_out: [Vec<f32>; 2],
    pub out: [Vec<f32>; 2],
    pub ffn_bias: Option<[Vec<f32>; 2]>,
}

impl EncoderInput {
    pub fn load(model: &Model) -> Result<Option<EncoderInput>> {
        if model.hparams().encoder.is_none() {
            return Ok(None);
        }
        let d = model.hparams().n_embd;
        let mut type0 = vec_f32(model, TOKEN_TYPES)?;
        type0.truncate(d);
        Ok(Some(EncoderInput {
            type0,
            norm: [
                vec_f32(model, TOKEN_EMBD_NORM)?,
                vec_f32(model, TOKEN_EMBD_NORM_B)?,
            ],
        }))
    }
}

impl EncoderLayer {
    pub fn load(model: &Model, n: &LayerNames) -> Result<Option<EncoderLayer>> {
        let Some(e) = model.hparams().encoder else {
            return Ok(None);
        };
        let v = |name: &str| vec_f32(model, name);
        Ok(Some(EncoderLayer {
            attn_out: [v(&n.attn_out_norm)?, v(&n.attn_out_norm_b)?],
            out: [v(&n.out_norm)?, v(&n.out_norm_b)?],
            ffn_bias: if e.ffn_bias {
                Some([v(&n.ffn_up_b)?, v(&n.ffn_down_b)?])
            } else {
                None
            },
        }))
    }
}

/// LayerNorm with bias of each row of x (rows of `wb[0].len()`).
pub(super) fn layernorm_bias(x: &mut [f32], wb: &[Vec<f32>; 2], eps: f32) {
    layernorm(x, &wb[0], eps);
    add_rows(x, &wb[1]);
}

impl CpuBackend {
    /// An encoder's input rows `x` (token embeddings, positions `pos`):
    /// plus type 0's embedding and the learned positions' (bert), then the
    /// input's LayerNorm.
    pub(super) fn encoder_input(
        &self,
        input: &EncoderInput,
        pos: impl Iterator<Item = usize>,
        x: &mut [f32],
    ) -> Result<()> {
        let hp = self.model.hparams();
        let d = hp.n_embd;
        add_rows(x, &input.type0);
        if hp.encoder.is_some_and(|e| e.learned_pos) {
            let pe = self.model.tensor(POSITION_EMBD);
            let mut row = vec![0f32; d];
            for (p, xr) in pos.zip(x.chunks_exact_mut(d)) {
                if p >= hp.n_ctx_train {
                    return Err(ModelError::Unsupported(format!(
                        "position {p}: this encoder has learned positions for {} tokens",
                        hp.n_ctx_train
                    )));
                }
                dequantize(pe.info.ty, pe.row(p), &mut row)?;
                xr.iter_mut().zip(&row).for_each(|(x, r)| *x += r);
            }
        }
        layernorm_bias(x, &input.norm, hp.rms_eps);
        Ok(())
    }

    /// An encoder's FFN of `h` (n rows) into `out`: act(gate) * up where
    /// it is gated, else gelu(up), each matrix with its bias where it has
    /// one. `gate` and `up` are (n, n_ff) scratch.
    pub(super) fn encoder_ffn(
        &self,
        names: &LayerNames,
        layer: &EncoderLayer,
        h: &[f32],
        n: usize,
        [gate, up]: [&mut [f32]; 2],
        out: &mut [f32],
    ) -> Result<()> {
        let hp = self.model.hparams();
        let gated = hp.encoder.is_some_and(|e| e.gated);
        self.matmul(&names.ffn_up, h, n, up)?;
        if let Some([bu, _]) = &layer.ffn_bias {
            add_rows(up, bu);
        }
        if gated {
            self.matmul(&names.ffn_gate, h, n, gate)?;
            super::ops::glu(hp.act, gate, up);
        } else {
            // bert's GELU, the one ungated FFN.
            gate.iter_mut()
                .zip(up.iter())
                .for_each(|(g, &u)| *g = gelu_tanh(u));
        }
        self.matmul(&names.ffn_down, gate, n, out)?;
        if let Some([_, bd]) = &layer.ffn_bias {
            add_rows(out, bd);
        }
        Ok(())
    }
}
