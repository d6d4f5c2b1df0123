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

/// Several steps in flight (`EngineOptions::steps_in_flight`: step loops
/// sharing one backend, each on its share of the KV pool): every request
/// gets the tokens it gets with one loop (the CPU is batch invariant:
/// bitwise), the pool's pages are shared out, and the loads add up.
#[test]
fn steps_in_flight_share_the_pool_and_change_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path(), 41);
    let with = |n: Option<usize>| {
        let mut o = cpu_options();
        o.steps_in_flight = n;
        o.kv_tokens = Some(1024);
        Engine::from_path(&path, o).unwrap()
    };
    let (one, three) = (with(None), with(Some(3)));
    let (a, b) = (one.activity(), three.activity());
    assert_eq!((a.steps_in_flight, b.steps_in_flight), (1, 3));
    assert_eq!(b.replicas, 1);
    assert_eq!(b.kv_pages, 3 * (a.kv_pages / 3), "{a:?} {b:?}");
    let prompts: Vec<String> = (0..7).map(|i| format!("prompt number {i} says")).collect();
    let answers = |e: &Engine| -> Vec<Vec<u32>> {
        std::thread::scope(|s| {
            let hs: Vec<_> = prompts
                .iter()
                .map(|p| {
                    s.spawn(move || {
                        let mut req = Request::new(Prompt::Text(p.clone()));
                        req.sampling = SamplingParams::greedy();
                        req.max_tokens = Some(24);
                        e.generate(&req, &CancelToken::new(), |_| {})
                            .unwrap()
                            .token_ids
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    assert_eq!(answers(&three), answers(&one));
    let l = three.activity();
    assert_eq!((l.running, l.waiting, l.kv_pages_used), (0, 0, 0), "{l:?}");
    assert!(l.steps > 0);
    // The context still fits each loop's share: more loops than the pool
    // holds contexts are cut to what it holds.
    let mut o = cpu_options();
    o.kv_tokens = Some(256);
    o.steps_in_flight = Some(4);
    let e = Engine::from_path(&path, o).unwrap();
    assert_eq!(e.activity().steps_in_flight, 1);
}
