//! `/metrics` in Prometheus' text format: requests, tokens in and out, queue
//! depth, requests running, KV cache use, time-to-first-token and inter-token
//! latency histograms.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use m40_runtime::{Engine, Load};

use crate::slot::Slot;
use crate::AppState;

/// An engine's gauge: name, kind, help, and how to read it from its load.
type Gauge = (&'static str, &'static str, &'static str, fn(&Load) -> u64);

/// Bucket upper bounds in seconds.
const TTFT_BUCKETS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
const ITL_BUCKETS: [f64; 10] = [0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0];

/// Counters shared by every request (cheap to clone).
#[derive(Clone, Default)]
pub struct Metrics(Arc<Counters>);

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    running: AtomicU64,
    kv_tokens: AtomicU64,
    ttft: Histogram<10>,
    itl: Histogram<10>,
}

struct Histogram<const N: usize> {
    counts: [AtomicU64; N],
    count: AtomicU64,
    /// Microseconds.
    sum_us: AtomicU64,
}

impl<const N: usize> Default for Histogram<N> {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl<const N: usize> Histogram<N> {
    fn observe(&self, bounds: &[f64; N], d: Duration) {
        let s = d.as_secs_f64();
        for (c, &b) in self.counts.iter().zip(bounds) {
            if s <= b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, help: &str, bounds: &[f64; N]) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(bounds) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{b}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let n = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {n}");
    }
}

impl Metrics {
    pub(crate) fn started(&self, prompt_tokens: usize) {
        let c = &self.0;
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        c.running.fetch_add(1, Ordering::Relaxed);
        c.kv_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
    }

    pub(crate) fn first_token(&self, d: Duration) {
        self.0.ttft.observe(&TTFT_BUCKETS, d);
        self.0.kv_tokens.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn next_token(&self, d: Duration) {
        self.0.itl.observe(&ITL_BUCKETS, d);
        self.0.kv_tokens.fetch_add(1, Ordering::Relaxed);
    }

    /// A request ended after `generated` tokens; the `kv_held` tokens of
    /// its cache are freed with it.
    pub(crate) fn finished(&self, generated: usize, kv_held: usize) {
        let c = &self.0;
        c.generated_tokens
            .fetch_add(generated as u64, Ordering::Relaxed);
        c.running.fetch_sub(1, Ordering::Relaxed);
        c.kv_tokens.fetch_sub(kv_held as u64, Ordering::Relaxed);
    }

    /// The metrics: the server's, then each loaded model's engine,
    /// labelled with the model's name.
    fn text(&self, loaded: &[(Arc<Slot>, Arc<Engine>)]) -> String {
        let c = &self.0;
        let mut out = String::new();
        fn scalar(out: &mut String, name: &str, kind: &str, help: &str, v: u64) {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        scalar(
            &mut out,
            "m40_requests_total",
            "counter",
            "Generation requests started.",
            c.requests.load(Ordering::Relaxed),
        );
        scalar(
            &mut out,
            "m40_prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            c.prompt_tokens.load(Ordering::Relaxed),
        );
        scalar(
            &mut out,
            "m40_generated_tokens_total",
            "counter",
            "Tokens generated.",
            c.generated_tokens.load(Ordering::Relaxed),
        );
        scalar(
            &mut out,
            "m40_requests_running",
            "gauge",
            "Requests generating now.",
            c.running.load(Ordering::Relaxed),
        );
        let loads: Vec<(String, Load, usize)> = loaded
            .iter()
            .map(|(s, e)| {
                (
                    s.name.replace(['\\', '"', '\n'], "_"),
                    e.activity(),
                    e.n_ctx(),
                )
            })
            .collect();
        let engine: [Gauge; 12] = [
            (
                "m40_queue_depth",
                "gauge",
                "Sequences waiting for admission (KV pages or the parallel limit).",
                |l| l.waiting as u64,
            ),
            (
                "m40_sequences_running",
                "gauge",
                "Sequences admitted: holding KV pages, in the engine's batched steps.",
                |l| l.running as u64,
            ),
            (
                "m40_sequences_parallel_max",
                "gauge",
                "Sequences running at once at most (--parallel).",
                |l| l.parallel as u64,
            ),
            (
                "m40_kv_pages_used",
                "gauge",
                "KV cache pages held by running sequences.",
                |l| l.kv_pages_used as u64,
            ),
            (
                "m40_kv_pages",
                "gauge",
                "KV cache pages in the pool.",
                |l| l.kv_pages as u64,
            ),
            (
                "m40_kv_page_tokens",
                "gauge",
                "Tokens per KV cache page.",
                |l| l.kv_page_tokens as u64,
            ),
            (
                "m40_steps_total",
                "counter",
                "Batched forward steps the engine ran.",
                |l| l.steps,
            ),
            (
                "m40_step_tokens_total",
                "counter",
                "Tokens those steps ran (decode tokens and prompt chunks).",
                |l| l.step_tokens,
            ),
            (
                "m40_preemptions_total",
                "counter",
                "Sequences preempted when KV pages ran out (recomputed later).",
                |l| l.preemptions,
            ),
            (
                "m40_prefix_cache_pages",
                "gauge",
                "Full KV pages the prefix cache keeps for later requests.",
                |l| l.prefix_cached_pages as u64,
            ),
            (
                "m40_prefix_cache_hits_total",
                "counter",
                "Requests that started with cached KV pages.",
                |l| l.prefix_hits,
            ),
            (
                "m40_prefill_tokens_saved_total",
                "counter",
                "Prompt tokens not computed again: they were in cached pages.",
                |l| l.prefix_tokens_saved,
            ),
        ];
        for (name, kind, help, v) in engine {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (model, l, _) in &loads {
                let _ = writeln!(out, "{name}{{model=\"{model}\"}} {}", v(l));
            }
        }
        scalar(
            &mut out,
            "m40_kv_cache_tokens",
            "gauge",
            "Tokens held in KV caches of running requests.",
            c.kv_tokens.load(Ordering::Relaxed),
        );
        let name = "m40_kv_cache_capacity_tokens";
        let _ = writeln!(
            out,
            "# HELP {name} Tokens one request's KV cache holds (the context).\n# TYPE {name} gauge"
        );
        for (model, _, n_ctx) in &loads {
            let _ = writeln!(out, "{name}{{model=\"{model}\"}} {n_ctx}");
        }
        c.ttft.write(
            &mut out,
            "m40_time_to_first_token_seconds",
            "Time from the start of generation to the first token.",
            &TTFT_BUCKETS,
        );
        c.itl.write(
            &mut out,
            "m40_inter_token_latency_seconds",
            "Time between consecutive tokens.",
            &ITL_BUCKETS,
        );
        out
    }
}

pub(crate) async fn render(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics().text(&s.loaded_slots()),
    )
}
