//! SmolLM2's tokenizer on ../shared/testdata/smollm2/eval-gpl3.txt: encode in
//! MB/s of text (and tokens/s), decode in tokens/s, whole and streamed.
//! The model comes from the store (`M40_MODELS`), fetched on first use.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use m40_tokenizer::{Encode, Tokenizer};

fn bench(c: &mut Criterion) {
    let text_path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/testdata/smollm2/eval-gpl3.txt");
    let Ok(text) = std::fs::read_to_string(&text_path) else {
        eprintln!("skipping: {} not found", text_path.display());
        return;
    };
    let store = m40_store::Store::from_env().unwrap();
    let model = store
        .ensure_default(&mut |m: &str| eprintln!("{m}"))
        .unwrap();
    let tok = Tokenizer::from_gguf(&m40_gguf::GgufFile::open(model).unwrap()).unwrap();
    let opts = Encode {
        parse_special: false,
        add_special: false,
    };
    let ids = tok.encode(&text, opts).unwrap();
    eprintln!("{} bytes -> {} tokens", text.len(), ids.len());

    let mut g = c.benchmark_group("smollm2_tokenizer");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("encode_bytes", |b| {
        b.iter(|| tok.encode(&text, opts).unwrap())
    });
    g.throughput(Throughput::Elements(ids.len() as u64));
    g.bench_function("encode_tokens", |b| {
        b.iter(|| tok.encode(&text, opts).unwrap())
    });
    g.bench_function("decode_tokens", |b| b.iter(|| tok.decode(&ids).unwrap()));
    g.bench_function("stream_decode_tokens", |b| {
        b.iter(|| {
            let mut s = tok.stream();
            let mut n = 0;
            for &id in &ids {
                n += s.push(id).unwrap().len();
            }
            n + s.finish().unwrap().len()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
