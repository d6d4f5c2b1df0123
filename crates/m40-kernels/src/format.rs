//! Weight formats as the kernels see them (kernels/quant.cuh).

use m40_gguf::GgmlType;

use crate::error::{KernelError, Result};

/// Warps (rows) per GEMV block: `GEMV_WARPS` in kernels/gemv.cu.
pub(crate) const GEMV_WARPS: u32 = 4;

macro_rules! kformat {
    ($ty:ident, $sym:literal, $qk:expr, $bytes:expr, $subs:expr, $float:expr) => {
        KernelFormat {
            ty: GgmlType::$ty,
            symbol: $sym,
            gemv: concat!("gemv_", $sym, "_f32"),
            gemv_id: concat!("gemv_id_", $sym, "_f32"),
            gemv_idglu: concat!("gemv_idglu_", $sym, "_f32"),
            embed: concat!("embed_", $sym, "_f32"),
            qk: $qk,
            bytes: $bytes,
            subs: $subs,
            float: $float,
        }
    };
}

/// A weight format with GPU kernels: its name in kernel symbols and the block
/// geometry of its `Fmt*` struct in quant.cuh (float formats are cut into
/// pseudo-blocks of 32 values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFormat {
    pub ty: GgmlType,
    /// The name in kernel symbols (`q4_k`).
    pub symbol: &'static str,
    /// `gemv_{symbol}_f32`, `embed_{symbol}_f32`.
    pub gemv: &'static str,
    /// `gemv_id_{symbol}_f32`: the experts' GEMV of a mixture.
    pub gemv_id: &'static str,
    /// `gemv_idglu_{symbol}_f32`: the same over interleaved gate/up
    /// experts, SwiGLU applied.
    pub gemv_idglu: &'static str,
    pub embed: &'static str,
    /// Weights per (pseudo-)block, bytes per block, 32-weight sub-blocks per block.
    pub qk: usize,
    pub bytes: usize,
    pub subs: usize,
    pub float: bool,
}

impl KernelFormat {
    pub const ALL: [KernelFormat; 16] = [
        kformat!(F32, "f32", 32, 128, 1, true),
        kformat!(F16, "f16", 32, 64, 1, true),
        kformat!(BF16, "bf16", 32, 64, 1, true),
        kformat!(Q8_0, "q8_0", 32, 34, 1, false),
        kformat!(Q4_0, "q4_0", 32, 18, 1, false),
        kformat!(Q4_1, "q4_1", 32, 20, 1, false),
        kformat!(Q5_0, "q5_0", 32, 22, 1, false),
        kformat!(Q5_1, "q5_1", 32, 24, 1, false),
        kformat!(Q2_K, "q2_k", 256, 84, 8, false),
        kformat!(Q3_K, "q3_k", 256, 110, 8, false),
        kformat!(Q4_K, "q4_k", 256, 144, 8, false),
        kformat!(Q5_K, "q5_k", 256, 176, 8, false),
        kformat!(Q6_K, "q6_k", 256, 210, 8, false),
        kformat!(IQ4_NL, "iq4_nl", 32, 18, 1, false),
        kformat!(IQ4_XS, "iq4_xs", 256, 136, 8, false),
        kformat!(MXFP4, "mxfp4", 32, 17, 1, false),
    ];

    /// The kernel format for `ty`, or an error naming the kernel that lacks it.
    pub fn of(ty: GgmlType, kernel: &'static str) -> Result<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|f| f.ty == ty)
            .ok_or(KernelError::Unsupported { kernel, ty })
    }

    /// Bytes of one row of `ncols` weights, or why `ncols` is not allowed.
    pub fn row_bytes(&self, ncols: usize, kernel: &'static str) -> Result<usize> {
        match self.ty.row_bytes(ncols as u64) {
            Some(b) if ncols > 0 => Ok(b as usize),
            _ => Err(KernelError::Shape {
                kernel,
                what: format!(
                    "{ncols} columns is not a positive multiple of the {} block of {} values",
                    self.ty,
                    self.ty.block_len()
                ),
            }),
        }
    }

    /// Sub-blocks (threads' work items) per row of `ncols`.
    pub(crate) fn subs_per_row(&self, ncols: usize) -> usize {
        ncols.div_ceil(self.qk) * self.subs
    }
}

/// `GEMV_CHUNK_BYTES` in kernels/gemv.cu: staged bytes per row and chunk.
const GEMV_CHUNK_BYTES: usize = 1008;
/// Rows a GEMV warp works on at once: `GEMV_ROWS` in kernels/gemv.cu.
pub(crate) const GEMV_ROWS: usize = 4;

/// Blocks of `f` per GEMV chunk at most: `GemvChunk<F>::BLOCKS` in
/// kernels/gemv.cu (as many as fit GEMV_CHUNK_BYTES; a multiple of 8 for
/// formats of one 32-weight sub-block per block).
pub(crate) fn gemv_chunk_blocks(f: &KernelFormat) -> usize {
    let fit = GEMV_CHUNK_BYTES / f.bytes;
    if f.subs == 8 {
        fit.max(1)
    } else {
        (fit & !7).max(8)
    }
}

/// Static shared memory of `gemv_<fmt>_f32` per block: GEMV_WARPS x
/// GEMV_ROWS slices of `GemvChunk<F>::VECS` 16-byte vectors, and the
/// GEMV_WARPS x GEMV_ROWS floats where split rows meet (kernels/gemv.cu).
pub fn gemv_shared_bytes(f: &KernelFormat) -> usize {
    let vecs = (gemv_chunk_blocks(f) * f.bytes + 30) / 16;
    let warps = GEMV_WARPS as usize;
    warps * GEMV_ROWS * vecs * 16 + warps * GEMV_ROWS * 4
}
