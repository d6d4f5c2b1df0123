//! Prefix caching: full KV pages keyed by their tokens and everything
//! before them, so that a request that starts as an earlier one did (a chat
//! resending its history, agents sharing a system prompt) reuses the pages
//! instead of computing them again.
//!
//! A page's key chains the previous page's key with the page's tokens. The
//! cache also keeps the tokens, and a lookup compares them, so two prefixes
//! whose keys collide are never confused. Pages in use count their users;
//! a page no sequence uses stays cached until the pool needs it back, least
//! recently used first out.
//!
//! After the whole pages, a request also takes the cached page that follows
//! them whose first tokens match its next ones the longest (a partial page:
//! a shared system prompt rarely ends at a page's end). Its cache starts in
//! that page, which the backend copies before the first write into it.

use std::collections::{BTreeMap, HashMap};

/// A full page's key (see the module's documentation).
pub type PageKey = u64;

/// The key of a full page holding `tokens` after the page keyed `prev`
/// (None: a sequence's first page). FNV-1a over `prev` and the tokens:
/// the same on every run and machine.
pub fn page_key(prev: Option<PageKey>, tokens: &[u32]) -> PageKey {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= b as u64;
            h = h.wrapping_mul(PRIME);
        }
    };
    match prev {
        Some(p) => eat(&p.to_le_bytes()),
        None => eat(&[0xFF; 9]),
    }
    for t in tokens {
        eat(&t.to_le_bytes());
    }
    h
}

struct Entry {
    page: u32,
    prev: Option<PageKey>,
    tokens: Vec<u32>,
    users: u32,
    /// When it was last used (acquired or released).
    stamp: u64,
}

/// A cached prefix of a request's tokens ([`PrefixCache::acquire`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CachedPrefix {
    /// Its whole pages, each now used once more.
    pub pages: Vec<u32>,
    /// The cached page after them that shares its first tokens, if asked
    /// for: used by the request until it has copied it (it writes into the
    /// copy), then released ([`PrefixCache::release`]).
    pub part: Option<u32>,
    /// The key of the last whole page (the sequence chains the pages it
    /// fills next from it).
    pub key: Option<PageKey>,
    /// The tokens it holds: the whole pages', then the partial page's
    /// first ones.
    pub tokens: usize,
}

/// What [`PrefixCache::peek_pages`] finds.
pub(crate) struct Peeked {
    pub(crate) whole: Vec<u32>,
    pub(crate) part: Option<(u32, usize)>,
}

/// Cached pages by key, their users, and the unused ones in order of last
/// use.
#[derive(Default)]
pub struct PrefixCache {
    by_key: HashMap<PageKey, Entry>,
    by_page: HashMap<u32, PageKey>,
    /// The cached pages that follow each key (None: first pages).
    next: HashMap<Option<PageKey>, Vec<PageKey>>,
    /// Unused pages by the stamp of their last use (the oldest first).
    unused: BTreeMap<u64, PageKey>,
    clock: u64,
}

impl PrefixCache {
    pub fn new() -> PrefixCache {
        PrefixCache::default()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The cached entry for the page after `prev` holding `tokens`.
    fn find(&self, prev: Option<PageKey>, tokens: &[u32]) -> Option<PageKey> {
        let key = page_key(prev, tokens);
        self.by_key
            .get(&key)
            .filter(|e| e.prev == prev && e.tokens == tokens)
            .map(|_| key)
    }

    /// The longest cached prefix of `tokens` (pages of `page_tokens`): the
    /// whole pages that match, each now used once more, then, where
    /// `with_part`, the cached page after them that shares the most of the
    /// next tokens (at least one), used once more too until the request has
    /// copied it ([`CachedPrefix::part`]).
    pub fn acquire(&mut self, tokens: &[u32], page_tokens: usize, with_part: bool) -> CachedPrefix {
        let (whole, part) = self.lookup(tokens, page_tokens);
        let part = part.filter(|_| with_part);
        CachedPrefix {
            key: whole.last().copied(),
            tokens: whole.len() * page_tokens + part.map_or(0, |(_, n)| n),
            pages: whole.into_iter().map(|key| self.take(key)).collect(),
            part: part.map(|(key, _)| self.take(key)),
        }
    }

    /// The tokens [`PrefixCache::acquire`] would find cached now, taking
    /// nothing.
    pub fn peek(&self, tokens: &[u32], page_tokens: usize) -> usize {
        let (whole, part) = self.lookup(tokens, page_tokens);
        whole.len() * page_tokens + part.map_or(0, |(_, n)| n)
    }

    /// [`PrefixCache::peek`]'s pages: the whole ones, and the partly
    /// shared one with the tokens it shares.
    pub(crate) fn peek_pages(&self, tokens: &[u32], page_tokens: usize) -> Peeked {
        let (whole, part) = self.lookup(tokens, page_tokens);
        Peeked {
            whole: whole.iter().map(|k| self.by_key[k].page).collect(),
            part: part.map(|(k, n)| (self.by_key[&k].page, n)),
        }
    }

    /// The keys of the whole cached pages `tokens` starts with, and the
    /// cached page after them sharing the most of its next tokens (with
    /// how many, at least one).
    fn lookup(
        &self,
        tokens: &[u32],
        page_tokens: usize,
    ) -> (Vec<PageKey>, Option<(PageKey, usize)>) {
        let mut whole: Vec<PageKey> = Vec::new();
        for chunk in tokens.chunks_exact(page_tokens) {
            let Some(key) = self.find(whole.last().copied(), chunk) else {
                break;
            };
            whole.push(key);
        }
        let rest = &tokens[whole.len() * page_tokens..];
        let shared = |e: &Entry| {
            e.tokens
                .iter()
                .zip(rest)
                .take_while(|(a, b)| a == b)
                .count()
        };
        let part = self.next.get(&whole.last().copied()).and_then(|keys| {
            keys.iter()
                .map(|k| (shared(&self.by_key[k]), *k))
                .max_by_key(|&(n, k)| (n, std::cmp::Reverse(k)))
        });
        let part = part.filter(|&(n, _)| n > 0).map(|(n, k)| (k, n));
        (whole, part)
    }

    /// `key`'s page, now the most recently used (unused ones are evicted
    /// least recently used first).
    fn touch(&mut self, key: PageKey) -> u32 {
        let stamp = self.tick();
        let e = self.by_key.get_mut(&key).expect("cached");
        if e.users == 0 {
            self.unused.remove(&e.stamp);
            self.unused.insert(stamp, key);
        }
        e.stamp = stamp;
        e.page
    }

    /// One more user of the cached page `key`; its page.
    fn take(&mut self, key: PageKey) -> u32 {
        let page = self.touch(key);
        let e = self.by_key.get_mut(&key).expect("cached");
        if e.users == 0 {
            self.unused.remove(&e.stamp);
        }
        e.users += 1;
        page
    }

    /// A sequence filled `page` with `tokens` after the page keyed `prev`:
    /// cache it, used by that sequence. Returns its key, and the page
    /// already cached for the same tokens when another sequence got there
    /// first. `page` is cached only when neither that nor a (vanishingly
    /// unlikely) key collision kept it out: [`PrefixCache::holds`] says;
    /// [`PrefixCache::release`] hands it back uncached otherwise.
    pub fn insert(
        &mut self,
        prev: Option<PageKey>,
        tokens: &[u32],
        page: u32,
    ) -> (PageKey, Option<u32>) {
        let key = page_key(prev, tokens);
        if let Some(e) = self.by_key.get(&key) {
            // The same tokens (or, never in practice, a colliding key: then
            // the page stays uncached).
            let same = e.prev == prev && e.tokens == tokens;
            return (key, same.then_some(e.page));
        }
        assert!(
            !self.by_page.contains_key(&page),
            "page {page} is cached already"
        );
        let stamp = self.tick();
        self.by_key.insert(
            key,
            Entry {
                page,
                prev,
                tokens: tokens.to_vec(),
                users: 1,
                stamp,
            },
        );
        self.by_page.insert(page, key);
        self.next.entry(prev).or_default().push(key);
        (key, None)
    }

    /// Whether `page` is cached (then [`PrefixCache::release`] takes it
    /// back; the caller frees only pages that are not).
    pub fn holds(&self, page: u32) -> bool {
        self.by_page.contains_key(&page)
    }

    /// A sequence stops using `pages` (its pages in order: it ended or was
    /// preempted). Cached ones stay cached; those no sequence uses now can
    /// be evicted, a sequence's last pages before its first (a prefix's
    /// head serves every longer one). Returns the pages that are not cached
    /// (the caller frees them).
    pub fn release(&mut self, pages: &[u32]) -> Vec<u32> {
        let mut uncached = Vec::new();
        for &page in pages.iter().rev() {
            let Some(&key) = self.by_page.get(&page) else {
                uncached.push(page);
                continue;
            };
            let stamp = self.tick();
            let e = self.by_key.get_mut(&key).expect("by_page and by_key agree");
            assert!(e.users > 0, "releasing unused page {page}");
            e.users -= 1;
            e.stamp = stamp;
            if e.users == 0 {
                self.unused.insert(stamp, key);
            }
        }
        uncached
    }

    /// Cached pages no sequence uses (the pool can take them back).
    pub fn evictable(&self) -> usize {
        self.unused.len()
    }

    /// Cached pages in all.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Take back up to `n` unused pages, the least recently used first:
    /// they leave the cache.
    pub fn evict(&mut self, n: usize) -> Vec<u32> {
        let mut out = Vec::new();
        while out.len() < n {
            let Some((_, key)) = self.unused.pop_first() else {
                break;
            };
            let e = self.by_key.remove(&key).expect("unused entries are cached");
            self.by_page.remove(&e.page);
            if let Some(keys) = self.next.get_mut(&e.prev) {
                keys.retain(|&k| k != key);
                if keys.is_empty() {
                    self.next.remove(&e.prev);
                }
            }
            out.push(e.page);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32)
            .map(|i| i.wrapping_mul(2654435761) ^ seed)
            .collect()
    }

    /// Cache the full pages of `tokens` as a sequence would, on pages
    /// `first..`.
    fn fill(c: &mut PrefixCache, tokens: &[u32], first: u32) -> Vec<u32> {
        let mut prev = None;
        let mut pages = Vec::new();
        for (i, chunk) in tokens.chunks_exact(4).enumerate() {
            let page = first + i as u32;
            let (key, dup) = c.insert(prev, chunk, page);
            assert_eq!(dup, None);
            prev = Some(key);
            pages.push(page);
        }
        pages
    }

    #[test]
    fn keys_depend_on_the_tokens_and_everything_before() {
        let a = page_key(None, &[1, 2, 3, 4]);
        assert_eq!(a, page_key(None, &[1, 2, 3, 4]));
        assert_ne!(a, page_key(None, &[1, 2, 3, 5]));
        assert_ne!(
            page_key(Some(a), &[5, 6, 7, 8]),
            page_key(None, &[5, 6, 7, 8])
        );
        assert_ne!(
            page_key(Some(a), &[5, 6, 7, 8]),
            page_key(Some(a + 1), &[5, 6, 7, 8])
        );
    }

    #[test]
    fn the_longest_cached_prefix_is_reused_in_whole_pages() {
        let mut c = PrefixCache::new();
        let history = toks(1, 14); // 3 full pages and 2 tokens
        assert_eq!(fill(&mut c, &history, 10), [10, 11, 12]);
        assert_eq!(c.release(&[10, 11, 12, 13]), [13], "page 13 is not cached");
        assert_eq!(c.evictable(), 3);
        // The pages are back in use on a hit, then released again.
        // (Its last 2 tokens are not a page, and no cached page follows.)
        let again = c.acquire(&history, 4, true).pages;
        assert_eq!(again, [10, 11, 12]);
        assert!(c.release(&again).is_empty());
        assert_eq!(c.evictable(), 3);
        // The next turn resends the history and more: the 3 pages again.
        let mut turn = history.clone();
        turn.extend(toks(2, 9));
        let got = c.acquire(&turn, 4, true);
        assert_eq!((got.pages, got.tokens), (vec![10, 11, 12], 12));
        assert_eq!(
            got.key,
            Some(page_key(
                Some(page_key(Some(page_key(None, &turn[..4])), &turn[4..8])),
                &turn[8..12]
            ))
        );
        assert_eq!(c.evictable(), 0);
        // Another start shares only the first page.
        let mut other = history[..4].to_vec();
        other.extend(toks(3, 8));
        assert_eq!(c.acquire(&other, 4, true).pages, [10]);
        // A different first page: nothing.
        assert_eq!(c.acquire(&toks(4, 12), 4, true), CachedPrefix::default());
    }

    #[test]
    fn a_prefix_may_end_inside_a_cached_page() {
        let mut c = PrefixCache::new();
        let a = toks(1, 12);
        fill(&mut c, &a, 0); // pages 0, 1, 2
        let mut b = toks(2, 12);
        fill(&mut c, &b[..8], 3); // pages 3, 4 after another start
        c.release(&[0, 1, 2, 3, 4]);
        // 6 tokens as a's, then others: page 0 whole, page 1's first 2.
        let mut q = a[..6].to_vec();
        q.extend(toks(3, 5));
        let unused = c.evictable();
        assert_eq!(c.peek(&q, 4), 6, "what acquire finds");
        assert_eq!(c.evictable(), unused, "peek takes nothing");
        let got = c.acquire(&q, 4, true);
        assert_eq!(
            (got.pages.clone(), got.part, got.tokens),
            (vec![0], Some(1), 6)
        );
        assert_eq!(
            got.key,
            Some(page_key(None, &a[..4])),
            "chained from the whole page"
        );
        assert_eq!(c.evictable(), 3, "pages 0 and 1 are in use until the copy");
        c.release(&got.pages);
        c.release(&[1]);
        // Without the part: only the whole pages.
        let got = c.acquire(&q, 4, false);
        assert_eq!(
            (got.pages.clone(), got.part, got.tokens),
            (vec![0], None, 4)
        );
        c.release(&got.pages);
        // Of two cached pages after the same one, the longer match wins.
        b[..5].copy_from_slice(&a[..5]);
        let (k0, dup) = c.insert(None, &b[..4], 7);
        assert_eq!(dup, Some(0), "b's first page is a's");
        c.insert(Some(k0), &b[4..8], 8);
        c.release(&[8]);
        let mut r = a[..4].to_vec();
        r.extend_from_slice(&b[4..7]); // a's page 0, then b's page 1's first 3
        r.push(u32::MAX);
        assert_eq!(c.peek(&r, 4), 7);
        let got = c.acquire(&r, 4, true);
        assert_eq!(
            (got.pages.clone(), got.part, got.tokens),
            (vec![0], Some(8), 7),
            "{got:?}"
        );
        c.release(&got.pages);
        c.release(&[8]);
        // Fewer tokens than a page: the first page's match, nothing used.
        let got = c.acquire(&a[..3], 4, true);
        assert_eq!((got.pages.len(), got.part, got.tokens), (0, Some(0), 3));
        c.release(&[0]);
        // Nothing shared: nothing taken.
        assert_eq!(c.acquire(&toks(9, 3), 4, true), CachedPrefix::default());
        // An evicted page is no longer offered.
        let gone = c.evict(usize::MAX);
        assert_eq!(gone.len(), 6);
        assert_eq!(c.acquire(&a, 4, true), CachedPrefix::default());
        assert_eq!(c.peek(&a, 4), 0);
        assert!(c.next.is_empty());
    }

    #[test]
    fn unused_pages_are_evicted_least_recently_used_first() {
        let mut c = PrefixCache::new();
        let a = fill(&mut c, &toks(1, 8), 0); // pages 0, 1
        let b = fill(&mut c, &toks(2, 8), 2); // pages 2, 3
        assert!(c.release(&b).is_empty());
        assert!(c.release(&a).is_empty());
        // b was released first: its pages go first, each sequence's last
        // page before its first.
        assert_eq!(c.evict(3), [3, 2, 1]);
        assert_eq!((c.len(), c.evictable()), (1, 1));
        // a's head is still found; in use, it is never evicted.
        let pages = c.acquire(&toks(1, 8), 4, true).pages;
        assert_eq!(pages, [0]);
        assert!(c.evict(5).is_empty());
        c.release(&pages);
        assert_eq!(c.evict(5), [0]);
        assert!(c.is_empty());
    }

    #[test]
    fn a_page_computed_twice_is_cached_once() {
        let mut c = PrefixCache::new();
        let t = toks(7, 4);
        let (key, dup) = c.insert(None, &t, 5);
        assert_eq!(dup, None);
        // Another sequence computed the same page into page 9.
        assert_eq!(c.insert(None, &t, 9), (key, Some(5)));
        assert!(c.holds(5) && !c.holds(9));
        assert_eq!(c.release(&[9]), [9]);
        // A colliding key with other tokens is not mistaken for the page.
        let mut fake = PrefixCache::new();
        fake.by_key.insert(
            page_key(None, &[1, 2, 3, 4]),
            Entry {
                page: 0,
                prev: None,
                tokens: vec![9, 9, 9, 9],
                users: 1,
                stamp: 0,
            },
        );
        assert_eq!(
            fake.acquire(&[1, 2, 3, 4], 4, true).pages,
            Vec::<u32>::new()
        );
        assert_eq!(fake.insert(None, &[1, 2, 3, 4], 3).1, None);
        assert!(!fake.holds(3));
    }
}
