//! The step loop: every generation of an [`crate::Engine`] runs here, on one
//! thread, in batched steps that m40-sched plans (continuous batching:
//! running decodes first, prompt chunks fill the rest of the token budget,
//! admission while KV pages last, preemption of the newest sequence when
//! they run out).
//!
//! A caller ([`crate::Engine::run`]) submits a sequence and reads its
//! sampled tokens from a channel; it detokenizes, applies stop strings and
//! streams on its own thread. The loop ends a sequence when it samples an
//! end-of-generation token or its last allowed one, when its caller
//! cancels or stops reading (a client gone: its pages are freed at the
//! next step), and closes its channel then.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use m40_chat::Constraint;
use m40_model::{
    apply_mask, AnyBackend, AnyCache, Backend, MaskFiller, MaskSlot, ModelError, SeqStep, StepOut,
    Want,
};
use m40_sched::{Config, Scheduler, SeqId, Step};
use m40_tokenizer::Tokenizer;

use crate::cancel::CancelToken;

mod route;
mod stats;
use crate::sampling::{Sampler, SamplingParams};
use stats::StepStats;

/// What the loop sends a sequence's caller.
pub(crate) enum SeqEvent {
    /// A sampled token, with the logits it was sampled from (before the
    /// penalties) when the request asked for logprobs.
    Token { id: u32, logits: Option<Vec<f32>> },
    /// The sequence could not run (it was refused, or a step failed).
    Failed(Arc<ModelError>),
    /// Its structured output is complete: nothing else may follow.
    Complete,
    /// The final hidden states of the next of its prompt's tokens (rows of
    /// n_embd), for an embedding ([`Submission::hidden`]).
    Hidden(Vec<f32>),
    /// The engine is going away (its loop ends before the sequence does).
    Stopped,
}

/// A sequence whose structured output's constraint failed.
fn constraint_failed(e: String) -> Arc<ModelError> {
    Arc::new(ModelError::Unsupported(format!(
        "the structured output's constraint failed: {e}"
    )))
}

/// A sequence to generate.
pub(crate) struct Submission {
    pub prompt: Vec<u32>,
    /// New tokens at most (at least 1).
    pub max_new: usize,
    pub sampling: SamplingParams,
    pub logprobs: bool,
    /// Added to these tokens' logits before sampling (OpenAI's
    /// `logit_bias`); the row is then sampled on the host.
    pub logit_bias: Vec<(u32, f32)>,
    /// Run on past end-of-generation tokens (to `max_new`).
    pub ignore_eos: bool,
    /// A structured output's grammar: each token is sampled from those it
    /// allows, and the sequence ends when it is complete.
    pub constraint: Option<Constraint>,
    /// An embedding's sequence: its prompt's hidden states come back
    /// ([`SeqEvent::Hidden`]) and nothing is sampled; an encoder's prompt
    /// runs in one step. It takes no part in the prefix cache (an
    /// encoder's keys depend on the tokens after them).
    pub hidden: bool,
    /// A context shift (`Request::shift`): when its tokens fill this
    /// context, it keeps the first `SHIFT_KEEP`, drops the older half of
    /// the rest and is computed again from what is left.
    pub shift: Option<usize>,
    pub cancel: CancelToken,
    pub events: flume::Sender<SeqEvent>,
}

/// The loop's limits.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    /// Tokens a step runs at most.
    pub max_batch_tokens: usize,
    /// Sequences running at once at most.
    pub parallel: usize,
    pub page_tokens: usize,
    pub pages: usize,
    /// Keep full KV pages for later requests that start with the same
    /// tokens.
    pub prefix_cache: bool,
    /// Log the step timings every N steps.
    pub step_stats: Option<usize>,
}

/// Counters the loop keeps for [`crate::Engine::activity`].
#[derive(Default)]
struct Counters {
    waiting: AtomicUsize,
    running: AtomicUsize,
    pages_used: AtomicUsize,
    steps: AtomicU64,
    step_tokens: AtomicU64,
    preemptions: AtomicU64,
    prefix_pages: AtomicUsize,
    prefix_hits: AtomicU64,
    prefix_tokens: AtomicU64,
}

/// What an engine is doing now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Load {
    /// Sequences queued for admission.
    pub waiting: usize,
    /// Sequences admitted (holding KV pages).
    pub running: usize,
    /// Copies of the model, each with its own step loop and KV pool
    /// (`EngineOptions::replicas`); 1 without.
    pub replicas: usize,
    /// Steps each replica runs at once: a split model's stages work on
    /// different steps (`EngineOptions::steps_in_flight`), each with its
    /// own sequences and a share of the KV pool; 1 otherwise.
    pub steps_in_flight: usize,
    /// Sequences running at once at most (`EngineOptions::parallel`).
    pub parallel: usize,
    /// Tokens a step runs at most (`EngineOptions::max_batch_tokens`).
    pub max_batch_tokens: usize,
    /// KV pages held by sequences, and in the pool.
    pub kv_pages_used: usize,
    pub kv_pages: usize,
    /// Tokens per KV page.
    pub kv_page_tokens: usize,
    /// Steps run and the tokens they ran, since the engine started.
    pub steps: u64,
    pub step_tokens: u64,
    /// Sequences preempted (their pages freed, computed again later).
    pub preemptions: u64,
    /// Full KV pages kept by the prefix cache (used by a sequence or not).
    pub prefix_cached_pages: usize,
    /// Requests that started with cached pages, and the prompt tokens
    /// those pages held (not computed again).
    pub prefix_hits: u64,
    pub prefix_tokens_saved: u64,
}

struct Inbox {
    new: Vec<Submission>,
    shutdown: bool,
}

struct Shared {
    inbox: Mutex<Inbox>,
    wake: Condvar,
    counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The step loops (one per replica) and their inboxes; dropping it ends
/// the loops (sequences still running are dropped: their callers see their
/// channels close).
pub(crate) struct Batcher {
    lanes: Vec<Lane>,
}

/// What one step loop runs: which of the core's backends, with what
/// limits, on which pages of that backend's pool (`page_offset` and the
/// `limits.pages` after it): a replica has a backend to itself; a split
/// model's several steps in flight share one, each on its own pages.
pub(crate) struct LaneSpec {
    pub backend: usize,
    pub limits: Limits,
    pub page_offset: u32,
}

/// One step loop: its thread, its inbox and counters, and the first pages
/// of the prompts sent to it (where their prefix cache may be).
struct Lane {
    /// Which of the core's backends it runs.
    backend: usize,
    shared: Arc<Shared>,
    limits: Limits,
    thread: Option<JoinHandle<()>>,
    recent: route::Recent,
}

/// What the loops need of the engine.
pub(crate) struct Core {
    /// The model's backend, or one replica per GPU (`EngineOptions::
    /// replicas`), each run by its own step loop.
    pub backends: Vec<AnyBackend>,
    pub tokenizer: Tokenizer,
}

impl Core {
    /// The first replica's backend (the only one without replicas): what
    /// the engine asks of the model's shape.
    pub fn backend(&self) -> &AnyBackend {
        &self.backends[0]
    }
}

impl Batcher {
    /// A loop per lane of `lanes` (each names its backend in `core`).
    pub fn start(core: Arc<Core>, lanes: Vec<LaneSpec>) -> std::io::Result<Batcher> {
        let mut out = Vec::with_capacity(lanes.len());
        for (i, spec) in lanes.into_iter().enumerate() {
            assert!(spec.backend < core.backends.len(), "a lane's backend");
            let shared = Arc::new(Shared {
                inbox: Mutex::new(Inbox {
                    new: Vec::new(),
                    shutdown: false,
                }),
                wake: Condvar::new(),
                counters: Counters::default(),
            });
            let (s, c, l) = (shared.clone(), core.clone(), spec.limits.clone());
            let name = match i {
                0 => "m40-steps".to_string(),
                i => format!("m40-steps-{i}"),
            };
            let (backend, offset) = (spec.backend, spec.page_offset);
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || Loop::new(c, backend, offset, s, l).run())?;
            out.push(Lane {
                backend,
                shared,
                limits: spec.limits,
                thread: Some(thread),
                recent: route::Recent::default(),
            });
        }
        Ok(Batcher { lanes: out })
    }

    pub fn submit(&self, sub: Submission) {
        self.submit_all(vec![sub]);
    }

    /// Several sequences at once: the loop sees all of them before its
    /// next step (an embedding request's inputs run together), on one
    /// replica ([`Batcher::pick`]'s for the first).
    pub fn submit_all(&self, subs: Vec<Submission>) {
        let Some(first) = subs.first() else { return };
        let lane = &self.lanes[self.pick(&first.prompt)];
        let n = subs.len();
        lane.shared.counters.waiting.fetch_add(n, Ordering::SeqCst);
        lock(&lane.shared.inbox).new.extend(subs);
        lane.shared.wake.notify_one();
    }

    /// The replica a new sequence runs on (it stays there: its pages are
    /// there): [`route::choose`] by the sequences each has waiting and
    /// running and whether it was sent a prompt with the same first page.
    fn pick(&self, prompt: &[u32]) -> usize {
        if self.lanes.len() == 1 {
            return 0;
        }
        let loads: Vec<usize> = self.lanes.iter().map(Lane::load).collect();
        let key = route::first_page(prompt, self.lanes[0].limits.page_tokens);
        let seen = |i: usize| key.is_some_and(|k| self.lanes[i].recent.contains(k));
        let pick = route::choose(&loads, seen);
        if let Some(k) = key {
            self.lanes[pick].recent.note(k);
        }
        pick
    }

    /// What every loop is doing, added up (the sequences a step takes and
    /// a page's tokens: the first replica's).
    pub fn load(&self) -> Load {
        let mut total = Load::default();
        for lane in &self.lanes {
            let c = &lane.shared.counters;
            let l = &lane.limits;
            total.waiting += c.waiting.load(Ordering::SeqCst);
            total.running += c.running.load(Ordering::SeqCst);
            total.parallel += l.parallel;
            total.max_batch_tokens = total.max_batch_tokens.max(l.max_batch_tokens);
            total.kv_pages_used += c.pages_used.load(Ordering::SeqCst);
            total.kv_pages += l.pages;
            total.steps += c.steps.load(Ordering::Relaxed);
            total.step_tokens += c.step_tokens.load(Ordering::Relaxed);
            total.preemptions += c.preemptions.load(Ordering::Relaxed);
            total.prefix_cached_pages += c.prefix_pages.load(Ordering::Relaxed);
            total.prefix_hits += c.prefix_hits.load(Ordering::Relaxed);
            total.prefix_tokens_saved += c.prefix_tokens.load(Ordering::Relaxed);
        }
        total.kv_page_tokens = self.lanes[0].limits.page_tokens;
        total.replicas = self.replica_loads().len();
        total.steps_in_flight = self.lanes.len() / total.replicas.max(1);
        total
    }

    /// Each replica's sequences waiting and running (over its lanes).
    pub fn replica_loads(&self) -> Vec<usize> {
        let n = self.lanes.iter().map(|l| l.backend + 1).max().unwrap_or(0);
        let mut loads = vec![0; n];
        for l in &self.lanes {
            loads[l.backend] += l.load();
        }
        loads
    }
}

impl Lane {
    /// Its sequences waiting and running.
    fn load(&self) -> usize {
        let c = &self.shared.counters;
        c.waiting.load(Ordering::SeqCst) + c.running.load(Ordering::SeqCst)
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        for lane in &self.lanes {
            lock(&lane.shared.inbox).shutdown = true;
            lane.shared.wake.notify_one();
        }
        for lane in &mut self.lanes {
            if let Some(t) = lane.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// A sequence in the loop.
struct Live {
    sub: Submission,
    /// The prompt, then every sampled token.
    tokens: Vec<u32>,
    sampler: Sampler,
    /// The submission's grammar, taken out of it (it changes each token).
    constraint: Option<Constraint>,
    /// Tokens sampled so far (a shift drops some of `tokens`).
    generated: usize,
}

struct Loop {
    core: Arc<Core>,
    /// Which of the core's backends it runs.
    replica: usize,
    /// Where its pages start in that backend's pool.
    page_offset: u32,
    shared: Arc<Shared>,
    sched: Scheduler,
    live: HashMap<SeqId, Live>,
    next_id: SeqId,
    /// `EngineOptions::step_stats`: every N steps, the mean time a step spends
    /// planning, preparing, in the backend and after, to stderr.
    stats: Option<StepStats>,
}

impl Loop {
    fn new(
        core: Arc<Core>,
        replica: usize,
        page_offset: u32,
        shared: Arc<Shared>,
        l: Limits,
    ) -> Loop {
        let sched = Scheduler::new(Config {
            max_batch_tokens: l.max_batch_tokens,
            max_running: l.parallel,
            page_tokens: l.page_tokens,
            pages: l.pages,
            // Room for the running sequences to grow (vLLM keeps 1%).
            watermark_pages: (l.pages / 100).max(1),
            // As large as fits beside every running decode (the scheduler
            // lowers it to that).
            chunk_tokens: l.max_batch_tokens,
            prefix_cache: l.prefix_cache,
        });
        Loop {
            core,
            replica,
            page_offset,
            shared,
            sched,
            live: HashMap::new(),
            next_id: 0,
            stats: l.step_stats.map(StepStats::every),
        }
    }

    fn run(mut self) {
        let mut mark = std::time::Instant::now();
        loop {
            let new = {
                let mut inbox = lock(&self.shared.inbox);
                while inbox.new.is_empty() && self.live.is_empty() && !inbox.shutdown {
                    inbox = self
                        .shared
                        .wake
                        .wait(inbox)
                        .unwrap_or_else(|e| e.into_inner());
                }
                if inbox.shutdown {
                    for sub in std::mem::take(&mut inbox.new) {
                        let _ = sub.events.send(SeqEvent::Stopped);
                    }
                    for l in self.live.values() {
                        let _ = l.sub.events.send(SeqEvent::Stopped);
                    }
                    return;
                }
                std::mem::take(&mut inbox.new)
            };
            let woke = std::time::Instant::now();
            for sub in new {
                self.admit(sub);
            }
            self.drop_cancelled();
            if self.live.is_empty() {
                self.publish();
                continue;
            }
            let step = self.sched.plan();
            let planned = std::time::Instant::now();
            if !step.preempted.is_empty() {
                let c = &self.shared.counters;
                c.preemptions
                    .fetch_add(step.preempted.len() as u64, Ordering::Relaxed);
            }
            self.publish();
            if step.is_empty() {
                // Only possible while every sequence waits for pages that
                // a preemption just freed: plan again.
                continue;
            }
            let (t, rows) = self.run_step(&step);
            self.publish();
            let done = std::time::Instant::now();
            if let Some(s) = &mut self.stats {
                let secs = |a: std::time::Instant, b: std::time::Instant| (b - a).as_secs_f64();
                let seqs = step.decode.len() + step.prefill.len();
                s.add(
                    rows,
                    seqs,
                    [
                        secs(mark, woke),
                        secs(woke, planned),
                        secs(planned, t[0]),
                        secs(t[0], t[1]),
                        secs(t[1], done),
                    ],
                );
            }
            mark = done;
        }
    }

    fn backend(&self) -> &AnyBackend {
        &self.core.backends[self.replica]
    }

    fn admit(&mut self, sub: Submission) {
        let id = self.next_id;
        self.next_id += 1;
        let max_new = sub.max_new.max(1);
        let n = sub.prompt.len();
        // A shifting sequence is scheduled to its context's end; past it, it
        // starts over (`shift`).
        let max_new = match sub.shift {
            Some(ctx) => max_new.min(ctx.saturating_sub(n)).max(1),
            None => max_new,
        };
        let added = match (sub.hidden, self.backend().hparams().causal) {
            (false, _) => self.sched.add(id, &sub.prompt, max_new),
            (true, true) => self.sched.add_private(id, &sub.prompt, 0),
            (true, false) => self.sched.add_whole(id, &sub.prompt),
        };
        if let Err(e) = added {
            let _ = sub
                .events
                .send(SeqEvent::Failed(Arc::new(ModelError::Unsupported(
                    format!("this request cannot run: {e}"),
                ))));
            self.shared.counters.waiting.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let mut sampler = Sampler::new(sub.sampling.clone());
        for &t in &sub.prompt {
            sampler.accept(t);
        }
        let mut sub = sub;
        let constraint = sub.constraint.take();
        self.live.insert(
            id,
            Live {
                tokens: sub.prompt.clone(),
                sub,
                sampler,
                constraint,
                generated: 0,
            },
        );
    }

    /// `id`'s tokens fill its context (the scheduler has ended it): it
    /// keeps its first `SHIFT_KEEP` tokens and the newer half of the rest,
    /// and waits to be computed again from them, to go on sampling.
    fn shift(&mut self, id: SeqId) {
        let Some(l) = self.live.get_mut(&id) else {
            return;
        };
        let (Some(ctx), n) = (l.sub.shift, l.tokens.len()) else {
            return;
        };
        let keep = crate::request::SHIFT_KEEP.min(l.sub.prompt.len());
        let discard = (n - keep) / 2;
        l.tokens.drain(keep..keep + discard);
        let left = l.sub.max_new - l.generated;
        let room = ctx.saturating_sub(l.tokens.len()).min(left).max(1);
        if let Err(e) = self.sched.add(id, &l.tokens, room) {
            let e = Arc::new(ModelError::Unsupported(format!(
                "this request cannot go on after its context shift: {e}"
            )));
            if let Some(l) = self.remove(id) {
                let _ = l.sub.events.send(SeqEvent::Failed(e));
            }
        }
    }

    /// `id` leaves (the scheduler has let its pages go).
    fn remove(&mut self, id: SeqId) -> Option<Live> {
        self.live.remove(&id)
    }

    /// Sequences whose caller cancelled (or went away) leave, freeing
    /// their pages.
    fn drop_cancelled(&mut self) {
        let gone: Vec<SeqId> = self
            .live
            .iter()
            .filter(|(_, l)| l.sub.cancel.is_cancelled())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.sched.cancel(id);
            self.remove(id);
        }
    }

    fn publish(&self) {
        let c = &self.shared.counters;
        let (waiting, running) = self.sched.counts();
        let queued = lock(&self.shared.inbox).new.len();
        c.waiting.store(waiting + queued, Ordering::SeqCst);
        c.running.store(running, Ordering::SeqCst);
        let kv = self.sched.kv();
        c.pages_used
            .store(kv.pages() - kv.available(), Ordering::SeqCst);
        c.prefix_pages.store(kv.cached(), Ordering::Relaxed);
        let (hits, saved) = kv.prefix_hits();
        c.prefix_hits.store(hits, Ordering::Relaxed);
        c.prefix_tokens.store(saved, Ordering::Relaxed);
    }

    /// Run `step`, sample where it computed a sequence's last token, and
    /// end the sequences that are done.
    /// Returns when the backend started and returned, and the tokens it
    /// computed (a cached prefix's are not).
    fn run_step(&mut self, step: &Step) -> ([std::time::Instant; 2], usize) {
        let backend = &self.core.backends[self.replica];
        let max_k = backend.select_max_k();
        // (id, the step's tokens, want, whether it samples), in step order.
        let mut parts: Vec<(SeqId, Vec<u32>, Want, bool)> = Vec::new();
        let mut caches: Vec<AnyCache> = Vec::new();
        let mut failed: Vec<(SeqId, Arc<ModelError>)> = Vec::new();
        // The masks of the constrained sequences that sample, filled by
        // the mask thread.
        let mut slots: HashMap<SeqId, MaskSlot> = HashMap::new();
        let ranges = step
            .decode
            .iter()
            .map(|&id| (id, None))
            .chain(step.prefill.iter().map(|(id, r)| (*id, Some(r.clone()))));
        for (id, range) in ranges {
            let Some(l) = self.live.get_mut(&id) else {
                continue;
            };
            let range = range.unwrap_or(l.tokens.len() - 1..l.tokens.len());
            let cap = match l.sub.shift {
                Some(ctx) => ctx.min(l.sub.prompt.len() + l.sub.max_new.max(1)),
                None => l.sub.prompt.len() + l.sub.max_new.max(1),
            };
            // Its pages as the plan gives them; what came before the
            // chunk is in them (a cached prefix's tokens too).
            let kv = &step.kv[&id];
            let off = self.page_offset;
            let pages = kv.pages.iter().map(|p| p + off).collect();
            let copy = kv.copy.map(|(a, b)| (a + off, b + off));
            let made = backend.cache_on(pages, copy, range.start, cap);
            let cache = match made {
                Ok(c) => c,
                Err(e) => {
                    failed.push((id, Arc::new(e)));
                    continue;
                }
            };
            let samples = range.end == l.tokens.len() && !l.sub.hidden;
            let mut want = if l.sub.hidden {
                Want::Hidden
            } else if !samples {
                Want::Nothing
            } else {
                let host = l.sub.logprobs || !l.sub.logit_bias.is_empty();
                match (host, l.sampler.selection(max_k)) {
                    (false, Some(sel)) => Want::Select(sel),
                    _ => Want::Logits,
                }
            };
            if samples && l.constraint.is_some() {
                // Its mask is computed while the step runs; the backend
                // waits for it just before the selection.
                let slot = MaskSlot::new();
                if let Want::Select(sel) = &mut want {
                    sel.mask = Some(slot.clone());
                }
                slots.insert(id, slot);
            }
            parts.push((id, l.tokens[range].to_vec(), want, samples));
            caches.push(cache);
        }
        let mut steps: Vec<SeqStep<'_, AnyCache>> = caches
            .iter_mut()
            .zip(&parts)
            .map(|(cache, (_, tokens, want, _))| SeqStep {
                cache,
                tokens,
                want: want.clone(),
            })
            .collect();
        let c = &self.shared.counters;
        c.steps.fetch_add(1, Ordering::Relaxed);
        // The tokens computed (a cached prefix's are not).
        let ran: usize = parts.iter().map(|(_, t, _, _)| t.len()).sum();
        c.step_tokens.fetch_add(ran as u64, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let live = &mut self.live;
        let result = std::thread::scope(|scope| {
            if !slots.is_empty() {
                // The constrained sequences' masks, on the host while the
                // device runs the step.
                let jobs: Vec<(&mut Constraint, MaskFiller)> = live
                    .iter_mut()
                    .filter_map(|(id, l)| Some((l.constraint.as_mut()?, slots.get(id)?.filler())))
                    .collect();
                scope.spawn(move || {
                    for (c, filler) in jobs {
                        let m = c.mask().map(|m| Arc::new(m.into_words()));
                        filler.fill(m.map_err(|e| e.to_string()));
                    }
                });
            }
            backend.forward_batch(&mut steps)
        });
        let returned = std::time::Instant::now();
        drop(steps);
        drop(caches);
        let mut ended: Vec<SeqId> = Vec::new();
        // The tokens sampled, for the scheduler (its prefix cache keys
        // pages by their tokens).
        let mut sampled: Vec<(SeqId, u32)> = Vec::new();
        // Sequences whose tokens fill their context and that go on.
        let mut shifts: Vec<SeqId> = Vec::new();
        match result {
            Ok(outs) => {
                for ((id, _, _, samples), out) in parts.iter().zip(outs) {
                    let l = self.live.get_mut(id).expect("live");
                    if let StepOut::Hidden(rows) = out {
                        // It ends after its prompt's last chunk (the
                        // scheduler's complete), or now if its caller left.
                        if l.sub.events.send(SeqEvent::Hidden(rows)).is_err() {
                            ended.push(*id);
                        }
                        continue;
                    }
                    if !samples {
                        continue;
                    }
                    let mask = match slots.get(id).map(MaskSlot::wait) {
                        Some(Err(e)) => {
                            failed.push((*id, constraint_failed(e)));
                            continue;
                        }
                        m => m.and_then(Result::ok),
                    };
                    let (tok, logits) = match out {
                        StepOut::Logits(mut logits) => {
                            let raw = l.sub.logprobs.then(|| logits.clone());
                            for &(id, bias) in &l.sub.logit_bias {
                                if let Some(x) = logits.get_mut(id as usize) {
                                    *x += bias;
                                }
                            }
                            if let Some(m) = &mask {
                                apply_mask(m, &mut logits);
                            }
                            (l.sampler.sample(&mut logits), raw)
                        }
                        StepOut::Top(top) => (l.sampler.sample_selected(&top), None),
                        StepOut::Nothing | StepOut::Hidden(_) => {
                            unreachable!("a sampled sequence asked for logits")
                        }
                    };
                    let eog = self.core.tokenizer.is_eog(tok);
                    let mut complete = false;
                    if let Some(c) = &mut l.constraint {
                        if !eog {
                            if let Err(e) = c.accept(tok) {
                                failed.push((*id, constraint_failed(e.to_string())));
                                continue;
                            }
                        }
                        complete = c.is_done();
                    }
                    l.tokens.push(tok);
                    sampled.push((*id, tok));
                    l.generated += 1;
                    let mut gone = l
                        .sub
                        .events
                        .send(SeqEvent::Token { id: tok, logits })
                        .is_err();
                    if complete && !eog {
                        gone |= l.sub.events.send(SeqEvent::Complete).is_err();
                    }
                    let end = eog && (!l.sub.ignore_eos || l.constraint.is_some());
                    if gone || end || complete || l.generated >= l.sub.max_new {
                        ended.push(*id);
                    } else if l.sub.shift.is_some_and(|ctx| l.tokens.len() >= ctx) {
                        shifts.push(*id);
                    }
                }
            }
            Err(e) => {
                // A step that fails fails its sequences; the others go on.
                let e = Arc::new(e);
                for (id, _, _, _) in &parts {
                    failed.push((*id, e.clone()));
                }
            }
        }
        for (id, e) in failed {
            if let Some(l) = self.remove(id) {
                let _ = l.sub.events.send(SeqEvent::Failed(e));
            }
            self.sched.cancel(id);
        }
        for id in self.sched.complete(step, &sampled, &ended) {
            if shifts.contains(&id) {
                self.shift(id);
            } else {
                self.remove(id);
            }
        }
        ([started, returned], ran)
    }
}
