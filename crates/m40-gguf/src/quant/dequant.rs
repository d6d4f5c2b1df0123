//! CPU dequantization, one block at a time, in the same float operations and
//! order as ggml's reference `dequantize_row_*` (so results match it exactly).

use half::{bf16, f16};

use super::blocks::*;

/// Q4_0: 32 values.
#[inline]
pub fn block_q4_0(b: &BlockQ4_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    for j in 0..QK32 / 2 {
        y[j] = ((b.qs[j] & 0xF) as i32 - 8) as f32 * d;
        y[j + QK32 / 2] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

#[inline]
pub fn block_q4_1(b: &BlockQ4_1, y: &mut [f32]) {
    let d = b.d.to_f32();
    let m = b.m.to_f32();
    for j in 0..QK32 / 2 {
        y[j] = (b.qs[j] & 0xF) as f32 * d + m;
        y[j + QK32 / 2] = (b.qs[j] >> 4) as f32 * d + m;
    }
}

#[inline]
pub fn block_q5_0(b: &BlockQ5_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    let qh = u32::from_le_bytes(b.qh);
    for j in 0..QK32 / 2 {
        let xh0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
        y[j] = (((b.qs[j] & 0xF) | xh0) as i32 - 16) as f32 * d;
        y[j + QK32 / 2] = (((b.qs[j] >> 4) | xh1) as i32 - 16) as f32 * d;
    }
}

#[inline]
pub fn block_q5_1(b: &BlockQ5_1, y: &mut [f32]) {
    let d = b.d.to_f32();
    let m = b.m.to_f32();
    let qh = u32::from_le_bytes(b.qh);
    for j in 0..QK32 / 2 {
        let xh0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
        y[j] = ((b.qs[j] & 0xF) | xh0) as f32 * d + m;
        y[j + QK32 / 2] = ((b.qs[j] >> 4) | xh1) as f32 * d + m;
    }
}

#[inline]
pub fn block_q8_0(b: &BlockQ8_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (y, &q) in y.iter_mut().zip(&b.qs) {
        *y = q as f32 * d;
    }
}

#[inline]
pub fn block_q2_k(b: &BlockQ2K, y: &mut [f32]) {
    let d = b.d.to_f32();
    let min = b.dmin.to_f32();
    let mut out = 0;
    let mut is = 0;
    for n in (0..QK_K).step_by(128) {
        let q = &b.qs[n / 4..n / 4 + 32];
        for shift in (0..8).step_by(2) {
            for half in 0..2 {
                let sc = b.scales[is];
                is += 1;
                let dl = d * (sc & 0xF) as f32;
                let ml = min * (sc >> 4) as f32;
                for l in 0..16 {
                    y[out] = dl * ((q[l + 16 * half] >> shift) & 3) as f32 - ml;
                    out += 1;
                }
            }
        }
    }
}

#[inline]
pub fn block_q3_k(b: &BlockQ3K, y: &mut [f32]) {
    let d_all = b.d.to_f32();
    let scales = q3k_scales(&b.scales);
    let mut m: u8 = 1;
    let mut out = 0;
    let mut is = 0;
    for n in (0..QK_K).step_by(128) {
        let q = &b.qs[n / 4..n / 4 + 32];
        for shift in (0..8).step_by(2) {
            for half in 0..2 {
                let dl = d_all * scales[is] as f32;
                is += 1;
                for l in 0..16 {
                    let i = l + 16 * half;
                    let lo = ((q[i] >> shift) & 3) as i32;
                    let hi = if b.hmask[i] & m != 0 { 0 } else { 4 };
                    y[out] = dl * (lo - hi) as f32;
                    out += 1;
                }
            }
            m <<= 1;
        }
    }
}

#[inline]
pub fn block_q4_k(b: &BlockQ4K, y: &mut [f32]) {
    let d = b.d.to_f32();
    let min = b.dmin.to_f32();
    for j in 0..QK_K / 64 {
        let (sc1, m1) = scale_min_k4(2 * j, &b.scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, &b.scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let q = &b.qs[32 * j..32 * j + 32];
        let y = &mut y[64 * j..64 * j + 64];
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0xF) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

#[inline]
pub fn block_q5_k(b: &BlockQ5K, y: &mut [f32]) {
    let d = b.d.to_f32();
    let min = b.dmin.to_f32();
    let (mut u1, mut u2) = (1u8, 2u8);
    for j in 0..QK_K / 64 {
        let (sc1, m1) = scale_min_k4(2 * j, &b.scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, &b.scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let ql = &b.qs[32 * j..32 * j + 32];
        let y = &mut y[64 * j..64 * j + 64];
        for l in 0..32 {
            let h1 = if b.qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if b.qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
            y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
        u1 <<= 2;
        u2 <<= 2;
    }
}

#[inline]
pub fn block_q6_k(b: &BlockQ6K, y: &mut [f32]) {
    let d = b.d.to_f32();
    for n in 0..QK_K / 128 {
        let ql = &b.ql[64 * n..64 * n + 64];
        let qh = &b.qh[32 * n..32 * n + 32];
        let sc = &b.scales[8 * n..8 * n + 8];
        let y = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * sc[is] as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
        }
    }
}

#[inline]
pub fn block_iq4_nl(b: &BlockIQ4NL, y: &mut [f32]) {
    let d = b.d.to_f32();
    for j in 0..QK32 / 2 {
        y[j] = d * KVALUES_IQ4NL[(b.qs[j] & 0xF) as usize] as f32;
        y[j + QK32 / 2] = d * KVALUES_IQ4NL[(b.qs[j] >> 4) as usize] as f32;
    }
}

/// An E8M0 scale halved, as ggml's `GGML_E8M0_TO_FP32_HALF`: 2^(e - 128),
/// the denormals 2^-128 and 2^-127 for e = 0 and 1.
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e as u32 - 1) << 23
    })
}

#[inline]
pub fn block_mxfp4(b: &BlockMXFP4, y: &mut [f32]) {
    let d = e8m0_half(b.e);
    for j in 0..QK32 / 2 {
        y[j] = KVALUES_MXFP4[(b.qs[j] & 0xF) as usize] as f32 * d;
        y[j + QK32 / 2] = KVALUES_MXFP4[(b.qs[j] >> 4) as usize] as f32 * d;
    }
}

#[inline]
pub fn block_iq4_xs(b: &BlockIQ4XS, y: &mut [f32]) {
    let d = b.d.to_f32();
    for ib in 0..QK_K / 32 {
        let ls = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) as i32
            | ((((b.scales_h >> (2 * ib)) & 3) as i32) << 4);
        let dl = d * (ls - 32) as f32;
        let qs = &b.qs[16 * ib..16 * ib + 16];
        let y = &mut y[32 * ib..32 * ib + 32];
        for j in 0..16 {
            y[j] = dl * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f32;
            y[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
        }
    }
}

#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    bf16::from_bits(bits).to_f32()
}
