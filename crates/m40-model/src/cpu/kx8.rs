//! Q4_K and Q6_K matrices repacked for the CPU's 8-bit products, eight
//! rows interleaved four bytes at a time as [`super::q4x8`] does for Q4_0
//! (llama.cpp's CPU backend repacks Q4_K in the same spirit, its
//! `q4_K_8x8`): each 32-bit lane of a vector is one row, so an input's four
//! bytes, broadcast, meet the same four bytes of all eight rows in one
//! multiply-add, and a part's eight integer sums are one vector, scaled by
//! its eight integer scales in one multiply. The arithmetic is
//! [`super::q8k`]'s: the inputs rounded to 8 bits per block of 256, each
//! part's exact integer dot product times its integer scale, a block one
//! integer sum a row scaled once by the weight's and the input's `d`; the
//! unsigned quants' offsets (Q4_K's minimums, Q6_K's 32) from the inputs'
//! part sums. Only the order of the float additions differs from
//! `q8k.rs` (one sum a row instead of eight lanes). AVX2 (`maddubs`) and
//! AVX-512 VNNI (`vpdpbusd`) compute the same integers and the same float
//! operations, and a token's result never depends on how many tokens
//! share the pass (batch invariance).
//!
//! Layout of a group of eight rows, per block of 256 (quarter c of four
//! bytes: the eight rows' four bytes side by side, 32 bytes):
//! - Q4_K: `d` and `dmin` of the eight rows (f16, 16 bytes each), the
//!   eight parts' 6-bit scales `[part][row]` (64 bytes) and minimums (64),
//!   then for each 64 values k the eight quarters of its 32 bytes of
//!   nibbles (low nibbles: part 2k, high: part 2k + 1; 1024 bytes). 1184
//!   bytes, 148 a row where GGUF has 144 (the 6-bit scales as bytes).
//! - Q6_K: `d` (16 bytes), the 16 scales `[part][row]` (128), then for
//!   each half n of 128 values and each quarter c of its 32 values: `ql`
//!   bytes 64n + 4c.., 64n + 32 + 4c.. and `qh` bytes 32n + 4c.. (96
//!   bytes; 1536). 1680 bytes, 210 a row as in GGUF.

use m40_gguf::quant::as_blocks;
use m40_gguf::quant::blocks::{BlockQ4K, BlockQ6K, QK_K};
use m40_gguf::{GgmlType, TensorView};
use rayon::prelude::*;

use super::group8::{each_group, matmul_groups, Put, GROUP};
use super::q8k::{k4_scales, Q8KRows};

/// Groups per rayon task (16 rows, as `q8k.rs`'s tasks).
const TASK_GROUPS: usize = 2;

/// Bytes of a group's block of 256 values.
const Q4K_GROUP_BLOCK: usize = 16 + 16 + 64 + 64 + 1024;
const Q6K_GROUP_BLOCK: usize = 16 + 128 + 1536;

/// A Q4_K or Q6_K matrix of whole groups of eight rows, repacked.
pub struct PackedK {
    ty: GgmlType,
    data: Vec<u8>,
    n_in: usize,
    n_out: usize,
}

/// Whether this CPU runs the repacked products (AVX2, FMA, F16C).
pub fn supported() -> bool {
    super::simd::has_avx2()
}

impl PackedK {
    /// `w` repacked, where it is a Q4_K or Q6_K matrix of a multiple of
    /// eight rows.
    pub fn pack(w: &TensorView<'_>) -> Option<Self> {
        let info = w.info;
        let group_block = match info.ty {
            GgmlType::Q4_K => Q4K_GROUP_BLOCK,
            GgmlType::Q6_K => Q6K_GROUP_BLOCK,
            _ => return None,
        };
        let (n_in, n_out) = (info.row_len(), info.n_rows());
        let ok = info.shape.len() == 2
            && n_out.is_multiple_of(GROUP)
            && n_in.is_multiple_of(QK_K)
            && w.data.len() == n_out * info.row_bytes();
        if !ok {
            return None;
        }
        let (nb, row_bytes) = (n_in / QK_K, info.row_bytes());
        let mut data = vec![0u8; n_out / GROUP * nb * group_block];
        let ty = info.ty;
        data.par_chunks_mut(nb * group_block)
            .zip(w.data.par_chunks(GROUP * row_bytes))
            .for_each(|(dst, rows)| {
                let row = |r: usize| &rows[r * row_bytes..][..row_bytes];
                let outs = dst.chunks_exact_mut(group_block);
                match ty {
                    GgmlType::Q4_K => {
                        let blocks: [_; GROUP] =
                            std::array::from_fn(|r| as_blocks::<BlockQ4K>(row(r)));
                        for (b, out) in outs.enumerate() {
                            pack_q4_k(std::array::from_fn(|r| &blocks[r][b]), out);
                        }
                    }
                    _ => {
                        let blocks: [_; GROUP] =
                            std::array::from_fn(|r| as_blocks::<BlockQ6K>(row(r)));
                        for (b, out) in outs.enumerate() {
                            pack_q6_k(std::array::from_fn(|r| &blocks[r][b]), out);
                        }
                    }
                }
            });
        Some(Self {
            ty,
            data,
            n_in,
            n_out,
        })
    }

    /// `out[t * n_out + r] = W[r, :] . x[t]` with the inputs rounded to 8
    /// bits per block of 256, as [`super::q8k::matmul_q8k`] computes it
    /// (the same integers and scale products). Callers check [`supported`]
    /// first.
    pub fn matmul(&self, x: &[f32], n_tok: usize, out: &mut [f32]) {
        let (n_in, n_out) = (self.n_in, self.n_out);
        assert_eq!(x.len(), n_tok * n_in, "matmul input shape");
        assert_eq!(out.len(), n_tok * n_out, "matmul output shape");
        assert!(
            supported(),
            "the repacked K-quant product needs AVX2, FMA and F16C"
        );
        let a = Q8KRows::quantize(x);
        // Q4_K's minimums meet each part's sum of 32 inputs.
        let bs32: Vec<i16> = match self.ty {
            GgmlType::Q4_K => a.bsums.chunks_exact(2).map(|p| p[0] + p[1]).collect(),
            _ => Vec::new(),
        };
        let nb = n_in / QK_K;
        let group_bytes = self.data.len() / (n_out / GROUP);
        let vnni = super::q4x8::has_vnni();
        let xs = Inputs {
            a: &a,
            bs32: &bs32,
            nb,
        };
        // Q4_K with VNNI: two groups a pass (16 rows, 512-bit vectors).
        let pass_groups = if vnni && self.ty == GgmlType::Q4_K {
            2
        } else {
            1
        };
        let shape = (group_bytes, TASK_GROUPS, pass_groups);
        matmul_groups(&self.data, shape, n_tok, out, |g, t0, left, put| {
            group(self.ty, g, &xs, t0, left, vnni, put)
        });
    }
}

/// A group's block of eight Q4_K rows in the repacked layout.
fn pack_q4_k(rows: [&BlockQ4K; GROUP], out: &mut [u8]) {
    for (r, blk) in rows.iter().enumerate() {
        out[2 * r..2 * r + 2].copy_from_slice(&blk.d.to_bits().to_le_bytes());
        out[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&blk.dmin.to_bits().to_le_bytes());
        let (sc, m) = k4_scales(&blk.scales);
        for j in 0..8 {
            out[32 + 8 * j + r] = sc[j];
            out[96 + 8 * j + r] = m[j];
        }
        for k in 0..4 {
            for c in 0..8 {
                let at = 160 + (8 * k + c) * 32 + 4 * r;
                out[at..at + 4].copy_from_slice(&blk.qs[32 * k + 4 * c..][..4]);
            }
        }
    }
}

/// A group's block of eight Q6_K rows in the repacked layout.
fn pack_q6_k(rows: [&BlockQ6K; GROUP], out: &mut [u8]) {
    for (r, blk) in rows.iter().enumerate() {
        out[2 * r..2 * r + 2].copy_from_slice(&blk.d.to_bits().to_le_bytes());
        for j in 0..16 {
            out[16 + 8 * j + r] = blk.scales[j] as u8;
        }
        for n in 0..2 {
            for c in 0..8 {
                let at = 144 + (8 * n + c) * 96 + 4 * r;
                out[at..at + 4].copy_from_slice(&blk.ql[64 * n + 4 * c..][..4]);
                out[at + 32..at + 36].copy_from_slice(&blk.ql[64 * n + 32 + 4 * c..][..4]);
                out[at + 64..at + 68].copy_from_slice(&blk.qh[32 * n + 4 * c..][..4]);
            }
        }
    }
}

/// The quantized inputs of a matmul, `nb` blocks a token; Q4_K's part
/// sums of 32.
struct Inputs<'a> {
    a: &'a Q8KRows,
    bs32: &'a [i16],
    nb: usize,
}

/// One group's eight sums for tokens `t0..` (up to 4 of the `left` with
/// VNNI, which has 32 vector registers, 2 without), handed to `put(token,
/// sums)`; returns how many tokens it did.
fn group(
    ty: GgmlType,
    g: &[u8],
    xs: &Inputs<'_>,
    t0: usize,
    left: usize,
    vnni: bool,
    put: Put<'_>,
) -> usize {
    let gb = xs.nb
        * match ty {
            GgmlType::Q4_K => Q4K_GROUP_BLOCK,
            _ => Q6K_GROUP_BLOCK,
        };
    assert!(g.len() >= gb);
    let wide = vnni && ty == GgmlType::Q4_K && left >= 4;
    if g.len() >= 2 * gb && !wide {
        // Several groups, 8 rows a pass (a decode's few tokens read weights
        // more than they multiply them: one stream at a time, as
        // `q4x8::group`): each in turn, the same tokens.
        return each_group(g, gb, put, |one, put| {
            group(ty, one, xs, t0, left, vnni, put)
        });
    }
    let need = (t0 + left.min(4)) * xs.nb;
    assert!(xs.a.q.len() >= need * QK_K && xs.a.d.len() >= need && xs.a.bsums.len() >= need * 16);
    assert!(ty != GgmlType::Q4_K || xs.bs32.len() >= need * 8);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller checked `supported` (AVX2, FMA, F16C) and `vnni`
    // is `has_vnni`; the asserts above bound every read.
    unsafe {
        macro_rules! run {
            ($pass:ident) => {
                match (vnni, left) {
                    (true, 1) | (false, 1) => x86::emit(x86::$pass::<1>(g, xs, t0), 0, put),
                    (true, 2) | (false, _) => x86::emit(x86::$pass::<2>(g, xs, t0), 0, put),
                    (true, 3) => x86::emit(x86::$pass::<3>(g, xs, t0), 0, put),
                    (true, _) => x86::emit(x86::$pass::<4>(g, xs, t0), 0, put),
                }
            };
        }
        if g.len() >= 2 * gb {
            // Two Q4_K groups: 16 rows a 512-bit vector, 4 tokens.
            return x86::emit(x86::q4_k_vnni16::<4>(g, xs, t0), 0, put);
        }
        match (ty, vnni) {
            (GgmlType::Q4_K, true) => run!(q4_k_vnni),
            (GgmlType::Q4_K, false) => run!(q4_k_avx2),
            (_, true) => run!(q6_k_vnni),
            (_, false) => run!(q6_k_avx2),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (g, vnni, put);
        unreachable!("the repacked K-quant products run on x86-64 only")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    pub use super::super::group8::{emit, store, Sums};
    use super::{Inputs, GROUP, Q4K_GROUP_BLOCK, Q6K_GROUP_BLOCK, QK_K};

    /// Eight bytes at `p` as eight i32, unsigned (`cvtepu8`) or signed.
    /// # Safety
    /// The bytes read must be readable.
    #[inline(always)]
    unsafe fn u8x8(p: *const u8) -> __m256i {
        // SAFETY: the caller's eight bytes.
        unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)) }
    }
    /// # Safety
    /// The bytes read must be readable.
    #[inline(always)]
    unsafe fn i8x8(p: *const u8) -> __m256i {
        // SAFETY: the caller's eight bytes.
        unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)) }
    }

    /// Lane r: the i16 pair (a[r], b[r]) of two rows of eight bytes,
    /// unsigned or signed.
    /// # Safety
    /// The bytes read must be readable.
    #[inline(always)]
    unsafe fn pairs(a: *const u8, b: *const u8, signed: bool) -> __m256i {
        // SAFETY: the caller's eight bytes at each.
        let (a, b) = unsafe {
            (
                _mm_loadl_epi64(a as *const __m128i),
                _mm_loadl_epi64(b as *const __m128i),
            )
        };
        let ab = _mm_unpacklo_epi8(a, b);
        match signed {
            true => _mm256_cvtepi8_epi16(ab),
            false => _mm256_cvtepu8_epi16(ab),
        }
    }

    /// Four input bytes at `p`, broadcast to every lane.
    /// # Safety
    /// The bytes read must be readable.
    #[inline(always)]
    unsafe fn bcast(p: *const i8) -> __m256i {
        // SAFETY: the caller's four bytes.
        _mm256_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
    }

    /// The Q4_K and Q6_K passes over a group's blocks for `N` tokens from
    /// `t0`, each four-byte product added by `$dot(sum, weights, inputs)`,
    /// compiled for `$features`.
    macro_rules! passes {
        ($q4k:ident, $q6k:ident, $features:literal, |$s:ident, $w:ident, $x:ident| $dot:block) => {
            #[target_feature(enable = $features)]
            pub fn $q4k<const N: usize>(g: &[u8], xs: &Inputs<'_>, t0: usize) -> Sums<N> {
                let mask = _mm256_set1_epi8(0x0F);
                let nb = xs.nb;
                let (q, d, bs) = (xs.a.q.as_ptr(), xs.a.d.as_ptr(), xs.bs32.as_ptr());
                let (mut acc, mut off) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
                for b in 0..nb {
                    let blk = |t: usize| (t0 + t) * nb + b;
                    // SAFETY: (every read below) `group` checked that `g`
                    // holds `nb` blocks of Q4K_GROUP_BLOCK bytes and that
                    // the inputs hold tokens t0..t0 + N of `nb` blocks.
                    let base = unsafe { g.as_ptr().add(b * Q4K_GROUP_BLOCK) };
                    let mut total = [_mm256_setzero_si256(); N];
                    // Parts 2k and 2k + 1: the low and high nibbles of the
                    // same bytes, loaded once for both.
                    for k in 0..4 {
                        let mut sums = [[_mm256_setzero_si256(); N]; 2];
                        for c in 0..8 {
                            // SAFETY: quarter c of values 64k.., within the block.
                            let v = unsafe {
                                _mm256_loadu_si256(
                                    base.add(160 + (8 * k + c) * 32) as *const __m256i
                                )
                            };
                            for (half, part) in sums.iter_mut().enumerate() {
                                let w = match half {
                                    1 => _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
                                    _ => _mm256_and_si256(v, mask),
                                };
                                let j = 2 * k + half;
                                for (t, s) in part.iter_mut().enumerate() {
                                    // SAFETY: token t0 + t's values 32 j + 4 c ...
                                    let x = unsafe { bcast(q.add(blk(t) * QK_K + 32 * j + 4 * c)) };
                                    *s = {
                                        let ($s, $w, $x) = (*s, w, x);
                                        $dot
                                    };
                                }
                            }
                        }
                        for (half, part) in sums.iter().enumerate() {
                            // SAFETY: part 2k + half's eight scales.
                            let sc = unsafe { u8x8(base.add(32 + 8 * (2 * k + half))) };
                            for (t, s) in part.iter().enumerate() {
                                total[t] = _mm256_add_epi32(total[t], _mm256_mullo_epi32(*s, sc));
                            }
                        }
                    }
                    // The minimums times the inputs' part sums, two parts a
                    // multiply-add.
                    let mut mins = [_mm256_setzero_si256(); N];
                    for i in 0..4 {
                        let at = base.wrapping_add(96 + 16 * i);
                        // SAFETY: parts 2i and 2i + 1's eight minimums.
                        let m = unsafe { pairs(at, at.wrapping_add(8), false) };
                        for (t, mn) in mins.iter_mut().enumerate() {
                            // SAFETY: token t0 + t's sums of parts 2i, 2i + 1.
                            let x = unsafe { bcast(bs.add(blk(t) * 8 + 2 * i) as *const i8) };
                            *mn = _mm256_add_epi32(*mn, _mm256_madd_epi16(m, x));
                        }
                    }
                    // SAFETY: the eight rows' d and dmin.
                    let (dw, dm) = unsafe {
                        (
                            _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i)),
                            _mm256_cvtph_ps(_mm_loadu_si128(base.add(16) as *const __m128i)),
                        )
                    };
                    for t in 0..N {
                        // SAFETY: token t0 + t's block scale.
                        let dx = _mm256_set1_ps(unsafe { *d.add(blk(t)) });
                        let ds = _mm256_mul_ps(dw, dx);
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[t]), ds, acc[t]);
                        let dms = _mm256_mul_ps(dm, dx);
                        off[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins[t]), dms, off[t]);
                    }
                }
                store(std::array::from_fn(|t| _mm256_sub_ps(acc[t], off[t])))
            }

            #[target_feature(enable = $features)]
            pub fn $q6k<const N: usize>(g: &[u8], xs: &Inputs<'_>, t0: usize) -> Sums<N> {
                let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
                let nb = xs.nb;
                let (q, d, bs) = (xs.a.q.as_ptr(), xs.a.d.as_ptr(), xs.a.bsums.as_ptr());
                let mut acc = [_mm256_setzero_ps(); N];
                for b in 0..nb {
                    let blk = |t: usize| (t0 + t) * nb + b;
                    // SAFETY: (every read below) as in the Q4_K pass, of
                    // Q6K_GROUP_BLOCK bytes a block.
                    let base = unsafe { g.as_ptr().add(b * Q6K_GROUP_BLOCK) };
                    let mut total = [_mm256_setzero_si256(); N];
                    // Values 128 n + 32 i + l (l: quarters 4 h .. 4 h + 3):
                    // part 8 n + 2 i + h. A quarter's ql and qh bytes are
                    // loaded once for its four parts (i).
                    for n in 0..2 {
                        for h in 0..2 {
                            let mut sums = [[_mm256_setzero_si256(); N]; 4];
                            for c in 4 * h..4 * h + 4 {
                                let at = 144 + (8 * n + c) * 96;
                                // SAFETY: quarter c's ql and qh bytes, within the block.
                                let (ql0, ql1, qh) = unsafe {
                                    (
                                        _mm256_loadu_si256(base.add(at) as *const __m256i),
                                        _mm256_loadu_si256(base.add(at + 32) as *const __m256i),
                                        _mm256_loadu_si256(base.add(at + 64) as *const __m256i),
                                    )
                                };
                                for (i, part) in sums.iter_mut().enumerate() {
                                    let ql = if i % 2 == 0 { ql0 } else { ql1 };
                                    let low = match i / 2 {
                                        0 => _mm256_and_si256(ql, m4),
                                        _ => _mm256_and_si256(_mm256_srli_epi16::<4>(ql), m4),
                                    };
                                    let high = match i {
                                        0 => _mm256_slli_epi16::<4>(qh),
                                        1 => _mm256_slli_epi16::<2>(qh),
                                        2 => qh,
                                        _ => _mm256_srli_epi16::<2>(qh),
                                    };
                                    let w = _mm256_or_si256(low, _mm256_and_si256(high, m30));
                                    for (t, s) in part.iter_mut().enumerate() {
                                        // SAFETY: token t0 + t's values 128 n + 32 i + 4 c ..
                                        let x = unsafe {
                                            bcast(q.add(blk(t) * QK_K + 128 * n + 32 * i + 4 * c))
                                        };
                                        *s = {
                                            let ($s, $w, $x) = (*s, w, x);
                                            $dot
                                        };
                                    }
                                }
                            }
                            for (i, part) in sums.iter().enumerate() {
                                // SAFETY: part 8n + 2i + h's eight scales.
                                let sc = unsafe { i8x8(base.add(16 + 8 * (8 * n + 2 * i + h))) };
                                for (t, s) in part.iter().enumerate() {
                                    total[t] =
                                        _mm256_add_epi32(total[t], _mm256_mullo_epi32(*s, sc));
                                }
                            }
                        }
                    }
                    // The quants' 32: sum_j sc_j 32 bsum_j, two parts a
                    // multiply-add, subtracted in integers.
                    let mut shift = [_mm256_setzero_si256(); N];
                    for p in 0..8 {
                        let at = base.wrapping_add(16 + 16 * p);
                        // SAFETY: parts 2p and 2p + 1's eight scales.
                        let sc = unsafe { pairs(at, at.wrapping_add(8), true) };
                        for (t, sh) in shift.iter_mut().enumerate() {
                            // SAFETY: token t0 + t's 16-sums 2p and 2p + 1.
                            let x = unsafe { bcast(bs.add(blk(t) * 16 + 2 * p) as *const i8) };
                            *sh = _mm256_add_epi32(*sh, _mm256_madd_epi16(sc, x));
                        }
                    }
                    // SAFETY: the eight rows' d.
                    let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(base as *const __m128i) });
                    for t in 0..N {
                        let int = _mm256_sub_epi32(total[t], _mm256_slli_epi32::<5>(shift[t]));
                        // SAFETY: token t0 + t's block scale.
                        let ds = _mm256_mul_ps(dw, _mm256_set1_ps(unsafe { *d.add(blk(t)) }));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(int), ds, acc[t]);
                    }
                }
                store(acc)
            }
        };
    }

    /// Eight bytes at each of `a` and `b` as one 128-bit vector.
    /// # Safety
    /// The bytes read must be readable.
    #[inline(always)]
    unsafe fn two8(a: *const u8, b: *const u8) -> __m128i {
        // SAFETY: the caller's eight bytes at each.
        unsafe {
            _mm_unpacklo_epi64(
                _mm_loadl_epi64(a as *const __m128i),
                _mm_loadl_epi64(b as *const __m128i),
            )
        }
    }

    /// The Q4_K VNNI pass over two adjacent groups (16 rows: lanes 0-7 the
    /// first group's, 8-15 the second's) on 512-bit vectors: lane by lane
    /// the integers and float operations of `q4_k_vnni`, so the same bits.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn q4_k_vnni16<const N: usize>(
        g: &[u8],
        xs: &Inputs<'_>,
        t0: usize,
    ) -> [[f32; 2 * GROUP]; N] {
        let mask = _mm512_set1_epi8(0x0F);
        let nb = xs.nb;
        let (q, d, bs) = (xs.a.q.as_ptr(), xs.a.d.as_ptr(), xs.bs32.as_ptr());
        let (mut acc, mut off) = ([_mm512_setzero_ps(); N], [_mm512_setzero_ps(); N]);
        // Both groups' 32 bytes at `at` as one vector.
        let join = |a: *const u8, b: *const u8| -> __m512i {
            // SAFETY: the callers' 32 bytes at each, within `g`.
            unsafe {
                let lo = _mm256_loadu_si256(a as *const __m256i);
                let hi = _mm256_loadu_si256(b as *const __m256i);
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
            }
        };
        for b in 0..nb {
            let blk = |t: usize| (t0 + t) * nb + b;
            // SAFETY: (every read below) `group` checked that `g` holds two
            // groups of `nb` blocks and that the inputs hold tokens t0..t0 +
            // N of `nb` blocks.
            let (g0, g1) = unsafe {
                let g0 = g.as_ptr().add(b * Q4K_GROUP_BLOCK);
                (g0, g0.add(nb * Q4K_GROUP_BLOCK))
            };
            let mut total = [_mm512_setzero_si512(); N];
            // Parts 2k and 2k + 1 from the same bytes, loaded once.
            for k in 0..4 {
                let mut sums = [[_mm512_setzero_si512(); N]; 2];
                for c in 0..8 {
                    let at = 160 + (8 * k + c) * 32;
                    let v = join(g0.wrapping_add(at), g1.wrapping_add(at));
                    for (half, part) in sums.iter_mut().enumerate() {
                        let w = match half {
                            1 => _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask),
                            _ => _mm512_and_si512(v, mask),
                        };
                        let j = 2 * k + half;
                        for (t, s) in part.iter_mut().enumerate() {
                            // SAFETY: token t0 + t's values 32 j + 4 c ..
                            let x = unsafe {
                                let p = q.add(blk(t) * QK_K + 32 * j + 4 * c) as *const i32;
                                _mm512_set1_epi32(p.read_unaligned())
                            };
                            *s = _mm512_dpbusd_epi32(*s, w, x);
                        }
                    }
                }
                for (half, part) in sums.iter().enumerate() {
                    let j = 2 * k + half;
                    let (s0, s1) = (g0.wrapping_add(32 + 8 * j), g1.wrapping_add(32 + 8 * j));
                    // SAFETY: part j's eight scales of each group.
                    let sc = _mm512_cvtepu8_epi32(unsafe { two8(s0, s1) });
                    for (t, s) in part.iter().enumerate() {
                        total[t] = _mm512_add_epi32(total[t], _mm512_mullo_epi32(*s, sc));
                    }
                }
            }
            let mut mins = [_mm512_setzero_si512(); N];
            for i in 0..4 {
                // Lane r: the i16 pair (m[2i][r], m[2i + 1][r]) of each group.
                let (a0, a1) = (g0.wrapping_add(96 + 16 * i), g1.wrapping_add(96 + 16 * i));
                // SAFETY: parts 2i and 2i + 1's eight minimums of each group.
                let (p0, p1) = unsafe {
                    (
                        _mm_unpacklo_epi8(
                            _mm_loadl_epi64(a0 as *const __m128i),
                            _mm_loadl_epi64(a0.add(8) as *const __m128i),
                        ),
                        _mm_unpacklo_epi8(
                            _mm_loadl_epi64(a1 as *const __m128i),
                            _mm_loadl_epi64(a1.add(8) as *const __m128i),
                        ),
                    )
                };
                let m = _mm512_cvtepu8_epi16(_mm256_inserti128_si256::<1>(
                    _mm256_castsi128_si256(p0),
                    p1,
                ));
                for (t, mn) in mins.iter_mut().enumerate() {
                    // SAFETY: token t0 + t's sums of parts 2i, 2i + 1.
                    let x = unsafe {
                        let p = bs.add(blk(t) * 8 + 2 * i) as *const i32;
                        _mm512_set1_epi32(p.read_unaligned())
                    };
                    *mn = _mm512_add_epi32(*mn, _mm512_madd_epi16(m, x));
                }
            }
            // SAFETY: each group's eight d and dmin.
            let (dw, dm) = unsafe {
                let h = |p: *const u8, o: usize| _mm_loadu_si128(p.add(o) as *const __m128i);
                let two = |o: usize| {
                    _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
                        _mm256_castsi128_si256(h(g0, o)),
                        h(g1, o),
                    ))
                };
                (two(0), two(16))
            };
            for t in 0..N {
                // SAFETY: token t0 + t's block scale.
                let dx = _mm512_set1_ps(unsafe { *d.add(blk(t)) });
                let ds = _mm512_mul_ps(dw, dx);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[t]), ds, acc[t]);
                let dms = _mm512_mul_ps(dm, dx);
                off[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins[t]), dms, off[t]);
            }
        }
        std::array::from_fn(|t| {
            let mut o = [0f32; 2 * GROUP];
            // SAFETY: o holds 16 floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_sub_ps(acc[t], off[t])) };
            o
        })
    }

    passes!(q4_k_avx2, q6_k_avx2, "avx2,fma,f16c", |s, w, x| {
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
        _mm256_add_epi32(s, p)
    });

    passes!(
        q4_k_vnni,
        q6_k_vnni,
        "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
        |s, w, x| { _mm256_dpbusd_epi32(s, w, x) }
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::group8::check_repacked;
    use crate::cpu::q8k::matmul_q8k;
    use crate::cpu::{fresh_seed, test_values as values};

    /// The repacked products give `q8k.rs`'s outputs (the same integers
    /// and scale products; only the order of the float additions differs:
    /// within 1e-5 of the row's absolute sum), every output checked,
    /// poisoned first; each token's outputs the same bits whatever number
    /// of tokens share the pass; on the AVX2 and (where the CPU has it) the
    /// VNNI path, which give the same bits.
    #[test]
    fn repacked_k_quants_match_the_8_bit_product() {
        if !supported() {
            eprintln!("SKIP: no AVX2 here");
            return;
        }
        let seed = fresh_seed(9);
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let (rows, cols) = (24usize, 768usize);
            let w = values(rows * cols, seed ^ ty as u64);
            let file = super::super::matrix_file(ty, rows, cols, &w);
            let view = file.tensor("w").unwrap();
            let packed = PackedK::pack(&view).expect("a K-quant matrix of 24 rows packs");
            let x = values(9 * cols, seed.wrapping_add(5));
            let got = |x: &[f32], n: usize, o: &mut [f32]| packed.matmul(x, n, o);
            let want = |x: &[f32], n: usize, o: &mut [f32]| matmul_q8k(&view, x, n, o);
            check_repacked(&format!("{ty}"), (rows, cols), &w, &x, got, want);
            if super::super::q4x8::has_vnni() {
                // The AVX2 pass gives the VNNI pass's bits.
                // The AVX2 passes give the VNNI passes' bits: the first
                // two groups' 16 rows for 4 tokens (Q4_K: the 16-row pass),
                // every group's for 2 (8-row passes, group by group).
                let a = Q8KRows::quantize(&x[..4 * cols]);
                let bs32: Vec<i16> = a.bsums.chunks_exact(2).map(|p| p[0] + p[1]).collect();
                let nb = cols / QK_K;
                let xs = Inputs {
                    a: &a,
                    bs32: &bs32,
                    nb,
                };
                let gb = packed.data.len() / (rows / GROUP);
                for (g, left) in [(&packed.data[..2 * gb], 4), (&packed.data[..], 2)] {
                    let n_rows = g.len() / gb * GROUP;
                    // Every token, poisoned first, as many passes as it takes.
                    let run = |vnni: bool| {
                        let mut o = vec![f32::NAN; left * n_rows];
                        let mut t0 = 0;
                        while t0 < left {
                            let mut put = |t: usize, r0: usize, x: &[f32]| {
                                o[(t0 + t) * n_rows + r0..][..x.len()].copy_from_slice(x)
                            };
                            t0 += group(ty, g, &xs, t0, left - t0, vnni, &mut put);
                        }
                        o
                    };
                    let (v, s) = (run(true), run(false));
                    let bits = |f: &Vec<f32>| f.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&v), bits(&s), "{ty}, {left} tokens: AVX2 and VNNI");
                    assert!(v.iter().all(|x| x.is_finite()), "{ty}: every row written");
                }
            }
        }
    }

    /// Matrices it cannot hold are left to the other paths.
    #[test]
    fn only_k_quants_in_whole_groups_pack() {
        let w = values(12 * 256, 3);
        let odd = super::super::matrix_file(GgmlType::Q4_K, 12, 256, &w);
        assert!(PackedK::pack(&odd.tensor("w").unwrap()).is_none());
        let q8 = super::super::matrix_file(GgmlType::Q8_0, 8, 256, &w[..8 * 256]);
        assert!(PackedK::pack(&q8.tensor("w").unwrap()).is_none());
    }
}
