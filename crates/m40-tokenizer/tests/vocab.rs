//! Every vocabulary in ../shared/testdata/vocab reproduces Hugging Face's ids
//! for every test string (add_special_tokens=False, special tokens not parsed),
//! and decoding gives the text back.

#[path = "../../m40-gguf/tests/common/mod.rs"]
mod common;

use m40_gguf::GgufFile;
use m40_tokenizer::{Encode, Tokenizer};

mod vectors;

fn check(name: &str) {
    let Some(td) = common::testdata() else { return };
    let (n, failures) = vectors::run(&td.join("vocab"), name, true).unwrap();
    assert!(n > 40, "{name}: only {n} cases");
    assert!(
        failures.is_empty(),
        "{name}: {} of {n} cases differ:\n{}",
        failures.len(),
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
    for (text, want) in vectors::cases(&td.join("vocab"), "gpt-2") {
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
    md.insert(
        "tokenizer.ggml.model",
        m40_gguf::Value::String("rwkv".into()),
    );
    let e = m40_tokenizer::Vocab::from_metadata(&md)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`rwkv`") && e.contains("`t5`"), "{e}");
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

/// Each token's bytes (`Tokenizer::token_bytes`), joined, are the decoded
/// text of every test vector, byte for byte: what a constraint engine
/// reads of the vocabulary is what the user gets. SentencePiece decoding
/// drops the one space its encoder prepends.
#[test]
fn token_bytes_join_to_the_decoded_text() {
    let Some(td) = common::testdata() else { return };
    for name in [
        "llama-spm",
        "phi-3",
        "llama-bpe",
        "qwen2",
        "gpt-2",
        "deepseek-coder",
        "falcon",
        "starcoder",
    ] {
        let dir = td.join("vocab");
        let f = GgufFile::open(dir.join(format!("ggml-vocab-{name}.gguf"))).unwrap();
        let tok = Tokenizer::from_gguf(&f).unwrap();
        for (text, ids) in vectors::cases(&dir, name) {
            let mut bytes = Vec::new();
            for &id in &ids {
                match tok.token_bytes(id).unwrap() {
                    m40_tokenizer::TokenBytes::Text(b) => bytes.extend(b),
                    m40_tokenizer::TokenBytes::Special => panic!("{name}: {id} in {text:?}"),
                }
            }
            let mut joined = String::from_utf8_lossy(&bytes).into_owned();
            if tok.vocab().add_space_prefix {
                joined = joined.strip_prefix(' ').unwrap_or(&joined).to_string();
            }
            assert_eq!(joined, tok.decode(&ids).unwrap(), "{name}: {text:?}");
        }
        assert!(tok.token_bytes(tok.n_vocab() as u32).is_none());
    }
}

/// Harmony's turn ends (gpt-oss): `<|return|>` and `<|call|>` end
/// generation, `<|end|>` (the end of one message) does not; elsewhere
/// `<|end|>` still does (Phi-3). Control tokens are written out by the
/// special stream only.
#[test]
fn harmony_ends_its_turn_at_return_or_call() {
    let Some(td) = common::testdata() else { return };
    let f = GgufFile::open(td.join("vocab/ggml-vocab-qwen2.gguf")).unwrap();
    let base = m40_tokenizer::Vocab::from_metadata(f.metadata()).unwrap();
    let with = |extra: &[&str]| {
        let mut v = base.clone();
        for t in extra {
            v.tokens.push(t.to_string());
            v.scores.push(0.0);
            v.types.push(m40_tokenizer::TokenType::Control);
        }
        Tokenizer::from_vocab(v).unwrap()
    };
    let harmony = with(&["<|end|>", "<|return|>", "<|call|>", "<|channel|>"]);
    let id = |t: &Tokenizer, s: &str| t.token_id(s).unwrap();
    assert!(!harmony.is_eog(id(&harmony, "<|end|>")));
    assert!(harmony.is_eog(id(&harmony, "<|return|>")));
    assert!(harmony.is_eog(id(&harmony, "<|call|>")));
    let phi = with(&["<|end|>"]);
    assert!(phi.is_eog(id(&phi, "<|end|>")));
    let ch = id(&harmony, "<|channel|>");
    let hello = harmony
        .encode(
            "hi",
            Encode {
                parse_special: false,
                add_special: false,
            },
        )
        .unwrap();
    let ids: Vec<u32> = [ch].into_iter().chain(hello).collect();
    let (mut plain, mut special) = (harmony.stream(), harmony.stream_with_special());
    let (mut a, mut b) = (String::new(), String::new());
    for &i in &ids {
        a.push_str(&plain.push(i).unwrap());
        b.push_str(&special.push(i).unwrap());
    }
    a.push_str(&plain.finish().unwrap());
    b.push_str(&special.finish().unwrap());
    assert_eq!((a.as_str(), b.as_str()), ("hi", "<|channel|>hi"));
}

/// Fill-in-the-middle tokens where the vocabularies have them.
#[test]
fn fim_tokens_are_found_where_they_exist() {
    let Some(td) = common::testdata() else { return };
    let tok = |name: &str| {
        let f = GgufFile::open(td.join(format!("vocab/ggml-vocab-{name}.gguf"))).unwrap();
        Tokenizer::from_gguf(&f).unwrap()
    };
    let names = |t: &Tokenizer| {
        t.fim_tokens()
            .map(|ids| ids.map(|i| t.piece(i).unwrap().to_string()))
    };
    assert_eq!(
        names(&tok("starcoder")).unwrap(),
        ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
    );
    assert_eq!(
        names(&tok("deepseek-coder")).unwrap(),
        ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"]
    );
    assert_eq!(names(&tok("llama-spm")), None);
}
