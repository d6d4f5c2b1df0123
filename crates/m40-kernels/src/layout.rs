//! How the kernels' operands lie in device memory: the weight matrices (in
//! their GGUF format or packed), stacked outputs, and the KV cache's pages.

use m40_device::{DeviceBuffer, DeviceView, KernelArgs};
use m40_gguf::GgmlType;

use crate::error::Result;
use crate::launch::{check_len, shape, to_i32};

/// Tokens per page of the KV cache: `KV_PAGE` in kernels/attention.cu.
pub const KV_PAGE: usize = 32;

/// A kernel's names for FP16, Q8_0 and Q4_0 pages: `NAME` (or
/// `NAME_f32` with `f32`) then `NAME_q8_0`, `NAME_q4_0`.
macro_rules! kv_names {
    ($b:literal) => {
        [$b, concat!($b, "_q8_0"), concat!($b, "_q4_0")]
    };
    ($b:literal, f32) => {
        [
            concat!($b, "_f32"),
            concat!($b, "_q8_0"),
            concat!($b, "_q4_0"),
        ]
    };
}
pub(crate) use kv_names;

/// How the KV cache's pages store values (kernels/kvq.cuh): FP16, or
/// blocks of 32 with an FP16 scale (ggml's Q8_0 and Q4_0 values, the
/// quants of a page's rows before its scales), keys and values rotated
/// before they are quantized.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    #[default]
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    /// Bytes of one page of one layer's K (or V) pool, `kv_dim` values a row.
    pub const fn page_bytes(self, kv_dim: usize) -> usize {
        let values = KV_PAGE * kv_dim;
        match self {
            KvType::F16 => 2 * values,
            KvType::Q8_0 => values / 32 * 34,
            KvType::Q4_0 => values / 32 * 18,
        }
    }

    /// Its kernel of a family: `names` lists FP16's, Q8_0's and Q4_0's
    /// (`kv_names!`).
    pub(crate) const fn pick(self, names: &[&'static str; 3]) -> &'static str {
        names[self as usize]
    }

    /// Whether a quantized page takes heads of `head_dim` (the rotation's
    /// runs: a multiple of 64, at most 256); FP16 takes any.
    pub const fn takes(self, head_dim: usize) -> bool {
        matches!(self, KvType::F16) || (head_dim.is_multiple_of(64) && head_dim <= 256)
    }

    /// An error unless pools of `len` u16 words hold whole pages of rows of
    /// `kv_dim` values for heads of `head_dim`.
    pub(crate) fn check_pool(
        self,
        kernel: &'static str,
        len: usize,
        kv_dim: usize,
        head_dim: usize,
    ) -> Result<()> {
        if !self.takes(head_dim) {
            return Err(shape(
                kernel,
                format!("{self:?} pages take head sizes that are multiples of 64 up to 256, not {head_dim}"),
            ));
        }
        let page = self.page_bytes(kv_dim) / 2;
        if page == 0 || !len.is_multiple_of(page) {
            return Err(shape(
                kernel,
                format!("a pool of {len} words is not whole {self:?} pages of {page}"),
            ));
        }
        Ok(())
    }
}

/// A weight matrix on the device in its GGUF format: `rows` rows of `cols`
/// weights, rows back to back.
#[derive(Clone, Copy)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub data: &'a DeviceView<'a, u8>,
    pub rows: usize,
    pub cols: usize,
}

/// Where a matmul's output goes when its weight rows are up to three
/// matrices stacked (a fused Q/K/V or gate/up projection): part `i` takes
/// the next `rows[i]` rows of every token, stored (tokens, rows[i])
/// row-major in `bufs[i]`. One part is an ordinary matmul.
pub struct RowSplit<'a, 'b> {
    pub bufs: &'a mut [&'b mut DeviceBuffer<f32>],
    pub rows: &'a [usize],
}

impl<'a, 'b> RowSplit<'a, 'b> {
    /// The kernels' (r1, r2) part boundaries, after checking the parts
    /// against a matrix of `n` rows and `m` tokens.
    pub(crate) fn bounds(&self, kernel: &'static str, n: usize, m: usize) -> Result<(i32, i32)> {
        let parts = self.rows.len();
        if parts != self.bufs.len() || !(1..=3).contains(&parts) {
            return Err(shape(
                kernel,
                format!(
                    "{parts} row counts for {} output buffers (1 to 3 parts)",
                    self.bufs.len()
                ),
            ));
        }
        let total: usize = self.rows.iter().sum();
        if total != n {
            return Err(shape(
                kernel,
                format!("output parts of {total} rows for a matrix of {n}"),
            ));
        }
        for (b, &r) in self.bufs.iter().zip(self.rows) {
            check_len(kernel, "y", b.len(), m * r)?;
        }
        let r1 = if parts == 1 { n } else { self.rows[0] };
        let r2 = if parts == 3 { r1 + self.rows[1] } else { n };
        Ok((to_i32(kernel, "rows", r1)?, to_i32(kernel, "rows", r2)?))
    }

    /// Push the kernels' `float* y0, float* y1, float* y2` (null where
    /// there is no such part).
    pub(crate) fn push<'l, A: KernelArgs<'l>>(&'l mut self, mut l: A) -> A {
        let parts = self.bufs.len();
        for b in self.bufs.iter_mut() {
            l = l.buf_mut(&mut **b);
        }
        for _ in parts..3 {
            l = l.null();
        }
        l
    }
}

/// A weight matrix on the device in the packed GEMV layout
/// ([`crate::pack_gemv`]): `rows` x `cols` weights of `ty`.
#[derive(Clone, Copy)]
pub struct PackedMatrix<'a> {
    pub ty: GgmlType,
    pub data: &'a DeviceView<'a, u8>,
    pub rows: usize,
    pub cols: usize,
}
