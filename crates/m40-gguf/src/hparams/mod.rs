//! Hyperparameters of the llama family and the tensors each layer needs.

use crate::error::{GgufError, Result};
use crate::file::GgufFile;
use crate::metadata::Metadata;
pub use crate::rope::{AttnTemperature, RopeScaling};

mod arch;
mod encoder;
mod layer;
mod parts;
pub use arch::{Arch, Traits};
pub use encoder::{
    Encoder, Pooling, POSITION_EMBD, TOKEN_EMBD_NORM, TOKEN_EMBD_NORM_B, TOKEN_TYPES,
};
pub use layer::{Block, LayerRope};
use parts::{moe, sliding_window};

/// How the model normalizes its activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// x / sqrt(mean(x^2) + eps) * w.
    Rms,
    /// (x - mean(x)) / sqrt(var(x) + eps) * w (no bias: command-r).
    Layer,
}

/// How RoPE pairs dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x0, x1), (x2, x3)... (llama).
    Normal,
    /// Halves (x0, x_{d/2}), ... (GPT-NeoX; qwen2).
    Neox,
}

/// The activation of the FFN's gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// silu(gate) * up (SwiGLU).
    Silu,
    /// gelu(gate) * up with GELU's tanh approximation (GeGLU; gemma).
    GeluTanh,
    /// gpt-oss's experts: g = min(gate, 7), u = clamp(up, -7, 7),
    /// g sigmoid(1.702 g) (u + 1) (ggml's swiglu_oai).
    SwigluOai,
}

impl Activation {
    /// gpt-oss's clamp and sigmoid slope (llama.cpp's constants).
    pub const OAI_LIMIT: f32 = 7.0;
    pub const OAI_ALPHA: f32 = 1.702;
}

/// Sliding-window attention (gemma2/3, gpt-oss): on its layers a token attends to
/// the `window` newest keys, its own included (positions p - window + 1
/// ..= p), as llama.cpp's standard SWA mask.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    /// Per layer: whether it is a sliding-window layer.
    pub layers: Vec<bool>,
    /// The sliding-window layers' RoPE base, and their linear scaling
    /// factor (1: none; gemma3 scales only its global layers).
    pub rope_freq_base: f32,
    pub rope_linear: f32,
}

/// A mixture-of-experts FFN (qwen3moe; llama files with experts: Mixtral):
/// per token, softmax over the router's `n_expert` logits, the
/// `n_expert_used` highest (their weights renormalized to sum 1), each a
/// SwiGLU FFN of `n_ff_exp`, summed by weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moe {
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    /// gpt-oss: the router and every expert matrix add a bias
    /// (`ffn_*.bias`; the experts' are (rows, n_expert)).
    pub bias: bool,
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct HyperParams {
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    /// `rope.scaling.original_context_length`, else the trained context
    /// (llama.cpp's n_ctx_orig_yarn): LongRoPE takes its long factors for
    /// contexts beyond it, its short ones up to it.
    pub n_ctx_orig: usize,
    pub rope_freq_base: f32,
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    pub rope_scaling: RopeScaling,
    /// The norms' epsilon (`attention.layer_norm_rms_epsilon`, or
    /// `attention.layer_norm_epsilon` for LayerNorm models).
    pub rms_eps: f32,
    /// RMSNorm or LayerNorm, every norm of the model.
    pub norm: NormKind,
    /// Attention and FFN both read the layer's one norm and both join x
    /// (command-r): no `ffn_norm`.
    pub parallel: bool,
    /// No `output.weight`: the token embedding is the output projection.
    pub tied_output: bool,
    /// `attn_{q,k,v}.bias` present (qwen2 always).
    pub qkv_bias: bool,
    /// `attn_{q,k}_norm`: each query and key head normed before RoPE
    /// (qwen3: RMS, weights of `head_dim` shared by the heads; command-r+:
    /// LayerNorm, weights of `head_dim` per head: [`Self::qk_norm_len`]).
    pub qk_norm: bool,
    /// The FFN gate's activation.
    pub act: Activation,
    /// Token embeddings are multiplied by this (gemma: sqrt(n_embd)).
    pub embd_scale: f32,
    /// Attention scores are q.k times this (1/sqrt(head_dim) but for
    /// gemma's 27B models and granite).
    pub attn_scale: f32,
    /// The queries' temperature by position (mistral3 where its file asks).
    pub attn_temp: Option<AttnTemperature>,
    /// `rope.scaling.attn_factor` (1 where absent): with YaRN's own factor,
    /// the scale of RoPE's cos and sin ([`Self::rope_mscale`]).
    pub rope_attn_factor: f32,
    /// Scores soft-capped to c tanh(s / c) before the softmax (gemma2).
    pub attn_softcap: Option<f32>,
    /// Logits soft-capped likewise (gemma2; gemma3 where the file says).
    pub final_softcap: Option<f32>,
    /// `post_attention_norm` and `post_ffw_norm`: the attention's and the
    /// FFN's outputs RMS-normed before their residual add (gemma).
    pub post_norms: bool,
    pub sliding_window: Option<SlidingWindow>,
    /// Each residual branch (attention, FFN) is multiplied by this before
    /// its add (granite's `residual_scale`; 1 elsewhere).
    pub residual_scale: f32,
    /// Logits are multiplied by this (command-r's `logit_scale`; 1 /
    /// granite's; 1 elsewhere).
    pub logit_scale: f32,
    /// The FFN is a mixture of experts (every layer).
    pub moe: Option<Moe>,
    /// `attn_output.bias` (gpt-oss).
    pub out_bias: bool,
    /// `attn_sinks.weight` (gpt-oss): per query head a logit in the
    /// softmax's denominator with no value.
    pub attn_sinks: bool,
    /// Each token attends to those before it (false: to every token of its
    /// sequence, an encoder's; `attention.causal`).
    pub causal: bool,
    /// An encoder's layer (bert, nomic-bert).
    pub encoder: Option<Encoder>,
    /// How its embeddings pool (`pooling_type`), where the file says.
    pub pooling: Option<Pooling>,
}

/// The names of one layer's tensors.
#[derive(Clone, Debug)]
pub struct LayerNames {
    pub attn_norm: String,
    pub wq: String,
    pub wk: String,
    pub wv: String,
    pub wo: String,
    pub bq: String,
    pub bk: String,
    pub bv: String,
    pub q_norm: String,
    pub k_norm: String,
    pub ffn_norm: String,
    pub ffn_gate: String,
    pub ffn_up: String,
    pub ffn_down: String,
    pub attn_post_norm: String,
    pub ffn_post_norm: String,
    /// MoE: the router, and the experts' matrices (3-D: one per expert).
    pub ffn_gate_inp: String,
    pub ffn_gate_exps: String,
    pub ffn_up_exps: String,
    pub ffn_down_exps: String,
    /// gpt-oss: the attention's output bias and sinks, the router's and
    /// the experts' biases.
    pub bo: String,
    pub sinks: String,
    pub ffn_gate_inp_b: String,
    pub ffn_gate_exps_b: String,
    pub ffn_up_exps_b: String,
    pub ffn_down_exps_b: String,
    /// An encoder's post-norms and FFN biases.
    pub attn_out_norm: String,
    pub attn_out_norm_b: String,
    pub out_norm: String,
    pub out_norm_b: String,
    pub ffn_up_b: String,
    pub ffn_down_b: String,
}

impl LayerNames {
    pub fn new(layer: usize) -> Self {
        let n = |s: &str| format!("blk.{layer}.{s}");
        Self {
            attn_norm: n("attn_norm.weight"),
            wq: n("attn_q.weight"),
            wk: n("attn_k.weight"),
            wv: n("attn_v.weight"),
            wo: n("attn_output.weight"),
            bq: n("attn_q.bias"),
            bk: n("attn_k.bias"),
            bv: n("attn_v.bias"),
            q_norm: n("attn_q_norm.weight"),
            k_norm: n("attn_k_norm.weight"),
            ffn_norm: n("ffn_norm.weight"),
            ffn_gate: n("ffn_gate.weight"),
            ffn_up: n("ffn_up.weight"),
            ffn_down: n("ffn_down.weight"),
            attn_post_norm: n("post_attention_norm.weight"),
            ffn_post_norm: n("post_ffw_norm.weight"),
            ffn_gate_inp: n("ffn_gate_inp.weight"),
            ffn_gate_exps: n("ffn_gate_exps.weight"),
            ffn_up_exps: n("ffn_up_exps.weight"),
            ffn_down_exps: n("ffn_down_exps.weight"),
            bo: n("attn_output.bias"),
            sinks: n("attn_sinks.weight"),
            ffn_gate_inp_b: n("ffn_gate_inp.bias"),
            ffn_gate_exps_b: n("ffn_gate_exps.bias"),
            ffn_up_exps_b: n("ffn_up_exps.bias"),
            ffn_down_exps_b: n("ffn_down_exps.bias"),
            attn_out_norm: n("attn_output_norm.weight"),
            attn_out_norm_b: n("attn_output_norm.bias"),
            out_norm: n("layer_output_norm.weight"),
            out_norm_b: n("layer_output_norm.bias"),
            ffn_up_b: n("ffn_up.bias"),
            ffn_down_b: n("ffn_down.bias"),
        }
    }
}

pub const TOKEN_EMBD: &str = "token_embd.weight";
pub const OUTPUT_NORM: &str = "output_norm.weight";
pub const OUTPUT: &str = "output.weight";

fn bad(msg: String) -> GgufError {
    GgufError::BadHyperparameters(msg)
}

impl HyperParams {
    /// The longest context the model is made for: its trained context, or,
    /// where the file declares YaRN scaling, the original context times the
    /// factor when that is longer (linear scaling's files already state the
    /// scaled length as their context).
    pub fn max_context(&self) -> usize {
        match self.rope_scaling {
            RopeScaling::Yarn {
                factor,
                original_context,
                ..
            } if factor > 1.0 => self
                .n_ctx_train
                .max((original_context as f64 * factor as f64) as usize),
            _ => self.n_ctx_train,
        }
        .max(1)
    }

    /// Read the hyperparameters from metadata; `n_vocab` falls back to the
    /// tokenizer's token count when `{arch}.vocab_size` is absent.
    pub fn from_metadata(md: &Metadata) -> Result<Self> {
        let arch = Arch::parse(md.str("general.architecture")?)?;
        let a = arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let n_layer = md.usize(&key("block_count"))?;
        let n_embd = md.usize(&key("embedding_length"))?;
        let n_head = md.usize(&key("attention.head_count"))?;
        let n_head_kv = md
            .opt_usize(&key("attention.head_count_kv"))?
            .unwrap_or(n_head);
        let n_ff = md.usize(&key("feed_forward_length"))?;
        let n_ctx_train = md.usize(&key("context_length"))?;
        if n_layer == 0 || n_embd == 0 || n_head == 0 || n_head_kv == 0 || n_ff == 0 {
            return Err(bad(format!(
                "zero size: layers {n_layer}, embedding {n_embd}, heads {n_head}/{n_head_kv}, ffn {n_ff}"
            )));
        }
        if n_head % n_head_kv != 0 {
            return Err(bad(format!(
                "{n_head} query heads are not a multiple of {n_head_kv} KV heads"
            )));
        }
        let head_dim = match md.opt_usize(&key("attention.key_length"))? {
            Some(d) => d,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => {
                return Err(bad(format!(
                    "embedding {n_embd} is not a multiple of {n_head} heads"
                )))
            }
        };
        if let Some(v) = md.opt_usize(&key("attention.value_length"))? {
            if v != head_dim {
                return Err(bad(format!(
                    "value head size {v} differs from key head size {head_dim}"
                )));
            }
        }
        let n_vocab = match md.opt_usize(&key("vocab_size"))? {
            Some(v) => v,
            None => md
                .opt_array("tokenizer.ggml.tokens")?
                .map(|a| a.len())
                .ok_or_else(|| {
                    bad(format!(
                        "neither {a}.vocab_size nor tokenizer.ggml.tokens is present"
                    ))
                })?,
        };
        let rope_dim = md
            .opt_usize(&key("rope.dimension_count"))?
            .unwrap_or(head_dim);
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(bad(format!(
                "RoPE dimension {rope_dim} must be even and at most the head size {head_dim}"
            )));
        }
        let rope_freq_base = md.opt_f64(&key("rope.freq_base"))?.unwrap_or(10000.0) as f32;
        let factor = md.opt_f64(&key("rope.scaling.factor"))?;
        // llama.cpp's n_ctx_orig_yarn: YaRN's and LongRoPE's original
        // context and mistral3's temperature floor (0 or absent: trained).
        let n_ctx_orig = md
            .opt_usize(&key("rope.scaling.original_context_length"))?
            .filter(|&n| n > 0)
            .unwrap_or(n_ctx_train);
        let rope_scaling = match md.opt_str(&key("rope.scaling.type"))? {
            None | Some("none") => match md.opt_f64(&key("rope.scale_linear"))? {
                Some(f) if f != 1.0 => RopeScaling::Linear { factor: f as f32 },
                _ => RopeScaling::None,
            },
            Some("linear") => RopeScaling::Linear {
                factor: factor.unwrap_or(1.0) as f32,
            },
            Some("yarn") => {
                // llama.cpp reads the betas and the log multiplier for
                // mistral3 (of the architectures here) and takes its
                // defaults (32, 1, none) for the rest.
                let yarn_key = |k: &str, default: f32| -> Result<f32> {
                    Ok(if arch == Arch::Mistral3 {
                        md.opt_f64(&key(k))?.map_or(default, |v| v as f32)
                    } else {
                        default
                    })
                };
                RopeScaling::Yarn {
                    factor: factor.unwrap_or(1.0) as f32,
                    original_context: n_ctx_orig,
                    beta_fast: yarn_key("rope.scaling.yarn_beta_fast", 32.0)?,
                    beta_slow: yarn_key("rope.scaling.yarn_beta_slow", 1.0)?,
                    log_mul: yarn_key("rope.scaling.yarn_log_multiplier", 0.0)?,
                }
            }
            Some(other) => return Err(bad(format!("unknown RoPE scaling type `{other}`"))),
        };
        let traits = arch.traits();
        let norm = traits.norm;
        let rms_eps = match norm {
            NormKind::Rms => md
                .opt_f64(&key("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-5) as f32,
            // llama.cpp requires it of command-r.
            NormKind::Layer => md
                .opt_f64(&key("attention.layer_norm_epsilon"))?
                .ok_or_else(|| bad(format!("{a}.attention.layer_norm_epsilon is missing")))?
                as f32,
        };
        let linear = rope_scaling.linear_factor();
        let sliding_window = sliding_window(md, arch, n_layer, rope_freq_base, linear)?;
        let opt_f32 = |k: &str| -> Result<Option<f32>> {
            Ok(md.opt_f64(&key(k))?.map(|v| v as f32).filter(|&v| v != 0.0))
        };
        // As llama.cpp: gemma2 caps unless its file says otherwise; gemma3
        // only where its file asks.
        let (attn_softcap, final_softcap) = match arch {
            Arch::Gemma2 => (
                Some(opt_f32("attn_logit_softcapping")?.unwrap_or(50.0)),
                Some(opt_f32("final_logit_softcapping")?.unwrap_or(30.0)),
            ),
            Arch::Gemma3 => (None, opt_f32("final_logit_softcapping")?),
            _ => (None, None),
        };
        // Gemma's 27B models scale queries by 1/sqrt(n_embd / n_head)
        // (their query_pre_attn_scalar), which GGUF does not record:
        // llama.cpp knows them by their layer count, and so do we.
        let gemma_27b = matches!((arch, n_layer), (Arch::Gemma2, 46) | (Arch::Gemma3, 62));
        let mut attn_scale = 1.0
            / (if gemma_27b {
                (n_embd / n_head) as f32
            } else {
                head_dim as f32
            })
            .sqrt();
        // granite's multipliers (llama.cpp reads them for granite only; 0
        // or absent: none, but the logits' is required).
        let (mut embd_scale, mut residual_scale, mut logit_scale) = (1.0, 1.0, 1.0);
        if arch.gemma() {
            embd_scale = (n_embd as f32).sqrt();
        }
        if arch == Arch::Granite {
            embd_scale = opt_f32("embedding_scale")?.unwrap_or(1.0);
            residual_scale = opt_f32("residual_scale")?.unwrap_or(1.0);
            attn_scale = opt_f32("attention.scale")?.unwrap_or(attn_scale);
            // llama.cpp multiplies by 1 / it.
            logit_scale = 1.0
                / opt_f32("logit_scale")?
                    .ok_or_else(|| bad(format!("{a}.logit_scale is missing (granite needs it)")))?;
        }
        if arch == Arch::CommandR {
            logit_scale = opt_f32("logit_scale")?.unwrap_or(1.0);
        }
        let moe = moe(md, arch, n_ff)?;
        let rope_attn_factor = md
            .opt_f64(&key("rope.scaling.attn_factor"))?
            .map_or(1.0, |v| v as f32);
        let attn_temp = match (arch, opt_f32("attention.temperature_scale")?) {
            (Arch::Mistral3, Some(_)) if n_ctx_orig == 0 => {
                return Err(bad(format!(
                    "{a}.attention.temperature_scale needs a nonzero original context"
                )))
            }
            (Arch::Mistral3, Some(scale)) => Some(AttnTemperature {
                scale,
                floor: n_ctx_orig,
            }),
            _ => None,
        };
        let (encoder, pooling) = encoder::read(md, arch)?;
        let causal = match md.opt_bool(&key("attention.causal"))? {
            Some(c) => c,
            None => !arch.encoder(),
        };
        if !causal && !arch.encoder() {
            return Err(bad(format!(
                "{a} with non-causal attention is not supported by m40-llm"
            )));
        }
        Ok(Self {
            causal,
            encoder,
            pooling,
            arch,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_vocab,
            n_ctx_train,
            n_ctx_orig,
            rope_freq_base,
            rope_dim,
            rope_style: traits.rope_style,
            rope_scaling,
            rms_eps,
            norm,
            parallel: traits.parallel,
            tied_output: true,
            qkv_bias: traits.qkv_bias,
            // Command-R+ (64 layers and more) norms its heads.
            qk_norm: traits.qk_norm || (arch == Arch::CommandR && n_layer >= 64),
            act: traits.act,
            embd_scale,
            attn_scale,
            attn_softcap,
            final_softcap,
            post_norms: traits.gemma,
            sliding_window,
            residual_scale,
            logit_scale,
            moe,
            attn_temp,
            rope_attn_factor,
            out_bias: traits.out_bias,
            attn_sinks: traits.sinks,
        })
    }

    /// The names of layer `l`'s tensors: gpt-oss's FFN norm is its
    /// `post_attention_norm`.
    pub fn layer_names(&self, l: usize) -> LayerNames {
        let mut n = LayerNames::new(l);
        if self.arch == Arch::GptOss {
            n.ffn_norm = std::mem::take(&mut n.attn_post_norm);
        }
        n
    }

    /// The factor llama.cpp's RoPE multiplies its cos and sin by
    /// ([`crate::rope::mscale`] of this model's scaling and
    /// `rope.scaling.attn_factor`).
    pub fn rope_mscale(&self) -> f32 {
        crate::rope::mscale(self.rope_scaling, self.rope_attn_factor)
    }

    /// Whether a layer's attention and FFN outputs are transformed (normed
    /// or scaled) before they join the residual stream.
    pub fn residual_transformed(&self) -> bool {
        self.post_norms || self.residual_scale != 1.0
    }

    /// The length of the query (`q`) or key head norms' weights: one
    /// head's (qwen3, gemma3) or every head's (command-r+).
    pub fn qk_norm_len(&self, q: bool) -> usize {
        match self.arch {
            Arch::CommandR => self.head_dim * if q { self.n_head } else { self.n_head_kv },
            _ => self.head_dim,
        }
    }

    /// Whether layer `l` attends through a sliding window.
    pub fn is_swa(&self, l: usize) -> bool {
        self.sliding_window
            .as_ref()
            .is_some_and(|s| s.layers.get(l).copied().unwrap_or(false))
    }

    /// Read the hyperparameters and check every tensor the forward pass needs:
    /// present, with the right shape. Fills in `tied_output` and `qkv_bias`
    /// from what the file holds.
    pub fn from_file(file: &GgufFile) -> Result<Self> {
        let mut hp = Self::from_metadata(file.metadata())?;
        // gemma2's and command-r's output is the embedding even where a
        // file has both.
        hp.tied_output =
            matches!(hp.arch, Arch::Gemma2 | Arch::CommandR) || file.tensor_info(OUTPUT).is_none();
        hp.qkv_bias = hp.arch.qkv_bias() || file.tensor_info(&LayerNames::new(0).bq).is_some();
        // Biases llama.cpp reads for some architectures and this model's
        // forward pass does not: refused, never ignored.
        let reads: Vec<String> = hp.expected_tensors().into_iter().map(|(n, _)| n).collect();
        for b in [
            "attn_output.bias",
            "ffn_gate.bias",
            "ffn_up.bias",
            "ffn_down.bias",
        ] {
            let name = format!("blk.0.{b}");
            if file.tensor_info(&name).is_some() && !reads.contains(&name) {
                return Err(GgufError::BadTensor {
                    name,
                    what: format!(
                        "{} models with this bias are not supported by m40-llm",
                        hp.arch.name()
                    ),
                });
            }
        }
        // Fused matrices (phi3) stand for their parts where the file has
        // them.
        for (name, shape) in hp.file_tensors(|name| file.tensor_info(name).is_some()) {
            let info = file
                .tensor_info(&name)
                .ok_or_else(|| GgufError::MissingTensor(name.clone()))?;
            if info.shape != shape {
                return Err(GgufError::WrongShape {
                    name,
                    expected: shape,
                    found: info.shape.clone(),
                });
            }
        }
        Ok(hp)
    }

    /// Every tensor the model needs, with its GGUF shape (row length first), in
    /// the order llama.cpp writes them (phi3's fused matrices as their
    /// parts: [`Self::fused_tensors`]).
    pub fn expected_tensors(&self) -> Vec<(String, Vec<u64>)> {
        let (d, q, kv, ff, v) = (
            self.n_embd as u64,
            (self.n_head * self.head_dim) as u64,
            (self.n_head_kv * self.head_dim) as u64,
            self.n_ff as u64,
            self.n_vocab as u64,
        );
        let mut out = vec![(TOKEN_EMBD.to_string(), vec![d, v])];
        if let Some(e) = self.encoder {
            self.encoder_tensors(e, &mut out);
            return out;
        }
        let h = self.n_head as u64;
        for (l, b) in self.blocks().into_iter().enumerate() {
            let n = self.layer_names(l);
            out.push((n.attn_norm, vec![d]));
            out.push((n.wq, vec![d, q]));
            out.push((n.wk, vec![d, kv]));
            out.push((n.wv, vec![d, kv]));
            if b.qkv_bias {
                out.push((n.bq, vec![q]));
                out.push((n.bk, vec![kv]));
                out.push((n.bv, vec![kv]));
            }
            if b.head_norms {
                let hd = self.head_dim as u64;
                let (q, k) = (self.qk_norm_len(true), self.qk_norm_len(false));
                let shape = |len: usize| match len as u64 {
                    l if l == hd => vec![hd],
                    l => vec![hd, l / hd],
                };
                out.push((n.q_norm, shape(q)));
                out.push((n.k_norm, shape(k)));
            }
            out.push((n.wo, vec![q, d]));
            if b.out_bias {
                out.push((n.bo, vec![d]));
            }
            if b.sinks {
                out.push((n.sinks, vec![h]));
            }
            if b.post_norms {
                out.push((n.attn_post_norm, vec![d]));
            }
            if b.ffn_norm() {
                out.push((n.ffn_norm, vec![d]));
            }
            if let Some(m) = b.experts {
                let (e, fe) = (m.n_expert as u64, m.n_ff_exp as u64);
                out.push((n.ffn_gate_inp, vec![d, e]));
                out.push((n.ffn_gate_exps, vec![d, fe, e]));
                out.push((n.ffn_up_exps, vec![d, fe, e]));
                out.push((n.ffn_down_exps, vec![fe, d, e]));
                if m.bias {
                    out.push((n.ffn_gate_inp_b, vec![e]));
                    out.push((n.ffn_gate_exps_b, vec![fe, e]));
                    out.push((n.ffn_up_exps_b, vec![fe, e]));
                    out.push((n.ffn_down_exps_b, vec![d, e]));
                }
            } else {
                out.push((n.ffn_gate, vec![d, ff]));
                out.push((n.ffn_up, vec![d, ff]));
                out.push((n.ffn_down, vec![ff, d]));
            }
            if b.post_norms {
                out.push((n.ffn_post_norm, vec![d]));
            }
        }
        out.push((OUTPUT_NORM.to_string(), vec![d]));
        if !self.tied_output {
            out.push((OUTPUT.to_string(), vec![d, v]));
        }
        out
    }
}
