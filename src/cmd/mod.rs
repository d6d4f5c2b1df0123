pub mod bench;
pub mod bench_args;
pub mod bench_batch;
pub mod bench_cpu;
pub mod bench_engine;
mod ceilings;
pub mod embed;
pub mod perplexity;
pub mod run;
pub mod serve;
pub mod show;
pub mod store;
pub mod synth;
pub mod text;

use std::path::PathBuf;

use anyhow::Result;
use m40_store::Store;

/// A model argument (path, store name, or the default model when absent) as a
/// path, fetching catalog models on first use.
pub fn resolve_model(model: Option<&str>) -> Result<PathBuf> {
    resolve_in(&Store::from_env()?, model)
}

/// [`resolve_model`] in `store`.
pub fn resolve_in(store: &Store, model: Option<&str>) -> Result<PathBuf> {
    let name = model.unwrap_or(m40_store::DEFAULT_MODEL);
    // A model fetched on first use shows its download as `pull` does.
    Ok(store.resolve(name, &mut store::Bar::default())?)
}

/// Where a model runs: `--cpu`, `--gpu N`, or the GPU when there is one.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DeviceArgs {
    /// Force the CPU backend.
    #[arg(long, conflicts_with = "gpu")]
    pub cpu: bool,
    /// Run on this GPU (CUDA ordinal) or fail; the default is GPU 0 when
    /// one is usable, else the CPU.
    #[arg(long, value_name = "N")]
    pub gpu: Option<usize>,
    /// On the CPU, multiply in exact FP32 (the reference) instead of
    /// rounding the inputs of Q4_0/Q4_1/Q8_0 matrices to 8 bits as llama.cpp
    /// does (about 2x faster).
    #[arg(long)]
    pub cpu_exact: bool,
    /// Sequences generating at once at most (more wait in line); default:
    /// one per 256 tokens of the KV cache, at most 64 (Ollama's
    /// OLLAMA_NUM_PARALLEL).
    #[arg(long, value_name = "N", env = "M40_NUM_PARALLEL")]
    pub parallel: Option<usize>,
    /// Tokens one batched step runs at most (running decodes first, prompt
    /// chunks fill the rest); default on the GPU what it computes in about
    /// a quarter second (128 to 512: an 8B model on an M40 takes 128), on
    /// the CPU 512.
    #[arg(long, value_name = "N")]
    pub max_batch_tokens: Option<usize>,
    /// Tokens the KV cache holds over all sequences; default on the GPU 16
    /// contexts or as many as its memory has room for, on the CPU 4 (fewer
    /// where the machine has no room), at least one either way.
    #[arg(long, value_name = "N")]
    pub kv_tokens: Option<usize>,
    /// How the KV cache stores K and V: f16, q8_0 (half the memory: twice
    /// the context per GB) or q4_0 (a quarter), on the CPU and the GPU (a
    /// model whose head size is not a multiple of 64 keeps f16 on the GPU,
    /// and says so). Ollama's OLLAMA_KV_CACHE_TYPE.
    #[arg(long, value_name = "TYPE", env = "M40_KV_CACHE_TYPE", default_value = "f16",
          value_parser = m40_runtime::KvFormat::parse)]
    pub kv_type: m40_runtime::KvFormat,
    /// Give every request bitwise the tokens it would get alone, whatever
    /// else runs: on the GPU each sequence's decode step runs alone (one
    /// sequence's speed) instead of in a batch (the CPU is always so).
    #[arg(long)]
    pub batch_invariant: bool,
    /// Compute every prompt in full instead of reusing the KV pages of
    /// earlier requests that started the same way.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// The GPUs the model's layers run on, in layer order: `0,1,2` or
    /// `all`. With more than one, each takes a run of layers in proportion
    /// to its free memory (or --tensor-split), and the placement is
    /// printed.
    #[arg(long, value_name = "LIST", env = "M40_GPUS")]
    pub gpus: Option<String>,
    /// Each GPU's share of the layers, in the order of --gpus (`3,2`).
    #[arg(long, value_name = "SHARES", value_delimiter = ',')]
    pub tensor_split: Option<Vec<f64>>,
    /// Layers on GPUs at most (llama.cpp's -ngl, Ollama's num_gpu): the
    /// first layers run on the CPU. By default as many as fit.
    #[arg(long, alias = "n-gpu-layers", value_name = "N")]
    pub gpu_layers: Option<usize>,
    /// The most memory the model may take on each GPU, GiB (decimals
    /// allowed): a 24 GB M40 emulated on a larger card with 22.
    #[arg(long, value_name = "GIB")]
    pub max_vram: Option<f64>,
    /// How a model goes over the GPUs of --gpus: `layer` (default: its
    /// layers split among them) or `none` (a whole copy on each, every new
    /// sequence on the least loaded: --replicas).
    #[arg(long, value_name = "MODE", value_parser = ["layer", "none"])]
    pub split: Option<String>,
    /// A whole copy of the model on each GPU of --gpus (`--split none`):
    /// for models that fit one card, served to several people at once.
    #[arg(long)]
    pub replicas: bool,
    /// Steps a model split over stages runs at once (default 1: the stages
    /// one after another; one a stage lets every card work while several
    /// people generate), each with its own sequences and share of the KV
    /// cache.
    #[arg(long, value_name = "N")]
    pub steps_in_flight: Option<usize>,
}

/// `--gpus`: "all" (every GPU the driver has) or ordinals.
fn gpu_list(s: &str) -> Option<Vec<usize>> {
    if s.trim().eq_ignore_ascii_case("all") {
        let n = m40_device::Device::count().ok().filter(|&n| n > 0)?;
        return Some((0..n).collect());
    }
    s.split(',')
        .map(|p| p.trim().parse().ok())
        .collect::<Option<Vec<usize>>>()
        .filter(|v| !v.is_empty())
}

impl DeviceArgs {
    /// Engine options for these flags and a context length, with a weight
    /// upload progress line on a terminal.
    pub fn engine_options(&self, n_ctx: Option<usize>) -> m40_runtime::EngineOptions {
        use m40_runtime::{BackendChoice, UploadProgress};
        use std::io::IsTerminal;
        let gpus = self.gpus.as_deref().map(|s| match gpu_list(s) {
            Some(v) => v,
            None => {
                eprintln!("--gpus {s}: expected GPU ordinals (0,1) or `all` with a GPU present");
                std::process::exit(2)
            }
        });
        let backend = match (self.cpu, self.gpu.or(gpus.as_ref().map(|_| 0))) {
            (true, _) => BackendChoice::Cpu,
            (false, Some(_)) => BackendChoice::Gpu,
            (false, None) => BackendChoice::Auto,
        };
        let upload_progress = std::io::stderr().is_terminal().then(|| {
            UploadProgress(std::sync::Arc::new(|done: u64, total: u64| {
                let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
                eprint!(
                    "\ruploading weights: {:.0}/{:.0} MiB",
                    mib(done),
                    mib(total)
                );
                if done >= total {
                    eprintln!();
                }
            }))
        });
        {
            let mut o = m40_runtime::EngineOptions::default();
            o.n_ctx = n_ctx;
            o.backend = backend;
            o.gpu = self.gpu.unwrap_or(0);
            o.chat_template = None;
            o.upload_progress = upload_progress;
            o.kernel_progress = Some(kernel_progress());
            o.cpu_math = if self.cpu_exact {
                m40_runtime::CpuMath::Exact
            } else {
                m40_runtime::CpuMath::Quantized
            };
            o.kv_tokens = self.kv_tokens;
            o.kv_type = self.kv_type;
            o.parallel = self.parallel;
            o.max_batch_tokens = self.max_batch_tokens;
            o.batch_invariant = self.batch_invariant;
            o.no_prefix_cache = self.no_prefix_cache;
            o.gpus = gpus;
            o.tensor_split = self.tensor_split.clone();
            o.gpu_layers = self.gpu_layers;
            o.max_vram = self.max_vram.map(gib_bytes);
            o.replicas = self.replicas || self.split.as_deref() == Some("none");
            o.steps_in_flight = self.steps_in_flight;
            o.step_stats = env_usize("M40_STEP_STATS");
            o.jit_threads = env_usize("M40_JIT_THREADS");
            o
        }
    }
}

/// `g` GiB in bytes (the flags that take GiB with decimals).
pub fn gib_bytes(g: f64) -> u64 {
    (g * (1u64 << 30) as f64) as u64
}

/// A number from the environment (the CLI's diagnostic knobs; the library
/// reads none).
pub fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// Says on stderr what a slow kernel load is (the driver compiling the PTX
/// for this GPU, a first run's cost) and how far it has come; silent when
/// the driver's cache makes it quick.
fn kernel_progress() -> m40_runtime::KernelProgress {
    use std::io::IsTerminal;
    use std::sync::atomic::{AtomicBool, Ordering};
    let tty = std::io::stderr().is_terminal();
    let said = AtomicBool::new(false);
    m40_runtime::KernelProgress(std::sync::Arc::new(move |p: m40_runtime::LoadProgress| {
        let secs = p.elapsed.as_secs_f64();
        let finished = p.done >= p.total;
        if !said.load(Ordering::Relaxed) {
            if finished || secs < 1.0 {
                return;
            }
            said.store(true, Ordering::Relaxed);
            eprintln!(
                "preparing the kernels for this GPU: the driver compiles them on a first run \
                 and caches them (~/.nv/ComputeCache), so later starts take about a second"
            );
        }
        if tty {
            eprint!("\r  {}/{} kernel modules, {secs:.0} s", p.done, p.total);
            if finished {
                eprintln!();
            }
        } else if finished {
            eprintln!("  {} kernel modules ready after {secs:.1} s", p.total);
        }
    }))
}

/// Say where the engine runs (and why not on the GPU, when it fell back).
pub fn report_backend(engine: &m40_runtime::Engine) {
    match engine.backend_note() {
        Some(why) => eprintln!("running on the CPU: {why}"),
        None if engine.activity().replicas > 1 => eprintln!("running {}", engine.backend_name()),
        None => eprintln!("running on the {}", engine.backend_name()),
    }
    if let Some(p) = engine.placement() {
        eprint!("{p}");
    }
}

/// The batching limits a server runs with (the defaults depend on the
/// device and the model).
pub fn report_limits(engine: &m40_runtime::Engine) {
    let l = engine.activity();
    eprintln!(
        "up to {} sequences at once, {} tokens a step; KV cache of {} tokens{}",
        l.parallel,
        l.max_batch_tokens,
        l.kv_pages * l.kv_page_tokens,
        match (l.replicas, l.steps_in_flight) {
            (1, 1) => String::new(),
            (1, n) => format!(" ({n} steps in flight)"),
            (r, 1) => format!(" ({r} replicas)"),
            (r, n) => format!(" ({r} replicas, {n} steps in flight each)"),
        }
    );
}
