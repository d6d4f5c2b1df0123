//! The CPU reference backend: FP32 arithmetic on weights kept in their GGUF
//! blocks, a paged FP16 KV cache (`kv`), all prompt tokens through each
//! matmul together.

mod encoder;
pub(crate) mod fused;
mod group8;
mod kv;
pub(crate) mod kx8;
pub mod matmul;
mod moe;
pub mod ops;
pub(crate) mod q4x8;
pub(crate) mod q8;
pub(crate) mod q8k;
mod repack;
pub(crate) mod simd;
mod stage;

use std::sync::Arc;

use m40_gguf::hparams::{Block, LayerRope, OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
use m40_gguf::quant::dequantize;
use m40_gguf::HyperParams;
use rayon::prelude::*;

use crate::error::{ModelError, Result};
use crate::paged::PagedCache;
use crate::{Backend, KvFormat, KvState, Logits, Model, SeqStep, Span, StepOut, DEFAULT_SEQUENCES};
use encoder::{layernorm_bias, EncoderInput, EncoderLayer};
pub use kv::{rotate as kv_rotate, PAGE_TOKENS};
use kv::{HostPages, LayerPages};
use m40_gguf::TensorView;
use matmul::matmul;
mod memory;
use memory::kv_too_big;
pub use memory::{check_memory, check_memory_within, costs, memory_needed, memory_needed_in};
pub use moe::route;
use ops::{glu, head_norm, norm, rmsnorm, softcap, softmax_sink, Rope};

/// Small per-layer vectors kept as f32 (norm weights, biases).
struct LayerVecs {
    /// What the layer is (the description the GPU backend reads too).
    block: Block,
    /// None in an encoder (its norms come after the residual adds).
    attn_norm: Option<Vec<f32>>,
    encoder: Option<EncoderLayer>,
    /// None where attention and FFN share the attention norm (command-r).
    ffn_norm: Option<Vec<f32>>,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    /// The query and key heads' norm weights (qwen3: head_dim each;
    /// command-r+: every head's).
    qk_norm: Option<[Vec<f32>; 2]>,
    /// gemma: the RMSNorm weights of the attention's and the FFN's outputs.
    post_norms: Option<[Vec<f32>; 2]>,
    /// gpt-oss: the attention output's bias, the sink logit of each head.
    bo: Option<Vec<f32>>,
    sinks: Option<Vec<f32>>,
    /// gpt-oss: the router's bias (n_expert) and the experts' biases of
    /// gate, up (n_expert, n_ff_exp) and down (n_expert, n_embd).
    moe_bias: Option<[Vec<f32>; 4]>,
}

/// How the CPU backend multiplies by the weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuMath {
    /// As llama.cpp's CPU backend: the inputs of Q4_0, Q4_1 and Q8_0
    /// matrices rounded to 8 bits per block of 32 and integer dot products
    /// ([`q8`]), the other formats exact. The default for running models.
    #[default]
    Quantized,
    /// FP32 throughout: the reference every GPU kernel is checked against
    /// ([`CpuBackend::new`]).
    Exact,
}

/// The CPU backend over one model.
pub struct CpuBackend {
    model: Arc<Model>,
    math: CpuMath,
    layers: Vec<LayerVecs>,
    /// None in an encoder.
    output_norm: Option<Vec<f32>>,
    encoder: Option<Box<EncoderInput>>,
    rope: Rope,
    /// The sliding-window layers' RoPE (gemma), where they differ.
    rope_window: Option<Rope>,
    /// The KV pages of every sequence.
    kv: HostPages,
    /// The layers it runs (all but in a stage of a split model).
    span: Span,
    /// Its Q4_0, Q4_K and Q6_K matrices repacked for the 8-bit products
    /// (`CpuMath::Quantized` on a CPU with AVX2).
    repacked: repack::Repacked,
}

/// A sequence's KV cache on the CPU: pages of its backend's pool.
pub type CpuCache = PagedCache;

fn vec_f32(model: &Model, name: &str) -> Result<Vec<f32>> {
    Ok(model.tensor(name).to_f32()?)
}

impl CpuBackend {
    /// The exact backend ([`CpuMath::Exact`]), the reference.
    pub fn new(model: Arc<Model>) -> Result<Self> {
        Self::with_math(model, CpuMath::Exact)
    }

    /// A KV cache of [`DEFAULT_SEQUENCES`] model contexts.
    pub fn with_math(model: Arc<Model>, math: CpuMath) -> Result<Self> {
        let tokens = model.context() * DEFAULT_SEQUENCES;
        Self::with_kv(model, math, tokens)
    }

    /// A KV cache of `kv_tokens` tokens over all sequences together: its
    /// host memory is taken as pages are first used, and checked against
    /// the machine's now (with a step's activations), so that a server
    /// refuses to start rather than fail requests later.
    pub fn with_kv(model: Arc<Model>, math: CpuMath, kv_tokens: usize) -> Result<Self> {
        Self::within(model, math, kv_tokens, KvFormat::F16, None)
    }

    /// As [`CpuBackend::with_kv`], its KV pages in `kv_format`, taking at
    /// most `memory_limit` bytes in all where given (the weights' file, the
    /// KV cache, the activations: what [`Backend::memory`] reports).
    pub fn within(
        model: Arc<Model>,
        math: CpuMath,
        kv_tokens: usize,
        kv_format: KvFormat,
        memory_limit: Option<u64>,
    ) -> Result<Self> {
        let span = Span::whole(model.hparams());
        Self::stage(model, math, kv_tokens, kv_format, memory_limit, span)
    }

    /// As [`CpuBackend::within`] for the layers of `span` only: a stage of
    /// a model split over devices (`crate::split`), whose KV pages hold
    /// those layers'.
    pub fn stage(
        model: Arc<Model>,
        math: CpuMath,
        kv_tokens: usize,
        kv_format: KvFormat,
        memory_limit: Option<u64>,
        span: Span,
    ) -> Result<Self> {
        let hp = model.hparams().clone();
        // The memory plan of the span's layers: a model of that many.
        let span_hp = HyperParams {
            n_layer: span.len(),
            ..hp.clone()
        };
        let kv_dim = hp.n_head_kv * hp.head_dim;
        if !hp.head_dim.is_multiple_of(kv_format.block()) {
            return Err(ModelError::Unsupported(format!(
                "a {} KV cache for a head dimension of {} (a multiple of {} is needed; use f16)",
                kv_format.name(),
                hp.head_dim,
                kv_format.block()
            )));
        }
        let room = memory_limit.map(|l| l.saturating_sub(model.file().file_size()));
        memory::check_memory_within(&span_hp, kv_tokens, crate::DEFAULT_STEP, kv_format, room)?;
        // A stage shares its block table with GPU stages: their pages.
        let page = match span.is_whole() {
            true => PAGE_TOKENS,
            false => m40_kernels::KV_PAGE,
        };
        let pages = kv_tokens.max(1).div_ceil(page);
        if pages > u32::MAX as usize {
            return Err(kv_too_big(&hp, kv_tokens, kv_format));
        }
        let mut layers = Vec::with_capacity(span.len());
        let blocks = hp.blocks().into_iter().enumerate();
        for (l, block) in blocks.filter(|(l, _)| span.layers.contains(l)) {
            let n = model.layer(l);
            let opt = |on: bool, name: &str| -> Result<Option<Vec<f32>>> {
                on.then(|| vec_f32(&model, name)).transpose()
            };
            let decoder = hp.encoder.is_none();
            layers.push(LayerVecs {
                block,
                bo: opt(block.out_bias, &n.bo)?,
                sinks: opt(block.sinks, &n.sinks)?,
                moe_bias: match block.experts {
                    Some(m) if m.bias => Some([
                        vec_f32(&model, &n.ffn_gate_inp_b)?,
                        vec_f32(&model, &n.ffn_gate_exps_b)?,
                        vec_f32(&model, &n.ffn_up_exps_b)?,
                        vec_f32(&model, &n.ffn_down_exps_b)?,
                    ]),
                    _ => None,
                },
                attn_norm: opt(decoder, &n.attn_norm)?,
                encoder: EncoderLayer::load(&model, &n)?,
                ffn_norm: opt(block.ffn_norm() && decoder, &n.ffn_norm)?,
                bq: opt(block.qkv_bias, &n.bq)?,
                bk: opt(block.qkv_bias, &n.bk)?,
                bv: opt(block.qkv_bias, &n.bv)?,
                qk_norm: if block.head_norms {
                    Some([vec_f32(&model, &n.q_norm)?, vec_f32(&model, &n.k_norm)?])
                } else {
                    None
                },
                post_norms: if block.post_norms {
                    Some([
                        vec_f32(&model, &n.attn_post_norm)?,
                        vec_f32(&model, &n.ffn_post_norm)?,
                    ])
                } else {
                    None
                },
            });
        }
        let rope = Rope::for_model(&model)?;
        let rope_window = Rope::for_window(&model)?;
        let output_norm = match hp.encoder {
            None if span.last() => Some(vec_f32(&model, OUTPUT_NORM)?),
            _ => None,
        };
        let encoder = EncoderInput::load(&model)?.map(Box::new);
        let kv = HostPages::new(span.len(), kv_dim, (pages, page), kv_format);
        let repacked = match math == CpuMath::Quantized && q4x8::supported() {
            true => repack::Repacked::of(&model, &span),
            false => repack::Repacked::default(),
        };
        Ok(Self {
            model,
            math,
            layers,
            output_norm,
            encoder,
            rope,
            rope_window,
            kv,
            repacked,
            span,
        })
    }

    /// The layers it runs.
    pub fn span(&self) -> &Span {
        &self.span
    }

    pub fn math(&self) -> CpuMath {
        self.math
    }

    /// The output norm over rows of the residual stream (an encoder has
    /// none).
    fn final_norm(&self, rows: &mut [f32]) {
        let hp = self.model.hparams();
        if let Some(w) = &self.output_norm {
            norm(hp.norm, rows, w, hp.rms_eps);
        }
    }

    /// `out = W x` for the `n` rows of `x`, by this backend's math.
    fn matmul(&self, name: &str, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        if let Some(p) = self.repacked.get(name) {
            p.matmul(x, n, out);
            return Ok(());
        }
        self.matmul_view(&self.model.tensor(name), x, n, out)
    }

    fn matmul_view(&self, w: &TensorView<'_>, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        if self.math == CpuMath::Quantized && q8::supported(w.info.ty) {
            q8::matmul_q8(w, x, n, out);
            Ok(())
        } else if self.math == CpuMath::Quantized && q8k::supported(w.info.ty) {
            q8k::matmul_q8k(w, x, n, out);
            Ok(())
        } else {
            matmul(w, x, n, out)
        }
    }

    fn embed(&self, tokens: &[u32], x: &mut [f32]) -> Result<()> {
        let hp = self.model.hparams();
        let embd = self.model.tensor(TOKEN_EMBD);
        for (&t, row) in tokens.iter().zip(x.chunks_exact_mut(hp.n_embd)) {
            if t as usize >= hp.n_vocab {
                return Err(ModelError::BadToken {
                    id: t,
                    n_vocab: hp.n_vocab,
                });
            }
            dequantize(embd.info.ty, embd.row(t as usize), row)?;
            if hp.embd_scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= hp.embd_scale);
            }
        }
        Ok(())
    }

    /// Causal GQA attention of a step's tokens, each over its own
    /// sequence's cache up to and including its position (on a
    /// sliding-window layer, its `window` newest keys): `at[i]` = (the
    /// cache of token i, its position); an encoder's over every token of
    /// its sequence (`ends[s]`: the sequence's length after the step).
    /// q: (n, n_head*hd); out likewise.
    /// Scores are q.k times the model's scale (and the query's temperature
    /// where the model has one), soft-capped where it says.
    /// Each (token, KV head) is computed alone, in the same order whatever
    /// else the step holds.
    fn attention(
        &self,
        tables: &[&[u32]],
        at: &[(usize, usize)],
        ends: &[usize],
        layer: usize,
        q: &[f32],
        out: &mut [f32],
    ) {
        let hp = self.model.hparams();
        let (hd, group) = (hp.head_dim, hp.n_head / hp.n_head_kv);
        let (scale, cap) = (hp.attn_scale, hp.attn_softcap);
        let sinks = self.layers[layer].sinks.as_deref();
        let pages = self.kv.read(layer);
        let LayerPages { k: kc, v: vc } = &*pages;
        let rows = self.kv.rows();
        let window = self.layers[layer].block.window;
        // One task per (token, KV head): its `group` query heads are contiguous.
        out.par_chunks_mut(group * hd)
            .enumerate()
            .for_each(|(task, o)| {
                let (i, g) = (task / hp.n_head_kv, task % hp.n_head_kv);
                let (seq, pos) = at[i];
                let row = |pos| self.kv.row_at(tables[seq], pos) + g * hd;
                let end = if hp.causal { pos + 1 } else { ends[seq] };
                let first = match window {
                    0 => 0,
                    w => (pos + 1).saturating_sub(w),
                };
                let len = end - first;
                // mistral3's temperature scales the queries by position.
                let scale = scale * hp.attn_temp.map_or(1.0, |t| t.at(pos));
                let qh = &q[i * hp.n_head * hd + g * group * hd..][..group * hd];
                let mut scores = vec![0f32; group * len];
                let mut r = vec![0f32; hd];
                for j in 0..len {
                    rows.load(kc, row(first + j), &mut r);
                    for h in 0..group {
                        scores[h * len + j] = simd::dot(&qh[h * hd..(h + 1) * hd], &r) * scale;
                    }
                }
                if let Some(c) = cap {
                    softcap(&mut scores, c);
                }
                for h in 0..group {
                    let sink = sinks.map(|s| s[g * group + h]);
                    softmax_sink(&mut scores[h * len..(h + 1) * len], sink);
                }
                o.fill(0.0);
                for j in 0..len {
                    rows.load(vc, row(first + j), &mut r);
                    for h in 0..group {
                        let p = scores[h * len + j];
                        for (acc, v) in o[h * hd..(h + 1) * hd].iter_mut().zip(&r) {
                            *acc += p * v;
                        }
                    }
                }
            });
    }

    /// One forward over `seqs`: each one's tokens at positions
    /// `cache.len()..`, every matmul over all the step's tokens together
    /// (row by row the same arithmetic whatever the other rows: see
    /// `matmul`), and each sequence's logits as its [`Logits`] asks.
    ///
    /// A later stage of a split model (`crate::split`) takes the rows `x`
    /// entering its layers (a row per token, sequence after sequence) in
    /// place of the embedding; an earlier stage gives each sequence the
    /// rows leaving them, whatever its [`Logits`] asks.
    fn run(
        &self,
        seqs: &mut [(&mut CpuCache, &[u32], Logits)],
        x_in: Option<&[f32]>,
    ) -> Result<Vec<Vec<f32>>> {
        let hp = self.model.hparams();
        let n_rows: usize = seqs.iter().map(|(_, t, _)| t.len()).sum();
        crate::split::check_rows(&self.span, hp.n_embd, x_in, n_rows)?;
        // Every sequence's input is checked before any cache changes.
        for (cache, tokens, want) in seqs.iter() {
            if self.encoder.is_some() && matches!(want, Logits::Last | Logits::All) {
                return Err(ModelError::Unsupported("logits of an encoder".into()));
            }
            if !cache.is_of(self.kv.pool()) {
                return Err(ModelError::Unsupported(
                    "a KV cache of another backend".into(),
                ));
            }
            crate::check_input(cache.len(), cache.n_ctx(), tokens, hp.n_vocab)?;
        }
        // Pages for every token of the step, a sequence's own where it
        // writes (a shared page is copied first), in memory.
        let mut copies = Vec::new();
        for (cache, tokens, _) in seqs.iter_mut() {
            copies.extend(cache.unshare_tail()?);
            cache.extend_to(cache.len() + tokens.len())?;
        }
        self.kv
            .cover(&seqs.iter().map(|(c, _, _)| &**c).collect::<Vec<_>>())?;
        for (from, to) in copies {
            self.kv.copy_page(from, to);
        }
        // (sequence, position) of every token of the step, in order.
        let at: Vec<(usize, usize)> = seqs
            .iter()
            .enumerate()
            .flat_map(|(s, (c, t, _))| (c.len()..c.len() + t.len()).map(move |p| (s, p)))
            .collect();
        let n = at.len();
        if n == 0 {
            return Ok(seqs.iter().map(|_| Vec::new()).collect());
        }
        let tokens: Vec<u32> = seqs
            .iter()
            .flat_map(|(_, t, _)| t.iter().copied())
            .collect();
        let (d, hd) = (hp.n_embd, hp.head_dim);
        let (q_dim, kv_dim) = (hp.n_head * hd, hp.n_head_kv * hd);
        // Activations, row-major by token.
        let mut x = vec![0f32; n * d]; // (n, d) residual stream
        let mut h = vec![0f32; n * d]; // (n, d) normed input
        let mut q = vec![0f32; n * q_dim]; // (n, n_head*hd)
        let mut k = vec![0f32; n * kv_dim]; // (n, n_kv*hd)
        let mut v = vec![0f32; n * kv_dim];
        let mut att = vec![0f32; n * q_dim];
        let mut proj = vec![0f32; n * d];
        let mut gate = vec![0f32; n * hp.n_ff]; // (n, n_ff)
        let mut up = vec![0f32; n * hp.n_ff];
        match x_in {
            Some(rows) => x.copy_from_slice(rows),
            None => self.embed(&tokens, &mut x)?,
        }
        if let Some(input) = &self.encoder {
            self.encoder_input(input, at.iter().map(|&(_, p)| p), &mut x)?;
        }
        let ends: Vec<usize> = seqs.iter().map(|(c, t, _)| c.len() + t.len()).collect();
        for (l, lv) in self.layers.iter().enumerate() {
            let names = self.model.layer(self.span.layers.start + l);
            h.copy_from_slice(&x);
            if let Some(w) = &lv.attn_norm {
                norm(hp.norm, &mut h, w, hp.rms_eps);
            }
            self.matmul(&names.wq, &h, n, &mut q)?;
            self.matmul(&names.wk, &h, n, &mut k)?;
            self.matmul(&names.wv, &h, n, &mut v)?;
            add_bias(&mut q, &lv.bq);
            add_bias(&mut k, &lv.bk);
            add_bias(&mut v, &lv.bv);
            if let Some([qn, kn]) = &lv.qk_norm {
                head_norm(hp.norm, &mut q, qn, hd, hp.rms_eps);
                head_norm(hp.norm, &mut k, kn, hd, hp.rms_eps);
            }
            let rope = match lv.block.rope {
                LayerRope::Model => Some(&self.rope),
                LayerRope::Window => Some(self.rope_window.as_ref().unwrap_or(&self.rope)),
                LayerRope::None => None,
            };
            let learned = hp.encoder.is_some_and(|e| e.learned_pos);
            let rope = rope.filter(|_| !learned);
            if let Some(rope) = rope {
                for (i, &(_, pos)) in at.iter().enumerate() {
                    rope.apply(&mut q[i * q_dim..(i + 1) * q_dim], hd, pos);
                    rope.apply(&mut k[i * kv_dim..(i + 1) * kv_dim], hd, pos);
                }
            }
            let rotations = self.kv.rows().rotations(hd);
            if let Some((rk, rv)) = rotations {
                kv::rotate(&mut q, rk);
                kv::rotate(&mut k, rk);
                kv::rotate(&mut v, rv);
            }
            {
                let mut pages = self.kv.write(l);
                let rows = self.kv.rows();
                for (i, &(s, pos)) in at.iter().enumerate() {
                    let row = self.kv.row_at(seqs[s].0.pages(), pos);
                    rows.store(&mut pages.k, row, &k[i * kv_dim..(i + 1) * kv_dim]);
                    rows.store(&mut pages.v, row, &v[i * kv_dim..(i + 1) * kv_dim]);
                }
            }
            let tables: Vec<&[u32]> = seqs.iter().map(|(c, _, _)| c.pages()).collect();
            self.attention(&tables, &at, &ends, l, &q, &mut att);
            if let Some((_, rv)) = rotations {
                kv::rotate(&mut att, rv);
            }
            self.matmul(&names.wo, &att, n, &mut proj)?;
            add_bias(&mut proj, &lv.bo);
            if let Some([post, _]) = &lv.post_norms {
                rmsnorm(&mut proj, post, hp.rms_eps);
            }
            add_residual(&mut x, &proj, hp.residual_scale);
            if let Some(e) = &lv.encoder {
                // Post-norms: x = LN(x + attn), x = LN(x + ffn(x)).
                layernorm_bias(&mut x, &e.attn_out, hp.rms_eps);
                self.encoder_ffn(&names, e, &x, n, [&mut gate, &mut up], &mut proj)?;
                add_residual(&mut x, &proj, 1.0);
                layernorm_bias(&mut x, &e.out, hp.rms_eps);
                continue;
            }

            // In parallel (command-r) the FFN reads the attention's input h.
            if let Some(ffn_norm) = &lv.ffn_norm {
                h.copy_from_slice(&x);
                norm(hp.norm, &mut h, ffn_norm, hp.rms_eps);
            }
            if lv.block.experts.is_some() {
                self.moe_ffn(&names, lv.moe_bias.as_ref(), &h, n, &mut proj)?;
                add_residual(&mut x, &proj, hp.residual_scale);
                continue;
            }
            self.matmul(&names.ffn_gate, &h, n, &mut gate)?;
            self.matmul(&names.ffn_up, &h, n, &mut up)?;
            glu(hp.act, &mut gate, &up);
            self.matmul(&names.ffn_down, &gate, n, &mut proj)?;
            if let Some([_, post]) = &lv.post_norms {
                rmsnorm(&mut proj, post, hp.rms_eps);
            }
            add_residual(&mut x, &proj, hp.residual_scale);
        }
        if !self.span.last() {
            let mut first = 0;
            let mut out = Vec::with_capacity(seqs.len());
            for (cache, t, _) in seqs.iter_mut() {
                cache.set_len(cache.len() + t.len());
                out.push(x[first * d..(first + t.len()) * d].to_vec());
                first += t.len();
            }
            return Ok(out);
        }
        // The rows each sequence wants logits of, all through one matmul;
        // hidden states are the normed rows themselves.
        let mut wanted = Vec::new(); // (sequence, rows)
        let mut out: Vec<Vec<f32>> = seqs.iter().map(|_| Vec::new()).collect();
        let mut first = 0;
        for (s, (cache, t, want)) in seqs.iter_mut().enumerate() {
            cache.set_len(cache.len() + t.len());
            let rows = match want {
                Logits::None => first..first,
                Logits::Last => first + t.len() - 1..first + t.len(),
                Logits::All => first..first + t.len(),
                Logits::Hidden => {
                    let mut rows = x[first * d..(first + t.len()) * d].to_vec();
                    self.final_norm(&mut rows);
                    out[s] = rows;
                    first..first
                }
            };
            first += t.len();
            wanted.push((s, rows));
        }
        let n_rows: usize = wanted.iter().map(|(_, r)| r.len()).sum();
        if n_rows == 0 {
            return Ok(out);
        }
        let mut rows = Vec::with_capacity(n_rows * d);
        for (_, r) in &wanted {
            rows.extend_from_slice(&x[r.start * d..r.end * d]);
        }
        self.final_norm(&mut rows);
        let out_name = if hp.tied_output { TOKEN_EMBD } else { OUTPUT };
        let mut logits = vec![0f32; n_rows * hp.n_vocab];
        self.matmul(out_name, &rows, n_rows, &mut logits)?;
        if hp.logit_scale != 1.0 {
            logits.iter_mut().for_each(|v| *v *= hp.logit_scale);
        }
        if let Some(c) = hp.final_softcap {
            softcap(&mut logits, c);
        }
        let mut at_row = 0;
        // (A sequence with no rows here keeps what it has: nothing, or its
        // hidden states.)
        for (s, r) in wanted.into_iter().filter(|(_, r)| !r.is_empty()) {
            out[s] = logits[at_row * hp.n_vocab..(at_row + r.len()) * hp.n_vocab].to_vec();
            at_row += r.len();
        }
        Ok(out)
    }
}

/// x += s * p: a residual branch (scaled by granite's multiplier; s * p
/// is exactly p where s is 1).
fn add_residual(x: &mut [f32], p: &[f32], s: f32) {
    x.iter_mut().zip(p).for_each(|(x, p)| *x += s * p);
}

fn add_bias(x: &mut [f32], b: &Option<Vec<f32>>) {
    if let Some(b) = b {
        ops::add_rows(x, b);
    }
}

impl Backend for CpuBackend {
    type Cache = CpuCache;

    fn hparams(&self) -> &HyperParams {
        self.model.hparams()
    }

    fn new_cache(&self, n_ctx: usize) -> Result<CpuCache> {
        Ok(PagedCache::new(self.kv.pool().clone(), n_ctx))
    }

    fn kv_pool(&self) -> (crate::KvLayout, usize) {
        let pool = self.kv.pool();
        let hp = self.model.hparams();
        let layout = crate::KvLayout::new(hp, pool.page_tokens(), self.kv.format())
            .of_layers(self.span.len());
        (layout, pool.pages())
    }

    fn memory(&self) -> crate::MemoryUse {
        let hp = self.model.hparams();
        let (layout, pages) = self.kv_pool();
        let (_, act) = memory_needed(hp, 0, crate::DEFAULT_STEP);
        crate::MemoryUse {
            weights: self.span.weight_bytes(&self.model),
            kv: layout.pool_bytes(pages),
            workspace: act,
            on_device: false,
        }
    }

    fn cache_on(
        &self,
        pages: Vec<u32>,
        copy: Option<(u32, u32)>,
        len: usize,
        n_ctx: usize,
    ) -> Result<CpuCache> {
        PagedCache::on_pages(self.kv.pool().clone(), pages, copy, len, n_ctx)
    }

    fn forward(&self, cache: &mut CpuCache, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        let mut out = self.run(&mut [(cache, tokens, want)], None)?;
        Ok(out.pop().unwrap_or_default())
    }

    fn forward_batch(&self, seqs: &mut [SeqStep<'_, CpuCache>]) -> Result<Vec<StepOut>> {
        match crate::split::Stage::stage_batch(self, seqs, None)? {
            crate::split::StageOut::Outs(o) => Ok(o),
            // A whole model's last layer is its own.
            crate::split::StageOut::Rows(_) => Err(ModelError::Unsupported(
                "the outputs of an earlier stage".into(),
            )),
        }
    }
}

/// The synth shape "tiny" in Q8_0 with weights of `seed`, written in `dir`.
#[cfg(test)]
pub(crate) fn tiny_model(dir: &tempfile::TempDir, seed: u64) -> Arc<Model> {
    use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
    let path = dir.path().join("tiny.gguf");
    let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let opts = SynthOptions {
        shape: Shape::find("tiny").unwrap(),
        ty: FileType::All(m40_gguf::GgmlType::Q8_0),
        seed,
    };
    write_model(f, &opts, |_, _| {}).unwrap();
    Arc::new(Model::open(&path).unwrap())
}

/// A pseudo-random stream in [-1, 1), fresh per seed (xorshift): the CPU
/// kernels' test inputs.
#[cfg(test)]
pub(crate) fn test_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A seed fresh each run (the clock), or `or` where it cannot be read.
#[cfg(test)]
pub(crate) fn fresh_seed(or: u64) -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(or, |d| d.as_nanos() as u64)
}

/// A GGUF file (in memory) of one matrix `w` of `rows` x `cols` in `ty`,
/// named "w": the CPU matmul tests' operand.
#[cfg(test)]
pub(crate) fn matrix_file(
    ty: m40_gguf::GgmlType,
    rows: usize,
    cols: usize,
    w: &[f32],
) -> m40_gguf::GgufFile {
    use m40_gguf::{quant::quantize_to_vec, GgufFile, GgufWriter, Metadata, TensorSpec};
    let spec = TensorSpec::new("w", ty, &[cols as u64, rows as u64]);
    let md = Metadata::new();
    let mut wr = GgufWriter::new(Vec::new(), &md, std::slice::from_ref(&spec)).unwrap();
    wr.write_tensor(&quantize_to_vec(ty, w).unwrap()[..])
        .unwrap();
    GgufFile::from_bytes(wr.finish().unwrap()).unwrap()
}

#[cfg(test)]
mod tests;
