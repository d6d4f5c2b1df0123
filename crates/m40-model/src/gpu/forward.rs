//! The forward pass on the device: a step's layers queued kernel by kernel
//! (capturable: nothing here allocates or waits), the matmul routing
//! (packed GEMV, GEMV of GGUF rows, GEMM), and the fusions of one-token
//! steps (residual adds and RMSNorms folded into the GEMVs, RoPE and the
//! KV append folded into the Q/K/V GEMV).

use m40_device::{DeviceBuffer, DeviceView};
use m40_gguf::hparams::Block;
use m40_gguf::{HyperParams, NormKind};
use m40_kernels::{
    AddResidual, AttnInputs, AttnPlan, AttnScratch, AttnShape, Fold, GemvOpts, GemvOut, KvAppend,
    PostNorm, RopeKv, RowSplit, Scores,
};

use super::kv::{GpuCache, Pools};
use super::moe::MoeIo;
use super::ops::{HeadNorms, Join, LayerOps};
use super::residual::{Input, Residual};
use super::weights::{Ffn, Layer, Mat, MatView, Stack};
use super::workspace::{norm_bufs, res_bufs, Norm, Res, Select, Workspace, LOGIT_ROWS};
use super::{kv_type, GpuBackend, State};
use crate::error::Result;
use crate::{KvState, Logits};

/// The attention of `n_tok` tokens of one sequence from position `start`
/// (at most: the kernels read the start from the device), on a layer
/// without a sliding window (see [`layer_shape`]).
pub(super) fn attn_shape(hp: &HyperParams, n_tok: usize, start: usize) -> AttnShape {
    let plain = 1.0 / (hp.head_dim as f32).sqrt();
    AttnShape {
        n_tok,
        start,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        head_dim: hp.head_dim,
        scores: Scores {
            scale: (hp.attn_scale != plain).then_some(hp.attn_scale),
            softcap: hp.attn_softcap.unwrap_or(0.0),
            window: 0,
        },
    }
}

/// `shape` on a layer of `block`: with its sliding window, where it has one.
fn layer_shape(block: &Block, shape: &AttnShape) -> AttnShape {
    AttnShape {
        scores: Scores {
            window: block.window,
            ..shape.scores
        },
        ..*shape
    }
}

/// What every layer of a step shares: its token count, positions,
/// attention and whether its logits follow.
struct LayerStep {
    n: usize,
    max_start: usize,
    attn: StepAttn,
    /// The attention's shape on a layer without a window.
    shape: AttnShape,
    last_logits: bool,
}

/// How a step's attention runs: one sequence's tokens under a plan, or a
/// batched decode step (one token of each of several sequences, see
/// `upload_batch`: each at its own position over its own block table).
#[derive(Clone, Copy, Debug)]
pub(super) enum StepAttn {
    Seq(AttnPlan),
    Batch,
}

impl GpuBackend {
    /// The GEMV's x, and the half of a folded norm it takes, for `x`.
    pub(super) fn fold_in<'a>(
        &self,
        x: Input<'a>,
    ) -> (&'a DeviceView<'a, f32>, Option<Fold<'a, 'a>>) {
        match x {
            Input::Rows(x) => (x, None),
            Input::Folded { h, part, n } => {
                let eps = self.model.hparams().rms_eps;
                (
                    h,
                    Some(Fold::Take {
                        part,
                        n_part: n,
                        eps,
                    }),
                )
            }
        }
    }

    /// y = W x for `n` rows of x (y += W x with `accumulate`; not through
    /// the GEMV of GGUF rows).
    pub(super) fn matmul(
        &self,
        w: &Mat,
        x: Input<'_>,
        y: &mut DeviceBuffer<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let y = RowSplit {
            bufs: &mut [y],
            rows: &[w.rows],
        };
        self.gemm_or_gemv(w, x, y, n, accumulate)
    }

    /// The matrices of `stacks` applied to `n` rows of x, each matrix's
    /// rows into the next buffer of `outs`.
    fn matmul_stacks(
        &self,
        stacks: &[Stack],
        x: Input<'_>,
        mut outs: &mut [&mut DeviceBuffer<f32>],
        n: usize,
    ) -> Result<()> {
        for st in stacks {
            let (mine, rest) = std::mem::take(&mut outs).split_at_mut(st.parts.len());
            outs = rest;
            let y = RowSplit {
                bufs: mine,
                rows: &st.parts,
            };
            self.gemm_or_gemv(&st.mat, x, y, n, false)?;
        }
        Ok(())
    }

    /// gate = act(gate h) * up h for `n` rows of h (SwiGLU, GeGLU): through
    /// the GLU GEMV, or the GEMM into `up` (2 n_ff per row) and glu_pairs,
    /// for an interleaved stack; else the two projections and the GLU.
    fn gate_up(
        &self,
        stacks: &[Stack],
        h: Input<'_>,
        gate: &mut DeviceBuffer<f32>,
        up: &mut DeviceBuffer<f32>,
        n: usize,
    ) -> Result<()> {
        let (k, s) = (&self.kernels, &self.stream);
        let (n_ff, act) = (self.model.hparams().n_ff, self.model.hparams().act);
        match stacks {
            [st] if st.glu => {
                let data = st.mat.data.view();
                match st.mat.view(&data) {
                    MatView::Packed(m) if self.gemv_takes(&st.mat, n) => {
                        let (h, fold) = self.fold_in(h);
                        let opts = GemvOpts {
                            m: n,
                            ksplit: None,
                            fold,
                        };
                        k.gemv_packed_to(s, &m, h, GemvOut::Glu(gate, act), opts)?;
                    }
                    _ => {
                        self.matmul(&st.mat, h, up, n, false)?;
                        k.glu_pairs(s, act, &up.view(), gate, n, n_ff)?;
                    }
                }
            }
            _ => {
                self.matmul_stacks(stacks, h, &mut [&mut *gate, &mut *up], n)?;
                k.glu(s, act, gate, &up.view(), n * n_ff)?;
            }
        }
        Ok(())
    }

    /// The residual connection x += W a for `n` rows of a. The GEMM, and
    /// with `fuse` the packed GEMV, accumulate into x in place; with
    /// `next_norm` (the weight of the norm that follows, when its GEMVs
    /// take a folded norm: see `folds`) the one-token GEMV also emits that
    /// norm's h and partial sums. Otherwise rows that go through the GEMV
    /// (`gemv_takes`) land in `w.proj` and are left pending: the
    /// next [`Self::norm`] adds them as it normalizes.
    fn matmul_res(
        &self,
        wt: &Mat,
        a: &DeviceView<'_, f32>,
        w: Res<'_>,
        n: usize,
        next_norm: Option<&DeviceBuffer<f32>>,
    ) -> Result<Residual<'static>> {
        let data = wt.data.view();
        if let (Some(nw), MatView::Packed(m)) = (next_norm, wt.view(&data)) {
            debug_assert!(self.fuse && n == 1);
            let nv = nw.view();
            let fold = Fold::Emit {
                weight: &nv,
                h: w.h,
                part: w.part,
            };
            let opts = GemvOpts {
                m: 1,
                ksplit: None,
                fold: Some(fold),
            };
            let l = self
                .kernels
                .gemv_packed_to(&self.stream, &m, a, GemvOut::Add(w.x), opts)?;
            return Ok(Residual::Folded(l.blocks));
        }
        if self.gemv_takes(wt, n) && !(wt.packed && self.fuse) {
            self.matmul(wt, Input::Rows(a), w.proj, n, false)?;
            Ok(Residual::PENDING)
        } else {
            self.matmul(wt, Input::Rows(a), w.x, n, true)?;
            Ok(Residual::Done)
        }
    }

    /// A residual connection whose branch is transformed before it joins
    /// x, for `n` rows of a: W a into `proj` (the workspace's), left
    /// pending with its post-norm (gemma's: the next norm's launch norms
    /// and scales it as it adds it to x), or scaled here by the model's
    /// residual multiplier (granite's).
    fn transformed_res<'w>(
        &self,
        wt: &Mat,
        a: &DeviceView<'_, f32>,
        post: Option<&'w DeviceBuffer<f32>>,
        proj: &mut DeviceBuffer<f32>,
        n: usize,
    ) -> Result<Residual<'w>> {
        let (k, s) = (&self.kernels, &self.stream);
        let hp = self.model.hparams();
        self.matmul(wt, Input::Rows(a), proj, n, false)?;
        if post.is_none() && hp.residual_scale != 1.0 {
            k.scale(s, proj, n * hp.n_embd, hp.residual_scale)?;
        }
        Ok(Residual::Pending { post })
    }

    /// x += the pending branch in `w.proj` (`n` rows), post-normed and
    /// scaled first where `res` says: a step that ends without the norm
    /// that would take it.
    fn join_pending(
        &self,
        x: &mut DeviceBuffer<f32>,
        proj: &mut DeviceBuffer<f32>,
        res: Residual<'_>,
        n: usize,
    ) -> Result<()> {
        let (k, s) = (&self.kernels, &self.stream);
        let hp = self.model.hparams();
        let d = hp.n_embd;
        if let Residual::Pending { post: Some(post) } = res {
            k.norm_in_place(s, NormKind::Rms, proj, &post.view(), d, n, hp.rms_eps)?;
            if hp.residual_scale != 1.0 {
                k.scale(s, proj, n * d, hp.residual_scale)?;
            }
        }
        Ok(k.add(s, x, &proj.view(), n * d)?)
    }

    /// h = norm(x rows `rows`) * weight (the model's RMSNorm or LayerNorm),
    /// adding the pending residual rows `w.proj` (post-normed where it
    /// says) to x first when `res` is pending (rows then start at 0).
    fn norm(
        &self,
        w: Norm<'_>,
        weight: &DeviceBuffer<f32>,
        rows: std::ops::Range<usize>,
        res: Residual<'_>,
    ) -> Result<()> {
        let (k, s) = (&self.kernels, &self.stream);
        let hp = self.model.hparams();
        let (eps, d, kind) = (hp.rms_eps, hp.n_embd, hp.norm);
        debug_assert!(
            !matches!(res, Residual::Folded(_)),
            "a folded norm runs no launch"
        );
        if let Residual::Pending { post } = res {
            debug_assert_eq!(rows.start, 0, "pending residual rows start at 0");
            let pv = post.map(|p| p.view());
            let add = AddResidual {
                x: w.x,
                d: &w.proj.view(),
                post: pv.as_ref().map(|w| PostNorm {
                    w,
                    scale: hp.residual_scale,
                }),
            };
            k.add_norm(s, kind, add, &weight.view(), w.h, rows.len(), eps)?;
        } else {
            let x = w.x.slice(rows.start * d..rows.end * d)?;
            k.norm(s, kind, &x, &weight.view(), w.h, rows.len(), eps)?;
        }
        Ok(())
    }

    /// The norm after a residual connection left as `res`, over `n` rows
    /// into h, unless it was folded into the GEMVs.
    fn norm_after(
        &self,
        w: Norm<'_>,
        weight: &DeviceBuffer<f32>,
        n: usize,
        res: Residual<'_>,
    ) -> Result<()> {
        if matches!(res, Residual::Folded(_)) {
            return Ok(());
        }
        self.norm(w, weight, 0..n, res)
    }

    /// Queue the layers for `n` tokens whose inputs are uploaded, positions
    /// from pos[0] (at most `max_start`), attention as `attn` says (with
    /// [`StepAttn::Batch`], each token of its own sequence at a position of
    /// at most `max_start`); with `last_logits`, then the last token's
    /// logits into `w.logits`. Each layer's kernels are its op list's
    /// (`ops.rs`). Nothing here allocates or waits, so it can be captured.
    pub(super) fn enqueue(
        &self,
        w: &mut Workspace,
        pools: &mut Pools,
        n: usize,
        max_start: usize,
        attn: StepAttn,
        last_logits: bool,
    ) -> Result<()> {
        let hp = self.model.hparams();
        let (s, k) = (&self.stream, &self.kernels);
        if self.span.first() {
            let ids = w.inputs.slice(0..n)?;
            let embd = self.weights.embd()?;
            let data = embd.data.view();
            match embd.view(&data) {
                MatView::Packed(m) => k.embed_packed(s, &m, &ids, &mut w.x)?,
                MatView::Rows(m) => k.embed(s, &m, &ids, &mut w.x)?,
            }
            if hp.embd_scale != 1.0 {
                k.scale(s, &mut w.x, n * hp.n_embd, hp.embd_scale)?;
            }
        }
        // A later stage's x rows are uploaded (`upload_rows`); an earlier
        // stage ends with its rows in x, every residual added.
        let last_logits = last_logits && self.span.last();
        let step = LayerStep {
            n,
            max_start,
            attn,
            shape: attn_shape(hp, n, max_start),
            last_logits,
        };
        // How the last residual connection was left (see matmul_res).
        let mut res = Residual::Done;
        for (l, (layer, ops)) in self.weights.layers.iter().zip(&self.ops).enumerate() {
            res = self.attention_layer(w, pools, l, (layer, ops), &step, res)?;
            res = self.ffn_layer(w, l, (layer, ops), &step, res)?;
        }
        if res.is_pending() && (n > 1 || !last_logits) {
            self.join_pending(&mut w.x, &mut w.proj, res, n)?;
            res = Residual::Done;
        }
        if last_logits {
            self.logits(w, n - 1..n, res)?;
        }
        Ok(())
    }

    /// Layer `l`'s attention half: its norm (unless folded), Q/K/V, head
    /// norms, RoPE and the KV append, the attention, and its output's
    /// residual connection, left as the returned [`Residual`].
    fn attention_layer<'a>(
        &'a self,
        w: &mut Workspace,
        pools: &mut Pools,
        l: usize,
        (layer, ops): (&'a Layer, &LayerOps),
        step: &LayerStep,
        res: Residual<'a>,
    ) -> Result<Residual<'a>> {
        let hp = self.model.hparams();
        let (s, k) = (&self.stream, &self.kernels);
        let (b, n, max_start) = (self.max_batch, step.n, step.max_start);
        let hd = hp.head_dim;
        let (q_dim, kv_dim) = (hp.n_head * hd, hp.n_head_kv * hd);
        let pos_v = w.inputs.slice(b..b + n)?;
        let table = w.inputs.slice(2 * b..2 * b + self.pages.pages())?;
        let tab = match step.attn {
            StepAttn::Batch => Some(w.inputs.slice(self.tab_at()..self.tab_at() + n)?),
            StepAttn::Seq(_) => None,
        };
        // Q, K, V of the attention norm (folded into their GEMV, or run
        // here into h).
        self.norm_after(norm_bufs!(w), &layer.attn_norm, n, res)?;
        let (hv, pv) = (w.h.view(), w.norm_part.view());
        let xin = res.input(&hv, &pv);
        let (inv_freq, rope) = self.ropes.of(layer.block.rope);
        // Where this layer's rotated keys and values go.
        let mut kv = KvAppend {
            n_head_kv: hp.n_head_kv,
            pos: &pos_v,
            inv_freq: &inv_freq,
            p: rope,
            kpool: &mut pools.k[l],
            vpool: &mut pools.v[l],
            format: kv_type(self.kv_layout.format),
            table: &table,
            max_start,
        };
        if n == 1 && ops.one_token_rope {
            // One token through packed Q/K/V stacks (one, or a run of them
            // per format: a Q4_K_M layer's Q/K and its Q6_K V): the GEMVs
            // add the biases, rotate and append to the cache themselves.
            let mut first = 0;
            for st in &layer.qkv {
                let data = st.mat.data.view();
                let MatView::Packed(m) = st.mat.view(&data) else {
                    unreachable!("one_token_rope: packed")
                };
                let (x, fold) = self.fold_in(xin);
                // This stack's rows' biases (Q's, K's, V's in one buffer).
                let from: usize = [q_dim, kv_dim][..first].iter().sum();
                let bias = match &layer.bias {
                    Some(b) => Some(b.slice(from..from + m.rows)?),
                    None => None,
                };
                let parts = first..first + st.parts.len();
                first = parts.end;
                let out = GemvOut::RopeKv(RopeKv {
                    parts,
                    q: &mut w.q,
                    kv: kv.reborrow(),
                    bias: bias.as_ref(),
                });
                let opts = GemvOpts {
                    m: 1,
                    ksplit: None,
                    fold,
                };
                k.gemv_packed_to(s, &m, x, out, opts)?;
            }
        } else {
            self.matmul_stacks(&layer.qkv, xin, &mut [&mut w.q, &mut w.k, &mut w.v], n)?;
            if let (Some(b), true) = (&layer.bias, ops.bias_apart) {
                let kd = kv_dim;
                k.add_rows(s, &mut w.q, &b.slice(0..q_dim)?, n)?;
                k.add_rows(s, &mut w.k, &b.slice(q_dim..q_dim + kd)?, n)?;
                k.add_rows(s, &mut w.v, &b.slice(q_dim + kd..q_dim + 2 * kd)?, n)?;
            }
            if let (Some([qn, kn]), HeadNorms::Apart) = (&layer.qk_norm, ops.head_norms) {
                let (kind, eps) = (hp.norm, hp.rms_eps);
                k.norm_in_place(s, kind, &mut w.q, &qn.view(), hd, n * hp.n_head, eps)?;
                k.norm_in_place(s, kind, &mut w.k, &kn.view(), hd, n * hp.n_head_kv, eps)?;
            }
            let (kv_k, kv_v) = (w.k.slice(0..n * kv_dim)?, w.v.slice(0..n * kv_dim)?);
            match (&layer.qk_norm, ops.head_norms) {
                (Some([qn, kn]), HeadNorms::InRope) => {
                    let (qn, kn) = (qn.view(), kn.view());
                    let norms = m40_kernels::HeadNorms {
                        q: &qn,
                        k: &kn,
                        eps: hp.rms_eps,
                    };
                    let t = tab.as_ref();
                    k.rope_kv_append_normed(s, &mut w.q, &kv_k, &kv_v, kv, t, norms)?
                }
                _ => match (&tab, &layer.bias) {
                    (t, Some(b)) if !ops.bias_apart => {
                        let b = b.view();
                        k.rope_kv_append_biased(s, &mut w.q, &kv_k, &kv_v, kv, t.as_ref(), &b)?
                    }
                    (Some(tab), _) => k.rope_kv_append_batch(s, &mut w.q, &kv_k, &kv_v, kv, tab)?,
                    (None, _) => k.rope_kv_append(s, &mut w.q, &kv_k, &kv_v, kv)?,
                },
            }
        }
        if let Some(t) = hp.attn_temp {
            let per_token = tab.is_some();
            k.attn_temperature(s, &mut w.q, &pos_v, per_token, n, q_dim, t.scale, t.floor)?;
        }
        let sinks = layer.sinks.as_ref().map(|b| b.view());
        let inputs = AttnInputs {
            q: &w.q.slice(0..n * q_dim)?,
            kpool: &pools.k[l].view(),
            vpool: &pools.v[l].view(),
            format: kv_type(self.kv_layout.format),
            table: &table,
            pos: &pos_v,
            sinks: sinks.as_ref(),
        };
        let shape = layer_shape(&layer.block, &step.shape);
        match (&tab, step.attn) {
            (Some(tab), _) => k.attention_decode_batch(s, &shape, &inputs, tab, &mut w.att)?,
            (None, StepAttn::Batch) => unreachable!("a batch has its table offsets"),
            (None, StepAttn::Seq(plan)) => {
                let scratch = AttnScratch {
                    part: &mut w.part,
                    part_ml: &mut w.part_ml,
                };
                k.attention(s, &shape, &inputs, &mut w.att, Some(scratch), Some(plan))?;
            }
        }
        let av = w.att.view();
        // gpt-oss's output bias joins x first (x is up to date here: the
        // attention norm took any pending branch).
        if let Some(bo) = &layer.bo {
            k.add_rows(s, &mut w.x, &bo.view(), n)?;
        }
        Ok(match ops.attn_join {
            Join::Parallel => {
                // The FFN reads h, the attention's input, and its branch
                // needs proj: the attention's joins x now.
                let r = self.matmul_res(&layer.wo, &av, res_bufs!(w), n, None)?;
                if r.is_pending() {
                    self.join_pending(&mut w.x, &mut w.proj, r, n)?;
                }
                Residual::Done
            }
            Join::Transformed => {
                let post = layer.post_norms.as_ref().map(|[p, _]| p);
                self.transformed_res(&layer.wo, &av, post, &mut w.proj, n)?
            }
            Join::Plain => {
                let emit = layer.ffn_norm.as_ref();
                let emit = emit.filter(|_| n == 1 && ops.one_token_ffn_norm);
                self.matmul_res(&layer.wo, &av, res_bufs!(w), n, emit)?
            }
        })
    }

    /// The norm after layer `l`'s FFN: the next layer's attention norm, or
    /// the output norm when this step's logits follow.
    fn next_norm(&self, l: usize, step: &LayerStep) -> Option<&DeviceBuffer<f32>> {
        match self.weights.layers.get(l + 1) {
            Some(next) => Some(&next.attn_norm),
            None => self
                .weights
                .output_norm
                .as_ref()
                .filter(|_| step.last_logits),
        }
    }

    /// Layer `l`'s FFN half after `res` (its attention's): the FFN norm
    /// (unless folded), the FFN (dense or a mixture), and its residual
    /// connection, left as the returned [`Residual`].
    fn ffn_layer<'a>(
        &'a self,
        w: &mut Workspace,
        l: usize,
        (layer, ops): (&'a Layer, &LayerOps),
        step: &LayerStep,
        mut res: Residual<'a>,
    ) -> Result<Residual<'a>> {
        let n = step.n;
        // A one-token mixture's router takes the FFN norm where x is up to
        // date.
        let router_norm = layer
            .ffn_norm
            .as_ref()
            .filter(|_| n == 1 && ops.one_token_router_norm && matches!(res, Residual::Done));
        if let (Some(ffn_norm), None) = (&layer.ffn_norm, router_norm) {
            self.norm_after(norm_bufs!(w), ffn_norm, n, res)?;
        }
        let (gate_up, down) = match &layer.ffn {
            Ffn::Dense { gate_up, down } => (gate_up, down),
            Ffn::Moe(mats) => {
                let next = self
                    .next_norm(l, step)
                    .filter(|_| n == 1 && ops.one_token_next_norm);
                let io = MoeIo {
                    x: &mut w.x,
                    h: &mut w.h,
                    part: &mut w.norm_part,
                    proj: &mut w.proj,
                };
                res = self.moe_ffn(l, mats, io, (router_norm, next), &mut w.moe, n)?;
                return Ok(res);
            }
        };
        let (hv, pv) = (w.h.view(), w.norm_part.view());
        let xin = res.input(&hv, &pv);
        self.gate_up(gate_up, xin, &mut w.gate, &mut w.up, n)?;
        let gv = w.gate.view();
        Ok(match ops.ffn_join {
            Join::Transformed => {
                let post = layer.post_norms.as_ref().map(|[_, p]| p);
                self.transformed_res(down, &gv, post, &mut w.proj, n)?
            }
            _ => {
                let emit = self
                    .next_norm(l, step)
                    .filter(|_| n == 1 && ops.one_token_next_norm);
                self.matmul_res(down, &gv, res_bufs!(w), n, emit)?
            }
        })
    }

    /// Rows `rows` (at most LOGIT_ROWS) of the final norm and output matmul
    /// into `w.logits`; `pending`: see [`Self::norm`].
    pub(super) fn logits(
        &self,
        w: &mut Workspace,
        rows: std::ops::Range<usize>,
        res: Residual<'_>,
    ) -> Result<()> {
        let n = rows.len();
        let (out_norm, out_w) = self.weights.head()?;
        if let Residual::Folded(_) = res {
            debug_assert_eq!(rows, 0..1, "a folded norm is one token's");
            let (hv, pv) = (w.h.view(), w.norm_part.view());
            self.matmul(out_w, res.input(&hv, &pv), &mut w.logits, 1, false)?;
            return self.finish_logits(w, 1);
        }
        self.norm(norm_bufs!(w), out_norm, rows, res)?;
        self.matmul(out_w, Input::Rows(&w.h.view()), &mut w.logits, n, false)?;
        self.finish_logits(w, n)
    }

    /// The final hidden states of the step's `n` rows (the output norm of
    /// the residual stream, as the logits read it) appended to `out`.
    pub(super) fn hidden(&self, w: &mut Workspace, n: usize, out: &mut Vec<f32>) -> Result<()> {
        let d = self.model.hparams().n_embd;
        let (out_norm, _) = self.weights.head()?;
        self.norm(norm_bufs!(w), out_norm, 0..n, Residual::Done)?;
        let at = out.len();
        out.resize(at + n * d, 0.0);
        self.stream
            .copy_to_host(&w.h.slice(0..n * d)?, &mut out[at..])?;
        Ok(())
    }

    /// The `n` rows of logits in `w.logits` times the model's logit scale
    /// (granite, command-r) and soft-capped (gemma), where it says.
    fn finish_logits(&self, w: &mut Workspace, n: usize) -> Result<()> {
        let hp = self.model.hparams();
        if hp.logit_scale != 1.0 {
            self.kernels
                .scale(&self.stream, &mut w.logits, n * hp.n_vocab, hp.logit_scale)?;
        }
        if let Some(c) = hp.final_softcap {
            self.kernels
                .softcap(&self.stream, &mut w.logits, n * hp.n_vocab, c)?;
        }
        Ok(())
    }

    /// The attention plan of `shape` on this device
    /// (`GpuOptions::decode_attention`).
    pub(super) fn attn_plan(&self, shape: &AttnShape) -> AttnPlan {
        let sm = self.device().info().sm_count as usize;
        AttnPlan::choose(shape, sm, self.decode_attention)
    }

    /// One step of at most max_batch tokens at positions start..start+n
    /// (checked by `run`: room and ids);
    /// with `sel` (and `want` Last), the selection from the last logits.
    /// A later stage's layers take the rows `x`; an earlier stage's rows
    /// go to `out` (see `run`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn step(
        &self,
        st: &mut State,
        cache: &mut GpuCache,
        tokens: &[u32],
        want: Logits,
        mut out: Option<&mut Vec<f32>>,
        sel: Option<Select<'_>>,
        x: Option<&[f32]>,
    ) -> Result<()> {
        let hp = self.model.hparams();
        let n = tokens.len();
        let start = cache.len();
        debug_assert!(sel.is_none() || want == Logits::Last);
        let State {
            work: w,
            pools,
            graphs,
        } = st;
        // Pages for the new tokens; a shared page they would write into is
        // copied to one of this sequence's own first.
        if let Some((from, to)) = cache.unshare_tail()? {
            pools.copy_page(&self.stream, from, to)?;
        }
        cache.extend_to(start + n)?;
        self.upload_inputs(
            w,
            tokens,
            start,
            cache.pages(),
            sel.as_ref().map(|s| s.args),
        )?;
        if let Some(x) = x {
            self.upload_rows(w, x)?;
        }
        let n_vocab = hp.n_vocab;
        let use_graphs = self.graphs.load(std::sync::atomic::Ordering::Relaxed);
        let ends = self.span.last();
        if n == 1 && use_graphs && (!ends || !matches!(want, Logits::None | Logits::Hidden)) {
            // A masked selection runs after the graph, once the host has
            // its mask (computed while the graph runs).
            let masked = sel.as_ref().and_then(|s| s.mask);
            self.graph_step(w, pools, graphs, start, sel.is_some() && masked.is_none())?;
            cache.set_len(start + 1);
            if !ends {
                return self.rows_out(w, 1, out);
            }
            if masked.is_some() {
                self.upload_masks(w, &[masked])?;
                self.select(w)?;
            }
            if let Some(sel) = sel {
                return self.fetch_selection(w, sel);
            }
            if let Some(out) = out {
                let at = out.len();
                out.resize(at + n_vocab, 0.0);
                self.stream
                    .copy_to_host(&w.logits.slice(0..n_vocab)?, &mut out[at..])?;
            }
            return Ok(());
        }
        let shape = attn_shape(hp, n, start);
        let plan = self.attn_plan(&shape);
        self.scratch(w, graphs, &plan, &shape)?;
        self.enqueue(w, pools, n, start, StepAttn::Seq(plan), false)?;
        cache.set_len(start + n);
        if !ends {
            return self.rows_out(w, n, out);
        }
        let rows = match want {
            Logits::None => return Ok(()),
            Logits::Hidden => {
                return match out {
                    Some(out) => self.hidden(w, n, out),
                    None => Ok(()),
                };
            }
            Logits::Last => n - 1..n,
            Logits::All => 0..n,
        };
        for r0 in rows.clone().step_by(LOGIT_ROWS) {
            let r1 = (r0 + LOGIT_ROWS).min(rows.end);
            self.logits(w, r0..r1, Residual::Done)?;
            if let Some(out) = out.as_deref_mut() {
                let at = out.len();
                out.resize(at + (r1 - r0) * n_vocab, 0.0);
                self.stream
                    .copy_to_host(&w.logits.slice(0..(r1 - r0) * n_vocab)?, &mut out[at..])?;
            }
        }
        if let Some(sel) = sel {
            self.upload_masks(w, &[sel.mask])?;
            self.select(w)?;
            return self.fetch_selection(w, sel);
        }
        Ok(())
    }
}
