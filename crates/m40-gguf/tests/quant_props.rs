//! Property tests: quantize -> dequantize error bounds per format, F16/BF16 round trips.

use m40_gguf::quant::{dequantize_to_vec, quantize_to_vec};
use m40_gguf::GgmlType;
use proptest::prelude::*;

fn blocks(n_blocks: std::ops::Range<usize>) -> impl Strategy<Value = Vec<f32>> {
    (n_blocks, 1e-3f32..1e3).prop_flat_map(|(n, scale)| {
        prop::collection::vec(-1f32..1.0, n * 32)
            .prop_map(move |v| v.into_iter().map(|x| x * scale).collect())
    })
}

/// Worst-case error of one 32-element block for each format, from its rounding
/// rule plus the f16 rounding of its scale and minimum.
fn bound(ty: GgmlType, block: &[f32]) -> f32 {
    let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
    let min = block.iter().fold(f32::MAX, |a, &v| a.min(v));
    let max = block.iter().fold(f32::MIN, |a, &v| a.max(v));
    let f16_rel = 1.0 / 1024.0;
    match ty {
        // Step amax/127, half a step of rounding, 127 steps of scale error.
        GgmlType::Q8_0 => amax / 254.0 + amax * f16_rel,
        // Step amax/8; the value opposite the extreme can be clamped by a full step.
        GgmlType::Q4_0 => amax / 8.0 + amax * f16_rel,
        GgmlType::Q5_0 => amax / 16.0 + amax * f16_rel,
        GgmlType::Q4_1 => (max - min) / 30.0 + (max - min + amax) * f16_rel,
        GgmlType::Q5_1 => (max - min) / 62.0 + (max - min + amax) * f16_rel,
        _ => unreachable!(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn block_formats_stay_within_their_error_bound(x in blocks(1..9)) {
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1] {
            let q = quantize_to_vec(ty, &x).unwrap();
            prop_assert_eq!(q.len() as u64, ty.row_bytes(x.len() as u64).unwrap());
            let y = dequantize_to_vec(ty, &q, x.len()).unwrap();
            for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
                let tol = bound(ty, xb) * 1.001 + 1e-30;
                for (i, (a, c)) in xb.iter().zip(yb).enumerate() {
                    prop_assert!((a - c).abs() <= tol, "{} block {} [{}]: {} -> {} (bound {})", ty, b, i, a, c, tol);
                }
            }
        }
    }

    #[test]
    fn k_quants_stay_within_their_error_bound(x in blocks(8..25)) {
        // Super-blocks of 256. Q4_K: sub-blocks of 32 with 6-bit scales and
        // mins relative to the super-block's largest; every element within
        // one step at the largest scale, (max - min) / 15. Q6_K: signed 8-bit
        // sub-block scales, every element within amax / 32 (two half-steps).
        let n = x.len() / 256 * 256;
        let x = &x[..n];
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let y = dequantize_to_vec(ty, &quantize_to_vec(ty, x).unwrap(), n).unwrap();
            for (b, (xb, yb)) in x.chunks(256).zip(y.chunks(256)).enumerate() {
                let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                let min = xb.iter().fold(f32::MAX, |a, &v| a.min(v)).min(0.0);
                let max = xb.iter().fold(f32::MIN, |a, &v| a.max(v));
                let tol = match ty {
                    GgmlType::Q4_K => (max - min) / 15.0,
                    _ => amax / 32.0,
                } * 1.01 + 1e-30;
                for (i, (a, c)) in xb.iter().zip(yb).enumerate() {
                    prop_assert!((a - c).abs() <= tol, "{} super-block {} [{}]: {} -> {} (bound {})", ty, b, i, a, c, tol);
                }
            }
        }
    }

    #[test]
    fn quantization_is_exact_on_its_own_grid(x in blocks(1..5)) {
        // Dequantized values are on the format's grid: quantizing them again
        // and dequantizing gives them back (to f16 rounding of the scale).
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1] {
            let y = dequantize_to_vec(ty, &quantize_to_vec(ty, &x).unwrap(), x.len()).unwrap();
            let z = dequantize_to_vec(ty, &quantize_to_vec(ty, &y).unwrap(), y.len()).unwrap();
            for (yb, zb) in y.chunks(32).zip(z.chunks(32)) {
                let amax = yb.iter().fold(0f32, |a, v| a.max(v.abs()));
                for (a, b) in yb.iter().zip(zb) {
                    prop_assert!((a - b).abs() <= amax * 4e-3, "{}: {} vs {}", ty, a, b);
                }
            }
        }
    }

    #[test]
    fn f16_round_trips(bits in any::<u16>()) {
        let v = half::f16::from_bits(bits);
        prop_assume!(!v.is_nan());
        let x = v.to_f32();
        let q = quantize_to_vec(GgmlType::F16, &[x]).unwrap();
        prop_assert_eq!(u16::from_le_bytes([q[0], q[1]]), bits);
        prop_assert_eq!(dequantize_to_vec(GgmlType::F16, &q, 1).unwrap()[0].to_bits(), x.to_bits());
    }

    #[test]
    fn bf16_round_trips(bits in any::<u16>()) {
        let v = half::bf16::from_bits(bits);
        prop_assume!(!v.is_nan());
        let x = v.to_f32();
        let q = quantize_to_vec(GgmlType::BF16, &[x]).unwrap();
        prop_assert_eq!(u16::from_le_bytes([q[0], q[1]]), bits);
        prop_assert_eq!(dequantize_to_vec(GgmlType::BF16, &q, 1).unwrap()[0].to_bits(), x.to_bits());
    }

    #[test]
    fn half_precision_rounding_error(x in -6.0e4f32..6.0e4) {
        let y = dequantize_to_vec(GgmlType::F16, &quantize_to_vec(GgmlType::F16, &[x]).unwrap(), 1).unwrap()[0];
        prop_assert!((x - y).abs() <= x.abs() / 2048.0 + 6e-8 / 2.0 + 1e-12, "f16 {} -> {}", x, y);
        let y = dequantize_to_vec(GgmlType::BF16, &quantize_to_vec(GgmlType::BF16, &[x]).unwrap(), 1).unwrap()[0];
        prop_assert!((x - y).abs() <= x.abs() / 256.0, "bf16 {} -> {}", x, y);
    }

    #[test]
    fn f32_is_bit_exact(x in prop::collection::vec(any::<f32>(), 1..64)) {
        let y = dequantize_to_vec(GgmlType::F32, &quantize_to_vec(GgmlType::F32, &x).unwrap(), x.len()).unwrap();
        for (a, b) in x.iter().zip(&y) {
            prop_assert_eq!(a.to_bits(), b.to_bits());
        }
    }
}

#[test]
fn wrong_sizes_and_unsupported_types_are_errors() {
    assert!(quantize_to_vec(GgmlType::Q4_0, &[0.0; 31]).is_err());
    assert!(quantize_to_vec(GgmlType::IQ4_NL, &[0.0; 32]).is_err());
    assert!(quantize_to_vec(GgmlType::Q4_K, &[0.0; 255]).is_err());
    assert!(dequantize_to_vec(GgmlType::Q4_0, &[0u8; 17], 32).is_err());
    assert!(dequantize_to_vec(GgmlType::IQ2_XXS, &[0u8; 66], 256).is_err());
    // Zero blocks quantize to zero scale and dequantize to exact zeros.
    for ty in GgmlType::QUANTIZABLE {
        let y = dequantize_to_vec(*ty, &quantize_to_vec(*ty, &[0.0; 256]).unwrap(), 256).unwrap();
        assert!(y.iter().all(|&v| v == 0.0), "{ty}");
    }
}
