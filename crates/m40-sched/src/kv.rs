//! The KV ledger: which pages of the pool are free, which sequence holds
//! which (its block table), which full pages the prefix cache keeps, and
//! the copy a sequence makes before it first writes into a page it shares.
//! One owner for all of it ([`KvManager`]); the scheduler drives it and a
//! backend only executes what a step's plan says ([`SeqKv`]).
//!
//! Holders: every page counts the block tables that list it, plus one
//! while the prefix cache keeps it. A cached page no sequence uses is held
//! by the cache alone, so evicting it frees it: the manager frees pages
//! that way, least recently used first, only when an allocation finds too
//! few free ones.

use crate::prefix::{PageKey, PrefixCache};

/// What a step's plan says of one sequence's KV pages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqKv {
    /// Its block table: the pool pages of its tokens, in order, every one
    /// the step writes included.
    pub pages: Vec<u32>,
    /// Copy page `.0` to page `.1` (every layer's K and V) before the step
    /// writes: `.1` is in `pages` where the prefix cache's page `.0` was,
    /// whose first tokens the sequence shares.
    pub copy: Option<(u32, u32)>,
}

/// A sequence's share of the ledger (kept in the scheduler's entry for it).
#[derive(Debug, Default)]
pub(crate) struct Blocks {
    pub(crate) kv: SeqKv,
    /// Prefix-cache pages it uses (each counted once by the cache's users):
    /// those it started with, those it cached itself, and a copy's source
    /// until the copy is made.
    uses: Vec<u32>,
    /// Caching its own full pages: the key of the last one the cache has
    /// seen and how many (None: it takes no part, or a key collision ended
    /// its chain).
    chain: Option<(Option<PageKey>, usize)>,
}

impl Blocks {
    /// Cache none of its pages from now on (its tokens are not all known).
    pub(crate) fn stop_caching(&mut self) {
        self.chain = None;
    }
}

/// What [`KvManager::lookup`] finds cached for a sequence's tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Found {
    /// Whole cached pages it starts with.
    pub(crate) whole: usize,
    /// Tokens shared with the cached page after them (0: none).
    pub(crate) part: usize,
    /// Of the whole pages, those no sequence uses now (using them takes
    /// them out of what eviction can free).
    pub(crate) whole_unused: usize,
    /// Whether the partly shared page is unused now.
    pub(crate) part_unused: bool,
}

/// The pool's pages, their holders and the prefix cache.
pub struct KvManager {
    page_tokens: usize,
    holders: Vec<u32>,
    /// Free pages, the next one to take last.
    free: Vec<u32>,
    prefix: Option<PrefixCache>,
    hits: u64,
    saved: u64,
}

impl KvManager {
    /// A pool of `pages` pages of `page_tokens` tokens, with a prefix cache
    /// or without.
    pub fn new(pages: usize, page_tokens: usize, prefix_cache: bool) -> KvManager {
        KvManager {
            page_tokens,
            holders: vec![0; pages],
            free: (0..pages as u32).rev().collect(),
            prefix: prefix_cache.then(PrefixCache::new),
            hits: 0,
            saved: 0,
        }
    }

    pub(crate) fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_tokens)
    }

    /// Pages in the pool.
    pub fn pages(&self) -> usize {
        self.holders.len()
    }

    /// Pages nothing holds.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// Cached pages no sequence uses (an allocation may evict them).
    pub fn evictable(&self) -> usize {
        self.prefix.as_ref().map_or(0, PrefixCache::evictable)
    }

    /// Pages an allocation can have: free ones and evictable ones.
    pub fn available(&self) -> usize {
        self.free() + self.evictable()
    }

    /// Pages the prefix cache keeps (used by a sequence or not).
    pub fn cached(&self) -> usize {
        self.prefix.as_ref().map_or(0, PrefixCache::len)
    }

    /// Sequences that started with cached pages, and the tokens those
    /// pages held (not computed again).
    pub fn prefix_hits(&self) -> (u64, u64) {
        (self.hits, self.saved)
    }

    /// Holders of `page` (block tables, and the cache).
    pub fn holders(&self, page: u32) -> u32 {
        self.holders[page as usize]
    }

    /// What is cached of `tokens` now, taking nothing.
    pub(crate) fn lookup(&self, tokens: &[u32]) -> Found {
        let Some(pc) = &self.prefix else {
            return Found::default();
        };
        let look = pc.peek_pages(tokens, self.page_tokens);
        let held = |p: u32| self.holders[p as usize] == 1;
        Found {
            whole: look.whole.len(),
            part: look.part.map_or(0, |(_, n)| n),
            whole_unused: look.whole.iter().filter(|&&p| held(p)).count(),
            part_unused: look.part.is_some_and(|(p, _)| held(p)),
        }
    }

    /// `n` pages, each held once: free ones, then evicted ones (least
    /// recently used first); none when too few are available.
    fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.available() {
            return None;
        }
        if self.free.len() < n {
            let pc = self.prefix.as_mut().expect("evictable pages are cached");
            let gone = pc.evict(n - self.free.len());
            self.release_pages(&gone);
        }
        let at = self.free.len() - n;
        let pages: Vec<u32> = self.free.drain(at..).collect();
        for &p in &pages {
            debug_assert_eq!(self.holders[p as usize], 0);
            self.holders[p as usize] = 1;
        }
        Some(pages)
    }

    fn release_pages(&mut self, pages: &[u32]) {
        for &p in pages {
            let h = &mut self.holders[p as usize];
            assert!(*h > 0, "releasing free page {p}");
            *h -= 1;
            if *h == 0 {
                self.free.push(p);
            }
        }
    }

    /// A new table for a sequence whose first tokens `prompt` are (the
    /// prefix cache's, where `cached`): it starts with the `found.whole`
    /// cached pages, and with a copy of the partly shared one where
    /// `with_part`, then pages of its own to `tokens` tokens. All or
    /// nothing: false when too few pages are available.
    pub(crate) fn admit(
        &mut self,
        b: &mut Blocks,
        prompt: &[u32],
        tokens: usize,
        found: Found,
        with_part: bool,
        cached: bool,
    ) -> bool {
        debug_assert!(b.kv.pages.is_empty() && b.uses.is_empty());
        let pinned = found.whole_unused + usize::from(with_part && found.part_unused);
        let own = self.pages_for(tokens) - found.whole;
        if own + pinned > self.available() {
            return false;
        }
        let mut start = 0;
        if let Some(pc) = self
            .prefix
            .as_mut()
            .filter(|_| found.whole > 0 || with_part)
        {
            let got = pc.acquire(prompt, self.page_tokens, with_part);
            debug_assert_eq!(got.pages.len(), found.whole, "the pages lookup found");
            for &p in got.pages.iter().chain(&got.part) {
                self.holders[p as usize] += 1;
            }
            start = got.pages.len() * self.page_tokens + usize::from(with_part) * found.part;
            b.kv.pages = got.pages;
            b.uses = b.kv.pages.clone();
            b.uses.extend(got.part);
            b.kv.copy = got.part.map(|p| (p, 0));
            b.chain = cached.then_some((got.key, found.whole));
        } else {
            b.chain = cached.then_some((None, 0));
        }
        let mine = self.alloc(own).expect("checked available");
        if let Some((_, to)) = &mut b.kv.copy {
            *to = mine[0];
        }
        b.kv.pages.extend(mine);
        if start > 0 {
            self.hits += 1;
            self.saved += start as u64;
        }
        true
    }

    /// Pages so that the table holds `tokens` tokens; false (nothing taken)
    /// when too few are available.
    pub(crate) fn grow(&mut self, b: &mut Blocks, tokens: usize) -> bool {
        let more = self.pages_for(tokens).saturating_sub(b.kv.pages.len());
        if more == 0 {
            return true;
        }
        match self.alloc(more) {
            Some(p) => {
                b.kv.pages.extend(p);
                true
            }
            None => false,
        }
    }

    /// After a step ran on `b`: its copy is made (the source goes back),
    /// and the full pages of its first `computed` tokens (`tokens`) that
    /// the cache has not seen are cached.
    pub(crate) fn ran(&mut self, b: &mut Blocks, tokens: &[u32], computed: usize) {
        if let Some((from, _)) = b.kv.copy.take() {
            let at = b.uses.iter().rposition(|&p| p == from).expect("a use");
            b.uses.remove(at);
            if let Some(pc) = &mut self.prefix {
                pc.release(&[from]);
            }
            self.release_pages(&[from]);
        }
        let (Some(pc), p) = (&mut self.prefix, self.page_tokens) else {
            return;
        };
        let full = computed / p;
        while let Some((key, n)) = b.chain {
            if n >= full {
                break;
            }
            let page = b.kv.pages[n];
            let (k, dup) = pc.insert(key, &tokens[n * p..(n + 1) * p], page);
            if dup.is_none() {
                if !pc.holds(page) {
                    // A key collision: this sequence caches no more.
                    b.chain = None;
                    break;
                }
                self.holders[page as usize] += 1;
                b.uses.push(page);
            }
            b.chain = Some((Some(k), n + 1));
        }
    }

    /// The sequence leaves (or is preempted): its pages go back; cached
    /// ones stay cached, unused by it.
    pub(crate) fn release(&mut self, b: &mut Blocks) {
        if let Some(pc) = &mut self.prefix {
            pc.release(&b.uses);
        }
        let mut pages = std::mem::take(&mut b.kv.pages);
        if let Some((from, to)) = b.kv.copy.take() {
            // The copy was never made: its source is held as well.
            debug_assert!(pages.contains(&to));
            pages.push(from);
        }
        self.release_pages(&pages);
        b.uses.clear();
        b.chain = b.chain.map(|_| (None, 0));
    }

    /// Every page is free, held by tables or cached, and the counts agree:
    /// what the tests check after every step.
    #[cfg(test)]
    pub(crate) fn check(&self, tables: &[&Blocks]) {
        let mut count = vec![0u32; self.pages()];
        for b in tables {
            for &p in b.kv.pages.iter().chain(b.kv.copy.as_ref().map(|c| &c.0)) {
                count[p as usize] += 1;
            }
        }
        if let Some(pc) = &self.prefix {
            for p in 0..self.pages() as u32 {
                count[p as usize] += u32::from(pc.holds(p));
            }
        }
        assert_eq!(count, self.holders, "holders");
        let free = self.holders.iter().filter(|&&h| h == 0).count();
        assert_eq!(free, self.free.len(), "free pages");
    }
}

#[cfg(test)]
mod tests;
