use super::*;
use proptest::prelude::*;

fn cfg(budget: usize, running: usize, pages: usize, watermark: usize) -> Config {
    Config {
        max_batch_tokens: budget,
        max_running: running,
        page_tokens: 4,
        pages,
        watermark_pages: watermark,
        chunk_tokens: budget,
    }
}

#[test]
fn a_long_prompt_is_chunked_and_running_decodes_go_first() {
    // A budget of 8 beside up to 4 decodes: chunks of 4.
    let mut s = Scheduler::new(cfg(8, 4, 64, 0));
    s.add(1, 3, 10).unwrap();
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 0..3)]);
    assert_eq!(s.complete(&step, &[]), Vec::<SeqId>::new());
    // 1 decodes; 2's 18-token prompt runs in chunks at multiples of 4,
    // whatever budget is left beside.
    s.add(2, 18, 2).unwrap();
    for chunk in [0..4, 4..8, 8..12, 12..16, 16..18] {
        let step = s.plan();
        assert_eq!(
            (step.decode.clone(), step.prefill.clone()),
            (vec![1], vec![(2, chunk)])
        );
        s.complete(&step, &[]);
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
    s.add(1, 3, 10).unwrap();
    let step = s.plan();
    s.complete(&step, &[]);
    s.add_whole(2, 7).unwrap();
    s.add_whole(3, 3).unwrap();
    let step = s.plan();
    assert_eq!(
        (step.decode.clone(), step.prefill.clone()),
        (vec![1], vec![(2, 0..7)])
    );
    assert_eq!(s.complete(&step, &[]), [2]);
    assert_eq!(s.pages_of(2), None);
    let step = s.plan();
    assert_eq!(step.prefill, [(3, 0..3)]);
    assert_eq!(s.complete(&step, &[]), [3]);
    // One longer than a step can never run: refused at once.
    assert_eq!(
        s.add_whole(4, 9),
        Err(SchedError::NotOneStep {
            id: 4,
            prompt: 9,
            max: 8
        })
    );
}

#[test]
fn cached_prefixes_count_only_the_tokens_computed() {
    // A budget of 16 (chunks of 14 beside up to 2 decodes): two 10-token
    // prompts of which 7 tokens are cached fit one step (3 tokens each);
    // uncached, only one would. A fully cached prompt still computes its
    // last token, and only the sequences the step tries to admit are
    // asked about.
    let mut s = Scheduler::new(cfg(16, 2, 64, 0));
    for id in 1..=3 {
        s.add(id, 10, 4).unwrap();
    }
    let mut asked = Vec::new();
    let step = s.plan_with(|id| {
        asked.push(id);
        if id == 3 {
            10
        } else {
            7
        }
    });
    assert_eq!(step.prefill, [(1, 7..10), (2, 7..10)]);
    // 3 waits: at most 2 run, so it is not asked about.
    assert_eq!(asked, [1, 2]);
    // The pages taken cover all ten tokens of each, and for this step a
    // copy of the page the cached 7 end inside (pages of 4); the copy
    // made, that page is given back.
    assert_eq!(s.pages_of(1), Some(4));
    s.complete(&step, &[]);
    assert_eq!(s.pages_of(1), Some(3));
    s.cancel(2);
    let step = s.plan_with(|_| 10);
    assert_eq!(
        (step.decode.clone(), step.prefill.clone()),
        (vec![1], vec![(3, 9..10)])
    );
    s.complete(&step, &[]);
    assert_eq!(s.plan().decode, [1, 3]);
}

#[test]
fn a_chunk_that_does_not_fit_waits_whole() {
    // Chunks of 6 in a budget of 8: two prompts' first chunks do not fit
    // one step; the second waits rather than run a cut chunk.
    let mut s = Scheduler::new(cfg(8, 2, 64, 0));
    s.add(1, 6, 3).unwrap();
    s.add(2, 9, 3).unwrap();
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 0..6)]);
    s.complete(&step, &[]);
    let step = s.plan();
    assert_eq!(
        (step.decode.clone(), step.prefill.clone()),
        (vec![1], vec![(2, 0..6)])
    );
    s.complete(&step, &[]);
    let step = s.plan();
    assert_eq!(
        (step.decode.clone(), step.prefill.clone()),
        (vec![1], vec![(2, 6..9)])
    );
}

#[test]
fn sequences_end_at_max_new_or_when_told() {
    let mut s = Scheduler::new(cfg(16, 4, 64, 0));
    s.add(1, 2, 2).unwrap();
    s.add(2, 2, 10).unwrap();
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 0..2), (2, 0..2)]);
    assert!(s.complete(&step, &[]).is_empty());
    let step = s.plan();
    assert_eq!(step.decode, [1, 2]);
    // 1 reaches max_new (2 tokens); 2 samples an end-of-generation token.
    assert_eq!(s.complete(&step, &[2]), [1, 2]);
    assert_eq!(s.counts(), (0, 0));
    assert_eq!(s.free_pages(), 64);
}

#[test]
fn admission_is_fifo_within_pages_and_a_watermark() {
    // 10 pages of 4 tokens; a watermark of 1 page.
    let mut s = Scheduler::new(cfg(64, 8, 10, 1));
    s.add(1, 16, 4).unwrap(); // 4 pages + 1 <= 10
    s.add(2, 16, 4).unwrap(); // 4 pages + 1 <= 6
    s.add(3, 8, 4).unwrap(); // 2 pages + 1 > 2 left: waits
    s.add(4, 1, 1).unwrap(); // 1 page + 1 would fit, but 3 is ahead
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 0..16), (2, 0..16)]);
    assert_eq!((s.counts(), s.free_pages()), ((2, 2), 2));
    s.complete(&step, &[]);
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
    s.add(1, 8, 8).unwrap();
    s.add(2, 8, 8).unwrap();
    s.add(3, 1, 1).unwrap();
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 0..8), (2, 0..8)]);
    s.complete(&step, &[]);
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
    s.complete(&step, &[]);
    // 1 ends; 2 comes back before 3, with its prompt and its sampled token.
    let step = s.plan();
    s.complete(&step, &[1]);
    let step = s.plan();
    assert_eq!(step.prefill, [(2, 0..9), (3, 0..1)]);
}

#[test]
fn bad_sequences_are_refused_and_cancel_frees_pages() {
    let mut s = Scheduler::new(cfg(8, 2, 4, 0));
    assert!(matches!(
        s.add(1, 15, 2),
        Err(SchedError::TooLong { need: 5, .. })
    ));
    assert_eq!(s.add(1, 0, 2), Err(SchedError::EmptyPrompt(1)));
    s.add(1, 12, 4).unwrap();
    assert_eq!(s.add(1, 1, 1), Err(SchedError::Duplicate(1)));
    let step = s.plan();
    assert_eq!((step.prefill.clone(), s.free_pages()), (vec![(1, 0..6)], 1));
    assert!(s.cancel(1));
    assert!(!s.cancel(1));
    assert_eq!((s.free_pages(), s.counts()), (4, (0, 0)));
    // A step planned before the cancel completes without it.
    assert!(s.complete(&step, &[]).is_empty());
}

/// A simulated server: sequences arrive over time with random prompts and
/// limits, some end early or are cancelled; the caller runs every step.
#[derive(Debug, Clone)]
struct Arrival {
    at_step: usize,
    prompt: usize,
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
            1..24usize,
            prop::option::of(1..24usize),
            prop::option::weighted(0.1, 0..60usize),
        )
            .prop_map(
                |(at_step, prompt, max_new, ends_after, cancel_at)| Arrival {
                    at_step,
                    prompt,
                    max_new,
                    ends_after,
                    cancel_at,
                },
            ),
        1..24,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Every step keeps the budget and the pool, makes progress while
    /// anything is scheduled, runs each running decode (unless preempted),
    /// admits in arrival order, and every sequence ends with exactly the
    /// tokens it was owed.
    #[test]
    fn every_sequence_is_served_within_the_limits(
        arr in arrivals(),
        budget in 4..48usize,
        running in 1..12usize,
        pages in 16..40usize,
        watermark in 0..3usize,
        chunk in 1..48usize,
    ) {
        let c = Config { chunk_tokens: chunk, ..cfg(budget, running, pages, watermark) };
        // The chunk size in effect (see Config::chunk_tokens).
        let chunk = chunk.min(budget - running.min(budget)).max(1);
        let mut s = Scheduler::new(c.clone());
        // Per sequence: samples so far, admitted order.
        let mut sampled: HashMap<SeqId, usize> = HashMap::new();
        let mut admitted: Vec<SeqId> = Vec::new();
        let mut ended: HashMap<SeqId, usize> = HashMap::new();
        let mut added: Vec<SeqId> = Vec::new();
        let mut step_no = 0;
        loop {
            for (i, a) in arr.iter().enumerate() {
                if a.at_step == step_no {
                    let id = i as SeqId;
                    if s.add(id, a.prompt, a.max_new).is_ok() {
                        added.push(id);
                        sampled.insert(id, 0);
                    }
                }
                if a.cancel_at == Some(step_no) && s.cancel(i as SeqId) {
                    ended.insert(i as SeqId, sampled[&(i as SeqId)]);
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
            let held: usize = s.seqs.values().map(|q| q.pages).sum();
            prop_assert_eq!(held + s.free_pages(), pages);
            prop_assert!(s.running.len() <= running.min(budget));
            if waiting + run > 0 {
                prop_assert!(!step.is_empty(), "no progress at step {}", step_no);
            }
            for id in &decoding_before {
                prop_assert!(step.decode.contains(id) || step.preempted.contains(id));
            }
            for (id, r) in &step.prefill {
                // Chunks cut at multiples of `chunk`, whatever else runs.
                prop_assert_eq!(r.start % chunk, 0);
                prop_assert_eq!(r.end, s.seqs[id].tokens.min(r.start + chunk));
                if r.start == 0 && !admitted.contains(id) {
                    admitted.push(*id);
                }
            }
            // The caller samples: a sequence whose last token ran samples
            // one; some say they are done.
            let mut done_now = Vec::new();
            let sampled_ids: Vec<SeqId> = step.decode.iter().copied().chain(
                step.prefill.iter().filter(|(id, r)| r.end == s.seqs[id].tokens).map(|(id, _)| *id),
            ).collect();
            for id in &sampled_ids {
                let n = sampled.get_mut(id).unwrap();
                *n += 1;
                if arr[*id as usize].ends_after == Some(*n) {
                    done_now.push(*id);
                }
            }
            for id in s.complete(&step, &done_now) {
                let a = &arr[id as usize];
                let n = sampled[&id];
                prop_assert!(n == a.max_new || a.ends_after == Some(n), "{} ended after {} samples", id, n);
                ended.insert(id, n);
            }
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
    }
}

#[test]
fn a_cached_prefix_past_a_chunk_boundary_goes_on_from_there() {
    // Chunks of 8 (a budget of 10 beside 2 decodes).
    let mut s = Scheduler::new(cfg(10, 2, 64, 0));
    s.add(1, 30, 2).unwrap();
    // Its first 20 tokens are cached: its chunks start there, at the
    // multiples of 8 after it.
    let step = s.plan_with(|_| 20);
    assert_eq!(step.prefill, [(1, 20..24)]);
    s.complete(&step, &[]);
    let step = s.plan();
    assert_eq!(step.prefill, [(1, 24..30)]);
    assert_eq!(s.complete(&step, &[]), Vec::<SeqId>::new());
    assert_eq!(s.plan().decode, [1]);
    // The last token is always computed, whatever is cached.
    s.add(2, 30, 2).unwrap();
    let step = s.plan_with(|_| 30);
    assert_eq!(
        (step.decode.clone(), step.prefill.clone()),
        (vec![1], vec![(2, 29..30)])
    );
}

#[test]
fn a_partly_cached_page_takes_a_copy_or_is_computed_again() {
    // Pages of 4, 6 in the pool: a 20-token prompt (5 pages) whose first
    // 6 tokens are cached ends its prefix inside page 1. Alone in a pool
    // of 6 it takes the copy's page for its first step and gives it back.
    let mut s = Scheduler::new(cfg(32, 2, 6, 0));
    s.add(1, 20, 4).unwrap();
    let step = s.plan_with(|_| 6);
    assert_eq!(step.prefill, [(1, 6..20)]);
    assert_eq!((s.pages_of(1), s.free_pages()), (Some(6), 0));
    s.complete(&step, &[]);
    assert_eq!((s.pages_of(1), s.free_pages()), (Some(5), 1));
    // A 24-token prompt fills the pool alone: no page for a copy, so its
    // chunk starts at the page boundary before the cached tokens' end.
    s.cancel(1);
    s.add(2, 24, 0).unwrap();
    let step = s.plan_with(|_| 6);
    assert_eq!(step.prefill, [(2, 4..24)]);
    assert_eq!((s.pages_of(2), s.free_pages()), (Some(6), 0));
    s.complete(&step, &[]);
    assert_eq!(s.pages_of(2), None, "it ended: max_new 0 samples one token");
}
