//! Matrix products with the activations rounded to 8 bits, as llama.cpp's
//! CPU backend computes them: each token's input is quantized per block of
//! 32 values (Q8: `d = max|x| / 127`, `q = round(x / d)`), and a weight block
//! times an input block is an integer dot product of the quants (AVX2
//! `maddubs`), scaled once by both `d`s. Four times less arithmetic per
//! weight than unpacking the weights to f32; the result differs from the
//! exact product by the rounding of the inputs (about 0.4% of an input's
//! block maximum), which costs llama.cpp ~0.3% in perplexity.
//!
//! Used by [`super::CpuMath::Quantized`] for Q4_0, Q4_1 and Q8_0 weights;
//! other formats, and machines without AVX2, take the exact path.

use m40_gguf::quant::as_blocks;
use m40_gguf::quant::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, QK32};
use m40_gguf::{GgmlType, TensorView};
use rayon::prelude::*;

use super::simd::has_avx2;

/// Tokens whose inputs meet each unpacked weight block together.
const TOKENS: usize = 4;

/// Output rows per rayon task.
const ROWS: usize = 32;

/// Whether `ty` has an 8-bit kernel on this CPU.
pub fn supported(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0) && has_avx2()
}

/// Rows of inputs quantized to 8 bits per block of 32.
/// q: (n_tok, n_in); d, s: (n_tok, n_in / 32).
pub struct Q8Rows {
    /// The quants.
    pub q: Vec<i8>,
    /// Each block's scale.
    pub d: Vec<f32>,
    /// Each block's `d * sum(q)`: the block's sum as the quants give it
    /// (Q4_1's minimum multiplies it).
    pub s: Vec<f32>,
    n_in: usize,
}

impl Q8Rows {
    /// `x` (n_tok rows of `n_in`, a multiple of 32) quantized.
    pub fn quantize(x: &[f32], n_in: usize) -> Self {
        let n_blocks = x.len() / QK32;
        let (mut q, mut d, mut s) = (
            vec![0i8; x.len()],
            vec![0f32; n_blocks],
            vec![0f32; n_blocks],
        );
        let avx2 = has_avx2();
        for (b, (xb, qb)) in x
            .chunks_exact(QK32)
            .zip(q.chunks_exact_mut(QK32))
            .enumerate()
        {
            let xb: &[f32; QK32] = xb.try_into().expect("a block of 32");
            let qb: &mut [i8; QK32] = qb.try_into().expect("a block of 32");
            (d[b], s[b]) = quantize_block(xb, qb, avx2);
        }
        Self { q, d, s, n_in }
    }

    fn blocks(&self) -> usize {
        self.n_in / QK32
    }
}

/// One block: its scale `max|x| / 127`, the quants `round(x / d)` (to
/// nearest, ties to even, as llama.cpp's AVX2 code rounds), and
/// `d * sum(q)`.
/// `avx2`: [`has_avx2`], asked once by the caller.
fn quantize_block(x: &[f32; QK32], q: &mut [i8; QK32], avx2: bool) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `has_avx2` detected AVX2, FMA and F16C.
        return unsafe { avx2::quantize_block(x, q) };
    }
    let _ = avx2;
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (o, v) in q.iter_mut().zip(x) {
        let r = (v * id).round_ties_even() as i32;
        *o = r as i8;
        sum += r;
    }
    (d, d * sum as f32)
}

/// `out[t * n_out + r] = W[r, :] . x[t]` as [`super::matmul::matmul`], with
/// the inputs rounded to 8 bits. Callers check [`supported`] first.
pub fn matmul_q8(w: &TensorView<'_>, x: &[f32], n_tok: usize, out: &mut [f32]) {
    let (n_in, n_out) = (w.info.row_len(), w.info.n_rows());
    assert_eq!(x.len(), n_tok * n_in, "matmul input shape");
    assert_eq!(out.len(), n_tok * n_out, "matmul output shape");
    let a = Q8Rows::quantize(x, n_in);
    let row_bytes = w.info.row_bytes();
    // Transposed: a task owns a run of rows, all tokens of each.
    let mut out_t = vec![0f32; n_tok * n_out];
    out_t
        .par_chunks_mut(ROWS * n_tok)
        .zip(w.data.par_chunks(ROWS * row_bytes))
        .for_each(|(dst, rows)| {
            for t0 in (0..n_tok).step_by(TOKENS) {
                let args = (w.info.ty, rows, row_bytes, &a, t0, &mut *dst, n_tok);
                match (n_tok - t0).min(TOKENS) {
                    1 => dot_rows::<1>(args),
                    2 => dot_rows::<2>(args),
                    3 => dot_rows::<3>(args),
                    _ => dot_rows::<TOKENS>(args),
                }
            }
        });
    super::matmul::untranspose(&out_t, n_tok, n_out, out);
}

/// For each row of `rows` (`row_bytes` each): `dst[r * n_tok + t0 + i] =
/// row . x[t0 + i]` for `N` tokens; each weight block is unpacked once for
/// all of them.
type DotArgs<'a, 'b> = (
    GgmlType,
    &'a [u8],
    usize,
    &'a Q8Rows,
    usize,
    &'b mut [f32],
    usize,
);

fn dot_rows<const N: usize>((ty, rows, row_bytes, a, t0, dst, n_tok): DotArgs<'_, '_>) {
    let nb = a.blocks();
    let x = Tokens::<N> {
        q: std::array::from_fn(|i| &a.q[(t0 + i) * a.n_in..(t0 + i + 1) * a.n_in]),
        d: std::array::from_fn(|i| &a.d[(t0 + i) * nb..(t0 + i + 1) * nb]),
        s: std::array::from_fn(|i| &a.s[(t0 + i) * nb..(t0 + i + 1) * nb]),
    };
    for (row, o) in rows
        .chunks_exact(row_bytes)
        .zip(dst.chunks_exact_mut(n_tok))
    {
        o[t0..t0 + N].copy_from_slice(&dot_row(ty, row, &x));
    }
}

/// `row . x[i]` for the `N` tokens of `x`.
fn dot_row<const N: usize>(ty: GgmlType, row: &[u8], x: &Tokens<'_, N>) -> [f32; N] {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `supported(ty)` (checked by the caller) verified AVX2, FMA and F16C.
    unsafe {
        match ty {
            GgmlType::Q4_0 => return avx2::q4_0(&as_blocks::<BlockQ4_0>(row), x),
            GgmlType::Q4_1 => return avx2::q4_1(&as_blocks::<BlockQ4_1>(row), x),
            GgmlType::Q8_0 => return avx2::q8_0(&as_blocks::<BlockQ8_0>(row), x),
            _ => {}
        }
    }
    let _ = (row, x);
    unreachable!("dot_row called for {ty} without an 8-bit kernel")
}

/// The quantized inputs of `N` tokens: quants, scales and sums by block.
pub(super) struct Tokens<'a, const N: usize> {
    q: [&'a [i8]; N],
    d: [&'a [f32]; N],
    s: [&'a [f32]; N],
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    use super::super::fused::avx2::{h2f, hsum};
    use super::{BlockQ4_0, BlockQ4_1, BlockQ8_0, Tokens, QK32};

    /// 16 bytes of nibbles as 32 unsigned bytes: the low nibbles (values
    /// 0..15 of the block) then the high ones (16..31), ggml's order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn nibbles(qs: &[u8; 16]) -> __m256i {
        // SAFETY: qs is 16 readable bytes.
        let v = unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) };
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(v, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
        _mm256_set_m128i(hi, lo)
    }

    /// Sums of adjacent products of unsigned `u` and signed `s` bytes, as
    /// eight i32 (each of 4 products) converted to f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn udot(u: __m256i, s: __m256i) -> __m256 {
        let p16 = _mm256_maddubs_epi16(u, s);
        _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
    }

    /// The same for two signed vectors (|w| times the sign moved onto x).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn sdot(w: __m256i, x: __m256i) -> __m256 {
        udot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
    }

    /// [`super::quantize_block`] in registers.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn quantize_block(x: &[f32; QK32], q: &mut [i8; QK32]) -> (f32, f32) {
        let amax = abs_max(x);
        let d = amax / 127.0;
        let total = round32(x, if d > 0.0 { 1.0 / d } else { 0.0 }, q);
        (d, d * total as f32)
    }

    /// The largest |x| of `x` (a multiple of 8 values).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn abs_max(x: &[f32]) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let m = x.chunks_exact(8).fold(_mm256_setzero_ps(), |m, c| {
            // SAFETY: c holds 8 floats.
            let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            _mm256_max_ps(m, _mm256_andnot_ps(sign, v))
        });
        hmax(m)
    }

    /// `q = round(x id)` (to nearest, ties to even, as llama.cpp's AVX2
    /// code rounds) for 32 values; returns the quants' sum.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn round32(x: &[f32; QK32], id: f32, q: &mut [i8; QK32]) -> i32 {
        let p = x.as_ptr();
        // SAFETY: x holds 32 floats: four loads of 8.
        let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(p.add(8 * i)) });
        let id = _mm256_set1_ps(id);
        let r: [__m256i; 4] = std::array::from_fn(|i| {
            _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(_mm256_mul_ps(v[i], id)))
        });
        // Sum of the quants, then i32 -> i16 -> i8 (packs interleave the
        // 128-bit lanes: the permute puts the values back in order).
        let sum = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
        let s16 = _mm256_hadd_epi32(sum, sum);
        let s16 = _mm256_hadd_epi32(s16, s16);
        let total = _mm256_extract_epi32::<0>(s16) + _mm256_extract_epi32::<4>(s16);
        let w01 = _mm256_packs_epi32(r[0], r[1]);
        let w23 = _mm256_packs_epi32(r[2], r[3]);
        let b = _mm256_packs_epi16(w01, w23);
        let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: q holds 32 bytes.
        unsafe { _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, b) };
        total
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)))
    }

    /// Pointers to token `i`'s quants, scales and sums, checked once to
    /// hold `nb` blocks.
    #[inline]
    fn rows<const N: usize>(
        x: &Tokens<'_, N>,
        nb: usize,
    ) -> [(*const i8, *const f32, *const f32); N] {
        std::array::from_fn(|i| {
            assert!(x.q[i].len() >= nb * QK32 && x.d[i].len() >= nb && x.s[i].len() >= nb);
            (x.q[i].as_ptr(), x.d[i].as_ptr(), x.s[i].as_ptr())
        })
    }

    /// Weights of signed quants, `w = d q`: each block unpacked by `unpack`
    /// into its 32 quants and its scale, dotted with every token's block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn signed<B, const N: usize>(
        w: &[B],
        x: &Tokens<'_, N>,
        unpack: impl Fn(&B) -> (__m256i, f32),
    ) -> [f32; N] {
        let p = rows(x, w.len());
        let mut acc = [_mm256_setzero_ps(); N];
        for (b, blk) in w.iter().enumerate() {
            let (q, dw) = unpack(blk);
            for i in 0..N {
                // SAFETY: b < w.len(), which `rows` checked every token holds.
                let (xq, dx) = unsafe {
                    (
                        _mm256_loadu_si256(p[i].0.add(b * QK32) as *const __m256i),
                        *p[i].1.add(b),
                    )
                };
                acc[i] = _mm256_fmadd_ps(sdot(q, xq), _mm256_set1_ps(dw * dx), acc[i]);
            }
        }
        acc.map(|a| hsum(a))
    }

    /// Q4_0: w = d (q - 8).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn q4_0<const N: usize>(w: &[BlockQ4_0], x: &Tokens<'_, N>) -> [f32; N] {
        signed(w, x, |blk| {
            let q = _mm256_sub_epi8(nibbles(&blk.qs), _mm256_set1_epi8(8));
            (q, h2f(blk.d))
        })
    }

    /// Q4_1: w = d q + m; a block's dot is d dx (q . qx) + m (dx sum qx).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn q4_1<const N: usize>(w: &[BlockQ4_1], x: &Tokens<'_, N>) -> [f32; N] {
        let p = rows(x, w.len());
        let mut acc = [_mm256_setzero_ps(); N];
        let mut off = [0f32; N];
        for (b, blk) in w.iter().enumerate() {
            let q = nibbles(&blk.qs);
            // d and m side by side: one conversion.
            // SAFETY: d and m are the block's first 4 bytes.
            let dm = unsafe {
                _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(
                    blk as *const BlockQ4_1 as *const i32,
                )))
            };
            let (dw, mw) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
            for i in 0..N {
                // SAFETY: b < w.len(), which `rows` checked every token holds.
                let (xq, dx, sx) = unsafe {
                    (
                        _mm256_loadu_si256(p[i].0.add(b * QK32) as *const __m256i),
                        *p[i].1.add(b),
                        *p[i].2.add(b),
                    )
                };
                acc[i] = _mm256_fmadd_ps(udot(q, xq), _mm256_set1_ps(dw * dx), acc[i]);
                off[i] = mw.mul_add(sx, off[i]);
            }
        }
        std::array::from_fn(|i| hsum(acc[i]) + off[i])
    }

    /// Q8_0: w = d q.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn q8_0<const N: usize>(w: &[BlockQ8_0], x: &Tokens<'_, N>) -> [f32; N] {
        signed(w, x, |blk| {
            // SAFETY: qs is 32 readable bytes.
            let q = unsafe { _mm256_loadu_si256(blk.qs.as_ptr() as *const __m256i) };
            (q, h2f(blk.d))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use m40_gguf::quant::dequantize;

    use crate::cpu::{fresh_seed, test_values as values};

    /// Every output of the 8-bit product against the exact product of the
    /// dequantized weights with the inputs as the quants give them (the
    /// only rounding is the inputs'), and against the exact inputs within
    /// the input rounding's bound.
    #[test]
    fn eight_bit_products_match_their_reference() {
        let seed = fresh_seed(1);
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            if !supported(ty) {
                eprintln!("SKIP {ty}: no AVX2 here");
                continue;
            }
            let (rows, cols) = (37usize, 320usize);
            let w = values(rows * cols, seed ^ ty as u64);
            let file = super::super::matrix_file(ty, rows, cols, &w);
            let view = file.tensor("w").unwrap();
            for n_tok in [1usize, 3, 4, 9] {
                let mut x = values(n_tok * cols, seed.wrapping_add(n_tok as u64));
                x[5] = 0.0;
                x[cols..].iter_mut().take(32).for_each(|v| *v = 0.0); // an all-zero block
                let mut out = vec![f32::NAN; n_tok * rows];
                matmul_q8(&view, &x, n_tok, &mut out);
                let a = Q8Rows::quantize(&x, cols);
                let xq: Vec<f32> =
                    a.q.iter()
                        .enumerate()
                        .map(|(i, &q)| q as f32 * a.d[i / QK32])
                        .collect();
                let mut wr_row = vec![0f32; cols];
                for r in 0..rows {
                    dequantize(ty, view.row(r), &mut wr_row).unwrap();
                    for t in 0..n_tok {
                        let xt = &xq[t * cols..(t + 1) * cols];
                        let want: f64 = wr_row
                            .iter()
                            .zip(xt)
                            .map(|(&w, &x)| w as f64 * x as f64)
                            .sum();
                        let norm: f64 = wr_row
                            .iter()
                            .zip(xt)
                            .map(|(&w, &x)| (w as f64 * x as f64).abs())
                            .sum();
                        let got = out[t * rows + r] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * norm + 1e-6,
                            "{ty} n_tok {n_tok} row {r} token {t}: {got} vs {want}"
                        );
                        // Against the exact inputs: within the rounding of
                        // the inputs (half a quant step per value).
                        let exact: f64 = wr_row
                            .iter()
                            .zip(&x[t * cols..(t + 1) * cols])
                            .map(|(&w, &x)| w as f64 * x as f64)
                            .sum();
                        let bound: f64 = (0..cols / QK32)
                            .map(|b| {
                                let step = a.d[t * cols / QK32 + b] as f64 / 2.0;
                                wr_row[b * QK32..(b + 1) * QK32]
                                    .iter()
                                    .map(|w| w.abs() as f64 * step)
                                    .sum::<f64>()
                            })
                            .sum();
                        assert!(
                            (got - exact).abs() <= bound * 1.001 + 1e-5,
                            "{ty}: {got} vs exact {exact} (bound {bound})"
                        );
                    }
                }
            }
        }
    }

    /// The AVX2 quantizer gives what the plain one does, on fresh values.
    #[test]
    fn both_quantizers_agree() {
        let seed = fresh_seed(3);
        let mut x = values(32 * 64, seed);
        x[..32].iter_mut().for_each(|v| *v = 0.0);
        x[40] = 1e-30;
        for (i, b) in x.chunks_exact(32).enumerate() {
            let b: &[f32; 32] = b.try_into().unwrap();
            let mut q = [0i8; 32];
            let (d, s) = quantize_block(b, &mut q, has_avx2());
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(d, amax / 127.0, "block {i}");
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let want: Vec<i8> = b.iter().map(|v| (v * id).round_ties_even() as i8).collect();
            assert_eq!(&q[..], &want[..], "block {i}");
            let sum: i32 = want.iter().map(|&v| v as i32).sum();
            assert_eq!(s, d * sum as f32, "block {i}");
        }
    }

    #[test]
    fn quantization_is_round_to_nearest_over_the_block_maximum() {
        let mut x = vec![0f32; 64];
        x[0] = -2.54;
        x[1] = 1.2;
        x[2] = 0.004;
        let a = Q8Rows::quantize(&x, 64);
        assert!((a.d[0] - 0.02).abs() < 1e-7);
        assert_eq!(&a.q[..3], &[-127, 60, 0]);
        assert_eq!((a.d[1], a.s[1]), (0.0, 0.0));
        assert!((a.s[0] - 0.02 * (-127 + 60) as f32).abs() < 1e-6);
    }
}
