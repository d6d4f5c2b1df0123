//! Q4_K and Q6_K products with the inputs rounded to 8 bits per block of
//! 256 (llama.cpp's `Q8_K`: one scale a block, and the sums of each 16
//! quants), as llama.cpp's CPU backend computes them: each 32-value (Q4_K)
//! or 16-value (Q6_K) part's integer dot product is multiplied by its
//! integer scale before anything is converted, so a whole block is one
//! integer sum, scaled once by the weight's and the input's `d`. The
//! unsigned quants' offsets (Q4_K's minimums, Q6_K's 32) come from the
//! input's per-16 sums. Four to eight times less arithmetic a weight than
//! unpacking it to f32 (the exact path, `fused.rs`); the result differs
//! from the exact product by the rounding of the inputs.
//!
//! A token's result is the same whatever number of tokens share the pass
//! (each token's arithmetic is its own: batch invariance).

use m40_gguf::quant::as_blocks;
use m40_gguf::quant::blocks::{BlockQ4K, BlockQ6K, QK_K};
use m40_gguf::{GgmlType, TensorView};
use rayon::prelude::*;

/// Tokens whose inputs meet each unpacked weight block together.
const TOKENS: usize = 4;

/// Output rows per rayon task.
const ROWS: usize = 16;

/// Whether `ty` has an 8-bit kernel here (Q4_K, Q6_K on AVX2).
pub fn supported(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) && super::simd::has_avx2()
}

/// Rows of inputs in blocks of 256: the quants, each block's scale
/// `max|x| / 127`, and each 16 quants' sum.
pub struct Q8KRows {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub bsums: Vec<i16>,
}

impl Q8KRows {
    /// `x` (rows whose length is a multiple of 256) quantized: to nearest,
    /// ties to even.
    pub fn quantize(x: &[f32]) -> Self {
        let nb = x.len() / QK_K;
        let (mut q, mut d, mut bsums) = (vec![0i8; x.len()], vec![0f32; nb], vec![0i16; nb * 16]);
        let avx2 = super::simd::has_avx2();
        for (b, (xb, qb)) in x
            .chunks_exact(QK_K)
            .zip(q.chunks_exact_mut(QK_K))
            .enumerate()
        {
            let amax = abs_max(xb, avx2);
            let scale = amax / 127.0;
            let id = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            round(xb, id, qb, avx2);
            d[b] = scale;
            for (s, part) in bsums[b * 16..(b + 1) * 16]
                .iter_mut()
                .zip(qb.chunks_exact(16))
            {
                *s = part.iter().map(|&v| v as i16).sum();
            }
        }
        Self { q, d, bsums }
    }
}

/// The largest |x| of a block; `avx2`: [`super::simd::has_avx2`].
fn abs_max(x: &[f32], avx2: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `has_avx2` detected AVX2, FMA and F16C.
        return unsafe { super::q8::avx2::abs_max(x) };
    }
    let _ = avx2;
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// `q = round(x id)`, to nearest, ties to even (the same on both paths).
fn round(x: &[f32], id: f32, q: &mut [i8], avx2: bool) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        for (x, q) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)) {
            let (x, q) = (x.try_into().expect("32"), q.try_into().expect("32"));
            // SAFETY: `has_avx2` detected AVX2, FMA and F16C.
            unsafe { super::q8::avx2::round32(x, id, q) };
        }
        return;
    }
    let _ = avx2;
    for (o, v) in q.iter_mut().zip(x) {
        *o = (v * id).round_ties_even() as i8;
    }
}

/// `out[t * n_out + r] = W[r, :] . x[t]` with the inputs rounded to 8 bits
/// per block of 256. Callers check [`supported`] first.
pub fn matmul_q8k(w: &TensorView<'_>, x: &[f32], n_tok: usize, out: &mut [f32]) {
    let (n_in, n_out) = (w.info.row_len(), w.info.n_rows());
    assert_eq!(x.len(), n_tok * n_in, "matmul input shape");
    assert_eq!(out.len(), n_tok * n_out, "matmul output shape");
    assert!(n_in.is_multiple_of(QK_K), "K-quant rows of whole blocks");
    assert!(supported(w.info.ty), "no 8-bit kernel for {}", w.info.ty);
    let a = Q8KRows::quantize(x);
    let (row_bytes, nb) = (w.info.row_bytes(), n_in / QK_K);
    let mut out_t = vec![0f32; n_tok * n_out];
    out_t
        .par_chunks_mut(ROWS * n_tok)
        .zip(w.data.par_chunks(ROWS * row_bytes))
        .for_each(|(dst, rows)| {
            for (row, o) in rows
                .chunks_exact(row_bytes)
                .zip(dst.chunks_exact_mut(n_tok))
            {
                let mut t0 = 0;
                while t0 < n_tok {
                    let n = (n_tok - t0).min(TOKENS);
                    let xs = Inputs { a: &a, t0, nb };
                    let ty = w.info.ty;
                    match n {
                        1 => o[t0..t0 + 1].copy_from_slice(&dot_row::<1>(ty, row, &xs)),
                        2 => o[t0..t0 + 2].copy_from_slice(&dot_row::<2>(ty, row, &xs)),
                        3 => o[t0..t0 + 3].copy_from_slice(&dot_row::<3>(ty, row, &xs)),
                        _ => o[t0..t0 + 4].copy_from_slice(&dot_row::<4>(ty, row, &xs)),
                    }
                    t0 += n;
                }
            }
        });
    super::matmul::untranspose(&out_t, n_tok, n_out, out);
}

/// The quantized inputs of a pass: tokens from `t0`, `nb` blocks each.
struct Inputs<'a> {
    a: &'a Q8KRows,
    t0: usize,
    nb: usize,
}

/// `row . x[t0 + i]` for `N` tokens.
fn dot_row<const N: usize>(ty: GgmlType, row: &[u8], xs: &Inputs<'_>) -> [f32; N] {
    let need = (xs.t0 + N) * xs.nb;
    assert!(xs.a.q.len() >= need * QK_K && xs.a.d.len() >= need && xs.a.bsums.len() >= need * 16);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `supported(ty)` (asserted by the caller) verified AVX2, FMA
    // and F16C; the assert above bounds every input read, and the blocks
    // come from the row's own bytes.
    unsafe {
        match ty {
            GgmlType::Q4_K => return avx2::q4_k(&as_blocks::<BlockQ4K>(row), xs),
            GgmlType::Q6_K => return avx2::q6_k(&as_blocks::<BlockQ6K>(row), xs),
            _ => {}
        }
    }
    let _ = (row, xs);
    unreachable!("dot_row called for {ty} without an 8-bit kernel")
}

/// Q4_K's eight 6-bit scales and eight 6-bit minimums from its 12 bytes
/// (`scale_min_k4`'s unpacking, four at a time).
pub(super) fn k4_scales(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (u0, u1, u2) = (w(0), w(1), w(2));
    let sc_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let m_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    sc[..4].copy_from_slice(&(u0 & KMASK1).to_le_bytes());
    sc[4..].copy_from_slice(&sc_hi.to_le_bytes());
    m[..4].copy_from_slice(&(u1 & KMASK1).to_le_bytes());
    m[4..].copy_from_slice(&m_hi.to_le_bytes());
    (sc, m)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::fused::avx2::{h2f, hsum};
    use super::{k4_scales, BlockQ4K, BlockQ6K, Inputs, QK_K};

    /// Token `t`'s quants, scale and 16-sums of block `b`.
    #[inline]
    fn input<'a>(xs: &'a Inputs<'_>, t: usize, b: usize) -> (&'a [i8], f32, &'a [i16]) {
        let blk = (xs.t0 + t) * xs.nb + b;
        (
            &xs.a.q[blk * QK_K..(blk + 1) * QK_K],
            xs.a.d[blk],
            &xs.a.bsums[blk * 16..(blk + 1) * 16],
        )
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load(p: &[u8]) -> __m256i {
        assert!(p.len() >= 32);
        // SAFETY: 32 readable bytes, checked above.
        unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load_x(p: &[i8]) -> __m256i {
        assert!(p.len() >= 32);
        // SAFETY: 32 readable bytes, checked above.
        unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
    }

    /// The 16 per-16 sums as i16.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn bsums(b: &[i16]) -> __m256i {
        assert!(b.len() >= 16);
        // SAFETY: 16 readable i16, checked above.
        unsafe { _mm256_loadu_si256(b.as_ptr() as *const __m256i) }
    }

    /// Q4_K: w = d sc_j q - dmin m_j over sub-block j of 32.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn q4_k<const N: usize>(w: &[BlockQ4K], xs: &Inputs<'_>) -> [f32; N] {
        let mask = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut off = [_mm256_setzero_ps(); N];
        for (b, blk) in w.iter().enumerate() {
            let (d, dmin) = (h2f(blk.d), h2f(blk.dmin));
            let (sc, m) = k4_scales(&blk.scales);
            // Each minimum twice: one a 16-sum.
            let m8 = _mm_cvtsi64_si128(i64::from_le_bytes(m));
            let m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
            let mut sumi = [_mm256_setzero_si256(); N];
            for k in 0..QK_K / 64 {
                let v = load(&blk.qs[32 * k..]);
                let lo = _mm256_and_si256(v, mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
                let (sl, sh) = (
                    _mm256_set1_epi16(sc[2 * k] as i16),
                    _mm256_set1_epi16(sc[2 * k + 1] as i16),
                );
                for (t, s) in sumi.iter_mut().enumerate() {
                    let (xq, _, _) = input(xs, t, b);
                    let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load_x(&xq[64 * k..])), sl);
                    let ph =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load_x(&xq[64 * k + 32..])), sh);
                    *s = _mm256_add_epi32(*s, _mm256_add_epi32(pl, ph));
                }
            }
            for t in 0..N {
                let (_, dx, bs) = input(xs, t, b);
                let mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(m16, bsums(bs)));
                acc[t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_set1_ps(d * dx), acc[t]);
                off[t] = _mm256_fmadd_ps(mins, _mm256_set1_ps(dmin * dx), off[t]);
            }
        }
        std::array::from_fn(|t| hsum(acc[t]) - hsum(off[t]))
    }

    /// Q6_K: w = d sc_j (q - 32) over part j of 16, q of six bits (four in
    /// `ql`, two in `qh`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn q6_k<const N: usize>(w: &[BlockQ6K], xs: &Inputs<'_>) -> [f32; N] {
        let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        let mut acc = [_mm256_setzero_ps(); N];
        for (b, blk) in w.iter().enumerate() {
            let d = h2f(blk.d);
            let sc: [i16; 16] = std::array::from_fn(|j| blk.scales[j] as i16);
            // SAFETY: 16 i16.
            let sc16 = unsafe { _mm256_loadu_si256(sc.as_ptr() as *const __m256i) };
            let mut sumi = [_mm256_setzero_si256(); N];
            for n in 0..QK_K / 128 {
                let q0 = load(&blk.ql[64 * n..]);
                let q1 = load(&blk.ql[64 * n + 32..]);
                let h = load(&blk.qh[32 * n..]);
                // Values 128n + 32i + l, i = 0..4, as unsigned 6-bit quants.
                let q: [__m256i; 4] = [
                    _mm256_or_si256(
                        _mm256_and_si256(q0, m4),
                        _mm256_and_si256(_mm256_slli_epi16::<4>(h), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(q1, m4),
                        _mm256_and_si256(_mm256_slli_epi16::<2>(h), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(q0), m4),
                        _mm256_and_si256(h, m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(q1), m4),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(h), m30),
                    ),
                ];
                for (i, qi) in q.iter().enumerate() {
                    // Parts 8n + 2i and 8n + 2i + 1: one scale a 128-bit half.
                    let j = 8 * n + 2 * i;
                    let s = _mm256_set_m128i(_mm_set1_epi16(sc[j + 1]), _mm_set1_epi16(sc[j]));
                    for (t, acc_i) in sumi.iter_mut().enumerate() {
                        let (xq, _, _) = input(xs, t, b);
                        let x = load_x(&xq[128 * n + 32 * i..]);
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*qi, x), s);
                        *acc_i = _mm256_add_epi32(*acc_i, p);
                    }
                }
            }
            for t in 0..N {
                let (_, dx, bs) = input(xs, t, b);
                // The quants' 32: sum_j sc_j 32 bsum_j, in integers.
                let shift = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bsums(bs)));
                let int = _mm256_sub_epi32(sumi[t], shift);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(int), _mm256_set1_ps(d * dx), acc[t]);
            }
        }
        std::array::from_fn(|t| hsum(acc[t]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use m40_gguf::quant::blocks::scale_min_k4;
    use m40_gguf::quant::dequantize;

    use crate::cpu::{fresh_seed, test_values as values};

    #[test]
    fn k4_scales_unpack_as_scale_min_k4() {
        let v = values(200 * 12, 0x1234_5678);
        for chunk in v.chunks_exact(12) {
            let bytes: [u8; 12] = std::array::from_fn(|i| (chunk[i] * 1e4) as i64 as u8);
            let (sc, m) = k4_scales(&bytes);
            for j in 0..8 {
                assert_eq!((sc[j], m[j]), scale_min_k4(j, &bytes), "{bytes:?} part {j}");
            }
        }
    }

    /// Every output against the exact product of the dequantized weights
    /// with the inputs as their quants give them (only the order of the
    /// float additions differs), poisoned first; each token's result the
    /// same bits alone and among others.
    #[test]
    fn eight_bit_k_products_match_their_reference() {
        let seed = fresh_seed(7);
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            if !supported(ty) {
                eprintln!("SKIP {ty}: no AVX2 here");
                continue;
            }
            let (rows, cols) = (21usize, 512usize);
            let w = values(rows * cols, seed ^ ty as u64);
            let file = super::super::matrix_file(ty, rows, cols, &w);
            let view = file.tensor("w").unwrap();
            let x = values(7 * cols, seed.wrapping_add(3));
            let alone: Vec<Vec<f32>> = (0..7)
                .map(|t| {
                    let mut o = vec![f32::NAN; rows];
                    matmul_q8k(&view, &x[t * cols..(t + 1) * cols], 1, &mut o);
                    o
                })
                .collect();
            for n_tok in [1usize, 2, 4, 5, 7] {
                let xs = &x[..n_tok * cols];
                let mut out = vec![f32::NAN; n_tok * rows];
                matmul_q8k(&view, xs, n_tok, &mut out);
                let a = Q8KRows::quantize(xs);
                let mut wr = vec![0f32; cols];
                for r in 0..rows {
                    dequantize(ty, view.row(r), &mut wr).unwrap();
                    for t in 0..n_tok {
                        let (mut want, mut norm) = (0f64, 0f64);
                        for (c, &wv) in wr.iter().enumerate() {
                            let i = t * cols + c;
                            let xv = a.q[i] as f64 * a.d[i / QK_K] as f64;
                            want += wv as f64 * xv;
                            norm += (wv as f64 * xv).abs();
                        }
                        let got = out[t * rows + r];
                        assert!(
                            (got as f64 - want).abs() <= 1e-5 * norm + 1e-6,
                            "{ty} n_tok {n_tok} row {r} token {t}: {got} vs {want}"
                        );
                        assert_eq!(
                            got.to_bits(),
                            alone[t][r].to_bits(),
                            "{ty} token {t} row {r}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn inputs_round_to_nearest_over_the_block_maximum() {
        let mut x = vec![0f32; 512];
        x[0] = -2.54;
        x[1] = 1.2;
        x[17] = 0.5;
        let a = Q8KRows::quantize(&x);
        assert!((a.d[0] - 0.02).abs() < 1e-7);
        assert_eq!(&a.q[..2], &[-127, 60]);
        assert_eq!(a.q[17], 25);
        assert_eq!(a.bsums[0], -67);
        assert_eq!(a.bsums[1], 25);
        assert_eq!((a.d[1], a.bsums[16]), (0.0, 0));
    }
}
