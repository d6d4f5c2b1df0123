//! `EngineOptions::step_stats` (the CLI's `M40_STEP_STATS=N`): the step
//! loop's mean timings every N steps, logged at info level with target
//! `m40_runtime::steps`.

/// Step timings summed over N steps.
#[derive(Default)]
pub(super) struct StepStats {
    every: usize,
    steps: usize,
    mixed: usize,
    rows: usize,
    seqs: usize,
    /// Seconds idle, planning, preparing, in the backend, after.
    times: [f64; 5],
}

impl StepStats {
    /// Stats printed every `every` steps.
    pub(super) fn every(every: usize) -> StepStats {
        StepStats {
            every,
            ..Default::default()
        }
    }
}

/// Now in milliseconds since the Unix epoch (the step stats' clock, which
/// the load example's probe prints too).
fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

impl StepStats {
    pub(super) fn add(&mut self, rows: usize, seqs: usize, t: [f64; 5]) {
        self.steps += 1;
        self.mixed += (rows > seqs) as usize;
        self.rows += rows;
        self.seqs += seqs;
        for (sum, v) in self.times.iter_mut().zip(t) {
            *sum += v;
        }
        if self.steps == self.every {
            let n = self.steps as f64;
            let [idle, plan, prepare, backend, after] = self.times.map(|v| v * 1e3 / n);
            tracing::info!(
                target: "m40_runtime::steps",
                "steps {} to {:.1} ms (Unix time): {:.1} rows, {:.1} sequences, {} with prompt rows; ms a step: idle {idle:.3}, plan {plan:.3}, prepare {prepare:.3}, backend {backend:.3}, after {after:.3}",
                self.steps,
                unix_ms(),
                self.rows as f64 / n,
                self.seqs as f64 / n,
                self.mixed,
            );
            *self = StepStats {
                every: self.every,
                ..Default::default()
            };
        }
    }
}
