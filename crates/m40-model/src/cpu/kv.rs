//! The CPU's KV cache: pages of [`PAGE_TOKENS`] tokens, as on the GPU, so
//! that sequences share the pages of a common prefix (the engine's prefix
//! cache). Per layer one array for K and one for V hold every page of the
//! pool used so far, each page's rows together, in the pool's
//! [`KvFormat`] (halves, or ggml's Q8_0 / Q4_0 blocks, dequantized to FP32
//! as attention reads them); the arrays grow as pages are first taken.
//! Which sequence holds which page is [`crate::paged`]'s accounting.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::error::{ModelError, Result};
use crate::host::human_bytes;
use crate::paged::{PagePool, PagedCache};
use crate::KvFormat;

/// Tokens a page of the CPU's KV cache holds. Smaller than the GPU's 32
/// (whose attention kernels read a page per warp step): on the CPU a
/// page's size costs nothing in attention, and a finer page lets the
/// prefix cache reuse more of a prompt (BENCHMARKS.md: 8 clients of the
/// load example, 2.5x one client's tokens with pages of 16, 2.8x with 8).
pub const PAGE_TOKENS: usize = 8;

/// The K and V rows of every page of one layer, in 16-bit words (a half,
/// or the words of Q8_0's 34-byte and Q4_0's 18-byte blocks): page p's row
/// of the token at offset i in it starts at value (p * PAGE_TOKENS + i) *
/// kv_dim ([`HostPages::row_at`]), word [`Rows::word`] of it.
#[derive(Default)]
pub(crate) struct LayerPages {
    pub(crate) k: Vec<u16>,
    pub(crate) v: Vec<u16>,
}

/// Reads and writes values of a pool's format in its word arrays.
#[derive(Clone, Copy)]
pub(crate) struct Rows(pub(crate) KvFormat);

/// An orthonormal Walsh-Hadamard rotation of each run of `n` values of
/// `x` (`n` a power of two): spreads an outlier over its block before a
/// quantized page's blocks take one scale each, and is its own inverse.
pub fn rotate(x: &mut [f32], n: usize) {
    let scale = 1.0 / (n as f32).sqrt();
    for b in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for i in (0..n).step_by(2 * h) {
                for j in i..i + h {
                    let (u, w) = (b[j], b[j + h]);
                    b[j] = u + w;
                    b[j + h] = u - w;
                }
            }
            h *= 2;
        }
        b.iter_mut().for_each(|v| *v *= scale);
    }
}

impl Rows {
    /// The rotations a quantized page format takes, as llama.cpp's KV
    /// cache does (where the head dimension is a multiple of 64): queries
    /// and keys in runs of the largest power of two dividing it (the dot
    /// products are unchanged), values and the attention's output in runs
    /// of 64. (keys' run, values' run); None for halves.
    pub(crate) fn rotations(self, head_dim: usize) -> Option<(usize, usize)> {
        if self.0.ggml().is_none() || !head_dim.is_multiple_of(64) {
            return None;
        }
        let mut k = 64;
        while head_dim.is_multiple_of(2 * k) {
            k *= 2;
        }
        Some((k, 64))
    }

    /// The word where value `at` starts (at a block's start).
    pub(crate) fn word(self, at: usize) -> usize {
        (self.0.bytes(at) / 2) as usize
    }

    /// `out.len()` values from value `at` of `words`, as FP32.
    pub(crate) fn load(self, words: &[u16], at: usize, out: &mut [f32]) {
        let w = &words[self.word(at)..self.word(at + out.len())];
        match self.0.ggml() {
            None => bytemuck::cast_slice::<u16, f16>(w).convert_to_f32_slice(out),
            Some(ty) => m40_gguf::quant::dequantize(ty, bytemuck::cast_slice(w), out)
                .expect("whole blocks of a KV format"),
        }
    }

    /// Store `x` at value `at` of `words` (rounded to the format).
    pub(crate) fn store(self, words: &mut [u16], at: usize, x: &[f32]) {
        let w = &mut words[self.word(at)..self.word(at + x.len())];
        match self.0.ggml() {
            None => bytemuck::cast_slice_mut::<u16, f16>(w).convert_from_f32_slice(x),
            Some(ty) => m40_gguf::quant::quantize_fast(ty, x, bytemuck::cast_slice_mut(w))
                .expect("whole blocks of a KV format"),
        }
    }
}

/// The pool's pages in host memory.
pub(crate) struct HostPages {
    pool: Arc<PagePool>,
    layers: Vec<RwLock<LayerPages>>,
    kv_dim: usize,
    format: KvFormat,
    /// Tokens a page holds.
    page: usize,
}

impl HostPages {
    /// A pool of `pages` pages of `page` tokens for `n_layer` layers of
    /// `kv_dim` values a token in `format` (`kv_dim` a multiple of its
    /// block); nothing allocated until pages are used.
    pub(crate) fn new(
        n_layer: usize,
        kv_dim: usize,
        (pages, page): (usize, usize),
        format: KvFormat,
    ) -> HostPages {
        HostPages {
            pool: PagePool::new(pages, page),
            layers: (0..n_layer).map(|_| RwLock::default()).collect(),
            kv_dim,
            format,
            page,
        }
    }

    /// Where the row of `pos` starts, in a sequence of block table `pages`
    /// (a row of `kv_dim` values).
    pub(crate) fn row_at(&self, pages: &[u32], pos: usize) -> usize {
        let p = self.page;
        (pages[pos / p] as usize * p + pos % p) * self.kv_dim
    }

    /// How its values are read and written.
    pub(crate) fn rows(&self) -> Rows {
        Rows(self.format)
    }

    pub(crate) fn format(&self) -> KvFormat {
        self.format
    }

    pub(crate) fn pool(&self) -> &Arc<PagePool> {
        &self.pool
    }

    pub(crate) fn read(&self, layer: usize) -> RwLockReadGuard<'_, LayerPages> {
        self.layers[layer].read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn write(&self, layer: usize) -> RwLockWriteGuard<'_, LayerPages> {
        self.layers[layer]
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Memory for the pages `caches` hold (grown, never shrunk: a freed
    /// page is taken again); an error where the machine has too little.
    pub(crate) fn cover(&self, caches: &[&PagedCache]) -> Result<()> {
        let top = caches
            .iter()
            .flat_map(|c| c.pages().iter())
            .max()
            .map_or(0, |&p| p as usize + 1);
        let len = self.rows().word(top * self.page * self.kv_dim);
        for layer in 0..self.layers.len() {
            let mut l = self.write(layer);
            let LayerPages { k, v } = &mut *l;
            for a in [k, v] {
                if a.len() < len {
                    a.try_reserve(len - a.len())
                        .map_err(|_| self.no_room(top))?;
                    a.resize(len, 0);
                }
            }
        }
        Ok(())
    }

    /// Page `to` becomes a copy of page `from`, in every layer.
    pub(crate) fn copy_page(&self, from: u32, to: u32) {
        let n = self.rows().word(self.page * self.kv_dim);
        let (a, b) = (from as usize * n, to as usize * n);
        for layer in 0..self.layers.len() {
            let mut l = self.write(layer);
            l.k.copy_within(a..a + n, b);
            l.v.copy_within(a..a + n, b);
        }
    }

    fn no_room(&self, pages: usize) -> ModelError {
        let layout = crate::KvLayout {
            format: self.format,
            page_tokens: self.page,
            n_layer: self.layers.len(),
            kv_dim: self.kv_dim,
        };
        let bytes = layout.pool_bytes(pages);
        ModelError::HostMemory {
            what: format!("a KV cache of {} tokens", pages * self.page),
            need: human_bytes(bytes),
            available: crate::host::available_memory().map_or_else(|| "less".into(), human_bytes),
            hint: "use a smaller context or fewer parallel sequences".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{rotate, Rows, PAGE_TOKENS};
    use crate::cpu::{tiny_model, CpuBackend, CpuMath};
    use crate::{Backend, KvFormat, KvState, Logits, Model, ModelError};

    fn tiny(dir: &tempfile::TempDir) -> Arc<Model> {
        tiny_model(dir, 3)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Block tables a scheduler gives (`Backend::cache_on`): a sequence
    /// started on another's full pages, and one whose cached prefix ends
    /// inside a shared page (copied before its first write), compute what a
    /// cold sequence does, bitwise; the other sequence's rows stay as they
    /// were. In every page format.
    #[test]
    fn shared_and_copied_pages_give_a_cold_runs_logits() {
        for format in KvFormat::ALL {
            shared_and_copied_pages(format);
        }
    }

    fn shared_and_copied_pages(format: KvFormat) {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny(&dir);
        let nv = model.hparams().n_vocab;
        let cpu =
            CpuBackend::within(model, CpuMath::Exact, 16 * PAGE_TOKENS, format, None).unwrap();
        let tokens: Vec<u32> = (0..41).map(|i| ((i * 7 + 3) % nv) as u32).collect();
        let p = PAGE_TOKENS;
        let pages = |from: u32, n: usize| (from..from + n as u32).collect::<Vec<u32>>();
        let n = 41usize.div_ceil(p);
        let mut a = cpu.cache_on(pages(0, n), None, 0, 128).unwrap();
        let cold = cpu.forward(&mut a, &tokens[..40], Logits::All).unwrap();
        let a_pages = a.pages().to_vec();

        // b starts on a's first two pages.
        let mut table = a_pages[..2].to_vec();
        table.extend(pages(6, n - 2));
        let mut b = cpu.cache_on(table, None, 2 * p, 128).unwrap();
        let warm = cpu
            .forward(&mut b, &tokens[2 * p..40], Logits::All)
            .unwrap();
        assert_eq!(bits(&warm), bits(&cold[2 * p * nv..]));

        // c shares a's second page's first 4 tokens: a copy of its own.
        let mut table = vec![a_pages[0]];
        table.extend(pages(10, n - 1));
        let copy = Some((a_pages[1], 10));
        let mut c = cpu.cache_on(table, copy, p + 4, 128).unwrap();
        let again = cpu
            .forward(&mut c, &tokens[p + 4..40], Logits::All)
            .unwrap();
        assert_eq!(bits(&again), bits(&cold[(p + 4) * nv..]));

        // a's rows are intact: its next token is a cold run's.
        let next = cpu.forward(&mut a, &tokens[40..], Logits::Last).unwrap();
        drop((a, b, c));
        let mut d = cpu.new_cache(128).unwrap();
        let fresh = cpu.forward(&mut d, &tokens, Logits::Last).unwrap();
        assert_eq!(bits(&next), bits(&fresh));
        // Given pages are not the backend's to count: while its own cache
        // holds pages, it refuses them.
        assert!(cpu.cache_on(pages(0, 1), None, 0, 128).is_err());
        drop(d);
        let pool = cpu.kv.pool();
        assert_eq!(pool.free_pages(), pool.pages());
    }

    /// A step that needs more pages than the pool has free is an error
    /// that changes nothing; the sequence goes on once pages are freed.
    #[test]
    fn a_dry_pool_is_an_error_that_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = CpuBackend::with_kv(tiny(&dir), CpuMath::Exact, 3 * PAGE_TOKENS).unwrap();
        let mut hog = cpu.new_cache(64).unwrap();
        cpu.forward(&mut hog, &[1; PAGE_TOKENS + 1], Logits::None)
            .unwrap();
        let mut a = cpu.new_cache(64).unwrap();
        let e = cpu
            .forward(&mut a, &[2; 2 * PAGE_TOKENS], Logits::Last)
            .unwrap_err();
        assert!(matches!(e, ModelError::KvFull { .. }), "{e}");
        assert_eq!((a.len(), a.pages().len()), (0, 0));
        drop(hog);
        let logits = cpu
            .forward(&mut a, &[2; 2 * PAGE_TOKENS], Logits::Last)
            .unwrap();
        assert_eq!(logits.len(), cpu.hparams().n_vocab);
    }

    /// The rotation is orthonormal (dot products and norms kept) and its
    /// own inverse; the runs follow llama.cpp's (keys: the largest power of
    /// two dividing the head, values: 64), and halves take none.
    #[test]
    fn the_rotation_keeps_dot_products_and_undoes_itself() {
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let y: Vec<f32> = (0..256)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 5.0)
            .collect();
        for n in [64, 128, 256] {
            let (mut a, mut b) = (x.clone(), y.clone());
            rotate(&mut a, n);
            rotate(&mut b, n);
            let dot = |u: &[f32], w: &[f32]| u.iter().zip(w).map(|(p, q)| p * q).sum::<f32>();
            assert!(
                (dot(&a, &b) - dot(&x, &y)).abs() <= 1e-3 * dot(&x, &x).sqrt() * dot(&y, &y).sqrt()
            );
            assert_ne!(a, x);
            rotate(&mut a, n);
            assert!(
                a.iter()
                    .zip(&x)
                    .all(|(p, q)| (p - q).abs() <= 1e-4 * q.abs().max(1.0)),
                "{n}"
            );
        }
        assert_eq!(Rows(KvFormat::Q8_0).rotations(64), Some((64, 64)));
        assert_eq!(Rows(KvFormat::Q4_0).rotations(128), Some((128, 64)));
        assert_eq!(Rows(KvFormat::Q4_0).rotations(192), Some((64, 64)));
        assert_eq!(Rows(KvFormat::Q4_0).rotations(96), None);
        assert_eq!(Rows(KvFormat::F16).rotations(128), None);
    }

    /// A quantized pool: rows round-trip within the format's step (Q8_0:
    /// half a step of max/127; Q4_0: a step of max/8, as ggml's clamp of
    /// the end opposite the largest value costs one), it takes the
    /// bytes its layout says, and the logits stay near the halves' (a
    /// random tiny model; real-text perplexity is in BENCHMARKS.md).
    #[test]
    fn quantized_pages_round_trip_and_stay_near_halves() {
        let mut rng = 7u64;
        let x: Vec<f32> = (0..128)
            .map(|_| {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((rng >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
            })
            .collect();
        for (format, step) in [(KvFormat::Q8_0, 0.5 / 127.0), (KvFormat::Q4_0, 1.0 / 8.0)] {
            let rows = Rows(format);
            let mut words = vec![0xdead_u16; rows.word(256)];
            rows.store(&mut words, 128, &x);
            let mut back = vec![f32::NAN; 128];
            rows.load(&words, 128, &mut back);
            for (block, (a, b)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
                let max = a.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (u, w) in a.iter().zip(b) {
                    assert!(
                        (u - w).abs() <= max * step + 1e-3 * max,
                        "{format:?} block {block}: {u} -> {w}"
                    );
                }
            }
            assert!(
                words[..rows.word(128)].iter().all(|&w| w == 0xdead),
                "only its own words"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let model = tiny(&dir);
        let nv = model.hparams().n_vocab;
        let tokens: Vec<u32> = (0..40).map(|i| ((i * 11 + 5) % nv) as u32).collect();
        let logits = |format| {
            let cpu = CpuBackend::within(model.clone(), CpuMath::Exact, 64, format, None).unwrap();
            let mut c = cpu.new_cache(64).unwrap();
            let l = cpu.forward(&mut c, &tokens, Logits::All).unwrap();
            (l, cpu.memory().kv)
        };
        let (half, half_kv) = logits(KvFormat::F16);
        let scale = half.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (format, bound, ratio) in [
            (KvFormat::Q8_0, 0.02, 34.0 / 64.0),
            (KvFormat::Q4_0, 0.2, 18.0 / 64.0),
        ] {
            let (q, kv) = logits(format);
            let worst = half
                .iter()
                .zip(&q)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(worst <= bound * scale, "{format:?}: {worst} of {scale}");
            assert!(worst > 0.0, "{format:?} rounds");
            assert_eq!(kv as f64, half_kv as f64 * ratio, "{format:?} pool bytes");
        }
    }
}
