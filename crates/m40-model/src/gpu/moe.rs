//! A mixture of experts' FFN on the device (qwen3moe, Mixtral): the
//! router, the choice of each token's experts, their GEMVs by id; the
//! weighted sum joins x in the next norm (`Residual::Experts`).

use m40_device::DeviceView;
use m40_kernels::{MoeShape, QMatrix};

use super::forward::{Input, Residual};
use super::weights::{Experts, Mat, MatView, MoeMats};
use super::workspace::MoeBufs;
use super::GpuBackend;
use crate::error::Result;

impl GpuBackend {
    /// A mixture of experts over the `n` normed rows h ([`MoeMats`]): the
    /// router's logits, each token's experts chosen on the device, the
    /// chosen experts' gate and up GEMVs with SwiGLU (one launch for every
    /// token's experts where they are interleaved) and their down GEMVs,
    /// left in `b` for the next norm to add their weighted sum to x
    /// ([`Residual::Experts`]).
    pub(super) fn moe_ffn(
        &self,
        mats: &MoeMats,
        h: &DeviceView<'_, f32>,
        b: &mut MoeBufs,
        n: usize,
    ) -> Result<Residual> {
        let (k, s) = (&self.kernels, &self.stream);
        let hp = self.model.hparams();
        let m = hp.moe.expect("a mixture's layer");
        let shape = MoeShape {
            n,
            k: m.n_expert_used,
        };
        self.matmul(&mats.router, Input::Rows(h), &mut b.logits, n, false)?;
        k.moe_route(s, &b.logits.view(), m.n_expert, shape, &mut b.ids, &mut b.w)?;
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
        match &mats.gate_up {
            Experts::Glu(gu) => rows(gu, &mut |q| {
                k.gemv_experts(s, q, 2 * ff, &ids, h, shape.k, &mut b.gate, shape, true)
            })?,
            Experts::Split(gate, up) => {
                for (mat, out) in [(gate, &mut b.gate), (up, &mut b.up)] {
                    rows(mat, &mut |q| {
                        k.gemv_experts(s, q, ff, &ids, h, shape.k, out, shape, false)
                    })?;
                }
                k.swiglu(s, &mut b.gate, &b.up.view(), n * shape.k * ff)?;
            }
        }
        let d = hp.n_embd;
        rows(&mats.down, &mut |q| {
            k.gemv_experts(s, q, d, &ids, &b.gate.view(), 1, &mut b.y, shape, false)
        })?;
        Ok(Residual::Experts)
    }

    /// A mixture's step of `n` tokens.
    pub(super) fn moe_shape(&self, n: usize) -> MoeShape {
        let m = self.model.hparams().moe.expect("a mixture");
        MoeShape {
            n,
            k: m.n_expert_used,
        }
    }
}
