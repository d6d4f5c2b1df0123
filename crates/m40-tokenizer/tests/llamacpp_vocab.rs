//! Every vocabulary in llama.cpp's models/ folder, from the PyPI sdist of
//! llama-cpp-python: `scripts/llamacpp-vocab.sh` fetches them into
//! target/llamacpp-vocab (or the folder M40_LLAMACPP_VOCAB names). Those with
//! test vectors reproduce every one of them (llama.cpp's test-tokenizer-0
//! protocol); the others load, or name the tokenizer model they need.

mod vectors;

use std::path::PathBuf;

use m40_gguf::GgufFile;
use m40_tokenizer::{Encode, Tokenizer, VocabKind};

fn dir() -> Option<PathBuf> {
    let d = std::env::var_os("M40_LLAMACPP_VOCAB")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/llamacpp-vocab")
        });
    if d.is_dir() {
        return Some(d);
    }
    if std::env::var_os("M40_REQUIRE_LLAMACPP_VOCAB").is_some() {
        panic!(
            "{}: no vocabularies (run scripts/llamacpp-vocab.sh)",
            d.display()
        );
    }
    eprintln!(
        "{}: no vocabularies (scripts/llamacpp-vocab.sh): skipped",
        d.display()
    );
    None
}

/// The vocabularies in `dir` (`ggml-vocab-NAME.gguf`), by NAME, and whether
/// each has test vectors.
fn vocabularies(dir: &std::path::Path) -> Vec<(String, bool)> {
    let mut v: Vec<(String, bool)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().into_string().ok()?;
            let name = n
                .strip_prefix("ggml-vocab-")?
                .strip_suffix(".gguf")?
                .to_string();
            let vectors = dir.join(format!("{n}.inp")).is_file();
            Some((name, vectors))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_vocabulary_reproduces_all_its_vectors() {
    let Some(dir) = dir() else { return };
    let with: Vec<String> = vocabularies(&dir)
        .into_iter()
        .filter_map(|(n, v)| v.then_some(n))
        .collect();
    // llama-cpp-python 0.3.36 carries 15; fewer means a broken fetch.
    assert!(
        with.len() >= 15,
        "only {} vocabularies with vectors: {with:?}",
        with.len()
    );
    let mut report = Vec::new();
    let mut total = 0;
    for name in &with {
        let f = GgufFile::open(dir.join(format!("ggml-vocab-{name}.gguf"))).unwrap();
        // WordPiece lowercases and drops spaces: no way back to the text.
        let lossless = Tokenizer::from_gguf(&f).map(|t| t.vocab().kind != VocabKind::Wpm);
        match vectors::run(&dir, name, lossless.unwrap_or(true)) {
            Ok((n, failures)) => {
                total += n;
                if !failures.is_empty() {
                    report.push(format!(
                        "{name}: {} of {n} differ:\n{}",
                        failures.len(),
                        failures.join("\n")
                    ));
                }
            }
            Err(e) => report.push(format!("{name}: {e}")),
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
    eprintln!(
        "{} vocabularies, {total} vectors, all reproduced",
        with.len()
    );
}

#[test]
fn vocabularies_without_vectors_load_or_name_their_model() {
    let Some(dir) = dir() else { return };
    let literal = Encode {
        parse_special: false,
        add_special: false,
    };
    for (name, _) in vocabularies(&dir).into_iter().filter(|(_, v)| !v) {
        let f = GgufFile::open(dir.join(format!("ggml-vocab-{name}.gguf"))).unwrap();
        let model = f
            .metadata()
            .str("tokenizer.ggml.model")
            .unwrap()
            .to_string();
        match Tokenizer::from_gguf(&f) {
            Ok(t) => {
                let text = "Hello world: 42 apples, naïve café.";
                let ids = t.encode(text, literal).unwrap();
                assert!(ids.len() > 4, "{name}: {ids:?}");
                assert_eq!(t.decode(&ids).unwrap(), text, "{name}");
            }
            // Unigram (`t5`) is not read yet: the error names it.
            Err(e) => {
                assert_eq!(model, "t5", "{name}: {e}");
                assert!(e.to_string().contains("`t5`"), "{name}: {e}");
            }
        }
    }
}
