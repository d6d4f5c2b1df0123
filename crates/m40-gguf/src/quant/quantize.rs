//! CPU quantization: ggml's reference (`quantize_row_*_ref`) algorithms.

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
