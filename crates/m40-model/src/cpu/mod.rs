//! The CPU reference backend: FP32 arithmetic on weights kept in their GGUF
//! blocks, an FP16 KV cache, all prompt tokens through each matmul together.

pub mod fused;
pub mod matmul;
pub mod ops;
pub mod simd;

use std::sync::Arc;

use half::f16;
use half::slice::HalfFloatSliceExt;
use m40_gguf::hparams::{OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
use m40_gguf::quant::dequantize;
use m40_gguf::HyperParams;
use rayon::prelude::*;

use crate::error::{ModelError, Result};
use crate::{Backend, KvState, Logits, Model};
use matmul::matmul;
use ops::{rmsnorm, softmax, swiglu, Rope};

/// Small per-layer vectors kept as f32 (norm weights, biases).
struct LayerVecs {
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
}

/// The CPU backend over one model.
pub struct CpuBackend {
    model: Arc<Model>,
    layers: Vec<LayerVecs>,
    output_norm: Vec<f32>,
    rope: Rope,
}

/// A contiguous FP16 KV cache. Per layer: k, v of (n_ctx, n_head_kv * head_dim).
pub struct CpuCache {
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    kv_dim: usize,
    n_ctx: usize,
    len: usize,
}

impl KvState for CpuCache {
    fn len(&self) -> usize {
        self.len
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }
}

fn vec_f32(model: &Model, name: &str) -> Result<Vec<f32>> {
    Ok(model.tensor(name).to_f32()?)
}

impl CpuBackend {
    pub fn new(model: Arc<Model>) -> Result<Self> {
        let hp = model.hparams().clone();
        let mut layers = Vec::with_capacity(hp.n_layer);
        for l in 0..hp.n_layer {
            let n = model.layer(l);
            let bias = |name: &str| -> Result<Option<Vec<f32>>> {
                if hp.qkv_bias {
                    vec_f32(&model, name).map(Some)
                } else {
                    Ok(None)
                }
            };
            layers.push(LayerVecs {
                attn_norm: vec_f32(&model, &n.attn_norm)?,
                ffn_norm: vec_f32(&model, &n.ffn_norm)?,
                bq: bias(&n.bq)?,
                bk: bias(&n.bk)?,
                bv: bias(&n.bv)?,
            });
        }
        let rope = Rope::for_model(&model)?;
        let output_norm = vec_f32(&model, OUTPUT_NORM)?;
        Ok(Self {
            model,
            layers,
            output_norm,
            rope,
        })
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
        }
        Ok(())
    }

    /// Causal GQA attention of `n` new tokens (positions `start..start+n`)
    /// over the cache's first `start + n` entries. q: (n, n_head*hd); out likewise.
    fn attention(&self, cache: &CpuCache, layer: usize, q: &[f32], start: usize, out: &mut [f32]) {
        let hp = self.model.hparams();
        let (hd, group) = (hp.head_dim, hp.n_head / hp.n_head_kv);
        let scale = 1.0 / (hd as f32).sqrt();
        let (kc, vc, kv_dim) = (&cache.k[layer], &cache.v[layer], cache.kv_dim);
        // One task per (token, KV head): its `group` query heads are contiguous.
        out.par_chunks_mut(group * hd)
            .enumerate()
            .for_each(|(task, o)| {
                let (i, g) = (task / hp.n_head_kv, task % hp.n_head_kv);
                let len = start + i + 1;
                let qh = &q[i * hp.n_head * hd + g * group * hd..][..group * hd];
                let mut scores = vec![0f32; group * len];
                let mut row = vec![0f32; hd];
                for j in 0..len {
                    kc[j * kv_dim + g * hd..][..hd].convert_to_f32_slice(&mut row);
                    for h in 0..group {
                        scores[h * len + j] = simd::dot(&qh[h * hd..(h + 1) * hd], &row) * scale;
                    }
                }
                for h in 0..group {
                    softmax(&mut scores[h * len..(h + 1) * len]);
                }
                o.fill(0.0);
                for j in 0..len {
                    vc[j * kv_dim + g * hd..][..hd].convert_to_f32_slice(&mut row);
                    for h in 0..group {
                        let p = scores[h * len + j];
                        for (acc, v) in o[h * hd..(h + 1) * hd].iter_mut().zip(&row) {
                            *acc += p * v;
                        }
                    }
                }
            });
    }
}

fn add_bias(x: &mut [f32], b: &Option<Vec<f32>>) {
    if let Some(b) = b {
        for row in x.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
        }
    }
}

impl Backend for CpuBackend {
    type Cache = CpuCache;

    fn hparams(&self) -> &HyperParams {
        self.model.hparams()
    }

    fn new_cache(&self, n_ctx: usize) -> Result<CpuCache> {
        let hp = self.model.hparams();
        let kv_dim = hp.n_head_kv * hp.head_dim;
        let zeros = || vec![f16::ZERO; n_ctx * kv_dim];
        Ok(CpuCache {
            k: (0..hp.n_layer).map(|_| zeros()).collect(),
            v: (0..hp.n_layer).map(|_| zeros()).collect(),
            kv_dim,
            n_ctx,
            len: 0,
        })
    }

    fn forward(&self, cache: &mut CpuCache, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        let hp = self.model.hparams();
        let n = tokens.len();
        let start = cache.len;
        if start + n > cache.n_ctx {
            return Err(ModelError::ContextFull {
                needed: n,
                used: start,
                n_ctx: cache.n_ctx,
            });
        }
        if n == 0 {
            return Ok(Vec::new());
        }
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
        self.embed(tokens, &mut x)?;
        for (l, lv) in self.layers.iter().enumerate() {
            let names = self.model.layer(l);
            h.copy_from_slice(&x);
            rmsnorm(&mut h, &lv.attn_norm, hp.rms_eps);
            matmul(&self.model.tensor(&names.wq), &h, n, &mut q)?;
            matmul(&self.model.tensor(&names.wk), &h, n, &mut k)?;
            matmul(&self.model.tensor(&names.wv), &h, n, &mut v)?;
            add_bias(&mut q, &lv.bq);
            add_bias(&mut k, &lv.bk);
            add_bias(&mut v, &lv.bv);
            for i in 0..n {
                self.rope
                    .apply(&mut q[i * q_dim..(i + 1) * q_dim], hd, start + i);
                self.rope
                    .apply(&mut k[i * kv_dim..(i + 1) * kv_dim], hd, start + i);
            }
            let at = start * kv_dim;
            cache.k[l][at..at + n * kv_dim].convert_from_f32_slice(&k);
            cache.v[l][at..at + n * kv_dim].convert_from_f32_slice(&v);
            self.attention(cache, l, &q, start, &mut att);
            matmul(&self.model.tensor(&names.wo), &att, n, &mut proj)?;
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += p);

            h.copy_from_slice(&x);
            rmsnorm(&mut h, &lv.ffn_norm, hp.rms_eps);
            matmul(&self.model.tensor(&names.ffn_gate), &h, n, &mut gate)?;
            matmul(&self.model.tensor(&names.ffn_up), &h, n, &mut up)?;
            swiglu(&mut gate, &up);
            matmul(&self.model.tensor(&names.ffn_down), &gate, n, &mut proj)?;
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += p);
        }
        cache.len = start + n;
        let rows = match want {
            Logits::None => return Ok(Vec::new()),
            Logits::Last => &mut x[(n - 1) * d..],
            Logits::All => &mut x[..],
        };
        rmsnorm(rows, &self.output_norm, hp.rms_eps);
        let n_rows = rows.len() / d;
        let out_name = if hp.tied_output { TOKEN_EMBD } else { OUTPUT };
        let mut logits = vec![0f32; n_rows * hp.n_vocab];
        matmul(&self.model.tensor(out_name), rows, n_rows, &mut logits)?;
        Ok(logits)
    }
}
