//! Every template in ../shared/testdata/templates renders byte for byte as
//! transformers does, and fails where it fails.

#[path = "../../m40-gguf/tests/common/mod.rs"]
mod common;

use chrono::NaiveDate;
use m40_tokenizer::template::{ChatTemplate, RenderOptions};
use m40_tokenizer::{Message, TokenizerError};
use serde_json::Value;

fn conversations() -> Vec<(&'static str, Vec<Message>)> {
    vec![
        (
            "user_only",
            vec![Message::new("user", "Hello! What is 2+2?")],
        ),
        (
            "system_user",
            vec![
                Message::new("system", "You are terse."),
                Message::new("user", "Name a color."),
            ],
        ),
        (
            "multi_turn",
            vec![
                Message::new("system", "You are a helpful assistant."),
                Message::new("user", "Hi"),
                Message::new("assistant", "Hello! How can I help?"),
                Message::new("user", "Tell me a joke about \"GPUs\" & <tags>."),
            ],
        ),
    ]
}

fn first_difference(a: &str, b: &str) -> String {
    let i = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let ctx = |s: &str| {
        s.chars()
            .skip(i.saturating_sub(40))
            .take(100)
            .collect::<String>()
    };
    format!("at char {i}:\n   got  {:?}\n   want {:?}", ctx(a), ctx(b))
}

#[test]
fn every_template_renders_like_transformers() {
    let Some(td) = common::testdata() else { return };
    let dir = td.join("templates");
    let expected: Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let now = NaiveDate::from_ymd_opt(2026, 1, 2)
        .unwrap()
        .and_hms_opt(3, 4, 5)
        .unwrap();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (file, cases) in expected.as_object().unwrap() {
        let source = std::fs::read_to_string(dir.join(file)).unwrap();
        let compiled = ChatTemplate::new(&source);
        for (conv, messages) in conversations() {
            for gen in [true, false] {
                let key = format!("{conv}/{}", if gen { "gen" } else { "nogen" });
                let want = &cases[&key];
                let opts = RenderOptions {
                    add_generation_prompt: gen,
                    bos_token: "<s>".into(),
                    eos_token: "</s>".into(),
                    now: Some(now),
                    ..RenderOptions::default()
                };
                let got = compiled
                    .as_ref()
                    .map_err(|e| e.to_string())
                    .and_then(|t| t.render(&messages, &opts).map_err(|e| e.to_string()));
                checked += 1;
                match (want.as_str(), want.get("error").and_then(Value::as_str)) {
                    (Some(w), _) => match got {
                        Ok(g) if g == w => {}
                        Ok(g) => {
                            failures.push(format!("{file} {key}: {}", first_difference(&g, w)))
                        }
                        Err(e) => failures.push(format!("{file} {key}: error {e}")),
                    },
                    (None, Some(kind)) => {
                        let ok = match (&compiled, kind) {
                            (Err(TokenizerError::TemplateSyntax(_)), "TemplateSyntaxError") => true,
                            (Ok(t), _) => {
                                let e = t.render(&messages, &opts);
                                matches!(
                                    (&e, kind),
                                    (Err(TokenizerError::TemplateRaised(_)), "TemplateError")
                                        | (
                                            Err(TokenizerError::TemplateRender(_)),
                                            "UndefinedError"
                                        )
                                        | (
                                            Err(TokenizerError::TemplateSyntax(_)),
                                            "TemplateSyntaxError"
                                        )
                                )
                            }
                            _ => false,
                        };
                        if !ok {
                            failures.push(format!(
                                "{file} {key}: expected {kind}, got {:?}",
                                got.map(|s| s.chars().take(80).collect::<String>())
                            ));
                        }
                    }
                    _ => panic!("{file} {key}: bad expectation {want}"),
                }
            }
        }
    }
    assert_eq!(checked, 54 * 6);
    assert!(
        failures.is_empty(),
        "{} of {checked} renderings differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
