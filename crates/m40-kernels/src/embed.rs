//! The embedding gather (kernels/embed.cu).

use m40_device::{DeviceBuffer, DeviceView, Stream};

use crate::error::Result;
use crate::format::KernelFormat;
use crate::launch::{cfg, check_len, shape, to_i32};
use crate::layout::{PackedMatrix, QMatrix};
use crate::pack::PackFormat;
use crate::Kernels;

/// Threads per block of kernels/embed.cu (`EMBED_THREADS`).
const EMBED_THREADS: u32 = 128;

/// The gather's grid: a block row per id, `items` threads per row.
fn embed_grid(
    kernel: &'static str,
    n_ids: usize,
    ncols: usize,
    items: usize,
) -> Result<(u32, u32, u32)> {
    let grid_y = items.div_ceil(EMBED_THREADS as usize);
    if grid_y > 65535 {
        return Err(shape(
            kernel,
            format!("{ncols} columns need {grid_y} blocks in y (max 65535)"),
        ));
    }
    Ok((to_i32(kernel, "ids", n_ids)? as u32, grid_y as u32, 1))
}

impl Kernels {
    /// [`Kernels::embed`] from a table in the packed layout (a tied
    /// embedding shares the output matrix's packed copy).
    pub fn embed_packed(
        &self,
        stream: &Stream,
        table: &PackedMatrix<'_>,
        ids: &DeviceView<'_, i32>,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "embed_packed";
        let (ty, w, n_vocab, ncols) = (table.ty, table.data, table.rows, table.cols);
        let f = PackFormat::checked(K, ty, ncols)?;
        let n_ids = ids.len();
        if n_ids == 0 {
            return Ok(());
        }
        check_len(K, "weights", w.len(), f.packed_bytes(n_vocab, ncols))?;
        check_len(K, "out", out.len(), n_ids * ncols)?;
        if !w.is_aligned(16) {
            return Err(shape(
                K,
                "weights must start at a multiple of 16 bytes".into(),
            ));
        }
        let grid = embed_grid(K, n_ids, ncols, ncols / 32 * 4)?; // a thread per 8 weights
        let kernel = self.kernel("embed", f.embed)?;
        let (ncols, n_vocab) = (to_i32(K, "ncols", ncols)?, to_i32(K, "n_vocab", n_vocab)?);
        // SAFETY: embed_packed_<fmt>_f32(const u8* W, const int* ids, float* out, int ncols,
        // int n_vocab): block t reads ids[t] and, for an id < n_vocab, that row's words of
        // the packed W (packed_bytes checked, 16-byte aligned); writes out[t*ncols..][..ncols].
        unsafe {
            stream
                .launch(&kernel)
                .view(w)
                .view(ids)
                .buf_mut(out)
                .scalar(&ncols)
                .scalar(&n_vocab)
                .run(cfg(grid, EMBED_THREADS))?
        };
        Ok(())
    }

    /// out[t] = dequant(table)[ids[t]]: rows of an embedding table (n_vocab
    /// rows). ids: (n_ids); out: (n_ids, cols) FP32. Ids outside [0, n_vocab)
    /// give NaN rows.
    pub fn embed(
        &self,
        stream: &Stream,
        table: &QMatrix<'_>,
        ids: &DeviceView<'_, i32>,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "embed";
        let (ty, w, n_vocab, ncols) = (table.ty, table.data, table.rows, table.cols);
        let f = KernelFormat::of(ty, K)?;
        let row_bytes = f.row_bytes(ncols, K)?;
        let n_ids = ids.len();
        if n_ids == 0 {
            return Ok(());
        }
        check_len(K, "weights", w.len(), n_vocab * row_bytes)?;
        check_len(K, "out", out.len(), n_ids * ncols)?;
        // One thread per 4-weight part.
        let grid = embed_grid(K, n_ids, ncols, f.subs_per_row(ncols) * 8)?;
        let kernel = self.kernel("embed", f.embed)?;
        let (ncols, row_bytes, n_vocab) = (
            to_i32(K, "ncols", ncols)?,
            row_bytes as i64,
            to_i32(K, "n_vocab", n_vocab)?,
        );
        // SAFETY: embed_<fmt>_f32(const u8* W, const int* ids, float* out, int ncols,
        // long long row_bytes, int n_vocab); it reads W rows only for ids in
        // [0, n_vocab) (checked on the device) within n_vocab * row_bytes bytes,
        // and writes n_ids * ncols floats of out, lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .view(w)
                .view(ids)
                .buf_mut(out)
                .scalar(&ncols)
                .scalar(&row_bytes)
                .scalar(&n_vocab)
                .run(cfg(grid, EMBED_THREADS))?
        };
        Ok(())
    }
}
