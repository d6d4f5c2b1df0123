//! The matrices a CPU backend repacks at load for its 8-bit products
//! (`CpuMath::Quantized` on a CPU with AVX2): eight rows interleaved four
//! bytes at a time, Q4_0 and Q8_0 by [`super::q4x8`], Q4_K and Q6_K by
//! [`super::kx8`]; by tensor name.

use std::collections::HashMap;

use m40_gguf::hparams::TOKEN_EMBD;
use m40_gguf::GgmlType;

use super::kx8::PackedK;
use super::q4x8::PackedQ4;
use crate::{Model, Span};

/// A repacked matrix.
pub enum Packed {
    /// Q4_0 or Q8_0.
    Q4_0(PackedQ4),
    K(PackedK),
}

impl Packed {
    /// `out[t * n_out + r] = W[r, :] . x[t]` by the format's 8-bit product.
    pub fn matmul(&self, x: &[f32], n_tok: usize, out: &mut [f32]) {
        match self {
            Packed::Q4_0(p) => p.matmul(x, n_tok, out),
            Packed::K(p) => p.matmul(x, n_tok, out),
        }
    }
}

/// The matrices a backend of `span` multiplies by that repack (the token
/// embedding only where it is also the output matrix of the span's last
/// layer).
#[derive(Default)]
pub struct Repacked(HashMap<String, Packed>);

impl Repacked {
    pub fn of(model: &Model, span: &Span) -> Self {
        let hp = model.hparams();
        let map = model
            .file()
            .tensors()
            .iter()
            .filter(|t| span.holds(&t.name, hp))
            .filter(|t| t.name != TOKEN_EMBD || (span.last() && hp.tied_output))
            .filter_map(|t| {
                let view = model.tensor(&t.name);
                let packed = match t.ty {
                    GgmlType::Q4_0 | GgmlType::Q8_0 => Packed::Q4_0(PackedQ4::pack(&view)?),
                    GgmlType::Q4_K | GgmlType::Q6_K => Packed::K(PackedK::pack(&view)?),
                    _ => return None,
                };
                Some((t.name.clone(), packed))
            })
            .collect();
        Self(map)
    }

    pub fn get(&self, name: &str) -> Option<&Packed> {
        self.0.get(name)
    }
}
