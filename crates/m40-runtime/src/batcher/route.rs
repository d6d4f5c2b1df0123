//! Which replica a new sequence runs on (`EngineOptions::replicas`): the
//! least loaded, unless one nearly as idle may hold its prompt's first
//! pages in its prefix cache.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// Prompts whose first page a replica remembers.
const RECENT_PREFIXES: usize = 256;

/// How many more sequences than the least loaded replica one may hold and
/// still be given a prompt whose first page it has seen: load comes first
/// (as in vLLM's and SGLang's routers), the prefix cache second.
pub const PREFIX_SLACK: usize = 2;

/// The first pages of the prompts a replica was given, newest last.
#[derive(Default)]
pub struct Recent(Mutex<VecDeque<u64>>);

impl Recent {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<u64>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn contains(&self, key: u64) -> bool {
        self.lock().contains(&key)
    }

    /// `key` seen now (the oldest forgotten past [`RECENT_PREFIXES`]).
    pub fn note(&self, key: u64) {
        let mut r = self.lock();
        r.retain(|&k| k != key);
        if r.len() == RECENT_PREFIXES {
            r.pop_front();
        }
        r.push_back(key);
    }
}

/// A hash of `prompt`'s first full page of `page` tokens (none for a
/// shorter prompt: the prefix cache keeps full pages only).
pub fn first_page(prompt: &[u32], page: usize) -> Option<u64> {
    let head = prompt.get(..page.max(1))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    head.hash(&mut h);
    Some(h.finish())
}

/// The replica for a new sequence, given each one's `loads` (sequences
/// waiting and running) and whether it has `seen` the prompt's first page:
/// the least loaded of those that have and hold at most [`PREFIX_SLACK`]
/// more than the least loaded of all, else the least loaded; the first of
/// equals.
pub fn choose(loads: &[usize], seen: impl Fn(usize) -> bool) -> usize {
    let least = loads.iter().copied().min().expect("a replica");
    (0..loads.len())
        .filter(|&i| loads[i] <= least + PREFIX_SLACK && seen(i))
        .min_by_key(|&i| loads[i])
        .or_else(|| loads.iter().position(|&l| l == least))
        .expect("a least loaded replica")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_loaded_replica_takes_a_new_sequence() {
        assert_eq!(choose(&[0, 0], |_| false), 0);
        assert_eq!(choose(&[1, 0], |_| false), 1);
        assert_eq!(choose(&[3, 1, 1], |_| false), 1);
        // Sequences placed one by one over two idle replicas alternate.
        let mut loads = vec![0; 2];
        let mut order = Vec::new();
        for _ in 0..6 {
            let i = choose(&loads, |_| false);
            loads[i] += 1;
            order.push(i);
        }
        assert_eq!(order, [0, 1, 0, 1, 0, 1]);
    }

    #[test]
    fn a_replica_that_saw_the_prefix_wins_within_the_slack() {
        // Replica 1 saw the prompt's first page: it wins while it holds at
        // most PREFIX_SLACK more sequences than the least loaded.
        assert_eq!(choose(&[0, 0], |i| i == 1), 1);
        assert_eq!(choose(&[0, PREFIX_SLACK], |i| i == 1), 1);
        assert_eq!(choose(&[0, PREFIX_SLACK + 1], |i| i == 1), 0);
        // Of two that saw it, the less loaded.
        assert_eq!(choose(&[5, 2, 1], |i| i != 2), 1);
    }

    #[test]
    fn first_pages_and_the_recent_list() {
        let page = 4;
        let (a, b) = ([1u32, 2, 3, 4, 9], [1u32, 2, 3, 4, 7, 7]);
        assert_eq!(first_page(&a, page), first_page(&b, page));
        assert_ne!(first_page(&a, page), first_page(&[1, 2, 3, 5], page));
        assert_eq!(first_page(&[1, 2, 3], page), None);
        let r = Recent::default();
        for k in 0..RECENT_PREFIXES as u64 + 1 {
            r.note(k);
        }
        assert!(!r.contains(0), "the oldest is forgotten");
        assert!(r.contains(1) && r.contains(RECENT_PREFIXES as u64));
        r.note(1);
        r.note(RECENT_PREFIXES as u64 + 1);
        assert!(r.contains(1), "noting a key again makes it the newest");
        assert!(!r.contains(2));
    }
}
