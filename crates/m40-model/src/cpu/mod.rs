//! The CPU reference backend: FP32 arithmetic on weights kept in their GGUF
//! blocks, an FP16 KV cache, all prompt tokens through each matmul together.

pub(crate) mod fused;
pub mod matmul;
pub mod ops;
pub(crate) mod q8;
pub(crate) mod simd;

use std::sync::Arc;

use half::f16;
use half::slice::HalfFloatSliceExt;
use m40_gguf::hparams::{OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
use m40_gguf::quant::dequantize;
use m40_gguf::HyperParams;
use rayon::prelude::*;

use crate::error::{ModelError, Result};
use crate::host::human_bytes;
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
    /// The exact backend ([`CpuMath::Exact`]), the reference.
    pub fn new(model: Arc<Model>) -> Result<Self> {
        Self::with_math(model, CpuMath::Exact)
    }

    pub fn with_math(model: Arc<Model>, math: CpuMath) -> Result<Self> {
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
            math,
            layers,
            output_norm,
            rope,
        })
    }

    pub fn math(&self) -> CpuMath {
        self.math
    }

    /// `out = W x` for the `n` rows of `x`, by this backend's math.
    fn matmul(&self, name: &str, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        let w = self.model.tensor(name);
        if self.math == CpuMath::Quantized && q8::supported(w.info.ty) {
            q8::matmul_q8(&w, x, n, out);
            Ok(())
        } else {
            matmul(&w, x, n, out)
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

/// Host memory a [`CpuBackend`] of `hp` takes beyond its (memory-mapped)
/// weights, bytes: (a KV cache of `n_ctx` tokens, the activations of one
/// forward of `batch` tokens with its logits).
pub fn memory_needed(hp: &HyperParams, n_ctx: usize, batch: usize) -> (u64, u64) {
    let kv = kv_bytes_per_token(hp).saturating_mul(n_ctx as u64);
    let (b, d, ff) = (batch as u64, hp.n_embd as u64, hp.n_ff as u64);
    let (q, kvd) = (
        (hp.n_head * hp.head_dim) as u64,
        (hp.n_head_kv * hp.head_dim) as u64,
    );
    // x, h, proj; q, att; k, v; gate, up; logits (f32).
    let act = 4 * b * (3 * d + 2 * q + 2 * kvd + 2 * ff + hp.n_vocab as u64);
    (kv, act)
}

/// FP16 K and V of every layer for one token.
fn kv_bytes_per_token(hp: &HyperParams) -> u64 {
    2 * 2 * (hp.n_layer * hp.n_head_kv * hp.head_dim) as u64
}

/// Checks that a context of `n_ctx` tokens and forwards of `batch` tokens
/// fit in the memory this machine has available (where it can be read),
/// before anything is allocated; the error says what would fit.
pub fn check_memory(hp: &HyperParams, n_ctx: usize, batch: usize) -> Result<()> {
    let Some(available) = crate::host::available_memory() else {
        return Ok(());
    };
    let (kv, act) = memory_needed(hp, n_ctx, batch);
    if kv.saturating_add(act) <= available {
        return Ok(());
    }
    let fits = available.saturating_sub(act) / kv_bytes_per_token(hp).max(1);
    Err(ModelError::HostMemory {
        what: format!("a KV cache of {n_ctx} tokens (with the activations)"),
        need: format!(
            "{} ({} KV cache, {} activations)",
            human_bytes(kv.saturating_add(act)),
            human_bytes(kv),
            human_bytes(act)
        ),
        available: human_bytes(available),
        hint: if fits > 0 {
            format!("use a context of at most {fits} tokens")
        } else {
            "free some memory or use a smaller model".into()
        },
    })
}

fn kv_too_big(hp: &HyperParams, n_ctx: usize) -> ModelError {
    let kv = kv_bytes_per_token(hp).saturating_mul(n_ctx as u64);
    ModelError::HostMemory {
        what: format!("a KV cache of {n_ctx} tokens"),
        need: human_bytes(kv),
        available: crate::host::available_memory().map_or_else(|| "less".into(), human_bytes),
        hint: "use a smaller context".into(),
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
        // Fallible: a cache the machine cannot hold is an error, not an abort.
        let zeros = || -> Result<Vec<f16>> {
            let n = n_ctx
                .checked_mul(kv_dim)
                .ok_or_else(|| kv_too_big(hp, n_ctx))?;
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| kv_too_big(hp, n_ctx))?;
            v.resize(n, f16::ZERO);
            Ok(v)
        };
        Ok(CpuCache {
            k: (0..hp.n_layer).map(|_| zeros()).collect::<Result<_>>()?,
            v: (0..hp.n_layer).map(|_| zeros()).collect::<Result<_>>()?,
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
            self.matmul(&names.wq, &h, n, &mut q)?;
            self.matmul(&names.wk, &h, n, &mut k)?;
            self.matmul(&names.wv, &h, n, &mut v)?;
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
            self.matmul(&names.wo, &att, n, &mut proj)?;
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += p);

            h.copy_from_slice(&x);
            rmsnorm(&mut h, &lv.ffn_norm, hp.rms_eps);
            self.matmul(&names.ffn_gate, &h, n, &mut gate)?;
            self.matmul(&names.ffn_up, &h, n, &mut up)?;
            swiglu(&mut gate, &up);
            self.matmul(&names.ffn_down, &gate, n, &mut proj)?;
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
        self.matmul(out_name, rows, n_rows, &mut logits)?;
        Ok(logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use m40_gguf::hparams::{Arch, RopeScaling, RopeStyle};

    /// An 8B-like shape: 32 layers, 8 KV heads of 128 (128 KiB a token).
    fn hp() -> HyperParams {
        HyperParams {
            arch: Arch::Llama,
            n_layer: 32,
            n_embd: 4096,
            n_head: 32,
            n_head_kv: 8,
            head_dim: 128,
            n_ff: 14336,
            n_vocab: 128256,
            n_ctx_train: 131072,
            rope_freq_base: 500000.0,
            rope_dim: 128,
            rope_style: RopeStyle::Normal,
            rope_scaling: RopeScaling::None,
            rms_eps: 1e-5,
            tied_output: false,
            qkv_bias: false,
        }
    }

    #[test]
    fn memory_is_counted_and_checked_before_allocation() {
        let hp = hp();
        let (kv, act) = memory_needed(&hp, 4096, 512);
        assert_eq!(kv, 4096 * 128 * 1024);
        assert!(act > 0);
        // Far beyond any machine: an error that says what would fit.
        let e = check_memory(&hp, 1 << 40, 512).unwrap_err().to_string();
        assert!(e.contains("KV cache of 1099511627776 tokens"), "{e}");
        assert!(
            e.contains("use a context of at most") || e.contains("free some memory"),
            "{e}"
        );
        if let Some(avail) = crate::host::available_memory() {
            if avail > 1 << 30 {
                check_memory(&hp, 1024, 16).unwrap();
            }
        }
    }

    #[test]
    fn an_impossible_cache_is_an_error_not_an_abort() {
        use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let opts = SynthOptions {
            shape: Shape::find("tiny").unwrap(),
            ty: FileType::All(m40_gguf::GgmlType::Q8_0),
            seed: 1,
        };
        write_model(f, &opts, |_, _| {}).unwrap();
        let cpu = CpuBackend::new(Arc::new(Model::open(&path).unwrap())).unwrap();
        for n_ctx in [usize::MAX / 2, 1 << 50] {
            let e = cpu.new_cache(n_ctx).err().expect("no machine holds this");
            assert!(matches!(e, ModelError::HostMemory { .. }), "{e}");
        }
        assert_eq!(cpu.new_cache(64).unwrap().n_ctx(), 64);
    }
}
