//! The model shapes `m40-llm synth --shape` knows: tiny test shapes per
//! architecture and the real shapes of the models people run.

use crate::hparams::{Arch, Pooling};

/// A model shape `m40-llm synth --shape` knows.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// The head size the file states (`attention.key_length`; qwen3's
    /// files always do, and from 0.6B to 4B it is not n_embd / n_head);
    /// `None`: n_embd / n_head, unstated.
    pub head_dim: Option<usize>,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub rope_freq_base: f32,
    pub tied_output: bool,
    /// Gemma: `attention.sliding_window` and `sliding_window_pattern` (the
    /// period n: layers l % n < n - 1 slide), and the global layers'
    /// linear RoPE scaling factor (`rope.scaling.factor`; 1: none).
    pub swa: Option<(usize, usize)>,
    pub rope_linear: f32,
    /// gemma2's `attn_logit_softcapping`, where not its default (50).
    pub attn_softcap: Option<f32>,
    /// A mixture of experts: (experts, used per token, their FFN size).
    pub moe: Option<(usize, usize, usize)>,
    /// YaRN RoPE scaling: (factor, original context, beta_fast, beta_slow,
    /// log multiplier; the last three written where not llama.cpp's
    /// defaults 32, 1, 0).
    pub yarn: Option<(f32, usize, f32, f32, f32)>,
    /// `attention.temperature_scale` (mistral3).
    pub attn_temp: Option<f32>,
    /// LongRoPE (phi3): the original context, `rope.scaling.attn_factor`,
    /// and `rope_factors_long` / `_short` tensors.
    pub longrope: Option<(usize, f32)>,
    /// Rotated dimensions per head (`rope.dimension_count`), where fewer
    /// than the head size (Phi-4-mini: 96 of 128).
    pub rope_dim: Option<usize>,
    /// `pooling_type`: an embedding model's (encoders, qwen3-embedding).
    /// A decoder that pools its last token also adds EOS to its input.
    pub pooling: Option<Pooling>,
}

/// The shapes the synthesizer knows: `tiny` matches the quant zoo.
/// What a shape does not state: a head size of n_embd / n_head, no window,
/// no RoPE scaling, gemma2's default soft-cap, a dense FFN.
const PLAIN: Shape = Shape {
    name: "",
    arch: Arch::Llama,
    n_layer: 0,
    n_embd: 0,
    n_head: 0,
    n_head_kv: 0,
    head_dim: None,
    n_ff: 0,
    n_vocab: 0,
    n_ctx_train: 0,
    rope_freq_base: 10000.0,
    tied_output: false,
    swa: None,
    rope_linear: 1.0,
    attn_softcap: None,
    moe: None,
    yarn: None,
    attn_temp: None,
    longrope: None,
    rope_dim: None,
    pooling: None,
};

/// qwen3-tiny (in SHAPES), also the base of qwen3-embedding-tiny.
const QWEN3_TINY: Shape = Shape {
    name: "qwen3-tiny",
    arch: Arch::Qwen3,
    head_dim: Some(64),
    n_layer: 2,
    n_embd: 128,
    n_head: 4,
    n_head_kv: 2,
    n_ff: 384,
    n_vocab: 512,
    n_ctx_train: 4096,
    rope_freq_base: 1000000.0,
    tied_output: false,
    ..PLAIN
};

/// gemma3-tiny (in SHAPES), also the base of gemma3-tiny-256.
const GEMMA3_TINY: Shape = Shape {
    name: "gemma3-tiny",
    arch: Arch::Gemma3,
    head_dim: Some(64),
    n_layer: 3,
    n_embd: 128,
    n_head: 4,
    n_head_kv: 2,
    n_ff: 384,
    n_vocab: 512,
    n_ctx_train: 32768,
    rope_freq_base: 1000000.0,
    tied_output: true,
    swa: Some((5, 3)),
    rope_linear: 8.0,
    ..PLAIN
};

pub const SHAPES: &[Shape] = &[
    Shape {
        name: "tiny",
        arch: Arch::Llama,
        n_layer: 2,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        n_vocab: 512,
        n_ctx_train: 2048,
        rope_freq_base: 10000.0,
        tied_output: false,
        ..PLAIN
    },
    Shape {
        name: "smollm2-135m",
        arch: Arch::Llama,
        n_layer: 30,
        n_embd: 576,
        n_head: 9,
        n_head_kv: 3,
        n_ff: 1536,
        n_vocab: 49152,
        n_ctx_train: 8192,
        rope_freq_base: 100000.0,
        tied_output: true,
        ..PLAIN
    },
    Shape {
        name: "llama-1b",
        arch: Arch::Llama,
        n_layer: 16,
        n_embd: 2048,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 8192,
        n_vocab: 128256,
        n_ctx_train: 131072,
        rope_freq_base: 500000.0,
        tied_output: true,
        ..PLAIN
    },
    Shape {
        name: "llama-8b",
        arch: Arch::Llama,
        n_layer: 32,
        n_embd: 4096,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 14336,
        n_vocab: 128256,
        n_ctx_train: 131072,
        rope_freq_base: 500000.0,
        tied_output: false,
        ..PLAIN
    },
    // Qwen2's tiny test shape: Q/K/V biases and NeoX RoPE.
    Shape {
        name: "qwen2-tiny",
        arch: Arch::Qwen2,
        n_layer: 2,
        n_embd: 128,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 384,
        n_vocab: 512,
        n_ctx_train: 4096,
        rope_freq_base: 1000000.0,
        tied_output: true,
        ..PLAIN
    },
    // Qwen3's tiny test shape: a head size (64) that is not n_embd / n_head.
    QWEN3_TINY,
    Shape {
        name: "qwen3-8b",
        arch: Arch::Qwen3,
        head_dim: Some(128),
        n_layer: 36,
        n_embd: 4096,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 12288,
        n_vocab: 151936,
        n_ctx_train: 40960,
        rope_freq_base: 1000000.0,
        tied_output: false,
        ..PLAIN
    },
    // Gemma's tiny test shapes: head size 64 (not 128 / 4), a window of
    // 5 keys so a 16-token test crosses it, global and window layers.
    Shape {
        name: "gemma2-tiny",
        arch: Arch::Gemma2,
        head_dim: Some(64),
        n_layer: 2,
        n_embd: 128,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 384,
        n_vocab: 512,
        n_ctx_train: 8192,
        rope_freq_base: 10000.0,
        tied_output: true,
        swa: Some((5, 2)),
        // Small enough that capping changes the random model's scores.
        attn_softcap: Some(1.5),
        ..PLAIN
    },
    GEMMA3_TINY,
    // gemma3-tiny with the real models' head size, 256: the GPU's decode
    // attention for it (queries 1024 wide over a 128-wide residual).
    Shape {
        name: "gemma3-tiny-256",
        head_dim: Some(256),
        n_layer: 2,
        swa: Some((5, 2)),
        ..GEMMA3_TINY
    },
    // Granite's tiny test shape: head size 64 (its attention multiplier
    // 1/64, not 1/8).
    Shape {
        name: "granite-tiny",
        arch: Arch::Granite,
        n_layer: 2,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        n_vocab: 512,
        n_ctx_train: 4096,
        rope_freq_base: 10000000.0,
        tied_output: true,
        ..PLAIN
    },
    // Mistral 3's tiny test shape: YaRN (factor 16 over an original
    // context of 8, betas 4 and 0.75, log multiplier 0.5) and the
    // attention temperature from position 8, so a 16-token test crosses
    // it. RoPE base 2 puts YaRN's ramp over pairs 0-25 of 32 (with base
    // 10^6 and this context it would cover none).
    Shape {
        name: "mistral3-tiny",
        arch: Arch::Mistral3,
        head_dim: Some(64),
        n_layer: 2,
        n_embd: 128,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 384,
        n_vocab: 512,
        n_ctx_train: 512,
        rope_freq_base: 2.0,
        tied_output: false,
        yarn: Some((16.0, 8, 4.0, 0.75, 0.5)),
        attn_temp: Some(0.3),
        ..PLAIN
    },
    // Phi-3's tiny test shape: fused Q/K/V and gate/up, LongRoPE factors
    // over an original context of 256 (the short ones for contexts up to
    // it, the long ones beyond; llama.cpp rounds its context up to a
    // multiple of 256 before it chooses) and its attention factor, which
    // scales the rotated dimensions only: 48 of 64, as Phi-4-mini rotates
    // 96 of 128.
    Shape {
        name: "phi3-tiny",
        arch: Arch::Phi3,
        n_layer: 2,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 384,
        n_vocab: 512,
        n_ctx_train: 1024,
        rope_freq_base: 10000.0,
        tied_output: false,
        longrope: Some((256, 1.2)),
        rope_dim: Some(48),
        ..PLAIN
    },
    // SmolLM3's tiny test shape: llama's layer, layer 3 without RoPE, and
    // SmolLM3-3B's RoPE base, tied output and 4-to-1 grouped queries.
    Shape {
        name: "smollm3-tiny",
        arch: Arch::SmolLm3,
        n_layer: 4,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 1,
        n_ff: 512,
        n_vocab: 512,
        n_ctx_train: 2048,
        rope_freq_base: 5000000.0,
        tied_output: true,
        ..PLAIN
    },
    // Mixtures of experts: qwen3moe's tiny shape (8 experts, 3 a token),
    // Mixtral's (llama with 4 experts, 2 a token), and Qwen3-30B-A3B.
    Shape {
        name: "qwen3moe-tiny",
        arch: Arch::Qwen3Moe,
        head_dim: Some(64),
        n_layer: 2,
        n_embd: 128,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 384,
        n_vocab: 512,
        n_ctx_train: 4096,
        rope_freq_base: 1000000.0,
        tied_output: false,
        moe: Some((8, 3, 128)),
        ..PLAIN
    },
    Shape {
        name: "mixtral-tiny",
        arch: Arch::Llama,
        n_layer: 2,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 256,
        n_vocab: 512,
        n_ctx_train: 4096,
        rope_freq_base: 1000000.0,
        tied_output: false,
        moe: Some((4, 2, 256)),
        ..PLAIN
    },
    Shape {
        name: "qwen3-30b-a3b",
        arch: Arch::Qwen3Moe,
        head_dim: Some(128),
        n_layer: 48,
        n_embd: 2048,
        n_head: 32,
        n_head_kv: 4,
        n_ff: 6144,
        n_vocab: 151936,
        n_ctx_train: 40960,
        rope_freq_base: 1000000.0,
        tied_output: false,
        moe: Some((128, 8, 768)),
        ..PLAIN
    },
    Shape {
        name: "gemma3-12b",
        arch: Arch::Gemma3,
        head_dim: Some(256),
        n_layer: 48,
        n_embd: 3840,
        n_head: 16,
        n_head_kv: 8,
        n_ff: 15360,
        n_vocab: 262144,
        n_ctx_train: 131072,
        rope_freq_base: 1000000.0,
        tied_output: true,
        swa: Some((1024, 6)),
        rope_linear: 8.0,
        ..PLAIN
    },
    // gpt-oss's tiny test shape: head size 64 (Q is 256 wide on an
    // embedding of 128, as the 20B's 4096 on 2880), layer 0 slides over 5
    // keys, layer 1 is global; YaRN (factor 4 over an original context of
    // 8, llama.cpp's default betas: pair 0 extrapolates, the rest are
    // interpolated); 8 experts, 3 a token.
    Shape {
        name: "gpt-oss-tiny",
        arch: Arch::GptOss,
        head_dim: Some(64),
        n_layer: 2,
        n_embd: 128,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 128,
        n_vocab: 512,
        n_ctx_train: 4096,
        rope_freq_base: 10000.0,
        tied_output: false,
        swa: Some((5, 2)),
        moe: Some((8, 3, 128)),
        yarn: Some((4.0, 8, 32.0, 1.0, 0.0)),
        ..PLAIN
    },
    Shape {
        name: "gpt-oss-20b",
        arch: Arch::GptOss,
        head_dim: Some(64),
        n_layer: 24,
        n_embd: 2880,
        n_head: 64,
        n_head_kv: 8,
        n_ff: 2880,
        n_vocab: 201088,
        n_ctx_train: 131072,
        rope_freq_base: 150000.0,
        tied_output: false,
        swa: Some((128, 2)),
        moe: Some((32, 4, 2880)),
        yarn: Some((32.0, 4096, 32.0, 1.0, 0.0)),
        ..PLAIN
    },
    // Command-R's tiny test shapes: 2 layers; and 64 (Command-R+'s count,
    // from which its files norm each query and key head), narrow.
    Shape {
        name: "command-r-tiny",
        arch: Arch::CommandR,
        n_layer: 2,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        n_vocab: 512,
        n_ctx_train: 4096,
        rope_freq_base: 10000.0,
        tied_output: true,
        ..PLAIN
    },
    Shape {
        name: "command-r-plus-tiny",
        arch: Arch::CommandR,
        n_layer: 64,
        n_embd: 64,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 128,
        n_vocab: 512,
        n_ctx_train: 4096,
        rope_freq_base: 10000.0,
        tied_output: true,
        ..PLAIN
    },
    // Mixtral 8x7B (a llama file with 8 experts, 2 a token).
    Shape {
        name: "mixtral-8x7b",
        arch: Arch::Llama,
        n_layer: 32,
        n_embd: 4096,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 14336,
        n_vocab: 32000,
        n_ctx_train: 32768,
        rope_freq_base: 1000000.0,
        tied_output: false,
        moe: Some((8, 2, 14336)),
        ..PLAIN
    },
    // Aya 23 8B (command-r).
    Shape {
        name: "aya-23-8b",
        arch: Arch::CommandR,
        n_layer: 32,
        n_embd: 4096,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 14336,
        n_vocab: 256000,
        n_ctx_train: 8192,
        rope_freq_base: 10000.0,
        tied_output: true,
        ..PLAIN
    },
    // Embedding models. Encoders' tiny test shapes (a WordPiece vocabulary
    // of BERT's special ids), and a qwen3 that pools its last token.
    Shape {
        name: "bert-tiny",
        arch: Arch::Bert,
        n_layer: 2,
        n_embd: 128,
        n_head: 4,
        n_head_kv: 4,
        n_ff: 512,
        n_vocab: 1024,
        n_ctx_train: 512,
        pooling: Some(Pooling::Cls),
        ..PLAIN
    },
    Shape {
        name: "nomic-bert-tiny",
        arch: Arch::NomicBert,
        n_layer: 2,
        n_embd: 128,
        n_head: 4,
        n_head_kv: 4,
        n_ff: 384,
        n_vocab: 1024,
        n_ctx_train: 2048,
        rope_freq_base: 1000.0,
        pooling: Some(Pooling::Mean),
        ..PLAIN
    },
    Shape {
        name: "qwen3-embedding-tiny",
        pooling: Some(Pooling::Last),
        ..QWEN3_TINY
    },
    // all-minilm (L6 v2), bge-large / mxbai-embed-large, nomic-embed-text.
    Shape {
        name: "all-minilm",
        arch: Arch::Bert,
        n_layer: 6,
        n_embd: 384,
        n_head: 12,
        n_head_kv: 12,
        n_ff: 1536,
        n_vocab: 30522,
        n_ctx_train: 512,
        pooling: Some(Pooling::Mean),
        ..PLAIN
    },
    Shape {
        name: "bge-large",
        arch: Arch::Bert,
        n_layer: 24,
        n_embd: 1024,
        n_head: 16,
        n_head_kv: 16,
        n_ff: 4096,
        n_vocab: 30522,
        n_ctx_train: 512,
        pooling: Some(Pooling::Cls),
        ..PLAIN
    },
    Shape {
        name: "nomic-embed-text",
        arch: Arch::NomicBert,
        n_layer: 12,
        n_embd: 768,
        n_head: 12,
        n_head_kv: 12,
        n_ff: 3072,
        n_vocab: 30522,
        n_ctx_train: 2048,
        rope_freq_base: 1000.0,
        pooling: Some(Pooling::Mean),
        ..PLAIN
    },
];

impl Shape {
    pub fn find(name: &str) -> Option<&'static Shape> {
        SHAPES.iter().find(|s| s.name.eq_ignore_ascii_case(name))
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.n_embd / self.n_head)
    }
}
