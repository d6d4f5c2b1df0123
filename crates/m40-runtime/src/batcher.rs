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
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use m40_model::{AnyBackend, AnyCache, Backend, KvState, ModelError, SeqStep, StepOut, Want};
use m40_sched::{Config, Scheduler, SeqId, Step};
use m40_tokenizer::Tokenizer;

use crate::engine::CancelToken;
use crate::sampling::{Sampler, SamplingParams};

/// What the loop sends a sequence's caller.
pub(crate) enum SeqEvent {
    /// A sampled token, with the logits it was sampled from (before the
    /// penalties) when the request asked for logprobs.
    Token { id: u32, logits: Option<Vec<f32>> },
    /// The sequence could not run (it was refused, or a step failed).
    Failed(Arc<ModelError>),
}

/// A sequence to generate.
pub(crate) struct Submission {
    pub prompt: Vec<u32>,
    /// New tokens at most (at least 1).
    pub max_new: usize,
    pub sampling: SamplingParams,
    pub logprobs: bool,
    pub cancel: CancelToken,
    pub events: mpsc::Sender<SeqEvent>,
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
}

/// What an engine is doing now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Load {
    /// Sequences queued for admission.
    pub waiting: usize,
    /// Sequences admitted (holding KV pages).
    pub running: usize,
    /// Sequences running at once at most (`EngineOptions::parallel`).
    pub parallel: usize,
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

/// The loop's thread and its inbox; dropping it ends the loop (sequences
/// still running are dropped: their callers see their channels close).
pub(crate) struct Batcher {
    shared: Arc<Shared>,
    limits: Limits,
    thread: Option<JoinHandle<()>>,
}

/// What the loop needs of the engine.
pub(crate) struct Core {
    pub backend: AnyBackend,
    pub tokenizer: Tokenizer,
}

impl Batcher {
    pub fn start(core: Arc<Core>, limits: Limits) -> std::io::Result<Batcher> {
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox {
                new: Vec::new(),
                shutdown: false,
            }),
            wake: Condvar::new(),
            counters: Counters::default(),
        });
        let (s, l) = (shared.clone(), limits.clone());
        let thread = std::thread::Builder::new()
            .name("m40-steps".into())
            .spawn(move || Loop::new(core, s, l).run())?;
        Ok(Batcher {
            shared,
            limits,
            thread: Some(thread),
        })
    }

    pub fn submit(&self, sub: Submission) {
        self.shared.counters.waiting.fetch_add(1, Ordering::SeqCst);
        lock(&self.shared.inbox).new.push(sub);
        self.shared.wake.notify_one();
    }

    pub fn load(&self) -> Load {
        let c = &self.shared.counters;
        Load {
            waiting: c.waiting.load(Ordering::SeqCst),
            running: c.running.load(Ordering::SeqCst),
            parallel: self.limits.parallel,
            kv_pages_used: c.pages_used.load(Ordering::SeqCst),
            kv_pages: self.limits.pages,
            kv_page_tokens: self.limits.page_tokens,
            steps: c.steps.load(Ordering::Relaxed),
            step_tokens: c.step_tokens.load(Ordering::Relaxed),
            preemptions: c.preemptions.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        lock(&self.shared.inbox).shutdown = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A sequence in the loop.
struct Live {
    sub: Submission,
    /// The prompt, then every sampled token.
    tokens: Vec<u32>,
    /// None while waiting (before admission, after a preemption).
    cache: Option<AnyCache>,
    sampler: Sampler,
}

struct Loop {
    core: Arc<Core>,
    shared: Arc<Shared>,
    sched: Scheduler,
    live: HashMap<SeqId, Live>,
    next_id: SeqId,
}

impl Loop {
    fn new(core: Arc<Core>, shared: Arc<Shared>, l: Limits) -> Loop {
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
        });
        Loop {
            core,
            shared,
            sched,
            live: HashMap::new(),
            next_id: 0,
        }
    }

    fn run(mut self) {
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
                    return;
                }
                std::mem::take(&mut inbox.new)
            };
            for sub in new {
                self.admit(sub);
            }
            self.drop_cancelled();
            if self.live.is_empty() {
                self.publish();
                continue;
            }
            let step = self.sched.plan();
            if !step.preempted.is_empty() {
                let c = &self.shared.counters;
                c.preemptions
                    .fetch_add(step.preempted.len() as u64, Ordering::Relaxed);
            }
            for id in &step.preempted {
                if let Some(l) = self.live.get_mut(id) {
                    l.cache = None;
                }
            }
            self.publish();
            if step.is_empty() {
                // Only possible while every sequence waits for pages that
                // a preemption just freed: plan again.
                continue;
            }
            self.run_step(&step);
            self.publish();
        }
    }

    fn admit(&mut self, sub: Submission) {
        let id = self.next_id;
        self.next_id += 1;
        let max_new = sub.max_new.max(1);
        if let Err(e) = self.sched.add(id, sub.prompt.len(), max_new) {
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
        self.live.insert(
            id,
            Live {
                tokens: sub.prompt.clone(),
                sub,
                cache: None,
                sampler,
            },
        );
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
            self.live.remove(&id);
        }
    }

    fn publish(&self) {
        let c = &self.shared.counters;
        let (waiting, running) = self.sched.counts();
        let queued = lock(&self.shared.inbox).new.len();
        c.waiting.store(waiting + queued, Ordering::SeqCst);
        c.running.store(running, Ordering::SeqCst);
        let free = self.sched.free_pages();
        c.pages_used
            .store(self.limits_pages().saturating_sub(free), Ordering::SeqCst);
    }

    fn limits_pages(&self) -> usize {
        self.sched.pages()
    }

    /// Run `step`, sample where it computed a sequence's last token, and
    /// end the sequences that are done.
    fn run_step(&mut self, step: &Step) {
        let backend = &self.core.backend;
        let max_k = backend.select_max_k();
        // (id, the step's tokens, want, whether it samples), in step order.
        let mut parts: Vec<(SeqId, Vec<u32>, Want, bool)> = Vec::new();
        let mut caches: Vec<AnyCache> = Vec::new();
        let mut failed: Vec<(SeqId, Arc<ModelError>)> = Vec::new();
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
            let cache = match l.cache.take() {
                Some(c) => c,
                None => match backend.new_cache(l.sub.prompt.len() + l.sub.max_new.max(1)) {
                    Ok(c) => c,
                    Err(e) => {
                        failed.push((id, Arc::new(e)));
                        continue;
                    }
                },
            };
            debug_assert_eq!(cache.len(), range.start, "the cache holds what came before");
            let samples = range.end == l.tokens.len();
            let want = if !samples {
                Want::Nothing
            } else {
                match (l.sub.logprobs, l.sampler.selection(max_k)) {
                    (false, Some(sel)) => Want::Select(sel),
                    _ => Want::Logits,
                }
            };
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
        c.step_tokens
            .fetch_add(step.tokens() as u64, Ordering::Relaxed);
        let result = backend.forward_batch(&mut steps);
        drop(steps);
        let mut ended: Vec<SeqId> = Vec::new();
        match result {
            Ok(outs) => {
                for (((id, _, _, samples), cache), out) in parts.iter().zip(caches).zip(outs) {
                    let l = self.live.get_mut(id).expect("live");
                    l.cache = Some(cache);
                    if !samples {
                        continue;
                    }
                    let (tok, logits) = match out {
                        StepOut::Logits(mut logits) => {
                            let raw = l.sub.logprobs.then(|| logits.clone());
                            (l.sampler.sample(&mut logits), raw)
                        }
                        StepOut::Top(top) => (l.sampler.sample_selected(&top), None),
                        StepOut::Nothing => unreachable!("a sampled sequence asked for logits"),
                    };
                    l.tokens.push(tok);
                    let gone = l
                        .sub
                        .events
                        .send(SeqEvent::Token { id: tok, logits })
                        .is_err();
                    if gone || self.core.tokenizer.is_eog(tok) {
                        ended.push(*id);
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
            if let Some(l) = self.live.remove(&id) {
                let _ = l.sub.events.send(SeqEvent::Failed(e));
            }
            self.sched.cancel(id);
        }
        for id in self.sched.complete(step, &ended) {
            self.live.remove(&id);
        }
    }
}
