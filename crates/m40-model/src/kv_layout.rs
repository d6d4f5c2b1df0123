//! How a KV pool is laid out: the format of its values and the shape of a
//! page. Every size of the cache (the memory plans, the pools' allocations,
//! a page's copy) is computed here, so that a new page format (q8_0, q4_0:
//! issue 60) changes this type and the kernels' arguments, not its callers.

use m40_gguf::HyperParams;

/// What a backend holds, bytes: its weights, its KV pool (all of it, as
/// planned: the CPU's pages are taken as first used) and a step's
/// workspace; `on_device` where they are in GPU memory (the CPU's weights
/// are the mapped file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    pub weights: u64,
    pub kv: u64,
    pub workspace: u64,
    pub on_device: bool,
}

impl MemoryUse {
    pub fn total(&self) -> u64 {
        self.weights + self.kv + self.workspace
    }
}

/// How a pool stores K and V values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KvFormat {
    /// IEEE half floats, one per value: both backends' only format today
    /// (the GPU's attention kernels read FP16 pages and do FP32 math).
    #[default]
    F16,
}

impl KvFormat {
    /// Bytes `values` values take.
    pub fn bytes(self, values: usize) -> u64 {
        match self {
            KvFormat::F16 => 2 * values as u64,
        }
    }

    /// llama.cpp's and Ollama's name for it (`OLLAMA_KV_CACHE_TYPE`).
    pub fn name(self) -> &'static str {
        match self {
            KvFormat::F16 => "f16",
        }
    }
}

/// A KV pool's layout: per layer one pool for K and one for V, in pages of
/// `page_tokens` tokens, a token's row `kv_dim` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub format: KvFormat,
    pub page_tokens: usize,
    pub n_layer: usize,
    /// Values of K (or of V) per token and layer: KV heads x head dimension.
    pub kv_dim: usize,
}

impl KvLayout {
    /// The layout of `hp`'s KV cache in pages of `page_tokens`.
    pub fn new(hp: &HyperParams, page_tokens: usize, format: KvFormat) -> KvLayout {
        KvLayout {
            format,
            page_tokens,
            n_layer: hp.n_layer,
            kv_dim: hp.n_head_kv * hp.head_dim,
        }
    }

    /// Values in one layer's K (or V) page.
    pub fn page_values(&self) -> usize {
        self.page_tokens * self.kv_dim
    }

    /// Pages that hold `tokens`.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_tokens)
    }

    /// Bytes one token takes over every layer, K and V.
    pub fn token_bytes(&self) -> u64 {
        2 * self.n_layer as u64 * self.format.bytes(self.kv_dim)
    }

    /// Bytes `pages` pages take over every layer, K and V.
    pub fn pool_bytes(&self, pages: usize) -> u64 {
        2 * self.n_layer as u64 * pages as u64 * self.format.bytes(self.page_values())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_shape() {
        let l = KvLayout {
            format: KvFormat::F16,
            page_tokens: 32,
            n_layer: 2,
            kv_dim: 128,
        };
        assert_eq!(l.page_values(), 4096);
        assert_eq!(
            (l.pages_for(0), l.pages_for(32), l.pages_for(33)),
            (0, 1, 2)
        );
        assert_eq!(l.token_bytes(), 2 * 2 * 128 * 2);
        assert_eq!(l.pool_bytes(3), 3 * 32 * l.token_bytes());
        assert_eq!(KvFormat::default().name(), "f16");
    }
}
