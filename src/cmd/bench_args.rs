//! `m40-llm bench`'s arguments, shared by its GPU, batched and CPU runs
//! (`bench.rs`, `bench_batch.rs`, `bench_cpu.rs`).

#[derive(clap::Args)]
pub struct Args {
    /// Model file or store name (or use --shape).
    pub model: Option<String>,
    /// Generate a random-weight model of this shape instead (any shape
    /// `m40-llm synth --shape` knows: its help lists them).
    #[arg(long, conflicts_with = "model")]
    pub shape: Option<String>,
    /// Weight type of the generated model.
    #[arg(long = "type", default_value = "Q4_0")]
    pub ty: String,
    /// Prompt tokens of the pp test (0 skips it).
    #[arg(short = 'p', long, default_value_t = 512)]
    pub n_prompt: usize,
    /// Generated tokens of the tg tests (0 skips them).
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n_gen: usize,
    /// Context depth of the second tg test (0 skips it).
    #[arg(short = 'd', long, default_value_t = 4096)]
    pub depth: usize,
    /// How the KV cache stores K and V: f16, q8_0 or q4_0 (`run --kv-type`;
    /// llama-bench and llama-batched-bench get the same as -ctk / -ctv).
    #[arg(long, value_name = "TYPE", default_value = "f16", value_parser = m40_runtime::KvFormat::parse)]
    pub kv_type: m40_runtime::KvFormat,
    /// KV cache size in tokens (0: what the tests need). A server's
    /// context (e.g. 8192) makes the decode steps plan their attention as
    /// they would there.
    #[arg(long, default_value_t = 0)]
    pub ctx: usize,
    /// Timed repetitions per test (the median is reported).
    #[arg(short = 'r', long, default_value_t = 5)]
    pub reps: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Keep the weights in their GGUF row layout instead of repacking them
    /// for the packed GEMV (to compare the two).
    #[arg(long)]
    pub gguf_layout: bool,
    /// Keep Q, K, V and gate, up as separate matrices (one launch each)
    /// instead of stacking them (to compare the two).
    #[arg(long)]
    pub no_fuse: bool,
    /// Run each decode step's GEMVs and attention as one launch of the
    /// persistent decode kernel instead of a launch per kernel inside the
    /// step's graph (to compare the two).
    #[arg(long)]
    pub persistent: bool,
    /// Decode attention in the warp kernel with its key splits instead of
    /// the decode kernel (to compare the two).
    #[arg(long)]
    pub warp_attention: bool,
    /// Do not run llama-bench even when it is on PATH.
    #[arg(long)]
    pub no_llama_bench: bool,
    /// Benchmark the CPU backend instead: pp and tg in tokens/s, as
    /// llama-bench's CPU build reports them.
    #[arg(long)]
    pub cpu: bool,
    /// Threads for --cpu (default: every core).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// With --cpu: the exact FP32 reference instead of 8-bit inputs.
    #[arg(long)]
    pub cpu_exact: bool,
    /// Batched decode instead (llama-batched-bench's table): these numbers
    /// of sequences, each with a prompt of --npp tokens, decoding --ntg
    /// tokens together.
    #[arg(long, value_delimiter = ',', value_name = "B,B,...")]
    pub batch: Vec<usize>,
    /// Prompt tokens per sequence of --batch.
    #[arg(long, default_value_t = 128)]
    pub npp: usize,
    /// Generated tokens per sequence of --batch.
    #[arg(long, default_value_t = 128)]
    pub ntg: usize,
    /// With --batch on the GPU: each sequence's own decode step (bitwise
    /// its solo result) instead of one batched step.
    #[arg(long)]
    pub batch_invariant: bool,
    /// A mixture's steps of several tokens do not group their experts'
    /// slots on the device (`GpuOptions::group_experts` off: a slot a
    /// block row of the experts' GEMVs, and prompt chunks through the
    /// GEMVs, not grouped GEMMs; to compare the two).
    #[arg(long)]
    pub no_group_experts: bool,
    /// A mixture's one-token steps fold the next norm into the experts'
    /// weighted sum (`GpuOptions::fold_moe_norm`: off by default until
    /// measured on a GPU; to compare the two).
    #[arg(long)]
    pub fold_moe_norm: bool,
    /// With --batch: every sequence's tokens constrained by this JSON
    /// schema (a structured output's cost: its masks computed on the host
    /// while each step runs, applied in the selection; a sequence whose
    /// document is complete starts another).
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
    /// The model's layers over these GPUs (`run --gpus`: `0,1`; `0,0` runs
    /// two stages on one GPU), placed by the planner, which is printed.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub gpus: Vec<usize>,
    /// Each GPU's share of the layers (`run --tensor-split`).
    #[arg(long, value_name = "SHARES", value_delimiter = ',')]
    pub tensor_split: Option<Vec<f64>>,
    /// Layers on GPUs at most, the first ones on the CPU (`run
    /// --gpu-layers`; llama-bench gets it as -ngl).
    #[arg(long, value_name = "N")]
    pub gpu_layers: Option<usize>,
    /// The most memory the model may take on each GPU, GiB (`run
    /// --max-vram`); llama-bench gets the GPU layers the planner chose.
    #[arg(long, value_name = "GIB")]
    pub max_vram: Option<f64>,
    /// With --batch: through the engine (its scheduler and step loops, a
    /// thread a request) instead of the backend's batched steps.
    #[arg(long)]
    pub engine: bool,
    /// With --engine: a whole copy of the model on each GPU of --gpus.
    #[arg(long)]
    pub replicas: bool,
    /// With --engine: steps a split model runs at once (`run
    /// --steps-in-flight`).
    #[arg(long, value_name = "N")]
    pub steps_in_flight: Option<usize>,
}

impl Args {
    /// Whether the placement planner runs the model (any of its flags).
    pub fn placed(&self) -> bool {
        !self.gpus.is_empty()
            || self.tensor_split.is_some()
            || self.gpu_layers.is_some()
            || self.max_vram.is_some()
    }

    /// Engine options for the GPU with the placement flags (`run`'s
    /// `--gpus`, `--tensor-split`, `--gpu-layers`, `--max-vram`) and
    /// `--kv-type`.
    pub fn placement_options(&self) -> m40_runtime::EngineOptions {
        let mut o = m40_runtime::EngineOptions::default();
        o.backend = m40_runtime::BackendChoice::Gpu;
        o.gpu = self.gpu;
        o.gpus = (!self.gpus.is_empty()).then(|| self.gpus.clone());
        o.tensor_split = self.tensor_split.clone();
        o.gpu_layers = self.gpu_layers;
        o.max_vram = self.max_vram.map(super::gib_bytes);
        o.kv_type = self.kv_type;
        o
    }

    /// llama.cpp's flags for `--kv-type` (none for f16).
    pub fn llama_kv_args(&self) -> Vec<std::ffi::OsString> {
        match self.kv_type.name() {
            "f16" => Vec::new(),
            t => ["-ctk", t, "-ctv", t].into_iter().map(Into::into).collect(),
        }
    }
}
