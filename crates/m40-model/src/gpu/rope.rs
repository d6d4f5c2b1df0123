//! The RoPE tables a model's layers take on the device: the model's, the
//! sliding-window layers' where they have their own (gemma3), and the
//! identity for layers without RoPE (SmolLM3's every fourth layer), each
//! the CPU's [`Rope`] as the kernels read it (frequencies, then the
//! magnitude scale).

use m40_device::{DeviceBuffer, DeviceView, Stream};
use m40_gguf::hparams::{LayerRope, RopeStyle as GgufRope};
use m40_kernels::{RopeParams, RopeStyle};

use crate::cpu::ops::Rope;
use crate::error::Result;
use crate::Model;

pub(super) struct Ropes {
    table: DeviceBuffer<f32>,
    params: RopeParams,
    window: Option<(DeviceBuffer<f32>, RopeParams)>,
    /// Zero frequencies and a scale of 1: every angle is 0, so the kernels'
    /// rotation (cos 1, sin 0) leaves queries and keys exactly as they are
    /// while they append the keys as every layer does.
    identity: Option<DeviceBuffer<f32>>,
}

impl Ropes {
    /// `model`'s tables; `adjacent`: its NeoX heads were uploaded with their
    /// pairs adjacent, so they rotate as llama's.
    pub(super) fn upload(model: &Model, adjacent: bool, stream: &Stream) -> Result<Self> {
        let hp = model.hparams();
        let params = |r: &Rope| RopeParams {
            style: match hp.rope_style {
                GgufRope::Normal => RopeStyle::Normal,
                GgufRope::Neox if adjacent => RopeStyle::Normal,
                GgufRope::Neox => RopeStyle::Neox,
            },
            n_head: hp.n_head,
            head_dim: hp.head_dim,
            n_rot: hp.rope_dim,
            pos_scale: r.pos_scale,
        };
        let rope = Rope::for_model(model)?;
        let window = match Rope::for_window(model)? {
            Some(r) => Some((
                stream.upload(&r.device_table(), "sliding-window RoPE frequencies")?,
                params(&r),
            )),
            None => None,
        };
        let identity = match hp.blocks().iter().any(|b| b.rope == LayerRope::None) {
            true => {
                let mut t = vec![0f32; hp.rope_dim / 2];
                t.push(1.0);
                Some(stream.upload(&t, "identity RoPE table")?)
            }
            false => None,
        };
        Ok(Self {
            table: stream.upload(&rope.device_table(), "RoPE frequencies")?,
            params: params(&rope),
            window,
            identity,
        })
    }

    /// The pairing the kernels are given (every table's).
    pub(super) fn style(&self) -> RopeStyle {
        self.params.style
    }

    /// The table and parameters of a layer whose RoPE is `r`.
    pub(super) fn of(&self, r: LayerRope) -> (DeviceView<'_, f32>, &RopeParams) {
        let model = (&self.table, &self.params);
        let (t, p) = match (r, &self.window, &self.identity) {
            (LayerRope::Window, Some((t, p)), _) => (t, p),
            (LayerRope::None, _, Some(t)) => (t, &self.params),
            (LayerRope::None, _, None) => unreachable!("a layer without RoPE has its table"),
            _ => model,
        };
        (t.view(), p)
    }
}
