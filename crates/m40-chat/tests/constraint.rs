//! Constraints over real vocabularies (../shared/testdata/vocab): a valid
//! answer's own tokens are allowed step by step and end where the grammar
//! does; a wrong token is refused; and for random JSON schemas, a walk that
//! picks any allowed token at every step ends in a document the schema
//! accepts.

#[path = "../../m40-gguf/tests/common/mod.rs"]
mod common;

use m40_chat::{Format, FormatError, Grammars, OutputParser, Syntax, Tool};
use m40_gguf::GgufFile;
use m40_tokenizer::Tokenizer;
use proptest::prelude::*;
use serde_json::{json, Value};

fn vocab(name: &str) -> Option<Tokenizer> {
    let td = common::testdata()?;
    let f = GgufFile::open(td.join(format!("vocab/ggml-vocab-{name}.gguf"))).unwrap();
    Some(Tokenizer::from_gguf(&f).unwrap())
}

/// Feeds `text`'s tokens through a constraint of `format`, each checked
/// against the mask before; then an end-of-generation token must be
/// allowed and nothing else once the grammar is done.
fn follows(tok: &Tokenizer, g: &Grammars, format: &Format, text: &str) -> Result<(), String> {
    let mut c = g.compile(format).map_err(|e| e.to_string())?;
    // The answer's tokens by the longest match at each byte (a model's
    // first token has no SentencePiece space before it, so the encoder's
    // ids would not do).
    let pieces: std::collections::HashMap<Vec<u8>, u32> = (0..tok.n_vocab() as u32)
        .filter_map(|id| match tok.token_bytes(id) {
            Some(m40_tokenizer::TokenBytes::Text(b)) if !b.is_empty() => Some((b, id)),
            _ => None,
        })
        .collect();
    let mut ids = Vec::new();
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        let n = (1..=rest.len().min(64))
            .rev()
            .find(|&n| pieces.contains_key(&rest[..n]))
            .expect("a token");
        ids.push(pieces[&rest[..n]]);
        rest = &rest[n..];
    }
    for &id in &ids {
        let m = c.mask().map_err(|e| e.to_string())?;
        if !m.allows(id) {
            return Err(format!("{:?} refused", tok.decode(&[id]).unwrap()));
        }
        c.accept(id).map_err(|e| e.to_string())?;
    }
    let m = c.mask().map_err(|e| e.to_string())?;
    let eog: Vec<u32> = tok.eog_ids().collect();
    if !eog.iter().any(|&e| m.allows(e)) {
        return Err("no end of generation after the answer".into());
    }
    Ok(())
}

#[test]
fn valid_answers_pass_and_wrong_tokens_do_not() {
    for name in ["qwen2", "llama-spm", "llama-bpe", "phi-3"] {
        let Some(tok) = vocab(name) else { return };
        let g = Grammars::new(&tok).unwrap();
        let schema = Format::JsonSchema(json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": false,
        }));
        follows(&tok, &g, &schema, r#"{"name": "Zebulon", "age": 42}"#).unwrap();
        // Wrong type, unknown key, free whitespace: refused.
        assert!(
            follows(&tok, &g, &schema, r#"{"name": 5"#).is_err(),
            "{name}"
        );
        assert!(follows(&tok, &g, &schema, r#"{"nick"#).is_err(), "{name}");
        assert!(follows(&tok, &g, &schema, "{\n").is_err(), "{name}");
        follows(
            &tok,
            &g,
            &Format::Json,
            r#"{"a": [1, 2.5, "x", null, {"b": true}]}"#,
        )
        .unwrap();
        assert!(
            follows(&tok, &g, &Format::Json, "[1]").is_err(),
            "{name}: json mode is an object"
        );
        let gbnf = Format::Gbnf("root ::= (\"yes\" | \"no\") \" \" [0-9]{1,3}".into());
        follows(&tok, &g, &gbnf, "yes 123").unwrap();
        assert!(follows(&tok, &g, &gbnf, "maybe").is_err());
        follows(&tok, &g, &Format::Regex("[a-c]+@[0-9]".into()), "abc@7").unwrap();
        follows(
            &tok,
            &g,
            &Format::Lark("start: \"ok\" | \"fine\"".into()),
            "fine",
        )
        .unwrap();
        // Every bit past the vocabulary is clear.
        let m = g.compile(&Format::Json).unwrap().mask().unwrap();
        assert_eq!(m.words().len(), tok.n_vocab().div_ceil(32));
        assert!((tok.n_vocab()..m.words().len() * 32).all(|i| !m.allows(i as u32)));
    }
}

#[test]
fn grammars_the_engine_cannot_use_say_why() {
    let Some(tok) = vocab("qwen2") else { return };
    let g = Grammars::new(&tok).unwrap();
    let err = |f: Format| match g.compile(&f) {
        Err(FormatError::Unsupported(e)) => e,
        other => panic!("{other:?}"),
    };
    // Keywords of JSON Schema it does not implement are named; unknown
    // ones are ignored, as validators do.
    let e = err(Format::JsonSchema(
        json!({"type": "array", "uniqueItems": true}),
    ));
    assert!(e.contains("uniqueItems"), "{e}");
    g.compile(&Format::JsonSchema(
        json!({"type": "object", "x-ui-widget": 3}),
    ))
    .unwrap();
    let e = err(Format::JsonSchema(
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
    ));
    assert!(!e.is_empty());
    assert!(err(Format::JsonSchema(json!("a string"))).contains("object"));
    assert!(err(Format::Gbnf("item ::= \"x\"".into())).contains("root"));
    assert!(!err(Format::Lark("start: (".into())).is_empty());
}

/// A JSON schema of bounded answers: objects (at most two levels deep),
/// short strings, bounded integers, booleans, string enums, short arrays.
fn schema() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        (0usize..6).prop_map(|n| json!({"type": "string", "maxLength": n})),
        (-50i64..50, 0i64..1000)
            .prop_map(|(lo, w)| json!({"type": "integer", "minimum": lo, "maximum": lo + w})),
        Just(json!({"type": "boolean"})),
        prop::collection::vec("[a-z]{1,6}", 1..4).prop_map(|v| json!({"enum": v})),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            (inner.clone(), 0usize..4).prop_map(|(s, n)| json!({"type": "array", "items": s, "maxItems": n})),
            prop::collection::btree_map("[a-z]{1,5}", inner, 1..4).prop_flat_map(|props| {
                let keys: Vec<String> = props.keys().cloned().collect();
                prop::sample::subsequence(keys.clone(), 0..=keys.len()).prop_map(move |req| {
                    json!({"type": "object", "properties": props.clone(), "required": req, "additionalProperties": false})
                })
            }),
        ]
    })
}

/// Whether `v` is valid under a schema of [`schema`]'s kind.
fn valid(s: &Value, v: &Value) -> bool {
    if let Some(e) = s.get("enum") {
        return e.as_array().unwrap().contains(v);
    }
    match s["type"].as_str().unwrap() {
        "string" => v
            .as_str()
            .is_some_and(|x| x.chars().count() as u64 <= s["maxLength"].as_u64().unwrap()),
        // -0 is the integer 0.
        "integer" => v.as_f64().is_some_and(|x| {
            x.fract() == 0.0
                && x >= s["minimum"].as_f64().unwrap()
                && x <= s["maximum"].as_f64().unwrap()
        }),
        "boolean" => v.is_boolean(),
        "array" => v.as_array().is_some_and(|a| {
            a.len() as u64 <= s["maxItems"].as_u64().unwrap()
                && a.iter().all(|x| valid(&s["items"], x))
        }),
        "object" => v.as_object().is_some_and(|o| {
            let props = s["properties"].as_object().unwrap();
            s["required"]
                .as_array()
                .unwrap()
                .iter()
                .all(|k| o.contains_key(k.as_str().unwrap()))
                && o.iter()
                    .all(|(k, x)| props.get(k).is_some_and(|p| valid(p, x)))
        }),
        t => panic!("{t}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any token the mask allows, at every step, until an end of
    /// generation is picked: the text is a document the schema accepts.
    #[test]
    fn random_walks_end_in_valid_documents(s in schema(), seed in any::<u64>()) {
        let Some(tok) = TOKENIZER.as_ref() else { return Ok(()) };
        let g = &GRAMMARS.as_ref().unwrap();
        let c = g.compile(&Format::JsonSchema(s.clone())).unwrap();
        let ids = walk(tok, c, seed)?;
        let text = tok.decode(&ids).unwrap();
        let v: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
        prop_assert!(valid(&s, &v), "{} is not valid under {}", text, s);
    }
}

/// Any token the mask allows at every step (a fixed stream per seed),
/// until an end of generation is picked or the grammar is done: the ids.
fn walk(
    tok: &Tokenizer,
    mut c: m40_chat::Constraint,
    seed: u64,
) -> Result<Vec<u32>, TestCaseError> {
    let mut rng = seed | 1;
    let mut ids = Vec::new();
    for _ in 0..4000 {
        let m = c.mask().unwrap();
        let allowed: Vec<u32> = (0..tok.n_vocab() as u32).filter(|&i| m.allows(i)).collect();
        prop_assert!(!allowed.is_empty());
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let id = allowed[(rng % allowed.len() as u64) as usize];
        if tok.is_eog(id) || c.is_done() {
            return Ok(ids);
        }
        c.accept(id).unwrap();
        ids.push(id);
    }
    Err(TestCaseError::fail(format!(
        "no end after 4000 tokens: {:?}",
        tok.decode(&ids)
    )))
}

static TOKENIZER: std::sync::LazyLock<Option<Tokenizer>> =
    std::sync::LazyLock::new(|| vocab("qwen2"));
static GRAMMARS: std::sync::LazyLock<Option<Grammars>> =
    std::sync::LazyLock::new(|| TOKENIZER.as_ref().map(|t| Grammars::new(t).unwrap()));

/// The qwen2 vocabulary with the control tokens of every call syntax added,
/// so that each family's forced-call grammar can be walked.
static TOOL_VOCAB: std::sync::LazyLock<Option<(Tokenizer, Grammars)>> =
    std::sync::LazyLock::new(|| {
        let td = common::testdata()?;
        let f = GgufFile::open(td.join("vocab/ggml-vocab-qwen2.gguf")).unwrap();
        let mut v = m40_tokenizer::Vocab::from_metadata(f.metadata()).unwrap();
        for t in [
            "[TOOL_CALLS]",
            "[ARGS]",
            "<|tool_call|>",
            "<|START_ACTION|>",
            "<|END_ACTION|>",
            "<|channel|>",
            "<|constrain|>",
            "<|message|>",
            "<|python_tag|>",
        ] {
            v.tokens.push(t.into());
            v.scores.push(0.0);
            v.types.push(m40_tokenizer::TokenType::Control);
        }
        let tok = Tokenizer::from_vocab(v).unwrap();
        let g = Grammars::new(&tok).unwrap();
        Some((tok, g))
    });

const SYNTAXES: [Syntax; 9] = [
    Syntax::Llama3,
    Syntax::Hermes,
    Syntax::Mistral,
    Syntax::MistralArgs,
    Syntax::Granite,
    Syntax::CommandR7b,
    Syntax::CommandR,
    Syntax::Harmony,
    Syntax::Generic,
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// A forced call in every family's syntax, for two tools with random
    /// argument schemas: any walk through the grammar is read back by that
    /// family's parser as calls of those tools with valid arguments.
    #[test]
    fn forced_calls_parse_and_validate(a in schema(), b in schema(), which in 0usize..9,
                                       parallel in any::<bool>(), seed in any::<u64>()) {
        let Some((tok, g)) = TOOL_VOCAB.as_ref() else { return Ok(()) };
        let syntax = SYNTAXES[which];
        let params = |s: &Value| json!({"type": "object", "properties": {"x": s}, "required": ["x"]});
        let tools = Tool::parse_all(&[
            json!({"type": "function", "function": {"name": "first", "parameters": params(&a)}}),
            json!({"type": "function", "function": {"name": "second_one", "parameters": params(&b)}}),
        ]).unwrap();
        let special = |s: &str| tok.token_id(s);
        let format = syntax.forced(&tools, None, parallel, &special).unwrap();
        let c = g.compile(&format).map_err(|e| TestCaseError::fail(format!("{format:?}: {e}")))?;
        let ids = walk(tok, c, seed)?;
        let text = tok.decode_with_special(&ids).unwrap();
        let parsed = if syntax == Syntax::Generic {
            m40_chat::output::parse_generic(&text)
        } else {
            let mut p = OutputParser::new(Some(syntax), None, false);
            m40_chat::output::parse_all(&mut p, &text)
        };
        prop_assert!(!parsed.calls.is_empty(), "{:?}: no call in {:?}", syntax, text);
        prop_assert!(parallel || parsed.calls.len() == 1);
        prop_assert_eq!(parsed.content.trim(), "", "{:?}: {:?}", syntax, text);
        for call in &parsed.calls {
            let s = match call.function.name.as_str() { "first" => &a, "second_one" => &b, n => panic!("{n}") };
            prop_assert!(valid(s, &call.function.arguments["x"]), "{:?}: {} not valid under {}", syntax, text, s);
        }
    }
}
