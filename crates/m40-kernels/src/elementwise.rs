//! Element-wise kernels (kernels/elementwise.cu): SwiGLU and GeGLU, the
//! residual add, bias rows, scaling and soft-capping, FP32 to FP16.

use m40_device::{DeviceBuffer, DeviceView, Stream};

use crate::error::Result;
use crate::launch::{cfg, check_len, shape, to_i32};
use crate::Kernels;

/// Threads per block of kernels/elementwise.cu (`ELEMENTWISE_THREADS`).
pub(crate) const ELEMENTWISE_THREADS: u32 = 256;
/// Grid-stride kernels launch at most this many blocks per SM.
const BLOCKS_PER_SM: u32 = 16;

impl Kernels {
    /// Blocks of ELEMENTWISE_THREADS for a grid-stride loop over `n` items.
    pub(crate) fn flat_grid(&self, n: usize) -> u32 {
        let cap = self.device().info().sm_count.max(1) * BLOCKS_PER_SM;
        (n.div_ceil(ELEMENTWISE_THREADS as usize) as u64).clamp(1, cap as u64) as u32
    }

    /// g = silu(g) * u over the first `n` elements.
    pub fn swiglu(
        &self,
        stream: &Stream,
        g: &mut DeviceBuffer<f32>,
        u: &DeviceView<'_, f32>,
        n: usize,
    ) -> Result<()> {
        self.in_place("swiglu_f32", stream, g, u, n)
    }

    /// g = gelu(g) * u over the first `n` elements (GeGLU, GELU's tanh
    /// approximation).
    pub fn geglu(
        &self,
        stream: &Stream,
        g: &mut DeviceBuffer<f32>,
        u: &DeviceView<'_, f32>,
        n: usize,
    ) -> Result<()> {
        self.in_place("geglu_f32", stream, g, u, n)
    }

    /// g = act(g) * u over the first `n` elements, by the model's gate
    /// activation (SwiGLU, GeGLU, gpt-oss's clamped SwiGLU).
    pub fn glu(
        &self,
        stream: &Stream,
        act: m40_gguf::hparams::Activation,
        g: &mut DeviceBuffer<f32>,
        u: &DeviceView<'_, f32>,
        n: usize,
    ) -> Result<()> {
        use m40_gguf::hparams::Activation;
        let name = match act {
            Activation::Silu => "swiglu_f32",
            Activation::GeluTanh => "geglu_f32",
            Activation::SwigluOai => "swiglu_oai_f32",
        };
        self.in_place(name, stream, g, u, n)
    }

    /// x = x * s over the first `n` elements.
    pub fn scale(
        &self,
        stream: &Stream,
        x: &mut DeviceBuffer<f32>,
        n: usize,
        s: f32,
    ) -> Result<()> {
        self.map("scale_f32", stream, x, n, s)
    }

    /// x = c tanh(x / c) over the first `n` elements (c > 0).
    pub fn softcap(
        &self,
        stream: &Stream,
        x: &mut DeviceBuffer<f32>,
        n: usize,
        c: f32,
    ) -> Result<()> {
        if c <= 0.0 || !c.is_finite() {
            return Err(shape("softcap_f32", format!("cap {c}: must be positive")));
        }
        self.map("softcap_f32", stream, x, n, c)
    }

    /// mistral3's attention temperature on a step's queries x (`n_tok`
    /// rows of `width`): row t times 1 + scale ln(floor(p / floor) + 1), p
    /// its position, `pos[t]` where `per_token` (a batched step), else
    /// `pos[0] + t` (one sequence). The positions are read on the device.
    #[allow(clippy::too_many_arguments)]
    pub fn attn_temperature(
        &self,
        stream: &Stream,
        x: &mut DeviceBuffer<f32>,
        pos: &DeviceView<'_, i32>,
        per_token: bool,
        n_tok: usize,
        width: usize,
        scale: f32,
        floor: usize,
    ) -> Result<()> {
        const K: &str = "attn_temp_f32";
        check_len(K, "x", x.len(), n_tok * width)?;
        check_len(K, "pos", pos.len(), if per_token { n_tok } else { 1 })?;
        if floor == 0 {
            return Err(shape(K, "floor 0".into()));
        }
        let kernel = self.kernel("elementwise", K)?;
        let grid = (self.flat_grid(n_tok * width), 1, 1);
        let (pt, n, w, fl) = (
            per_token as i32,
            to_i32(K, "n_tok", n_tok)?,
            to_i32(K, "width", width)?,
            to_i32(K, "floor", floor)?,
        );
        // SAFETY: attn_temp_f32 is (float* x, const int* pos, int
        // per_token, int n_tok, int width, float s, int fl), grid-stride
        // over n_tok * width elements of x; the lengths are checked above.
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(x)
                .view(pos)
                .scalar(&pt)
                .scalar(&n)
                .scalar(&w)
                .scalar(&scale)
                .scalar(&fl)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }

    /// The kernels (float* x, long long n, float c) over x[..n].
    fn map(
        &self,
        name: &'static str,
        stream: &Stream,
        x: &mut DeviceBuffer<f32>,
        n: usize,
        c: f32,
    ) -> Result<()> {
        check_len(name, "x", x.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let kernel = self.kernel("elementwise", name)?;
        let grid = (self.flat_grid(n), 1, 1);
        let n = n as i64;
        // SAFETY: scale_f32 and softcap_f32 are (float* x, long long n,
        // float c), grid-stride over i < n; the length is checked above.
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(x)
                .scalar(&n)
                .scalar(&c)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }

    /// The gate of an interleaved gate/up projection gu (m, 2f) (the rows
    /// of a stack from [`crate::interleave_glu`]): out (m, f) = act(gate) *
    /// up.
    #[allow(clippy::too_many_arguments)]
    pub fn glu_pairs(
        &self,
        stream: &Stream,
        act: m40_gguf::hparams::Activation,
        gu: &DeviceView<'_, f32>,
        out: &mut DeviceBuffer<f32>,
        m: usize,
        f: usize,
    ) -> Result<()> {
        const K: &str = "glu_pairs_f32";
        if !f.is_multiple_of(2) {
            return Err(shape(K, format!("{f} columns: pairs")));
        }
        check_len(K, "gu", gu.len(), 2 * m * f)?;
        check_len(K, "out", out.len(), m * f)?;
        if !gu.is_aligned(8) {
            return Err(shape(K, "gu must start at a multiple of 8 bytes".into()));
        }
        let pairs = m * f / 2;
        if pairs == 0 {
            return Ok(());
        }
        let kernel = self.kernel("elementwise", K)?;
        let (n, act) = (pairs as i64, act_id(act));
        // SAFETY: glu_pairs_f32(const float* gu, float* out, long long n, int
        // act): reads gu[..4n] and writes out[..2n] as float2 (gu 8-byte
        // aligned, checked; out a buffer's start); lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .view(gu)
                .buf_mut(out)
                .scalar(&n)
                .scalar(&act)
                .run(cfg((self.flat_grid(pairs), 1, 1), ELEMENTWISE_THREADS))?
        };
        Ok(())
    }

    /// y += x over the first `n` elements (the residual connection).
    pub fn add(
        &self,
        stream: &Stream,
        y: &mut DeviceBuffer<f32>,
        x: &DeviceView<'_, f32>,
        n: usize,
    ) -> Result<()> {
        self.in_place("add_f32", stream, y, x, n)
    }

    /// y[r, c] += b[c] for the first `rows` rows of y (rows of b.len()).
    pub fn add_rows(
        &self,
        stream: &Stream,
        y: &mut DeviceBuffer<f32>,
        b: &DeviceView<'_, f32>,
        rows: usize,
    ) -> Result<()> {
        const K: &str = "add_rows_f32";
        let width = b.len();
        let n = rows * width;
        check_len(K, "y", y.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let kernel = self.kernel("elementwise", K)?;
        let grid = (self.flat_grid(n), 1, 1);
        let (n, width) = (n as i64, to_i32(K, "width", width)?);
        // SAFETY: add_rows_f32(float* y, const float* b, long long n, int width):
        // grid-stride over i < n reading b[i % width]; lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(y)
                .view(b)
                .scalar(&n)
                .scalar(&width)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }

    /// The element-wise kernels of the form `k(float* y, const float* x, long long n)`
    /// that update y from x in place (kernels/elementwise.cu).
    fn in_place(
        &self,
        name: &'static str,
        stream: &Stream,
        y: &mut DeviceBuffer<f32>,
        x: &DeviceView<'_, f32>,
        n: usize,
    ) -> Result<()> {
        check_len(name, "output", y.len(), n)?;
        check_len(name, "input", x.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let kernel = self.kernel("elementwise", name)?;
        let grid = (self.flat_grid(n), 1, 1);
        let n = n as i64;
        // SAFETY: swiglu_f32, geglu_f32, swiglu_oai_f32 and add_f32 are (float* y, const float* x, long long n),
        // grid-stride over i < n; lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(y)
                .view(x)
                .scalar(&n)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }

    /// y = fp16(x) (round to nearest even) over the first `n` elements; y
    /// holds FP16 bit patterns.
    pub fn f32_to_f16(
        &self,
        stream: &Stream,
        x: &DeviceView<'_, f32>,
        y: &mut DeviceBuffer<u16>,
        n: usize,
    ) -> Result<()> {
        const K: &str = "f32_to_f16";
        check_len(K, "x", x.len(), n)?;
        check_len(K, "y", y.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let kernel = self.kernel("elementwise", K)?;
        let grid = (self.flat_grid(n), 1, 1);
        let n = n as i64;
        // SAFETY: f32_to_f16(const float* x, u16* y, long long n): grid-stride over
        // i < n, lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .view(x)
                .buf_mut(y)
                .scalar(&n)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }
}

/// The kernels' number for an activation (common.cuh's `glu_act`).
pub(crate) fn act_id(act: m40_gguf::hparams::Activation) -> i32 {
    use m40_gguf::hparams::Activation;
    match act {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
        Activation::SwigluOai => 2,
    }
}
