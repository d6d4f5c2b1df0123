//! Decode-time dot products straight from quantized blocks: the weights are
//! unpacked to f32 in AVX2 registers and multiplied into FP32 accumulators,
//! never written out. Used for the most common formats when only a few
//! tokens share a weight read; everything else takes the dequantize-rows path.

use m40_gguf::quant::as_blocks;
use m40_gguf::quant::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, QK32};
use m40_gguf::GgmlType;

/// Whether `ty` has a fused kernel on this CPU.
pub fn supported(ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        false
    }
}

/// Per-32-block sums of `x`, shared by every row of a Q4_0/Q4_1 product.
pub fn block_sums(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(QK32).map(|c| c.iter().sum()).collect()
}

/// `row . x` for one quantized row; `xsum` from [`block_sums`].
/// Callers check [`supported`] first.
pub fn dot_row(ty: GgmlType, row: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `supported(ty)` (checked by the caller) verified AVX2, FMA and F16C.
    unsafe {
        match ty {
            GgmlType::Q4_0 => return q4_0(&as_blocks::<BlockQ4_0>(row), x, xsum),
            GgmlType::Q4_1 => return q4_1(&as_blocks::<BlockQ4_1>(row), x, xsum),
            GgmlType::Q8_0 => return q8_0(&as_blocks::<BlockQ8_0>(row), x),
            _ => {}
        }
    }
    let _ = (row, x, xsum);
    unreachable!("dot_row called for {ty} without a fused kernel")
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// 16 packed nibbles -> the low and high 16 values as four f32x8.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn nibbles(qs: &[u8; 16]) -> [__m256; 4] {
        // SAFETY: qs is 16 readable bytes.
        let v = unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) };
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(v, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
        let f = |b: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
        [
            f(lo),
            f(_mm_srli_si128(lo, 8)),
            f(hi),
            f(_mm_srli_si128(hi, 8)),
        ]
    }

    /// An f16 scale to f32 with the F16C instruction.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn h2f(h: half::f16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }

    /// Sum over the block of q * x, q the four f32x8 of `nibbles`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn qx(q: [__m256; 4], x: &[f32]) -> __m256 {
        // SAFETY: x has 32 readable floats (one block).
        unsafe {
            let p = x.as_ptr();
            let a = _mm256_mul_ps(q[0], _mm256_loadu_ps(p));
            let a = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(p.add(8)), a);
            let a = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(p.add(16)), a);
            _mm256_fmadd_ps(q[3], _mm256_loadu_ps(p.add(24)), a)
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `x` holds 32 values per block.
unsafe fn q4_0(b: &[BlockQ4_0], x: &[f32], xsum: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    // x = d * (q - 8): sum = d * (sum q*x - 8 * sum x).
    let mut acc = _mm256_setzero_ps();
    let mut off = 0f32;
    for (i, blk) in b.iter().enumerate() {
        let d = avx2::h2f(blk.d);
        let v = avx2::qx(avx2::nibbles(&blk.qs), &x[i * QK32..]);
        acc = _mm256_fmadd_ps(v, _mm256_set1_ps(d), acc);
        off += d * xsum[i];
    }
    avx2::hsum(acc) - 8.0 * off
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `x` holds 32 values per block.
unsafe fn q4_1(b: &[BlockQ4_1], x: &[f32], xsum: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    // x = d * q + m: sum = d * sum q*x + m * sum x.
    let mut acc = _mm256_setzero_ps();
    let mut off = 0f32;
    for (i, blk) in b.iter().enumerate() {
        let v = avx2::qx(avx2::nibbles(&blk.qs), &x[i * QK32..]);
        acc = _mm256_fmadd_ps(v, _mm256_set1_ps(avx2::h2f(blk.d)), acc);
        off += avx2::h2f(blk.m) * xsum[i];
    }
    avx2::hsum(acc) + off
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `x` holds 32 values per block.
unsafe fn q8_0(b: &[BlockQ8_0], x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    for (i, blk) in b.iter().enumerate() {
        // SAFETY: qs is 32 bytes; x has 32 floats from i * 32.
        let v = unsafe {
            let q = _mm256_loadu_si256(blk.qs.as_ptr() as *const __m256i);
            let p = x.as_ptr().add(i * QK32);
            let lo = _mm256_castsi256_si128(q);
            let hi = _mm256_extracti128_si256(q, 1);
            let f = |b: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
            let a = _mm256_mul_ps(f(lo), _mm256_loadu_ps(p));
            let a = _mm256_fmadd_ps(f(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(p.add(8)), a);
            let a = _mm256_fmadd_ps(f(hi), _mm256_loadu_ps(p.add(16)), a);
            _mm256_fmadd_ps(f(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(p.add(24)), a)
        };
        acc = _mm256_fmadd_ps(v, _mm256_set1_ps(avx2::h2f(blk.d)), acc);
    }
    avx2::hsum(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use m40_gguf::quant::{dequantize_to_vec, quantize_to_vec};

    #[test]
    fn fused_dots_match_dequantize_then_dot() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            if !supported(ty) {
                eprintln!("SKIP {ty}: no AVX2/FMA on this CPU");
                continue;
            }
            for n in [32, 96, 576, 4096] {
                let w: Vec<f32> = (0..n)
                    .map(|i| (((i * 7919) % 1000) as f32 / 500.0 - 1.0) * 0.3)
                    .collect();
                let x: Vec<f32> = (0..n)
                    .map(|i| ((i * 104_729) % 997) as f32 / 498.5 - 1.0)
                    .collect();
                let q = quantize_to_vec(ty, &w).unwrap();
                let wd = dequantize_to_vec(ty, &q, n).unwrap();
                let want: f64 = wd.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                let got = dot_row(ty, &q, &x, &block_sums(&x)) as f64;
                let scale: f64 = wd
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                assert!(
                    (got - want).abs() <= 1e-5 * scale.max(1.0),
                    "{ty} n={n}: {got} vs {want}"
                );
            }
        }
    }
}
