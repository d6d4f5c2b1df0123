//! The scheduling policy: see the crate's documentation.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use crate::kv::{Blocks, Found, KvManager, SeqKv};

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
    /// Keep full KV pages for later sequences that start with the same
    /// tokens ([`crate::PrefixCache`]).
    pub prefix_cache: bool,
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
    /// The KV pages of every sequence the step runs: its block table (the
    /// step's tokens' pages taken), and the copy it makes first.
    pub kv: HashMap<SeqId, SeqKv>,
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
    ids: Vec<u32>,
    /// Tokens in the KV cache (0 while waiting).
    computed: usize,
    /// Its pages (none while waiting).
    blocks: Blocks,
    /// New tokens sampled so far, and at most.
    generated: usize,
    max_new: usize,
    /// Its prompt runs in one chunk (an encoder's: every token attends to
    /// every other).
    whole: bool,
    /// It takes part in the prefix cache.
    cached: bool,
}

impl Seq {
    fn tokens(&self) -> usize {
        self.ids.len()
    }

    /// Decoding: it has sampled, and only that last token is to compute.
    fn decoding(&self) -> bool {
        self.generated > 0 && self.tokens() - self.computed == 1
    }
}

/// The state of continuous batching: sequences waiting and running, and the
/// KV pages they hold (the [`KvManager`]: the pool's one ledger).
///
/// A sequence takes the pages of its prompt when admitted (the prefix
/// cache's where it has them) and one more page each time its decoding
/// crosses a page boundary. Every step makes progress: a running sequence
/// alone always fits (`add` refuses one whose prompt and new tokens exceed
/// the pool), and all running decodes fit the token budget.
pub struct Scheduler {
    cfg: Config,
    seqs: HashMap<SeqId, Seq>,
    /// Waiting, in order of admission (preempted sequences first).
    waiting: VecDeque<SeqId>,
    /// Running, oldest admission first.
    running: Vec<SeqId>,
    kv: KvManager,
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
            kv: KvManager::new(cfg.pages, cfg.page_tokens, cfg.prefix_cache),
            cfg,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.cfg.page_tokens)
    }

    /// Queue a sequence with the tokens `prompt` that may sample `max_new`
    /// more. Refused when it could not run even alone. It takes part in the
    /// prefix cache (where the scheduler keeps one): its first tokens may
    /// come from cached pages, and its full pages are cached.
    pub fn add(&mut self, id: SeqId, prompt: &[u32], max_new: usize) -> Result<(), SchedError> {
        self.insert(id, prompt, max_new, false, true)
    }

    /// [`Scheduler::add`], for a sequence that takes no part in the prefix
    /// cache (an embedding's).
    pub fn add_private(
        &mut self,
        id: SeqId,
        prompt: &[u32],
        max_new: usize,
    ) -> Result<(), SchedError> {
        self.insert(id, prompt, max_new, false, false)
    }

    /// A sequence whose prompt is computed in one chunk, for its hidden
    /// states (an embedding: nothing is sampled, and an encoder's tokens
    /// attend to each other, so its prompt cannot be cut): it ends after
    /// that step.
    pub fn add_whole(&mut self, id: SeqId, prompt: &[u32]) -> Result<(), SchedError> {
        if prompt.len() > self.cfg.max_batch_tokens {
            return Err(SchedError::NotOneStep {
                id,
                prompt: prompt.len(),
                max: self.cfg.max_batch_tokens,
            });
        }
        self.insert(id, prompt, 0, true, false)
    }

    fn insert(
        &mut self,
        id: SeqId,
        ids: &[u32],
        max_new: usize,
        whole: bool,
        cached: bool,
    ) -> Result<(), SchedError> {
        if self.seqs.contains_key(&id) {
            return Err(SchedError::Duplicate(id));
        }
        let prompt = ids.len();
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
                ids: ids.to_vec(),
                computed: 0,
                blocks: Blocks::default(),
                generated: 0,
                max_new,
                whole,
                cached,
            },
        );
        self.waiting.push_back(id);
        Ok(())
    }

    /// Drop a sequence (its client went away), freeing its pages. False if
    /// it was not scheduled.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        let Some(mut s) = self.seqs.remove(&id) else {
            return false;
        };
        self.kv.release(&mut s.blocks);
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

    /// KV pages a sequence could take now: free ones, and cached ones no
    /// sequence uses.
    pub fn free_pages(&self) -> usize {
        self.kv.available()
    }

    /// The KV ledger: pages, the prefix cache and its hits.
    pub fn kv(&self) -> &KvManager {
        &self.kv
    }

    /// Pages `id` holds, if it is scheduled (a copy's source too, until the
    /// copy is made).
    pub fn pages_of(&self, id: SeqId) -> Option<usize> {
        self.seqs
            .get(&id)
            .map(|s| s.blocks.kv.pages.len() + usize::from(s.blocks.kv.copy.is_some()))
    }

    /// Take pages so that `id` holds `tokens` tokens; false (nothing taken)
    /// when too few are available.
    fn grow(&mut self, id: SeqId, tokens: usize) -> bool {
        let s = self.seqs.get_mut(&id).expect("scheduled");
        self.kv.grow(&mut s.blocks, tokens)
    }

    /// Free the newest running sequence's pages and queue it first.
    fn preempt_newest(&mut self, step: &mut Step) {
        let id = self.running.pop().expect("a running sequence to preempt");
        let s = self.seqs.get_mut(&id).expect("scheduled");
        self.kv.release(&mut s.blocks);
        s.computed = 0;
        self.waiting.push_front(id);
        step.preempted.push(id);
    }

    /// The chunk from `start` of a sequence of `tokens` tokens: to the
    /// next multiple of `chunk_tokens`, or its end.
    fn chunk(&self, s: &Seq, start: usize) -> Range<usize> {
        if s.whole {
            return start..s.tokens();
        }
        let c = self.cfg.chunk_tokens;
        start..s.tokens().min((start / c + 1) * c)
    }

    /// The next step: the pages its tokens need are taken, and each
    /// sequence's block table is in [`Step::kv`] (see
    /// [`Scheduler::complete`] for what comes after).
    ///
    /// A sequence admitted with a cached prefix starts its first chunk
    /// where the prefix ends (or at the page boundary before it, when the
    /// partly shared page it would copy does not fit), so the step's budget
    /// counts only the tokens it computes.
    pub fn plan(&mut self) -> Step {
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
            if self.grow(id, want) {
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
            if step.preempted.contains(&id) || !self.admit(id, &mut budget, &mut step) {
                break;
            }
        }
        for &id in step
            .decode
            .iter()
            .chain(step.prefill.iter().map(|(id, _)| id))
        {
            step.kv.insert(id, self.seqs[&id].blocks.kv.clone());
        }
        step
    }

    /// Admit the waiting head `id` if its pages and first chunk fit; false
    /// (nothing changed) if not.
    ///
    /// Alone, a sequence is admitted whatever the watermark: it fits the
    /// pool (checked by `add`). It takes the pages of all its tokens now
    /// (cached ones too), so its chunks never wait for pages; where its
    /// cached prefix ends inside a page, it keeps that page until its first
    /// step has copied it, or, where that does not fit, computes that
    /// page's cached tokens again instead. Its last token is computed
    /// whatever is cached.
    fn admit(&mut self, id: SeqId, budget: &mut usize, step: &mut Step) -> bool {
        let s = &self.seqs[&id];
        let n = s.tokens();
        let found = if s.cached {
            self.kv.lookup(&s.ids[..n - 1])
        } else {
            Found::default()
        };
        let own = self.pages_for(n) - found.whole;
        let avail = self.kv.available() - found.whole_unused;
        let need = own
            + if self.running.is_empty() {
                0
            } else {
                self.cfg.watermark_pages
            };
        let part_cost = usize::from(found.part_unused);
        let with_part = found.part > 0 && need + part_cost <= avail;
        if need > avail {
            return false;
        }
        let start = found.whole * self.cfg.page_tokens + if with_part { found.part } else { 0 };
        let chunk = self.chunk(s, start);
        if chunk.len() > *budget {
            return false;
        }
        let s = self.seqs.get_mut(&id).expect("scheduled");
        let prompt = &s.ids[..n - 1];
        if !self
            .kv
            .admit(&mut s.blocks, prompt, n, found, with_part, s.cached)
        {
            return false;
        }
        s.computed = start;
        self.waiting.pop_front();
        self.running.push(id);
        *budget -= chunk.len();
        step.prefill.push((id, chunk));
        true
    }

    /// After `step` ran: its tokens are in the caches (its full pages are
    /// cached now, its copies made), and `sampled` has the token sampled
    /// for each sequence whose last token it computed, unless the sequence
    /// is in `ended` (an end-of-generation token, a stop string, its client
    /// gone: its pages are freed). A sequence that reaches its `max_new`
    /// ends too. Returns the sequences that ended.
    ///
    /// A sampled token not given is not known: the sequence caches no more
    /// pages (the prefix cache is keyed by tokens).
    pub fn complete(
        &mut self,
        step: &Step,
        sampled: &[(SeqId, u32)],
        ended: &[SeqId],
    ) -> Vec<SeqId> {
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
            self.kv.ran(&mut s.blocks, &s.ids, s.computed);
            if s.computed == s.tokens() {
                match sampled.iter().find(|(i, _)| *i == id) {
                    Some(&(_, t)) => s.ids.push(t),
                    None => {
                        s.ids.push(u32::MAX);
                        s.blocks.stop_caching();
                    }
                }
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
