//! m40-sched: which sequences each forward step runs.
//!
//! Continuous batching as a policy, apart from any backend: sequences
//! arrive with a prompt and a limit of new tokens, and each step
//! ([`Scheduler::plan`]) says which of them decode one token, which prompt
//! chunks run, and which sequences are preempted to make room. The caller
//! runs the step (one forward over all of it), samples, and reports which
//! sequences ended ([`Scheduler::complete`]).
//!
//! The policy (issue 33, "Policy"):
//! - a token budget per step; running decodes first, prompt chunks fill the
//!   rest, so a long prompt never stalls running streams for more than one
//!   chunk; chunks are cut at fixed multiples and run whole, so a prompt is
//!   computed in the same pieces whatever runs beside it;
//! - admission in arrival order (FIFO: the head of the queue is never
//!   passed over, so no sequence starves) while the free KV pages cover its
//!   prompt plus a watermark, and while fewer than `max_running` run;
//! - when the pages run dry mid-decode, the newest running sequence is
//!   preempted: its pages are freed and it waits, first in line, to be
//!   computed again from its prompt and the tokens it had generated (no
//!   token is lost or repeated: the caller keeps them).
//!
//! The KV pool's one ledger is the scheduler's ([`KvManager`]): which
//! pages are free, each sequence's block table, the prefix cache and the
//! copies a step makes. [`PrefixCache`] keys full KV pages by their tokens
//! and all before them (a sequence takes the longest match, the last page
//! in part), counts their users, and keeps unused ones until an allocation
//! needs them (least recently used first out). A step's plan carries every
//! sequence's pages ([`Step::kv`]); a backend only executes it.
//! m40-runtime's step loop (`batcher.rs`) plans every step of an `Engine`
//! here.

mod kv;
mod policy;
mod prefix;

pub use kv::{KvManager, SeqKv};
pub use policy::{Config, SchedError, Scheduler, SeqId, Step};
pub use prefix::{page_key, CachedPrefix, PageKey, PrefixCache};
