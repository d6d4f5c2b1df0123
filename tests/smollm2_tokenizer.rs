//! SmolLM2's tokenizer reproduces llama.cpp's ids for every `tokenize` entry
//! of reference.json (special tokens parsed, no BOS) and the perplexity text.

mod support;

use m40_tokenizer::{Encode, Tokenizer};
use serde_json::Value;

#[test]
fn smollm2_reference_tokenization() {
    let Some(td) = support::testdata() else {
        return;
    };
    let reference: Value =
        serde_json::from_slice(&std::fs::read(td.join("smollm2/reference.json")).unwrap()).unwrap();
    let f = m40_gguf::GgufFile::open(support::smollm2()).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let entries = reference["tokenize"].as_array().unwrap();
    assert!(!entries.is_empty());
    for e in entries {
        let text = e["text"].as_str().unwrap();
        let want = support::json_ids(&e["ids"]);
        let got = tok
            .encode(
                text,
                Encode {
                    parse_special: true,
                    add_special: false,
                },
            )
            .unwrap();
        assert_eq!(got, want, "{text:?}");
        assert_eq!(
            tok.decode_with_special(&got).unwrap(),
            text,
            "decode {text:?}"
        );
    }
    // The perplexity text: count and head of llama.cpp's ids.
    let ids = support::eval_text_ids(&td, &tok);
    assert_eq!(ids.len() as u64, reference["text_tokens"].as_u64().unwrap());
    let head = support::json_ids(&reference["text_token_ids_head"]);
    assert_eq!(&ids[..head.len()], &head[..]);
    // End of generation: EOS and ChatML's <|im_end|>.
    let im_end = tok.token_id("<|im_end|>").unwrap();
    assert!(tok.is_eog(im_end));
    assert!(tok.is_eog(tok.eos().unwrap()));
}
