//! Probes the benchmarks measure ceilings with (kernels/bench.cu).

use m40_device::{DeviceBuffer, DeviceView, Stream};

use crate::elementwise::ELEMENTWISE_THREADS;
use crate::error::Result;
use crate::launch::{cfg, check_len, shape, to_i32};
use crate::Kernels;

impl Kernels {
    /// Read every byte of `buf` (whole 16-byte vectors) once; one word per
    /// block goes to `out`, which needs `probe_blocks()` elements. The read
    /// bandwidth this reaches is the ceiling GEMV is measured against.
    pub fn read_probe(
        &self,
        stream: &Stream,
        buf: &DeviceView<'_, u8>,
        out: &mut DeviceBuffer<u32>,
    ) -> Result<()> {
        const K: &str = "read_probe";
        if !buf.is_aligned(16) {
            return Err(shape(
                K,
                "buffer must start at a multiple of 16 bytes".into(),
            ));
        }
        let blocks = self.probe_blocks();
        check_len(K, "out", out.len(), blocks)?;
        let kernel = self.kernel("bench", K)?;
        let n_vec = (buf.len() / 16) as i64;
        // SAFETY: read_probe(const uint4* p, long long n_vec, u32* out): reads
        // n_vec whole vectors inside buf, writes out[..grid]; checked above.
        unsafe {
            stream
                .launch(&kernel)
                .view(buf)
                .scalar(&n_vec)
                .buf_mut(out)
                .run(cfg((blocks as u32, 1, 1), 256))?
        };
        Ok(())
    }

    /// FMA chains per thread of `fma_probe` (`FMA_CHAINS` in kernels/bench.cu).
    const FMA_CHAINS: u64 = 8;

    /// Run `iters` rounds of FMA_CHAINS dependent FMAs in every thread of
    /// `probe_blocks()` blocks of 256; `out` needs `probe_blocks() * 256`
    /// floats. Returns the FLOPs done (2 per FMA); the rate this reaches is
    /// the FP32 ceiling prefill is measured against.
    pub fn fma_probe(
        &self,
        stream: &Stream,
        out: &mut DeviceBuffer<f32>,
        iters: u32,
    ) -> Result<u64> {
        const K: &str = "fma_probe";
        let blocks = self.probe_blocks();
        check_len(K, "out", out.len(), blocks * 256)?;
        let kernel = self.kernel("bench", K)?;
        let (iters_i, a, b) = (to_i32(K, "iters", iters as usize)?, 0.999_f32, 0.5_f32);
        // SAFETY: fma_probe(float* out, int iters, float a, float b) writes
        // out[block * 256 + thread] for the grid launched; length checked above.
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(out)
                .scalar(&iters_i)
                .scalar(&a)
                .scalar(&b)
                .run(cfg((blocks as u32, 1, 1), 256))?
        };
        Ok(2 * Self::FMA_CHAINS * iters as u64 * blocks as u64 * 256)
    }

    /// Blocks of a `read_probe` launch: 8 per SM.
    pub fn probe_blocks(&self) -> usize {
        self.device().info().sm_count.max(1) as usize * 8
    }

    /// Fill `buf` with pseudo-random words (whole words; a trailing partial
    /// word is left alone) from `seed`.
    pub fn fill_random(
        &self,
        stream: &Stream,
        buf: &mut DeviceBuffer<u8>,
        seed: u32,
    ) -> Result<()> {
        const K: &str = "fill_random";
        let n = (buf.len() / 4) as i64;
        if n == 0 {
            return Ok(());
        }
        let kernel = self.kernel("bench", K)?;
        let grid = (self.flat_grid(n as usize), 1, 1);
        // SAFETY: fill_random(u32* p, long long n, u32 seed): grid-stride over the
        // n whole words of buf (allocations are 256-byte aligned).
        unsafe {
            stream
                .launch(&kernel)
                .buf_mut(buf)
                .scalar(&n)
                .scalar(&seed)
                .run(cfg(grid, ELEMENTWISE_THREADS))?
        };
        Ok(())
    }
}
