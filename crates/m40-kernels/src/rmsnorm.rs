//! RMSNorm (kernels/rmsnorm.cu).

use m40_device::{DeviceBuffer, DeviceView, Stream};

use crate::error::Result;
use crate::launch::{cfg, check_len, shape, to_i32};
use crate::Kernels;

/// Threads per block of kernels/rmsnorm.cu.
const RMSNORM_THREADS: u32 = 256;

/// The x operand of an RMSNorm launch: read, or updated by a residual
/// first.
enum Norm<'x, 'v> {
    Plain(&'x DeviceView<'v, f32>),
    Add(&'x mut DeviceBuffer<f32>, &'x DeviceView<'v, f32>),
}

/// A residual connection x += d (x, d: (rows, n)) that
/// [`Kernels::add_rmsnorm`] makes before its norm.
pub struct AddResidual<'x, 'v> {
    pub x: &'x mut DeviceBuffer<f32>,
    pub d: &'x DeviceView<'v, f32>,
}

impl Kernels {
    /// y = x / sqrt(mean(x^2) + eps) * w, row by row. x, y: (rows, n); w: (n).
    pub fn rmsnorm(
        &self,
        stream: &Stream,
        x: &DeviceView<'_, f32>,
        w: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        self.rmsnorm_launch(stream, Norm::Plain(x), w, y, rows, eps)
    }

    /// The residual connection and the next norm in one launch: x += d,
    /// then y = x / sqrt(mean(x^2) + eps) * w. x, d, y: (rows, n); w: (n).
    pub fn add_rmsnorm(
        &self,
        stream: &Stream,
        AddResidual { x, d }: AddResidual<'_, '_>,
        w: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        self.rmsnorm_launch(stream, Norm::Add(x, d), w, y, rows, eps)
    }

    /// x = x / sqrt(mean(x^2) + eps) * w in place, for each of `rows` rows
    /// of w.len() (qwen3's per-head query and key norms). x: at least
    /// (rows, n); w: (n).
    pub fn rmsnorm_in_place(
        &self,
        stream: &Stream,
        x: &mut DeviceBuffer<f32>,
        w: &DeviceView<'_, f32>,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        const NAME: &str = "rmsnorm_inplace_f32";
        let n = w.len();
        if rows == 0 || n == 0 {
            return Ok(());
        }
        check_len(NAME, "x", x.len(), rows * n)?;
        if n.is_multiple_of(4) && !w.is_aligned(16) {
            return Err(shape(
                NAME,
                format!(
                    "rows of {n} floats are read with 16-byte loads: w must be 16-byte aligned"
                ),
            ));
        }
        let kernel = self.kernel("rmsnorm", NAME)?;
        let n = to_i32(NAME, "n", n)?;
        let grid = (
            u32::try_from(rows).map_err(|_| shape(NAME, format!("{rows} rows")))?,
            1,
            1,
        );
        // SAFETY: rmsnorm_inplace_f32(float* x, const float* w, int n, float eps):
        // block r reads and writes x[r*n..][..n] (a whole allocation: 16-byte
        // aligned) and reads w[..n]: lengths and alignment checked above.
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(x)
                .view(w)
                .scalar(&n)
                .scalar(&eps)
                .run(cfg(grid, RMSNORM_THREADS))?
        };
        Ok(())
    }

    fn rmsnorm_launch(
        &self,
        stream: &Stream,
        x: Norm<'_, '_>,
        w: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        let (name, x_len, x_aligned) = match &x {
            Norm::Plain(x) => ("rmsnorm_f32", x.len(), x.is_aligned(16)),
            Norm::Add(x, d) => {
                check_len("add_rmsnorm_f32", "d", d.len(), rows * w.len())?;
                ("add_rmsnorm_f32", x.len(), d.is_aligned(16))
            }
        };
        let n = w.len();
        if rows == 0 || n == 0 {
            return Ok(());
        }
        check_len(name, "x", x_len, rows * n)?;
        check_len(name, "y", y.len(), rows * n)?;
        if n.is_multiple_of(4) && !(x_aligned && w.is_aligned(16)) {
            return Err(shape(
                name,
                format!("rows of {n} floats are read with 16-byte loads: x, d and w must be 16-byte aligned"),
            ));
        }
        let kernel = self.kernel("rmsnorm", name)?;
        let n = to_i32(name, "n", n)?;
        let grid = (
            u32::try_from(rows).map_err(|_| shape(name, format!("{rows} rows")))?,
            1,
            1,
        );
        // SAFETY: rmsnorm_f32(const float* x, const float* w, float* y, int n, float eps)
        // and add_rmsnorm_f32(float* x, const float* d, const float* w, float* y, int n,
        // float eps); block r reads (and for add_rmsnorm writes) x[r*n..][..n], reads
        // d[r*n..][..n] and w[..n], writes y[r*n..][..n]: lengths checked above; 16-byte
        // accesses when n % 4 == 0, alignment checked above (y is a whole allocation).
        unsafe {
            let l = stream.launch(&kernel);
            let l = match x {
                Norm::Plain(x) => l.view(x),
                Norm::Add(x, d) => l.buf_mut(x).view(d),
            };
            l.view(w)
                .buf_mut(y)
                .scalar(&n)
                .scalar(&eps)
                .run(cfg(grid, RMSNORM_THREADS))?
        };
        Ok(())
    }
}
