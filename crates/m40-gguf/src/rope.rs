//! RoPE scaling as llama.cpp reads and applies it: linear, YaRN (its ramp
//! and magnitude scale), `rope.scaling.attn_factor`, and mistral3's
//! attention temperature.

/// RoPE context scaling (`rope.scaling.type`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// YaRN (as llama.cpp's ggml_rope_yarn): dimension i's angle is
    /// interpolated (divided by `factor`) or extrapolated (kept) by a ramp
    /// between the dimensions that turn `beta_fast` and `beta_slow` times
    /// over `original_context` positions, and q and k are scaled by
    /// [`crate::HyperParams::rope_mscale`].
    Yarn {
        factor: f32,
        original_context: usize,
        beta_fast: f32,
        beta_slow: f32,
        /// `rope.scaling.yarn_log_multiplier` (mistral3; 0: none).
        log_mul: f32,
    },
}

impl RopeScaling {
    /// The linear scaling factor positions are divided by (1 but for
    /// linear scaling).
    pub fn linear_factor(&self) -> f32 {
        match *self {
            RopeScaling::Linear { factor } => factor,
            _ => 1.0,
        }
    }

    /// YaRN's ramp over the `dim / 2` rotated pairs: the share of pair i's
    /// angle that is extrapolated (1: unscaled, 0: divided by the factor),
    /// llama.cpp's `rope_yarn_ramp` over `ggml_rope_yarn_corr_dims` (with
    /// `yarn_ext_factor` 1, its value for YaRN files). `None` unless YaRN.
    pub fn yarn_ramp(&self, dim: usize, base: f32) -> Option<Vec<f32>> {
        let RopeScaling::Yarn {
            original_context,
            beta_fast,
            beta_slow,
            ..
        } = *self
        else {
            return None;
        };
        let corr = |rot: f32| {
            dim as f32 * (original_context as f32 / (rot * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let low = corr(beta_fast).floor().max(0.0);
        let high = corr(beta_slow).ceil().min(dim as f32 - 1.0);
        Some(
            (0..dim / 2)
                .map(|i| {
                    let y = (i as f32 - low) / (high - low).max(0.001);
                    1.0 - y.clamp(0.0, 1.0)
                })
                .collect(),
        )
    }
}

/// Llama 4's attention temperature (mistral3): the queries at position p
/// are multiplied by 1 + scale * ln(floor(p / floor) + 1) (1 below `floor`,
/// YaRN's original context).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnTemperature {
    pub scale: f32,
    pub floor: usize,
}

impl AttnTemperature {
    pub fn at(&self, pos: usize) -> f32 {
        1.0 + self.scale * ((pos / self.floor) as f32 + 1.0).ln()
    }
}

/// The factor llama.cpp's RoPE multiplies its cos and sin by (so q and
/// k both): `rope.scaling.attn_factor`, and under YaRN its magnitude
/// scale 1 + 0.1 ln(factor) (over 1 + 0.1 m ln(factor) where the file
/// gives a log multiplier m), as llama_context sets `yarn_attn_factor`
/// and ggml's rope_yarn applies it.
pub fn mscale(scaling: RopeScaling, attn_factor: f32) -> f32 {
    let yarn = match scaling {
        RopeScaling::Yarn {
            factor, log_mul, ..
        } => {
            let m = |mul: f32| {
                if factor <= 1.0 {
                    1.0
                } else {
                    0.1 * mul * factor.ln() + 1.0
                }
            };
            if log_mul != 0.0 {
                m(1.0) / m(log_mul)
            } else {
                m(1.0)
            }
        }
        _ => 1.0,
    };
    attn_factor * yarn
}
