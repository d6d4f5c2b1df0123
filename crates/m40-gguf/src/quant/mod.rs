//! GGML block formats and CPU (de)quantization.
//!
//! `dequantize` and `quantize` work on whole rows (any number of blocks); the
//! per-block functions in [`dequant`] are the building blocks the CPU matmul
//! uses to dequantize in registers.

pub mod blocks;
pub mod dequant;
pub mod quantize;

use std::borrow::Cow;

use bytemuck::Pod;
use half::slice::HalfFloatSliceExt;

use crate::error::{GgufError, Result};
use crate::types::GgmlType;

/// View `bytes` as blocks of `B`, copying only when the bytes are misaligned.
pub fn as_blocks<B: Pod>(bytes: &[u8]) -> Cow<'_, [B]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(
            bytes
                .chunks_exact(std::mem::size_of::<B>())
                .map(bytemuck::pod_read_unaligned)
                .collect(),
        ),
    }
}

fn check_sizes(ty: GgmlType, n_bytes: usize, n: usize) -> Result<()> {
    let expected = ty.row_bytes(n as u64).ok_or(GgufError::BadRowLength {
        ty,
        len: n,
        block: ty.block_len(),
    })?;
    if expected != n_bytes as u64 {
        return Err(GgufError::BadTensor {
            name: format!("<{ty} data>"),
            what: format!("{n_bytes} bytes do not hold {n} values ({expected} bytes expected)"),
        });
    }
    Ok(())
}

fn each_block<B: Pod>(src: &[u8], out: &mut [f32], block_len: usize, f: impl Fn(&B, &mut [f32])) {
    let blocks = as_blocks::<B>(src);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(block_len)) {
        f(b, y);
    }
}

/// Dequantize `src` (whole blocks of `ty`) into `out`, whose length is the
/// element count. Sizes that do not match are an error.
pub fn dequantize(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<()> {
    check_sizes(ty, src.len(), out.len())?;
    use blocks::*;
    use dequant as d;
    match ty {
        GgmlType::F32 => {
            for (y, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *y = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        // half's slice conversions use F16C/SIMD where the CPU has them.
        GgmlType::F16 => as_blocks::<half::f16>(src).convert_to_f32_slice(out),
        GgmlType::BF16 => as_blocks::<half::bf16>(src).convert_to_f32_slice(out),
        GgmlType::Q4_0 => each_block::<BlockQ4_0>(src, out, QK32, d::block_q4_0),
        GgmlType::Q4_1 => each_block::<BlockQ4_1>(src, out, QK32, d::block_q4_1),
        GgmlType::Q5_0 => each_block::<BlockQ5_0>(src, out, QK32, d::block_q5_0),
        GgmlType::Q5_1 => each_block::<BlockQ5_1>(src, out, QK32, d::block_q5_1),
        GgmlType::Q8_0 => each_block::<BlockQ8_0>(src, out, QK32, d::block_q8_0),
        GgmlType::Q2_K => each_block::<BlockQ2K>(src, out, QK_K, d::block_q2_k),
        GgmlType::Q3_K => each_block::<BlockQ3K>(src, out, QK_K, d::block_q3_k),
        GgmlType::Q4_K => each_block::<BlockQ4K>(src, out, QK_K, d::block_q4_k),
        GgmlType::Q5_K => each_block::<BlockQ5K>(src, out, QK_K, d::block_q5_k),
        GgmlType::Q6_K => each_block::<BlockQ6K>(src, out, QK_K, d::block_q6_k),
        GgmlType::IQ4_NL => each_block::<BlockIQ4NL>(src, out, QK32, d::block_iq4_nl),
        GgmlType::IQ4_XS => each_block::<BlockIQ4XS>(src, out, QK_K, d::block_iq4_xs),
        GgmlType::MXFP4 => each_block::<BlockMXFP4>(src, out, QK32, d::block_mxfp4),
        other => {
            return Err(GgufError::UnsupportedType {
                ty: other,
                op: "dequantization",
            })
        }
    }
    Ok(())
}

fn push_blocks<B: Pod>(x: &[f32], block_len: usize, out: &mut [u8], f: impl Fn(&[f32]) -> B) {
    for (xs, o) in x
        .chunks_exact(block_len)
        .zip(out.chunks_exact_mut(std::mem::size_of::<B>()))
    {
        o.copy_from_slice(bytemuck::bytes_of(&f(xs)));
    }
}

/// Quantize `x` into `out` (exactly `ty.row_bytes(x.len())` bytes) with ggml's
/// reference algorithms. Types outside [`GgmlType::QUANTIZABLE`] are an error.
pub fn quantize(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<()> {
    check_sizes(ty, out.len(), x.len())?;
    use quantize as q;
    match ty {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&q::f32_to_f16(*v).to_bits().to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&q::f32_to_bf16(*v).to_bits().to_le_bytes());
            }
        }
        GgmlType::Q8_0 => push_blocks(x, blocks::QK32, out, q::block_q8_0),
        GgmlType::Q4_0 => push_blocks(x, blocks::QK32, out, q::block_q4_0),
        GgmlType::Q4_1 => push_blocks(x, blocks::QK32, out, q::block_q4_1),
        GgmlType::Q5_0 => push_blocks(x, blocks::QK32, out, q::block_q5_0),
        GgmlType::Q5_1 => push_blocks(x, blocks::QK32, out, q::block_q5_1),
        GgmlType::Q4_K => push_blocks(x, blocks::QK_K, out, q::block_q4_k),
        GgmlType::Q6_K => push_blocks(x, blocks::QK_K, out, q::block_q6_k),
        GgmlType::MXFP4 => push_blocks(x, blocks::QK32, out, q::block_mxfp4),
        other => {
            return Err(GgufError::UnsupportedType {
                ty: other,
                op: "quantization",
            })
        }
    }
    Ok(())
}

/// [`quantize`], but Q4_K and Q6_K without the candidate sweeps of their
/// scale fits (each sub-block's first fit), MXFP4 by thresholds: the same format, 10-20x less
/// arithmetic, not llama-quantize's bytes. For random synthetic models
/// (`synth`), whose values matter only through their format.
pub fn quantize_fast(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<()> {
    match ty {
        GgmlType::Q4_K => {
            check_sizes(ty, out.len(), x.len())?;
            push_blocks(x, blocks::QK_K, out, |b| quantize::block_q4_k_fit(b, false));
            Ok(())
        }
        GgmlType::Q6_K => {
            check_sizes(ty, out.len(), x.len())?;
            push_blocks(x, blocks::QK_K, out, |b| quantize::block_q6_k_fit(b, false));
            Ok(())
        }
        GgmlType::MXFP4 => {
            check_sizes(ty, out.len(), x.len())?;
            push_blocks(x, blocks::QK32, out, quantize::block_mxfp4_fast);
            Ok(())
        }
        _ => quantize(ty, x, out),
    }
}

/// Quantize into a new buffer.
pub fn quantize_to_vec(ty: GgmlType, x: &[f32]) -> Result<Vec<u8>> {
    let n = ty
        .row_bytes(x.len() as u64)
        .ok_or(GgufError::BadRowLength {
            ty,
            len: x.len(),
            block: ty.block_len(),
        })?;
    let mut out = vec![0u8; n as usize];
    quantize(ty, x, &mut out)?;
    Ok(out)
}

/// Dequantize into a new buffer.
pub fn dequantize_to_vec(ty: GgmlType, src: &[u8], n: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; n];
    dequantize(ty, src, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast K-quant fits: a valid block of the same format whose error
    /// is close to the searched fit's (never far worse); MXFP4's the same
    /// but for near-ties; the other types byte for byte `quantize`'s.
    #[test]
    fn fast_fits_stay_close_to_the_searched_ones() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let x: Vec<f32> = (0..64 * 256)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect();
        let rms = |ty: GgmlType, b: &[u8]| {
            let y = dequantize_to_vec(ty, b, x.len()).unwrap();
            let e: f64 = x
                .iter()
                .zip(&y)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum();
            (e / x.len() as f64).sqrt()
        };
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let n = ty.row_bytes(x.len() as u64).unwrap() as usize;
            let (mut exact, mut fast) = (vec![0u8; n], vec![0u8; n]);
            quantize(ty, &x, &mut exact).unwrap();
            quantize_fast(ty, &x, &mut fast).unwrap();
            assert_ne!(exact, fast, "{ty}: the fast fit skips the search");
            let (e, f) = (rms(ty, &exact), rms(ty, &fast));
            println!("{ty}: rms error {f:.5} fast, {e:.5} searched");
            assert!(f <= 1.25 * e, "{ty}: rms error {f} against {e}");
        }
        // MXFP4 by thresholds: ggml's levels but for float near-ties.
        let ty = GgmlType::MXFP4;
        let n = ty.row_bytes(x.len() as u64).unwrap() as usize;
        let (mut exact, mut fast) = (vec![0u8; n], vec![0u8; n]);
        quantize(ty, &x, &mut exact).unwrap();
        quantize_fast(ty, &x, &mut fast).unwrap();
        let differ = exact.iter().zip(&fast).filter(|(a, b)| a != b).count();
        assert!(differ * 1000 <= n, "MXFP4: {differ} of {n} bytes differ");
        assert!(rms(ty, &fast) <= 1.001 * rms(ty, &exact));
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::F16] {
            let n = ty.row_bytes(x.len() as u64).unwrap() as usize;
            let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
            quantize(ty, &x, &mut a).unwrap();
            quantize_fast(ty, &x, &mut b).unwrap();
            assert_eq!(a, b, "{ty}");
        }
    }
}
