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

/// The formats repacked.
const REPACKED: [GgmlType; 4] = [
    GgmlType::Q4_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Whether copies of `bytes` fit in `available` bytes (None: not known,
/// taken to fit): three quarters of it at most, the rest left for the KV
/// cache, a step's activations and everything else. The copies are
/// anonymous memory; the file's pages they were read from can be
/// reclaimed.
fn fits(bytes: u64, available: Option<u64>) -> bool {
    available.is_none_or(|a| bytes <= a / 4 * 3)
}

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
    /// The span's matrices repacked, where their copies fit ([`fits`] in
    /// what the machine has available); else none (the unpacked products
    /// read the file's mapping, slower), with a warning.
    pub fn of(model: &Model, span: &Span) -> Self {
        let hp = model.hparams();
        let tensors: Vec<_> = model
            .file()
            .tensors()
            .iter()
            .filter(|t| span.holds(&t.name, hp))
            .filter(|t| t.name != TOKEN_EMBD || (span.last() && hp.tied_output))
            .filter(|t| REPACKED.contains(&t.ty))
            .collect();
        // Q4_K rows grow from 144 to 148 bytes a block.
        let bytes: u64 = tensors.iter().map(|t| t.n_bytes / 36 * 37).sum();
        let available = crate::host::available_memory();
        if !fits(bytes, available) {
            tracing::warn!(
                "not repacking {} of weights for the CPU's 8-bit products: {} available; \
                 the unpacked products read the file instead (slower)",
                crate::host::human_bytes(bytes),
                available.map_or("?".into(), crate::host::human_bytes),
            );
            return Self::default();
        }
        let map = tensors
            .into_iter()
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

#[cfg(test)]
mod tests {
    #[test]
    fn copies_fit_in_three_quarters_of_what_is_available() {
        assert!(super::fits(3 << 30, Some(4 << 30)));
        assert!(!super::fits((3 << 30) + 1, Some(4 << 30)));
        assert!(super::fits(u64::MAX, None));
        assert!(!super::fits(1, Some(0)));
    }
}
