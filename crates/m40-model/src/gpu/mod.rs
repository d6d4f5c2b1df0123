//! The GPU backend: the same forward pass as [`crate::cpu`], with weights in
//! their GGUF formats (or packed for the GEMV) in device memory, FP32
//! activations, and a paged FP16 KV cache.
//!
//! - [`weights`]: upload, packing and stacking of the matrices, and what a
//!   model needs (kernel modules, bytes) before anything is allocated.
//! - [`kv`]: the KV pools (their [`crate::KvLayout`]) and a [`GpuCache`] per
//!   sequence: its block table, given by a scheduler's plan
//!   ([`crate::Backend::cache_on`]) or kept by the backend's own [`PagePool`]
//!   ([`crate::Backend::new_cache`]).
//! - [`tuning`]: every threshold that picks a kernel, a step size or a
//!   graph policy, with the measurement behind it.
//! - [`workspace`]: a step's activations, inputs and scratch.
//! - [`forward`]: a step's kernels, queued (capturable).
//! - [`graphs`]: decode steps replayed from captured CUDA graphs, and the
//!   persistent decode kernel's seam.
//!
//! One stream; forward passes of different sequences take turns (a mutex
//! over the workspace). Everything the model needs (weights, the KV pool,
//! the workspace) is computed before anything is allocated; a GPU without
//! that much free memory is a [`ModelError::GpuMemory`] error, not a
//! failure halfway.

mod batch;
mod encoder;
mod forward;
mod graphs;
mod kv;
mod matmul;
mod moe;
mod ops;
mod plan;
mod residual;
mod rope;
mod stage;
mod tuning;
mod weights;
mod workspace;

use std::sync::{Arc, Mutex, MutexGuard};

use m40_device::{Device, DeviceBuffer, Stream};
use m40_gguf::HyperParams;
use m40_kernels::{
    select_args, select_masked, GemmSlots, Kernels, Penalties, MAX_HEAD_DIM, MOE_MAX_EXPERTS,
    SELECT_MAX_K,
};

pub use kv::{GpuCache, PagePool};
pub use m40_kernels::LoadProgress;
pub use m40_kernels::KV_PAGE;
pub use tuning::{JOIN_CHUNK, KV_FIT_HEADROOM};

use crate::error::{ModelError, Result};
use crate::{
    Backend, KvFormat, KvLayout, KvState, Logits, MemoryUse, Model, Selection, SeqStep, Span,
    StepOut,
};
use encoder::EncoderWeights;
use graphs::Graphs;
use kv::Pools;
use ops::LayerOps;
pub use plan::{costs, default_step_tokens};
use plan::{dec_scratch, fit_hint, flops_per_token, gib, kv_pool_tokens, memory_needed};
use rope::Ropes;
use weights::{modules_needed, packs, Weights};
use workspace::{gemm_scratch, Select, Workspace, LOGIT_ROWS};

/// How to set up a [`GpuBackend`].
#[derive(Clone)]
pub struct GpuOptions {
    /// Tokens the KV pool holds, over all sequences together.
    pub kv_tokens: usize,
    /// With `Some(min)`, `kv_tokens` is the most the pool holds: where the
    /// device's memory budget has no room for it beside the weights and the
    /// activations, the pool takes what fits, in whole pages, if that is at
    /// least `min` tokens ([`GpuBackend::kv_pool`] says what it got).
    /// `None`: `kv_tokens` or an error.
    pub kv_min_tokens: Option<usize>,
    /// Tokens per forward step at most (longer prompts run in steps).
    pub max_batch: usize,
    /// The most bytes the backend may allocate (weights, KV pool,
    /// workspace), beside the device's own budget and free memory: the KV
    /// pool shrinks to fit it as it does to fit them.
    pub memory_limit: Option<u64>,
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
    /// default: slower than a launch per kernel on an H100, not yet
    /// measured on an M40 (BENCHMARKS.md).
    pub persistent: bool,
    /// One-token steps' attention in `attn_dec_f32_*` (a block of up to 8
    /// warps per KV head, no split up to 256 keys); false: the warp kernel
    /// and its key splits, as before it (to compare the two:
    /// BENCHMARKS.md).
    pub decode_attention: bool,
    /// Decode steps of several sequences as one forward
    /// (`Backend::forward_batch`): the weights read once for all of them.
    /// Off: each sequence's own step, bitwise what it computes alone (batch
    /// invariance), at one sequence's speed.
    pub batch_decode: bool,
    /// A mixture's steps of several tokens: their expert slots grouped by
    /// expert on the device (`moe_tiles`), packed experts run as grouped
    /// GEMMs (tiles of 32 or 64 slots: prompt chunks) or GEMVs (tiles of up
    /// to 8; from as many slots as experts), each expert read once a tile
    /// instead of once a slot (BENCHMARKS.md, issue 61). On by default;
    /// off: a slot a block row, as before (`bench --no-group-experts`).
    pub group_experts: bool,
    /// A mixture's one-token steps add the experts' weighted sum to x and
    /// emit the next norm folded for the GEMVs after it
    /// (`moe_combine_fold`), one launch a layer fewer (with `fuse`). Off by
    /// default until a GPU has run it (written in a session whose device
    /// time ran out: BENCHMARKS.md, issue 61; `bench --fold-moe-norm`).
    pub fold_moe_norm: bool,
    /// Kernel modules loaded at once (the driver JIT-compiles each on a
    /// first run); default one a core, 1 one after another.
    pub jit_threads: Option<usize>,
    /// How the KV pool's pages store values: FP16, or Q8_0 / Q4_0 blocks
    /// (kernels/kvq.cuh: keys and values rotated, then quantized by the
    /// append; dequantized in registers by attention), which take heads
    /// of a multiple of 64 up to 256 and decoder layers
    /// ([`GpuBackend::takes_kv_format`]). A quantized pool turns the
    /// persistent decode kernel off (its attention reads FP16).
    pub kv_format: KvFormat,
    /// The layers this backend runs (a stage of a model split over
    /// devices, `crate::split`), with the embedding where they start at
    /// the first and the outputs where they end at the last; None: all.
    pub layers: Option<std::ops::Range<usize>>,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            kv_tokens: 4096,
            kv_min_tokens: None,
            max_batch: crate::DEFAULT_STEP,
            progress: None,
            kernel_progress: None,
            graphs: true,
            packed: true,
            fuse: true,
            persistent: false,
            decode_attention: true,
            batch_decode: true,
            group_experts: true,
            fold_moe_norm: false,
            jit_threads: None,
            memory_limit: None,
            kv_format: KvFormat::F16,
            layers: None,
        }
    }
}

struct State {
    work: Workspace,
    pools: Pools,
    graphs: Graphs,
}

/// The GPU backend over one model on one device.
pub struct GpuBackend {
    model: Arc<Model>,
    kernels: Kernels,
    stream: Stream,
    weights: Weights,
    /// An encoder's layers (bert, nomic-bert: `encoder.rs`).
    encoder: Option<EncoderWeights>,
    /// The RoPE table of each kind of layer.
    ropes: Ropes,
    /// Each decoder layer's op list (`ops.rs`), what `enqueue` walks.
    ops: Vec<LayerOps>,
    /// What it allocated (`memory_needed` of its pool).
    memory: MemoryUse,
    max_batch: usize,
    /// `Backend::step_tokens`: [`default_step_tokens`] for this device and
    /// model.
    step_tokens: usize,
    /// The GEMM's block slots on this device (its tiles and splits).
    gemm_slots: GemmSlots,
    /// `GpuOptions::fuse`: one-token steps add the output projections to x
    /// in their GEMV and fold the norms after them.
    fuse: bool,
    /// `GpuOptions::persistent`.
    persistent: bool,
    /// `GpuOptions::decode_attention`.
    decode_attention: bool,
    /// `GpuOptions::batch_decode`.
    batch_decode: bool,
    /// `GpuOptions::group_experts`.
    group_experts: bool,
    /// The layers it runs (`GpuOptions::layers`).
    span: Span,
    graphs: std::sync::atomic::AtomicBool,
    pages: Arc<PagePool>,
    /// The KV pool's layout (FP16 pages of KV_PAGE tokens).
    kv_layout: KvLayout,
    state: Mutex<State>,
    /// The partial tiles of prefill GEMMs split over K (`gemm_scratch`).
    gemm_part: Mutex<DeviceBuffer<f32>>,
}

/// [`GpuBackend::takes_kv_format`] of heads of `head_dim`.
fn takes_kv(format: KvFormat, head_dim: usize, encoder: bool) -> bool {
    format == KvFormat::F16 || (!encoder && kv_type(format).takes(head_dim))
}

/// The kernels' name for a page format.
pub(super) fn kv_type(f: KvFormat) -> m40_kernels::KvType {
    match f {
        KvFormat::Q8_0 => m40_kernels::KvType::Q8_0,
        KvFormat::Q4_0 => m40_kernels::KvType::Q4_0,
        _ => m40_kernels::KvType::F16,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GpuBackend {
    /// The backend for `model` on `device` (`Device::open(ordinal)`).
    pub fn new(device: Arc<Device>, model: Arc<Model>, mut opts: GpuOptions) -> Result<Self> {
        let hp = model.hparams().clone();
        if !Self::takes_kv_format(&hp, opts.kv_format) {
            return Err(ModelError::Unsupported(format!(
                "a {} KV cache on the GPU for {} heads of {} (head sizes that are multiples of 64, \
                 at most 256; decoders only)",
                opts.kv_format.name(),
                hp.arch.name(),
                hp.head_dim
            )));
        }
        let span = match &opts.layers {
            Some(l) => Span::of(&hp, l.clone())?,
            None => Span::whole(&hp),
        };
        // The persistent kernel's program is a whole model's decode step.
        opts.persistent &= opts.kv_format == KvFormat::F16 && span.is_whole();
        if hp.head_dim > MAX_HEAD_DIM || !hp.head_dim.is_multiple_of(2) {
            return Err(ModelError::Unsupported(format!(
                "head dimension {} on the GPU (even, at most {MAX_HEAD_DIM})",
                hp.head_dim
            )));
        }
        if let Some(m) = hp.moe {
            if m.n_expert > MOE_MAX_EXPERTS || !m.n_ff_exp.is_multiple_of(32) {
                return Err(ModelError::Unsupported(format!(
                    "{} experts of FFN {} on the GPU (at most {MOE_MAX_EXPERTS}, FFN a multiple of 32)",
                    m.n_expert, m.n_ff_exp
                )));
            }
        }
        if !hp.n_embd.is_multiple_of(32) || !hp.n_ff.is_multiple_of(32) {
            return Err(ModelError::Unsupported(format!(
                "embedding {} / FFN {} not multiples of 32 on the GPU",
                hp.n_embd, hp.n_ff
            )));
        }
        let max_batch = opts.max_batch.max(1);
        let kernels = Kernels::new(device.clone());
        let mut progress = |p| {
            if let Some(f) = &opts.kernel_progress {
                f(p)
            }
        };
        kernels.load_modules(
            &modules_needed(&model, &opts),
            opts.jit_threads,
            &mut progress,
        )?;
        // The GEMM's slots from a format the model holds (loading another
        // format's kernels would JIT-compile them on a first run).
        let gpu = {
            let l0 = model.layer(0);
            let name = if hp.moe.is_some() {
                &l0.ffn_gate_inp
            } else {
                &l0.ffn_up
            };
            let t = model.tensor(name).info;
            let packed = packs(&opts, t.ty, t.row_len()) && hp.encoder.is_none();
            kernels.gemm_slots_for(t.ty, packed)?
        };
        kernels.load_modules(
            &weights::rows_modules(&model, &opts, gpu),
            opts.jit_threads,
            &mut progress,
        )?;
        // Memory freed on any stream (an engine just dropped, as a server
        // unloads one for room) goes back to the driver at a synchronize:
        // the plan sees it free.
        device.synchronize()?;
        let (free, total) = device.memory()?;
        let limit = (device.budget_left() as u64)
            .min(free as u64)
            .min(opts.memory_limit.unwrap_or(u64::MAX));
        let sms = device.info().sm_count as usize;
        let needed = |t| {
            let (w, kv, work) = memory_needed(&model, &opts, &span, gpu, sms, t);
            w + kv + work
        };
        let kv_tokens = match kv_pool_tokens(opts.kv_tokens, opts.kv_min_tokens, limit, needed) {
            Ok(t) => t,
            Err(fits) => {
                let (w, kv, work) = memory_needed(&model, &opts, &span, gpu, sms, opts.kv_tokens);
                return Err(ModelError::GpuMemory {
                    device: device.info().name.clone(),
                    need: format!(
                        "{} ({} weights, {} KV cache for {} tokens, {} activations)",
                        gib(w + kv + work),
                        gib(w),
                        gib(kv),
                        opts.kv_tokens,
                        gib(work)
                    ),
                    free: match opts.memory_limit.filter(|&l| l < free as u64) {
                        Some(l) => format!(
                            "{} allowed by its memory limit ({} of {} free)",
                            gib(l),
                            gib(free as u64),
                            gib(total as u64)
                        ),
                        None => format!("{} of {} free", gib(free as u64), gib(total as u64)),
                    },
                    hint: fit_hint(fits, opts.kv_tokens, w),
                });
            }
        };
        let (w, _, _) = memory_needed(&model, &opts, &span, gpu, sms, kv_tokens);
        // What it holds, as allocated through the device's budget (the plan
        // above leaves out a few small tables): weights (with the RoPE
        // tables), the KV pool, and the rest.
        let used = || device.budget_used() as u64;
        let before = used();

        let stream = device.new_stream()?;
        let weights = Weights::upload(&model, &opts, &span, &stream, w)?;
        let encoder = EncoderWeights::upload(&model, &stream)?;

        // NeoX heads uploaded with their pairs adjacent rotate as llama's.
        let adjacent = weights::neox_pairs_adjacent(&opts, &hp);
        let ropes = Ropes::upload(&model, adjacent, &stream)?;
        let quant_kv = opts.kv_format != KvFormat::F16;
        let ops = LayerOps::plan(
            &hp,
            &weights,
            &kernels,
            (opts.fuse, opts.fold_moe_norm),
            ropes.style(),
            quant_kv,
        );
        let after_weights = used();

        let layout = KvLayout::new(&hp, KV_PAGE, opts.kv_format).of_layers(span.len());
        let n_pages = layout.pages_for(kv_tokens).max(1);
        let pools = Pools::new(&stream, layout, n_pages)?;
        let after_kv = used();
        let step_tokens = default_step_tokens(
            device.info().peak_fp32_flops(),
            flops_per_token(&model),
            max_batch,
        );
        let dec = dec_scratch(&hp, n_pages, sms, opts.decode_attention);
        let work = Workspace::new(&stream, &hp, max_batch, n_pages, dec)?;
        let gemm_part = stream.alloc::<f32>(
            gemm_scratch(&hp, max_batch, gpu).max(1),
            "GEMM split scratch",
        )?;
        stream.synchronize()?;
        let memory = MemoryUse {
            weights: after_weights - before,
            kv: after_kv - after_weights,
            workspace: used() - after_kv,
            on_device: true,
        };
        Ok(Self {
            model,
            kernels,
            stream,
            weights,
            encoder,
            ropes,
            ops,
            memory,
            max_batch,
            step_tokens,
            gemm_slots: gpu,
            fuse: opts.fuse,
            persistent: opts.persistent,
            decode_attention: opts.decode_attention,
            batch_decode: opts.batch_decode,
            group_experts: opts.group_experts,
            span,
            graphs: opts.graphs.into(),
            pages: PagePool::new(n_pages, KV_PAGE),
            kv_layout: layout,
            state: Mutex::new(State {
                work,
                pools,
                graphs: Graphs::default(),
            }),
            gemm_part: Mutex::new(gemm_part),
        })
    }

    pub fn device(&self) -> &Arc<Device> {
        self.kernels.device()
    }

    /// Whether the GPU holds `hp`'s KV cache in `format`: FP16 always; a
    /// quantized format for decoders whose head size is a multiple of 64,
    /// at most 256 (the rotation's runs, the kernels' head sizes).
    pub fn takes_kv_format(hp: &HyperParams, format: KvFormat) -> bool {
        takes_kv(format, hp.head_dim, hp.arch.encoder())
    }

    /// Replay decode steps from a CUDA graph (on), or launch every kernel
    /// (off); benchmarks compare the two.
    pub fn set_graphs(&self, on: bool) {
        self.graphs.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Pages in the KV pool, and pages free.
    pub fn kv_pages(&self) -> (usize, usize) {
        (self.pages.pages(), self.pages.free_pages())
    }

    /// The KV pool's pages: which are free, which sequences share.
    pub fn page_pool(&self) -> &Arc<PagePool> {
        &self.pages
    }
}

impl Backend for GpuBackend {
    type Cache = GpuCache;

    fn hparams(&self) -> &HyperParams {
        self.model.hparams()
    }

    fn new_cache(&self, n_ctx: usize) -> Result<GpuCache> {
        Ok(GpuCache::new(self.pages.clone(), n_ctx))
    }

    fn forward(&self, cache: &mut GpuCache, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        if let Some(enc) = &self.encoder {
            if want != Logits::Hidden {
                return Err(ModelError::Unsupported("logits of an encoder".into()));
            }
            let mut one = [SeqStep {
                cache,
                tokens,
                want: crate::Want::Hidden,
            }];
            return match self.encoder_batch(enc, &mut one)?.pop() {
                Some(StepOut::Hidden(h)) => Ok(h),
                _ => Ok(Vec::new()),
            };
        }
        let mut st = lock(&self.state);
        let mut out = Vec::new();
        self.run(&mut st, cache, tokens, want, Some(&mut out), None, None)?;
        Ok(out)
    }

    fn max_step(&self) -> usize {
        self.max_batch
    }

    fn step_tokens(&self) -> usize {
        self.step_tokens
    }

    fn select_max_k(&self) -> usize {
        SELECT_MAX_K.min(self.model.hparams().n_vocab)
    }

    fn kv_pool(&self) -> (KvLayout, usize) {
        (self.kv_layout, self.pages.pages())
    }

    fn memory(&self) -> MemoryUse {
        self.memory
    }

    fn step_limits(&self) -> crate::StepLimits {
        crate::StepLimits {
            tokens: self.max_batch,
            seqs: if self.batches_decode() {
                LOGIT_ROWS
            } else {
                usize::MAX
            },
        }
    }

    fn cache_on(
        &self,
        pages: Vec<u32>,
        copy: Option<(u32, u32)>,
        len: usize,
        n_ctx: usize,
    ) -> Result<GpuCache> {
        GpuCache::on_pages(self.pages.clone(), pages, copy, len, n_ctx)
    }

    fn forward_batch(&self, seqs: &mut [SeqStep<'_, GpuCache>]) -> Result<Vec<StepOut>> {
        match &self.encoder {
            Some(enc) => self.encoder_batch(enc, seqs),
            None => self.forward_batch_gpu(seqs),
        }
    }

    fn forward_select(
        &self,
        cache: &mut GpuCache,
        tokens: &[u32],
        sel: &Selection,
    ) -> Result<Vec<(u32, f32)>> {
        let mut st = lock(&self.state);
        self.select_rows(&mut st, cache, tokens, sel, None)
    }
}

impl GpuBackend {
    /// The selection kernel's arguments for `sel` (see `select_args`).
    fn selection_args(&self, sel: &Selection) -> Result<Vec<i32>> {
        let n_vocab = self.model.hparams().n_vocab;
        if sel.k == 0 || sel.k > self.select_max_k() {
            return Err(ModelError::Unsupported(format!(
                "selecting {} tokens on the GPU (1 ..= {})",
                sel.k,
                self.select_max_k()
            )));
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
        Ok(match sel.mask {
            Some(_) => select_masked(args),
            None => args,
        })
    }

    /// A forward of `tokens` in steps of at most max_batch; the requested
    /// logits go to `out` (None: they stay in the workspace). A later
    /// stage's layers take the rows `x` (a row per token); an earlier
    /// stage's give theirs to `out`, whatever `want` says.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        st: &mut State,
        cache: &mut GpuCache,
        tokens: &[u32],
        want: Logits,
        mut out: Option<&mut Vec<f32>>,
        mut sel: Option<Select<'_>>,
        x: Option<&[f32]>,
    ) -> Result<()> {
        let n = tokens.len();
        crate::check_input(
            cache.len(),
            cache.n_ctx(),
            tokens,
            self.model.hparams().n_vocab,
        )?;
        if n == 0 {
            return Ok(());
        }
        if !cache.is_of(&self.pages) {
            return Err(ModelError::Unsupported(
                "a KV cache of another GPU backend".into(),
            ));
        }
        let d = self.model.hparams().n_embd;
        self.check_rows(x, n)?;
        let steps: Vec<&[u32]> = tokens.chunks(self.max_batch).collect();
        let last = steps.len() - 1;
        let before = cache.len();
        for (i, chunk) in steps.into_iter().enumerate() {
            let want_here = match want {
                Logits::Last if i < last => Logits::None,
                w => w,
            };
            let sel_here = if i == last { sel.take() } else { None };
            let at = i * self.max_batch * d;
            let x_here = x.map(|x| &x[at..at + chunk.len() * d]);
            let o = out.as_deref_mut();
            if let Err(e) = self.step(st, cache, chunk, want_here, o, sel_here, x_here) {
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

#[cfg(test)]
mod tests {
    use super::plan::max_kv_tokens;
    use super::*;

    #[test]
    fn quantized_pages_take_decoder_heads_of_multiples_of_64() {
        for f in KvFormat::ALL {
            for hd in [64, 128, 192, 256] {
                assert!(takes_kv(f, hd, false), "{f:?} {hd}");
            }
            let f16 = f == KvFormat::F16;
            assert_eq!(takes_kv(f, 96, false), f16, "{f:?} 96");
            assert_eq!(takes_kv(f, 512, false), f16, "{f:?} 512");
            // An encoder's cache is read by the encoder's FP16 kernels.
            assert_eq!(takes_kv(f, 64, true), f16, "{f:?} encoder");
        }
    }

    #[test]
    fn the_kv_pool_that_fits_is_the_largest_whole_pages_within_the_limit() {
        // 1000 bytes fixed, 10 a token: a limit of 1000 + 10 * 100 holds
        // 100 tokens, 96 in whole pages of 32.
        let total = |t: usize| 1000 + 10 * t as u64;
        assert_eq!(max_kv_tokens(4096, 2000, total), 96);
        // Exactly whole pages: all of them.
        assert_eq!(max_kv_tokens(4096, 1000 + 10 * 128, total), 128);
        // Everything asked fits: what was asked, in whole pages.
        assert_eq!(max_kv_tokens(100, u64::MAX, total), 128);
        // Not one page, or not even the fixed part.
        assert_eq!(max_kv_tokens(4096, 1000 + 10 * 31, total), 0);
        assert_eq!(max_kv_tokens(4096, 500, total), 0);
        // A total that grows faster than linearly (a workspace growing
        // with the pages) is searched the same way.
        let steep = |t: usize| (t as u64) * (t as u64);
        assert_eq!(max_kv_tokens(1 << 20, 100 * 100, steep), 96);
    }

    #[test]
    fn a_pool_with_a_minimum_takes_what_fits() {
        // 1000 bytes fixed, a MiB a token.
        let mib = 1u64 << 20;
        let total = |t: usize| 1000 + mib * t as u64;
        let h = KV_FIT_HEADROOM;
        // What was asked fits: all of it, with or without a minimum.
        assert_eq!(kv_pool_tokens(4096, None, u64::MAX, total), Ok(4096));
        assert_eq!(kv_pool_tokens(4096, Some(64), u64::MAX, total), Ok(4096));
        // It does not: without a minimum, an error saying what fits; with
        // one, the whole pages that fit, less the headroom, while they are
        // at least it.
        let limit = 1000 + 100 * mib;
        assert_eq!(kv_pool_tokens(4096, None, limit, total), Err(96));
        assert_eq!(kv_pool_tokens(4096, Some(64), h + limit, total), Ok(96));
        assert_eq!(kv_pool_tokens(4096, Some(96), h + limit, total), Ok(96));
        assert_eq!(kv_pool_tokens(4096, Some(97), h + limit, total), Err(96));
        // The headroom is kept: of room for 100 tokens, 36 are left, one
        // page.
        assert_eq!(kv_pool_tokens(4096, Some(32), limit, total), Ok(32));
        // Not one page: an error, even with a minimum of none.
        assert_eq!(
            kv_pool_tokens(4096, Some(0), h + 1000 + 31 * mib, total),
            Err(0)
        );
    }

    #[test]
    fn the_default_step_fits_a_quarter_second() {
        // Peak FP32 rates (DeviceInfo::peak_fp32_flops): the M40, 24 SMs
        // of 128 lanes at 1114 MHz; an H100 SXM, 132 at 1980 MHz.
        let m40 = 2.0 * 128.0 * 24.0 * 1114e6;
        let h100 = 2.0 * 128.0 * 132.0 * 1980e6;
        // FLOPs a token: llama-3.1-8B (the embedding gathered), 3.2-1B
        // (tied: its embedding is the output), SmolLM2-135M (tied).
        let (b8, b1, smol) = (2.0 * 7.5e9, 2.0 * 1.24e9, 2.0 * 1.35e8);
        assert_eq!(default_step_tokens(m40, b8, 512), 128);
        assert_eq!(default_step_tokens(m40, b1, 512), 256);
        assert_eq!(default_step_tokens(m40, smol, 512), 512);
        assert_eq!(default_step_tokens(h100, b8, 512), 512);
        // A 70B model on an H100: ~0.24 s for 128 tokens.
        assert_eq!(default_step_tokens(h100, 2.0 * 70e9, 512), 128);
        // Never past the workspace, never below its floor (or the
        // workspace, where that is smaller).
        assert_eq!(default_step_tokens(h100, smol, 256), 256);
        assert_eq!(default_step_tokens(m40, 1e15, 512), 128);
        assert_eq!(default_step_tokens(m40, 1e15, 64), 64);
        assert_eq!(default_step_tokens(0.0, b8, 512), 128);
    }

    #[test]
    fn a_tokens_flops_count_its_matrices() {
        let dir = tempfile::tempdir().unwrap();
        let model = crate::cpu::tiny_model(&dir, 1);
        let hp = model.hparams().clone();
        let (d, ff, l) = (hp.n_embd as f64, hp.n_ff as f64, hp.n_layer as f64);
        let (q, kv) = (
            (hp.n_head * hp.head_dim) as f64,
            (hp.n_head_kv * hp.head_dim) as f64,
        );
        // Q, K, V, O, gate, up, down a layer, and the output matrix.
        let want = 2.0 * (l * (d * (q + 2.0 * kv) + q * d + 3.0 * d * ff) + d * hp.n_vocab as f64);
        assert_eq!(flops_per_token(&model), want);
    }

    #[test]
    fn the_hint_says_what_fits() {
        let h = fit_hint(2048, 1 << 20, 5 << 30);
        assert!(h.contains("2048 tokens fits (of the 1048576 asked)"), "{h}");
        let h = fit_hint(0, 4096, 5 << 30);
        assert!(h.contains("5.00 GiB of weights"), "{h}");
        assert!(h.contains("smaller quantization"), "{h}");
    }
}
