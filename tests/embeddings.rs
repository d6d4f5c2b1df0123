//! Embeddings (issue 57, point 4) against llama.cpp's: the embedding test
//! shapes (bert, nomic-bert, qwen3-embedding's last-token pooling) and a
//! chat model's mean pooling, written with `synth` as
//! scripts/embed-references.sh wrote them for llama.cpp
//! (tests/data/llamacpp-embed-*.json), every text of a reference in one
//! request; on both backends.

mod support;

use std::path::Path;

use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
use m40_runtime::{
    BackendChoice, CancelToken, EmbedInput, EmbedRequest, Engine, EngineError, EngineOptions,
    Prompt, Request,
};
use support::On;

on_both!(
    embeddings_match_llamacpp,
    sixty_four_texts_run_in_one_step,
    limits_are_clear_errors,
);

/// tests/data: in this checkout, or under the working directory, or the
/// GPU pack's copy (`embed-refs`, beside its run.sh).
fn data_dir() -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        root.join("tests/data"),
        "tests/data".into(),
        "embed-refs".into(),
    ]
    .into_iter()
    .find(|p| p.join("llamacpp-embed-tiny-F32.json").is_file())
    .expect("tests/data with the llama.cpp embedding references")
}

fn engine(on: On, shape: &str, ty: &str, dir: &Path, parallel: usize) -> Engine {
    engine_math(
        on,
        shape,
        ty,
        dir,
        parallel,
        m40_runtime::CpuMath::Quantized,
    )
}

fn engine_math(
    on: On,
    shape: &str,
    ty: &str,
    dir: &Path,
    parallel: usize,
    cpu_math: m40_runtime::CpuMath,
) -> Engine {
    let shape = Shape::find(shape).expect("a synth shape");
    let path = dir.join(format!("{}-{ty}.gguf", shape.name));
    if !path.exists() {
        let opts = SynthOptions {
            shape,
            ty: FileType::parse(ty).unwrap(),
            seed: 0,
        };
        let f = std::fs::File::create(&path).unwrap();
        write_model(std::io::BufWriter::new(f), &opts, |_, _| {}).unwrap();
    }
    let backend = match on {
        On::Cpu => BackendChoice::Cpu,
        On::Gpu => {
            m40_device::testing::gpu_device("embedding tests");
            BackendChoice::Gpu
        }
    };
    let opts = {
        let mut o = EngineOptions::default();
        o.n_ctx = Some(512);
        o.backend = backend;
        o.parallel = Some(parallel);
        o.cpu_math = cpu_math;
        o
    };
    Engine::from_path(&path, opts).unwrap()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn texts(e: &Engine, texts: &[String]) -> m40_runtime::Embeddings {
    let inputs = texts.iter().cloned().map(EmbedInput::Text).collect();
    e.embed(&EmbedRequest::new(inputs), &CancelToken::new())
        .unwrap()
}

fn embeddings_match_llamacpp(on: On) {
    let dir = tempfile::tempdir().unwrap();
    let data = data_dir();
    for shape in [
        "bert-tiny",
        "nomic-bert-tiny",
        "qwen3-embedding-tiny",
        "tiny",
    ] {
        for ty in ["F32", "F16"] {
            let file = data.join(format!("llamacpp-embed-{shape}-{ty}.json"));
            let r: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
            let e = engine(on, shape, ty, dir.path(), 64);
            let t: Vec<String> = r["texts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect();
            let got = texts(&e, &t);
            for (i, text) in t.iter().enumerate() {
                let ids = support::json_ids(&r["token_ids"][i]);
                let mine = e
                    .tokenizer()
                    .encode(
                        text,
                        m40_tokenizer::Encode {
                            parse_special: false,
                            add_special: true,
                        },
                    )
                    .unwrap();
                assert_eq!(mine, ids, "{shape} {ty}: the tokens of {text:?}");
                assert_eq!(got.tokens[i], ids.len());
                let want: Vec<f32> = r["embeddings"][i]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect();
                let v = &got.vectors[i];
                assert_eq!(v.len(), want.len());
                let norm: f64 = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
                assert!((norm - 1.0).abs() < 1e-5, "normalized: {norm}");
                let c = cosine(v, &want);
                assert!(
                    c >= 0.9999,
                    "{shape} {ty} {on:?}: cosine {c} to llama.cpp's for {text:?}"
                );
            }
        }
    }
}

/// 64 short texts in one request take one step, and each gets the vector
/// it gets alone.
fn sixty_four_texts_run_in_one_step(on: On) {
    let dir = tempfile::tempdir().unwrap();
    for shape in ["bert-tiny", "tiny"] {
        let e = engine(on, shape, "F16", dir.path(), 64);
        // Short enough that 64 fit one step's 512 tokens.
        let t: Vec<String> = (0..64)
            .map(|i| format!("{}{}", (b'a' + i as u8 / 8) as char, i % 8))
            .collect();
        let before = support::idle(&e);
        let all = texts(&e, &t);
        let after = support::idle(&e);
        assert_eq!(
            after.steps - before.steps,
            1,
            "{shape}: one step for 64 texts"
        );
        for (i, text) in t.iter().enumerate().step_by(9) {
            let alone = texts(&e, std::slice::from_ref(text));
            let c = cosine(&alone.vectors[0], &all.vectors[i]);
            assert!(
                c > 0.99999,
                "{shape}: text {i} alone and batched: cosine {c}"
            );
        }
    }
}

fn limits_are_clear_errors(on: On) {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(on, "bert-tiny", "F32", dir.path(), 4);
    let long = "word ".repeat(600);
    let cancel = CancelToken::new();
    // Too long: refused without truncation; cut (its [SEP] kept) with it.
    let mut req = EmbedRequest::new(vec![EmbedInput::Text(long.clone())]);
    req.truncate = false;
    match e.embed(&req, &cancel) {
        Err(EngineError::InputTooLong { index: 0, max, .. }) => assert_eq!(max, 512),
        other => panic!("{other:?}"),
    }
    req.truncate = true;
    let cut = e.embed(&req, &cancel).unwrap();
    assert_eq!(cut.tokens, [512]);
    // Dimensions: the first k, normalized again; 0 or more than n_embd
    // refused.
    let mut req = EmbedRequest::new(vec![EmbedInput::Text("hello world".into())]);
    let full = e.embed(&req, &cancel).unwrap().vectors.remove(0);
    req.dimensions = Some(32);
    let short = e.embed(&req, &cancel).unwrap().vectors.remove(0);
    assert_eq!(short.len(), 32);
    assert!(cosine(&short, &full[..32]) > 0.99999);
    for bad in [0, 129] {
        req.dimensions = Some(bad);
        assert!(matches!(
            e.embed(&req, &cancel),
            Err(EngineError::BadDimensions { max: 128, .. })
        ));
    }
    // Token ids run as given; one outside the vocabulary is refused.
    let special = m40_tokenizer::Encode {
        parse_special: false,
        add_special: true,
    };
    let hello = e.tokenizer().encode("hello world", special).unwrap();
    let ids = EmbedRequest::new(vec![EmbedInput::Tokens(hello)]);
    let by_ids = e.embed(&ids, &cancel).unwrap().vectors.remove(0);
    assert!(cosine(&by_ids, &full) > 0.99999);
    let bad = EmbedRequest::new(vec![EmbedInput::Tokens(vec![101, 5000])]);
    assert!(e.embed(&bad, &cancel).is_err());
    // An encoder does not generate.
    let r = Request::new(Prompt::Text("hello".into()));
    assert!(matches!(
        e.generate(&r, &cancel, |_| {}),
        Err(EngineError::EmbeddingOnly("bert"))
    ));
    support::idle(&e);
}

/// The GPU's vectors against the exact CPU's, element by element, for
/// every embedding shape, the inputs alone and in one batched request
/// (the decoders' rows through the batched step and alone; the encoders'
/// groups).
#[test]
#[ignore = "needs a GPU"]
fn gpu_vectors_match_the_exact_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let t: Vec<String> = (0..40)
        .map(|i| format!("text {i}: {}", "the cat sat on the mat ".repeat(i % 7 + 1)))
        .collect();
    for shape in [
        "bert-tiny",
        "nomic-bert-tiny",
        "qwen3-embedding-tiny",
        "tiny",
    ] {
        let cpu = engine_math(
            On::Cpu,
            shape,
            "F32",
            dir.path(),
            64,
            m40_runtime::CpuMath::Exact,
        );
        let gpu = engine(On::Gpu, shape, "F32", dir.path(), 64);
        let want = texts(&cpu, &t);
        let all = texts(&gpu, &t);
        for (i, w) in want.vectors.iter().enumerate() {
            let alone = texts(&gpu, std::slice::from_ref(&t[i]));
            for got in [&all.vectors[i], &alone.vectors[0]] {
                let worst = got
                    .iter()
                    .zip(w)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(
                    worst < 2e-3,
                    "{shape} text {i}: GPU and CPU differ by {worst}"
                );
            }
        }
    }
}
