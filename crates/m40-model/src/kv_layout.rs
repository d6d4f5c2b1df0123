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
    /// IEEE half floats, one per value (the GPU's only format so far: its
    /// attention kernels read FP16 pages and do FP32 math).
    #[default]
    F16,
    /// ggml's Q8_0 blocks: 32 values as an f16 scale and 32 signed bytes
    /// (8.5 bits a value); the CPU's attention dequantizes them to FP32.
    Q8_0,
    /// ggml's Q4_0 blocks: 32 values as an f16 scale and 32 nibbles (4.5
    /// bits a value).
    Q4_0,
}

impl KvFormat {
    /// Every format, in the order `--kv-type` lists them.
    pub const ALL: [KvFormat; 3] = [KvFormat::F16, KvFormat::Q8_0, KvFormat::Q4_0];

    /// Bytes `values` values take (a multiple of [`KvFormat::block`]).
    pub fn bytes(self, values: usize) -> u64 {
        let v = values as u64;
        match self {
            KvFormat::F16 => 2 * v,
            KvFormat::Q8_0 => v / 32 * 34,
            KvFormat::Q4_0 => v / 32 * 18,
        }
    }

    /// Values stored together: a row's values must be a multiple of it.
    pub fn block(self) -> usize {
        match self {
            KvFormat::F16 => 1,
            KvFormat::Q8_0 | KvFormat::Q4_0 => 32,
        }
    }

    /// The GGUF type of its blocks (None for plain halves).
    pub fn ggml(self) -> Option<m40_gguf::GgmlType> {
        match self {
            KvFormat::F16 => None,
            KvFormat::Q8_0 => Some(m40_gguf::GgmlType::Q8_0),
            KvFormat::Q4_0 => Some(m40_gguf::GgmlType::Q4_0),
        }
    }

    /// llama.cpp's and Ollama's name for it (`OLLAMA_KV_CACHE_TYPE`).
    pub fn name(self) -> &'static str {
        match self {
            KvFormat::F16 => "f16",
            KvFormat::Q8_0 => "q8_0",
            KvFormat::Q4_0 => "q4_0",
        }
    }

    /// A format by its name (any case); the error lists them.
    pub fn parse(s: &str) -> Result<KvFormat, String> {
        let s = s.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|f| f.name()).collect();
                format!("unknown KV cache type '{s}' (known: {})", names.join(", "))
            })
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

    /// The same pages for `n_layer` layers (a stage's part of a model).
    pub fn of_layers(self, n_layer: usize) -> KvLayout {
        KvLayout { n_layer, ..self }
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
        for f in KvFormat::ALL {
            assert_eq!(KvFormat::parse(&f.name().to_uppercase()), Ok(f));
        }
        assert!(KvFormat::parse("q5_1")
            .unwrap_err()
            .contains("f16, q8_0, q4_0"));
        // A page of 32 x 128 values: 8 KiB in halves, 4352 B in Q8_0, 2304 B in Q4_0.
        let q8 = KvLayout {
            format: KvFormat::Q8_0,
            ..l
        };
        let q4 = KvLayout {
            format: KvFormat::Q4_0,
            ..l
        };
        assert_eq!(q8.pool_bytes(1), 2 * 2 * 4352);
        assert_eq!(q4.pool_bytes(1), 2 * 2 * 2304);
        assert_eq!(q8.token_bytes(), 2 * 2 * 136);
    }
}
