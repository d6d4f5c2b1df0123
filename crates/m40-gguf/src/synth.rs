//! Random-weight llama models of real shapes, written tensor by tensor.
//!
//! The GPU machine cannot receive real model files, so tests and benchmarks
//! there generate models of the same shapes. Weights are uniform random with
//! variances chosen so activations stay O(1) through every layer: projections
//! into the residual stream are scaled by 1/sqrt(2 * n_layer), so the residual
//! grows like the sum of 2 * n_layer terms of variance 1 / (2 * n_layer).
//! Quantized types use `quant::quantize_fast`: Q4_K and Q6_K blocks take
//! their first scale fits, without llama-quantize's search (an 8B Q4_K_M
//! file took 338 s on 16 cores with the search).

use std::io::{Read, Write};

use rayon::prelude::*;

use crate::error::{GgufError, Result};
use crate::hparams::{
    Arch, HyperParams, LayerNames, Pooling, OUTPUT, OUTPUT_NORM, TOKEN_EMBD, TOKEN_TYPES,
};
use crate::metadata::{Array, Metadata, Value};
use crate::quant;
pub use crate::shapes::{Shape, SHAPES};
use crate::types::GgmlType;
use crate::writer::{GgufWriter, TensorSpec};

impl Shape {
    /// The hyperparameters a reader finds in this shape's file: read back
    /// from its own metadata, so the two cannot disagree.
    fn hparams(&self) -> HyperParams {
        let mut hp = HyperParams::from_metadata(&metadata(self, FileType::All(GgmlType::F32)))
            .expect("every shape's metadata is valid");
        hp.tied_output = self.tied_output;
        hp
    }
}

/// The types of a synthetic model's matrices: all one type, or llama.cpp's
/// Q4_K_M mix. Norm weights are F32 either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    /// Every matrix in this type (one of [`GgmlType::QUANTIZABLE`]).
    All(GgmlType),
    /// llama-quantize's Q4_K_M: Q4_K, with Q6_K for the output matrix (the
    /// tied embedding when there is none) and for `attn_v` and `ffn_down` in
    /// the first and last eighth of the layers and every third in between.
    Q4KM,
    /// llama-quantize's MXFP4_MOE: the experts' matrices MXFP4, every
    /// other matrix Q8_0 (gpt-oss's published files).
    Mxfp4Moe,
}

impl FileType {
    /// `Q4_K_M`, or the name of a quantizable type.
    pub fn parse(name: &str) -> Option<FileType> {
        if name.eq_ignore_ascii_case("Q4_K_M") {
            return Some(FileType::Q4KM);
        }
        if name.eq_ignore_ascii_case("MXFP4_MOE") {
            return Some(FileType::Mxfp4Moe);
        }
        GgmlType::from_name(name)
            .filter(|t| GgmlType::QUANTIZABLE.contains(t))
            .map(FileType::All)
    }

    /// Every name [`FileType::parse`] accepts, comma-separated.
    pub fn names() -> String {
        let mut v: Vec<&str> = GgmlType::QUANTIZABLE.iter().map(|t| t.name()).collect();
        v.extend(["Q4_K_M", "MXFP4_MOE"]);
        v.join(", ")
    }

    pub fn name(&self) -> &'static str {
        match self {
            FileType::All(t) => t.name(),
            FileType::Q4KM => "Q4_K_M",
            FileType::Mxfp4Moe => "MXFP4_MOE",
        }
    }

    /// llama.cpp's `general.file_type`.
    fn id(&self) -> u32 {
        match self {
            FileType::All(t) => match t {
                GgmlType::F32 => 0,
                GgmlType::F16 => 1,
                GgmlType::Q4_0 => 2,
                GgmlType::Q4_1 => 3,
                GgmlType::Q8_0 => 7,
                GgmlType::Q5_0 => 8,
                GgmlType::Q5_1 => 9,
                GgmlType::Q4_K => 14, // Q4_K_S
                GgmlType::Q6_K => 18,
                GgmlType::BF16 => 32,
                GgmlType::MXFP4 => 38,
                _ => 0,
            },
            FileType::Q4KM => 15,
            FileType::Mxfp4Moe => 38,
        }
    }

    /// The type of matrix `name` (rows of `row_len`) in a model of `hp`. As
    /// llama-quantize does, K-quants fall back where rows are not whole
    /// super-blocks: Q4_K to Q5_0, Q6_K to Q8_0.
    fn matrix_type(&self, name: &str, row_len: usize, hp: &HyperParams) -> GgmlType {
        let ty = match self {
            FileType::All(t) => *t,
            FileType::Q4KM => {
                let n = hp.n_layer;
                let more_bits = |i: usize| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
                let layer = name
                    .strip_prefix("blk.")
                    .and_then(|r| r.split('.').next())
                    .and_then(|i| i.parse::<usize>().ok());
                let six = name == OUTPUT
                    || (hp.tied_output && name == TOKEN_EMBD)
                    || ((name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight"))
                        && layer.is_some_and(more_bits));
                if six {
                    GgmlType::Q6_K
                } else {
                    GgmlType::Q4_K
                }
            }
            FileType::Mxfp4Moe if name.ends_with("_exps.weight") => GgmlType::MXFP4,
            FileType::Mxfp4Moe => GgmlType::Q8_0,
        };
        match ty {
            GgmlType::Q4_K if !row_len.is_multiple_of(256) => GgmlType::Q5_0,
            GgmlType::Q6_K if !row_len.is_multiple_of(256) => GgmlType::Q8_0,
            t => t,
        }
    }
}

impl From<GgmlType> for FileType {
    fn from(t: GgmlType) -> FileType {
        FileType::All(t)
    }
}

impl std::fmt::Display for FileType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A byte-level SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the 256
/// byte tokens `<0x00>`..`<0xFF>` (so any text tokenizes through byte
/// fallback), padded with unused tokens to `n_vocab`.
fn tokenizer_metadata(md: &mut Metadata, n_vocab: usize, arch: Arch) {
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    let mut types = vec![2i32, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    // llama.cpp's vocabulary loader looks this token up in phi3 models.
    if arch == Arch::Phi3 {
        tokens.push("<|endoftext|>".into());
        types.push(3);
    }
    while tokens.len() < n_vocab {
        tokens.push(format!("<unused{}>", tokens.len()));
        types.push(5);
    }
    tokens.truncate(n_vocab);
    types.truncate(n_vocab);
    let scores = (0..tokens.len()).map(|i| -(i as f32)).collect();
    md.insert("tokenizer.ggml.model", Value::String("llama".into()));
    md.insert("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    md.insert("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
    md.insert("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    md.insert("tokenizer.ggml.unknown_token_id", Value::U32(0));
    md.insert("tokenizer.ggml.bos_token_id", Value::U32(1));
    md.insert("tokenizer.ggml.eos_token_id", Value::U32(2));
    md.insert("tokenizer.ggml.add_bos_token", Value::Bool(true));
    md.insert("tokenizer.ggml.add_eos_token", Value::Bool(false));
}

/// A WordPiece vocabulary (`bert`) in BERT's layout: `[PAD]` 0, `[UNK]`
/// 100, `[CLS]` 101, `[SEP]` 102, `[MASK]` 103 (unused ones between), then
/// each letter, digit and punctuation mark as a word and as a continuation,
/// then words of two and three letters, in GGUF's spelling (a word starts
/// with `▁`, a continuation is bare).
fn wordpiece_metadata(md: &mut Metadata, n_vocab: usize) {
    let mut tokens: Vec<String> = (0..104).map(|i| format!("[unused{i}]")).collect();
    for (i, t) in [
        (0, "[PAD]"),
        (100, "[UNK]"),
        (101, "[CLS]"),
        (102, "[SEP]"),
        (103, "[MASK]"),
    ] {
        tokens[i] = t.into();
    }
    let mut types = vec![3i32; 104];
    let chars: Vec<char> = ('a'..='z')
        .chain('0'..='9')
        .chain(".,!?'-:;()".chars())
        .collect();
    let letters = || 'a'..='z';
    let pairs = letters().flat_map(|a| letters().map(move |b| format!("{a}{b}")));
    let triples = letters()
        .flat_map(|a| letters().flat_map(move |b| letters().map(move |c| format!("{a}{b}{c}"))));
    let words = pairs.chain(triples);
    for w in chars.iter().map(|c| c.to_string()).chain(words) {
        if tokens.len() + 2 > n_vocab {
            break;
        }
        tokens.push(format!("▁{w}"));
        tokens.push(w);
        types.extend([1, 1]);
    }
    while tokens.len() < n_vocab {
        tokens.push(format!("[unused{}]", tokens.len()));
        types.push(3);
    }
    md.insert("tokenizer.ggml.model", Value::String("bert".into()));
    md.insert("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    md.insert("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    md.insert("tokenizer.ggml.token_type_count", Value::U32(2));
    for (key, id) in [
        ("padding_token_id", 0),
        ("unknown_token_id", 100),
        ("bos_token_id", 101),
        ("cls_token_id", 101),
        ("seperator_token_id", 102),
        ("mask_token_id", 103),
    ] {
        md.insert(format!("tokenizer.ggml.{key}"), Value::U32(id));
    }
}

/// The metadata of a synthetic model.
pub fn metadata(shape: &Shape, ty: FileType) -> Metadata {
    let mut md = Metadata::new();
    let s = |v: &str| Value::String(v.to_string());
    let u = |v: usize| Value::U32(v as u32);
    let a = shape.arch.name();
    let key = |k: &str| format!("{a}.{k}");
    md.insert("general.architecture", s(a));
    md.insert(
        "general.name",
        s(&format!("m40-llm synthetic {} {}", shape.name, ty)),
    );
    md.insert("general.file_type", Value::U32(ty.id()));
    md.insert("general.quantization_version", Value::U32(2));
    md.insert(key("block_count"), u(shape.n_layer));
    md.insert(key("embedding_length"), u(shape.n_embd));
    md.insert(key("attention.head_count"), u(shape.n_head));
    md.insert(key("attention.head_count_kv"), u(shape.n_head_kv));
    if shape.head_dim.is_some() {
        md.insert(key("attention.key_length"), u(shape.head_dim()));
        md.insert(key("attention.value_length"), u(shape.head_dim()));
    }
    md.insert(key("feed_forward_length"), u(shape.n_ff));
    md.insert(key("context_length"), u(shape.n_ctx_train));
    md.insert(key("rope.freq_base"), Value::F32(shape.rope_freq_base));
    md.insert(
        key("rope.dimension_count"),
        u(shape.rope_dim.unwrap_or(shape.head_dim())),
    );
    if shape.arch.encoder() {
        md.insert(key("attention.layer_norm_epsilon"), Value::F32(1e-12));
        md.insert(key("attention.causal"), Value::Bool(false));
    } else if shape.arch == Arch::CommandR {
        md.insert(key("attention.layer_norm_epsilon"), Value::F32(1e-5));
        // Command-R's and Aya 23's.
        md.insert(key("logit_scale"), Value::F32(0.0625));
    } else {
        md.insert(key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5));
    }
    if let Some((window, period)) = shape.swa {
        md.insert(key("attention.sliding_window"), u(window));
        md.insert(key("attention.sliding_window_pattern"), u(period));
    }
    if let Some((n_expert, used, n_ff_exp)) = shape.moe {
        md.insert(key("expert_count"), u(n_expert));
        md.insert(key("expert_used_count"), u(used));
        if matches!(shape.arch, Arch::Qwen3Moe | Arch::GptOss) {
            md.insert(key("expert_feed_forward_length"), u(n_ff_exp));
        }
    }
    if shape.arch == Arch::Granite {
        // Granite 3's multipliers (its 2B and 8B configs): the attention's
        // is 1 / head size.
        md.insert(key("embedding_scale"), Value::F32(12.0));
        md.insert(key("residual_scale"), Value::F32(0.22));
        md.insert(
            key("attention.scale"),
            Value::F32(1.0 / shape.head_dim() as f32),
        );
        md.insert(key("logit_scale"), Value::F32(8.0));
    }
    if let Some(c) = shape.attn_softcap {
        md.insert(key("attn_logit_softcapping"), Value::F32(c));
    }
    if shape.rope_linear != 1.0 {
        md.insert(key("rope.scaling.type"), s("linear"));
        md.insert(key("rope.scaling.factor"), Value::F32(shape.rope_linear));
    }
    if let Some((factor, original, beta_fast, beta_slow, log_mul)) = shape.yarn {
        md.insert(key("rope.scaling.type"), s("yarn"));
        md.insert(key("rope.scaling.factor"), Value::F32(factor));
        md.insert(key("rope.scaling.original_context_length"), u(original));
        for (k, v, default) in [
            ("rope.scaling.yarn_beta_fast", beta_fast, 32.0),
            ("rope.scaling.yarn_beta_slow", beta_slow, 1.0),
            ("rope.scaling.yarn_log_multiplier", log_mul, 0.0),
        ] {
            if v != default {
                md.insert(key(k), Value::F32(v));
            }
        }
    }
    if let Some((original, attn_factor)) = shape.longrope {
        md.insert(key("rope.scaling.original_context_length"), u(original));
        md.insert(key("rope.scaling.attn_factor"), Value::F32(attn_factor));
    }
    if let Some(t) = shape.attn_temp {
        md.insert(key("attention.temperature_scale"), Value::F32(t));
    }
    if let Some(p) = shape.pooling {
        md.insert(key("pooling_type"), u(p as usize));
    }
    md.insert(key("vocab_size"), u(shape.n_vocab));
    if shape.arch.encoder() {
        wordpiece_metadata(&mut md, shape.n_vocab);
    } else {
        tokenizer_metadata(&mut md, shape.n_vocab, shape.arch);
        if shape.pooling == Some(Pooling::Last) {
            // qwen3-embedding's input ends with EOS, whose state it pools.
            md.insert("tokenizer.ggml.add_eos_token", Value::Bool(true));
        }
    }
    md
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug)]
enum Init {
    /// 1 + uniform noise of ±0.1 (RMSNorm weights).
    Norm,
    /// Uniform with this standard deviation.
    Uniform(f32),
}

fn init_for(name: &str, hp: &HyperParams) -> Init {
    let d = hp.n_embd as f32;
    let residual = (2.0 * hp.n_layer as f32).sqrt();
    // LongRoPE's factors divide frequencies: near 1, like a norm's weights.
    if name.ends_with("norm.weight") || name.starts_with("rope_factors_") {
        Init::Norm
    } else if name.ends_with("attn_sinks.weight") {
        // Sinks of the scores' size, so they take a visible share.
        Init::Uniform(1.0)
    } else if name.ends_with("_exps.bias") && !name.contains("down") {
        // gpt-oss's gate and up biases: wide enough that its clamp at 7
        // bites on some (value, token).
        Init::Uniform(4.0)
    } else if name.ends_with(".bias") {
        Init::Uniform(0.1 / residual)
    } else if name == TOKEN_EMBD {
        Init::Uniform(d.powf(-0.25))
    } else if name == OUTPUT {
        Init::Uniform(1.0 / d.sqrt())
    } else if name.ends_with("attn_output.weight") {
        Init::Uniform(1.0 / ((hp.n_head * hp.head_dim) as f32).sqrt() / residual)
    } else if name.ends_with("ffn_down.weight") {
        Init::Uniform(1.0 / (hp.n_ff as f32).sqrt() / residual)
    } else if name.ends_with("ffn_down_exps.weight") {
        let n_ff_exp = hp.moe.map_or(hp.n_ff, |m| m.n_ff_exp);
        Init::Uniform(1.0 / (n_ff_exp as f32).sqrt() / residual)
    } else {
        Init::Uniform(1.0 / d.sqrt())
    }
}

/// SplitMix64: a fast, well-mixed generator; one seeded per row keeps
/// generation parallel and the output independent of thread count.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32) * (2.0 / (1u64 << 24) as f32) - 1.0
    }
}

fn fill_row(init: Init, seed: u64, x: &mut [f32]) {
    let mut rng = SplitMix(seed);
    rng.next();
    match init {
        Init::Norm => x.iter_mut().for_each(|v| *v = 1.0 + 0.1 * rng.unit()),
        Init::Uniform(sigma) => {
            let a = sigma * 3f32.sqrt();
            x.iter_mut().for_each(|v| *v = a * rng.unit());
        }
    }
}

/// Streams a tensor's bytes, generating and quantizing rows in parallel
/// chunks of a few MB.
struct RowStream {
    ty: GgmlType,
    row_len: usize,
    row_bytes: usize,
    n_rows: usize,
    next_row: usize,
    seed: u64,
    init: Init,
    buf: Vec<u8>,
    pos: usize,
}

impl RowStream {
    fn refill(&mut self) -> Result<()> {
        let rows = ((4 << 20) / self.row_bytes.max(1)).clamp(1, self.n_rows - self.next_row);
        self.buf.resize(rows * self.row_bytes, 0);
        let (first, ty, row_len, seed, init) =
            (self.next_row, self.ty, self.row_len, self.seed, self.init);
        self.buf
            .par_chunks_mut(self.row_bytes)
            .enumerate()
            .try_for_each_init(
                || vec![0f32; row_len],
                |x, (i, out)| {
                    fill_row(
                        init,
                        seed ^ ((first + i) as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93),
                        x,
                    );
                    quant::quantize_fast(ty, x, out)
                },
            )?;
        self.next_row += rows;
        self.pos = 0;
        Ok(())
    }
}

impl Read for RowStream {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.buf.len() {
            if self.next_row == self.n_rows {
                return Ok(0);
            }
            self.refill().map_err(std::io::Error::other)?;
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Options for [`write_model`].
#[derive(Clone, Debug)]
pub struct SynthOptions<'a> {
    pub shape: &'a Shape,
    /// Types of the matrices (norm weights stay F32).
    pub ty: FileType,
    pub seed: u64,
}

/// Write a random-weight model to `out`, one tensor at a time; `progress` is
/// called after each tensor with (tensors done, tensors total).
pub fn write_model<W: Write>(
    out: W,
    opts: &SynthOptions<'_>,
    mut progress: impl FnMut(usize, usize),
) -> Result<W> {
    if let FileType::All(ty) = opts.ty {
        if !GgmlType::QUANTIZABLE.contains(&ty) {
            return Err(GgufError::UnsupportedType {
                ty,
                op: "synthetic models",
            });
        }
    }
    let hp = opts.shape.hparams();
    let md = metadata(opts.shape, opts.ty);
    let mut tensors = hp.file_tensors(|_| true);
    if opts.shape.longrope.is_some() {
        for n in ["rope_factors_long.weight", "rope_factors_short.weight"] {
            tensors.push((n.to_string(), vec![hp.rope_dim as u64 / 2]));
        }
    }
    let specs: Vec<TensorSpec> = tensors
        .into_iter()
        .map(|(name, shape)| {
            // Routers, biases and norms (command-r+'s head norms are 2-D)
            // stay F32, as llama-quantize leaves them; so do an encoder's
            // token type embeddings (llama.cpp adds a row of them to F32
            // activations, which its CPU backend does only in F32).
            let ty = if shape.len() == 1
                || name == TOKEN_TYPES
                || name.ends_with(".bias")
                || name.ends_with("norm.weight")
                || name.ends_with("ffn_gate_inp.weight")
            {
                GgmlType::F32
            } else {
                opts.ty.matrix_type(&name, shape[0] as usize, &hp)
            };
            TensorSpec { name, ty, shape }
        })
        .collect();
    let mut w = GgufWriter::new(out, &md, &specs)?;
    for (i, spec) in specs.iter().enumerate() {
        let row_len = spec.shape[0] as usize;
        let n_rows = (spec.n_elements() / spec.shape[0]) as usize;
        let stream = RowStream {
            ty: spec.ty,
            row_len,
            row_bytes: spec.ty.row_bytes(row_len as u64).unwrap_or(0) as usize,
            n_rows,
            next_row: 0,
            seed: SplitMix(opts.seed ^ (i as u64).wrapping_mul(0xA076_1D64_78BD_642F)).next(),
            init: init_for(&spec.name, &hp),
            buf: Vec::new(),
            pos: 0,
        };
        w.write_tensor(stream)?;
        progress(i + 1, specs.len());
    }
    w.finish()
}

/// `n` token ids below `n_vocab`, a fixed stream per seed (xorshift): prompts
/// for benchmarks and tests of synthetic models.
pub fn token_ids(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n_vocab as u64) as u32
        })
        .collect()
}

/// Names of the tensors a synthetic model of `shape` holds, for callers that
/// want to check them.
pub fn tensor_names(shape: &Shape) -> Vec<String> {
    shape
        .hparams()
        .expected_tensors()
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

#[doc(hidden)]
pub fn layer_names(layer: usize) -> LayerNames {
    LayerNames::new(layer)
}

#[doc(hidden)]
pub const OUTPUT_NORM_NAME: &str = OUTPUT_NORM;
