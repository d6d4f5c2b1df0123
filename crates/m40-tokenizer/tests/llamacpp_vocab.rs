//! Every vocabulary in llama.cpp's models/ folder, from the PyPI sdist of
//! llama-cpp-python: `scripts/llamacpp-vocab.sh` fetches them into
//! target/llamacpp-vocab (or the folder M40_LLAMACPP_VOCAB names). Those with
//! test vectors reproduce every one of them (llama.cpp's test-tokenizer-0
//! protocol); the others load and give back the text they encode.

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
fn vocabularies_without_vectors_load_and_round_trip() {
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
        let t = Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{name} ({model}): {e}"));
        let text = "Hello world: 42 apples, naïve café.";
        let ids = t.encode(text, literal).unwrap();
        assert!(ids.len() > 4, "{name}: {ids:?}");
        assert_eq!(t.decode(&ids).unwrap(), text, "{name}");
    }
}

/// The `tokenizer.ggml.pre` values of llama.cpp's llama-vocab.cpp (fetched
/// beside the vocabularies), each with its pre type and whether its branch
/// sets `ignore_merges`: the branches `if (tokenizer_pre == "a" ||
/// tokenizer_pre == "b") { pre_type = LLAMA_VOCAB_PRE_TYPE_T; ... }` (other
/// comparisons with a name are skipped).
fn llama_cpp_pre_types(src: &str) -> Vec<(String, String, bool)> {
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
            let block = &t[..t.find('}').unwrap()];
            let ignore = block.contains("ignore_merges = true");
            out.extend(names.drain(..).map(|n| (n, t[..end].to_string(), ignore)));
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
            // CHATGLM4 is either (glm4 and glm5 skip merges, chatglm-bpe not).
            "DBRX" | "SMAUG" | "CHATGLM4" => PreSplit::Llama3Split,
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
            "JAIS2" => PreSplit::Jais2,
            "DEEPSEEK3_LLM" | "HUNYUAN_DENSE" | "JOYAI_LLM" | "HY_V4" => PreSplit::Deepseek3,
            "SPARK2_5" => PreSplit::Spark25,
            "YOUTU" => PreSplit::Youtu,
            "PORO" | "BLOOM" | "GPT3_FINNISH" => PreSplit::Bloom,
            "VIKING" => PreSplit::Viking,
            "CHAMELEON" => PreSplit::Chameleon,
            "GRANITE_EMB_MULTI" => PreSplit::GraniteEmbMulti,
            "TINY_AYA" => PreSplit::TinyAya,
            "KIMI_K2" => PreSplit::KimiK2,
            "SUPERBPE" => PreSplit::SuperBpe,
            "BAILINGMOE" => PreSplit::BailingMoe,
            "SEED_CODER" => PreSplit::SeedCoder,
            "UFAKZEKA" => PreSplit::Ufakzeka,
            "GROK_2" => PreSplit::Qwen2Split,
            "AFMOE" => PreSplit::Afmoe,
            "LAGUNA" => PreSplit::Laguna,
            "EXAONE_MOE" => PreSplit::ExaoneMoe,
            "MINICPM5" => PreSplit::Minicpm5,
            "GEMMA4" | "SARVAM_MOE" => PreSplit::SpmStyle,
            "WHITESPACE" => PreSplit::Whitespace,
            _ => return None,
        })
    };
    let (mut covered, mut missing) = (0, Vec::new());
    for (name, ty, ignore_merges) in &table {
        match (split(ty), PreSplit::from_pre(name)) {
            (Some(want), Some(got)) => {
                assert_eq!(
                    got.ignores_merges(),
                    *ignore_merges,
                    "`{name}`: llama.cpp's ignore_merges"
                );
                // Qwen2's own names add NFC (Hugging Face's Qwen2 tokenizers
                // normalize; the vectors need it): the same split otherwise.
                // Llama 3's regex with merges skipped or not is one split.
                let got = match got {
                    PreSplit::Qwen2 => PreSplit::Qwen2Split,
                    PreSplit::Llama3 => PreSplit::Llama3Split,
                    other => other,
                };
                let want = match want {
                    PreSplit::Llama3 => PreSplit::Llama3Split,
                    other => other,
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
    for (name, _, _) in table
        .iter()
        .filter(|(n, _, _)| PreSplit::from_pre(n).is_some_and(PreSplit::byte_level))
    {
        let vocab = m40_tokenizer::Vocab::from_metadata(gpt2.metadata())
            .unwrap()
            .with_pre(name);
        let tok = Tokenizer::from_vocab(vocab).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Already NFC, so Qwen2's normalizer leaves it as it is.
        let text = "Hello World's 12345 ünïcödé, 日本語 CamelCase\r\n\n  x";
        let ids = tok
            .encode(text, literal)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(tok.decode(&ids).unwrap(), text, "{name}");
    }
    assert!(missing.is_empty(), "no split for: {}", missing.join(", "));
    eprintln!(
        "{covered} of {} pre values run llama.cpp's split",
        table.len()
    );
}

/// Where we split as the model's own tokenizer does and llama.cpp does not:
/// pre values, the texts (by index in llamacpp-pre.json) and why.
const HF_NOT_LLAMA_CPP: &[(&[&str], &[usize], &str)] = &[
    (
        &["falcon"],
        &[2, 5, 6, 8, 12, 17, 18, 22],
        "Falcon's tokenizer.json splits digit runs from a leading space and, \
         after the byte mapping, at byte characters that are numeric (¼, ², ...); \
         llama.cpp's regexes do neither (llama.cpp's falcon vectors, from \
         Hugging Face, pass with ours)",
    ),
    (
        &[
            "gpt-4o",
            "llama4",
            "kanana2",
            "talkie",
            "minimax-m2",
            "tekken",
        ],
        &[6],
        "o200k's and Tekken's regexes keep combining marks (\\p{M}) in words; \
         llama.cpp's rewrite of them without case classes drops \\p{M}",
    ),
];

/// llama.cpp's token ids (tests/data/llamacpp-pre.json, from
/// scripts/pre-references.sh) for every pre value it knows, over
/// scripts/pre-vocab.py's vocabularies, in which every piece of a split up to
/// 16 characters is one token: the split itself, piece by piece. Equal
/// everywhere but HF_NOT_LLAMA_CPP's cases, which must differ.
#[test]
fn every_pre_value_splits_as_llama_cpp_does() {
    let Some(dir) = dir() else { return };
    let data = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/llamacpp-pre.json"
    ))
    .unwrap();
    let data: serde_json::Value = serde_json::from_str(&data).unwrap();
    let texts: Vec<&str> = data["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    // The vocabularies must be the ones llama.cpp ran over: same texts.
    let ours: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("pre-texts.json")).unwrap())
            .unwrap();
    assert_eq!(
        ours, texts,
        "pre-texts.json differs: rerun scripts/pre-references.sh"
    );
    let literal = Encode {
        parse_special: false,
        add_special: false,
    };
    let pres = data["pre"].as_object().unwrap();
    assert!(pres.len() >= 80, "only {} pre values", pres.len());
    let mut files = std::collections::HashMap::new();
    let (mut failures, mut checked) = (Vec::new(), 0);
    for (name, want) in pres {
        let which = want["vocab"].as_str().unwrap();
        let file = files
            .entry(which)
            .or_insert_with(|| GgufFile::open(dir.join(format!("pre-{which}.gguf"))).unwrap());
        let vocab = m40_tokenizer::Vocab::from_metadata(file.metadata())
            .unwrap()
            .with_pre(name);
        let tok = Tokenizer::from_vocab(vocab).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (t, (text, ids)) in texts
            .iter()
            .zip(want["ids"].as_array().unwrap())
            .enumerate()
        {
            let Some(ids) = ids.as_array() else { continue };
            let want: Vec<u32> = ids.iter().map(|i| i.as_u64().unwrap() as u32).collect();
            let got = tok.encode(text, literal).unwrap();
            checked += 1;
            let expected_difference = HF_NOT_LLAMA_CPP
                .iter()
                .any(|(names, texts, _)| names.contains(&name.as_str()) && texts.contains(&t));
            if expected_difference {
                assert_ne!(got, want, "{name} on text {t}: now as llama.cpp");
                continue;
            }
            if got != want {
                failures.push(difference(
                    &tok,
                    &format!("{name} on {text:?}"),
                    &want,
                    &got,
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let differ: usize = HF_NOT_LLAMA_CPP
        .iter()
        .map(|(names, texts, _)| names.len() * texts.len())
        .sum();
    eprintln!(
        "{} pre values, {checked} texts: as llama.cpp splits them but {differ} (HF_NOT_LLAMA_CPP)",
        pres.len()
    );
}

/// Two tokenizations of one text, as pieces.
fn difference(tok: &Tokenizer, what: &str, want: &[u32], got: &[u32]) -> String {
    let pieces = |ids: &[u32]| -> Vec<String> {
        ids.iter()
            .map(|&i| tok.piece(i).unwrap().to_string())
            .collect()
    };
    format!(
        "{what}:\n  llama.cpp {:?}\n  ours      {:?}",
        pieces(want),
        pieces(got)
    )
}

/// llama.cpp's token ids for its Unigram (`t5`) test vocabulary,
/// nomic-bert-moe (XLM-R's SentencePiece model with its precompiled
/// character map), from scripts/pre-references.sh: literal text, and with
/// special tokens parsed and added.
#[test]
fn unigram_tokenizes_as_llama_cpp_does() {
    segments_as_llama_cpp("llamacpp-ugm.json", "nomic-bert-moe", VocabKind::Ugm);
}

/// llama.cpp's WordPiece on bert-bge's vocabulary beyond its test vectors
/// (Hangul, Devanagari, Thai, Arabic marks, emoji keycaps, CJK, symbols:
/// tests/data/llamacpp-wpm.json, from scripts/pre-references.sh).
#[test]
fn wordpiece_tokenizes_as_llama_cpp_does() {
    segments_as_llama_cpp("llamacpp-wpm.json", "bert-bge", VocabKind::Wpm);
}

/// Every text of tests/data/`data` as llama.cpp's tokenizer of
/// ggml-vocab-`vocab`.gguf gives it: literal text, and with special tokens
/// parsed and added.
fn segments_as_llama_cpp(data: &str, vocab: &str, kind: VocabKind) {
    let Some(dir) = dir() else { return };
    let path = format!("{}/tests/data/{data}", env!("CARGO_MANIFEST_DIR"));
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let f = GgufFile::open(dir.join(format!("ggml-vocab-{vocab}.gguf"))).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(tok.vocab().kind, kind);
    let texts = data["texts"].as_array().unwrap();
    let (mut failures, mut checked) = (Vec::new(), 0);
    for (mode, special) in [("literal", false), ("special", true)] {
        let opts = Encode {
            parse_special: special,
            add_special: special,
        };
        for (text, ids) in texts.iter().zip(data[mode].as_array().unwrap()) {
            let text = text.as_str().unwrap();
            let want: Vec<u32> = ids
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect();
            let got = tok.encode(text, opts).unwrap();
            checked += 1;
            if got != want {
                failures.push(difference(&tok, &format!("{mode} {text:?}"), &want, &got));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(tok.encode("", Encode::default()).unwrap().is_empty());
    eprintln!("{vocab}: {checked} texts as llama.cpp");
}
