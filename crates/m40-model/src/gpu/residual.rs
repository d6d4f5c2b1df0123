//! How a residual connection was left between a step's kernels, and what
//! the matmuls after the next norm read (forward.rs).

use m40_device::{DeviceBuffer, DeviceView};

/// What a matmul multiplies: rows of x, or (one token, packed GEMV only)
/// the h = x * weight of a folded RMSNorm, whose scale the GEMV computes
/// from the `n` partial sums of squares in `part` (see [`Residual`]).
#[derive(Clone, Copy)]
pub(super) enum Input<'a> {
    Rows(&'a DeviceView<'a, f32>),
    Folded {
        h: &'a DeviceView<'a, f32>,
        part: &'a DeviceView<'a, f32>,
        n: usize,
    },
}

/// How a residual connection x += W a was left (`matmul_res`); `'w`: the
/// weights'.
#[derive(Clone, Copy)]
pub(super) enum Residual<'w> {
    /// Added to x.
    Done,
    /// In `w.proj`: the next norm adds it (`add_norm`), with `post` first
    /// RMS-normed by those weights and scaled by the model's residual
    /// multiplier (gemma's post-norms: one launch with the add and the
    /// norm).
    Pending { post: Option<&'w DeviceBuffer<f32>> },
    /// Added to x by the GEMV, which also wrote h = x * (the next norm's
    /// weight) and its blocks' n partial sums of x^2 to `w.norm_part`: the
    /// next GEMVs take the norm from there (`Input::Folded`).
    Folded(usize),
}

impl Residual<'_> {
    /// A branch in `w.proj` to be added as it is.
    pub(super) const PENDING: Self = Residual::Pending { post: None };

    pub(super) fn is_pending(self) -> bool {
        matches!(self, Residual::Pending { .. })
    }

    /// What the matmuls after the next norm read: h as that norm left it
    /// (run into h, or folded: h = x * weight and the partial sums `part`).
    pub(super) fn input<'a>(
        self,
        h: &'a DeviceView<'a, f32>,
        part: &'a DeviceView<'a, f32>,
    ) -> Input<'a> {
        match self {
            Residual::Folded(n) => Input::Folded { h, part, n },
            _ => Input::Rows(h),
        }
    }
}
