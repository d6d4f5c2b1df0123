//! The GPU backend: the same forward pass as [`crate::cpu`], with weights in
//! their GGUF formats in device memory, FP32 activations, and a paged FP16 KV
//! cache.
//!
//! - Matmuls: GEMV (kernels/gemv.cu) for one token, the tiled GEMM with
//!   dequantization in the tile loader (kernels/gemm.cu) for more.
//! - KV cache: one pool of pages (KV_PAGE tokens each) per layer for K and
//!   one for V, shared by every sequence of the backend; a [`GpuCache`]
//!   owns a list of pages (its block table, uploaded with each step's
//!   token ids and positions) taken from a free list as it grows and given
//!   back when it shrinks or drops.
//! - Decode steps (one token) run as a captured CUDA graph by default
//!   ([`GpuOptions::graphs`]): the kernels read the position, token id and
//!   block table from device memory, so one graph serves every position
//!   and sequence; attention in the graph uses a key split fixed for the
//!   pool's capacity.
//! - One stream; forward passes of different sequences take turns (a mutex
//!   over the activation workspace).
//! - Everything the model needs (weights, the KV pool, the workspace) is
//!   computed before anything is allocated; a GPU without that much free
//!   memory is an [`ModelError::GpuMemory`] error, not a failure halfway.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use m40_device::{Device, DeviceBuffer, DeviceView, Stream};
use m40_gguf::hparams::{RopeStyle as GgufRope, OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
use m40_gguf::{GgmlType, HyperParams};
use m40_kernels::{
    gemm_scratch_len, interleave_glu, modules_for, pack_gemv, select_args, AttnPlan, AttnScratch,
    AttnShape, DecodeProgram, Fold, GemmSlots, GemvOut, KernelFormat, Kernels, PackFormat,
    PackedMatrix, Penalties, QMatrix, RopeKv, RopeParams, RopeStyle, RowSplit, KV_PAGE,
    MAX_HEAD_DIM, PACK_ROWS, SELECT_ARGS, SELECT_MAX_K, SELECT_SCRATCH,
};

pub use m40_kernels::LoadProgress;

use crate::cpu::ops::Rope;
use crate::error::{ModelError, Result};
use crate::{Backend, KvState, Logits, Model, Selection};

/// How to set up a [`GpuBackend`].
pub struct GpuOptions {
    /// Tokens the KV pool holds, over all sequences together.
    pub kv_tokens: usize,
    /// Tokens per forward step at most (longer prompts run in steps).
    pub max_batch: usize,
    /// Called as weights upload: (bytes done, bytes in all).
    pub progress: Option<Arc<dyn Fn(u64, u64) + Send + Sync>>,
    /// Called while the kernels load (the driver compiles them for this GPU
    /// on a first run): after each module and every half second.
    pub kernel_progress: Option<Arc<dyn Fn(LoadProgress) + Send + Sync>>,
    /// Replay decode steps from a captured CUDA graph (else launch each
    /// kernel every step).
    pub graphs: bool,
    /// Repack the matrices whose format has a packed GEMV (F16, Q8_0, Q4_0,
    /// Q4_1, Q4_K, Q6_K) at upload: decode streams them at a higher share
    /// of the bandwidth, and prefill and the embedding read the same copy.
    pub packed: bool,
    /// Stack Q, K and V, and gate and up, into one packed matrix each where
    /// their formats match: one launch, each part written to its own
    /// buffer; and in one-token steps, add the output projections to the
    /// residual stream in their GEMV and fold the RMSNorm after them into
    /// that GEMV and the ones that read it (kernels/gemv_packed.cu `Fold`)
    /// where all of them are packed (needs `packed`).
    pub fuse: bool,
    /// Run a captured decode step's one-token GEMVs and attention as one
    /// launch of the persistent decode kernel (kernels/decode.cu), ordered
    /// by grid barriers instead of a launch each (needs `graphs`). Off by
    /// default: on an H100 it decodes 8B Q4_0 at 348 tokens/s against 451
    /// with a launch per kernel (BENCHMARKS.md); not yet measured on an M40.
    pub persistent: bool,
    /// One-token steps' attention in `attn_dec_f32_*` (a block of up to 8
    /// warps per KV head, no split up to 256 keys); false: the warp kernel
    /// and its key splits, as before it (to compare the two; the decode
    /// kernel measured 2% faster for 8B Q4_0 tg128 and 7% for 1B on an
    /// H100, BENCHMARKS.md).
    pub decode_attention: bool,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            kv_tokens: 4096,
            max_batch: crate::DEFAULT_STEP,
            progress: None,
            kernel_progress: None,
            graphs: true,
            packed: true,
            fuse: true,
            persistent: false,
            decode_attention: true,
        }
    }
}

/// The attention of one token at position `start`.
fn decode_shape(hp: &HyperParams, start: usize) -> AttnShape {
    AttnShape {
        n_tok: 1,
        start,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        head_dim: hp.head_dim,
    }
}

/// The smallest context a decode graph plans its attention for (tokens):
/// one page, so the first 32 positions run attention without a key split
/// (and no combine launch). 8B Q4_0 tg128 on an H100, same binary: 453.1 /
/// 452.9 t/s from 512, 451.0 / 452.4 from 128, 456.4 / 458.3 from 32.
const GRAPH_MIN_CONTEXT: usize = 32;
/// Past this context, decode graphs' buckets grow by this many tokens, not
/// to the next power of two: a step at position 4096 plans attention for
/// 5120 keys (80 splits of 2 pages on an H100, 65 of them with keys), not
/// 8192 (129 splits, half of them past the context, and a combine over all
/// 129). With a 16384-token pool (`m40-llm bench --ctx 16384`), H100, same
/// call: tg128 @ d4096 8B Q4_0 355.9 -> 375.7 t/s, 1B 1242.8 -> 1304.0.
const GRAPH_LINEAR_CONTEXT: usize = 1024;

/// A token selection to run after a step's logits: its encoded arguments
/// (`select_args`) and k; the k ids and the bits of their logits land in
/// `out`.
struct Select<'a> {
    args: &'a [i32],
    k: usize,
    out: &'a mut Vec<i32>,
}

/// Rows of logits computed per output matmul when all are asked for.
const LOGIT_ROWS: usize = 64;

/// Tokens up to which a step runs packed matrices through the batched GEMV
/// (each weight loaded once for all of them) rather than the GEMM tile
/// (BENCHMARKS.md, the batched table).
const GEMV_TOKENS: usize = m40_kernels::PACKED_GEMV_MAX_TOKENS;

/// A weight matrix on the device: GGUF rows, or the packed layout.
struct Mat {
    ty: GgmlType,
    data: DeviceBuffer<u8>,
    rows: usize,
    cols: usize,
    packed: bool,
}

impl Mat {
    /// Rows of x up to which a matmul runs through the GEMV (one; packed:
    /// the batched GEMV's GEMV_TOKENS).
    fn gemv_rows(&self) -> usize {
        if self.packed {
            GEMV_TOKENS
        } else {
            1
        }
    }

    /// The launchers' view of the matrix: packed, or GGUF rows.
    fn view<'a>(&self, data: &'a DeviceView<'a, u8>) -> MatView<'a> {
        let (ty, rows, cols) = (self.ty, self.rows, self.cols);
        if self.packed {
            MatView::Packed(PackedMatrix {
                ty,
                data,
                rows,
                cols,
            })
        } else {
            MatView::Rows(QMatrix {
                ty,
                data,
                rows,
                cols,
            })
        }
    }
}

/// What a matmul multiplies: rows of x, or (one token, packed GEMV only)
/// the h = x * weight of a folded RMSNorm, whose scale the GEMV computes
/// from the `n` partial sums of squares in `part` (see [`Residual`]).
#[derive(Clone, Copy)]
enum Input<'a> {
    Rows(&'a DeviceView<'a, f32>),
    Folded {
        h: &'a DeviceView<'a, f32>,
        part: &'a DeviceView<'a, f32>,
        n: usize,
    },
}

/// How a residual connection x += W a was left (`matmul_res`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Residual {
    /// Added to x.
    Done,
    /// In `w.proj`: the next norm adds it (`add_rmsnorm`).
    Pending,
    /// Added to x by the GEMV, which also wrote h = x * (the next norm's
    /// weight) and its blocks' n partial sums of x^2 to `w.norm_part`: the
    /// next GEMVs take the norm from there (`Input::Folded`).
    Folded(usize),
}

impl Residual {
    /// What the matmuls after the next norm read: h as that norm left it
    /// (run into h, or folded: h = x * weight and the partial sums `part`).
    fn input<'a>(self, h: &'a DeviceView<'a, f32>, part: &'a DeviceView<'a, f32>) -> Input<'a> {
        match self {
            Residual::Folded(n) => Input::Folded { h, part, n },
            _ => Input::Rows(h),
        }
    }
}

/// A [`Mat`]'s launcher view.
enum MatView<'a> {
    Packed(PackedMatrix<'a>),
    Rows(QMatrix<'a>),
}

/// Whether a matrix of `ty` with `cols` columns is uploaded packed.
fn packs(opts: &GpuOptions, ty: GgmlType, cols: usize) -> bool {
    opts.packed && PackFormat::of(ty).is_some_and(|f| cols.is_multiple_of(f.qk))
}

/// Device bytes of a weight tensor as uploaded (the packed layout pads the
/// rows to groups of 4, and Q4_K's unpacked scales take 4 bytes more per
/// super-block).
fn device_bytes(opts: &GpuOptions, t: &m40_gguf::TensorInfo) -> u64 {
    match PackFormat::of(t.ty) {
        Some(f) if packs(opts, t.ty, t.row_len()) => f.packed_bytes(t.n_rows(), t.row_len()) as u64,
        _ => t.n_bytes,
    }
}

/// Matrices applied to the same input (Q, K, V; gate, up), stacked into
/// one upload where they share a packed format: `parts` holds each one's
/// rows in order, and each part is written to its own output buffer.
struct Stack {
    mat: Mat,
    parts: Vec<usize>,
    /// A gate/up pair interleaved for SwiGLU (`interleave_glu`): one
    /// output of half the rows, silu(gate) * up.
    glu: bool,
}

struct Layer {
    attn_norm: DeviceBuffer<f32>,
    ffn_norm: DeviceBuffer<f32>,
    bias: Option<[DeviceBuffer<f32>; 3]>,
    /// Q, K, V in one to three stacks.
    qkv: Vec<Stack>,
    wo: Mat,
    /// Gate and up in one or two stacks.
    gate_up: Vec<Stack>,
    down: Mat,
}

/// Activations for `max_batch` tokens, and the attention split scratch.
struct Workspace {
    /// A step's inputs: token ids (max_batch), positions (max_batch), the
    /// block table (the pool's page count), then a selection's arguments
    /// (SELECT_ARGS + 2 n_vocab: see `select_args`), uploaded in one copy.
    inputs: DeviceBuffer<i32>,
    x: DeviceBuffer<f32>,
    h: DeviceBuffer<f32>,
    q: DeviceBuffer<f32>,
    k: DeviceBuffer<f32>,
    v: DeviceBuffer<f32>,
    att: DeviceBuffer<f32>,
    /// The output projections of up to GEMV_TOKENS tokens before they join
    /// the residual (decode, short steps).
    proj: DeviceBuffer<f32>,
    /// A folded norm's partial sums of squares, one per block of the
    /// residual GEMV that emits them (at most n_embd / 4).
    norm_part: DeviceBuffer<f32>,
    gate: DeviceBuffer<f32>,
    up: DeviceBuffer<f32>,
    logits: DeviceBuffer<f32>,
    /// Token selection: the k ids and the bits of their logits.
    sel_out: DeviceBuffer<i32>,
    /// The selection's scratch (zeroed once; each selection leaves it zero).
    sel_scratch: DeviceBuffer<i32>,
    part: DeviceBuffer<f32>,
    part_ml: DeviceBuffer<f32>,
}

/// The [`Norm`] buffers of a workspace (a macro: it borrows three fields,
/// not the whole workspace).
macro_rules! norm_bufs {
    ($w:expr) => {
        Norm {
            x: &mut $w.x,
            proj: &$w.proj,
            h: &mut $w.h,
        }
    };
}

/// The buffers of a norm: the residual stream x, the pending one-row
/// residual, and the output.
struct Norm<'a> {
    x: &'a mut DeviceBuffer<f32>,
    proj: &'a DeviceBuffer<f32>,
    h: &'a mut DeviceBuffer<f32>,
}

/// The buffers of a residual connection: the residual stream x, the
/// pending projection, a folded norm's h and partial sums (a macro builds
/// it: it borrows four fields, not the whole workspace).
struct Res<'a> {
    x: &'a mut DeviceBuffer<f32>,
    proj: &'a mut DeviceBuffer<f32>,
    h: &'a mut DeviceBuffer<f32>,
    part: &'a mut DeviceBuffer<f32>,
}

macro_rules! res_bufs {
    ($w:expr) => {
        Res {
            x: &mut $w.x,
            proj: &mut $w.proj,
            h: &mut $w.h,
            part: &mut $w.norm_part,
        }
    };
}

/// The K and V pages of every layer.
struct Pools {
    k: Vec<DeviceBuffer<u16>>,
    v: Vec<DeviceBuffer<u16>>,
}

/// A captured decode step, and the program its persistent decode kernel
/// launches run (`GpuOptions::persistent`): the graph holds the program's
/// device address, so the two live and die together.
struct StepGraph {
    graph: m40_device::Graph,
    _program: Option<DecodeProgram>,
}

struct State {
    work: Workspace,
    pools: Pools,
    /// The captured decode steps, by (with the selection, the context
    /// bucket: the largest position their attention plan covers).
    graphs: HashMap<(bool, usize), StepGraph>,
}

/// The GPU backend over one model on one device.
pub struct GpuBackend {
    model: Arc<Model>,
    kernels: Kernels,
    stream: Stream,
    embd: Mat,
    layers: Vec<Layer>,
    output_norm: DeviceBuffer<f32>,
    output: Option<Mat>,
    inv_freq: DeviceBuffer<f32>,
    rope: RopeParams,
    max_batch: usize,
    n_pages: usize,
    /// `GpuOptions::fuse`: one-token steps add the output projections to x
    /// in their GEMV and fold the norms after them.
    fuse: bool,
    /// `GpuOptions::persistent`.
    persistent: bool,
    /// `GpuOptions::decode_attention`.
    decode_attention: bool,
    graphs: std::sync::atomic::AtomicBool,
    free: Arc<Mutex<Vec<u32>>>,
    state: Mutex<State>,
    /// The partial tiles of prefill GEMMs split over K (`gemm_scratch`).
    gemm_part: Mutex<DeviceBuffer<f32>>,
}

/// A sequence's KV cache: its pages of the backend's pool.
pub struct GpuCache {
    pages: Vec<u32>,
    len: usize,
    n_ctx: usize,
    free: Arc<Mutex<Vec<u32>>>,
}

impl GpuCache {
    /// Pages held.
    pub fn pages(&self) -> &[u32] {
        &self.pages
    }

    fn release_from(&mut self, keep: usize) {
        if self.pages.len() > keep {
            let mut free = lock(&self.free);
            free.extend(self.pages.drain(keep..));
        }
    }
}

impl Drop for GpuCache {
    fn drop(&mut self) {
        self.release_from(0);
    }
}

impl KvState for GpuCache {
    fn len(&self) -> usize {
        self.len
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
        self.release_from(self.len.div_ceil(KV_PAGE));
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// Floats of scratch the prefill GEMMs of `hp`'s matrices take split over
/// K (m40_kernels::gemm_scratch_len) on `gpu`, for any step of
/// up to `max_batch` tokens (the GEMV takes steps of GEMV_TOKENS or fewer;
/// the output matrix, LOGIT_ROWS rows at most).
fn gemm_scratch(hp: &HyperParams, max_batch: usize, gpu: GemmSlots) -> usize {
    let (d, q, kv, ff) = (
        hp.n_embd,
        hp.n_head * hp.head_dim,
        hp.n_head_kv * hp.head_dim,
        hp.n_ff,
    );
    // (rows, cols, most tokens): Q/K/V stacked or not, o, gate/up stacked
    // or not, down, the output.
    let mats = [
        (q + 2 * kv, d, max_batch),
        (q, d, max_batch),
        (kv, d, max_batch),
        (d, q, max_batch),
        (2 * ff, d, max_batch),
        (ff, d, max_batch),
        (d, ff, max_batch),
        (hp.n_vocab, d, LOGIT_ROWS.min(max_batch)),
    ];
    mats.iter()
        .flat_map(|&(n, k, most)| {
            (GEMV_TOKENS + 1..=most).map(move |m| gemm_scratch_len(m, n, k, gpu))
        })
        .max()
        .unwrap_or(0)
}

/// The kernel modules (m40_kernels::MODULES) a [`GpuBackend`] for `model`
/// with `opts` launches from, loaded (JIT-compiled on a first run) up front:
/// of the sources compiled in parts, only the parts of the model's formats
/// (the GEMV of GGUF rows only for matrices that are not packed); the
/// persistent decode kernel only when asked for; never the benchmark probes.
pub fn modules_needed(model: &Model, opts: &GpuOptions) -> Vec<&'static str> {
    let hp = model.hparams();
    let file = model.file();
    let (mut packed, mut rows) = (Vec::new(), Vec::new());
    for (name, shape) in hp.expected_tensors() {
        // An untied token embedding is only gathered (the embed module).
        if shape.len() != 2 || (name == TOKEN_EMBD && !hp.tied_output) {
            continue;
        }
        let Some(t) = file.tensor_info(&name) else {
            continue;
        };
        let Ok(f) = KernelFormat::of(t.ty, "gpu backend") else {
            continue;
        };
        let list = if PackFormat::of(t.ty).is_some() && packs(opts, t.ty, t.row_len()) {
            &mut packed
        } else {
            &mut rows
        };
        if !list.contains(&f.symbol) {
            list.push(f.symbol);
        }
    }
    let all: Vec<&str> = packed.iter().chain(&rows).copied().collect();
    let mut m = modules_for("gemm", &all);
    m.extend(modules_for("gemv_packed", &packed));
    if !rows.is_empty() {
        m.extend(modules_for("gemv", &rows));
    }
    m.extend([
        "attention",
        "embed",
        "sample",
        "rmsnorm",
        "rope",
        "elementwise",
    ]);
    if opts.persistent {
        m.push("decode");
    }
    m
}

/// Device memory a [`GpuBackend`] for `model` with `opts` allocates on
/// `gpu` (its GEMM slots size the split-K scratch), bytes: (weights, KV
/// pool, workspace).
pub fn memory_needed(model: &Model, opts: &GpuOptions, gpu: GemmSlots) -> (u64, u64, u64) {
    let hp = model.hparams();
    let file = model.file();
    let weights: u64 = hp
        .expected_tensors()
        .iter()
        .filter_map(|(name, _)| file.tensor_info(name))
        .map(|t| {
            if t.name == TOKEN_EMBD && !hp.tied_output {
                t.n_bytes // gathered only: stays in GGUF rows
            } else {
                device_bytes(opts, t)
            }
        })
        .sum::<u64>()
        + file
            .tensor_info("rope_freqs.weight")
            .map_or(0, |t| t.n_bytes);
    let kv_dim = (hp.n_head_kv * hp.head_dim) as u64;
    let pages = opts.kv_tokens.div_ceil(KV_PAGE) as u64;
    let kv = 2 * hp.n_layer as u64 * pages * KV_PAGE as u64 * kv_dim * 2;
    let b = opts.max_batch as u64;
    let (d, q, ff) = (
        hp.n_embd as u64,
        (hp.n_head * hp.head_dim) as u64,
        hp.n_ff as u64,
    );
    // x, h, q, att, k, v, gate, up (twice: a gate/up stack's output) per
    // token; GEMV_TOKENS tokens' projections; a folded norm's partial sums;
    // LOGIT_ROWS rows of logits; the step inputs (ids, positions, block
    // table, a selection's arguments); the token selection's results.
    let work = 4
        * (b * (2 * d + 2 * q + 2 * kv_dim + 3 * ff + 2)
            + b.min(GEMV_TOKENS as u64) * d
            + d.div_ceil(PACK_ROWS as u64)
            + LOGIT_ROWS as u64 * hp.n_vocab as u64
            + pages
            + (SELECT_ARGS + 2 * hp.n_vocab + 2 * SELECT_MAX_K + SELECT_SCRATCH) as u64
            + gemm_scratch(hp, opts.max_batch.max(1), gpu) as u64);
    (weights, kv, work)
}

impl GpuBackend {
    /// The backend for `model` on `device` (`Device::open(ordinal)`).
    pub fn new(device: Arc<Device>, model: Arc<Model>, opts: GpuOptions) -> Result<Self> {
        let hp = model.hparams().clone();
        if hp.head_dim > MAX_HEAD_DIM || !hp.head_dim.is_multiple_of(2) {
            return Err(ModelError::Unsupported(format!(
                "head dimension {} on the GPU (even, at most {MAX_HEAD_DIM})",
                hp.head_dim
            )));
        }
        if !hp.n_embd.is_multiple_of(32) || !hp.n_ff.is_multiple_of(32) {
            return Err(ModelError::Unsupported(format!(
                "embedding {} / FFN {} not multiples of 32 on the GPU",
                hp.n_embd, hp.n_ff
            )));
        }
        let max_batch = opts.max_batch.max(1);
        let kernels = Kernels::new(device.clone());
        let modules = modules_needed(&model, &opts);
        kernels.load_modules(&modules, &mut |p| {
            if let Some(f) = &opts.kernel_progress {
                f(p)
            }
        })?;
        // The GEMM's slots from a format the model holds (loading another
        // format's kernels would JIT-compile them on a first run).
        let gpu = {
            let t = model.tensor(&model.layer(0).ffn_up).info;
            kernels.gemm_slots_for(t.ty, packs(&opts, t.ty, t.row_len()))?
        };
        let (w, kv, work) = memory_needed(&model, &opts, gpu);
        let need = w + kv + work;
        let (free, total) = device.memory()?;
        let limit = (device.budget_left() as u64).min(free as u64);
        if need > limit {
            return Err(ModelError::GpuMemory {
                device: device.info().name.clone(),
                need: format!(
                    "{} ({} weights, {} KV cache for {} tokens, {} activations)",
                    gib(need),
                    gib(w),
                    gib(kv),
                    opts.kv_tokens,
                    gib(work)
                ),
                free: format!("{} of {} free", gib(free as u64), gib(total as u64)),
            });
        }

        let stream = device.new_stream()?;
        let mut done = 0u64;
        // Upload `names` stacked into one matrix (rows concatenated, then
        // packed when `may_pack` and the format allows).
        let mut upload_rows = |names: &[&str], may_pack: bool, glu: bool| -> Result<Mat> {
            let ts: Vec<_> = names.iter().map(|n| model.tensor(n)).collect();
            let (ty, cols) = (ts[0].info.ty, ts[0].info.row_len());
            KernelFormat::of(ty, "gpu backend")?;
            let rows: usize = ts.iter().map(|t| t.info.n_rows()).sum();
            let packed = may_pack && packs(&opts, ty, cols);
            let what = names.join(" + ");
            let joined;
            let bytes: &[u8] = if ts.len() == 1 {
                ts[0].data
            } else if glu {
                joined = interleave_glu(ts[0].data, ts[1].data, ts[0].info.n_rows())?;
                &joined
            } else {
                let mut v = Vec::with_capacity(ts.iter().map(|t| t.data.len()).sum());
                ts.iter().for_each(|t| v.extend_from_slice(t.data));
                joined = v;
                &joined
            };
            let data = if packed {
                stream.upload(&pack_gemv(ty, bytes, rows, cols)?, &what)?
            } else {
                stream.upload(bytes, &what)?
            };
            done = (done + data.len() as u64).min(w);
            if let Some(p) = &opts.progress {
                p(done, w);
            }
            Ok(Mat {
                ty,
                data,
                rows,
                cols,
                packed,
            })
        };
        // Matrices of one input, stacked in runs of the same packed format
        // whose row counts keep the packed groups of 4 apart.
        let fusable = |a: &str, b: &str| {
            let (a, b) = (model.tensor(a).info, model.tensor(b).info);
            opts.fuse
                && a.ty == b.ty
                && a.row_len() == b.row_len()
                && packs(&opts, a.ty, a.row_len())
                && a.n_rows().is_multiple_of(PACK_ROWS)
                && b.n_rows().is_multiple_of(PACK_ROWS)
        };
        // `glu`: names are a gate and an up matrix; stacked, they are
        // interleaved for the SwiGLU GEMV.
        let mut stacks = |names: &[&str], may_pack: bool, glu: bool| -> Result<Vec<Stack>> {
            let mut out = Vec::new();
            let mut i = 0;
            while i < names.len() {
                let mut j = i + 1;
                while may_pack && j < names.len() && fusable(names[i], names[j]) {
                    j += 1;
                }
                let rows: Vec<usize> = names[i..j]
                    .iter()
                    .map(|n| model.tensor(n).info.n_rows())
                    .collect();
                let glu = glu && j - i == 2;
                out.push(Stack {
                    mat: upload_rows(&names[i..j], may_pack, glu)?,
                    parts: if glu { vec![rows[0] + rows[1]] } else { rows },
                    glu,
                });
                i = j;
            }
            Ok(out)
        };
        let one =
            |s: Vec<Stack>| -> Mat { s.into_iter().next().expect("one matrix, one stack").mat };
        let f32s = |name: &str| -> Result<DeviceBuffer<f32>> {
            let v = model.tensor(name).to_f32()?;
            Ok(stream.upload(&v, name)?)
        };
        // The embedding is packed only when it is also the output matrix.
        let embd = one(stacks(&[TOKEN_EMBD], hp.tied_output, false)?);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for l in 0..hp.n_layer {
            let n = model.layer(l);
            let bias = if hp.qkv_bias {
                Some([f32s(&n.bq)?, f32s(&n.bk)?, f32s(&n.bv)?])
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: f32s(&n.attn_norm)?,
                ffn_norm: f32s(&n.ffn_norm)?,
                bias,
                qkv: stacks(&[&n.wq, &n.wk, &n.wv], true, false)?,
                wo: one(stacks(&[&n.wo], true, false)?),
                gate_up: stacks(&[&n.ffn_gate, &n.ffn_up], true, true)?,
                down: one(stacks(&[&n.ffn_down], true, false)?),
            });
        }
        let output = if hp.tied_output {
            None
        } else {
            Some(one(stacks(&[OUTPUT], true, false)?))
        };
        let output_norm = f32s(OUTPUT_NORM)?;
        if let Some(p) = &opts.progress {
            p(w, w);
        }

        let cpu_rope = Rope::for_model(&model)?;
        let inv_freq = stream.upload(&cpu_rope.inv_freq, "RoPE frequencies")?;
        let rope = RopeParams {
            style: match hp.rope_style {
                GgufRope::Normal => RopeStyle::Normal,
                GgufRope::Neox => RopeStyle::Neox,
            },
            n_head: hp.n_head,
            head_dim: hp.head_dim,
            n_rot: hp.rope_dim,
            pos_scale: cpu_rope.pos_scale,
        };

        let kv_dim = hp.n_head_kv * hp.head_dim;
        let n_pages = opts.kv_tokens.div_ceil(KV_PAGE).max(1);
        let pool = |what: &str| -> Result<Vec<DeviceBuffer<u16>>> {
            (0..hp.n_layer)
                .map(|_| Ok(stream.alloc::<u16>(n_pages * KV_PAGE * kv_dim, what)?))
                .collect()
        };
        let pools = Pools {
            k: pool("KV cache (K)")?,
            v: pool("KV cache (V)")?,
        };
        let b = max_batch;
        let q_dim = hp.n_head * hp.head_dim;
        let a = |n: usize, what: &str| stream.alloc::<f32>(n.max(1), what);
        // The attention scratch of a one-token step at the pool's last
        // position: the most any decode graph's plan needs, so captures
        // never reallocate it (see `scratch`).
        let (dec_part, dec_ml) = {
            let full = decode_shape(&hp, n_pages * KV_PAGE - 1);
            AttnPlan::choose(
                &full,
                device.info().sm_count as usize,
                opts.decode_attention,
            )
            .scratch_len(&full)
        };
        let work = Workspace {
            inputs: stream.alloc_zeroed::<i32>(
                2 * b + n_pages + SELECT_ARGS + 2 * hp.n_vocab,
                "step inputs",
            )?,
            x: a(b * hp.n_embd, "activations")?,
            h: a(b * hp.n_embd, "activations")?,
            q: a(b * q_dim, "activations")?,
            k: a(b * kv_dim, "activations")?,
            v: a(b * kv_dim, "activations")?,
            att: a(b * q_dim, "activations")?,
            proj: a(b.min(GEMV_TOKENS) * hp.n_embd, "activations")?,
            norm_part: a(hp.n_embd.div_ceil(PACK_ROWS), "activations")?,
            gate: a(b * hp.n_ff, "activations")?,
            up: a(2 * b * hp.n_ff, "activations")?,
            logits: a(LOGIT_ROWS * hp.n_vocab, "logits")?,
            sel_out: stream.alloc::<i32>(2 * SELECT_MAX_K, "token selection")?,
            sel_scratch: stream.alloc_zeroed::<i32>(SELECT_SCRATCH, "token selection scratch")?,
            part: a(dec_part, "attention scratch")?,
            part_ml: a(dec_ml, "attention scratch")?,
        };
        let gemm_part = a(gemm_scratch(&hp, max_batch, gpu), "GEMM split scratch")?;
        stream.synchronize()?;
        let free = Arc::new(Mutex::new((0..n_pages as u32).rev().collect()));
        Ok(Self {
            model,
            kernels,
            stream,
            embd,
            layers,
            output_norm,
            output,
            inv_freq,
            rope,
            max_batch,
            n_pages,
            fuse: opts.fuse,
            persistent: opts.persistent,
            decode_attention: opts.decode_attention,
            graphs: opts.graphs.into(),
            free,
            state: Mutex::new(State {
                work,
                pools,
                graphs: HashMap::new(),
            }),
            gemm_part: Mutex::new(gemm_part),
        })
    }

    pub fn device(&self) -> &Arc<Device> {
        self.kernels.device()
    }

    /// Replay decode steps from a CUDA graph (on), or launch every kernel
    /// (off); benchmarks compare the two.
    pub fn set_graphs(&self, on: bool) {
        self.graphs.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Pages in the KV pool, and pages free.
    pub fn kv_pages(&self) -> (usize, usize) {
        (self.n_pages, lock(&self.free).len())
    }

    /// y = W x for `n` rows of x into the parts of `y` (several: a stacked
    /// matrix, always packed): the GEMV for up to `w.gemv_rows()` rows, the
    /// GEMM for more (y += W x with `accumulate`, GEMM only).
    fn gemm_or_gemv(
        &self,
        w: &Mat,
        x: Input<'_>,
        y: RowSplit<'_, '_>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let (k, s) = (&self.kernels, &self.stream);
        let data = w.data.view();
        debug_assert!(
            w.packed || n > 1 || !accumulate,
            "the row GEMV does not accumulate"
        );
        if let (MatView::Packed(m), true) = (w.view(&data), n <= GEMV_TOKENS) {
            let (x, fold) = self.fold_in(x);
            let out = match y.bufs {
                [y] if accumulate => GemvOut::Add(y),
                _ => GemvOut::Parts(y),
            };
            k.gemv_packed_to(s, &m, x, fold, out, n, None)?;
            return Ok(());
        }
        let Input::Rows(x) = x else {
            unreachable!("a folded norm goes to packed GEMVs only (see `folds`)")
        };
        let mut part = lock(&self.gemm_part);
        match w.view(&data) {
            MatView::Packed(m) => {
                k.gemm_packed_split(s, &m, x, y, n, accumulate, Some(&mut part))?
            }
            MatView::Rows(m) => {
                let [y] = y.bufs else {
                    unreachable!("only packed matrices are stacked")
                };
                if n == 1 {
                    k.gemv(s, &m, x, y)?
                } else {
                    k.gemm(s, &m, x, y, n, accumulate, Some(&mut part))?
                }
            }
        }
        Ok(())
    }

    /// The GEMV's x, and the half of a folded norm it takes, for `x`.
    fn fold_in<'a>(&self, x: Input<'a>) -> (&'a DeviceView<'a, f32>, Option<Fold<'a, 'a>>) {
        match x {
            Input::Rows(x) => (x, None),
            Input::Folded { h, part, n } => {
                let eps = self.model.hparams().rms_eps;
                (
                    h,
                    Some(Fold::Take {
                        part,
                        n_part: n,
                        eps,
                    }),
                )
            }
        }
    }

    /// y = W x for `n` rows of x (y += W x with `accumulate`; not through
    /// the GEMV of GGUF rows).
    fn matmul(
        &self,
        w: &Mat,
        x: Input<'_>,
        y: &mut DeviceBuffer<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let y = RowSplit {
            bufs: &mut [y],
            rows: &[w.rows],
        };
        self.gemm_or_gemv(w, x, y, n, accumulate)
    }

    /// The matrices of `stacks` applied to `n` rows of x, each matrix's
    /// rows into the next buffer of `outs`.
    fn matmul_stacks(
        &self,
        stacks: &[Stack],
        x: Input<'_>,
        mut outs: &mut [&mut DeviceBuffer<f32>],
        n: usize,
    ) -> Result<()> {
        for st in stacks {
            let (mine, rest) = std::mem::take(&mut outs).split_at_mut(st.parts.len());
            outs = rest;
            let y = RowSplit {
                bufs: mine,
                rows: &st.parts,
            };
            self.gemm_or_gemv(&st.mat, x, y, n, false)?;
        }
        Ok(())
    }

    /// gate = silu(gate h) * up h for `n` rows of h: through the SwiGLU
    /// GEMV, or the GEMM into `up` (2 n_ff per row) and swiglu_pairs, for an
    /// interleaved stack; else the two projections and swiglu.
    fn gate_up(
        &self,
        stacks: &[Stack],
        h: Input<'_>,
        gate: &mut DeviceBuffer<f32>,
        up: &mut DeviceBuffer<f32>,
        n: usize,
    ) -> Result<()> {
        let (k, s) = (&self.kernels, &self.stream);
        let n_ff = self.model.hparams().n_ff;
        match stacks {
            [st] if st.glu => {
                let data = st.mat.data.view();
                match st.mat.view(&data) {
                    MatView::Packed(m) if n <= GEMV_TOKENS => {
                        let (h, fold) = self.fold_in(h);
                        k.gemv_packed_to(s, &m, h, fold, GemvOut::Glu(gate), n, None)?;
                    }
                    _ => {
                        self.matmul(&st.mat, h, up, n, false)?;
                        k.swiglu_pairs(s, &up.view(), gate, n, n_ff)?;
                    }
                }
            }
            _ => {
                self.matmul_stacks(stacks, h, &mut [&mut *gate, &mut *up], n)?;
                k.swiglu(s, gate, &up.view(), n * n_ff)?;
            }
        }
        Ok(())
    }

    /// The residual connection x += W a for `n` rows of a. The GEMM, and
    /// with `fuse` the packed GEMV, accumulate into x in place; with
    /// `next_norm` (the weight of the norm that follows, when its GEMVs
    /// take a folded norm: see `folds`) the one-token GEMV also emits that
    /// norm's h and partial sums. Otherwise rows that go through the GEMV
    /// (up to `wt.gemv_rows()`) land in `w.proj` and are left pending: the
    /// next [`Self::norm`] adds them as it normalizes.
    fn matmul_res(
        &self,
        wt: &Mat,
        a: &DeviceView<'_, f32>,
        w: Res<'_>,
        n: usize,
        next_norm: Option<&DeviceBuffer<f32>>,
    ) -> Result<Residual> {
        let data = wt.data.view();
        if let (Some(nw), MatView::Packed(m)) = (next_norm, wt.view(&data)) {
            debug_assert!(self.fuse && n == 1);
            let nv = nw.view();
            let fold = Fold::Emit {
                weight: &nv,
                h: w.h,
                part: w.part,
            };
            let l = self.kernels.gemv_packed_to(
                &self.stream,
                &m,
                a,
                Some(fold),
                GemvOut::Add(w.x),
                1,
                None,
            )?;
            return Ok(Residual::Folded(l.blocks));
        }
        if n <= wt.gemv_rows() && !(wt.packed && self.fuse) {
            self.matmul(wt, Input::Rows(a), w.proj, n, false)?;
            Ok(Residual::Pending)
        } else {
            self.matmul(wt, Input::Rows(a), w.x, n, true)?;
            Ok(Residual::Done)
        }
    }

    /// Whether the norm before `mats` folds into their GEMVs (and the
    /// residual GEMV before it, `producer`): one token, `fuse`, and every
    /// one of them packed.
    fn folds<'m>(&self, producer: &Mat, mut mats: impl Iterator<Item = &'m Mat>, n: usize) -> bool {
        self.fuse && n == 1 && producer.packed && mats.all(|m| m.packed)
    }

    /// h = rmsnorm(x rows `rows`) * weight, adding the pending residual
    /// rows `w.proj` to x first when `pending` (rows then start at 0).
    fn norm(
        &self,
        w: Norm<'_>,
        weight: &DeviceBuffer<f32>,
        rows: std::ops::Range<usize>,
        pending: bool,
    ) -> Result<()> {
        let (k, s) = (&self.kernels, &self.stream);
        let eps = self.model.hparams().rms_eps;
        let d = self.model.hparams().n_embd;
        if pending {
            debug_assert_eq!(rows.start, 0, "pending residual rows start at 0");
            k.add_rmsnorm(s, w.x, &w.proj.view(), &weight.view(), w.h, rows.len(), eps)?;
        } else {
            let x = w.x.slice(rows.start * d..rows.end * d)?;
            k.rmsnorm(s, &x, &weight.view(), w.h, rows.len(), eps)?;
        }
        Ok(())
    }

    /// The norm after a residual connection left as `res`, over `n` rows
    /// into h, unless it was folded into the GEMVs.
    fn norm_after(
        &self,
        w: Norm<'_>,
        weight: &DeviceBuffer<f32>,
        n: usize,
        res: Residual,
    ) -> Result<()> {
        if matches!(res, Residual::Folded(_)) {
            return Ok(());
        }
        self.norm(w, weight, 0..n, res == Residual::Pending)
    }

    /// Take pages so that `cache` holds `len` tokens.
    fn reserve(&self, cache: &mut GpuCache, len: usize) -> Result<()> {
        let need = len.div_ceil(KV_PAGE);
        if need > cache.pages.len() {
            let mut free = lock(&self.free);
            let more = need - cache.pages.len();
            if free.len() < more {
                return Err(ModelError::KvFull {
                    needed: more * KV_PAGE,
                    free: free.len() * KV_PAGE,
                    total: self.n_pages * KV_PAGE,
                });
            }
            let at = free.len() - more;
            cache.pages.extend(free.drain(at..));
        }
        Ok(())
    }

    /// Upload a step's token ids, positions, block table and a selection's
    /// arguments (one copy).
    fn upload_inputs(
        &self,
        w: &mut Workspace,
        tokens: &[u32],
        start: usize,
        pages: &[u32],
        sel: Option<&[i32]>,
    ) -> Result<()> {
        let b = self.max_batch;
        let mut v = vec![0i32; 2 * b + pages.len()];
        for (i, &t) in tokens.iter().enumerate() {
            v[i] = t as i32;
            v[b + i] = (start + i) as i32;
        }
        for (i, &p) in pages.iter().enumerate() {
            v[2 * b + i] = p as i32;
        }
        if let Some(args) = sel {
            v.resize(self.sel_at(), 0);
            v.extend_from_slice(args);
        }
        self.stream.copy_to_device(&v, &mut w.inputs)?;
        Ok(())
    }

    /// Where a selection's arguments start in the step inputs.
    fn sel_at(&self) -> usize {
        2 * self.max_batch + self.n_pages
    }

    /// Select on the device from the logits in `w.logits` (row 0) with the
    /// arguments uploaded with the step's inputs (capturable).
    fn select(&self, w: &mut Workspace) -> Result<()> {
        let args = w.inputs.slice(self.sel_at()..w.inputs.len())?;
        self.kernels.select_top_k(
            &self.stream,
            &mut w.logits,
            self.model.hparams().n_vocab,
            &args,
            self.select_max_k(),
            &mut w.sel_out,
            &mut w.sel_scratch,
        )?;
        Ok(())
    }

    /// Queue the layers for `n` tokens whose inputs are uploaded, positions
    /// from pos[0] (at most `max_start`), attention split by `plan`; with
    /// `last_logits`, then the last token's logits into `w.logits`. Nothing
    /// here allocates or waits, so it can be captured.
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &self,
        w: &mut Workspace,
        pools: &mut Pools,
        n: usize,
        max_start: usize,
        plan: AttnPlan,
        last_logits: bool,
    ) -> Result<()> {
        let hp = self.model.hparams();
        let (s, k) = (&self.stream, &self.kernels);
        let b = self.max_batch;
        let hd = hp.head_dim;
        let (q_dim, kv_dim) = (hp.n_head * hd, hp.n_head_kv * hd);
        let ids = w.inputs.slice(0..n)?;
        let pos_v = w.inputs.slice(b..b + n)?;
        let table = w.inputs.slice(2 * b..2 * b + self.n_pages)?;
        let data = self.embd.data.view();
        match self.embd.view(&data) {
            MatView::Packed(m) => k.embed_packed(s, &m, &ids, &mut w.x)?,
            MatView::Rows(m) => k.embed(s, &m, &ids, &mut w.x)?,
        }
        let shape = AttnShape {
            n_tok: n,
            start: max_start,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hd,
        };
        // How the last residual connection was left (see matmul_res).
        let mut res = Residual::Done;
        let out_w = self.output.as_ref().unwrap_or(&self.embd);
        for (l, layer) in self.layers.iter().enumerate() {
            // Q, K, V of the attention norm (folded into their GEMV, or run
            // here into h).
            self.norm_after(norm_bufs!(w), &layer.attn_norm, n, res)?;
            let (hv, pv) = (w.h.view(), w.norm_part.view());
            let xin = res.input(&hv, &pv);
            let inv_freq = self.inv_freq.view();
            // One token through packed Q/K/V stacks (one, or a run of them
            // per format: a Q4_K_M layer's Q/K and its Q6_K V), no bias,
            // llama's RoPE style: the GEMVs rotate and append to the cache
            // themselves.
            let rope_folded = self.fuse
                && n == 1
                && layer.qkv.iter().all(|st| st.mat.packed)
                && layer.bias.is_none()
                && self.rope.style == RopeStyle::Normal;
            if rope_folded {
                let mut first = 0;
                for st in &layer.qkv {
                    let data = st.mat.data.view();
                    let MatView::Packed(m) = st.mat.view(&data) else {
                        unreachable!("rope_folded: packed")
                    };
                    let (x, fold) = self.fold_in(xin);
                    let parts = first..first + st.parts.len();
                    first = parts.end;
                    let out = GemvOut::RopeKv(RopeKv {
                        parts,
                        q: &mut w.q,
                        n_head_kv: hp.n_head_kv,
                        pos: &pos_v,
                        inv_freq: &inv_freq,
                        p: &self.rope,
                        kpool: &mut pools.k[l],
                        vpool: &mut pools.v[l],
                        table: &table,
                        max_start,
                    });
                    k.gemv_packed_to(s, &m, x, fold, out, 1, None)?;
                }
            } else {
                self.matmul_stacks(&layer.qkv, xin, &mut [&mut w.q, &mut w.k, &mut w.v], n)?;
                if let Some([bq, bk, bv]) = &layer.bias {
                    k.add_rows(s, &mut w.q, &bq.view(), n)?;
                    k.add_rows(s, &mut w.k, &bk.view(), n)?;
                    k.add_rows(s, &mut w.v, &bv.view(), n)?;
                }
                k.rope_kv_append(
                    s,
                    &mut w.q,
                    &w.k.slice(0..n * kv_dim)?,
                    &w.v.slice(0..n * kv_dim)?,
                    hp.n_head_kv,
                    &pos_v,
                    &inv_freq,
                    &self.rope,
                    &mut pools.k[l],
                    &mut pools.v[l],
                    &table,
                    max_start,
                )?;
            }
            k.attention(
                s,
                &shape,
                &w.q.slice(0..n * q_dim)?,
                &pools.k[l].view(),
                &pools.v[l].view(),
                &table,
                &pos_v,
                &mut w.att,
                Some(AttnScratch {
                    part: &mut w.part,
                    part_ml: &mut w.part_ml,
                }),
                Some(plan),
            )?;
            let av = w.att.view();
            let ffn = layer.gate_up.iter().map(|s| &s.mat);
            let emit = self.folds(&layer.wo, ffn, n).then_some(&layer.ffn_norm);
            res = self.matmul_res(&layer.wo, &av, res_bufs!(w), n, emit)?;

            self.norm_after(norm_bufs!(w), &layer.ffn_norm, n, res)?;
            let (hv, pv) = (w.h.view(), w.norm_part.view());
            let xin = res.input(&hv, &pv);
            self.gate_up(&layer.gate_up, xin, &mut w.gate, &mut w.up, n)?;
            let gv = w.gate.view();
            // The norm after the down projection: the next layer's, or the
            // output norm when this step's logits follow.
            let emit = match self.layers.get(l + 1) {
                Some(next) => {
                    let qkv = next.qkv.iter().map(|s| &s.mat);
                    self.folds(&layer.down, qkv, n).then_some(&next.attn_norm)
                }
                None => (last_logits && self.folds(&layer.down, std::iter::once(out_w), n))
                    .then_some(&self.output_norm),
            };
            res = self.matmul_res(&layer.down, &gv, res_bufs!(w), n, emit)?;
        }
        if res == Residual::Pending && (n > 1 || !last_logits) {
            k.add(s, &mut w.x, &w.proj.view(), n * hp.n_embd)?;
            res = Residual::Done;
        }
        if last_logits {
            self.logits(w, n - 1..n, res)?;
        }
        Ok(())
    }

    /// Rows `rows` (at most LOGIT_ROWS) of the final norm and output matmul
    /// into `w.logits`; `pending`: see [`Self::norm`].
    fn logits(&self, w: &mut Workspace, rows: std::ops::Range<usize>, res: Residual) -> Result<()> {
        let n = rows.len();
        let out_w = self.output.as_ref().unwrap_or(&self.embd);
        if let Residual::Folded(_) = res {
            debug_assert_eq!(rows, 0..1, "a folded norm is one token's");
            let (hv, pv) = (w.h.view(), w.norm_part.view());
            return self.matmul(out_w, res.input(&hv, &pv), &mut w.logits, 1, false);
        }
        self.norm(
            norm_bufs!(w),
            &self.output_norm,
            rows,
            res == Residual::Pending,
        )?;
        self.matmul(out_w, Input::Rows(&w.h.view()), &mut w.logits, n, false)
    }

    /// The attention plan of `shape` on this device
    /// (`GpuOptions::decode_attention`).
    fn attn_plan(&self, shape: &AttnShape) -> AttnPlan {
        let sm = self.device().info().sm_count as usize;
        AttnPlan::choose(shape, sm, self.decode_attention)
    }

    /// Make sure the split scratch holds what `plan` needs for `shape`.
    /// A larger scratch is a new buffer: the graphs captured with the old
    /// one are dropped with it.
    fn scratch(
        &self,
        w: &mut Workspace,
        graphs: &mut HashMap<(bool, usize), StepGraph>,
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

    /// The largest position a decode graph for a step at `start` plans its
    /// attention for: powers of two from GRAPH_MIN_CONTEXT tokens, then
    /// multiples of GRAPH_LINEAR_CONTEXT, up to the pool's capacity, so
    /// contexts run few empty key splits (a plan for the whole pool costs
    /// 8B Q4_0 ~9% of its tg128 at position ~100).
    fn graph_bucket(&self, start: usize) -> usize {
        let cap = self.n_pages * KV_PAGE;
        let need = start + 1;
        let bucket = if need <= GRAPH_LINEAR_CONTEXT {
            need.next_power_of_two().max(GRAPH_MIN_CONTEXT)
        } else {
            need.next_multiple_of(GRAPH_LINEAR_CONTEXT)
        };
        bucket.min(cap) - 1
    }

    /// One step of at most max_batch tokens at positions start..start+n;
    /// with `sel` (and `want` Last), the selection from the last logits.
    fn step(
        &self,
        st: &mut State,
        cache: &mut GpuCache,
        tokens: &[u32],
        want: Logits,
        mut out: Option<&mut Vec<f32>>,
        sel: Option<Select<'_>>,
    ) -> Result<()> {
        let hp = self.model.hparams();
        let n = tokens.len();
        let start = cache.len;
        for &t in tokens {
            if t as usize >= hp.n_vocab {
                return Err(ModelError::BadToken {
                    id: t,
                    n_vocab: hp.n_vocab,
                });
            }
        }
        debug_assert!(sel.is_none() || want == Logits::Last);
        self.reserve(cache, start + n)?;
        let State {
            work: w,
            pools,
            graphs,
        } = st;
        self.upload_inputs(w, tokens, start, &cache.pages, sel.as_ref().map(|s| s.args))?;
        let n_vocab = hp.n_vocab;
        let use_graphs = self.graphs.load(std::sync::atomic::Ordering::Relaxed);
        if n == 1 && use_graphs && want != Logits::None {
            // The captured decode step: attention split for the context
            // bucket; graphs with the selection and without.
            let max_start = self.graph_bucket(start);
            let key = (sel.is_some(), max_start);
            if !graphs.contains_key(&key) {
                // (The workspace's scratch already holds this plan's.)
                let shape = decode_shape(hp, max_start);
                let plan = self.attn_plan(&shape);
                self.scratch(w, graphs, &plan, &shape)?;
                let selects = sel.is_some();
                let mut program = match self.persistent {
                    true => Some(DecodeProgram::new(&self.stream, self.decode_ops())?),
                    false => None,
                };
                let graph = self.stream.capture(|_| -> Result<()> {
                    let mut body = || -> Result<()> {
                        self.enqueue(w, pools, 1, max_start, plan, true)?;
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
                graphs.insert(
                    key,
                    StepGraph {
                        graph,
                        _program: program,
                    },
                );
            }
            let g = &graphs[&key].graph;
            // SAFETY: the graph uses the workspace, pools, weights and inputs
            // of this backend, which live as long as it does (the state mutex
            // is held), and the attention scratch it was captured with (a
            // larger scratch drops every graph: see `scratch`).
            unsafe { g.launch()? };
            cache.len = start + 1;
            if let Some(sel) = sel {
                return self.fetch_selection(w, sel);
            }
            if let Some(out) = out {
                let at = out.len();
                out.resize(at + n_vocab, 0.0);
                self.stream
                    .copy_to_host(&w.logits.slice(0..n_vocab)?, &mut out[at..])?;
            }
            return Ok(());
        }
        let shape = AttnShape {
            n_tok: n,
            start,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
        };
        let plan = self.attn_plan(&shape);
        self.scratch(w, graphs, &plan, &shape)?;
        self.enqueue(w, pools, n, start, plan, false)?;
        cache.len = start + n;
        let rows = match want {
            Logits::None => return Ok(()),
            Logits::Last => n - 1..n,
            Logits::All => 0..n,
        };
        for r0 in rows.clone().step_by(LOGIT_ROWS) {
            let r1 = (r0 + LOGIT_ROWS).min(rows.end);
            self.logits(w, r0..r1, Residual::Done)?;
            if let Some(out) = out.as_deref_mut() {
                let at = out.len();
                out.resize(at + (r1 - r0) * n_vocab, 0.0);
                self.stream
                    .copy_to_host(&w.logits.slice(0..(r1 - r0) * n_vocab)?, &mut out[at..])?;
            }
        }
        if let Some(sel) = sel {
            self.select(w)?;
            return self.fetch_selection(w, sel);
        }
        Ok(())
    }

    /// Ops a decode step's program holds at most: a layer records at most
    /// 6 (Q/K/V, attention, combine, o, gate/up, down; more only where
    /// matrices are not stacked), and the output GEMV.
    fn decode_ops(&self) -> usize {
        self.layers.len() * 12 + 4
    }

    /// Copy a finished selection's k ids and logit bits to `sel.out`.
    fn fetch_selection(&self, w: &Workspace, sel: Select<'_>) -> Result<()> {
        sel.out.resize(2 * sel.k, 0);
        self.stream
            .copy_to_host(&w.sel_out.slice(0..2 * sel.k)?, sel.out)?;
        Ok(())
    }
}

impl Backend for GpuBackend {
    type Cache = GpuCache;

    fn hparams(&self) -> &HyperParams {
        self.model.hparams()
    }

    fn new_cache(&self, n_ctx: usize) -> Result<GpuCache> {
        Ok(GpuCache {
            pages: Vec::new(),
            len: 0,
            n_ctx,
            free: self.free.clone(),
        })
    }

    fn forward(&self, cache: &mut GpuCache, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        let mut st = lock(&self.state);
        let mut out = Vec::new();
        self.run(&mut st, cache, tokens, want, Some(&mut out), None)?;
        Ok(out)
    }

    fn max_step(&self) -> usize {
        self.max_batch
    }

    fn select_max_k(&self) -> usize {
        SELECT_MAX_K.min(self.model.hparams().n_vocab)
    }

    fn forward_select(
        &self,
        cache: &mut GpuCache,
        tokens: &[u32],
        sel: &Selection,
    ) -> Result<Vec<(u32, f32)>> {
        let n_vocab = self.model.hparams().n_vocab;
        if sel.k == 0 || sel.k > self.select_max_k() {
            return Err(ModelError::Unsupported(format!(
                "selecting {} tokens on the GPU (1 ..= {})",
                sel.k,
                self.select_max_k()
            )));
        }
        if tokens.is_empty() {
            return Err(ModelError::Unsupported("a selection without tokens".into()));
        }
        let pen: Vec<(u32, u32)> = sel
            .penalties
            .iter()
            .copied()
            .filter(|&(id, _)| (id as usize) < n_vocab)
            .take(n_vocab) // the inputs' room; ids are distinct
            .collect();
        let p = Penalties {
            repeat: sel.repeat,
            frequency: sel.frequency,
            presence: sel.presence,
        };
        let args = select_args(sel.k, p, &pen);
        let mut out = Vec::new();
        let mut st = lock(&self.state);
        let select = Select {
            args: &args,
            k: sel.k,
            out: &mut out,
        };
        self.run(&mut st, cache, tokens, Logits::Last, None, Some(select))?;
        let (ids, bits) = out.split_at(sel.k);
        Ok(ids
            .iter()
            .zip(bits)
            .map(|(&i, &b)| (i as u32, f32::from_bits(b as u32)))
            .collect())
    }
}

impl GpuBackend {
    /// A forward of `tokens` in steps of at most max_batch; the requested
    /// logits go to `out` (None: they stay in the workspace).
    fn run(
        &self,
        st: &mut State,
        cache: &mut GpuCache,
        tokens: &[u32],
        want: Logits,
        mut out: Option<&mut Vec<f32>>,
        mut sel: Option<Select<'_>>,
    ) -> Result<()> {
        let n = tokens.len();
        if cache.len + n > cache.n_ctx {
            return Err(ModelError::ContextFull {
                needed: n,
                used: cache.len,
                n_ctx: cache.n_ctx,
            });
        }
        if n == 0 {
            return Ok(());
        }
        if !Arc::ptr_eq(&cache.free, &self.free) {
            return Err(ModelError::Unsupported(
                "a KV cache of another GPU backend".into(),
            ));
        }
        let steps: Vec<&[u32]> = tokens.chunks(self.max_batch).collect();
        let last = steps.len() - 1;
        let before = cache.len;
        for (i, chunk) in steps.into_iter().enumerate() {
            let want_here = match want {
                Logits::Last if i < last => Logits::None,
                w => w,
            };
            let sel_here = if i == last { sel.take() } else { None };
            if let Err(e) = self.step(st, cache, chunk, want_here, out.as_deref_mut(), sel_here) {
                // A forward appends all of its tokens or none.
                cache.truncate(before);
                return Err(e);
            }
        }
        // Surface errors the kernels raised while running.
        self.stream.synchronize()?;
        Ok(())
    }
}
