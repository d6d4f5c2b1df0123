//! `EngineOptions::kv_type`: a quantized KV cache on the CPU takes the
//! bytes of its format (q8_0: 34/64 of f16's, q4_0: 18/64), so the same
//! memory holds two or three and a half times the tokens, and generates.

use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
use m40_runtime::{
    BackendChoice, CancelToken, Engine, EngineOptions, KvFormat, Prompt, Request, SamplingParams,
};

#[test]
fn a_quantized_kv_cache_takes_its_formats_bytes_and_generates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let opts = SynthOptions {
        shape: Shape::find("tiny").unwrap(),
        ty: FileType::All(m40_gguf::GgmlType::Q8_0),
        seed: 9,
    };
    write_model(f, &opts, |_, _| {}).unwrap();
    let engine = |kv_type| {
        let mut o = EngineOptions::default();
        o.n_ctx = Some(256);
        o.kv_tokens = Some(1024);
        o.backend = BackendChoice::Cpu;
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
