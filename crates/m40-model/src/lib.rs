//! m40-model: the transformer as m40-llm runs it.
//!
//! - [`Model`]: a GGUF file, its hyperparameters and checked tensors.
//! - [`Backend`]: what every backend implements (the CPU one here, the GPU
//!   one later): a KV cache per sequence and a forward pass over a batch of
//!   tokens that returns logits.
//! - [`cpu::CpuBackend`]: the exact FP32 reference (weights stay in their GGUF
//!   blocks, KV cache in FP16), the oracle every GPU kernel is checked against.

pub mod cpu;
pub mod error;

use std::path::Path;

use m40_gguf::hparams::{LayerNames, RopeScaling};
use m40_gguf::{GgufFile, HyperParams, TensorView};

pub use error::{ModelError, Result};

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (prompt prefill whose logits nobody reads).
    None,
    /// The last token's: (n_vocab).
    Last,
    /// Every token's: (n_tokens, n_vocab).
    All,
}

/// The interface the engine drives; the CPU and GPU backends implement it.
pub trait Backend: Send + Sync {
    /// Per-sequence state (the KV cache).
    type Cache: KvState + Send;
    fn hparams(&self) -> &HyperParams;
    /// A cache for up to `n_ctx` tokens.
    fn new_cache(&self, n_ctx: usize) -> Result<Self::Cache>;
    /// Run `tokens` at positions `cache.len()..`, appending them to the cache.
    fn forward(&self, cache: &mut Self::Cache, tokens: &[u32], logits: Logits) -> Result<Vec<f32>>;
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

/// A loaded model: the file (memory-mapped) and its checked description.
pub struct Model {
    file: GgufFile,
    hp: HyperParams,
}

impl Model {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(GgufFile::open(path)?)
    }

    pub fn from_file(file: GgufFile) -> Result<Self> {
        let hp = HyperParams::from_file(&file)?;
        if let RopeScaling::Yarn { .. } = hp.rope_scaling {
            return Err(ModelError::Unsupported(
                "YaRN RoPE scaling is not implemented yet".into(),
            ));
        }
        for (name, _) in hp.expected_tensors() {
            let info = file
                .tensor_info(&name)
                .expect("checked by HyperParams::from_file");
            if !info.ty.is_supported() {
                return Err(ModelError::UnsupportedWeight { name, ty: info.ty });
            }
        }
        Ok(Self { file, hp })
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
        LayerNames::new(l)
    }
}
