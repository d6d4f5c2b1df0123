//! CPU dequantization throughput per format, in GB/s of f32 written (one thread).
//!
//! Data: random f32 quantized with our quantizers for the formats we can
//! write; for the K-quants and IQ4 formats, the quant zoo's `blk.0.ffn_up.weight`
//! tiled to the bench size (real blocks, real scales: no denormal surprises).

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use m40_gguf::quant::{dequantize, quantize_to_vec};
use m40_gguf::{GgmlType, GgufFile};

const N: usize = 1 << 22; // 4 Mi values = 16 MiB of f32 out

fn zoo_file(ty: GgmlType) -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/testdata/quant-zoo");
    let suffix = match ty {
        GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K => format!("{ty}_S"),
        _ => ty.name().to_string(),
    };
    let p = dir.join(format!("zoo-{suffix}.gguf"));
    p.is_file().then_some(p)
}

fn input(ty: GgmlType) -> Option<Vec<u8>> {
    if GgmlType::QUANTIZABLE.contains(&ty) {
        let mut s = 0x9E37_79B9u32;
        let x: Vec<f32> = (0..N)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect();
        return Some(quantize_to_vec(ty, &x).unwrap());
    }
    let Some(path) = zoo_file(ty) else {
        eprintln!("skipping {ty}: ../shared/testdata/quant-zoo not found");
        return None;
    };
    let f = GgufFile::open(path).unwrap();
    let t = f.tensor("blk.0.ffn_up.weight").unwrap();
    assert_eq!(t.info.ty, ty);
    let total = ty.row_bytes(N as u64).unwrap() as usize;
    Some(t.data.iter().copied().cycle().take(total).collect())
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("dequantize");
    g.throughput(Throughput::Bytes((N * 4) as u64));
    g.sample_size(20);
    let mut out = vec![0f32; N];
    for &ty in GgmlType::SUPPORTED {
        let Some(src) = input(ty) else { continue };
        g.bench_function(ty.name(), |b| {
            b.iter(|| dequantize(ty, &src, &mut out).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
