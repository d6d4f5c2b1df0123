//! An encoder's forward on the GPU (bert, nomic-bert: the CPU's
//! `cpu/encoder.rs`): whole sequences from position 0, several in one step,
//! each token a row; every matrix in GGUF rows through the matmul routing;
//! Q/K/V's biases and RoPE (an angle of 0 for bert's learned positions)
//! in the KV append; the attention over every key of a row's sequence
//! (`attention_encoder`); LayerNorms with bias after each residual add.
//! What comes back is each row's final hidden state (`Want::Hidden`).

use m40_device::{DeviceBuffer, Stream};
use m40_gguf::hparams::{
    NormKind, RopeStyle as GgufRope, POSITION_EMBD, TOKEN_EMBD_NORM, TOKEN_EMBD_NORM_B, TOKEN_TYPES,
};
use m40_kernels::{EncAttnInputs, EncHeads, KernelFormat, KvAppend, RopeParams, RopeStyle};

use super::kv::GpuCache;
use super::residual::Input;
use super::weights::{Mat, MatView};
use super::{lock, GpuBackend, State};
use crate::batch::{SeqStep, StepOut, Want};
use crate::cpu::ops::Rope;
use crate::error::{ModelError, Result};
use crate::{KvState, Model};

/// A LayerNorm's weight and bias.
type NormWb = [DeviceBuffer<f32>; 2];

struct EncLayer {
    q: Mat,
    k: Mat,
    v: Mat,
    /// Q's, K's and V's biases in one buffer (bert).
    qkv_bias: Option<DeviceBuffer<f32>>,
    wo: Mat,
    bo: Option<DeviceBuffer<f32>>,
    attn_out: NormWb,
    /// None: bert's ungated GELU.
    gate: Option<Mat>,
    up: Mat,
    down: Mat,
    /// The FFN's biases (up, down; bert).
    ffn_bias: Option<[DeviceBuffer<f32>; 2]>,
    out: NormWb,
}

/// An encoder's weights beyond the token embedding (`Weights::embd`).
pub(super) struct EncoderWeights {
    type0: DeviceBuffer<f32>,
    /// bert's learned positions.
    pos: Option<Mat>,
    input_norm: NormWb,
    layers: Vec<EncLayer>,
    /// RoPE's table (zero angles where positions are learned) and
    /// parameters in the file's own style (the Q/K rows are as in the file).
    inv_freq: DeviceBuffer<f32>,
    rope: RopeParams,
}

fn upload_mat(model: &Model, stream: &Stream, name: &str) -> Result<Mat> {
    let t = model.tensor(name);
    KernelFormat::of(t.info.ty, "gpu backend")?;
    Ok(Mat {
        ty: t.info.ty,
        data: stream.upload(t.data, name)?,
        rows: t.info.n_rows(),
        cols: t.info.row_len(),
        packed: false,
    })
}

impl EncoderWeights {
    pub(super) fn upload(model: &Model, stream: &Stream) -> Result<Option<EncoderWeights>> {
        let hp = model.hparams();
        let Some(e) = hp.encoder else {
            return Ok(None);
        };
        let f32s = |name: &str| -> Result<DeviceBuffer<f32>> {
            Ok(stream.upload(&model.tensor(name).to_f32()?, name)?)
        };
        let wb = |w: &str, b: &str| -> Result<NormWb> { Ok([f32s(w)?, f32s(b)?]) };
        let mut type0 = model.tensor(TOKEN_TYPES).to_f32()?;
        type0.truncate(hp.n_embd);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for l in 0..hp.n_layer {
            let n = model.layer(l);
            let qkv_bias = match hp.qkv_bias {
                true => {
                    let mut b = model.tensor(&n.bq).to_f32()?;
                    b.extend(model.tensor(&n.bk).to_f32()?);
                    b.extend(model.tensor(&n.bv).to_f32()?);
                    Some(stream.upload(&b, &format!("blk.{l}.attn_qkv biases"))?)
                }
                false => None,
            };
            layers.push(EncLayer {
                q: upload_mat(model, stream, &n.wq)?,
                k: upload_mat(model, stream, &n.wk)?,
                v: upload_mat(model, stream, &n.wv)?,
                qkv_bias,
                wo: upload_mat(model, stream, &n.wo)?,
                bo: hp.out_bias.then(|| f32s(&n.bo)).transpose()?,
                attn_out: wb(&n.attn_out_norm, &n.attn_out_norm_b)?,
                gate: e
                    .gated
                    .then(|| upload_mat(model, stream, &n.ffn_gate))
                    .transpose()?,
                up: upload_mat(model, stream, &n.ffn_up)?,
                down: upload_mat(model, stream, &n.ffn_down)?,
                ffn_bias: match e.ffn_bias {
                    true => Some([f32s(&n.ffn_up_b)?, f32s(&n.ffn_down_b)?]),
                    false => None,
                },
                out: wb(&n.out_norm, &n.out_norm_b)?,
            });
        }
        let cpu_rope = Rope::for_model(model)?;
        let mut table = cpu_rope.device_table();
        if e.learned_pos {
            // Angle 0: the append's rotation leaves Q and K as they are.
            let last = table.len() - 1;
            table[..last].fill(0.0);
            table[last] = 1.0;
        }
        Ok(Some(EncoderWeights {
            type0: stream.upload(&type0, TOKEN_TYPES)?,
            pos: e
                .learned_pos
                .then(|| upload_mat(model, stream, POSITION_EMBD))
                .transpose()?,
            input_norm: wb(TOKEN_EMBD_NORM, TOKEN_EMBD_NORM_B)?,
            layers,
            inv_freq: stream.upload(&table, "RoPE frequencies")?,
            rope: RopeParams {
                style: match hp.rope_style {
                    GgufRope::Normal => RopeStyle::Normal,
                    GgufRope::Neox => RopeStyle::Neox,
                },
                n_head: hp.n_head,
                head_dim: hp.head_dim,
                n_rot: hp.rope_dim,
                pos_scale: cpu_rope.pos_scale,
            },
        }))
    }
}

impl GpuBackend {
    /// An encoder's step: each sequence's tokens whole, from position 0,
    /// its hidden states back (every sequence must want them), in groups
    /// of at most max_batch rows.
    pub(super) fn encoder_batch(
        &self,
        enc: &EncoderWeights,
        seqs: &mut [SeqStep<'_, GpuCache>],
    ) -> Result<Vec<StepOut>> {
        self.check_steps(seqs)?;
        for s in seqs.iter() {
            if s.want != Want::Hidden || s.cache.len() != 0 || s.tokens.len() > self.max_batch {
                return Err(ModelError::Unsupported(format!(
                    "an encoder's step takes whole sequences of at most {} tokens for their hidden states",
                    self.max_batch
                )));
            }
        }
        let mut out = Vec::with_capacity(seqs.len());
        let mut i = 0;
        while i < seqs.len() {
            let (mut j, mut rows) = (i, 0);
            while j < seqs.len() && rows + seqs[j].tokens.len() <= self.max_batch {
                rows += seqs[j].tokens.len();
                j += 1;
            }
            out.extend(self.encoder_group(enc, &mut seqs[i..j])?);
            i = j;
        }
        Ok(out)
    }

    fn encoder_group(
        &self,
        enc: &EncoderWeights,
        seqs: &mut [SeqStep<'_, GpuCache>],
    ) -> Result<Vec<StepOut>> {
        let d = self.model.hparams().n_embd;
        let mut st = lock(&self.state);
        for s in seqs.iter_mut() {
            s.cache.extend_to(s.tokens.len())?;
        }
        let (mut tokens, mut pos, mut of) = (Vec::new(), Vec::new(), Vec::new());
        for (j, s) in seqs.iter().enumerate() {
            tokens.extend_from_slice(s.tokens);
            pos.extend(0..s.tokens.len());
            of.extend(std::iter::repeat_n(j, s.tokens.len()));
        }
        let n = tokens.len();
        let tables: Vec<&[u32]> = seqs.iter().map(|s| s.cache.pages()).collect();
        let State { work: w, pools, .. } = &mut *st;
        self.upload_batch(w, &tokens, &pos, &tables, &of, &[])?;
        let max_pos = pos.iter().copied().max().unwrap_or(0);
        self.encoder_enqueue(enc, w, pools, n, max_pos)?;
        let mut rows = vec![0f32; n * d];
        self.stream.copy_to_host(&w.x.slice(0..n * d)?, &mut rows)?;
        self.stream.synchronize()?;
        let mut at = 0;
        Ok(seqs
            .iter_mut()
            .map(|s| {
                let len = s.tokens.len();
                s.cache.set_len(len);
                let h = rows[at * d..(at + len) * d].to_vec();
                at += len;
                StepOut::Hidden(h)
            })
            .collect())
    }

    /// The layers over the `n` uploaded rows, the hidden states left in
    /// `w.x`.
    fn encoder_enqueue(
        &self,
        enc: &EncoderWeights,
        w: &mut super::workspace::Workspace,
        pools: &mut super::kv::Pools,
        n: usize,
        max_pos: usize,
    ) -> Result<()> {
        let hp = self.model.hparams();
        let (s, k) = (&self.stream, &self.kernels);
        let (b, d, eps) = (self.max_batch, hp.n_embd, hp.rms_eps);
        let (q_dim, kv_dim) = (hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim);
        let ids = w.inputs.slice(0..n)?;
        let pos = w.inputs.slice(b..b + n)?;
        let table = w.inputs.slice(2 * b..2 * b + self.pages.pages())?;
        let tab = w.inputs.slice(self.tab_at()..self.tab_at() + n)?;
        let gather = |m: &Mat, ids, out: &mut DeviceBuffer<f32>| -> Result<()> {
            let data = m.data.view();
            match m.view(&data) {
                MatView::Packed(p) => k.embed_packed(s, &p, ids, out)?,
                MatView::Rows(r) => k.embed(s, &r, ids, out)?,
            }
            Ok(())
        };
        // x = LN(token + type 0 (+ position)).
        gather(self.weights.embd()?, &ids, &mut w.x)?;
        k.add_rows(s, &mut w.x, &enc.type0.view(), n)?;
        if let Some(p) = &enc.pos {
            gather(p, &pos, &mut w.h)?;
            k.add(s, &mut w.x, &w.h.slice(0..n * d)?, n * d)?;
        }
        let norm = |x: &mut DeviceBuffer<f32>, [wt, bias]: &NormWb| -> Result<()> {
            k.norm_in_place(s, NormKind::Layer, x, &wt.view(), d, n, eps)?;
            k.add_rows(s, x, &bias.view(), n)?;
            Ok(())
        };
        norm(&mut w.x, &enc.input_norm)?;
        let heads = EncHeads {
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            scale: hp.attn_scale,
        };
        for (l, layer) in enc.layers.iter().enumerate() {
            let xv = w.x.view();
            let xin = Input::Rows(&xv);
            self.matmul(&layer.q, xin, &mut w.q, n, false)?;
            self.matmul(&layer.k, xin, &mut w.k, n, false)?;
            self.matmul(&layer.v, xin, &mut w.v, n, false)?;
            let (kk, vv) = (w.k.slice(0..n * kv_dim)?, w.v.slice(0..n * kv_dim)?);
            let inv_freq = enc.inv_freq.view();
            let kv = KvAppend {
                n_head_kv: hp.n_head_kv,
                pos: &pos,
                inv_freq: &inv_freq,
                p: &enc.rope,
                kpool: &mut pools.k[l],
                vpool: &mut pools.v[l],
                // An encoder's pool is FP16 (GpuBackend::takes_kv_format).
                format: m40_kernels::KvType::F16,
                table: &table,
                max_start: max_pos,
            };
            match &layer.qkv_bias {
                Some(bias) => {
                    let bias = bias.view();
                    k.rope_kv_append_biased(s, &mut w.q, &kk, &vv, kv, Some(&tab), &bias)?
                }
                None => k.rope_kv_append_batch(s, &mut w.q, &kk, &vv, kv, &tab)?,
            }
            let inputs = EncAttnInputs {
                q: &w.q.slice(0..n * q_dim)?,
                kpool: &pools.k[l].view(),
                vpool: &pools.v[l].view(),
                table: &table,
                tab: &tab,
                pos: &pos,
            };
            k.attention_encoder(s, heads, &inputs, n, &mut w.att)?;
            // x = LN(x + attn Wo + bo).
            let av = w.att.view();
            self.matmul(&layer.wo, Input::Rows(&av), &mut w.h, n, false)?;
            if let Some(bo) = &layer.bo {
                k.add_rows(s, &mut w.h, &bo.view(), n)?;
            }
            k.add(s, &mut w.x, &w.h.slice(0..n * d)?, n * d)?;
            norm(&mut w.x, &layer.attn_out)?;
            // x = LN(x + ffn(x)).
            let xv = w.x.view();
            let ff = hp.n_ff;
            self.matmul(&layer.up, Input::Rows(&xv), &mut w.up, n, false)?;
            if let Some([bu, _]) = &layer.ffn_bias {
                k.add_rows(s, &mut w.up, &bu.view(), n)?;
            }
            let act = match &layer.gate {
                Some(g) => {
                    self.matmul(g, Input::Rows(&xv), &mut w.gate, n, false)?;
                    k.glu(s, hp.act, &mut w.gate, &w.up.slice(0..n * ff)?, n * ff)?;
                    &w.gate
                }
                None => {
                    k.gelu(s, &mut w.up, n * ff)?;
                    &w.up
                }
            };
            let actv = act.slice(0..n * ff)?;
            self.matmul(&layer.down, Input::Rows(&actv), &mut w.h, n, false)?;
            if let Some([_, bd]) = &layer.ffn_bias {
                k.add_rows(s, &mut w.h, &bd.view(), n)?;
            }
            k.add(s, &mut w.x, &w.h.slice(0..n * d)?, n * d)?;
            norm(&mut w.x, &layer.out)?;
        }
        Ok(())
    }
}
