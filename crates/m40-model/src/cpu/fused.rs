//! Decode-time dot products straight from quantized blocks: the weights are
//! unpacked to f32 in AVX2 registers and multiplied into FP32 accumulators,
//! never written out. Used for the most common formats when only a few
//! tokens share a weight read; everything else takes the dequantize-rows path.

use m40_gguf::quant::as_blocks;
use m40_gguf::quant::blocks::{
    scale_min_k4, BlockMXFP4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8_0, QK32, QK_K,
};
use m40_gguf::GgmlType;

/// Whether `ty` has a fused kernel on this CPU.
pub fn supported(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q8_0
            | GgmlType::Q4_K
            | GgmlType::Q6_K
            | GgmlType::MXFP4
    ) && super::simd::has_avx2()
}

/// Per-32-block sums of `x`, shared by every row of a Q4_0/Q4_1 product.
pub fn block_sums(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(QK32).map(|c| c.iter().sum()).collect()
}

/// `row . x` for one quantized row; `xsum` from [`block_sums`].
/// Callers check [`supported`] first.
pub fn dot_row(ty: GgmlType, row: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
    dot_rows::<1>(ty, row, [x], [xsum])[0]
}

/// `row . x[t]` for `N` tokens, each weight block unpacked once for all of
/// them; every token's result is bitwise [`dot_row`]'s (the same
/// operations in the same order: batch invariance). Callers check
/// [`supported`] first.
pub fn dot_rows<const N: usize>(
    ty: GgmlType,
    row: &[u8],
    x: [&[f32]; N],
    xsum: [&[f32]; N],
) -> [f32; N] {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `supported(ty)` (checked by the caller) verified AVX2, FMA and F16C.
    unsafe {
        match ty {
            GgmlType::Q4_0 => return q4_0(&as_blocks::<BlockQ4_0>(row), x, xsum),
            GgmlType::Q4_1 => return q4_1(&as_blocks::<BlockQ4_1>(row), x, xsum),
            GgmlType::Q8_0 => return q8_0(&as_blocks::<BlockQ8_0>(row), x),
            GgmlType::Q4_K => return q4_k(&as_blocks::<BlockQ4K>(row), x, xsum),
            GgmlType::Q6_K => return q6_k(&as_blocks::<BlockQ6K>(row), x),
            GgmlType::MXFP4 => return mxfp4(&as_blocks::<BlockMXFP4>(row), x),
            _ => {}
        }
    }
    let _ = (row, x, xsum);
    unreachable!("dot_row called for {ty} without a fused kernel")
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
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

    /// `sum(q[i] * x[i])` over `n` (a multiple of 8) bytes as unsigned (or
    /// signed) integers, as a vector of 8 partial sums.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn bytes_x(q: &[u8], x: &[f32], n: usize, signed: bool) -> __m256 {
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < n {
            // SAFETY: i + 8 <= n <= q.len(), x.len().
            unsafe {
                let b = _mm_loadl_epi64(q.as_ptr().add(i) as *const __m128i);
                let w = if signed {
                    _mm256_cvtepi8_epi32(b)
                } else {
                    _mm256_cvtepu8_epi32(b)
                };
                acc = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(w),
                    _mm256_loadu_ps(x.as_ptr().add(i)),
                    acc,
                );
            }
            i += 8;
        }
        acc
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
/// The CPU must support AVX2, FMA and F16C; each `x` holds 32 values per block.
unsafe fn q4_0<const N: usize>(b: &[BlockQ4_0], x: [&[f32]; N], xsum: [&[f32]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    // x = d * (q - 8): sum = d * (sum q*x - 8 * sum x).
    let mut acc = [_mm256_setzero_ps(); N];
    let mut off = [0f32; N];
    for (i, blk) in b.iter().enumerate() {
        let d = avx2::h2f(blk.d);
        let q = avx2::nibbles(&blk.qs);
        for t in 0..N {
            let v = avx2::qx(q, &x[t][i * QK32..]);
            acc[t] = _mm256_fmadd_ps(v, _mm256_set1_ps(d), acc[t]);
            off[t] += d * xsum[t][i];
        }
    }
    std::array::from_fn(|t| avx2::hsum(acc[t]) - 8.0 * off[t])
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
/// # Safety
/// The CPU must support AVX2, FMA and F16C; each `x` holds 32 values per block.
unsafe fn mxfp4<const N: usize>(b: &[BlockMXFP4], x: [&[f32]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    // The 16 FP4 levels (doubled) looked up per nibble with pshufb; the
    // block's power-of-two scale multiplies the block's sum.
    let table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    let mask = _mm_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, blk) in b.iter().enumerate() {
        let d = m40_gguf::quant::dequant::e8m0_half(blk.e);
        // SAFETY: qs is 16 bytes.
        let v = unsafe { _mm_loadu_si128(blk.qs.as_ptr() as *const __m128i) };
        let lo = _mm_shuffle_epi8(table, _mm_and_si128(v, mask));
        let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(v, 4), mask));
        let f = |b: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        let q = [
            f(lo),
            f(_mm_srli_si128(lo, 8)),
            f(hi),
            f(_mm_srli_si128(hi, 8)),
        ];
        for t in 0..N {
            let v = avx2::qx(q, &x[t][i * QK32..]);
            acc[t] = _mm256_fmadd_ps(v, _mm256_set1_ps(d), acc[t]);
        }
    }
    std::array::from_fn(|t| avx2::hsum(acc[t]))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
/// # Safety
/// The CPU must support AVX2, FMA and F16C; each `x` holds 32 values per block.
unsafe fn q4_1<const N: usize>(b: &[BlockQ4_1], x: [&[f32]; N], xsum: [&[f32]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    // x = d * q + m: sum = d * sum q*x + m * sum x.
    let mut acc = [_mm256_setzero_ps(); N];
    let mut off = [0f32; N];
    for (i, blk) in b.iter().enumerate() {
        let q = avx2::nibbles(&blk.qs);
        let (d, m) = (avx2::h2f(blk.d), avx2::h2f(blk.m));
        for t in 0..N {
            let v = avx2::qx(q, &x[t][i * QK32..]);
            acc[t] = _mm256_fmadd_ps(v, _mm256_set1_ps(d), acc[t]);
            off[t] += m * xsum[t][i];
        }
    }
    std::array::from_fn(|t| avx2::hsum(acc[t]) + off[t])
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
/// # Safety
/// The CPU must support AVX2, FMA and F16C; each `x` holds 32 values per block.
unsafe fn q8_0<const N: usize>(b: &[BlockQ8_0], x: [&[f32]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, blk) in b.iter().enumerate() {
        // SAFETY: qs is 32 bytes.
        let q = unsafe { _mm256_loadu_si256(blk.qs.as_ptr() as *const __m256i) };
        let lo = _mm256_castsi256_si128(q);
        let hi = _mm256_extracti128_si256(q, 1);
        let f = |b: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        let w = [
            f(lo),
            f(_mm_srli_si128(lo, 8)),
            f(hi),
            f(_mm_srli_si128(hi, 8)),
        ];
        let d = _mm256_set1_ps(avx2::h2f(blk.d));
        for t in 0..N {
            // SAFETY: x[t] has 32 floats from i * 32.
            let v = unsafe {
                let p = x[t].as_ptr().add(i * QK32);
                let a = _mm256_mul_ps(w[0], _mm256_loadu_ps(p));
                let a = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(p.add(8)), a);
                let a = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(p.add(16)), a);
                _mm256_fmadd_ps(w[3], _mm256_loadu_ps(p.add(24)), a)
            };
            acc[t] = _mm256_fmadd_ps(v, d, acc[t]);
        }
    }
    std::array::from_fn(|t| avx2::hsum(acc[t]))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
/// # Safety
/// The CPU must support AVX2, FMA and F16C; each `x` holds 256 values per block.
unsafe fn q4_k<const N: usize>(b: &[BlockQ4K], x: [&[f32]; N], xsum: [&[f32]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    // Per 32-value sub-block s: d * sc_s * sum(q x) - dmin * m_s * sum(x).
    let mut acc = [_mm256_setzero_ps(); N];
    let mut off = [0f32; N];
    let mut q = [0u8; QK_K];
    for (i, blk) in b.iter().enumerate() {
        for j in 0..QK_K / 64 {
            for l in 0..32 {
                q[64 * j + l] = blk.qs[32 * j + l] & 0xF;
                q[64 * j + 32 + l] = blk.qs[32 * j + l] >> 4;
            }
        }
        let (d, dmin) = (avx2::h2f(blk.d), avx2::h2f(blk.dmin));
        for s in 0..QK_K / 32 {
            let (sc, m) = scale_min_k4(s, &blk.scales);
            for t in 0..N {
                let xb = &x[t][i * QK_K..(i + 1) * QK_K];
                let v = avx2::bytes_x(&q[32 * s..], &xb[32 * s..], 32, false);
                acc[t] = _mm256_fmadd_ps(v, _mm256_set1_ps(d * sc as f32), acc[t]);
                off[t] += dmin * m as f32 * xsum[t][i * 8 + s];
            }
        }
    }
    std::array::from_fn(|t| avx2::hsum(acc[t]) - off[t])
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
/// # Safety
/// The CPU must support AVX2, FMA and F16C; each `x` holds 256 values per block.
unsafe fn q6_k<const N: usize>(b: &[BlockQ6K], x: [&[f32]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    // Value i of a block has scale index i / 16 (see dequant::block_q6_k).
    let mut acc = [_mm256_setzero_ps(); N];
    let mut q = [0u8; QK_K];
    for (i, blk) in b.iter().enumerate() {
        for n in 0..QK_K / 128 {
            let (ql, qh) = (&blk.ql[64 * n..64 * n + 64], &blk.qh[32 * n..32 * n + 32]);
            let y = &mut q[128 * n..128 * n + 128];
            for l in 0..32 {
                y[l] = (((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32) as u8;
                y[l + 32] = (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32) as u8;
                y[l + 64] = (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32) as u8;
                y[l + 96] = (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32) as u8;
            }
        }
        let d = avx2::h2f(blk.d);
        for s in 0..QK_K / 16 {
            let sc = _mm256_set1_ps(d * blk.scales[s] as f32);
            for t in 0..N {
                let xb = &x[t][i * QK_K..(i + 1) * QK_K];
                let v = avx2::bytes_x(&q[16 * s..], &xb[16 * s..], 16, true);
                acc[t] = _mm256_fmadd_ps(v, sc, acc[t]);
            }
        }
    }
    std::array::from_fn(|t| avx2::hsum(acc[t]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use m40_gguf::quant::{dequantize_to_vec, quantize_to_vec};

    /// Random K-quant rows with finite scales: random bytes, then each block's
    /// f16 scale fields overwritten with small values.
    fn random_k_row(ty: GgmlType, n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        let mut bytes: Vec<u8> = (0..ty.row_bytes(n as u64).unwrap())
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect();
        let scale = half::f16::from_f32(0.01).to_le_bytes();
        for blk in bytes.chunks_exact_mut(ty.block_bytes()) {
            match ty {
                GgmlType::Q4_K => {
                    blk[0..2].copy_from_slice(&scale);
                    blk[2..4].copy_from_slice(&scale);
                }
                GgmlType::Q6_K => {
                    let at = blk.len() - 2;
                    blk[at..].copy_from_slice(&scale);
                }
                _ => unreachable!(),
            }
        }
        bytes
    }

    #[test]
    fn fused_k_quant_dots_match_dequantize_then_dot() {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            if !supported(ty) {
                eprintln!("SKIP {ty}: no AVX2/FMA/F16C on this CPU");
                continue;
            }
            for (n, seed) in [(256, 1), (512, 2), (2048, 3)] {
                let q = random_k_row(ty, n, seed);
                let x: Vec<f32> = (0..n)
                    .map(|i| ((i * 104_729) % 997) as f32 / 498.5 - 1.0)
                    .collect();
                let wd = dequantize_to_vec(ty, &q, n).unwrap();
                let want: f64 = wd.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                let scale: f64 = wd
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                let got = dot_row(ty, &q, &x, &block_sums(&x)) as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * scale.max(1.0),
                    "{ty} n={n}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn fused_dots_match_dequantize_then_dot() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::MXFP4,
        ] {
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
