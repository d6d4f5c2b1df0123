//! Every vocabulary in ../shared/testdata/vocab reproduces Hugging Face's ids
//! for every test string (add_special_tokens=False, special tokens not parsed),
//! and decoding gives the text back.

#[path = "../../m40-gguf/tests/common/mod.rs"]
mod common;

use m40_gguf::GgufFile;
use m40_tokenizer::{Encode, Tokenizer};

const SEP: &str = "\n__ggml_vocab_test__\n";

fn cases(td: &std::path::Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read(td.join(format!("vocab/ggml-vocab-{name}.gguf.inp"))).unwrap();
    let inp = String::from_utf8(inp).unwrap();
    let mut strings: Vec<&str> = inp.split(SEP).collect();
    if inp.ends_with(SEP) {
        strings.pop();
    }
    let out =
        std::fs::read_to_string(td.join(format!("vocab/ggml-vocab-{name}.gguf.out"))).unwrap();
    let lines: Vec<&str> = out.split('\n').collect();
    assert!(
        lines.len() >= strings.len(),
        "{name}: {} outputs for {} inputs",
        lines.len(),
        strings.len()
    );
    strings
        .iter()
        .zip(lines)
        .map(|(s, l)| {
            (
                s.to_string(),
                l.split_whitespace().map(|x| x.parse().unwrap()).collect(),
            )
        })
        .collect()
}

fn check(name: &str) {
    let Some(td) = common::testdata() else { return };
    let f = GgufFile::open(td.join(format!("vocab/ggml-vocab-{name}.gguf"))).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let literal = Encode {
        parse_special: false,
        add_special: false,
    };
    let mut failures = Vec::new();
    let cases = cases(&td, name);
    assert!(cases.len() > 40, "{name}: only {} cases", cases.len());
    for (text, want) in &cases {
        let got = tok.encode(text, literal).unwrap();
        if &got != want {
            failures.push(format!("{text:?}\n   got  {got:?}\n   want {want:?}"));
            continue;
        }
        // Lossless both ways: byte-level BPE always; SentencePiece too, as
        // its decoder strips exactly the one space the normalizer prepends.
        let back = tok.decode(&got).unwrap();
        if &back != text {
            failures.push(format!("decode {text:?} gave {back:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn llama_spm() {
    check("llama-spm");
}
#[test]
fn phi_3() {
    check("phi-3");
}
#[test]
fn llama_bpe() {
    check("llama-bpe");
}
#[test]
fn qwen2() {
    check("qwen2");
}
#[test]
fn gpt_2() {
    check("gpt-2");
}
#[test]
fn deepseek_coder() {
    check("deepseek-coder");
}
#[test]
fn falcon() {
    check("falcon");
}
#[test]
fn starcoder() {
    check("starcoder");
}

#[test]
fn unknown_pre_falls_back_to_gpt2_split() {
    let Some(td) = common::testdata() else { return };
    let f = GgufFile::open(td.join("vocab/ggml-vocab-gpt-2.gguf")).unwrap();
    let mut vocab = m40_tokenizer::Vocab::from_metadata(f.metadata()).unwrap();
    vocab.pre = Some("brand-new-model-2027".into());
    let tok = Tokenizer::from_vocab(vocab).unwrap();
    assert_eq!(tok.pre_split(), Some(m40_tokenizer::PreSplit::Gpt2));
    let literal = Encode {
        parse_special: false,
        add_special: false,
    };
    for (text, want) in cases(&td, "gpt-2") {
        assert_eq!(tok.encode(&text, literal).unwrap(), want, "{text:?}");
    }
    // Every pre the issue names maps to a split.
    for pre in [
        "default",
        "llama-bpe",
        "smollm",
        "qwen2",
        "gpt-2",
        "deepseek-llm",
        "deepseek-coder",
        "falcon",
        "starcoder",
        "mpt",
        "refact",
        "command-r",
    ] {
        assert!(m40_tokenizer::PreSplit::from_pre(pre).is_some(), "{pre}");
    }
}

#[test]
fn unsupported_or_broken_vocabularies_are_errors() {
    let mut md = m40_gguf::Metadata::new();
    assert!(matches!(
        m40_tokenizer::Vocab::from_metadata(&md),
        Err(m40_tokenizer::TokenizerError::NoTokenizer)
    ));
    md.insert("tokenizer.ggml.model", m40_gguf::Value::String("t5".into()));
    let e = m40_tokenizer::Vocab::from_metadata(&md)
        .unwrap_err()
        .to_string();
    assert!(e.contains("t5"), "{e}");
    md.insert(
        "tokenizer.ggml.model",
        m40_gguf::Value::String("gpt2".into()),
    );
    md.insert(
        "tokenizer.ggml.tokens",
        m40_gguf::Value::Array(m40_gguf::Array::String(vec!["a".into(), "b".into()])),
    );
    let e = m40_tokenizer::Vocab::from_metadata(&md)
        .unwrap_err()
        .to_string();
    assert!(e.contains("merges"), "{e}");
    md.insert(
        "tokenizer.ggml.merges",
        m40_gguf::Value::Array(m40_gguf::Array::String(vec!["a b".into()])),
    );
    md.insert(
        "tokenizer.ggml.scores",
        m40_gguf::Value::Array(m40_gguf::Array::F32(vec![0.0])),
    );
    let e = m40_tokenizer::Vocab::from_metadata(&md)
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 scores for 2 tokens"), "{e}");
}
