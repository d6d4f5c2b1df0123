//! A mixture-of-experts FFN on the device (qwen3moe, Mixtral, gpt-oss):
//! routing on the device, the chosen experts' GEMVs by id.

use m40_device::{DeviceBuffer, DeviceView};
use m40_kernels::{ExpertGlu, MoeShape, QMatrix};

use super::forward::{Input, Residual};
use super::weights::{Experts, Mat, MatView, MoeMats};
use super::workspace::MoeBufs;
use super::GpuBackend;
use crate::error::Result;

impl GpuBackend {
    /// A mixture of experts over the `n` normed rows h ([`MoeMats`]): the
    /// router's logits, each token's experts chosen on the device, the
    /// chosen experts' gate and up GEMVs with the gate's activation (one
    /// launch for every token's experts where they are interleaved), their down GEMVs, and
    /// each token's weighted sum into `proj`, left pending (the next norm
    /// adds it to x). gpt-oss's biases join the launches: the router's in
    /// the routing, the gate's and up's in the GEMV's activation (or
    /// `moe_glu`), the down's in the weighted sum.
    pub(super) fn moe_ffn(
        &self,
        mats: &MoeMats,
        h: &DeviceView<'_, f32>,
        b: &mut MoeBufs,
        proj: &mut DeviceBuffer<f32>,
        n: usize,
    ) -> Result<Residual> {
        let (k, s) = (&self.kernels, &self.stream);
        let hp = self.model.hparams();
        let m = hp.moe.expect("a mixture's layer");
        let shape = MoeShape {
            n,
            k: m.n_expert_used,
        };
        // One token through an F32 router: a block a row (moe_router).
        let data = mats.router.data.view();
        match mats.router.view(&data) {
            MatView::Rows(q) if n == 1 && k.moe_router_takes(&q) => {
                k.moe_router(s, &q, h, &mut b.logits)?
            }
            _ => self.matmul(&mats.router, Input::Rows(h), &mut b.logits, n, false)?,
        }
        // gpt-oss's biases, as views: router, gate, up, down.
        let bias = mats.bias.as_ref().map(|bs| bs.each_ref().map(|b| b.view()));
        let router_b = bias.as_ref().map(|[r, ..]| r);
        k.moe_route(
            s,
            &b.logits.view(),
            router_b,
            m.n_expert,
            shape,
            &mut b.ids,
            &mut b.w,
        )?;
        let ids = b.ids.view();
        type Launch<'f> = &'f mut dyn FnMut(&QMatrix<'_>) -> m40_kernels::Result<()>;
        let rows = |mat: &Mat, f: Launch<'_>| -> Result<()> {
            let data = mat.data.view();
            let MatView::Rows(q) = mat.view(&data) else {
                unreachable!("experts stay in GGUF rows")
            };
            Ok(f(&q)?)
        };
        let ff = m.n_ff_exp;
        let gate_up_b = bias.as_ref().map(|[_, g, u, _]| [g, u]);
        match &mats.gate_up {
            Experts::Glu(gu) => rows(gu, &mut |q| {
                let glu = ExpertGlu {
                    act: hp.act,
                    bias: gate_up_b,
                };
                k.gemv_experts(
                    s,
                    q,
                    2 * ff,
                    &ids,
                    h,
                    shape.k,
                    &mut b.gate,
                    shape,
                    Some(glu),
                )
            })?,
            Experts::Split(gate, up) => {
                for (mat, out) in [(gate, &mut b.gate), (up, &mut b.up)] {
                    rows(mat, &mut |q| {
                        k.gemv_experts(s, q, ff, &ids, h, shape.k, out, shape, None)
                    })?;
                }
                match gate_up_b {
                    Some(gu) => {
                        k.moe_glu(s, hp.act, &mut b.gate, &b.up.view(), &ids, gu, ff, shape)?
                    }
                    None => k.glu(s, hp.act, &mut b.gate, &b.up.view(), n * shape.k * ff)?,
                }
            }
        }
        let d = hp.n_embd;
        rows(&mats.down, &mut |q| {
            k.gemv_experts(s, q, d, &ids, &b.gate.view(), 1, &mut b.y, shape, None)
        })?;
        let down_b = bias.as_ref().map(|[.., db]| (&ids, db));
        k.moe_combine(s, &b.y.view(), &b.w.view(), down_b, proj, d, shape)?;
        Ok(Residual::Pending)
    }
}
