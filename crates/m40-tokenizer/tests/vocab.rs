//! Every vocabulary in ../shared/testdata/vocab reproduces Hugging Face's ids
//! for every test string (add_special_tokens=False, special tokens not parsed),
//! and decoding gives the text back.

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
