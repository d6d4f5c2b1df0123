//! The scheduling policy: see the crate's documentation.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

/// A sequence's id, given by the caller.
pub type SeqId = u64;

/// The limits a scheduler plans within.
#[derive(Clone, Debug)]
pub struct Config {
    /// Tokens one step runs at most: decode tokens plus prompt chunks.
    pub max_batch_tokens: usize,
    /// Sequences running (holding pages) at once at most; at most
    /// `max_batch_tokens` (lowered to it), so every running decode fits
    /// every step.
    pub max_running: usize,
    /// Tokens per KV page.
    pub page_tokens: usize,
    /// Pages in the KV pool.
    pub pages: usize,
    /// Pages a sequence must leave free after its prompt to be admitted:
    /// room for the running ones to grow.
    pub watermark_pages: usize,
    /// Prompt chunks start at multiples of this many tokens and run whole
    /// (the last one shorter): a prompt is cut the same way whatever else
    /// runs, so its results do not depend on it (batch invariance). At most
    /// `max_batch_tokens - max_running` (lowered to it, at least 1), so the
    /// oldest waiting chunk always fits beside every running decode.
    pub chunk_tokens: usize,
}

/// Why a sequence cannot be scheduled.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SchedError {
    #[error("sequence {0} is already scheduled")]
    Duplicate(SeqId),
    #[error("sequence {id}: a prompt of {prompt} tokens plus {max_new} new ones needs {need} KV pages; the pool has {pages}")]
    TooLong {
        id: SeqId,
        prompt: usize,
        max_new: usize,
        need: usize,
        pages: usize,
    },
    #[error("sequence {0} has an empty prompt")]
    EmptyPrompt(SeqId),
    #[error("sequence {id}: a prompt of {prompt} tokens that must run in one step; a step runs {max} at most")]
    NotOneStep {
        id: SeqId,
        prompt: usize,
        max: usize,
    },
}

/// What one step runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// Sequences that compute their last token (one each), oldest first;
    /// each is then sampled.
    pub decode: Vec<SeqId>,
    /// Chunks of tokens still to compute: a sequence's positions `range`
    /// (its prompt, or after a preemption its prompt and what it had
    /// generated). A chunk that ends at the sequence's last token is
    /// sampled.
    pub prefill: Vec<(SeqId, Range<usize>)>,
    /// Sequences preempted before this step: their pages are free, and they
    /// wait first in line to be computed again.
    pub preempted: Vec<SeqId>,
}

impl Step {
    /// Tokens the step runs.
    pub fn tokens(&self) -> usize {
        self.decode.len() + self.prefill.iter().map(|(_, r)| r.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.decode.is_empty() && self.prefill.is_empty()
    }
}

struct Seq {
    /// Tokens known: the prompt, then each token sampled.
    tokens: usize,
    /// Tokens in the KV cache (0 while waiting).
    computed: usize,
    /// Pages held.
    pages: usize,
    /// New tokens sampled so far, and at most.
    generated: usize,
    max_new: usize,
    /// Admitted with a cached prefix that ends inside a page: its first
    /// step writes into a copy of that shared page, and it holds a page
    /// more than its tokens need until that step is done (the shared
    /// page stays taken while the copy is made).
    copies: bool,
    /// Its prompt runs in one chunk (an encoder's: every token attends to
    /// every other).
    whole: bool,
}

impl Seq {
    /// Decoding: it has sampled, and only that last token is to compute.
    fn decoding(&self) -> bool {
        self.generated > 0 && self.tokens - self.computed == 1
    }
}

/// The state of continuous batching: sequences waiting and running, and the
/// KV pages they hold.
///
/// A sequence takes the pages of its prompt when admitted and one more
/// page each time its decoding crosses a page boundary. Every step makes
/// progress: a running sequence alone always fits (`add` refuses one whose
/// prompt and new tokens exceed the pool), and all running decodes fit the
/// token budget.
pub struct Scheduler {
    cfg: Config,
    seqs: HashMap<SeqId, Seq>,
    /// Waiting, in order of admission (preempted sequences first).
    waiting: VecDeque<SeqId>,
    /// Running, oldest admission first.
    running: Vec<SeqId>,
    free_pages: usize,
}

impl Scheduler {
    pub fn new(mut cfg: Config) -> Scheduler {
        assert!(cfg.page_tokens > 0 && cfg.max_batch_tokens > 0 && cfg.max_running > 0);
        cfg.max_running = cfg.max_running.min(cfg.max_batch_tokens);
        cfg.chunk_tokens = cfg
            .chunk_tokens
            .min(cfg.max_batch_tokens - cfg.max_running)
            .max(1);
        Scheduler {
            free_pages: cfg.pages,
            cfg,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.cfg.page_tokens)
    }

    /// Queue a sequence with `prompt` tokens that may sample `max_new`
    /// more. Refused when it could not run even alone.
    pub fn add(&mut self, id: SeqId, prompt: usize, max_new: usize) -> Result<(), SchedError> {
        self.insert(id, prompt, max_new, false)
    }

    /// A sequence whose prompt is computed in one chunk, for its hidden
    /// states (an embedding: nothing is sampled, and an encoder's tokens
    /// attend to each other, so its prompt cannot be cut): it ends after
    /// that step.
    pub fn add_whole(&mut self, id: SeqId, prompt: usize) -> Result<(), SchedError> {
        if prompt > self.cfg.max_batch_tokens {
            return Err(SchedError::NotOneStep {
                id,
                prompt,
                max: self.cfg.max_batch_tokens,
            });
        }
        self.insert(id, prompt, 0, true)
    }

    fn insert(
        &mut self,
        id: SeqId,
        prompt: usize,
        max_new: usize,
        whole: bool,
    ) -> Result<(), SchedError> {
        if self.seqs.contains_key(&id) {
            return Err(SchedError::Duplicate(id));
        }
        if prompt == 0 {
            return Err(SchedError::EmptyPrompt(id));
        }
        let need = self.pages_for(prompt + max_new);
        if need > self.cfg.pages {
            return Err(SchedError::TooLong {
                id,
                prompt,
                max_new,
                need,
                pages: self.cfg.pages,
            });
        }
        self.seqs.insert(
            id,
            Seq {
                tokens: prompt,
                computed: 0,
                pages: 0,
                generated: 0,
                max_new,
                copies: false,
                whole,
            },
        );
        self.waiting.push_back(id);
        Ok(())
    }

    /// Drop a sequence (its client went away), freeing its pages. False if
    /// it was not scheduled.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        let Some(s) = self.seqs.remove(&id) else {
            return false;
        };
        self.free_pages += s.pages;
        self.waiting.retain(|&w| w != id);
        self.running.retain(|&r| r != id);
        true
    }

    /// Sequences waiting and running.
    pub fn counts(&self) -> (usize, usize) {
        (self.waiting.len(), self.running.len())
    }

    /// Pages in the pool.
    pub fn pages(&self) -> usize {
        self.cfg.pages
    }

    /// Free KV pages.
    pub fn free_pages(&self) -> usize {
        self.free_pages
    }

    /// Pages `id` holds, if it is scheduled.
    pub fn pages_of(&self, id: SeqId) -> Option<usize> {
        self.seqs.get(&id).map(|s| s.pages)
    }

    /// Take pages so that `id` holds `tokens` tokens and `extra` pages
    /// more; false (nothing taken) when the free pages are too few.
    fn grow(&mut self, id: SeqId, tokens: usize, extra: usize) -> bool {
        let need = self.pages_for(tokens) + extra;
        let s = self.seqs.get_mut(&id).expect("scheduled");
        let more = need.saturating_sub(s.pages);
        if more > self.free_pages {
            return false;
        }
        s.pages += more;
        self.free_pages -= more;
        true
    }

    /// Free the newest running sequence's pages and queue it first.
    fn preempt_newest(&mut self, step: &mut Step) {
        let id = self.running.pop().expect("a running sequence to preempt");
        let s = self.seqs.get_mut(&id).expect("scheduled");
        self.free_pages += s.pages;
        s.pages = 0;
        s.computed = 0;
        self.waiting.push_front(id);
        step.preempted.push(id);
    }

    /// The chunk from `start` of a sequence of `tokens` tokens: to the
    /// next multiple of `chunk_tokens`, or its end.
    fn chunk(&self, s: &Seq, start: usize) -> Range<usize> {
        if s.whole {
            return start..s.tokens;
        }
        let c = self.cfg.chunk_tokens;
        start..s.tokens.min((start / c + 1) * c)
    }

    /// The next step: the pages its tokens need are taken (see
    /// [`Scheduler::complete`] for what comes after).
    pub fn plan(&mut self) -> Step {
        self.plan_with(|_| 0)
    }

    /// [`Scheduler::plan`], where `cached(id)` says how many of a waiting
    /// sequence's first tokens a prefix cache holds now (asked only of
    /// the sequences it tries to admit): its first chunk starts there (or
    /// at the page boundary before it, when the page a copy of the last,
    /// partly shared, page takes does not fit), so the step's budget
    /// counts the tokens it computes. The caller takes those cached tokens
    /// into the sequence's cache before the step runs.
    pub fn plan_with(&mut self, mut cached: impl FnMut(SeqId) -> usize) -> Step {
        let mut step = Step::default();
        let mut budget = self.cfg.max_batch_tokens;
        // Running decodes, oldest first; when the pages run dry, the newest
        // running sequence makes room (it may be one of the decodes).
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let s = &self.seqs[&id];
            if !s.decoding() {
                i += 1;
                continue;
            }
            let want = s.computed + 1;
            if self.grow(id, want, 0) {
                step.decode.push(id);
                budget -= 1;
                i += 1;
            } else {
                // `id` itself may be the newest; then it waits.
                self.preempt_newest(&mut step);
            }
        }
        // Prompt chunks of running sequences, oldest first (their pages
        // were taken at admission); a chunk runs whole or waits.
        for idx in 0..self.running.len() {
            let id = self.running[idx];
            let s = &self.seqs[&id];
            if s.decoding() {
                continue;
            }
            let chunk = self.chunk(s, s.computed);
            if chunk.len() > budget {
                continue;
            }
            budget -= chunk.len();
            step.prefill.push((id, chunk));
        }
        // Admission in order, while the head fits.
        while budget > 0 && self.running.len() < self.cfg.max_running {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            if step.preempted.contains(&id) {
                break;
            }
            let s = &self.seqs[&id];
            let need = self.pages_for(s.tokens) + self.cfg.watermark_pages;
            if need > self.free_pages && !self.running.is_empty() {
                break;
            }
            // Alone, a sequence is admitted whatever the watermark: it fits
            // the pool (checked by `add`). It takes the pages of all its
            // tokens now (cached ones too), so its chunks never wait for
            // pages, and one more for its first step where the cached
            // prefix ends inside a page (the copy it writes into); where
            // that one page does not fit, it computes that page's cached
            // tokens again instead. Its last token is computed whatever is
            // cached.
            let tokens = s.tokens;
            let mut start = cached(id).min(tokens - 1);
            let mut copies = !start.is_multiple_of(self.cfg.page_tokens);
            if copies && self.pages_for(tokens) + 1 > self.free_pages {
                start -= start % self.cfg.page_tokens;
                copies = false;
            }
            let chunk = self.chunk(&self.seqs[&id], start);
            if chunk.len() > budget || !self.grow(id, tokens, usize::from(copies)) {
                break;
            }
            let s = self.seqs.get_mut(&id).expect("scheduled");
            s.computed = start;
            s.copies = copies;
            self.waiting.pop_front();
            self.running.push(id);
            budget -= chunk.len();
            step.prefill.push((id, chunk));
        }
        step
    }

    /// After `step` ran: its tokens are in the caches, a sampled token was
    /// appended to each sequence whose last token it computed, unless the
    /// sequence is in `ended` (an end-of-generation token, a stop string,
    /// its client gone: its pages are freed). A sequence that reaches its
    /// `max_new` ends too. Returns the sequences that ended.
    pub fn complete(&mut self, step: &Step, ended: &[SeqId]) -> Vec<SeqId> {
        let mut done = Vec::new();
        let ran = step
            .decode
            .iter()
            .map(|&id| (id, None))
            .chain(step.prefill.iter().map(|(id, r)| (*id, Some(r.end))));
        for (id, end) in ran {
            let Some(s) = self.seqs.get_mut(&id) else {
                continue; // cancelled meanwhile
            };
            s.computed = end.unwrap_or(s.computed + 1);
            if s.copies {
                // The copy is made: the shared page is given back.
                s.copies = false;
                s.pages -= 1;
                self.free_pages += 1;
            }
            if s.computed == s.tokens {
                s.tokens += 1;
                s.generated += 1;
                if s.generated >= s.max_new || ended.contains(&id) {
                    done.push(id);
                }
            } else if ended.contains(&id) {
                done.push(id);
            }
        }
        for &id in ended {
            if !done.contains(&id) && self.seqs.contains_key(&id) {
                done.push(id);
            }
        }
        for &id in &done {
            self.cancel(id);
        }
        done
    }
}

#[cfg(test)]
mod tests;
