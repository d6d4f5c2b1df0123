use super::*;
use proptest::prelude::*;
use std::ops::Range;

fn cfg(budget: usize, running: usize, pages: usize, watermark: usize) -> Config {
    Config {
        max_batch_tokens: budget,
        max_running: running,
        page_tokens: 4,
        pages,
        watermark_pages: watermark,
        chunk_tokens: budget,
        prefix_cache: false,
    }
}

/// `n` tokens of sequence `id`, shared with no other sequence.
fn t(id: SeqId, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| id as u32 * 1000 + i).collect()
}

#[test]
fn a_long_prompt_is_chunked_and_running_decodes_go_first() {
    // A budget of 8 beside up to 4 decodes: chunks of 4.
    let mut s = Scheduler::new(cfg(8, 4, 64, 0));
    s.add(1, &t(1, 3), 10).unwrap();
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 0..3)]);
    assert_eq!(s.complete(&step, &[], &[]), Vec::<SeqId>::new());
    // 1 decodes; 2's 18-token prompt runs in chunks at multiples of 4,
    // whatever budget is left beside.
    s.add(2, &t(2, 18), 2).unwrap();
    for chunk in [0..4, 4..8, 8..12, 12..16, 16..18] {
        let step = s.plan();
        assert_eq!(
            (step.decode.clone(), step.prefill.clone()),
            (vec![1], vec![(2, chunk)])
        );
        s.complete(&step, &[], &[]);
    }
    let step = s.plan();
    assert_eq!(step.decode, [1, 2]);
    assert_eq!(step.tokens(), 2);
}

#[test]
fn a_whole_prompt_runs_in_one_step_and_ends_there() {
    // Chunks of 4 beside up to 4 decodes; a whole 7-token prompt is not
    // cut, waits while a decode leaves it too little budget, and ends
    // after its step (nothing sampled), its pages freed.
    let mut s = Scheduler::new(cfg(8, 4, 64, 0));
    s.add(1, &t(1, 3), 10).unwrap();
    let step = s.plan();
    s.complete(&step, &[], &[]);
    s.add_whole(2, &t(2, 7)).unwrap();
    s.add_whole(3, &t(3, 3)).unwrap();
    let step = s.plan();
    assert_eq!(
        (step.decode.clone(), step.prefill.clone()),
        (vec![1], vec![(2, 0..7)])
    );
    assert_eq!(s.complete(&step, &[], &[]), [2]);
    assert_eq!(s.pages_of(2), None);
    let step = s.plan();
    assert_eq!(step.prefill, [(3, 0..3)]);
    assert_eq!(s.complete(&step, &[], &[]), [3]);
    // One longer than a step can never run: refused at once.
    assert_eq!(
        s.add_whole(4, &t(4, 9)),
        Err(SchedError::NotOneStep {
            id: 4,
            prompt: 9,
            max: 8
        })
    );
}

/// A configuration with the prefix cache.
fn cached(budget: usize, running: usize, pages: usize) -> Config {
    Config {
        prefix_cache: true,
        ..cfg(budget, running, pages, 0)
    }
}

/// Tokens every test prompt that shares a prefix starts with.
fn common(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 7_000_000 + i).collect()
}

fn cat(a: Vec<u32>, b: Vec<u32>) -> Vec<u32> {
    a.into_iter().chain(b).collect()
}

/// Run `prompt` as sequence `id` to its end (one sampled token), alone:
/// its full pages stay cached.
fn warm(s: &mut Scheduler, id: SeqId, prompt: &[u32]) {
    s.add(id, prompt, 1).unwrap();
    loop {
        let step = s.plan();
        let ended = s.complete(&step, &[(id, 1)], &[]);
        if ended == [id] {
            return;
        }
    }
}

#[test]
fn cached_prefixes_count_only_the_tokens_computed() {
    // A budget of 16 (chunks of 14 beside up to 2 decodes): two 10-token
    // prompts of which 7 tokens are cached fit one step (3 tokens each);
    // uncached, only one would. A fully cached prompt still computes its
    // last token.
    let mut s = Scheduler::new(cached(16, 2, 64));
    warm(&mut s, 9, &common(12)); // 3 full pages cached
    assert_eq!(s.kv().cached(), 3);
    for id in 1..=2 {
        s.add(id, &cat(common(7), t(id, 3)), 4).unwrap();
    }
    s.add(3, &common(10), 4).unwrap();
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 7..10), (2, 7..10)]);
    // The pages taken cover all ten tokens of each, and for this step the
    // cached page the 7 end inside, to copy from (pages of 4); the copy
    // made, that page is given back.
    assert_eq!(s.pages_of(1), Some(4));
    let kv = &step.kv[&1];
    assert_eq!(
        (kv.pages.len(), kv.copy.map(|c| c.1)),
        (3, Some(kv.pages[1]))
    );
    assert_eq!(kv.pages[0], step.kv[&2].pages[0], "page 0 is shared");
    s.complete(&step, &[(1, 5), (2, 5)], &[]);
    assert_eq!(s.pages_of(1), Some(3));
    s.cancel(2);
    // 3's first 9 tokens: two whole pages and one token of the third.
    let step = s.plan();
    assert_eq!(
        (step.decode.clone(), step.prefill.clone()),
        (vec![1], vec![(3, 9..10)])
    );
    s.complete(&step, &[(1, 5), (3, 5)], &[]);
    assert_eq!(s.plan().decode, [1, 3]);
    assert_eq!(s.kv().prefix_hits(), (3, 7 + 7 + 9));
}

#[test]
fn a_chunk_that_does_not_fit_waits_whole() {
    // Chunks of 6 in a budget of 8: two prompts' first chunks do not fit
    // one step; the second waits rather than run a cut chunk.
    let mut s = Scheduler::new(cfg(8, 2, 64, 0));
    s.add(1, &t(1, 6), 3).unwrap();
    s.add(2, &t(2, 9), 3).unwrap();
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 0..6)]);
    s.complete(&step, &[], &[]);
    let step = s.plan();
    assert_eq!(
        (step.decode.clone(), step.prefill.clone()),
        (vec![1], vec![(2, 0..6)])
    );
    s.complete(&step, &[], &[]);
    let step = s.plan();
    assert_eq!(
        (step.decode.clone(), step.prefill.clone()),
        (vec![1], vec![(2, 6..9)])
    );
}

#[test]
fn sequences_end_at_max_new_or_when_told() {
    let mut s = Scheduler::new(cfg(16, 4, 64, 0));
    s.add(1, &t(1, 2), 2).unwrap();
    s.add(2, &t(2, 2), 10).unwrap();
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 0..2), (2, 0..2)]);
    assert!(s.complete(&step, &[], &[]).is_empty());
    let step = s.plan();
    assert_eq!(step.decode, [1, 2]);
    // 1 reaches max_new (2 tokens); 2 samples an end-of-generation token.
    assert_eq!(s.complete(&step, &[], &[2]), [1, 2]);
    assert_eq!(s.counts(), (0, 0));
    assert_eq!(s.free_pages(), 64);
}

#[test]
fn admission_is_fifo_within_pages_and_a_watermark() {
    // 10 pages of 4 tokens; a watermark of 1 page.
    let mut s = Scheduler::new(cfg(64, 8, 10, 1));
    s.add(1, &t(1, 16), 4).unwrap(); // 4 pages + 1 <= 10
    s.add(2, &t(2, 16), 4).unwrap(); // 4 pages + 1 <= 6
    s.add(3, &t(3, 8), 4).unwrap(); // 2 pages + 1 > 2 left: waits
    s.add(4, &t(4, 1), 1).unwrap(); // 1 page + 1 would fit, but 3 is ahead
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 0..16), (2, 0..16)]);
    assert_eq!((s.counts(), s.free_pages()), ((2, 2), 2));
    s.complete(&step, &[], &[]);
    s.cancel(2);
    // 1 decodes into a fifth page; 3 and then 4 are admitted in order.
    let step = s.plan();
    assert_eq!(step.decode, [1]);
    assert_eq!(step.prefill, [(3, 0..8), (4, 0..1)]);
    assert_eq!(s.free_pages(), 2);
}

#[test]
fn the_newest_is_preempted_when_pages_run_dry_and_comes_back_first() {
    // 4 pages of 4 tokens: two sequences of 8 tokens fill them.
    let mut s = Scheduler::new(cfg(64, 8, 4, 0));
    s.add(1, &t(1, 8), 8).unwrap();
    s.add(2, &t(2, 8), 8).unwrap();
    s.add(3, &t(3, 1), 1).unwrap();
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 0..8), (2, 0..8)]);
    s.complete(&step, &[], &[]);
    // Both need a page to decode their 9th token: 2, the newest, yields.
    let step = s.plan();
    assert_eq!(
        (step.decode.clone(), step.preempted.clone()),
        (vec![1], vec![2])
    );
    assert_eq!(s.pages_of(2), Some(0));
    assert!(
        step.prefill.is_empty(),
        "2 is not readmitted in the step that preempted it"
    );
    s.complete(&step, &[], &[]);
    // 1 ends; 2 comes back before 3, with its prompt and its sampled token.
    let step = s.plan();
    s.complete(&step, &[], &[1]);
    let step = s.plan();
    assert_eq!(step.prefill, [(2, 0..9), (3, 0..1)]);
}

#[test]
fn bad_sequences_are_refused_and_cancel_frees_pages() {
    let mut s = Scheduler::new(cfg(8, 2, 4, 0));
    assert!(matches!(
        s.add(1, &t(1, 15), 2),
        Err(SchedError::TooLong { need: 5, .. })
    ));
    assert_eq!(s.add(1, &t(1, 0), 2), Err(SchedError::EmptyPrompt(1)));
    s.add(1, &t(1, 12), 4).unwrap();
    assert_eq!(s.add(1, &t(1, 1), 1), Err(SchedError::Duplicate(1)));
    let step = s.plan();
    assert_eq!((step.prefill.clone(), s.free_pages()), (vec![(1, 0..6)], 1));
    assert!(s.cancel(1));
    assert!(!s.cancel(1));
    assert_eq!((s.free_pages(), s.counts()), (4, (0, 0)));
    // A step planned before the cancel completes without it.
    assert!(s.complete(&step, &[], &[]).is_empty());
}

/// A simulated server: sequences arrive over time with random prompts
/// (some sharing a common start) and limits, some end early or are
/// cancelled; the caller runs every step on a simulated pool whose slots
/// record the token written there.
#[derive(Debug, Clone)]
struct Arrival {
    at_step: usize,
    prompt: usize,
    /// Its first tokens (at most) are the common ones.
    shared: usize,
    max_new: usize,
    /// Ends (an end-of-generation token) after this many samples, if any.
    ends_after: Option<usize>,
    cancel_at: Option<usize>,
}

fn arrivals() -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec(
        (
            0..30usize,
            1..40usize,
            prop::option::of(1..30usize),
            1..24usize,
            prop::option::of(1..24usize),
            prop::option::weighted(0.1, 0..60usize),
        )
            .prop_map(
                |(at_step, prompt, shared, max_new, ends_after, cancel_at)| Arrival {
                    at_step,
                    prompt,
                    shared: shared.unwrap_or(0),
                    max_new,
                    ends_after,
                    cancel_at,
                },
            ),
        1..24,
    )
}

/// The tokens of arrival `id`'s prompt.
fn prompt_of(id: SeqId, a: &Arrival) -> Vec<u32> {
    let shared = a.shared.min(a.prompt);
    cat(common(shared), t(id, a.prompt - shared))
}

/// What the backend does with a step: each sequence's copy, then its
/// tokens written at their positions through its block table; every
/// position before the step's end must then hold the sequence's own token
/// (a cached prefix the right one, a shared page never overwritten).
fn execute(
    pool: &mut [Vec<Option<u32>>],
    step: &Step,
    toks: &HashMap<SeqId, Vec<u32>>,
    page: usize,
) -> Result<(), TestCaseError> {
    let ranges: Vec<(SeqId, Range<usize>)> = step
        .decode
        .iter()
        .map(|id| {
            let n = toks[id].len();
            (*id, n - 1..n)
        })
        .chain(step.prefill.iter().cloned())
        .collect();
    for (id, _) in &ranges {
        if let Some((from, to)) = step.kv[id].copy {
            pool[to as usize] = pool[from as usize].clone();
        }
    }
    for (id, r) in &ranges {
        let kv = &step.kv[id];
        prop_assert!(
            kv.pages.len() * page >= r.end,
            "{} has pages for its step",
            id
        );
        for p in r.clone() {
            pool[kv.pages[p / page] as usize][p % page] = Some(toks[id][p]);
        }
    }
    for (id, r) in &ranges {
        let kv = &step.kv[id];
        for p in 0..r.end {
            let got = pool[kv.pages[p / page] as usize][p % page];
            prop_assert_eq!(got, Some(toks[id][p]), "sequence {} position {}", id, p);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Every step keeps the budget and the pool (the ledger's counts agree
    /// with the tables and the cache), makes progress while anything is
    /// scheduled, runs each running decode (unless preempted), admits in
    /// arrival order, reads only the right tokens from cached and shared
    /// pages, and every sequence ends with exactly the tokens it was owed.
    #[test]
    fn every_sequence_is_served_within_the_limits(
        arr in arrivals(),
        budget in 4..48usize,
        running in 1..12usize,
        pages in 16..40usize,
        watermark in 0..3usize,
        chunk in 1..48usize,
        prefix_cache in any::<bool>(),
    ) {
        let c = Config { chunk_tokens: chunk, prefix_cache, ..cfg(budget, running, pages, watermark) };
        // The chunk size in effect (see Config::chunk_tokens).
        let chunk = chunk.min(budget - running.min(budget)).max(1);
        let mut s = Scheduler::new(c.clone());
        let mut pool = vec![vec![None; c.page_tokens]; pages];
        // Per sequence: its tokens, samples so far, admitted order.
        let mut toks: HashMap<SeqId, Vec<u32>> = HashMap::new();
        let mut sampled: HashMap<SeqId, usize> = HashMap::new();
        let mut admitted: Vec<SeqId> = Vec::new();
        let mut ended: HashMap<SeqId, usize> = HashMap::new();
        let mut added: Vec<SeqId> = Vec::new();
        let mut step_no = 0;
        loop {
            for (i, a) in arr.iter().enumerate() {
                let id = i as SeqId;
                if a.at_step == step_no {
                    let prompt = prompt_of(id, a);
                    if s.add(id, &prompt, a.max_new).is_ok() {
                        added.push(id);
                        sampled.insert(id, 0);
                        toks.insert(id, prompt);
                    }
                }
                if a.cancel_at == Some(step_no) && s.cancel(id) {
                    ended.insert(id, sampled[&id]);
                }
            }
            let (waiting, run) = s.counts();
            if waiting + run == 0 && step_no > 30 {
                break;
            }
            let decoding_before: Vec<SeqId> = s.running.iter().copied()
                .filter(|id| s.seqs[id].decoding()).collect();
            let step = s.plan();
            prop_assert!(step.tokens() <= budget);
            let tables: Vec<&Blocks> = s.seqs.values().map(|q| &q.blocks).collect();
            s.kv.check(&tables);
            prop_assert!(s.running.len() <= running.min(budget));
            if waiting + run > 0 {
                prop_assert!(!step.is_empty(), "no progress at step {}", step_no);
            }
            for id in &decoding_before {
                prop_assert!(step.decode.contains(id) || step.preempted.contains(id));
            }
            for (id, r) in &step.prefill {
                // Chunks end at multiples of `chunk` (they start at one but
                // after a cached prefix), whatever else runs.
                let n = s.seqs[id].tokens();
                prop_assert_eq!(r.end, n.min((r.start / chunk + 1) * chunk));
                prop_assert!(prefix_cache || r.start % chunk == 0);
                if !admitted.contains(id) {
                    admitted.push(*id);
                }
            }
            execute(&mut pool, &step, &toks, c.page_tokens)?;
            // The caller samples: a sequence whose last token ran samples
            // one; some say they are done.
            let mut done_now = Vec::new();
            let sampled_ids: Vec<SeqId> = step.decode.iter().copied().chain(
                step.prefill.iter().filter(|(id, r)| r.end == s.seqs[id].tokens()).map(|(id, _)| *id),
            ).collect();
            let mut new_tokens = Vec::new();
            for id in &sampled_ids {
                let n = sampled.get_mut(id).unwrap();
                *n += 1;
                let tok = 500_000 + *id as u32 * 100 + *n as u32;
                toks.get_mut(id).unwrap().push(tok);
                new_tokens.push((*id, tok));
                if arr[*id as usize].ends_after == Some(*n) {
                    done_now.push(*id);
                }
            }
            for id in s.complete(&step, &new_tokens, &done_now) {
                let a = &arr[id as usize];
                let n = sampled[&id];
                prop_assert!(n == a.max_new || a.ends_after == Some(n), "{} ended after {} samples", id, n);
                ended.insert(id, n);
            }
            let tables: Vec<&Blocks> = s.seqs.values().map(|q| &q.blocks).collect();
            s.kv.check(&tables);
            step_no += 1;
            prop_assert!(step_no < 5000, "did not finish");
        }
        // Every sequence added ended; first admissions follow arrival order.
        for id in &added {
            prop_assert!(ended.contains_key(id), "{} never ended", id);
        }
        let mut order = admitted.clone();
        order.sort_by_key(|id| (arr[*id as usize].at_step, *id));
        prop_assert_eq!(admitted, order);
        // Nothing is held but what the cache keeps.
        prop_assert_eq!(s.kv.available(), pages);
    }
}

#[test]
fn a_cached_prefix_past_a_chunk_boundary_goes_on_from_there() {
    // Chunks of 8 (a budget of 10 beside 2 decodes).
    let mut s = Scheduler::new(cached(10, 2, 64));
    warm(&mut s, 9, &common(20)); // 5 full pages
    let p1 = cat(common(20), t(1, 10));
    s.add(1, &p1, 4).unwrap();
    // Its first 20 tokens are cached: its chunks start there, at the
    // multiples of 8 after it.
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 20..24)]);
    s.complete(&step, &[], &[]);
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 24..30)]);
    assert_eq!(s.complete(&step, &[(1, 1)], &[]), Vec::<SeqId>::new());
    // Two decodes fill its eighth page (32 tokens computed).
    for tok in [2, 3] {
        let step = s.plan();
        assert_eq!(step.decode, [1]);
        s.complete(&step, &[(1, tok)], &[]);
    }
    // The last token is always computed, whatever is cached.
    s.add(2, &p1, 2).unwrap();
    let step = s.plan();
    assert_eq!(
        (step.decode.clone(), step.prefill.clone()),
        (vec![1], vec![(2, 29..30)])
    );
}

#[test]
fn a_partly_cached_page_takes_a_copy_or_is_computed_again() {
    // Pages of 4, 6 in the pool: a 20-token prompt (5 pages) whose first
    // 6 tokens are cached ends its prefix inside page 1. In a pool of 6
    // it holds the copy's source for its first step and gives it back.
    let mut s = Scheduler::new(cached(32, 2, 6));
    warm(&mut s, 9, &common(8));
    s.add(1, &cat(common(6), t(1, 14)), 4).unwrap();
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 6..20)]);
    assert_eq!((s.pages_of(1), s.free_pages()), (Some(6), 0));
    s.complete(&step, &[(1, 1)], &[]);
    assert_eq!((s.pages_of(1), s.free_pages()), (Some(5), 1));
    // A 24-token prompt fills the pool alone: no page for a copy, so its
    // chunk starts at the page boundary before the cached tokens' end
    // (the cached pages it does not use are evicted for it).
    s.cancel(1);
    assert_eq!((s.free_pages(), s.kv().free()), (6, 0));
    s.add(2, &cat(common(6), t(2, 18)), 0).unwrap();
    let step = s.plan();
    assert_eq!(step.prefill, [(2, 4..24)]);
    assert_eq!((s.pages_of(2), s.free_pages()), (Some(6), 0));
    s.complete(&step, &[], &[]);
    assert_eq!(s.pages_of(2), None, "it ended: max_new 0 samples one token");
}
