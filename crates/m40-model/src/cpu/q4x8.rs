//! Q4_0 matrices repacked for the CPU's 8-bit products: eight rows
//! interleaved four bytes at a time (llama.cpp's CPU backend repacks Q4_0
//! in the same spirit, its `q4_0_8x8`), so that each 32-bit lane of a
//! vector is one row: an input's four bytes, broadcast, meet the same four
//! bytes of all eight rows in one multiply-add, a block's eight integer
//! sums end in one vector, and one conversion and one multiply-add a
//! token and block scale them, against four of each when a row's sum was
//! four lanes. The arithmetic is [`super::q8`]'s: the inputs rounded to 8
//! bits per block of 32, an exact integer dot product per block, scaled by
//! the weight's and the input's `d` (multiplied first, as there).
//!
//! The nibbles are used unsigned (0..15): a block's `(q - 8) . x` is
//! `q . x - 8 sum(x)`, and the `-8 sum(x)` part, which every row shares,
//! is computed once per input block and starts each block's integer sum.
//! So the integer sums equal [`super::q8`]'s exactly; AVX2 (`maddubs`) and
//! AVX-512 VNNI (`vpdpbusd`) compute the same integers, and a token's
//! result never depends on how many tokens share the pass (batch
//! invariance).
//!
//! Layout of a group of eight rows: for each block index, the eight rows'
//! f16 scales (16 bytes), then for each quarter c of the nibbles (bytes 4c
//! .. 4c + 3 of a row's 16: values 4c .. 4c + 3 in their low nibbles, 16 +
//! 4c .. in their high ones) the eight rows' four bytes in row order (32
//! bytes): the same 144 bytes as the eight GGUF blocks.
//!
//! Q8_0 the same way (its weights signed, -128 ..= 127): for each eighth c
//! of a block the eight rows' bytes 4c .. 4c + 3 plus 128 (unsigned, 272
//! bytes as the eight GGUF blocks). VNNI multiplies those and starts each
//! block's sum from `-128 sum(x)`; AVX2 takes the signed weight back and
//! multiplies its magnitude by the input signed as it (`maddubs` of
//! unsigned 128 by 127, twice, stays below 2^15): the same integers.

use m40_gguf::quant::blocks::QK32;
use m40_gguf::{GgmlType, TensorView};
use rayon::prelude::*;

use super::group8::{each_group, matmul_groups, Put, GROUP};
use super::q8::Q8Rows;

/// Bytes of one block index of a group: eight f16 scales, then eight rows'
/// 16 bytes of nibbles (Q4_0) or 32 of quants (Q8_0).
const GROUP_BLOCK: usize = GROUP * 2 + GROUP * 16;
const Q8_GROUP_BLOCK: usize = GROUP * 2 + GROUP * 32;

/// Bytes of a GGUF Q4_0 block: its f16 scale, then 16 bytes of nibbles.
const Q4_0_BLOCK: usize = 18;
const Q8_0_BLOCK: usize = 34;

/// Groups per rayon task (32 rows, as [`super::q8`]'s tasks).
const TASK_GROUPS: usize = 4;

/// Whether this CPU runs the repacked products (AVX2, FMA, F16C).
pub fn supported() -> bool {
    super::simd::has_avx2()
}

/// Whether it also has AVX-512 VNNI on 256-bit vectors (and so 32 of them).
pub(super) fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        supported()
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A Q4_0 or Q8_0 matrix of whole groups of eight rows, repacked.
pub struct PackedQ4 {
    q8: bool,
    data: Vec<u8>,
    n_in: usize,
    n_out: usize,
}

impl PackedQ4 {
    /// `w` repacked, where it is a Q4_0 or Q8_0 matrix of a multiple of
    /// eight rows.
    pub fn pack(w: &TensorView<'_>) -> Option<Self> {
        let info = w.info;
        let q8 = info.ty == GgmlType::Q8_0;
        let (block, group_block) = match q8 {
            true => (Q8_0_BLOCK, Q8_GROUP_BLOCK),
            false => (Q4_0_BLOCK, GROUP_BLOCK),
        };
        let ok = matches!(info.ty, GgmlType::Q4_0 | GgmlType::Q8_0)
            && info.shape.len() == 2
            && info.n_rows().is_multiple_of(GROUP)
            && info.row_len().is_multiple_of(QK32);
        if !ok {
            return None;
        }
        let (n_in, n_out) = (info.row_len(), info.n_rows());
        let (nb, row_bytes) = (n_in / QK32, info.row_bytes());
        debug_assert_eq!(row_bytes, nb * block);
        if w.data.len() != n_out * row_bytes {
            return None;
        }
        let mut data = vec![0u8; n_out / GROUP * nb * group_block];
        data.par_chunks_mut(nb * group_block)
            .zip(w.data.par_chunks(GROUP * row_bytes))
            .for_each(|(dst, rows)| {
                for (b, out) in dst.chunks_exact_mut(group_block).enumerate() {
                    for r in 0..GROUP {
                        let blk = &rows[r * row_bytes + b * block..][..block];
                        out[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
                        for c in 0..(block - 2) / 4 {
                            let at = GROUP * 2 + GROUP * 4 * c + 4 * r;
                            out[at..at + 4].copy_from_slice(&blk[2 + 4 * c..][..4]);
                            if q8 {
                                out[at..at + 4].iter_mut().for_each(|v| *v ^= 0x80);
                            }
                        }
                    }
                }
            });
        Some(Self {
            q8,
            data,
            n_in,
            n_out,
        })
    }

    /// `out[t * n_out + r] = W[r, :] . x[t]` as [`super::q8::matmul_q8`]
    /// computes it (the same integers, the same scale products). Callers
    /// check [`supported`] first.
    pub fn matmul(&self, x: &[f32], n_tok: usize, out: &mut [f32]) {
        let (n_in, n_out) = (self.n_in, self.n_out);
        assert_eq!(x.len(), n_tok * n_in, "matmul input shape");
        assert_eq!(out.len(), n_tok * n_out, "matmul output shape");
        assert!(
            supported(),
            "the repacked Q4_0 product needs AVX2, FMA and F16C"
        );
        let a = Q8Rows::quantize(x, n_in);
        let corr = corrections(&a.q, if self.q8 { 128 } else { 8 });
        let nb = n_in / QK32;
        let (vnni, q8) = (has_vnni(), self.q8);
        let group_block = if q8 { Q8_GROUP_BLOCK } else { GROUP_BLOCK };
        // Q4_0 with VNNI: two groups a pass (16 rows, 512-bit vectors) from
        // 4 tokens on (`group`).
        let pass_groups = if vnni && !q8 { 2 } else { 1 };
        matmul_groups(
            &self.data,
            (nb * group_block, TASK_GROUPS, pass_groups),
            n_tok,
            out,
            |g, t0, left, put| {
                let xs = Inputs {
                    a: &a,
                    corr: &corr,
                    t0,
                    nb,
                };
                group(q8, g, &xs, left, vnni, put)
            },
        );
    }
}

/// Each input block's `-bias sum(x)` (the weights' offset: Q4_0's 8,
/// Q8_0's 128 as VNNI multiplies it): where every row's integer sum of
/// that block starts.
fn corrections(q: &[i8], bias: i32) -> Vec<i32> {
    q.chunks_exact(QK32)
        .map(|blk| -bias * blk.iter().map(|&v| v as i32).sum::<i32>())
        .collect()
}

/// The quantized inputs of a pass: tokens from `t0`, `nb` blocks each.
struct Inputs<'a> {
    a: &'a Q8Rows,
    corr: &'a [i32],
    t0: usize,
    nb: usize,
}

/// One group's eight sums for the next tokens of `xs` (up to 8 with VNNI,
/// which has 32 vector registers, 4 without), handed to `put(token,
/// sums)`; returns how many tokens it did.
fn group(q8: bool, g: &[u8], xs: &Inputs<'_>, left: usize, vnni: bool, put: Put<'_>) -> usize {
    let gb = xs.nb * if q8 { Q8_GROUP_BLOCK } else { GROUP_BLOCK };
    assert!(g.len() >= gb);
    let need = (xs.t0 + left.min(if vnni { 8 } else { 4 })) * xs.nb;
    assert!(xs.a.q.len() >= need * QK32 && xs.a.d.len() >= need && xs.corr.len() >= need);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller checked `supported` (AVX2, FMA, F16C) and `vnni`
    // is `has_vnni`; the asserts above bound every read.
    unsafe {
        macro_rules! run {
            ($vnni:ident, $avx2:ident) => {
                match (vnni, left) {
                    (true, 1) => x86::emit(x86::$vnni::<1>(g, xs), 0, put),
                    (true, 2) => x86::emit(x86::$vnni::<2>(g, xs), 0, put),
                    (true, 3) => x86::emit(x86::$vnni::<3>(g, xs), 0, put),
                    (true, 4) => x86::emit(x86::$vnni::<4>(g, xs), 0, put),
                    (true, 5) => x86::emit(x86::$vnni::<5>(g, xs), 0, put),
                    (true, 6) => x86::emit(x86::$vnni::<6>(g, xs), 0, put),
                    (true, 7) => x86::emit(x86::$vnni::<7>(g, xs), 0, put),
                    (true, _) => x86::emit(x86::$vnni::<8>(g, xs), 0, put),
                    (false, 1) => x86::emit(x86::$avx2::<1>(g, xs), 0, put),
                    (false, 2) => x86::emit(x86::$avx2::<2>(g, xs), 0, put),
                    (false, 3) => x86::emit(x86::$avx2::<3>(g, xs), 0, put),
                    (false, _) => x86::emit(x86::$avx2::<4>(g, xs), 0, put),
                }
            };
        }
        if g.len() >= 2 * gb && (q8 || !vnni || left < 4) {
            // Several groups, 8 rows a pass: each in turn (the same tokens).
            // Fewer than 4 tokens (a decode) read weights more than they
            // multiply them, and the 16-row pass's two streams of them
            // (one a group) ran a 1B's decode at 25 t/s against the 8-row
            // pass's 40 on this project's CPU machine.
            return each_group(g, gb, put, |one, put| group(q8, one, xs, left, vnni, put));
        }
        if g.len() >= 2 * gb {
            // Two groups: 16 rows a 512-bit vector.
            return match left {
                1 => x86::emit(x86::vnni16::<1>(g, xs), 0, put),
                2 => x86::emit(x86::vnni16::<2>(g, xs), 0, put),
                3 => x86::emit(x86::vnni16::<3>(g, xs), 0, put),
                4 => x86::emit(x86::vnni16::<4>(g, xs), 0, put),
                5 => x86::emit(x86::vnni16::<5>(g, xs), 0, put),
                6 => x86::emit(x86::vnni16::<6>(g, xs), 0, put),
                7 => x86::emit(x86::vnni16::<7>(g, xs), 0, put),
                _ => x86::emit(x86::vnni16::<8>(g, xs), 0, put),
            };
        }
        match q8 {
            true => run!(q8_vnni, q8_avx2),
            false => run!(vnni, avx2),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (g, vnni, put);
        unreachable!("the repacked Q4_0 product runs on x86-64 only")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    pub use super::super::group8::{emit, store, Sums};
    use super::{Inputs, GROUP, GROUP_BLOCK, Q8_GROUP_BLOCK, QK32};

    /// The one pass over a group's blocks for `N` tokens, each block's
    /// integer sums by `$body` (adding to the sums the products of the low
    /// nibbles of a quarter of the eight rows with the input's four bytes
    /// they meet, and of the high nibbles with theirs: lane r row r) from
    /// the block's correction, then per token one conversion and one
    /// multiply-add by the rows' scales times the input's; in a function
    /// compiled for `$features`.
    macro_rules! pass {
        ($name:ident, $features:literal,
         |$sum:ident, $lo:ident, $hi:ident, $xlo:ident, $xhi:ident| $body:block) => {
            #[target_feature(enable = $features)]
            pub fn $name<const N: usize>(g: &[u8], xs: &Inputs<'_>) -> Sums<N> {
                let mask = _mm256_set1_epi8(0x0F);
                let nb = xs.nb;
                let (q, d, c) = (xs.a.q.as_ptr(), xs.a.d.as_ptr(), xs.corr.as_ptr());
                let mut acc = [_mm256_setzero_ps(); N];
                for b in 0..nb {
                    // SAFETY: (every read below) `group` checked that `g`
                    // holds `nb` block indices and that the inputs hold
                    // tokens t0..t0 + N of `nb` blocks each.
                    let base = unsafe { g.as_ptr().add(b * GROUP_BLOCK) };
                    let blk = |t: usize| (xs.t0 + t) * nb + b;
                    // SAFETY: each token's block b's correction.
                    let corr: [i32; N] = std::array::from_fn(|t| unsafe { *c.add(blk(t)) });
                    let mut sums = corr.map(|v| _mm256_set1_epi32(v));
                    for part in 0..4 {
                        // SAFETY: the eight rows' bytes 4 part .. 4 part + 3, within `g`.
                        let v = unsafe {
                            _mm256_loadu_si256(base.add(2 * GROUP + 32 * part) as *const __m256i)
                        };
                        let lo = _mm256_and_si256(v, mask);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
                        for (t, sum) in sums.iter_mut().enumerate() {
                            // SAFETY: token t0 + t's block b: its values
                            // 4 part .. and 16 + 4 part .. (four bytes each).
                            let (xlo, xhi) = unsafe {
                                let xq = q.add(blk(t) * QK32 + 4 * part);
                                (
                                    _mm256_set1_epi32((xq as *const i32).read_unaligned()),
                                    _mm256_set1_epi32((xq.add(16) as *const i32).read_unaligned()),
                                )
                            };
                            *sum = {
                                let ($sum, $lo, $hi, $xlo, $xhi) = (*sum, lo, hi, xlo, xhi);
                                $body
                            };
                        }
                    }
                    // SAFETY: the block index's 8 scales, within `g`.
                    let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(base as *const __m128i) });
                    for (t, acc) in acc.iter_mut().enumerate() {
                        // SAFETY: token t0 + t's block b's scale.
                        let s = _mm256_mul_ps(dw, _mm256_set1_ps(unsafe { *d.add(blk(t)) }));
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[t]), s, *acc);
                    }
                }
                store(acc)
            }
        };
    }

    pass!(avx2, "avx2,fma,f16c", |sum, lo, hi, xlo, xhi| {
        let s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
        _mm256_add_epi32(sum, _mm256_madd_epi16(s16, _mm256_set1_epi16(1)))
    });

    pass!(
        vnni,
        "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
        |sum, lo, hi, xlo, xhi| { _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(sum, lo, xlo), hi, xhi) }
    );

    /// The Q4_0 VNNI pass over two adjacent groups (16 rows: lanes 0-7 the
    /// first group's, 8-15 the second's) on 512-bit vectors: each input
    /// broadcast serves 16 rows. Lane by lane the same integers and float
    /// operations as `vnni` (and `avx2`), so the same bits.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn vnni16<const N: usize>(g: &[u8], xs: &Inputs<'_>) -> [[f32; 2 * GROUP]; N] {
        let mask = _mm512_set1_epi8(0x0F);
        let nb = xs.nb;
        let (q, d, c) = (xs.a.q.as_ptr(), xs.a.d.as_ptr(), xs.corr.as_ptr());
        let mut acc = [_mm512_setzero_ps(); N];
        for b in 0..nb {
            // SAFETY: (every read below) `group` checked that `g` holds two
            // groups of `nb` block indices and that the inputs hold tokens
            // t0..t0 + N of `nb` blocks each.
            let (g0, g1) = unsafe {
                let g0 = g.as_ptr().add(b * GROUP_BLOCK);
                (g0, g0.add(nb * GROUP_BLOCK))
            };
            let blk = |t: usize| (xs.t0 + t) * nb + b;
            // SAFETY: each token's block b's correction.
            let corr: [i32; N] = std::array::from_fn(|t| unsafe { *c.add(blk(t)) });
            let mut sums = corr.map(|v| _mm512_set1_epi32(v));
            for part in 0..4 {
                // SAFETY: both groups' bytes 4 part .. 4 part + 3, within `g`.
                let v = unsafe {
                    let at = 2 * GROUP + 32 * part;
                    let lo = _mm256_loadu_si256(g0.add(at) as *const __m256i);
                    let hi = _mm256_loadu_si256(g1.add(at) as *const __m256i);
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                };
                let lo = _mm512_and_si512(v, mask);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
                for (t, sum) in sums.iter_mut().enumerate() {
                    // SAFETY: token t0 + t's block b: its values 4 part ..
                    // and 16 + 4 part .. (four bytes each).
                    let (xlo, xhi) = unsafe {
                        let xq = q.add(blk(t) * QK32 + 4 * part);
                        (
                            _mm512_set1_epi32((xq as *const i32).read_unaligned()),
                            _mm512_set1_epi32((xq.add(16) as *const i32).read_unaligned()),
                        )
                    };
                    *sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(*sum, lo, xlo), hi, xhi);
                }
            }
            // SAFETY: both groups' 8 scales, within `g`.
            let dw = unsafe {
                let lo = _mm_loadu_si128(g0 as *const __m128i);
                let hi = _mm_loadu_si128(g1 as *const __m128i);
                _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
            };
            for (t, acc) in acc.iter_mut().enumerate() {
                // SAFETY: token t0 + t's block b's scale.
                let s = _mm512_mul_ps(dw, _mm512_set1_ps(unsafe { *d.add(blk(t)) }));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[t]), s, *acc);
            }
        }
        acc.map(|v| {
            let mut o = [0f32; 2 * GROUP];
            // SAFETY: o holds 16 floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
            o
        })
    }

    /// The Q8_0 pass: as `pass!`, each block's sums starting from `$init`
    /// of its correction and adding by `$body` the products of an eighth
    /// of the eight rows' (biased) quants with the input's four bytes.
    macro_rules! pass_q8 {
        ($name:ident, $features:literal, |$c:ident| $init:block,
         |$sum:ident, $w:ident, $x:ident| $body:block) => {
            #[target_feature(enable = $features)]
            pub fn $name<const N: usize>(g: &[u8], xs: &Inputs<'_>) -> Sums<N> {
                let nb = xs.nb;
                let (q, d, c) = (xs.a.q.as_ptr(), xs.a.d.as_ptr(), xs.corr.as_ptr());
                let mut acc = [_mm256_setzero_ps(); N];
                for b in 0..nb {
                    // SAFETY: (every read below) as in `pass!`, of
                    // Q8_GROUP_BLOCK bytes a block index.
                    let base = unsafe { g.as_ptr().add(b * Q8_GROUP_BLOCK) };
                    let blk = |t: usize| (xs.t0 + t) * nb + b;
                    // SAFETY: each token's block b's correction.
                    let corr: [i32; N] = std::array::from_fn(|t| unsafe { *c.add(blk(t)) });
                    let mut sums = corr.map(|$c| $init);
                    for part in 0..8 {
                        // SAFETY: the eight rows' quants 4 part .. 4 part + 3, within `g`.
                        let w = unsafe {
                            _mm256_loadu_si256(base.add(2 * GROUP + 32 * part) as *const __m256i)
                        };
                        for (t, sum) in sums.iter_mut().enumerate() {
                            // SAFETY: token t0 + t's values 4 part .. 4 part + 3.
                            let x = unsafe {
                                let xq = q.add(blk(t) * QK32 + 4 * part) as *const i32;
                                _mm256_set1_epi32(xq.read_unaligned())
                            };
                            *sum = {
                                let ($sum, $w, $x) = (*sum, w, x);
                                $body
                            };
                        }
                    }
                    // SAFETY: the block index's 8 scales, within `g`.
                    let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(base as *const __m128i) });
                    for (t, acc) in acc.iter_mut().enumerate() {
                        // SAFETY: token t0 + t's block b's scale.
                        let s = _mm256_mul_ps(dw, _mm256_set1_ps(unsafe { *d.add(blk(t)) }));
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[t]), s, *acc);
                    }
                }
                store(acc)
            }
        };
    }

    pass_q8!(
        q8_avx2,
        "avx2,fma,f16c",
        |c| {
            let _ = c;
            _mm256_setzero_si256()
        },
        |sum, w, x| {
            // The signed weight back; its magnitude times x signed as it.
            let ws = _mm256_xor_si256(w, _mm256_set1_epi8(-128));
            let p = _mm256_maddubs_epi16(_mm256_sign_epi8(ws, ws), _mm256_sign_epi8(x, ws));
            _mm256_add_epi32(sum, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
        }
    );

    pass_q8!(
        q8_vnni,
        "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
        |c| { _mm256_set1_epi32(c) },
        |sum, w, x| { _mm256_dpbusd_epi32(sum, w, x) }
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::group8::check_repacked;
    use crate::cpu::q8::matmul_q8;

    use crate::cpu::{fresh_seed, test_values as values};

    /// The repacked product gives [`matmul_q8`]'s outputs (the same
    /// integers and scale products; only the order the blocks' terms are
    /// added in differs: within 1e-5 of the row's absolute sum), every
    /// output checked, poisoned first; and each token's outputs are the
    /// same bits whatever number of tokens share the pass, on both the
    /// AVX2 and (where the CPU has it) the VNNI path.
    #[test]
    fn repacked_q4_0_matches_the_8_bit_product() {
        if !supported() {
            eprintln!("SKIP: no AVX2 here");
            return;
        }
        let seed = fresh_seed(5);
        for (ty, rows) in [
            (GgmlType::Q4_0, 48),
            (GgmlType::Q4_0, 40),
            (GgmlType::Q8_0, 40),
        ] {
            let cols = 320usize;
            let w = values(rows * cols, seed ^ ty as u64);
            let file = super::super::matrix_file(ty, rows, cols, &w);
            let view = file.tensor("w").unwrap();
            let packed = PackedQ4::pack(&view).expect("a matrix of 48 rows packs");
            assert_eq!(packed.data.len(), view.data.len());
            let x = values(9 * cols, seed ^ 0x55);
            let got = |x: &[f32], n: usize, o: &mut [f32]| packed.matmul(x, n, o);
            let want = |x: &[f32], n: usize, o: &mut [f32]| matmul_q8(&view, x, n, o);
            check_repacked(&format!("{ty}"), (rows, cols), &w, &x, got, want);
        }
    }

    /// The AVX2 and the VNNI passes give the same bits (the same integers,
    /// the same float operations), where the CPU has both; for Q8_0 also
    /// with weights of -128 (which quantizing never makes, a file may
    /// hold), against the product of the packed quants themselves.
    #[test]
    fn avx2_and_vnni_passes_agree() {
        if !has_vnni() {
            eprintln!("SKIP: no AVX-512 VNNI here");
            return;
        }
        for (ty, bias) in [(GgmlType::Q4_0, 8), (GgmlType::Q8_0, 128)] {
            // Two groups: the 16-row pass (Q4_0) or two 8-row ones.
            let (rows, cols) = (16usize, 256usize);
            let w = values(rows * cols, 11);
            let file = super::super::matrix_file(ty, rows, cols, &w);
            let mut packed = PackedQ4::pack(&file.tensor("w").unwrap()).unwrap();
            if ty == GgmlType::Q8_0 {
                // Biased 0: a weight of -128, in several rows and blocks.
                for at in [
                    16,
                    17,
                    50,
                    300,
                    Q8_GROUP_BLOCK + 16 + 9,
                    3 * Q8_GROUP_BLOCK + 200,
                ] {
                    packed.data[at] = 0;
                }
            }
            let x = values(2 * cols, 12);
            let a = Q8Rows::quantize(&x, cols);
            let corr = corrections(&a.q, bias);
            let nb = cols / QK32;
            let xs = Inputs {
                a: &a,
                corr: &corr,
                t0: 0,
                nb,
            };
            let q8 = ty == GgmlType::Q8_0;
            // (token, row) -> sum, poisoned first.
            let (mut v, mut s) = (vec![f32::NAN; 2 * rows], vec![f32::NAN; 2 * rows]);
            let into = |o: &mut Vec<f32>, t: usize, r0: usize, sums: &[f32]| {
                o[t * rows + r0..][..sums.len()].copy_from_slice(sums)
            };
            let n = group(q8, &packed.data, &xs, 2, true, &mut |t, r0, x| {
                into(&mut v, t, r0, x)
            });
            let m = group(q8, &packed.data, &xs, 2, false, &mut |t, r0, x| {
                into(&mut s, t, r0, x)
            });
            assert_eq!((n, m), (2, 2));
            let bits = |f: &Vec<f32>| f.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&v), bits(&s), "{ty}");
            assert!(v.iter().all(|x| x.is_finite()), "{ty}: every row written");
            if q8 {
                // Each (token, row) from the packed bytes: the quants' exact
                // integer sums a block, each scaled in f64.
                for (i, &got) in v.iter().enumerate() {
                    let (t, row) = (i / rows, i % rows);
                    let (grp, r) = (row / GROUP, row % GROUP);
                    let mut want = 0f64;
                    for b in 0..nb {
                        let g = &packed.data[(grp * nb + b) * Q8_GROUP_BLOCK..];
                        let dw = half::f16::from_le_bytes([g[2 * r], g[2 * r + 1]]).to_f64();
                        let dot: i32 = (0..QK32)
                            .map(|j| {
                                let wq = (g[16 + 32 * (j / 4) + 4 * r + j % 4] ^ 0x80) as i8;
                                wq as i32 * a.q[(t * nb + b) * QK32 + j] as i32
                            })
                            .sum();
                        want += dw * a.d[t * nb + b] as f64 * dot as f64;
                    }
                    let tol = 1e-5 * want.abs().max(1.0);
                    assert!(
                        (got as f64 - want).abs() <= tol,
                        "token {t} row {row}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// Matrices it cannot hold are left to the other paths.
    #[test]
    fn only_q4_0_and_q8_0_in_whole_groups_pack() {
        let w = values(12 * 64, 3);
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
            let odd = super::super::matrix_file(ty, 12, 64, &w);
            assert!(PackedQ4::pack(&odd.tensor("w").unwrap()).is_none());
        }
        let q4_1 = super::super::matrix_file(GgmlType::Q4_1, 8, 96, &w[..8 * 96]);
        assert!(PackedQ4::pack(&q4_1.tensor("w").unwrap()).is_none());
    }
}
