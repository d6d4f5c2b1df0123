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
/// yet has run.
#[derive(Default)]
pub(super) struct Graphs {
    map: HashMap<GraphKey, StepGraph>,
    seen: HashMap<GraphKey, u32>,
}

impl std::ops::Deref for Graphs {
    type Target = HashMap<GraphKey, StepGraph>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl std::ops::DerefMut for Graphs {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
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
        if !graphs.contains_key(&key) {
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
        // SAFETY: the graph uses the workspace, pools, weights and inputs
        // of this backend, which live as long as it does (the state mutex
        // is held), and the attention scratch it was captured with (a
        // larger scratch drops every graph: see `scratch`).
        unsafe { graphs[&key].graph.launch()? };
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
        if !graphs.contains_key(&key) {
            if graphs.seen.len() >= SEEN_SHAPES {
                graphs.seen.clear();
            }
            let seen = graphs.seen.entry(key).or_insert(0);
            *seen += 1;
            if *seen < CAPTURE_AT {
                // The same launches the graph would hold (its bucket too,
                // so that the step's results are the graph's).
                self.enqueue(w, pools, n, bucket, StepAttn::Batch, false)?;
                return self.logits(w, 0..n, Residual::Done);
            }
            graphs.seen.remove(&key);
            let batch = |k: &GraphKey| matches!(k, GraphKey::Batch(..));
            if graphs.keys().filter(|k| batch(k)).count() >= BATCH_GRAPHS {
                // The batched graph used longest ago makes room.
                let old = graphs
                    .iter()
                    .filter(|(k, _)| batch(k))
                    .min_by_key(|(_, g)| g.used)
                    .map(|(k, _)| *k);
                if let Some(k) = old {
                    graphs.remove(&k);
                }
            }
            let graph = self.stream.capture(|_| -> Result<()> {
                self.enqueue(w, pools, n, bucket, StepAttn::Batch, false)?;
                self.logits(w, 0..n, Residual::Done)
            })?;
            graphs.insert(key, StepGraph::new(graph, None));
        }
        let g = graphs.get_mut(&key).expect("captured");
        g.used = std::time::Instant::now();
        // SAFETY: as in graph_step (batched steps use no attention
        // scratch).
        unsafe { g.graph.launch()? };
        Ok(())
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
    /// Make sure the split scratch holds what `plan` needs for `shape`.
    /// A larger scratch is a new buffer: the graphs captured with the old
    /// one are dropped with it.
    pub(super) fn scratch(
        &self,
        w: &mut Workspace,
        graphs: &mut Graphs,
        plan: &AttnPlan,
        shape: &AttnShape,
    ) -> Result<()> {
        let (np, nml) = plan.scratch_len(shape);
        if w.part.len() < np || w.part_ml.len() < nml {
            graphs.clear();
        }
        if w.part.len() < np {
            w.part = self.stream.alloc::<f32>(np, "attention scratch")?;
        }
        if w.part_ml.len() < nml {
            w.part_ml = self.stream.alloc::<f32>(nml, "attention scratch")?;
        }
        Ok(())
    }
}
