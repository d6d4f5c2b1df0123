//! m40-model: the transformer as m40-llm runs it.
//!
//! - [`Model`]: a GGUF file, its hyperparameters and checked tensors.
//! - [`Backend`]: what every backend implements (the CPU one and the GPU one): a KV cache per sequence and a forward pass over a batch of
//!   tokens that returns logits.
//! - [`cpu::CpuBackend`]: the exact FP32 reference (weights stay in their GGUF
//!   blocks, KV cache in FP16), the oracle every GPU kernel is checked against.
//! - [`gpu::GpuBackend`]: the same forward pass with the kernels of
//!   m40-kernels, over a paged FP16 KV cache.

mod any;
pub mod batch;
pub mod cpu;
pub mod error;
pub mod gpu;
pub(crate) mod host;
mod kv_layout;
mod mask;
pub mod paged;
pub mod placement;
mod span;
pub mod split;

use std::path::Path;

use m40_gguf::hparams::LayerNames;
use m40_gguf::{GgufFile, HyperParams, TensorView};

pub use any::{AnyBackend, AnyCache};
pub use batch::{SeqStep, StepLimits, StepOut, Want};
pub use error::{ModelError, Result};
pub use kv_layout::{KvFormat, KvLayout, MemoryUse};
pub use mask::{apply_mask, MaskFiller, MaskSlot, MaskWords};
pub use span::Span;

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (prompt prefill whose logits nobody reads).
    None,
    /// The last token's: (n_vocab).
    Last,
    /// Every token's: (n_tokens, n_vocab).
    All,
    /// No logits: every token's final hidden state, after the output norm
    /// where the model has one (n_tokens, n_embd): what embeddings pool.
    Hidden,
}

/// The interface the engine drives; the CPU and GPU backends implement it.
/// Tokens per forward step unless a backend is built for another: bounds
/// the activation memory of one forward (the GPU's default workspace).
pub const DEFAULT_STEP: usize = 512;

pub trait Backend: Send + Sync {
    /// Per-sequence state (the KV cache).
    type Cache: KvState + Send;
    fn hparams(&self) -> &HyperParams;
    /// A cache for up to `n_ctx` tokens.
    fn new_cache(&self, n_ctx: usize) -> Result<Self::Cache>;
    /// Run `tokens` at positions `cache.len()..`, appending them to the cache.
    fn forward(&self, cache: &mut Self::Cache, tokens: &[u32], logits: Logits) -> Result<Vec<f32>>;
    /// The most tokens one step of [`Backend::forward`] takes: the GPU's
    /// workspace; [`DEFAULT_STEP`] on the CPU, whose activations grow with
    /// the tokens given. A forward of more runs in such steps; a caller
    /// that wants to act between steps (cancel a prompt) gives it one step
    /// at a time.
    fn max_step(&self) -> usize {
        DEFAULT_STEP
    }
    /// Tokens a batched step of several sequences takes by default (the
    /// scheduler's budget, `--max-batch-tokens`), at most
    /// [`Backend::max_step`]: on the GPU, what the device computes in about
    /// a quarter second ([`gpu::default_step_tokens`]); else `max_step`.
    fn step_tokens(&self) -> usize {
        self.max_step()
    }
    /// What one [`Backend::forward_batch`] takes at most: a scheduler that
    /// plans within these limits has each step run as planned (on the GPU,
    /// one batched forward, and each prompt chunk longer than
    /// `gpu::JOIN_CHUNK` through the prefill attention).
    /// The memory it holds (weights, KV pool, workspace).
    fn memory(&self) -> MemoryUse;
    fn step_limits(&self) -> StepLimits {
        StepLimits {
            tokens: self.max_step(),
            seqs: usize::MAX,
        }
    }
    /// The KV pool every cache of this backend is in: (its layout: the
    /// page format and tokens per page, and its pages). [`Backend::new_cache`]'s caches take its pages through the
    /// backend's own accounting; a caller that keeps the accounting itself
    /// (m40-sched's KV manager) gives each step's pages with
    /// [`Backend::cache_on`] instead. One or the other: a backend refuses
    /// the second while caches of its own hold pages.
    fn kv_pool(&self) -> (KvLayout, usize);
    /// A cache of up to `n_ctx` tokens on the pool pages `pages` (its block
    /// table, which the caller's ledger owns), whose first `len` tokens are
    /// computed; `copy` (page, page), where given, is made before its first
    /// write (the second page replaces the first, shared, in `pages`). It
    /// takes and frees no page: writing past `pages` is an error.
    fn cache_on(
        &self,
        pages: Vec<u32>,
        copy: Option<(u32, u32)>,
        len: usize,
        n_ctx: usize,
    ) -> Result<Self::Cache>;
    /// The largest `k` [`Backend::forward_select`] takes; 0: this backend
    /// does not select (the caller samples from [`Backend::forward`]'s logits).
    fn select_max_k(&self) -> usize {
        0
    }
    /// [`Backend::forward`] for the last token's logits, which stay where
    /// they are computed: the penalties of `sel` are applied to them and
    /// only the `sel.k` highest come back, sorted (logit descending, lower
    /// id first on ties): (id, penalized logit).
    fn forward_select(
        &self,
        _cache: &mut Self::Cache,
        _tokens: &[u32],
        _sel: &Selection,
    ) -> Result<Vec<(u32, f32)>> {
        Err(ModelError::Unsupported(
            "token selection on this backend".into(),
        ))
    }
    /// One step over several sequences: each one's tokens at its own
    /// positions, appended to its own cache, with what its [`Want`] asks
    /// for. A sequence's results are those of its own
    /// [`Backend::forward`] (bitwise where the backend's kernels allow;
    /// see ARCHITECTURE.md on batch invariance). Nothing is changed when
    /// an error is returned for a sequence's input (a bad token, a full
    /// context). The default runs each sequence's forward in turn.
    fn forward_batch(&self, seqs: &mut [SeqStep<'_, Self::Cache>]) -> Result<Vec<StepOut>> {
        batch::forward_each(self, seqs)
    }
}

/// What [`Backend::forward_select`] returns: the `k` best tokens after the
/// sampling penalties (llama.cpp's: a logit l of a token seen c times in the
/// window becomes (l > 0 ? l / repeat : l * repeat) - (c * frequency +
/// presence)).
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    pub k: usize,
    /// Distinct token ids and their counts in the penalty window (empty:
    /// no penalties).
    pub penalties: Vec<(u32, u32)>,
    pub repeat: f32,
    pub frequency: f32,
    pub presence: f32,
    /// A structured output's token mask, applied before the penalties: a
    /// token it does not allow is -inf (it may still be computed while the
    /// step runs: the backend waits for it just before the selection).
    pub mask: Option<MaskSlot>,
}

impl Selection {
    /// The argmax, no penalties: what a greedy request asks for.
    pub fn greedy() -> Selection {
        Selection {
            k: 1,
            penalties: Vec::new(),
            repeat: 1.0,
            frequency: 0.0,
            presence: 0.0,
            mask: None,
        }
    }
}

/// Whether `tokens` may follow the `used` tokens of a cache of `n_ctx`: the
/// room for them, and every id in the vocabulary (each backend checks a
/// step's input with this before anything changes).
pub(crate) fn check_input(used: usize, n_ctx: usize, tokens: &[u32], n_vocab: usize) -> Result<()> {
    if used + tokens.len() > n_ctx {
        return Err(ModelError::ContextFull {
            needed: tokens.len(),
            used,
            n_ctx,
        });
    }
    match tokens.iter().find(|&&t| t as usize >= n_vocab) {
        Some(&id) => Err(ModelError::BadToken { id, n_vocab }),
        None => Ok(()),
    }
}

/// What the engine needs to know of any backend's cache.
pub trait KvState {
    /// Tokens stored.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Capacity in tokens.
    fn n_ctx(&self) -> usize;
    /// Forget everything from position `n` on.
    fn truncate(&mut self, n: usize);
}

/// Contexts a KV cache holds by default over all sequences together (the
/// CPU's; the GPU's: [`DEFAULT_GPU_SEQUENCES`]).
pub const DEFAULT_SEQUENCES: usize = 4;

/// Contexts the GPU's KV pool holds by default, or as many as the device's
/// memory has room for beside the model, at least one: a server's
/// sequences decode together, and a pool of a few contexts preempts them
/// once their generations grow long.
pub const DEFAULT_GPU_SEQUENCES: usize = 16;

/// The context a model is run with when none is asked for, where the
/// model allows as much (Ollama's default).
pub const DEFAULT_CONTEXT: usize = 4096;

/// A loaded model: the file (memory-mapped) and its checked description.
pub struct Model {
    file: GgufFile,
    hp: HyperParams,
    context: usize,
}

impl Model {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(GgufFile::open(path)?)
    }

    pub fn from_file(mut file: GgufFile) -> Result<Self> {
        let hp = HyperParams::from_file(&file)?;
        hp.unfuse(&mut file)?;
        for (name, _) in hp.expected_tensors() {
            let info = file
                .tensor_info(&name)
                .expect("checked by HyperParams::from_file");
            if !info.ty.is_supported() {
                return Err(ModelError::UnsupportedWeight { name, ty: info.ty });
            }
        }
        let context = hp.max_context().min(DEFAULT_CONTEXT);
        Ok(Self { file, hp, context })
    }

    /// The context (tokens per sequence) the model will run with: LongRoPE
    /// (phi3) takes its long factors beyond the original context and its
    /// short ones up to it, as llama.cpp chooses by its context. Without
    /// this, [`DEFAULT_CONTEXT`] or the model's own if shorter.
    pub fn with_context(mut self, n_ctx: usize) -> Self {
        self.context = n_ctx;
        self
    }

    pub fn context(&self) -> usize {
        self.context
    }

    pub fn hparams(&self) -> &HyperParams {
        &self.hp
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    pub(crate) fn tensor(&self, name: &str) -> TensorView<'_> {
        self.file.tensor(name).expect("tensors are checked at load")
    }

    pub(crate) fn layer(&self, l: usize) -> LayerNames {
        self.hp.layer_names(l)
    }
}

/// The index of the largest logit (the first one on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| {
            if v > b.1 {
                (i, v)
            } else {
                b
            }
        })
        .0 as u32
}
