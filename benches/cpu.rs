//! CPU engine benchmarks.
//! - `matmul/<TYPE>/<n_tok>`: a 1536x576 weight (SmolLM2's FFN up) times 1 or
//!   128 tokens, in GFLOP/s (2 * rows * cols * tokens), weights from the
//!   quant zoo's formats or quantized here.
//! - `smollm2/pp128` and `smollm2/tg64`: the default model, 128 prompt tokens
//!   and 64 decode steps, in tokens/s, with 8-bit inputs as llama.cpp
//!   (`CpuMath::Quantized`, the default); `smollm2-exact/...` the FP32 reference (llama.cpp's CPU build measured pp128
//!   266 t/s and tg64 110-120 t/s on this kind of 2-core machine).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use m40_gguf::quant::quantize_to_vec;
use m40_gguf::{GgmlType, GgufFile, Metadata, TensorSpec};
use m40_model::cpu::matmul::matmul;
use m40_model::cpu::{CpuBackend, CpuMath};
use m40_model::{Backend, KvState, Logits, Model};

fn matmuls(c: &mut Criterion) {
    let (rows, cols) = (1536usize, 576usize);
    let mut g = c.benchmark_group("matmul");
    g.sample_size(10);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| (((i * 7919) % 2001) as f32 / 1000.0 - 1.0) * 0.05)
        .collect();
    for ty in GgmlType::QUANTIZABLE
        .iter()
        .copied()
        .filter(|t| *t != GgmlType::Q5_0 && *t != GgmlType::Q5_1)
    {
        // The K-quants' 256-value blocks do not divide SmolLM2's 576
        // columns (llama.cpp stores such rows in other formats too).
        if !cols.is_multiple_of(ty.block_len()) {
            eprintln!(
                "matmul/{ty}: skipped, {cols} columns are not whole {}-value blocks",
                ty.block_len()
            );
            continue;
        }
        // A one-tensor GGUF in memory gives a real TensorView.
        let md = Metadata::new();
        let spec = TensorSpec::new("w", ty, &[cols as u64, rows as u64]);
        let mut wr =
            m40_gguf::GgufWriter::new(Vec::new(), &md, std::slice::from_ref(&spec)).unwrap();
        wr.write_tensor(&quantize_to_vec(ty, &w).unwrap()[..])
            .unwrap();
        let file = GgufFile::from_bytes(wr.finish().unwrap()).unwrap();
        let view = file.tensor("w").unwrap();
        for n_tok in [1usize, 128] {
            let x: Vec<f32> = (0..n_tok * cols)
                .map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5)
                .collect();
            let mut out = vec![0f32; n_tok * rows];
            g.throughput(Throughput::Elements((2 * rows * cols * n_tok) as u64));
            g.bench_with_input(BenchmarkId::new(ty.name(), n_tok), &n_tok, |b, &n| {
                b.iter(|| matmul(&view, &x, n, &mut out).unwrap())
            });
        }
    }
    g.finish();
}

fn end_to_end(c: &mut Criterion) {
    let store = m40_store::Store::from_env().unwrap();
    let path = store
        .ensure_default(&mut |m: &str| eprintln!("{m}"))
        .unwrap();
    let model = Arc::new(Model::open(path).unwrap());
    let prompt: Vec<u32> = (0..128).map(|i| 100 + (i * 37) % 4000).collect();
    // The default (8-bit inputs, as llama.cpp) and the exact reference.
    for (group, math) in [
        ("smollm2", CpuMath::Quantized),
        ("smollm2-exact", CpuMath::Exact),
    ] {
        let cpu = CpuBackend::with_math(model.clone(), math).unwrap();
        let mut g = c.benchmark_group(group);
        g.sample_size(10);
        g.throughput(Throughput::Elements(128));
        g.bench_function("pp128", |b| {
            b.iter(|| {
                let mut cache = cpu.new_cache(256).unwrap();
                cpu.forward(&mut cache, &prompt, Logits::Last).unwrap()
            })
        });
        let mut cache = cpu.new_cache(256).unwrap();
        cpu.forward(&mut cache, &prompt[..16], Logits::Last)
            .unwrap();
        g.throughput(Throughput::Elements(64));
        g.bench_function("tg64", |b| {
            b.iter(|| {
                cache.truncate(16);
                let mut t = 1u32;
                for _ in 0..64 {
                    let l = cpu.forward(&mut cache, &[t], Logits::Last).unwrap();
                    t = m40_model::argmax(&l);
                }
            })
        });
        g.finish();
    }
}

criterion_group!(benches, matmuls, end_to_end);
criterion_main!(benches);
