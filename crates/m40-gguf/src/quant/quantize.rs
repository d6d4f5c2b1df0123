//! CPU quantization: ggml's reference (`quantize_row_*_ref`) algorithms.

use bytemuck::Zeroable;
use half::{bf16, f16};

use super::blocks::*;

/// F32 -> BF16 as ggml rounds it: to nearest even, NaN kept quiet.
#[inline]
pub fn f32_to_bf16(x: f32) -> bf16 {
    // `half` rounds to nearest even and keeps NaN a NaN, as ggml does.
    bf16::from_f32(x)
}

#[inline]
pub fn f32_to_f16(x: f32) -> f16 {
    f16::from_f32(x)
}

pub fn block_q8_0(x: &[f32]) -> BlockQ8_0 {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK32];
    for (q, v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    BlockQ8_0 {
        d: f16::from_f32(d),
        qs,
    }
}

/// The element of largest magnitude, keeping its sign (first one on ties).
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// An MXFP4 block of `x`: the exponent byte as ggml's, 2^(floor(log2
/// amax) - 2) (the float converted to uint8_t through an int on x86), and
/// each value's 4-bit index as `pick(value, scale)` chooses it.
fn mxfp4_block(x: &[f32], pick: impl Fn(f32, f32) -> u8) -> BlockMXFP4 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let e = if amax > 0.0 {
        (amax.log2().floor() - 2.0 + 127.0) as i32 as u8
    } else {
        0
    };
    let d = super::dequant::e8m0_half(e);
    let mut qs = [0u8; QK32 / 2];
    for j in 0..QK32 / 2 {
        qs[j] = pick(x[j], d) | pick(x[j + QK32 / 2], d) << 4;
    }
    BlockMXFP4 { e, qs }
}

/// MXFP4 as ggml's `quantize_row_mxfp4_ref`: each value the nearest of its
/// 16 levels (ties: the first).
pub fn block_mxfp4(x: &[f32]) -> BlockMXFP4 {
    mxfp4_block(x, |v, d| {
        let mut best = (0u8, (KVALUES_MXFP4[0] as f32 * d - v).abs());
        for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
            let err = (k as f32 * d - v).abs();
            if err < best.1 {
                best = (i as u8, err);
            }
        }
        best.0
    })
}

/// [`block_mxfp4`]'s format with each value's level by thresholds (the
/// midpoints between levels) instead of a search over all 16: the same
/// levels but where rounding makes a near-tie go the other way.
pub fn block_mxfp4_fast(x: &[f32]) -> BlockMXFP4 {
    // Midpoints between the magnitudes 0 1 2 3 4 6 8 12 (times d).
    const MID: [f32; 7] = [0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0];
    mxfp4_block(x, |v, d| {
        let j = MID.iter().take_while(|&&m| v.abs() / d > m).count() as u8;
        if v < 0.0 && j > 0 {
            8 + j
        } else {
            j
        }
    })
}

pub fn block_q4_0(x: &[f32]) -> BlockQ4_0 {
    let max = signed_absmax(x);
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; QK32 / 2];
    for j in 0..QK32 / 2 {
        let x0 = x[j] * id;
        let x1 = x[j + QK32 / 2] * id;
        let q0 = ((x0 + 8.5) as i8 as u8).min(15);
        let q1 = ((x1 + 8.5) as i8 as u8).min(15);
        qs[j] = q0 | (q1 << 4);
    }
    BlockQ4_0 {
        d: f16::from_f32(d),
        qs,
    }
}

pub fn block_q4_1(x: &[f32]) -> BlockQ4_1 {
    let min = x.iter().fold(f32::MAX, |a, &v| a.min(v));
    let max = x.iter().fold(-f32::MAX, |a, &v| a.max(v));
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; QK32 / 2];
    for j in 0..QK32 / 2 {
        let x0 = (x[j] - min) * id;
        let x1 = (x[j + QK32 / 2] - min) * id;
        let q0 = ((x0 + 0.5) as u8).min(15);
        let q1 = ((x1 + 0.5) as u8).min(15);
        qs[j] = q0 | (q1 << 4);
    }
    BlockQ4_1 {
        d: f16::from_f32(d),
        m: f16::from_f32(min),
        qs,
    }
}

pub fn block_q5_0(x: &[f32]) -> BlockQ5_0 {
    let max = signed_absmax(x);
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; QK32 / 2];
    let mut qh = 0u32;
    for j in 0..QK32 / 2 {
        let x0 = x[j] * id;
        let x1 = x[j + QK32 / 2] * id;
        let q0 = ((x0 + 16.5) as i8 as u8).min(31);
        let q1 = ((x1 + 16.5) as i8 as u8).min(31);
        qs[j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK32 / 2);
    }
    BlockQ5_0 {
        d: f16::from_f32(d),
        qh: qh.to_le_bytes(),
        qs,
    }
}

pub fn block_q5_1(x: &[f32]) -> BlockQ5_1 {
    let min = x.iter().fold(f32::MAX, |a, &v| a.min(v));
    let max = x.iter().fold(-f32::MAX, |a, &v| a.max(v));
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; QK32 / 2];
    let mut qh = 0u32;
    for j in 0..QK32 / 2 {
        let x0 = (x[j] - min) * id;
        let x1 = (x[j + QK32 / 2] - min) * id;
        let q0 = ((x0 + 0.5) as u8).min(31);
        let q1 = ((x1 + 0.5) as u8).min(31);
        qs[j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK32 / 2);
    }
    BlockQ5_1 {
        d: f16::from_f32(d),
        m: f16::from_f32(min),
        qh: qh.to_le_bytes(),
        qs,
    }
}

/// ggml's `nearest_int`: round half to even through the 1.5 * 2^23 trick
/// (exact for |x| < 2^22, which every caller guarantees).
#[inline]
fn nearest_int(x: f32) -> i32 {
    ((x + 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Scale and (negated) minimum of `x ≈ scale * l - min`, `l` in 0..=nmax,
/// minimizing the `weights`-weighted squared error over a sweep of
/// `nstep + 1` candidate scales around `nmax / (max - min)`; each candidate's
/// levels are refit by weighted least squares. ggml's `make_qkx2_quants`
/// (without its absolute-error mode), in the same float operation order so
/// that it reproduces llama-quantize's bytes.
fn fit_scale_min(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    (rmin, rdelta, nstep): (f32, f32, i32),
) -> (f32, f32) {
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        min = if v < min { v } else { min };
        max = if v > max { v } else { max };
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    // `min` moves with the best candidate, and later candidates use it.
    let quant = |iscale: f32, min: f32, v: f32| nearest_int(iscale * (v - min)).clamp(0, nmax);
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0f32;
    for ((l, &v), &w) in levels.iter_mut().zip(x).zip(weights) {
        *l = quant(iscale, min, v) as u8;
        let diff = scale * *l as f32 + min - v;
        best += w * (diff * diff);
    }
    let mut aux = [0u8; 32];
    let aux = &mut aux[..x.len()];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for ((a, &v), &w) in aux.iter_mut().zip(x).zip(weights) {
            let l = quant(iscale, min, v);
            *a = l as u8;
            let l = l as f32;
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut err = 0f32;
            for ((&a, &v), &w) in aux.iter().zip(x).zip(weights) {
                let diff = this_scale * a as f32 + this_min - v;
                err += w * (diff * diff);
            }
            if err < best {
                levels.copy_from_slice(aux);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Scale of `x ≈ scale * l`, `l` in -nmax..nmax, weighting each element by
/// x² and sweeping 19 candidate scales: ggml's `make_qx_quants` with
/// `rmse_type` 1 and no importance weights, in its float operation order.
/// The levels it leaves in `levels` (offset by nmax) are used only where the
/// block's final scale rounds to zero.
fn fit_scale_symmetric(nmax: i32, x: &[f32], levels: &mut [i8], search: bool) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < 1e-15 {
        levels.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let l = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let iscale = -(nmax as f32) / max;
    for (l, &v) in levels.iter_mut().zip(x) {
        *l = (level(iscale, v) + nmax) as i8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| search && is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (l, &v) in levels.iter_mut().zip(x) {
                *l = (level(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q4_K as ggml's `quantize_row_q4_K_ref` makes it: each sub-block of 32
/// fitted by [`fit_scale_min`] (weights: RMS of the sub-block + |x|), the 8
/// scales and 8 mins quantized to 6 bits against their maxima, then every
/// element requantized against the stored scale and min.
pub fn block_q4_k(x: &[f32]) -> BlockQ4K {
    block_q4_k_fit(x, true)
}

/// [`block_q4_k`] with or without the 20-candidate sweep of its scale fits
/// (without: each sub-block's first fit, 21x less arithmetic; for random
/// synthetic weights, where llama-quantize's exact choices do not matter).
pub fn block_q4_k_fit(x: &[f32], search: bool) -> BlockQ4K {
    let nstep = if search { 20 } else { -1 };
    let mut levels = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    for (j, xs) in x.chunks_exact(32).enumerate() {
        let sum_x2 = xs.iter().fold(0f32, |a, v| a + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0f32; 32];
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let l = &mut levels[32 * j..32 * j + 32];
        (scales[j], mins[j]) = fit_scale_min(15, xs, &weights, l, (-1.0, 0.1, nstep));
    }
    let max_scale = scales.iter().fold(0f32, |a, &s| if s > a { s } else { a });
    let max_min = mins.iter().fold(0f32, |a, &m| if m > a { m } else { a });
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; K_SCALE_SIZE];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    for (j, xs) in x.chunks_exact(32).enumerate() {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d.to_f32() * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for (l, &v) in levels[32 * j..32 * j + 32].iter_mut().zip(xs) {
            *l = nearest_int((v + dm) / dj).clamp(0, 15) as u8;
        }
    }
    let mut qs = [0u8; QK_K / 2];
    for (q, chunk) in qs.chunks_exact_mut(32).zip(levels.chunks_exact(64)) {
        for l in 0..32 {
            q[l] = chunk[l] | (chunk[l + 32] << 4);
        }
    }
    BlockQ4K {
        d,
        dmin,
        scales: packed,
        qs,
    }
}

/// Q6_K as ggml's `quantize_row_q6_K_ref` makes it: each sub-block of 16
/// fitted by [`fit_scale_symmetric`], the 16 scales quantized to signed 8
/// bits against the largest, every element requantized to 6 bits.
pub fn block_q6_k(x: &[f32]) -> BlockQ6K {
    block_q6_k_fit(x, true)
}

/// [`block_q6_k`] with or without the 18-candidate sweep of its scale fits
/// (as [`block_q4_k_fit`]).
pub fn block_q6_k_fit(x: &[f32], search: bool) -> BlockQ6K {
    let mut levels = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let (mut max_scale, mut max_abs) = (0f32, 0f32);
    for (ib, xs) in x.chunks_exact(16).enumerate() {
        let s = fit_scale_symmetric(32, xs, &mut levels[16 * ib..16 * ib + 16], search);
        scales[ib] = s;
        if s.abs() > max_abs {
            max_abs = s.abs();
            max_scale = s;
        }
    }
    if max_abs < 1e-15 {
        return BlockQ6K::zeroed();
    }
    let iscale = -128.0 / max_scale;
    let d = f16::from_f32(1.0 / iscale);
    let mut sc = [0i8; QK_K / 16];
    for (s, &f) in sc.iter_mut().zip(&scales) {
        *s = nearest_int(iscale * f).min(127) as i8;
    }
    for (j, xs) in x.chunks_exact(16).enumerate() {
        let dj = d.to_f32() * sc[j] as f32;
        if dj == 0.0 {
            continue;
        }
        for (l, &v) in levels[16 * j..16 * j + 16].iter_mut().zip(xs) {
            *l = (nearest_int(v / dj).clamp(-32, 31) + 32) as i8;
        }
    }
    let mut b = BlockQ6K {
        ql: [0; QK_K / 2],
        qh: [0; QK_K / 4],
        scales: sc,
        d,
    };
    for (n, l6) in levels.chunks_exact(128).enumerate() {
        let u = |i: usize| l6[i] as u8;
        for l in 0..32 {
            b.ql[64 * n + l] = (u(l) & 0xF) | ((u(l + 64) & 0xF) << 4);
            b.ql[64 * n + l + 32] = (u(l + 32) & 0xF) | ((u(l + 96) & 0xF) << 4);
            b.qh[32 * n + l] = (u(l) >> 4)
                | ((u(l + 32) >> 4) << 2)
                | ((u(l + 64) >> 4) << 4)
                | ((u(l + 96) >> 4) << 6);
        }
    }
    b
}
