//! How an engine is loaded: [`EngineOptions`] and the choices in it.

use std::sync::Arc;

/// Which backend runs the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// The GPU when one is present and the model fits it, else the CPU
    /// ([`Engine::backend_note`] says why).
    #[default]
    Auto,
    Cpu,
    /// The GPU or an error.
    Gpu,
}

/// Called as weights upload to the GPU: (bytes done, bytes in all).
#[derive(Clone)]
pub struct UploadProgress(pub Arc<dyn Fn(u64, u64) + Send + Sync>);

impl std::fmt::Debug for UploadProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UploadProgress")
    }
}

/// Called while the GPU kernels load: the driver compiles them for the GPU
/// at hand on a first run (seconds; cached after), after each module and
/// every half second.
#[derive(Clone)]
pub struct KernelProgress(pub Arc<dyn Fn(m40_model::gpu::LoadProgress) + Send + Sync>);

impl std::fmt::Debug for KernelProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KernelProgress")
    }
}

/// How to load a model. More options will come: start from
/// `EngineOptions::default()` and set fields.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct EngineOptions {
    /// Context length in tokens: by default the model's context up to
    /// [`DEFAULT_CONTEXT`] (as Ollama); `Some(0)` is the whole context the
    /// model was made for ([`m40_gguf::HyperParams::max_context`]), which
    /// is also the most it may be ([`EngineError::ContextTooLong`]).
    pub n_ctx: Option<usize>,
    pub backend: BackendChoice,
    /// CUDA device ordinal (default 0).
    pub gpu: usize,
    /// A chat template to use instead of the model's.
    pub chat_template: Option<String>,
    pub upload_progress: Option<UploadProgress>,
    pub kernel_progress: Option<KernelProgress>,
    /// How the CPU backend multiplies (default: 8-bit inputs as llama.cpp,
    /// `CpuMath::Exact` for the FP32 reference).
    pub cpu_math: m40_model::cpu::CpuMath,
    /// Tokens the KV cache holds over all sequences together (default: on
    /// the CPU [`DEFAULT_SEQUENCES`] contexts, halved while the machine has
    /// no room for them; on the GPU [`DEFAULT_GPU_SEQUENCES`] contexts, or
    /// as many whole pages as the device has room for; down to one context
    /// either way).
    pub kv_tokens: Option<usize>,
    /// The most bytes the engine may take (weights, KV cache, workspace:
    /// what [`Engine::memory`] reports), where given: its KV cache shrinks
    /// to fit (down to one context), else loading fails as it does when the
    /// device or the machine has no room. A server shares one such budget
    /// among its models (`m40-serve`'s `max_memory`).
    pub memory_limit: Option<u64>,
    /// How the KV cache stores K and V (`--kv-type`; Ollama's
    /// `OLLAMA_KV_CACHE_TYPE`): f16, or ggml's q8_0 / q4_0 blocks (half or
    /// a quarter of the memory a token) on the CPU; the GPU's pages are
    /// f16 so far, and a GPU engine asked for another says so in a warning
    /// and uses f16.
    pub kv_type: m40_model::KvFormat,
    /// Sequences generating at once at most (`--parallel`; default: one
    /// per 256 tokens of the KV cache, at most 64). More wait in line.
    pub parallel: Option<usize>,
    /// Tokens one step runs at most (`--max-batch-tokens`): running
    /// decodes and prompt chunks together (default: on the GPU what it
    /// computes in about a quarter second, 128 to 512
    /// (`m40_model::gpu::default_step_tokens`); on the CPU 512).
    pub max_batch_tokens: Option<usize>,
    /// Every request's tokens bitwise what it gets alone, whatever else
    /// runs (`--batch-invariant`). The CPU always gives that; on the GPU it
    /// runs each sequence's decode step alone (one sequence's speed)
    /// instead of batching them (ARCHITECTURE.md, batch invariance).
    pub batch_invariant: bool,
    /// Do not keep full KV pages for later requests that start with the
    /// same tokens (`--no-prefix-cache`).
    pub no_prefix_cache: bool,
    /// Every N steps, the step loop's mean timings (idle, plan, prepare,
    /// backend, after), rows and sequences, logged through `tracing` at
    /// info level, target `m40_runtime::steps` (the CLI's `M40_STEP_STATS=N`).
    pub step_stats: Option<usize>,
    /// GPU kernel modules loaded at once on a first run (the CLI's
    /// `M40_JIT_THREADS`; default one a core).
    pub jit_threads: Option<usize>,
    /// The GPUs the model's layers may run on (`--gpus 0,1`, `M40_GPUS`),
    /// in layer order; None: [`EngineOptions::gpu`] alone. With more than
    /// one, the placement planner splits the layers among them
    /// ([`Engine::placement`]).
    pub gpus: Option<Vec<usize>>,
    /// Each GPU's share of the layers (`--tensor-split 3,2`), in the order
    /// of `gpus`; default: in proportion to the memory each has room in.
    pub tensor_split: Option<Vec<f64>>,
    /// Layers on GPUs at most (`--gpu-layers`, Ollama's `num_gpu`): the
    /// first layers run on the CPU.
    pub gpu_layers: Option<usize>,
    /// The most bytes the plan may take on each GPU (`--max-vram GB`):
    /// emulates a smaller card (a 24 GB M40) on a larger one.
    pub max_vram: Option<u64>,
    /// A whole copy of the model on each GPU of `gpus` instead of its
    /// layers split among them (`--replicas`, `--split none`): each has its
    /// own step loop, KV pool and prefix cache, and a new sequence runs on
    /// the least loaded. For models that fit one card, served to several
    /// people at once. `parallel`, `kv_tokens` and `memory_limit` apply to
    /// each replica.
    pub replicas: bool,
    /// Steps a model split over stages runs at once (default 1: the
    /// stages one after another): each has its own step loop, sequences
    /// and share of the KV pool, and while one's step runs on a stage the
    /// next runs another's (vLLM's virtual engines), so that every card
    /// works at B >= 2; one a stage is the natural count. At most as many
    /// as the KV pool holds contexts. (Opt-in until it has run on GPUs:
    /// tested on the CPU; without a split, more overlap only the host's
    /// work between steps with the backend's.)
    pub steps_in_flight: Option<usize>,
}

/// Contexts the KV cache holds by default ([`EngineOptions::kv_tokens`]).
pub use m40_model::{DEFAULT_GPU_SEQUENCES, DEFAULT_SEQUENCES};
