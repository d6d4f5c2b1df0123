//! [`AnyBackend`]: the CPU, a GPU, or a model split over several of them,
//! picked at run time.

use m40_gguf::HyperParams;

use crate::error::{ModelError, Result};
use crate::split::{Split, SplitCache, Stage, StageOut};
use crate::{
    cpu, gpu, Backend, KvLayout, KvState, Logits, MemoryUse, Selection, SeqStep, Span, StepLimits,
    StepOut,
};

/// The CPU or the GPU backend, or a model split over several, picked at run
/// time. (One per engine, made once and never moved in a loop: the CPU
/// variant's size costs nothing.)
#[allow(clippy::large_enum_variant)]
pub enum AnyBackend {
    Cpu(cpu::CpuBackend),
    Gpu(Box<gpu::GpuBackend>),
    Split(Box<Split>),
}

/// The cache of an [`AnyBackend`].
pub enum AnyCache {
    Cpu(cpu::CpuCache),
    Gpu(gpu::GpuCache),
    Split(SplitCache),
}

/// `$f` of the backend `$b` is, whichever.
macro_rules! each {
    ($self:expr, $b:ident => $f:expr) => {
        match $self {
            AnyBackend::Cpu($b) => $f,
            AnyBackend::Gpu($b) => $f,
            AnyBackend::Split($b) => $f,
        }
    };
}

/// `$f` of the backend and a cache of the same kind, or an error.
macro_rules! with_cache {
    ($self:expr, $cache:expr, ($b:ident, $c:ident) => $f:expr) => {
        match ($self, $cache) {
            (AnyBackend::Cpu($b), AnyCache::Cpu($c)) => $f,
            (AnyBackend::Gpu($b), AnyCache::Gpu($c)) => $f,
            (AnyBackend::Split($b), AnyCache::Split($c)) => $f,
            _ => Err(other_cache()),
        }
    };
}

fn other_cache() -> ModelError {
    ModelError::Unsupported("a KV cache of another backend".into())
}

impl KvState for AnyCache {
    fn len(&self) -> usize {
        match self {
            AnyCache::Cpu(c) => c.len(),
            AnyCache::Gpu(c) => c.len(),
            AnyCache::Split(c) => c.len(),
        }
    }
    fn n_ctx(&self) -> usize {
        match self {
            AnyCache::Cpu(c) => c.n_ctx(),
            AnyCache::Gpu(c) => c.n_ctx(),
            AnyCache::Split(c) => c.n_ctx(),
        }
    }
    fn truncate(&mut self, n: usize) {
        match self {
            AnyCache::Cpu(c) => c.truncate(n),
            AnyCache::Gpu(c) => c.truncate(n),
            AnyCache::Split(c) => c.truncate(n),
        }
    }
}

impl AnyBackend {
    /// "CPU", the GPU's name, or each stage's device and layers.
    pub fn describe(&self) -> String {
        match self {
            AnyBackend::Cpu(_) => "CPU".into(),
            AnyBackend::Gpu(g) => format!(
                "GPU {} ({})",
                g.device().info().ordinal,
                g.device().info().name
            ),
            AnyBackend::Split(s) => s
                .stages()
                .iter()
                .map(|b| match b.stage_span() {
                    Ok(span) => format!("{} ({})", b.describe(), span.describe()),
                    Err(_) => b.describe(),
                })
                .collect::<Vec<_>>()
                .join(" + "),
        }
    }

    /// The bytes it holds in GPU memory (a split's GPU stages': Ollama's
    /// `size_vram`).
    pub fn gpu_memory(&self) -> u64 {
        match self {
            AnyBackend::Cpu(_) => 0,
            AnyBackend::Gpu(g) => g.memory().total(),
            AnyBackend::Split(s) => s.stages().iter().map(|b| b.gpu_memory()).sum(),
        }
    }

    /// Replay decode steps from CUDA graphs (on) or launch every kernel, on
    /// every GPU it runs on (`GpuBackend::set_graphs`).
    pub fn set_graphs(&self, on: bool) {
        match self {
            AnyBackend::Cpu(_) => {}
            AnyBackend::Gpu(g) => g.set_graphs(on),
            AnyBackend::Split(s) => s.stages().iter().for_each(|b| b.set_graphs(on)),
        }
    }

    /// The layers a CPU or GPU backend runs (a split is not a stage).
    pub fn stage_span(&self) -> Result<Span> {
        match self {
            AnyBackend::Cpu(b) => Ok(b.span().clone()),
            AnyBackend::Gpu(b) => Ok(b.span().clone()),
            AnyBackend::Split(_) => Err(ModelError::Unsupported(
                "a split model as a stage of another".into(),
            )),
        }
    }
}

/// A step's sequences with their caches of the kind `f` takes, or an error
/// before anything runs.
fn mine<'a, 'b, C>(
    seqs: &'b mut [SeqStep<'a, AnyCache>],
    f: impl Fn(&'b mut AnyCache) -> Option<&'b mut C>,
) -> Result<Vec<SeqStep<'b, C>>> {
    seqs.iter_mut()
        .map(|s| {
            Ok(SeqStep {
                cache: f(s.cache).ok_or_else(other_cache)?,
                tokens: s.tokens,
                want: s.want.clone(),
            })
        })
        .collect()
}

fn cpu_of(c: &mut AnyCache) -> Option<&mut cpu::CpuCache> {
    match c {
        AnyCache::Cpu(c) => Some(c),
        _ => None,
    }
}

fn gpu_of(c: &mut AnyCache) -> Option<&mut gpu::GpuCache> {
    match c {
        AnyCache::Gpu(c) => Some(c),
        _ => None,
    }
}

fn split_of(c: &mut AnyCache) -> Option<&mut SplitCache> {
    match c {
        AnyCache::Split(c) => Some(c),
        _ => None,
    }
}

impl Backend for AnyBackend {
    type Cache = AnyCache;

    fn hparams(&self) -> &HyperParams {
        each!(self, b => b.hparams())
    }

    fn new_cache(&self, n_ctx: usize) -> Result<AnyCache> {
        Ok(match self {
            AnyBackend::Cpu(b) => AnyCache::Cpu(b.new_cache(n_ctx)?),
            AnyBackend::Gpu(b) => AnyCache::Gpu(b.new_cache(n_ctx)?),
            AnyBackend::Split(b) => AnyCache::Split(b.new_cache(n_ctx)?),
        })
    }

    fn forward(&self, cache: &mut AnyCache, tokens: &[u32], logits: Logits) -> Result<Vec<f32>> {
        with_cache!(self, cache, (b, c) => b.forward(c, tokens, logits))
    }

    fn max_step(&self) -> usize {
        each!(self, b => b.max_step())
    }

    fn step_tokens(&self) -> usize {
        each!(self, b => b.step_tokens())
    }

    fn select_max_k(&self) -> usize {
        each!(self, b => b.select_max_k())
    }

    fn kv_pool(&self) -> (KvLayout, usize) {
        each!(self, b => b.kv_pool())
    }

    fn memory(&self) -> MemoryUse {
        each!(self, b => b.memory())
    }

    fn step_limits(&self) -> StepLimits {
        each!(self, b => b.step_limits())
    }

    fn cache_on(
        &self,
        pages: Vec<u32>,
        copy: Option<(u32, u32)>,
        len: usize,
        n_ctx: usize,
    ) -> Result<AnyCache> {
        Ok(match self {
            AnyBackend::Cpu(b) => AnyCache::Cpu(b.cache_on(pages, copy, len, n_ctx)?),
            AnyBackend::Gpu(b) => AnyCache::Gpu(b.cache_on(pages, copy, len, n_ctx)?),
            AnyBackend::Split(b) => AnyCache::Split(b.cache_on(pages, copy, len, n_ctx)?),
        })
    }

    fn forward_batch(&self, seqs: &mut [SeqStep<'_, AnyCache>]) -> Result<Vec<StepOut>> {
        match self {
            AnyBackend::Cpu(b) => b.forward_batch(&mut mine(seqs, cpu_of)?),
            AnyBackend::Gpu(b) => b.forward_batch(&mut mine(seqs, gpu_of)?),
            AnyBackend::Split(b) => b.forward_batch(&mut mine(seqs, split_of)?),
        }
    }

    fn forward_select(
        &self,
        cache: &mut AnyCache,
        tokens: &[u32],
        sel: &Selection,
    ) -> Result<Vec<(u32, f32)>> {
        with_cache!(self, cache, (b, c) => b.forward_select(c, tokens, sel))
    }
}

/// A CPU or GPU backend as a stage of a [`Split`].
impl Stage for AnyBackend {
    fn span(&self) -> &Span {
        match self {
            AnyBackend::Cpu(b) => b.span(),
            AnyBackend::Gpu(b) => b.span(),
            // Never a stage: `Split::new` refuses it.
            AnyBackend::Split(b) => b.stages()[0].span(),
        }
    }

    fn stage_forward(
        &self,
        cache: &mut AnyCache,
        tokens: &[u32],
        x: Option<&[f32]>,
        want: Logits,
    ) -> Result<Vec<f32>> {
        match (self, cache) {
            (AnyBackend::Cpu(b), AnyCache::Cpu(c)) => b.stage_forward(c, tokens, x, want),
            (AnyBackend::Gpu(b), AnyCache::Gpu(c)) => b.stage_forward(c, tokens, x, want),
            _ => Err(other_cache()),
        }
    }

    fn stage_select(
        &self,
        cache: &mut AnyCache,
        tokens: &[u32],
        x: Option<&[f32]>,
        sel: &Selection,
    ) -> Result<Vec<(u32, f32)>> {
        match (self, cache) {
            (AnyBackend::Cpu(b), AnyCache::Cpu(c)) => b.stage_select(c, tokens, x, sel),
            (AnyBackend::Gpu(b), AnyCache::Gpu(c)) => b.stage_select(c, tokens, x, sel),
            _ => Err(other_cache()),
        }
    }

    fn stage_batch(
        &self,
        seqs: &mut [SeqStep<'_, AnyCache>],
        x: Option<&[f32]>,
    ) -> Result<StageOut> {
        match self {
            AnyBackend::Cpu(b) => b.stage_batch(&mut mine(seqs, cpu_of)?, x),
            AnyBackend::Gpu(b) => b.stage_batch(&mut mine(seqs, gpu_of)?, x),
            AnyBackend::Split(_) => Err(ModelError::Unsupported(
                "a split model as a stage of another".into(),
            )),
        }
    }
}
