//! Weights repacked at upload for the packed GEMV kernels
//! (kernels/gemv_packed.cu, which documents the layout): rows in groups of
//! 4, each lane's 16-byte load holding one eighth of a block for all 4 rows,
//! the scales in a plane of their own. Same byte count as the GGUF rows
//! (plus zero rows padding the last group).

use m40_gguf::GgmlType;

use crate::error::{KernelError, Result};

/// Rows per packed group: the rows a GEMV warp works on at once.
pub const PACK_ROWS: usize = 4;

/// Formats with a packed GEMV kernel, and their geometry. Every one has
/// blocks of 32 weights: `scale_bytes` of scales first (moved to the scale
/// plane), then the quants, cut into 4 eighths of `eighth_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackFormat {
    pub ty: GgmlType,
    /// `gemv_packed_{symbol}_f32`.
    pub gemv: &'static str,
    /// Scale bytes per block and row (f16 d, or f16 d and m).
    pub scale_bytes: usize,
    /// Quant bytes per (block, eighth, row).
    pub eighth_bytes: usize,
    /// XORed into every quant byte (Q8_0: signed to biased unsigned).
    pub bias: u8,
}

macro_rules! pformat {
    ($ty:ident, $sym:literal, $sb:expr, $eb:expr, $bias:expr) => {
        PackFormat {
            ty: GgmlType::$ty,
            gemv: concat!("gemv_packed_", $sym, "_f32"),
            scale_bytes: $sb,
            eighth_bytes: $eb,
            bias: $bias,
        }
    };
}

impl PackFormat {
    pub const ALL: [PackFormat; 4] = [
        pformat!(F16, "f16", 0, 16, 0),
        pformat!(Q8_0, "q8_0", 2, 8, 0x80),
        pformat!(Q4_0, "q4_0", 2, 4, 0),
        pformat!(Q4_1, "q4_1", 4, 4, 0),
    ];

    /// The packed format of `ty`, if it has one.
    pub fn of(ty: GgmlType) -> Option<PackFormat> {
        Self::ALL.iter().copied().find(|f| f.ty == ty)
    }

    /// GGUF bytes per block of 32 weights.
    pub fn block_bytes(&self) -> usize {
        self.scale_bytes + 4 * self.eighth_bytes
    }

    /// Bytes of a packed `rows` x `cols` matrix.
    pub fn packed_bytes(&self, rows: usize, cols: usize) -> usize {
        rows.div_ceil(PACK_ROWS) * PACK_ROWS * (cols / 32) * self.block_bytes()
    }
}

/// `data` (GGUF rows of `ty`, `rows` x `cols`) in the packed layout.
pub fn pack_gemv(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Result<Vec<u8>> {
    const K: &str = "pack_gemv";
    let f = PackFormat::of(ty).ok_or(KernelError::Unsupported { kernel: K, ty })?;
    if cols == 0 || !cols.is_multiple_of(32) {
        return Err(KernelError::Shape {
            kernel: K,
            what: format!("{cols} columns is not a positive multiple of the {ty} block of 32"),
        });
    }
    let nb = cols / 32;
    let bb = f.block_bytes();
    let row_bytes = nb * bb;
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
    let groups = rows.div_ceil(PACK_ROWS);
    let eb = f.eighth_bytes;
    let mut out = vec![0u8; f.packed_bytes(rows, cols)];
    let (quants, scales) = out.split_at_mut(groups * nb * PACK_ROWS * 4 * eb);
    // Padding rows are zero bytes: zero scales (or zero F16 values).
    let (sb, bias) = (f.scale_bytes, f.bias);
    for r in 0..rows {
        let (g, j) = (r / PACK_ROWS, r % PACK_ROWS);
        let row = &data[r * row_bytes..][..row_bytes];
        for b in 0..nb {
            let blk = &row[b * bb..][..bb];
            let s = ((g * nb + b) * PACK_ROWS + j) * sb;
            scales[s..s + sb].copy_from_slice(&blk[..sb]);
            for e in 0..4 {
                let dst = (((g * nb + b) * 4 + e) * PACK_ROWS + j) * eb;
                let src = &blk[sb + e * eb..][..eb];
                for (d, s) in quants[dst..dst + eb].iter_mut().zip(src) {
                    *d = s ^ bias;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let s = groups * nb * PACK_ROWS * 4 * eb + ((g * nb + b) * PACK_ROWS + j) * sb;
        let half = |i: usize| half::f16::from_le_bytes([p[i], p[i + 1]]).to_f32();
        let eighth = |e: usize| &p[(((g * nb + b) * 4 + e) * PACK_ROWS + j) * eb..][..eb];
        match f.ty {
            GgmlType::F16 => {
                let e = eighth(k / 8);
                half::f16::from_le_bytes([e[2 * (k % 8)], e[2 * (k % 8) + 1]]).to_f32()
            }
            GgmlType::Q8_0 => half(s) * ((eighth(k / 8)[k % 8] ^ 0x80) as i8 as f32),
            _ => {
                // Eighth e: the low nibbles of its 4 bytes are weights 4e ..,
                // the high ones 16 + 4e ..
                let (e, i, hi) = ((k % 16) / 4, k % 4, k >= 16);
                let byte = eighth(e)[i];
                let v = if hi { byte >> 4 } else { byte & 15 } as f32;
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
            for (rows, cols) in [(1, 32), (5, 96), (8, 64), (13, 320)] {
                let row_bytes = cols / 32 * f.block_bytes();
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
        assert!(pack_gemv(GgmlType::Q6_K, &[0; 210], 1, 256).is_err());
    }
}
