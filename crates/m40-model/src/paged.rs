//! The accounting of a paged KV cache, the same on every backend: a
//! [`PagePool`] knows which pages are free and how many holders each one
//! has (sequences, and the engine's prefix cache); a [`PagedCache`] (one
//! sequence) holds a list of pages, its block table, taken as it grows and
//! given back as it shrinks or drops. Where the pages' K and V live is the
//! backend's (the GPU's device pools, the CPU's host pages).
//!
//! Pages can be shared read-only ([`PagedCache::share_prefix`],
//! [`PagedCache::with_prefix`]: a common prompt prefix is computed once): a
//! sequence never writes into a page another one holds; where it would
//! ([`PagedCache::unshare_tail`]), it takes a copy of its own first.
//!
//! That accounting is for a backend's own caches ([`crate::Backend::new_cache`]).
//! A caller that keeps its own ledger (m40-sched's KV manager, the engine's
//! one owner of the pool) gives a step's block tables instead
//! ([`PagedCache::on_pages`]): such a cache takes and frees nothing.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{ModelError, Result};
use crate::KvState;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which pages of a KV pool are free, and how many hold each.
pub struct PagePool {
    state: Mutex<PageState>,
    n_pages: usize,
    page_tokens: usize,
}

struct PageState {
    /// Free pages, the next one to take last.
    free: Vec<u32>,
    /// Holders of each page (0: free).
    holders: Vec<u32>,
}

impl PagePool {
    /// `n_pages` pages of `page_tokens` tokens each.
    pub fn new(n_pages: usize, page_tokens: usize) -> Arc<PagePool> {
        assert!(page_tokens > 0, "a page holds at least one token");
        Arc::new(PagePool {
            state: Mutex::new(PageState {
                free: (0..n_pages as u32).rev().collect(),
                holders: vec![0; n_pages],
            }),
            n_pages,
            page_tokens,
        })
    }

    /// Pages in the pool.
    pub fn pages(&self) -> usize {
        self.n_pages
    }

    /// Tokens a page holds.
    pub fn page_tokens(&self) -> usize {
        self.page_tokens
    }

    /// Pages nothing holds.
    pub fn free_pages(&self) -> usize {
        lock(&self.state).free.len()
    }

    /// Holders of `page`.
    pub fn holders(&self, page: u32) -> u32 {
        lock(&self.state).holders[page as usize]
    }

    /// `n` free pages, each now held once: all of them, or
    /// [`ModelError::KvFull`] and none.
    pub fn allocate(&self, n: usize) -> Result<Vec<u32>> {
        let mut s = lock(&self.state);
        if s.free.len() < n {
            return Err(ModelError::KvFull {
                needed: n * self.page_tokens,
                free: s.free.len() * self.page_tokens,
                total: self.n_pages * self.page_tokens,
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
    /// shares them read-only, or a prefix cache).
    pub fn share(&self, pages: &[u32]) {
        let mut s = lock(&self.state);
        for &p in pages {
            assert!(s.holders[p as usize] > 0, "sharing free page {p}");
            s.holders[p as usize] += 1;
        }
    }

    /// One holder less for each of `pages`; a page nothing holds is free.
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
pub struct PagedCache {
    pages: Vec<u32>,
    len: usize,
    n_ctx: usize,
    pool: Arc<PagePool>,
    /// None: its pages are the pool accounting's (taken and freed here).
    /// Some: a caller's ledger gave them; the copy it says to make before
    /// the first write, until made.
    given: Option<Option<(u32, u32)>>,
}

impl PagedCache {
    /// An empty sequence of at most `n_ctx` tokens over `pool`.
    pub fn new(pool: Arc<PagePool>, n_ctx: usize) -> PagedCache {
        PagedCache {
            pages: Vec::new(),
            len: 0,
            n_ctx,
            pool,
            given: None,
        }
    }

    /// A sequence on the pool pages `pages` that a caller's ledger gave
    /// (see the module's documentation), its first `len` tokens computed;
    /// `copy` is made before the first write. Checked: every page in the
    /// pool, `len` within the pages and `n_ctx`, and no page of the pool
    /// held by the pool's own accounting (one ledger at a time).
    pub fn on_pages(
        pool: Arc<PagePool>,
        pages: Vec<u32>,
        copy: Option<(u32, u32)>,
        len: usize,
        n_ctx: usize,
    ) -> Result<PagedCache> {
        let n = pool.pages() as u32;
        let bad = |what: String| Err(ModelError::Unsupported(format!("a block table {what}")));
        if let Some(&p) = pages
            .iter()
            .chain(copy.iter().flat_map(|(a, b)| [a, b]))
            .find(|&&p| p >= n)
        {
            return bad(format!("with page {p} of a pool of {n}"));
        }
        if len > pages.len() * pool.page_tokens || len > n_ctx {
            return bad(format!(
                "of {} pages for {len} tokens in a context of {n_ctx}",
                pages.len()
            ));
        }
        if pool.free_pages() != pool.pages() {
            return bad("over a pool whose pages the backend's own caches hold".into());
        }
        Ok(PagedCache {
            pages,
            len,
            n_ctx,
            pool,
            given: Some(copy),
        })
    }

    /// A sequence that starts with the full pages `pages` of `pool`
    /// (computed by others, held by a prefix cache), holding them with
    /// them: its own tokens go to pages of its own.
    pub fn with_prefix(pool: Arc<PagePool>, pages: &[u32], n_ctx: usize) -> PagedCache {
        pool.share(pages);
        PagedCache {
            pages: pages.to_vec(),
            len: (pages.len() * pool.page_tokens).min(n_ctx),
            n_ctx,
            pool,
            given: None,
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
        let need = len.div_ceil(self.pool.page_tokens);
        if need > self.pages.len() && self.given.is_some() {
            return Err(ModelError::Unsupported(format!(
                "a step writing {len} tokens on a block table of {} pages",
                self.pages.len()
            )));
        }
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
    pub fn share_prefix(&self, tokens: usize, n_ctx: usize) -> PagedCache {
        let full = (tokens.min(self.len).min(n_ctx) / self.pool.page_tokens).min(self.pages.len());
        PagedCache::with_prefix(self.pool.clone(), &self.pages[..full], n_ctx)
    }

    /// Before tokens are written at `len`: where the page they start in
    /// is shared (a truncation into a shared prefix), hold a page of this
    /// sequence's own in its place instead. Returns (shared page, own
    /// page): the caller copies the first's rows to the second before the
    /// write.
    pub fn unshare_tail(&mut self) -> Result<Option<(u32, u32)>> {
        if let Some(copy) = &mut self.given {
            return Ok(copy.take());
        }
        let Some(i) = self.shared_tail() else {
            return Ok(None);
        };
        let old = self.pages[i];
        let new = self.pool.allocate(1)?[0];
        self.pages[i] = new;
        self.pool.release(&[old]);
        Ok(Some((old, new)))
    }

    /// The index of the page the next write lands in, where that page is
    /// shared and already holds tokens before it (so it must be copied).
    fn shared_tail(&self) -> Option<usize> {
        let p = self.pool.page_tokens;
        let i = self.len / p;
        (!self.len.is_multiple_of(p)
            && i < self.pages.len()
            && self.pool.holders(self.pages[i]) > 1)
            .then_some(i)
    }

    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.pages.len() * self.pool.page_tokens && len <= self.n_ctx);
        self.len = len;
    }

    fn release_from(&mut self, keep: usize) {
        if self.given.is_none() && self.pages.len() > keep {
            let gone: Vec<u32> = self.pages.drain(keep..).collect();
            self.pool.release(&gone);
        }
    }
}

impl Drop for PagedCache {
    fn drop(&mut self) {
        self.release_from(0);
    }
}

impl KvState for PagedCache {
    fn len(&self) -> usize {
        self.len
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
        self.release_from(self.len.div_ceil(self.pool.page_tokens));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_taken_shared_and_given_back() {
        let pool = PagePool::new(8, 32);
        let mut a = PagedCache::new(pool.clone(), 1000);
        a.extend_to(70).unwrap(); // 3 pages
        a.set_len(70);
        assert_eq!((pool.free_pages(), a.pages().len()), (5, 3));
        // All or nothing.
        let mut b = PagedCache::new(pool.clone(), 1000);
        let err = b.extend_to(6 * 32).unwrap_err();
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

    #[test]
    fn given_pages_are_used_as_given() {
        let pool = PagePool::new(8, 32);
        let mut c = PagedCache::on_pages(pool.clone(), vec![5, 2], Some((7, 2)), 40, 100).unwrap();
        assert_eq!((c.len(), c.pages()), (40, &[5, 2][..]));
        assert_eq!(c.unshare_tail().unwrap(), Some((7, 2)), "the copy, once");
        assert_eq!(c.unshare_tail().unwrap(), None);
        c.extend_to(64).unwrap();
        let e = c.extend_to(65).unwrap_err();
        assert!(e.to_string().contains("block table of 2 pages"), "{e}");
        c.truncate(10);
        drop(c);
        assert_eq!(pool.free_pages(), 8, "it took and freed nothing");
        // Checked: pages in the pool, tokens within them and the context,
        // and no page held by the pool's own accounting.
        let on = |pages: Vec<u32>, len| PagedCache::on_pages(pool.clone(), pages, None, len, 100);
        assert!(on(vec![8], 0).is_err());
        assert!(on(vec![1], 33).is_err());
        assert!(PagedCache::on_pages(pool.clone(), vec![1, 2, 3, 4], None, 101, 100).is_err());
        let mut own = PagedCache::new(pool.clone(), 100);
        own.extend_to(1).unwrap();
        assert!(on(vec![1], 0).is_err());
        drop(own);
        assert!(on(vec![1], 0).is_ok());
    }
}
