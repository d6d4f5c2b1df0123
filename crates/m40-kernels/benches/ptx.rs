//! The start-up cost of the compressed PTX: decompressing modules as a model
//! load does (each module once per device, before the driver gets it).
//!
//! `every module` is the worst case (`Kernels::load_all`, or `bench`'s
//! probes); a model needs its formats' parts only. No GPU needed.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use m40_kernels::MODULES;

fn decompress(c: &mut Criterion) {
    let mut g = c.benchmark_group("ptx_decompress");
    let text: usize = MODULES.iter().map(|m| m.text().unwrap().len()).sum();
    let packed: usize = MODULES.iter().map(|m| m.compressed_len()).sum();
    eprintln!(
        "{} modules: {:.1} MB of PTX in {:.2} MB compressed ({:.1}x)",
        MODULES.len(),
        text as f64 / 1e6,
        packed as f64 / 1e6,
        text as f64 / packed as f64
    );
    g.throughput(Throughput::Bytes(text as u64));
    g.bench_function("every module", |b| {
        b.iter(|| {
            MODULES
                .iter()
                .map(|m| m.text().unwrap().len())
                .sum::<usize>()
        })
    });
    // A Q4_K_M llama's modules (what `weights::modules` picks for it).
    let model = [
        "attention",
        "elementwise",
        "embed",
        "rmsnorm",
        "rope",
        "sample",
        "gemm.common",
        "gemm.q4_k",
        "gemm.q6_k",
        "gemv_packed.q4_k",
        "gemv_packed.q6_k",
    ];
    let picked: Vec<_> = MODULES.iter().filter(|m| model.contains(&m.name)).collect();
    assert_eq!(picked.len(), model.len());
    let bytes: usize = picked.iter().map(|m| m.text().unwrap().len()).sum();
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function("a q4_k_m llama's modules", |b| {
        b.iter(|| {
            picked
                .iter()
                .map(|m| m.text().unwrap().len())
                .sum::<usize>()
        })
    });
    g.finish();
}

criterion_group!(benches, decompress);
criterion_main!(benches);
