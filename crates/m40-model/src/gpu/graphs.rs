//! Decode steps replayed from captured CUDA graphs: one graph per context
//! bucket (the largest position its attention plan covers), with the token
//! selection and without; and batched decode steps (one token of each of
//! several sequences), one graph per (sequences, context bucket). The
//! kernels read the positions, token ids and block tables from device
//! memory, so one graph serves every position and sequence of its bucket.
//!
//! The one seam of the persistent decode kernel (`GpuOptions::persistent`,
//! kernels/decode.cu): with it, a graph's one-token GEMVs and attention are
//! recorded into a decode program while it is captured (here, and nowhere
//! else in the backend).

use std::collections::HashMap;

use m40_kernels::{AttnPlan, AttnShape, DecodeProgram, KV_PAGE};

use super::forward::{attn_shape, StepAttn};
use super::kv::Pools;
use super::residual::Residual;
use super::tuning::{
    BATCH_GRAPHS, CAPTURE_AT, GRAPH_LINEAR_CONTEXT, GRAPH_MIN_CONTEXT, SEEN_SHAPES,
};
use super::workspace::Workspace;
use super::GpuBackend;
use crate::error::Result;

/// A captured decode step, and the program its persistent decode kernel
/// launches run (`GpuOptions::persistent`): the graph holds the program's
/// device address, so the two live and die together.
pub(super) struct StepGraph {
    graph: m40_device::Graph,
    _program: Option<DecodeProgram>,
    /// A batched step's: when it was last launched (the least recently
    /// used goes first at BATCH_GRAPHS).
    used: std::time::Instant,
}

impl StepGraph {
    fn new(graph: m40_device::Graph, program: Option<DecodeProgram>) -> StepGraph {
        StepGraph {
            graph,
            _program: program,
            used: std::time::Instant::now(),
        }
    }
}

/// What a graph was captured for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum GraphKey {
    /// One sequence's token: with the selection, context bucket.
    Step(bool, usize),
    /// A decode-only batched step: rows (one a sequence, every one's
    /// logits computed), context bucket (the largest position).
    Batch(usize, usize),
}

/// The captured steps, and how often each batched-step shape not captured
/// yet has run. It owns what it keeps and when a graph goes: a batched one
/// used longest ago past [`BATCH_GRAPHS`], and all of them when a buffer
/// they were captured with is replaced ([`Graphs::fit_scratch`]).
#[derive(Default)]
pub(super) struct Graphs {
    map: HashMap<GraphKey, StepGraph>,
    seen: HashMap<GraphKey, u32>,
}

impl Graphs {
    pub(super) fn contains(&self, key: &GraphKey) -> bool {
        self.map.contains_key(key)
    }

    /// The graph captured for `key`, now its most recent use.
    fn get(&mut self, key: &GraphKey) -> Option<&StepGraph> {
        let g = self.map.get_mut(key)?;
        g.used = std::time::Instant::now();
        Some(g)
    }

    /// A batched step of shape `key` runs without a graph: whether it has
    /// now run often enough ([`CAPTURE_AT`]) to be captured.
    fn due(&mut self, key: GraphKey) -> bool {
        if self.seen.len() >= SEEN_SHAPES {
            self.seen.clear();
        }
        let seen = self.seen.entry(key).or_insert(0);
        *seen += 1;
        if *seen < CAPTURE_AT {
            return false;
        }
        self.seen.remove(&key);
        true
    }

    /// Keep `graph` for `key`; past [`BATCH_GRAPHS`] batched ones, the one
    /// used longest ago makes room.
    fn insert(&mut self, key: GraphKey, graph: StepGraph) {
        let batch = |k: &GraphKey| matches!(k, GraphKey::Batch(..));
        if batch(&key) && self.map.keys().filter(|k| batch(k)).count() >= BATCH_GRAPHS {
            let old = self
                .map
                .iter()
                .filter(|(k, _)| batch(k))
                .min_by_key(|(_, g)| g.used)
                .map(|(k, _)| *k);
            if let Some(k) = old {
                self.map.remove(&k);
            }
        }
        self.map.insert(key, graph);
    }

    /// Make sure `w`'s attention scratch holds `part` and `ml` values. A
    /// larger scratch is a new buffer: the graphs captured with the old
    /// one are dropped with it.
    pub(super) fn fit_scratch(
        &mut self,
        stream: &m40_device::Stream,
        w: &mut Workspace,
        part: usize,
        ml: usize,
    ) -> Result<()> {
        if w.part.len() < part || w.part_ml.len() < ml {
            self.map.clear();
        }
        if w.part.len() < part {
            w.part = stream.alloc::<f32>(part, "attention scratch")?;
        }
        if w.part_ml.len() < ml {
            w.part_ml = stream.alloc::<f32>(ml, "attention scratch")?;
        }
        Ok(())
    }
}

impl GpuBackend {
    /// The one-token step at `start` whose inputs are uploaded, replayed
    /// from its graph (captured on first use): the last logits into
    /// `w.logits` and, with `selects`, the selection from them.
    pub(super) fn graph_step(
        &self,
        w: &mut Workspace,
        pools: &mut Pools,
        graphs: &mut Graphs,
        start: usize,
        selects: bool,
    ) -> Result<()> {
        let max_start = self.graph_bucket(start);
        let key = GraphKey::Step(selects, max_start);
        if !graphs.contains(&key) {
            let shape = attn_shape(self.model.hparams(), 1, max_start);
            let plan = self.attn_plan(&shape);
            self.scratch(w, graphs, &plan, &shape)?;
            let mut program = match self.persistent {
                true => Some(DecodeProgram::new(&self.stream, self.decode_ops())?),
                false => None,
            };
            let graph = self.stream.capture(|_| -> Result<()> {
                let mut body = || -> Result<()> {
                    self.enqueue(w, pools, 1, max_start, StepAttn::Seq(plan), true)?;
                    if selects {
                        self.select(w)?;
                    }
                    Ok(())
                };
                match &mut program {
                    Some(p) => self.kernels.record_decode(&self.stream, p, body),
                    None => body(),
                }
            })?;
            if let Some(p) = &mut program {
                p.upload(&self.stream)?;
            }
            graphs.insert(key, StepGraph::new(graph, program));
        }
        let g = graphs.get(&key).expect("captured");
        // SAFETY: the graph uses the workspace, pools, weights and inputs
        // of this backend, which live as long as it does (the state mutex
        // is held), and the attention scratch it was captured with (a
        // larger scratch drops every graph: see `Graphs::fit_scratch`).
        unsafe { g.graph.launch()? };
        Ok(())
    }

    /// A decode-only batched step of `n` rows, each reaching the output
    /// matmul (inputs uploaded; positions at most `max_start`)
    /// replayed from its graph (captured the [`CAPTURE_AT`]th time its
    /// shape runs, launched kernel by kernel before): those rows' logits
    /// into `w.logits`. Its attention covers the context bucket of
    /// `max_start`: the blocks past a row's own position have no keys.
    pub(super) fn batch_graph_step(
        &self,
        w: &mut Workspace,
        pools: &mut Pools,
        graphs: &mut Graphs,
        n: usize,
        max_start: usize,
    ) -> Result<()> {
        let bucket = self.graph_bucket(max_start);
        let key = GraphKey::Batch(n, bucket);
        if !graphs.contains(&key) {
            if !graphs.due(key) {
                // The same launches the graph would hold (its bucket too,
                // so that the step's results are the graph's).
                return self.batch_body(w, pools, n, bucket);
            }
            let graph = self
                .stream
                .capture(|_| -> Result<()> { self.batch_body(w, pools, n, bucket) })?;
            graphs.insert(key, StepGraph::new(graph, None));
        }
        let g = graphs.get(&key).expect("captured");
        // SAFETY: as in graph_step (batched steps use no attention
        // scratch).
        unsafe { g.graph.launch()? };
        Ok(())
    }

    /// A batched decode step's launches: its layers, and the rows' logits
    /// where this backend computes the outputs.
    fn batch_body(
        &self,
        w: &mut Workspace,
        pools: &mut Pools,
        n: usize,
        bucket: usize,
    ) -> Result<()> {
        self.enqueue(w, pools, n, bucket, StepAttn::Batch, false)?;
        match self.span.last() {
            true => self.logits(w, 0..n, Residual::Done),
            false => Ok(()),
        }
    }

    /// The largest position a decode graph for a step at `start` plans its
    /// attention for: powers of two from GRAPH_MIN_CONTEXT tokens, then
    /// multiples of GRAPH_LINEAR_CONTEXT, up to the pool's capacity, so
    /// contexts run few empty key splits (a plan for the whole pool costs
    /// 8B Q4_0 ~9% of its tg128 at position ~100).
    pub(super) fn graph_bucket(&self, start: usize) -> usize {
        let cap = self.pages.pages() * KV_PAGE;
        let need = start + 1;
        let bucket = if need <= GRAPH_LINEAR_CONTEXT {
            need.next_power_of_two().max(GRAPH_MIN_CONTEXT)
        } else {
            need.next_multiple_of(GRAPH_LINEAR_CONTEXT)
        };
        bucket.min(cap) - 1
    }

    /// Ops a decode step's program holds at most: a layer records at most
    /// 6 (Q/K/V, attention, combine, o, gate/up, down; more only where
    /// matrices are not stacked), and the output GEMV.
    fn decode_ops(&self) -> usize {
        self.weights.layers.len() * 12 + 4
    }
}

impl GpuBackend {
    /// Make sure the split scratch holds what `plan` needs for `shape`
    /// ([`Graphs::fit_scratch`]).
    pub(super) fn scratch(
        &self,
        w: &mut Workspace,
        graphs: &mut Graphs,
        plan: &AttnPlan,
        shape: &AttnShape,
    ) -> Result<()> {
        let (np, nml) = plan.scratch_len(shape);
        graphs.fit_scratch(&self.stream, w, np, nml)
    }
}
