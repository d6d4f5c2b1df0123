use super::*;

fn toks(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(2654435761) ^ seed)
        .collect()
}

/// Run a sequence of `tokens` through a fresh table: admitted with what is
/// cached of it, all its tokens computed; returns the table.
fn run(kv: &mut KvManager, tokens: &[u32]) -> Blocks {
    let mut b = Blocks::default();
    let found = kv.lookup(&tokens[..tokens.len() - 1]);
    assert!(kv.admit(
        &mut b,
        &tokens[..tokens.len() - 1],
        tokens.len(),
        found,
        true,
        true
    ));
    kv.ran(&mut b, tokens, tokens.len());
    b
}

#[test]
fn a_shared_prefix_is_held_twice_and_copied_where_it_ends_inside_a_page() {
    let mut kv = KvManager::new(8, 4, true);
    let a = toks(1, 10); // pages 0..3, two full ones cached
    let mut ta = run(&mut kv, &a);
    kv.check(&[&ta]);
    assert_eq!((kv.cached(), kv.free(), kv.evictable()), (2, 5, 0));
    // b shares a's first 6 tokens: page 0 whole, page 1's first 2.
    let mut b = a[..6].to_vec();
    b.extend(toks(2, 4));
    let found = kv.lookup(&b[..9]);
    assert_eq!(
        found,
        Found {
            whole: 1,
            part: 2,
            whole_unused: 0,
            part_unused: false
        }
    );
    let mut tb = Blocks::default();
    assert!(kv.admit(&mut tb, &b[..9], 10, found, true, true));
    assert_eq!(tb.kv.pages[0], ta.kv.pages[0]);
    let (from, to) = tb.kv.copy.expect("a copy of page 1");
    assert_eq!((from, to), (ta.kv.pages[1], tb.kv.pages[1]));
    assert_eq!((kv.holders(from), kv.holders(ta.kv.pages[0])), (3, 3));
    kv.check(&[&ta, &tb]);
    kv.ran(&mut tb, &b, 10);
    assert_eq!(kv.holders(from), 2, "the copy's source is given back");
    kv.check(&[&ta, &tb]);
    // Both leave: their cached pages stay, unused; the rest is free.
    kv.release(&mut ta);
    kv.release(&mut tb);
    kv.check(&[]);
    assert_eq!(kv.available(), 8);
    assert_eq!(kv.cached(), 3, "a's two full pages and b's second");
    assert_eq!(kv.prefix_hits(), (1, 6));
}

#[test]
fn allocation_evicts_unused_cached_pages_least_recently_used_first() {
    let mut kv = KvManager::new(4, 4, true);
    let mut ta = run(&mut kv, &toks(1, 9)); // 3 pages, 2 cached
    let mut tb = Blocks::default();
    // Only one page is free while a holds its pages.
    assert!(!kv.grow(&mut tb, 8));
    assert!(kv.grow(&mut tb, 4));
    let (p0, p1) = (ta.kv.pages[0], ta.kv.pages[1]);
    kv.release(&mut ta);
    kv.check(&[&tb]);
    assert_eq!((kv.free(), kv.evictable()), (1, 2));
    // Three more pages: the free one, then a's cached pages (its last
    // first), leaving none cached.
    assert!(kv.grow(&mut tb, 13));
    assert_eq!(&tb.kv.pages[2..], &[p1, p0]);
    assert_eq!(kv.cached(), 0);
    kv.check(&[&tb]);
    assert!(!kv.grow(&mut tb, 17), "the pool is full");
}

#[test]
fn without_a_prefix_cache_nothing_is_kept() {
    let mut kv = KvManager::new(4, 4, false);
    let mut ta = run(&mut kv, &toks(1, 9));
    assert_eq!(kv.lookup(&toks(1, 8)), Found::default());
    kv.release(&mut ta);
    assert_eq!((kv.free(), kv.cached()), (4, 0));
}
