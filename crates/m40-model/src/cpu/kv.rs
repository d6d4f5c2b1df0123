//! The CPU's KV cache: pages of [`PAGE_TOKENS`] tokens, as on the GPU, so
//! that sequences share the pages of a common prefix (the engine's prefix
//! cache). Per layer one FP16 array for K and one for V hold every page
//! of the pool used so far, each page's rows together; the arrays grow as
//! pages are first taken. Which sequence holds which page is
//! [`crate::paged`]'s accounting.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use half::f16;

use crate::error::{ModelError, Result};
use crate::host::human_bytes;
use crate::paged::{PagePool, PagedCache};

/// Tokens a page of the CPU's KV cache holds. Smaller than the GPU's 32
/// (whose attention kernels read a page per warp step): on the CPU a
/// page's size costs nothing in attention, and a finer page lets the
/// prefix cache reuse more of a prompt (BENCHMARKS.md: 8 clients of the
/// load example, 2.5x one client's tokens with pages of 16, 2.8x with 8).
pub const PAGE_TOKENS: usize = 8;

/// The K and V rows of every page of one layer: page p's row of the
/// token at offset i in it starts at (p * PAGE_TOKENS + i) * kv_dim.
#[derive(Default)]
pub(crate) struct LayerPages {
    pub(crate) k: Vec<f16>,
    pub(crate) v: Vec<f16>,
}

/// Where the row of `pos` starts, in a sequence of block table `pages`,
/// rows of `kv_dim` values.
pub(crate) fn row_at(pages: &[u32], pos: usize, kv_dim: usize) -> usize {
    (pages[pos / PAGE_TOKENS] as usize * PAGE_TOKENS + pos % PAGE_TOKENS) * kv_dim
}

/// The pool's pages in host memory.
pub(crate) struct HostPages {
    pool: Arc<PagePool>,
    layers: Vec<RwLock<LayerPages>>,
    kv_dim: usize,
}

impl HostPages {
    /// A pool of `pages` pages for `n_layer` layers of `kv_dim` values a
    /// token; nothing allocated until pages are used.
    pub(crate) fn new(n_layer: usize, kv_dim: usize, pages: usize) -> HostPages {
        HostPages {
            pool: PagePool::new(pages, PAGE_TOKENS),
            layers: (0..n_layer).map(|_| RwLock::default()).collect(),
            kv_dim,
        }
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
        let len = top * PAGE_TOKENS * self.kv_dim;
        for layer in 0..self.layers.len() {
            let mut l = self.write(layer);
            let LayerPages { k, v } = &mut *l;
            for a in [k, v] {
                if a.len() < len {
                    a.try_reserve(len - a.len())
                        .map_err(|_| self.no_room(top))?;
                    a.resize(len, f16::ZERO);
                }
            }
        }
        Ok(())
    }

    /// Page `to` becomes a copy of page `from`, in every layer.
    pub(crate) fn copy_page(&self, from: u32, to: u32) {
        let n = PAGE_TOKENS * self.kv_dim;
        let (a, b) = (from as usize * n, to as usize * n);
        for layer in 0..self.layers.len() {
            let mut l = self.write(layer);
            l.k.copy_within(a..a + n, b);
            l.v.copy_within(a..a + n, b);
        }
    }

    fn no_room(&self, pages: usize) -> ModelError {
        let layout = crate::KvLayout {
            format: crate::KvFormat::F16,
            page_tokens: PAGE_TOKENS,
            n_layer: self.layers.len(),
            kv_dim: self.kv_dim,
        };
        let bytes = layout.pool_bytes(pages);
        ModelError::HostMemory {
            what: format!("a KV cache of {} tokens", pages * PAGE_TOKENS),
            need: human_bytes(bytes),
            available: crate::host::available_memory().map_or_else(|| "less".into(), human_bytes),
            hint: "use a smaller context or fewer parallel sequences".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::PAGE_TOKENS;
    use crate::cpu::{tiny_model, CpuBackend, CpuMath};
    use crate::{Backend, KvState, Logits, Model, ModelError};

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
    /// were.
    #[test]
    fn shared_and_copied_pages_give_a_cold_runs_logits() {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny(&dir);
        let nv = model.hparams().n_vocab;
        let cpu = CpuBackend::with_kv(model, CpuMath::Exact, 16 * PAGE_TOKENS).unwrap();
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
}
