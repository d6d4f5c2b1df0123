//! Weights repacked at upload for the packed GEMV kernels
//! (kernels/gemv_packed.cu, which documents the layout): rows in groups of
//! 4, each lane's 16-byte load holding one eighth of a block for all 4 rows,
//! the scales in a plane of their own. Same byte count as the GGUF rows
//! (plus zero rows padding the last group), except Q4_K: its 6-bit scale
//! and min pairs are stored as bytes (148 bytes per row and super-block
//! instead of 144).

use m40_gguf::GgmlType;
use rayon::prelude::*;

use crate::error::{KernelError, Result};

/// Rows per packed group: the rows a GEMV warp works on at once.
pub const PACK_ROWS: usize = 4;

/// Formats with a packed GEMV kernel, and their geometry. The simple ones
/// have blocks of 32 weights: `scale_bytes` of scales first (moved to the
/// scale plane), then the quants, cut into 4 eighths of `eighth_bytes`.
/// Q6_K and Q4_K have layouts of their own (kernels/gemv_packed.cu
/// `Q6KPlanes`, `Q4KPlanes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackFormat {
    pub ty: GgmlType,
    /// `gemv_packed_{symbol}_f32`.
    pub gemv: &'static str,
    /// `gemv_packed_{symbol}_f32_take`, `_emit`: one token, the two halves
    /// of a folded RMSNorm (`Fold`).
    pub gemv_take: &'static str,
    pub gemv_emit: &'static str,
    /// `gemv_packed_{symbol}_f32_x{2,4,8}`: the same for up to that many
    /// tokens, each weight loaded once for all of them.
    pub gemv_batch: [&'static str; 3],
    /// `gemv_packed_{symbol}_f32_x8c`: more than 8 tokens in chunks of up
    /// to 8, one launch (a chunk a grid row).
    pub gemv_chunked: &'static str,
    /// `gemv_packed_id_{symbol}_f32`: a mixture's experts, one token a
    /// slot ([`crate::Kernels::gemv_packed_experts`]).
    pub gemv_id: &'static str,
    /// `gemv_packed_grp_{symbol}_f32`: the same with the slots grouped by
    /// expert ([`crate::ExpertTiles`]).
    pub gemv_grp: &'static str,
    /// `gemm_packed_{symbol}_f32` (prefill, kernels/gemm.cu) and its
    /// small-tile twin for prompts of at most 64 tokens.
    pub gemm: &'static str,
    pub gemm_small: &'static str,
    /// `gemm_narrow_packed_{symbol}_f32`: the 32-token tile (batched decode
    /// steps of 17 to 32 sequences).
    pub gemm_narrow: &'static str,
    /// `gemm_rows_packed_{symbol}_f32`: the rows tile (kernels/gemm_rows.cuh),
    /// up to 32 tokens.
    pub gemm_rows: &'static str,
    /// `gemm_grp_narrow_packed_{symbol}_f32`, `gemm_grp_packed_{symbol}_f32`:
    /// a mixture's experts over slots grouped by expert in tiles of up to
    /// 32 and 64 ([`crate::Kernels::gemm_packed_experts`]).
    pub gemm_grp: [&'static str; 2],
    /// `embed_packed_{symbol}_f32` (kernels/embed.cu).
    pub embed: &'static str,
    /// Weights and GGUF bytes per block.
    pub qk: usize,
    pub block_bytes: usize,
    /// Bytes per block and row in the packed layout.
    pub packed_block_bytes: usize,
    /// Scale bytes per 32-weight block and row (f16 d, or f16 d and m).
    scale_bytes: usize,
    /// Quant bytes per (block, eighth, row).
    eighth_bytes: usize,
    /// XORed into every quant byte (Q8_0: signed to biased unsigned).
    bias: u8,
    /// Blocks of loads a lane of the one-token GEMV keeps in flight
    /// (kernels/gemv_packed.cuh `Pack*::U`).
    pub(crate) in_flight: usize,
    /// Whether its one-token GEMV can split a row group over 3 warps
    /// (`Pack*::SPLIT3`: blocks of 6 warps, the last blocks of a lane in
    /// flight together).
    pub(crate) split3: bool,
}

macro_rules! pformat {
    ($ty:ident, $sym:literal, $qk:expr, $bytes:expr, $packed:expr, $sb:expr, $eb:expr, $bias:expr, $u:expr, $s3:expr) => {
        PackFormat {
            ty: GgmlType::$ty,
            gemv: concat!("gemv_packed_", $sym, "_f32"),
            gemv_take: concat!("gemv_packed_", $sym, "_f32_take"),
            gemv_emit: concat!("gemv_packed_", $sym, "_f32_emit"),
            gemv_batch: [
                concat!("gemv_packed_", $sym, "_f32_x2"),
                concat!("gemv_packed_", $sym, "_f32_x4"),
                concat!("gemv_packed_", $sym, "_f32_x8"),
            ],
            gemv_chunked: concat!("gemv_packed_", $sym, "_f32_x8c"),
            gemv_id: concat!("gemv_packed_id_", $sym, "_f32"),
            gemv_grp: concat!("gemv_packed_grp_", $sym, "_f32"),
            gemm: concat!("gemm_packed_", $sym, "_f32"),
            gemm_small: concat!("gemm_small_packed_", $sym, "_f32"),
            gemm_narrow: concat!("gemm_narrow_packed_", $sym, "_f32"),
            gemm_rows: concat!("gemm_rows_packed_", $sym, "_f32"),
            gemm_grp: [
                concat!("gemm_grp_narrow_packed_", $sym, "_f32"),
                concat!("gemm_grp_packed_", $sym, "_f32"),
            ],
            embed: concat!("embed_packed_", $sym, "_f32"),
            qk: $qk,
            block_bytes: $bytes,
            packed_block_bytes: $packed,
            scale_bytes: $sb,
            eighth_bytes: $eb,
            bias: $bias,
            in_flight: $u,
            split3: $s3,
        }
    };
}

impl PackFormat {
    pub const ALL: [PackFormat; 7] = [
        pformat!(F16, "f16", 32, 64, 64, 0, 16, 0, 1, true),
        pformat!(Q8_0, "q8_0", 32, 34, 34, 2, 8, 0x80, 2, true),
        pformat!(Q4_0, "q4_0", 32, 18, 18, 2, 4, 0, 4, false),
        pformat!(Q4_1, "q4_1", 32, 20, 20, 4, 4, 0, 4, false),
        pformat!(Q4_K, "q4_k", 256, 144, 148, 0, 0, 0, 2, true),
        pformat!(Q6_K, "q6_k", 256, 210, 210, 0, 0, 0, 2, true),
        // The scale plane keeps 2 bytes a row (its E8M0 byte, then 0): 18
        // packed bytes a block where GGUF has 17.
        pformat!(MXFP4, "mxfp4", 32, 17, 18, 2, 4, 0, 4, false),
    ];

    /// The packed format of `ty` for rows of `cols` weights, or the error
    /// `kernel` reports: no packed format, or not whole blocks.
    pub(crate) fn checked(kernel: &'static str, ty: GgmlType, cols: usize) -> Result<PackFormat> {
        let f = Self::of(ty).ok_or(KernelError::Unsupported { kernel, ty })?;
        if cols == 0 || !cols.is_multiple_of(f.qk) {
            return Err(KernelError::Shape {
                kernel,
                what: format!(
                    "{cols} columns is not a positive multiple of the {ty} block of {}",
                    f.qk
                ),
            });
        }
        Ok(f)
    }

    /// The format's number in the persistent decode kernel
    /// (kernels/decode.cu `DEC_FMT_*`): its place in [`Self::ALL`].
    pub(crate) fn decode_index(&self) -> i32 {
        Self::ALL
            .iter()
            .position(|f| f.ty == self.ty)
            .expect("a packed format") as i32
    }

    /// The packed format of `ty`, if it has one.
    pub fn of(ty: GgmlType) -> Option<PackFormat> {
        Self::ALL.iter().copied().find(|f| f.ty == ty)
    }

    /// Whether a mixture's experts of `rows` x `cols` in this format go
    /// through [`crate::Kernels::gemv_packed_experts`]: whole blocks, rows
    /// in groups of 4, and each expert's packed matrix a multiple of 16
    /// bytes (the next one's start stays aligned).
    pub fn takes_experts(&self, rows: usize, cols: usize) -> bool {
        cols > 0
            && cols.is_multiple_of(self.qk)
            && rows > 0
            && rows.is_multiple_of(PACK_ROWS)
            && self.packed_bytes(rows, cols).is_multiple_of(16)
    }

    /// Bytes of a packed `rows` x `cols` matrix: the rows rounded up to
    /// whole groups, `packed_block_bytes` per row and block.
    pub fn packed_bytes(&self, rows: usize, cols: usize) -> usize {
        rows.div_ceil(PACK_ROWS) * PACK_ROWS * (cols / self.qk) * self.packed_block_bytes
    }
}

/// A gate and an up matrix of the same format and shape (GGUF rows, `rows`
/// each) as one stack for the GLU GEMV ([`crate::Kernels::gemv_packed_glu`]):
/// rows gate 0, gate 1, up 0, up 1, gate 2, gate 3, up 2, ... (`rows` even),
/// so that each packed group of 4 holds both halves of two outputs.
pub fn interleave_glu(gate: &[u8], up: &[u8], rows: usize) -> Result<Vec<u8>> {
    const K: &str = "interleave_glu";
    if gate.len() != up.len() || !rows.is_multiple_of(2) || rows == 0 {
        return Err(KernelError::Shape {
            kernel: K,
            what: format!(
                "gate of {} bytes, up of {}, {rows} rows each (even, same sizes)",
                gate.len(),
                up.len()
            ),
        });
    }
    if !gate.len().is_multiple_of(rows) {
        return Err(KernelError::Shape {
            kernel: K,
            what: format!("{} bytes are not {rows} rows", gate.len()),
        });
    }
    let pair = 2 * (gate.len() / rows);
    let mut out = Vec::with_capacity(2 * gate.len());
    for (g, u) in gate.chunks_exact(pair).zip(up.chunks_exact(pair)) {
        out.extend_from_slice(g);
        out.extend_from_slice(u);
    }
    Ok(out)
}

/// `data` (GGUF rows of `ty`, `rows` x `cols`) in the packed layout.
pub fn pack_gemv(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Result<Vec<u8>> {
    const K: &str = "pack_gemv";
    let f = PackFormat::checked(K, ty, cols)?;
    let row_bytes = cols / f.qk * f.block_bytes;
    if data.len() != rows * row_bytes {
        return Err(KernelError::Shape {
            kernel: K,
            what: format!(
                "{} bytes for {rows} x {cols} {ty} weights ({} expected)",
                data.len(),
                rows * row_bytes
            ),
        });
    }
    let mut out = vec![0u8; f.packed_bytes(rows, cols)];
    let (nb, groups) = (cols / 32, rows.div_ceil(PACK_ROWS));
    // The rows of group g (fewer in a partial last group).
    let group_rows = |g: usize| {
        data[g * PACK_ROWS * row_bytes..]
            .chunks_exact(row_bytes)
            .take(PACK_ROWS)
    };
    if ty == GgmlType::Q6_K {
        by_group(&mut out, &[64 * nb, 32 * nb, 8 * nb, nb], groups, |g, p| {
            pack_q6_k(p, group_rows(g))
        });
    } else if ty == GgmlType::Q4_K {
        by_group(&mut out, &[64 * nb, 8 * nb, 2 * nb], groups, |g, p| {
            pack_q4_k(p, group_rows(g))
        });
    } else {
        let sizes = [16 * f.eighth_bytes * nb, PACK_ROWS * f.scale_bytes * nb];
        by_group(&mut out, &sizes, groups, |g, p| {
            pack_simple(&f, p, group_rows(g))
        });
    }
    Ok(out)
}

/// Run `pack` for every group of rows in parallel, on its share of each
/// plane: plane i holds `per_group[i]` bytes per group, groups in order
/// (every plane of the layout is [group][...]).
fn by_group(
    out: &mut [u8],
    per_group: &[usize],
    groups: usize,
    pack: impl Fn(usize, &mut [&mut [u8]]) + Sync,
) {
    let mut rest = out;
    let mut planes: Vec<&mut [u8]> = Vec::new();
    for &n in per_group {
        let (plane, tail) = std::mem::take(&mut rest).split_at_mut(n * groups);
        planes.push(plane);
        rest = tail;
    }
    debug_assert!(rest.is_empty(), "planes cover the packed matrix");
    let shares: Vec<Vec<&mut [u8]>> = (0..groups)
        .map(|_| {
            planes
                .iter_mut()
                .zip(per_group)
                .map(|(p, &n)| {
                    let (share, tail) = std::mem::take(p).split_at_mut(n);
                    *p = tail;
                    share
                })
                .collect()
        })
        .collect();
    shares
        .into_par_iter()
        .enumerate()
        .for_each(|(g, mut p)| pack(g, &mut p));
}

/// One group of a simple format: planes quants ([block][eighth][row]
/// eighth_bytes) and scales ([block][row] scale_bytes). Padding rows stay
/// zero bytes: zero scales (or zero F16 values).
fn pack_simple<'a>(f: &PackFormat, p: &mut [&mut [u8]], rows: impl Iterator<Item = &'a [u8]>) {
    let (sb, eb, bias) = (f.scale_bytes, f.eighth_bytes, f.bias);
    // The scales' bytes in the GGUF block, before its 4 eighths of quants
    // (MXFP4's one E8M0 byte: its plane's second byte stays 0).
    let head = f.block_bytes - 4 * eb;
    let [quants, scales] = p else {
        unreachable!("two planes")
    };
    for (j, row) in rows.enumerate() {
        for (b, blk) in row.chunks_exact(f.block_bytes).enumerate() {
            let s = (b * PACK_ROWS + j) * sb;
            scales[s..s + head].copy_from_slice(&blk[..head]);
            for e in 0..4 {
                let dst = ((b * 4 + e) * PACK_ROWS + j) * eb;
                let src = &blk[head + e * eb..][..eb];
                for (d, s) in quants[dst..dst + eb].iter_mut().zip(src) {
                    *d = s ^ bias;
                }
            }
        }
    }
}

/// One group of Q6_K: planes lo (64 bytes per 32-weight block), hi (32),
/// sc (8) and d (8 per super-block): kernels/gemv_packed.cu `Q6KPlanes`.
fn pack_q6_k<'a>(p: &mut [&mut [u8]], rows: impl Iterator<Item = &'a [u8]>) {
    let [lo_p, hi_p, sc_p, d_p] = p else {
        unreachable!("four planes")
    };
    for (j, row) in rows.enumerate() {
        for (sbk, blk) in row.chunks_exact(210).enumerate() {
            let (ql, qh, scales) = (&blk[..128], &blk[128..192], &blk[192..208]);
            // The 6-bit value of weight i (ggml's order: 128-weight halves
            // n, 32-weight quarters m, position l).
            let q6 = |i: usize| {
                let (n, m, l) = (i / 128, (i % 128) / 32, i % 32);
                let lo = ql[64 * n + 32 * (m & 1) + l] >> (4 * (m >> 1)) & 15;
                let hi = qh[32 * n + l] >> (2 * m) & 3;
                lo | hi << 4
            };
            let d = (sbk * PACK_ROWS + j) * 2;
            d_p[d..d + 2].copy_from_slice(&blk[208..210]);
            for s in 0..8 {
                let b = sbk * 8 + s;
                let c = b * 8 + 2 * j;
                sc_p[c..c + 2].copy_from_slice(&scales[2 * s..2 * s + 2]);
                for e in 0..4 {
                    let w = |k: usize| q6(32 * s + 8 * e + k);
                    let lo = ((b * 4 + e) * PACK_ROWS + j) * 4;
                    for k in 0..4 {
                        lo_p[lo + k] = (w(k) & 15) | (w(4 + k) & 15) << 4;
                    }
                    // Word j / 2 of the eighth; rows 2w + r at bits 4r, 4r+2.
                    let h = (b * 4 + e) * 8 + (j / 2) * 4;
                    for k in 0..4 {
                        hi_p[h + k] |= ((w(k) >> 4) | (w(4 + k) >> 4) << 2) << (4 * (j % 2));
                    }
                }
            }
        }
    }
}

/// Q4_K's 6-bit scale and min of sub-block `s` (ggml's packing of the 12
/// scale bytes).
fn q4_k_scale_min(scales: &[u8], s: usize) -> (u8, u8) {
    if s < 4 {
        (scales[s] & 63, scales[s + 4] & 63)
    } else {
        (
            (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4,
            (scales[s + 4] >> 4) | (scales[s] >> 6) << 4,
        )
    }
}

/// One group of Q4_K: planes q (64 bytes per 32-weight block, as Q4_0's
/// quants), sm (8: each row's scale and min as bytes) and d (16 per
/// super-block: each row's f16 d and dmin): kernels/gemv_packed.cu
/// `Q4KPlanes`.
fn pack_q4_k<'a>(p: &mut [&mut [u8]], rows: impl Iterator<Item = &'a [u8]>) {
    let [q_p, sm_p, d_p] = p else {
        unreachable!("three planes")
    };
    for (j, row) in rows.enumerate() {
        for (sbk, blk) in row.chunks_exact(144).enumerate() {
            let (scales, qs) = (&blk[4..16], &blk[16..144]);
            let d = (sbk * PACK_ROWS + j) * 4;
            d_p[d..d + 4].copy_from_slice(&blk[..4]);
            for s in 0..8 {
                let b = sbk * 8 + s;
                let (sc, m) = q4_k_scale_min(scales, s);
                let c = b * 8 + 2 * j;
                sm_p[c] = sc;
                sm_p[c + 1] = m;
                // Weight l of sub-block s: the low (s even) or high nibble
                // of qs[32 (s / 2) + l].
                let w = |l: usize| qs[32 * (s / 2) + l] >> (4 * (s % 2)) & 15;
                for e in 0..4 {
                    let q = ((b * 4 + e) * PACK_ROWS + j) * 4;
                    for i in 0..4 {
                        q_p[q + i] = w(4 * e + i) | w(16 + 4 * e + i) << 4;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_format_numbers_match_the_kernel() {
        // kernels/decode.cu's `#define DEC_FMT_<SYM> n` is the format's place.
        let src = include_str!("../../../kernels/decode.cu");
        for f in PackFormat::ALL {
            let sym = f.gemv["gemv_packed_".len()..f.gemv.len() - "_f32".len()].to_uppercase();
            let key = format!("#define DEC_FMT_{sym} ");
            let at = src
                .find(&key)
                .unwrap_or_else(|| panic!("{key} in decode.cu"));
            let n: i32 = src[at + key.len()..]
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .expect("a number");
            assert_eq!(n, f.decode_index(), "{sym}");
        }
    }

    #[test]
    fn in_flight_and_split3_match_the_kernels() {
        // Each format's `static constexpr int U = n;` and `bool SPLIT3 = b;`
        // in its Pack struct.
        let src = include_str!("../../../kernels/gemv_packed.cuh");
        for (f, name) in PackFormat::ALL.iter().zip([
            "PackF16",
            "PackQ8_0",
            "PackQ4_0",
            "PackQ4_1",
            "PackQ4_K",
            "PackQ6_K",
            "PackMXFP4",
        ]) {
            let at = src
                .find(&format!("struct {name} {{"))
                .unwrap_or_else(|| panic!("{name} in gemv_packed.cuh"));
            let body = &src[at..];
            let u = body[body.find("int U = ").expect("U") + 8..]
                .split(';')
                .next()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .expect("U's value");
            assert_eq!(f.in_flight, u, "{name}");
            let s3 = body[body.find("bool SPLIT3 = ").expect("SPLIT3") + 14..]
                .split(';')
                .next()
                .map(str::trim)
                .expect("SPLIT3's value");
            assert_eq!(f.split3.to_string(), s3, "{name}");
        }
    }

    /// Byte offset of plane `i` (of sizes `per_block[..]` bytes per group and
    /// 32-weight block) in a packed matrix of `groups * nb` group-blocks.
    fn plane(per_block: &[usize], i: usize, groups: usize, nb: usize) -> usize {
        per_block[..i].iter().sum::<usize>() * groups * nb
    }

    /// Weight `c` of row `r` read back from the packed layout (the kernel's
    /// view of it).
    fn packed_weight(
        f: &PackFormat,
        p: &[u8],
        rows: usize,
        cols: usize,
        r: usize,
        c: usize,
    ) -> f32 {
        let nb = cols / 32;
        let groups = rows.div_ceil(PACK_ROWS);
        let (g, j, b, k) = (r / PACK_ROWS, r % PACK_ROWS, c / 32, c % 32);
        let (eb, sb) = (f.eighth_bytes, f.scale_bytes);
        let gb = g * nb + b;
        let half = |i: usize| half::f16::from_le_bytes([p[i], p[i + 1]]).to_f32();
        if f.ty == GgmlType::Q6_K {
            let (e, t, kk) = (k / 8, (k % 8) / 4, k % 4);
            let lo = p[(gb * 4 + e) * PACK_ROWS * 4 + j * 4 + kk] >> (4 * t) & 15;
            let hword = plane(&[64], 1, groups, nb) + (gb * 4 + e) * 8 + (j / 2) * 4;
            let m = 2 * (j % 2) + t;
            let hi = p[hword + kk] >> (2 * m) & 3;
            let sc = p[plane(&[64, 32], 2, groups, nb) + gb * 8 + 2 * j + k / 16] as i8 as f32;
            let d = half(
                plane(&[64, 32, 8], 3, groups, nb) + ((g * (nb / 8) + b / 8) * PACK_ROWS + j) * 2,
            );
            return d * sc * ((lo | hi << 4) as f32 - 32.0);
        }
        let nibble = |byte: u8, k: usize| if k >= 16 { byte >> 4 } else { byte & 15 } as f32;
        if f.ty == GgmlType::Q4_K {
            let byte = p[(gb * 4 + (k % 16) / 4) * PACK_ROWS * 4 + j * 4 + k % 4];
            let sm = plane(&[64], 1, groups, nb) + gb * 8 + 2 * j;
            let dd = plane(&[64, 8], 2, groups, nb) + ((g * (nb / 8) + b / 8) * PACK_ROWS + j) * 4;
            let (sc, m) = (p[sm] as f32, p[sm + 1] as f32);
            return half(dd) * sc * nibble(byte, k) - half(dd + 2) * m;
        }
        let s = groups * nb * PACK_ROWS * 4 * eb + (gb * PACK_ROWS + j) * sb;
        let eighth = |e: usize| &p[((gb * 4 + e) * PACK_ROWS + j) * eb..][..eb];
        match f.ty {
            GgmlType::F16 => {
                let e = eighth(k / 8);
                half::f16::from_le_bytes([e[2 * (k % 8)], e[2 * (k % 8) + 1]]).to_f32()
            }
            GgmlType::Q8_0 => half(s) * ((eighth(k / 8)[k % 8] ^ 0x80) as i8 as f32),
            _ => {
                // Eighth e: the low nibbles of its 4 bytes are weights 4e ..,
                // the high ones 16 + 4e ..
                let v = nibble(eighth((k % 16) / 4)[k % 4], k);
                if f.ty == GgmlType::MXFP4 {
                    // Its E8M0 byte, then 0; ggml's doubled FP4 levels and
                    // half scale.
                    assert_eq!(p[s + 1], 0);
                    const LEVELS: [f32; 8] = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0];
                    let e = p[s] as u32;
                    let d = f32::from_bits(if e < 2 {
                        0x0020_0000 << e
                    } else {
                        (e - 1) << 23
                    });
                    let level = LEVELS[v as usize & 7] * if v >= 8.0 { -1.0 } else { 1.0 };
                    return d * level;
                }
                if f.ty == GgmlType::Q4_0 {
                    half(s) * (v - 8.0)
                } else {
                    half(s) * v + half(s + 2)
                }
            }
        }
    }

    #[test]
    fn packed_layout_holds_every_weight() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for f in PackFormat::ALL {
            for (rows, cols) in [(1, 256), (5, 768), (8, 512), (13, 2560)] {
                let row_bytes = cols / f.qk * f.block_bytes;
                let mut data: Vec<u8> = (0..rows * row_bytes)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed as u8
                    })
                    .collect();
                // Finite halves: exponent bits cleared to small values.
                for h in data.chunks_exact_mut(2) {
                    h[1] &= 0xbb;
                }
                let mut want = vec![0f32; rows * cols];
                m40_gguf::quant::dequantize(f.ty, &data, &mut want).unwrap();
                let p = pack_gemv(f.ty, &data, rows, cols).unwrap();
                assert_eq!(p.len(), f.packed_bytes(rows, cols));
                for r in 0..rows {
                    for c in 0..cols {
                        let got = packed_weight(&f, &p, rows, cols, r, c);
                        assert_eq!(
                            got,
                            want[r * cols + c],
                            "{:?} {rows}x{cols} ({r}, {c})",
                            f.ty
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn pack_rejects_bad_shapes_and_formats() {
        assert!(pack_gemv(GgmlType::Q4_0, &[0; 18], 1, 33).is_err());
        assert!(pack_gemv(GgmlType::Q4_0, &[0; 17], 1, 32).is_err());
        assert!(pack_gemv(GgmlType::Q6_K, &[0; 210], 1, 32).is_err());
        assert!(pack_gemv(GgmlType::Q4_K, &[0; 144], 1, 32).is_err());
        assert!(pack_gemv(GgmlType::Q5_K, &[0; 176], 1, 256).is_err());
    }
}
