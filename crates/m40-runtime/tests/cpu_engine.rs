//! The CPU engine on a random tiny model: embeddings batched with
//! generations (each input's vectors its own, bitwise; regression: the
//! others' logits once overwrote the hidden rows and the embedding failed
//! "ended the embedding early"), and a quantized KV cache (q8_0: 34/64 of
//! f16's bytes, q4_0: 18/64: two or three and a half times the tokens in the
//! same memory) that generates.

use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
use m40_runtime::{
    BackendChoice, CancelToken, EmbedInput, EmbedRequest, Engine, EngineOptions, KvFormat, Prompt,
    Request, SamplingParams,
};

/// The tiny shape with random Q8_0 weights of `seed`, in `dir`.
fn tiny(dir: &std::path::Path, seed: u64) -> std::path::PathBuf {
    let path = dir.join("tiny.gguf");
    let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let opts = SynthOptions {
        shape: Shape::find("tiny").unwrap(),
        ty: FileType::All(m40_gguf::GgmlType::Q8_0),
        seed,
    };
    write_model(f, &opts, |_, _| {}).unwrap();
    path
}

fn cpu_options() -> EngineOptions {
    let mut o = EngineOptions::default();
    o.n_ctx = Some(256);
    o.backend = BackendChoice::Cpu;
    o
}

#[test]
fn embeddings_batched_with_generations_are_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::from_path(&tiny(dir.path(), 40), cpu_options()).unwrap();
    let req = EmbedRequest::new(vec![
        EmbedInput::Text("one text".into()),
        EmbedInput::Text("and another, longer text".into()),
    ]);
    let embed = || {
        e.embed_start(&req, &CancelToken::new())
            .and_then(|r| r.wait())
            .unwrap()
            .vectors
    };
    let alone = embed();
    std::thread::scope(|s| {
        for t in 0..6 {
            let (e, embed, alone) = (&e, &embed, &alone);
            s.spawn(move || {
                for i in 0..12 {
                    if (i + t) % 3 == 0 {
                        assert_eq!(&embed(), alone, "thread {t}, request {i}");
                    } else {
                        let mut g = Request::new(Prompt::Text("The sea".into()));
                        g.max_tokens = Some(16);
                        e.generate(&g, &CancelToken::new(), |_| {}).unwrap();
                    }
                }
            });
        }
    });
}

#[test]
fn a_quantized_kv_cache_takes_its_formats_bytes_and_generates() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path(), 9);
    let engine = |kv_type| {
        let mut o = cpu_options();
        o.kv_tokens = Some(1024);
        o.kv_type = kv_type;
        Engine::from_path(&path, o).unwrap()
    };
    let half = engine(KvFormat::F16).memory().kv;
    for (format, ratio) in [(KvFormat::Q8_0, 34.0 / 64.0), (KvFormat::Q4_0, 18.0 / 64.0)] {
        let e = engine(format);
        assert_eq!(e.memory().kv as f64, half as f64 * ratio, "{format:?}");
        let mut req = Request::new(Prompt::Text("hello world".into()));
        req.sampling = SamplingParams::greedy();
        req.max_tokens = Some(12);
        req.ignore_eos = true;
        let done = e.generate(&req, &CancelToken::new(), |_| {}).unwrap();
        assert_eq!(done.token_ids.len(), 12, "{format:?}");
    }
}
