//! The GPU backend's tuning plan: every threshold that picks a kernel, a
//! step size or a graph policy, in one place, each with the measurement
//! behind it (BENCHMARKS.md). They were measured on H100s and H200s; none
//! on an M40, which no session could reach: its 24 SMs and ~10x less
//! bandwidth would move the SM-filling rules (`GEMV_FILL_TOKENS`) and the
//! graph thresholds first. The step size follows the device's own FP32
//! rate. The kernels' own shapes (tile rows, page size) are m40-kernels'.

// Memory and step size.

/// Bytes of the device's budget a KV pool sized to what fits
/// (`GpuOptions::kv_min_tokens`) leaves free: steps whose attention splits
/// its keys more than a decode step's grow their scratch (kilobytes to a
/// few megabytes), which would otherwise fail on a full budget.
pub const KV_FIT_HEADROOM: u64 = 64 << 20;

/// The seconds a batched step's rows take at most by default: a long
/// prompt arriving holds every running stream's next token back by about
/// this much (each step runs one chunk of it).
pub(super) const STEP_TARGET_S: f64 = 0.25;

/// The share of the FP32 FMA rate the prefill GEMM runs at (an H100 and an
/// H200: 42-55% at 32 tokens, ~50% at 512; BENCHMARKS.md), taken to be the
/// same on other GPUs (not measured on an M40).
pub(super) const GEMM_SHARE: f64 = 0.5;

/// The fewest tokens the default step takes: two of the GEMM's 64-token
/// tiles, and room for a prompt chunk beside 64 running decodes.
pub(super) const MIN_STEP_TOKENS: usize = 128;

// Batched steps.

/// Prompt chunks of at most this many tokens join a batched step, each
/// token a row at its own position (decode attention over its sequence's
/// keys so far); longer ones run alone, through the prefill attention,
/// which reads each key once per tile of queries instead of once per
/// query.
pub const JOIN_CHUNK: usize = 64;

// Matmul routing.

/// Rows past a GEMM's last full tile at most that the GEMV computes
/// instead (`gemv_tail`), in launches of up to GEMV_TAIL_LAUNCH (the
/// plain batched kernels: from a first token on, which the chunked one
/// does not take).
pub(super) const GEMV_TAIL: usize = 16;

pub(super) const GEMV_TAIL_LAUNCH: usize = 8;

/// Tokens up to which a step runs packed matrices through the batched GEMV
/// (each weight loaded once for every 8 of them, one launch) rather than
/// the GEMM tile. On an H100, an 8B Q4_0's steps of 24 sequences ran 18%
/// faster through the GEMV (3 chunks), of 32 5% slower (BENCHMARKS.md).
pub(super) const GEMV_TOKENS: usize = 24;

/// Tokens up to which a matrix whose GEMM would not give every SM a block
/// (a small model's on a large GPU) takes the batched GEMV (chunks of up to
/// 8 tokens, one launch). On an H200, decode steps of 24-32 sequences ran
/// 1.2-2.0x faster so for SmolLM2's and a 1B's shapes; on an H100,
/// SmolLM2's steps of 48-64 2.3-2.7x (BENCHMARKS.md).
pub(super) const GEMV_MAX_TOKENS: usize = 128;

/// Tokens up to which "would not give every SM a block" is the rule above;
/// from there the GEMM must fill fewer than half the SMs.
pub(super) const GEMV_FILL_TOKENS: usize = 32;

// Mixtures.

/// Steps whose slots average at least this many per expert (a prefill's,
/// on a model of few experts) run each chosen expert as one GEMM over the
/// tokens routed to it ([`GpuBackend::moe_grouped`]) instead of a GEMV per
/// (token, slot), which reads an expert's matrices once for every token
/// that chose it. Fewer rows make GEMMs too small to fill the GPU: on an
/// H100, qwen3-30b-a3b's pp512 (128 experts, 8 a token: 32 rows an
/// expert) ran at 510 t/s grouped against 1235 through the GEMVs.
pub(super) const MOE_GROUP_ROWS: usize = 64;

/// With `GpuOptions::group_experts`, steps whose slots average at least
/// this many per expert run packed experts as grouped GEMMs on the device
/// ([`GpuBackend::moe_gemms`]: tiles of 32 or 64 of an expert's slots, one
/// launch a matrix), below it as grouped GEMVs (tiles of up to 8). At 16
/// a narrow tile is half full on average where the GEMV would read the
/// expert twice for the same slots. Measured on an H100 with prompt
/// chunks of 512: qwen3-30b-a3b 1808 -> 3846 t/s, gpt-oss-20b 1182 ->
/// 3834 (BENCHMARKS.md).
pub(super) const MOE_GEMM_ROWS: usize = 16;

/// Steps of fewer slots than this many per expert (times the experts:
/// one slot an expert on average) keep a slot a block row of the experts'
/// GEMVs: the grouping's own launch and the tiles' gathered rows cost more
/// than the few experts two slots share. H100, S_TG (B = sequences):
/// qwen3-30b-a3b (128 experts, 8 a token) B = 4 904 ungrouped against 812
/// grouped, B = 8 1150 / 1087, B = 16 1342 / 1381, B = 32 1562 / 1911;
/// gpt-oss-20b (32 experts, 4 a token) B = 4 823 / 836, B = 8 937 / 1105.
pub(super) const MOE_GEMV_GROUP_SLOTS: usize = 1;

// CUDA graphs.

/// The smallest context a decode graph plans its attention for (tokens):
/// one page, so the first 32 positions run attention without a key split
/// (and no combine launch; BENCHMARKS.md, "Measurements behind constants").
pub(super) const GRAPH_MIN_CONTEXT: usize = 32;

/// Past this context, decode graphs' buckets grow by this many tokens, not
/// to the next power of two: a step at position 4096 plans attention for
/// 5120 keys (80 splits of 2 pages on an H100, 65 of them with keys), not
/// 8192 (129 splits, half of them past the context, and a combine over all
/// 129; BENCHMARKS.md, "Measurements behind constants").
pub(super) const GRAPH_LINEAR_CONTEXT: usize = 1024;

/// A decode batch's shape is captured the time it runs this often; until
/// then its kernels launch one by one. A capture costs about a step's time
/// more (instantiating a few hundred nodes), and a batch's size changes as
/// sequences join and leave: shapes that run once are not captured.
pub(super) const CAPTURE_AT: u32 = 2;

/// Shapes counted towards a capture at most; past it the counts restart.
pub(super) const SEEN_SHAPES: usize = 4096;

/// Batched-step graphs kept at most (a few hundred nodes each); past it
/// the one used longest ago is dropped (captured again if a step needs it).
pub(super) const BATCH_GRAPHS: usize = 256;

/// Tokens up to which a step of several runs an F32 router (qwen3moe's,
/// gpt-oss's) through `moe_router_tokens` (a block a row and 8 tokens)
/// rather than the GEMM of GGUF rows, whose few blocks walked all of a
/// router of 128 rows at 4 tokens for 61% of qwen3-30b-a3b's step (ncu,
/// H100). Past it the router kernel reads W once a block of 8 tokens (from
/// L2), where the GEMM's tiles reuse it more.
pub(super) const MOE_ROUTER_MAX_TOKENS: usize = 64;
