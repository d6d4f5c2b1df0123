//! The element-wise and normalization operations of the forward pass. These
//! are also the CPU references for the GPU kernels of the same names.

use m40_gguf::hparams::{NormKind, RopeScaling, RopeStyle};

/// `x = x / sqrt(mean(x^2) + eps) * w`, row by row. x: (n, d); w: (d).
pub fn rmsnorm(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for row in x.chunks_exact_mut(d) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let s = 1.0 / (ms + eps).sqrt();
        for (v, w) in row.iter_mut().zip(w) {
            *v = *v * s * w;
        }
    }
}

/// LayerNorm without bias of each row of x (rows of `w.len()`): (x -
/// mean) / sqrt(var + eps) * w, as ggml_norm then the weight (its sums in
/// f64).
pub fn layernorm(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for row in x.chunks_exact_mut(d) {
        let mean = (row.iter().map(|&v| v as f64).sum::<f64>() / d as f64) as f32;
        row.iter_mut().for_each(|v| *v -= mean);
        let var = (row.iter().map(|&v| (v * v) as f64).sum::<f64>() / d as f64) as f32;
        let s = 1.0 / (var + eps).sqrt();
        for (v, w) in row.iter_mut().zip(w) {
            *v = *v * s * w;
        }
    }
}

/// Each row of x (rows of `w.len()`) normed as `kind` says.
pub fn norm(kind: NormKind, x: &mut [f32], w: &[f32], eps: f32) {
    match kind {
        NormKind::Rms => rmsnorm(x, w, eps),
        NormKind::Layer => layernorm(x, w, eps),
    }
}

/// Every head (of `hd`) of x normed: x's rows of `w.len()` each hold the
/// heads w covers (one, its weights shared by every head: qwen3; or all
/// of a token's, each with its own: command-r+).
pub fn head_norm(kind: NormKind, x: &mut [f32], w: &[f32], hd: usize, eps: f32) {
    for row in x.chunks_exact_mut(w.len()) {
        for (head, w) in row.chunks_exact_mut(hd).zip(w.chunks_exact(hd)) {
            norm(kind, head, w, eps);
        }
    }
}

/// Each row of x (rows of `b.len()`) plus b: a bias.
pub fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
    }
}

/// RoPE parameters for one model.
#[derive(Clone, Debug)]
pub struct Rope {
    pub style: RopeStyle,
    /// Rotated dimensions per head (the rest pass through).
    pub dim: usize,
    /// theta_i = pos * inv_freq[i], for i < dim / 2.
    pub inv_freq: Vec<f32>,
    /// Positions are divided by this (linear scaling).
    pub pos_scale: f32,
    /// The rotated dimensions are multiplied by this (llama.cpp's scale of
    /// cos and sin: `HyperParams::rope_mscale`; the pass-through ones are
    /// not).
    pub mscale: f32,
}

impl Rope {
    pub fn new(
        style: RopeStyle,
        dim: usize,
        base: f32,
        linear_factor: f32,
        freq_factors: Option<&[f32]>,
    ) -> Self {
        let inv_freq = (0..dim / 2)
            .map(|i| {
                let f = base.powf(-(2.0 * i as f32) / dim as f32);
                match freq_factors {
                    Some(ff) => f / ff[i],
                    None => f,
                }
            })
            .collect();
        Self {
            style,
            dim,
            inv_freq,
            pos_scale: 1.0 / linear_factor,
            mscale: 1.0,
        }
    }

    /// The table the GPU's RoPE kernels read: the n_rot / 2 frequencies,
    /// then the magnitude scale.
    pub fn device_table(&self) -> Vec<f32> {
        let mut t = self.inv_freq.clone();
        t.push(self.mscale);
        t
    }

    /// The RoPE of `model`'s global layers (and of every layer without a
    /// sliding window): its style, dimension and base, linear or YaRN
    /// scaling, and the per-dimension factors of `rope_freqs.weight` when
    /// present. YaRN's angles are theta_i (1 - r_i) / factor + theta_i r_i
    /// (its ramp r), one frequency per pair; its magnitude scale (and
    /// `rope.scaling.attn_factor`) multiply the rotated dimensions.
    /// gemma3's sliding-window layers' RoPE (`for_window`) has neither.
    pub fn for_model(model: &crate::Model) -> crate::Result<Self> {
        let hp = model.hparams();
        let linear = hp.rope_scaling.linear_factor();
        let mut rope = Self::with_base(model, hp.rope_freq_base, linear)?;
        rope.mscale = hp.rope_mscale();
        if let (RopeScaling::Yarn { factor, .. }, Some(ramp)) = (
            hp.rope_scaling,
            hp.rope_scaling.yarn_ramp(hp.rope_dim, hp.rope_freq_base),
        ) {
            for (f, r) in rope.inv_freq.iter_mut().zip(ramp) {
                *f *= (1.0 - r) / factor + r;
            }
        }
        Ok(rope)
    }

    /// The RoPE of `model`'s sliding-window layers where it differs from
    /// the global layers' (gemma3): their own base and linear scaling,
    /// neither YaRN nor a magnitude scale. gemma2's and gpt-oss's window
    /// layers share the global RoPE (`None`).
    pub fn for_window(model: &crate::Model) -> crate::Result<Option<Self>> {
        let hp = model.hparams();
        let linear = hp.rope_scaling.linear_factor();
        match &hp.sliding_window {
            Some(w) if (w.rope_freq_base, w.rope_linear) != (hp.rope_freq_base, linear) => {
                Self::with_base(model, w.rope_freq_base, w.rope_linear).map(Some)
            }
            _ => Ok(None),
        }
    }

    fn with_base(model: &crate::Model, base: f32, linear: f32) -> crate::Result<Self> {
        let hp = model.hparams();
        // Per-dimension divisors: llama 3's `rope_freqs`, else LongRoPE's
        // long factors beyond the original context, its short ones within.
        let longrope = match model.context() > hp.n_ctx_orig {
            true => "rope_factors_long.weight",
            false => "rope_factors_short.weight",
        };
        let freq_factors = match model
            .file()
            .tensor("rope_freqs.weight")
            .or_else(|| model.file().tensor(longrope))
        {
            Some(t) => Some(t.to_f32()?),
            None => None,
        };
        if freq_factors
            .as_ref()
            .is_some_and(|f| f.len() != hp.rope_dim / 2)
        {
            return Err(crate::ModelError::Unsupported(
                "the RoPE factors (rope_freqs or rope_factors_*) do not match the RoPE dimension"
                    .into(),
            ));
        }
        Ok(Self::new(
            hp.rope_style,
            hp.rope_dim,
            base,
            linear,
            freq_factors.as_deref(),
        ))
    }

    /// Rotate every head of one token's vector `x` (n_head * head_dim) at `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let p = pos as f32 * self.pos_scale;
        let half = self.dim / 2;
        for head in x.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (sin, cos) = (p * self.inv_freq[i]).sin_cos();
                let (a, b) = match self.style {
                    RopeStyle::Normal => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (sin, cos) = (sin * self.mscale, cos * self.mscale);
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
    }
}

/// `g = silu(g) * u`, SwiGLU's gate.
pub fn swiglu(g: &mut [f32], u: &[f32]) {
    for (g, u) in g.iter_mut().zip(u) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// GELU with its tanh approximation (llama.cpp's ggml_gelu, PyTorch's
/// gelu(approximate="tanh")).
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)).tanh())
}

/// `g = gelu(g) * u`, GeGLU's gate.
pub fn geglu(g: &mut [f32], u: &[f32]) {
    for (g, u) in g.iter_mut().zip(u) {
        *g = gelu_tanh(*g) * u;
    }
}

/// gpt-oss's gate (ggml's swiglu_oai): g = min(g, 7), u = clamp(u, -7, 7),
/// `g = g sigmoid(1.702 g) (u + 1)`.
pub fn swiglu_oai(g: &mut [f32], u: &[f32]) {
    use m40_gguf::hparams::Activation;
    let (limit, alpha) = (Activation::OAI_LIMIT, Activation::OAI_ALPHA);
    for (g, u) in g.iter_mut().zip(u) {
        let x = g.min(limit);
        let y = u.clamp(-limit, limit);
        *g = x / (1.0 + (alpha * -x).exp()) * (y + 1.0);
    }
}

/// The gate of `act`: `g = act(g) * u` (gpt-oss's as [`swiglu_oai`]).
pub fn glu(act: m40_gguf::hparams::Activation, g: &mut [f32], u: &[f32]) {
    use m40_gguf::hparams::Activation;
    match act {
        Activation::Silu => swiglu(g, u),
        Activation::GeluTanh => geglu(g, u),
        Activation::SwigluOai => swiglu_oai(g, u),
    }
}

/// `x = c tanh(x / c)`: soft-capping to (-c, c).
pub fn softcap(x: &mut [f32], c: f32) {
    x.iter_mut().for_each(|v| *v = c * (*v / c).tanh());
}

/// In-place softmax.
pub fn softmax(x: &mut [f32]) {
    softmax_sink(x, None)
}

/// In-place softmax, with `sink` (gpt-oss's attention sinks) a logit in
/// the denominator whose probability is dropped, as ggml's soft_max_ext.
pub fn softmax_sink(x: &mut [f32], sink: Option<f32>) {
    let max = x
        .iter()
        .fold(sink.unwrap_or(f32::NEG_INFINITY), |m, &v| m.max(v));
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    if let Some(s) = sink {
        sum += (s - max).exp();
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotates_pairs_and_keeps_norms() {
        let rope = Rope::new(RopeStyle::Normal, 4, 10000.0, 1.0, None);
        let mut x = vec![1.0, 0.0, 1.0, 0.0];
        rope.apply(&mut x, 4, 1);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        let f = 10000f32.powf(-0.5);
        assert!((x[2] - f.cos()).abs() < 1e-6 && (x[3] - f.sin()).abs() < 1e-6);
        let neox = Rope::new(RopeStyle::Neox, 4, 10000.0, 1.0, None);
        let mut y = vec![1.0, 1.0, 0.0, 0.0];
        neox.apply(&mut y, 4, 1);
        assert!((y[0] - 1f32.cos()).abs() < 1e-6 && (y[2] - 1f32.sin()).abs() < 1e-6);
        let mut z = vec![0.3, -0.7, 0.2, 0.9];
        let n0: f32 = z.iter().map(|v| v * v).sum();
        rope.apply(&mut z, 4, 1234);
        assert!((z.iter().map(|v| v * v).sum::<f32>() - n0).abs() < 1e-5);
    }

    #[test]
    fn norms_and_activations() {
        let mut x = vec![3.0, 4.0];
        rmsnorm(&mut x, &[1.0, 2.0], 0.0);
        let s = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / s).abs() < 1e-6 && (x[1] - 8.0 / s).abs() < 1e-6);
        let mut p = vec![1.0, 2.0, 3.0];
        softmax(&mut p);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6 && p[2] > p[1]);
        let mut g = vec![0.0, 1.0];
        swiglu(&mut g, &[5.0, 2.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
    }
}
