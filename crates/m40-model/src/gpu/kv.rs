//! The paged KV cache: one pool of pages per layer for K and one for V
//! (FP16, KV_PAGE tokens a page, the layout of kernels/attention.cu), and
//! the accounting of those pages over sequences.
//!
//! A [`PagePool`] knows which pages are free and how many sequences hold
//! each one; a [`GpuCache`] (one sequence) holds a list of pages, its block
//! table, taken as it grows and given back as it shrinks or drops. Pages
//! can be shared read-only ([`GpuCache::share_prefix`]: a common prompt
//! prefix is computed once): a sequence never writes into a page another
//! one holds; where it would ([`GpuCache::unshare_tail`]), it takes a copy
//! of its own first.

use std::sync::{Arc, Mutex};

use m40_device::{DeviceBuffer, Stream};
use m40_kernels::KV_PAGE;

use crate::error::{ModelError, Result};
use crate::KvState;

use super::lock;

/// Which pages of a KV pool are free, and how many sequences hold each.
pub struct PagePool {
    state: Mutex<PageState>,
    n_pages: usize,
}

struct PageState {
    /// Free pages, the next one to take last.
    free: Vec<u32>,
    /// Holders of each page (0: free).
    holders: Vec<u32>,
}

impl PagePool {
    pub fn new(n_pages: usize) -> Arc<PagePool> {
        Arc::new(PagePool {
            state: Mutex::new(PageState {
                free: (0..n_pages as u32).rev().collect(),
                holders: vec![0; n_pages],
            }),
            n_pages,
        })
    }

    /// Pages in the pool.
    pub fn pages(&self) -> usize {
        self.n_pages
    }

    /// Pages no sequence holds.
    pub fn free_pages(&self) -> usize {
        lock(&self.state).free.len()
    }

    /// Sequences holding `page`.
    pub fn holders(&self, page: u32) -> u32 {
        lock(&self.state).holders[page as usize]
    }

    /// `n` free pages, each now held once: all of them, or
    /// [`ModelError::KvFull`] and none.
    pub fn allocate(&self, n: usize) -> Result<Vec<u32>> {
        let mut s = lock(&self.state);
        if s.free.len() < n {
            return Err(ModelError::KvFull {
                needed: n * KV_PAGE,
                free: s.free.len() * KV_PAGE,
                total: self.n_pages * KV_PAGE,
            });
        }
        let at = s.free.len() - n;
        let pages: Vec<u32> = s.free.drain(at..).collect();
        for &p in &pages {
            s.holders[p as usize] = 1;
        }
        Ok(pages)
    }

    /// One more holder for each of `pages` (held already: a sequence that
    /// shares them read-only).
    pub fn share(&self, pages: &[u32]) {
        let mut s = lock(&self.state);
        for &p in pages {
            assert!(s.holders[p as usize] > 0, "sharing free page {p}");
            s.holders[p as usize] += 1;
        }
    }

    /// One holder less for each of `pages`; a page nobody holds is free.
    pub fn release(&self, pages: &[u32]) {
        let mut s = lock(&self.state);
        for &p in pages {
            let h = &mut s.holders[p as usize];
            assert!(*h > 0, "releasing free page {p}");
            *h -= 1;
            if *h == 0 {
                s.free.push(p);
            }
        }
    }
}

/// A sequence's KV cache: its pages of the backend's pool, in order.
pub struct GpuCache {
    pages: Vec<u32>,
    len: usize,
    n_ctx: usize,
    pool: Arc<PagePool>,
}

impl GpuCache {
    /// An empty sequence of at most `n_ctx` tokens over `pool`.
    pub fn new(pool: Arc<PagePool>, n_ctx: usize) -> GpuCache {
        GpuCache {
            pages: Vec::new(),
            len: 0,
            n_ctx,
            pool,
        }
    }

    /// A sequence that starts with the full pages `pages` of `pool`
    /// (computed by others, held by a prefix cache), holding them with
    /// them: its own tokens go to pages of its own.
    pub fn with_prefix(pool: Arc<PagePool>, pages: &[u32], n_ctx: usize) -> GpuCache {
        pool.share(pages);
        GpuCache {
            pages: pages.to_vec(),
            len: (pages.len() * KV_PAGE).min(n_ctx),
            n_ctx,
            pool,
        }
    }

    /// Pages held (the block table).
    pub fn pages(&self) -> &[u32] {
        &self.pages
    }

    /// Whether `pool` is this cache's.
    pub(crate) fn is_of(&self, pool: &Arc<PagePool>) -> bool {
        Arc::ptr_eq(&self.pool, pool)
    }

    /// Take pages so that the cache holds `len` tokens (all or none).
    pub fn extend_to(&mut self, len: usize) -> Result<()> {
        let need = len.div_ceil(KV_PAGE);
        if need > self.pages.len() {
            let more = self.pool.allocate(need - self.pages.len())?;
            self.pages.extend(more);
        }
        Ok(())
    }

    /// A new sequence (of at most `n_ctx` tokens) that starts with this
    /// one's first `tokens` tokens, rounded down to whole pages, holding
    /// those pages with it: the prefix is not computed again, and the new
    /// sequence's own tokens go to pages of its own.
    pub fn share_prefix(&self, tokens: usize, n_ctx: usize) -> GpuCache {
        let full = (tokens.min(self.len).min(n_ctx) / KV_PAGE).min(self.pages.len());
        GpuCache::with_prefix(self.pool.clone(), &self.pages[..full], n_ctx)
    }

    /// Before tokens are written at `len`: where the page they start in
    /// is shared (a truncation into a shared prefix), hold a page of this
    /// sequence's own in its place instead. Returns (shared page, own
    /// page): the caller copies the first's rows to the second before the
    /// write.
    pub fn unshare_tail(&mut self) -> Result<Option<(u32, u32)>> {
        let i = self.len / KV_PAGE;
        if !self.len.is_multiple_of(KV_PAGE) && i < self.pages.len() {
            let old = self.pages[i];
            if self.pool.holders(old) > 1 {
                let new = self.pool.allocate(1)?[0];
                self.pages[i] = new;
                self.pool.release(&[old]);
                return Ok(Some((old, new)));
            }
        }
        Ok(None)
    }

    pub(super) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.pages.len() * KV_PAGE && len <= self.n_ctx);
        self.len = len;
    }

    fn release_from(&mut self, keep: usize) {
        if self.pages.len() > keep {
            let gone: Vec<u32> = self.pages.drain(keep..).collect();
            self.pool.release(&gone);
        }
    }
}

impl Drop for GpuCache {
    fn drop(&mut self) {
        self.release_from(0);
    }
}

impl KvState for GpuCache {
    fn len(&self) -> usize {
        self.len
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
        self.release_from(self.len.div_ceil(KV_PAGE));
    }
    fn pool_pages(&self) -> &[u32] {
        &self.pages
    }
}

/// The K and V pages of every layer on the device.
pub(super) struct Pools {
    pub(super) k: Vec<DeviceBuffer<u16>>,
    pub(super) v: Vec<DeviceBuffer<u16>>,
    /// FP16 values per page of one layer's K (or V).
    page_len: usize,
}

impl Pools {
    /// `n_pages` pages for `n_layer` layers of `kv_dim` values a token.
    pub(super) fn new(
        stream: &Stream,
        n_layer: usize,
        n_pages: usize,
        kv_dim: usize,
    ) -> Result<Pools> {
        let page_len = KV_PAGE * kv_dim;
        let pool = |what: &str| -> Result<Vec<DeviceBuffer<u16>>> {
            (0..n_layer)
                .map(|_| Ok(stream.alloc::<u16>(n_pages * page_len, what)?))
                .collect()
        };
        Ok(Pools {
            k: pool("KV cache (K)")?,
            v: pool("KV cache (V)")?,
            page_len,
        })
    }

    /// Copy page `from` to page `to` in every layer (stream-ordered).
    pub(super) fn copy_page(&mut self, stream: &Stream, from: u32, to: u32) -> Result<()> {
        let (n, a, b) = (self.page_len, from as usize, to as usize);
        for pool in self.k.iter_mut().chain(self.v.iter_mut()) {
            stream.copy_device_within(pool, a * n..(a + 1) * n, b * n)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_taken_shared_and_given_back() {
        let pool = PagePool::new(8);
        let mut a = GpuCache::new(pool.clone(), 1000);
        a.extend_to(70).unwrap(); // 3 pages
        a.set_len(70);
        assert_eq!((pool.free_pages(), a.pages().len()), (5, 3));
        // All or nothing.
        let mut b = GpuCache::new(pool.clone(), 1000);
        let err = b.extend_to(6 * KV_PAGE).unwrap_err();
        assert!(matches!(err, ModelError::KvFull { .. }), "{err}");
        assert_eq!((pool.free_pages(), b.pages().len()), (5, 0));

        // A prefix of 70 tokens shares its 2 full pages.
        let mut c = a.share_prefix(70, 500);
        assert_eq!((c.len(), c.pages()), (64, &a.pages()[..2]));
        assert!(a.pages()[..2].iter().all(|&p| pool.holders(p) == 2));
        assert_eq!(pool.holders(a.pages()[2]), 1);
        assert_eq!(c.unshare_tail().unwrap(), None, "at a page boundary");
        c.extend_to(100).unwrap();
        c.set_len(100);
        assert_eq!(pool.free_pages(), 3);

        // Truncated into a shared page, the tail page is copied first.
        c.truncate(40);
        assert_eq!(c.pages().len(), 2);
        assert_eq!(pool.free_pages(), 5);
        let shared = c.pages()[1];
        let (old, new) = c.unshare_tail().unwrap().expect("page 1 is shared");
        assert_eq!((old, c.pages()[1]), (shared, new));
        assert_eq!((pool.holders(old), pool.holders(new)), (1, 1));
        assert_eq!(c.unshare_tail().unwrap(), None, "now its own");

        // Dropping gives back what only it held.
        drop(a);
        assert_eq!(pool.holders(c.pages()[0]), 1);
        assert_eq!(pool.free_pages(), 6);
        drop(c);
        assert_eq!(pool.free_pages(), 8);
        // Pages come back whole: 8 allocate again.
        assert_eq!(pool.allocate(8).unwrap().len(), 8);
    }
}
