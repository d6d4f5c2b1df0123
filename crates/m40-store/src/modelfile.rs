//! Ollama's Modelfile: the text `ollama create -f` and `/api/create`'s
//! `modelfile` take. Instructions, one per line (case-insensitive, `#`
//! comments): `FROM model`, `PARAMETER name value` (repeatable for `stop`),
//! `SYSTEM text`, `TEMPLATE text`, `LICENSE text` (repeatable),
//! `MESSAGE role text`; a value may be quoted ("...") or triple-quoted
//! ("""...""", across lines). `ADAPTER` (LoRA) is refused: m40-llm has no
//! adapters.

use std::fmt;

/// A parsed Modelfile.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Modelfile {
    /// The model it starts from (a store name or a path).
    pub from: String,
    /// `PARAMETER`s in order, names lower-cased.
    pub parameters: Vec<(String, String)>,
    pub system: Option<String>,
    pub template: Option<String>,
    pub license: Vec<String>,
    /// `MESSAGE`s: (role, content).
    pub messages: Vec<(String, String)>,
}

/// Why a Modelfile does not parse: its line and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelfileError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ModelfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Modelfile line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ModelfileError {}

/// The parameters a Modelfile may set (Ollama's, less those of its
/// runner that m40-llm has no use for).
pub const PARAMETERS: &[&str] = &[
    "num_ctx",
    "num_predict",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "repeat_last_n",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "num_keep",
];

impl Modelfile {
    pub fn parse(text: &str) -> Result<Modelfile, ModelfileError> {
        let mut m = Modelfile::default();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        let err = |line: usize, message: String| ModelfileError { line, message };
        while i < lines.len() {
            let at = i + 1;
            let line = lines[i].trim();
            i += 1;
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (word, rest) = split_word(line);
            let mut rest = rest.to_string();
            // A triple-quoted value runs to the line that closes it.
            if let Some(open) = rest.find("\"\"\"") {
                let mut value = rest[open + 3..].to_string();
                loop {
                    if let Some(close) = value.find("\"\"\"") {
                        if !value[close + 3..].trim().is_empty() {
                            return Err(err(at, "text after the closing \"\"\"".into()));
                        }
                        value.truncate(close);
                        break;
                    }
                    let Some(next) = lines.get(i) else {
                        return Err(err(at, "a \"\"\" that is never closed".into()));
                    };
                    value.push('\n');
                    value.push_str(next);
                    i += 1;
                }
                rest = format!("{}{}", &rest[..open], Quoted(&value));
            }
            match word.to_ascii_lowercase().as_str() {
                "from" => m.from = value(&rest).map_err(|e| err(at, e))?,
                "system" => m.system = Some(value(&rest).map_err(|e| err(at, e))?),
                "template" => m.template = Some(value(&rest).map_err(|e| err(at, e))?),
                "license" => m.license.push(value(&rest).map_err(|e| err(at, e))?),
                "parameter" => {
                    let (name, v) = split_word(&rest);
                    let name = name.to_ascii_lowercase();
                    if !PARAMETERS.contains(&name.as_str()) {
                        return Err(err(
                            at,
                            format!(
                                "unknown parameter '{name}' (known: {})",
                                PARAMETERS.join(", ")
                            ),
                        ));
                    }
                    let v = value(v).map_err(|e| err(at, e))?;
                    m.parameters.push((name, v));
                }
                "message" => {
                    let (role, v) = split_word(&rest);
                    let role = role.to_ascii_lowercase();
                    if !matches!(role.as_str(), "system" | "user" | "assistant") {
                        return Err(err(
                            at,
                            format!("MESSAGE role '{role}' (system, user or assistant)"),
                        ));
                    }
                    m.messages.push((role, value(v).map_err(|e| err(at, e))?));
                }
                "adapter" => {
                    return Err(err(
                        at,
                        "ADAPTER: m40-llm does not apply LoRA adapters".into(),
                    ))
                }
                other => return Err(err(at, format!("unknown instruction '{other}'"))),
            }
        }
        if m.from.is_empty() {
            return Err(err(lines.len().max(1), "no FROM instruction".into()));
        }
        Ok(m)
    }
}

/// A value re-quoted for [`value`] to unquote (its quotes escaped).
struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "\"{}\"",
            self.0.replace('\\', "\\\\").replace('"', "\\\"")
        )
    }
}

/// The first word of `s` and the rest, trimmed.
fn split_word(s: &str) -> (&str, &str) {
    let s = s.trim();
    match s.find(char::is_whitespace) {
        Some(n) => (&s[..n], s[n..].trim()),
        None => (s, ""),
    }
}

/// An instruction's value: the rest of its line, or one quoted string
/// (`\"` and `\\` escaped within).
fn value(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("a value is missing".into());
    }
    let Some(inner) = s.strip_prefix('"') else {
        return Ok(s.to_string());
    };
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e) => out.push(e),
                None => return Err("a quote that is never closed".into()),
            },
            '"' => {
                return match chars.as_str().trim() {
                    "" => Ok(out),
                    _ => Err("text after the closing quote".into()),
                }
            }
            c => out.push(c),
        }
    }
    Err("a quote that is never closed".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ollamas_instructions_parse() {
        let text = r#"
# a comment
FROM smollm2:135m
parameter temperature 0.7
PARAMETER stop "<|im_end|>"
PARAMETER stop "User:"
SYSTEM """You are Mario.
Answer as him."""
TEMPLATE "{{ .Prompt }}"
MESSAGE user Is the sky blue?
MESSAGE assistant "Yes, \"very\"."
LICENSE MIT
"#;
        let m = Modelfile::parse(text).unwrap();
        assert_eq!(m.from, "smollm2:135m");
        assert_eq!(
            m.parameters,
            [
                ("temperature".into(), "0.7".into()),
                ("stop".into(), "<|im_end|>".into()),
                ("stop".into(), "User:".into())
            ]
        );
        assert_eq!(m.system.as_deref(), Some("You are Mario.\nAnswer as him."));
        assert_eq!(m.template.as_deref(), Some("{{ .Prompt }}"));
        assert_eq!(
            m.messages,
            [
                ("user".into(), "Is the sky blue?".into()),
                ("assistant".into(), "Yes, \"very\".".into())
            ]
        );
        assert_eq!(m.license, ["MIT"]);
        // A triple-quoted value on one line, quotes inside it kept.
        let m = Modelfile::parse("FROM x\nSYSTEM \"\"\"say \"hi\" \"\"\"").unwrap();
        assert_eq!(m.system.as_deref(), Some("say \"hi\" "));
    }

    #[test]
    fn mistakes_name_their_line() {
        for (text, line, needle) in [
            ("PARAMETER temperature 1", 1, "no FROM"),
            (
                "FROM x\nPARAMETER warmth 1",
                2,
                "unknown parameter 'warmth'",
            ),
            ("FROM x\n\nBOGUS y", 3, "unknown instruction 'bogus'"),
            ("FROM x\nSYSTEM \"\"\"never\nclosed", 2, "never closed"),
            ("FROM x\nSYSTEM \"open", 2, "never closed"),
            ("FROM x\nMESSAGE tool hi", 2, "MESSAGE role 'tool'"),
            ("FROM x\nADAPTER ./lora.gguf", 2, "LoRA"),
            ("FROM", 1, "value is missing"),
            ("FROM x\nSYSTEM \"a\" b", 2, "after the closing quote"),
            ("FROM x\nSYSTEM \"\"\"a\"\"\" b", 2, "after the closing"),
        ] {
            let e = Modelfile::parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.to_string().contains(needle), "{text:?}: {e}");
        }
    }
}
