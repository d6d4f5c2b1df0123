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

/// The `tokenizer.ggml.pre` values of llama.cpp's llama-vocab.cpp (fetched
/// beside the vocabularies), each with its pre type: the branches
/// `if (tokenizer_pre == "a" || tokenizer_pre == "b") { pre_type =
/// LLAMA_VOCAB_PRE_TYPE_T;` (other comparisons with a name are skipped).
fn llama_cpp_pre_types(src: &str) -> Vec<(String, String)> {
    const NAME: &str = "tokenizer_pre == \"";
    const TYPE: &str = "pre_type = LLAMA_VOCAB_PRE_TYPE_";
    let mut out = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut rest = src;
    while let Some(at) = rest.find(NAME) {
        let r = &rest[at + NAME.len()..];
        let end = r.find('"').unwrap();
        names.push(r[..end].to_string());
        let after = r[end + 1..].trim_start();
        rest = after;
        if let Some(more) = after.strip_prefix("||") {
            rest = more;
            continue;
        }
        // The branch's body: `) {` then the assignment, or not a branch.
        let body = after
            .strip_prefix(')')
            .map(str::trim_start)
            .and_then(|b| b.strip_prefix('{'))
            .map(str::trim_start)
            .and_then(|b| b.strip_prefix(TYPE));
        if let Some(t) = body {
            let end = t
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap();
            out.extend(names.drain(..).map(|n| (n, t[..end].to_string())));
        } else {
            names.clear();
        }
    }
    out
}

#[test]
fn pre_tokenizer_names_follow_llama_cpp() {
    use m40_tokenizer::PreSplit;
    let Some(dir) = dir() else { return };
    let src = std::fs::read_to_string(dir.join("llama-vocab.cpp")).unwrap();
    let table = llama_cpp_pre_types(&src);
    assert!(table.len() >= 80, "only {} pre values read", table.len());
    // llama.cpp's pre types by the split they run (its regex lists), for
    // the splits we have.
    let split = |t: &str| -> Option<PreSplit> {
        Some(match t {
            "DEFAULT" => PreSplit::Default,
            "LLAMA3" => PreSplit::Llama3,
            "DBRX" | "SMAUG" => PreSplit::Llama3Split,
            "QWEN2" | "STABLELM2" | "HUNYUAN" | "SOLAR_OPEN" => PreSplit::Qwen2Split,
            "QWEN35" => PreSplit::Qwen35,
            "GPT4O" | "MINIMAX_M2" => PreSplit::Gpt4o,
            "TEKKEN" => PreSplit::Tekken,
            "GPT2" | "MPT" | "OLMO" | "JAIS" | "TRILLION" | "GRANITE_DOCLING" => PreSplit::Gpt2,
            "STARCODER" | "REFACT" | "COMMAND_R" | "SMOLLM" | "CODESHELL" | "EXAONE"
            | "MINERVA" | "MELLUM2" => PreSplit::DigitsGpt2,
            "FALCON" => PreSplit::Falcon,
            "DEEPSEEK_CODER" => PreSplit::DeepseekCoder,
            "DEEPSEEK_LLM" => PreSplit::DeepseekLlm,
            _ => return None,
        })
    };
    let (mut covered, mut missing) = (0, Vec::new());
    for (name, ty) in &table {
        match (split(ty), PreSplit::from_pre(name)) {
            (Some(want), Some(got)) => {
                // Qwen2's own names add NFC (Hugging Face's Qwen2 tokenizers
                // normalize; the vectors need it): the same split otherwise.
                let got = if got == PreSplit::Qwen2 {
                    PreSplit::Qwen2Split
                } else {
                    got
                };
                assert_eq!(got, want, "`{name}` (LLAMA_VOCAB_PRE_TYPE_{ty})");
                covered += 1;
            }
            (Some(_), None) => panic!("`{name}` (LLAMA_VOCAB_PRE_TYPE_{ty}) has a split we run"),
            (None, Some(got)) => panic!("`{name}` (LLAMA_VOCAB_PRE_TYPE_{ty}) is not {got:?}"),
            (None, None) => missing.push(format!("{name} ({ty})")),
        }
    }
    // Every split we map a name to builds and runs (a regex Oniguruma
    // refuses fails here: deepseek-llm's once did), over GPT-2's vocabulary.
    let gpt2 = GgufFile::open(dir.join("ggml-vocab-gpt-2.gguf")).unwrap();
    let literal = Encode {
        parse_special: false,
        add_special: false,
    };
    for (name, _) in table
        .iter()
        .filter(|(n, _)| PreSplit::from_pre(n).is_some())
    {
        let mut vocab = m40_tokenizer::Vocab::from_metadata(gpt2.metadata()).unwrap();
        vocab.pre = Some(name.clone());
        let tok = Tokenizer::from_vocab(vocab).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Already NFC, so Qwen2's normalizer leaves it as it is.
        let text = "Hello World's 12345 ünïcödé, 日本語 CamelCase\r\n\n  x";
        let ids = tok
            .encode(text, literal)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(tok.decode(&ids).unwrap(), text, "{name}");
    }
    eprintln!(
        "{covered} of {} pre values run llama.cpp's split; not yet: {}",
        table.len(),
        missing.join(", ")
    );
}
