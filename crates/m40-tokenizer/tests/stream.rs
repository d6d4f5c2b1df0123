//! The streaming detokenizer: fed ids one at a time, it emits only whole
//! UTF-8 and loses or doubles nothing (token by token == all at once).

#[path = "../../m40-gguf/tests/common/mod.rs"]
mod common;

use m40_gguf::GgufFile;
use m40_tokenizer::{Encode, Tokenizer};
use proptest::prelude::*;

fn load(name: &str) -> Option<Tokenizer> {
    let td = common::testdata()?;
    Some(
        Tokenizer::from_gguf(
            &GgufFile::open(td.join(format!("vocab/ggml-vocab-{name}.gguf"))).unwrap(),
        )
        .unwrap(),
    )
}

fn streamed(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut s = tok.stream();
    let mut out = String::new();
    for &id in ids {
        out.push_str(&s.push(id).unwrap());
    }
    out.push_str(&s.finish().unwrap());
    out
}

/// Built once: the larger vocabularies take a second each.
fn tokenizers() -> &'static [(&'static str, Tokenizer)] {
    static ALL: std::sync::OnceLock<Vec<(&'static str, Tokenizer)>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        ["llama-spm", "llama-bpe", "qwen2", "gpt-2", "falcon"]
            .into_iter()
            .filter_map(|n| load(n).map(|t| (n, t)))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_ids_stream_as_they_decode(seed in any::<u64>(), len in 0usize..60) {
        for (name, tok) in tokenizers().iter() {
            let n = tok.n_vocab() as u64;
            let mut x = seed | 1;
            let ids: Vec<u32> = (0..len).map(|_| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; (x % n) as u32 }).collect();
            prop_assert_eq!(streamed(tok, &ids), tok.decode(&ids).unwrap(), "{} {:?}", name, ids);
        }
    }

    #[test]
    fn random_text_streams_back_exactly(text in "\\PC{0,40}|[a-z ]{0,30}|[ \\n\\t]{0,8}[\\u{80}-\\u{2FFF}\\u{4E00}-\\u{9FFF}\\u{1F300}-\\u{1FAFF}]{1,6}") {
        for (name, tok) in tokenizers().iter() {
            let ids = tok.encode(&text, Encode { parse_special: false, add_special: false }).unwrap();
            let out = streamed(tok, &ids);
            prop_assert_eq!(&out, &tok.decode(&ids).unwrap(), "{}", name);
            // Qwen2 normalizes to NFC, which is lossy by design. SPM writes
            // a space as U+2581 and decodes that character as a space (as
            // llama.cpp does), so text holding it comes back with spaces.
            match tok.pre_split() {
                Some(m40_tokenizer::PreSplit::Qwen2) => {}
                None => prop_assert_eq!(&out, &text.replace('\u{2581}', " "), "{} round trip", name),
                Some(_) => prop_assert_eq!(&out, &text, "{} round trip", name),
            }
        }
    }
}

#[test]
fn nothing_is_emitted_before_a_character_is_whole() {
    let Some(tok) = load("llama-spm") else { return };
    // "🦙" has no token of its own in Llama 2's vocabulary: four byte tokens.
    let ids = tok
        .encode(
            "🦙!",
            Encode {
                parse_special: false,
                add_special: false,
            },
        )
        .unwrap();
    let mut s = tok.stream();
    let pieces: Vec<String> = ids.iter().map(|&i| s.push(i).unwrap()).collect();
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    assert_eq!(pieces.concat(), "🦙!");
    assert!(
        pieces.iter().filter(|p| !p.is_empty()).count() >= 2,
        "{pieces:?}"
    );
    // An incomplete character at the end comes out on finish, as decode gives it.
    let partial = &ids[..ids.len() - 3];
    let mut s = tok.stream();
    let mut out: String = partial.iter().map(|&i| s.push(i).unwrap()).collect();
    out.push_str(&s.finish().unwrap());
    assert_eq!(out, tok.decode(partial).unwrap());
}

#[test]
fn out_of_range_ids_are_errors() {
    let Some(tok) = load("gpt-2") else { return };
    assert!(tok.decode(&[u32::MAX]).is_err());
    assert!(tok.stream().push(tok.n_vocab() as u32).is_err());
}
