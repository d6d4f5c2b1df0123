//! RMSNorm and LayerNorm without bias (kernels/rmsnorm.cu).

use m40_device::{DeviceBuffer, DeviceView, Stream};
use m40_gguf::NormKind;

use crate::error::Result;
use crate::launch::{cfg, check_len, shape, to_i32};
use crate::Kernels;

/// Threads per block of kernels/rmsnorm.cu.
const RMSNORM_THREADS: u32 = 256;

/// The x operand of a norm launch: read, or updated by a residual
/// first.
enum Norm<'x, 'v> {
    Plain(&'x DeviceView<'v, f32>),
    Add(AddResidual<'x, 'v>),
}

/// A residual connection x += d (x, d: (rows, n)) that
/// [`Kernels::add_norm`] makes before its norm; with `post`, the branch d
/// is RMS-normed first: x += rmsnorm(d) * post.w * post.scale.
pub struct AddResidual<'x, 'v> {
    pub x: &'x mut DeviceBuffer<f32>,
    pub d: &'x DeviceView<'v, f32>,
    pub post: Option<PostNorm<'x, 'v>>,
}

/// The RMSNorm of a residual branch before it joins x (gemma's post-norms),
/// its weights (n) and a factor after them (1.0 but for a model with a
/// residual multiplier); epsilon: the launch's.
pub struct PostNorm<'x, 'v> {
    pub w: &'x DeviceView<'v, f32>,
    pub scale: f32,
}

impl Kernels {
    /// y = norm(x) * w row by row: RMSNorm (x / sqrt(mean(x^2) + eps) *
    /// w) or LayerNorm ((x - mean) / sqrt(var + eps) * w). x, y: (rows,
    /// n); w: (n).
    #[allow(clippy::too_many_arguments)]
    pub fn norm(
        &self,
        stream: &Stream,
        kind: NormKind,
        x: &DeviceView<'_, f32>,
        w: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        self.norm_launch(stream, kind, Norm::Plain(x), w, y, rows, eps)
    }

    /// The residual connection and the next norm in one launch: x += d
    /// (or its post-norm, `add.post`), then y = norm(x) * w. x, d, y:
    /// (rows, n); w and the post-norm's weights: (n).
    #[allow(clippy::too_many_arguments)]
    pub fn add_norm(
        &self,
        stream: &Stream,
        kind: NormKind,
        add: AddResidual<'_, '_>,
        w: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        self.norm_launch(stream, kind, Norm::Add(add), w, y, rows, eps)
    }

    /// Each of `rows` rows of `n` of x normed in place, row r with the
    /// weights w[(r % (w.len() / n)) * n..][..n]: gemma's post-norms (w
    /// one row), the query and key head norms with weights one head's
    /// (shared: qwen3) or every head's of a token (command-r+). x: at
    /// least (rows, n); w: a multiple of n.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_in_place(
        &self,
        stream: &Stream,
        kind: NormKind,
        x: &mut DeviceBuffer<f32>,
        w: &DeviceView<'_, f32>,
        n: usize,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        let name = match kind {
            NormKind::Rms => "rmsnorm_inplace_f32",
            NormKind::Layer => "layernorm_inplace_f32",
        };
        if rows == 0 || n == 0 {
            return Ok(());
        }
        if !w.len().is_multiple_of(n) || w.is_empty() {
            return Err(shape(
                name,
                format!("{} weights are not rows of {n}", w.len()),
            ));
        }
        check_len(name, "x", x.len(), rows * n)?;
        if n.is_multiple_of(4) && !w.is_aligned(16) {
            return Err(shape(
                name,
                format!(
                    "rows of {n} floats are read with 16-byte loads: w must be 16-byte aligned"
                ),
            ));
        }
        let kernel = self.kernel("rmsnorm", name)?;
        let w_rows = to_i32(name, "w_rows", w.len() / n)?;
        let n = to_i32(name, "n", n)?;
        let grid = (
            u32::try_from(rows).map_err(|_| shape(name, format!("{rows} rows")))?,
            1,
            1,
        );
        // SAFETY: rmsnorm_inplace_f32 / layernorm_inplace_f32(float* x, const float* w,
        // int n, int w_rows, float eps): block r reads and writes x[r*n..][..n] (a whole
        // allocation: 16-byte aligned) and reads w[(r % w_rows)*n..][..n], inside w
        // (w_rows * n = w.len()): lengths and alignment checked above (rows of a
        // multiple of 4 floats keep 16-byte alignment).
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(x)
                .view(w)
                .scalar(&n)
                .scalar(&w_rows)
                .scalar(&eps)
                .run(cfg(grid, RMSNORM_THREADS))?
        };
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn norm_launch(
        &self,
        stream: &Stream,
        kind: NormKind,
        x: Norm<'_, '_>,
        w: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        let layer = kind == NormKind::Layer;
        let (name, x_len, x_aligned) = match &x {
            Norm::Plain(x) => (
                if layer {
                    "layernorm_f32"
                } else {
                    "rmsnorm_f32"
                },
                x.len(),
                x.is_aligned(16),
            ),
            Norm::Add(AddResidual { x, d, post }) => {
                let name = match (layer, post.is_some()) {
                    (true, false) => "add_layernorm_f32",
                    (false, false) => "add_rmsnorm_f32",
                    (true, true) => "add_post_layernorm_f32",
                    (false, true) => "add_post_rmsnorm_f32",
                };
                check_len(name, "d", d.len(), rows * w.len())?;
                let post_aligned = match post {
                    Some(p) => {
                        check_len(name, "post-norm weights", p.w.len(), w.len())?;
                        p.w.is_aligned(16)
                    }
                    None => true,
                };
                (name, x.len(), d.is_aligned(16) && post_aligned)
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
        let ps = match &x {
            Norm::Add(AddResidual { post: Some(p), .. }) => p.scale,
            _ => 1.0f32,
        };
        let grid = (
            u32::try_from(rows).map_err(|_| shape(name, format!("{rows} rows")))?,
            1,
            1,
        );
        // SAFETY: rmsnorm_f32 / layernorm_f32(const float* x, const float* w, float* y,
        // int n, float eps), add_rmsnorm_f32 / add_layernorm_f32(float* x, const float*
        // d, const float* w, float* y, int n, float eps) and add_post_rmsnorm_f32 /
        // add_post_layernorm_f32(float* x, const float* d, const float* pw, float ps,
        // const float* w, float* y, int n, float eps); block r reads (and for the add
        // forms writes) x[r*n..][..n], reads d[r*n..][..n], pw[..n] and w[..n], writes
        // y[r*n..][..n]: lengths checked above; 16-byte accesses when n % 4 == 0,
        // alignment checked above (y is a whole allocation).
        unsafe {
            let l = stream.launch(&kernel);
            let l = match x {
                Norm::Plain(x) => l.view(x),
                Norm::Add(AddResidual { x, d, post: None }) => l.buf_mut(x).view(d),
                Norm::Add(AddResidual {
                    x,
                    d,
                    post: Some(p),
                }) => l.buf_mut(x).view(d).view(p.w).scalar(&ps),
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
