//! MXFP4 against ggml's own quantizer and dequantizer (a fixed set of
//! values, tests/data/ggml-mxfp4.json from scripts/ggml-quant-reference.sh:
//! 64 blocks of random magnitudes 2^-20..2^20, zeros, exact levels, ties,
//! one huge value among small ones, subnormal scales).

use m40_gguf::quant::{dequantize_to_vec, quantize_to_vec};
use m40_gguf::GgmlType;
use serde_json::Value;

fn reference() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/ggml-mxfp4.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn mxfp4_quantizes_as_ggml_byte_for_byte() {
    let r = reference();
    let x = floats(&r["input"]);
    let want = unhex(r["bytes_hex"].as_str().unwrap());
    assert_eq!(x.len(), 64 * 32);
    let ours = quantize_to_vec(GgmlType::MXFP4, &x).unwrap();
    assert_eq!(ours.len(), want.len());
    for (b, (o, w)) in ours.chunks(17).zip(want.chunks(17)).enumerate() {
        assert_eq!(o, w, "block {b}: input {:?}", &x[b * 32..b * 32 + 32]);
    }
}

#[test]
fn mxfp4_dequantizes_as_ggml_bit_for_bit() {
    let r = reference();
    let bytes = unhex(r["bytes_hex"].as_str().unwrap());
    let want = floats(&r["dequantized"]);
    let ours = dequantize_to_vec(GgmlType::MXFP4, &bytes, want.len()).unwrap();
    for (i, (o, w)) in ours.iter().zip(&want).enumerate() {
        assert_eq!(o.to_bits(), w.to_bits(), "value {i}: {o:e} vs {w:e}");
    }
}
