//! llama.cpp's tokenizer test vectors: `ggml-vocab-NAME.gguf` with
//! `.gguf.inp` (texts separated by `\n__ggml_vocab_test__\n`) and `.gguf.out`
//! (a line of ids per text), read as llama.cpp's test-tokenizer-0 reads them,
//! and checked as it checks them: add_special and parse_special off.

use std::path::Path;

use m40_gguf::GgufFile;
use m40_tokenizer::{Encode, Tokenizer};

const SEP: &str = "\n__ggml_vocab_test__\n";

/// The texts and ids of `dir/ggml-vocab-{name}.gguf.{inp,out}`.
pub fn cases(dir: &Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let inp = String::from_utf8(inp).unwrap();
    let mut strings: Vec<&str> = inp.split(SEP).collect();
    if inp.ends_with(SEP) {
        strings.pop();
    }
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
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

/// How `dir/ggml-vocab-{name}.gguf` does on its vectors: the cases, and a
/// line for each that encodes to other ids or does not decode back. Decoding
/// is checked only where `lossless` (byte-level BPE and SentencePiece are;
/// WordPiece lowercases and drops spaces).
pub fn run(dir: &Path, name: &str, lossless: bool) -> Result<(usize, Vec<String>), String> {
    let f =
        GgufFile::open(dir.join(format!("ggml-vocab-{name}.gguf"))).map_err(|e| e.to_string())?;
    let tok = Tokenizer::from_gguf(&f).map_err(|e| e.to_string())?;
    let literal = Encode {
        parse_special: false,
        add_special: false,
    };
    let cases = cases(dir, name);
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode(text, literal).map_err(|e| e.to_string())?;
        if &got != want {
            failures.push(format!("{text:?}\n   got  {got:?}\n   want {want:?}"));
            continue;
        }
        if lossless {
            let back = tok.decode(&got).map_err(|e| e.to_string())?;
            if &back != text {
                failures.push(format!("decode {text:?} gave {back:?}"));
            }
        }
    }
    Ok((cases.len(), failures))
}
