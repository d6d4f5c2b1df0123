//! Ollama's Modelfile: the text `ollama create -f` and `/api/create`'s
//! `modelfile` take. Instructions, one per line (case-insensitive, `#`
//! comments): `FROM model`, `PARAMETER name value` (repeatable for `stop`),
//! `SYSTEM text`, `TEMPLATE text`, `LICENSE text` (repeatable),
//! `MESSAGE role text`; a value may be quoted ("...") or triple-quoted
//! ("""...""", across lines). `ADAPTER` (LoRA) is refused: m40-llm has no
//! adapters.

use std::fmt;

/// A parsed Modelfile. A created model's manifest keeps one (its
/// instructions merged onto those of the model it came from).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
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
    "num_gpu",
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

/// Parameters whose values are whole numbers (the others but `stop` are
/// numbers with a fraction).
const INTEGER_PARAMETERS: &[&str] = &[
    "num_ctx",
    "num_gpu",
    "num_predict",
    "top_k",
    "repeat_last_n",
    "seed",
    "num_keep",
];

impl Modelfile {
    /// Check each `PARAMETER`'s value (a number where one is meant) and the
    /// TEMPLATE (a Jinja chat template, as a GGUF's
    /// `tokenizer.chat_template`; Ollama's Go templates are refused); the
    /// first mistake, named.
    pub fn check_values(&self) -> Result<(), String> {
        if let Some(t) = &self.template {
            let go = ["{{ .", "{{- .", "{{.", "{{ if .", "{{- if .", "{{ range ."];
            if go.iter().any(|g| t.contains(g)) {
                return Err(
                    "TEMPLATE is a Go template (Ollama's); m40-llm renders Jinja chat templates, \
                     as a GGUF's tokenizer.chat_template holds them (leave TEMPLATE out to use the model's)"
                        .into(),
                );
            }
        }
        for (name, v) in &self.parameters {
            let ok = match name.as_str() {
                "stop" => true,
                n if INTEGER_PARAMETERS.contains(&n) => v.parse::<i64>().is_ok(),
                _ => v.parse::<f64>().is_ok_and(f64::is_finite),
            };
            if !ok {
                return Err(format!("PARAMETER {name} {v}: not a number"));
            }
        }
        Ok(())
    }

    /// The value of a parameter (the last where it is given twice).
    pub fn parameter(&self, name: &str) -> Option<&str> {
        (self.parameters.iter().rev())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Its `num_gpu` PARAMETER (Ollama's layers on GPUs) where it has one:
    /// that many layers, or None for a negative value (as many as fit).
    pub fn num_gpu(&self) -> Option<Option<usize>> {
        let n = self.parameter("num_gpu")?.parse::<i64>().ok()?;
        Some(usize::try_from(n).ok())
    }

    /// Every `stop` sequence.
    pub fn stops(&self) -> Vec<String> {
        (self.parameters.iter())
            .filter(|(n, _)| n == "stop")
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// These instructions over those of `base` (the model this one is
    /// created from): a parameter set here replaces the base's of that
    /// name, SYSTEM and TEMPLATE replace the base's, MESSAGEs replace the
    /// base's where any are given, LICENSEs add to them.
    pub fn over(&self, base: &Modelfile) -> Modelfile {
        let mut parameters: Vec<(String, String)> = (base.parameters.iter())
            .filter(|(n, _)| !self.parameters.iter().any(|(m, _)| m == n))
            .cloned()
            .collect();
        parameters.extend(self.parameters.iter().cloned());
        Modelfile {
            from: self.from.clone(),
            parameters,
            system: self.system.clone().or_else(|| base.system.clone()),
            template: self.template.clone().or_else(|| base.template.clone()),
            license: base.license.iter().chain(&self.license).cloned().collect(),
            messages: if self.messages.is_empty() {
                base.messages.clone()
            } else {
                self.messages.clone()
            },
        }
    }

    /// The parameters as `/api/show` gives them: a line each, name and
    /// value (stop sequences quoted).
    pub fn parameters_text(&self) -> String {
        (self.parameters.iter())
            .map(|(n, v)| match n.as_str() {
                "stop" => format!("{n:<30} {}", Quoted(v)),
                _ => format!("{n:<30} {v}"),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Modelfile text that parses back to this.
    pub fn to_text(&self) -> String {
        let long = |v: &str| {
            if v.contains('\n') && !v.contains("\"\"\"") {
                format!("\"\"\"{v}\"\"\"")
            } else {
                Quoted(v).to_string()
            }
        };
        let mut out = if self.from.contains(|c: char| c.is_whitespace() || c == '"') {
            format!("FROM {}\n", Quoted(&self.from))
        } else {
            format!("FROM {}\n", self.from)
        };
        if let Some(t) = &self.template {
            out += &format!("TEMPLATE {}\n", long(t));
        }
        if let Some(s) = &self.system {
            out += &format!("SYSTEM {}\n", long(s));
        }
        for (n, v) in &self.parameters {
            out += &format!("PARAMETER {n} {}\n", Quoted(v));
        }
        for (role, text) in &self.messages {
            out += &format!("MESSAGE {role} {}\n", long(text));
        }
        for l in &self.license {
            out += &format!("LICENSE {}\n", long(l));
        }
        out
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
    fn text_parses_back_and_layers_merge() {
        let m = Modelfile {
            from: "smollm2:135m".into(),
            parameters: vec![
                ("temperature".into(), "0.2".into()),
                ("stop".into(), "a \"quoted\" \\ stop".into()),
                ("stop".into(), "User:".into()),
            ],
            system: Some("Line one.\nLine \"two\".".into()),
            template: Some("{{ messages }}".into()),
            license: vec!["MIT".into(), "Apache\n2.0".into()],
            messages: vec![
                ("user".into(), "hi".into()),
                ("assistant".into(), "hello\nthere".into()),
            ],
        };
        assert_eq!(
            Modelfile::parse(&m.to_text()).unwrap(),
            m,
            "{}",
            m.to_text()
        );
        assert_eq!(m.parameter("temperature"), Some("0.2"));
        assert_eq!(m.stops(), ["a \"quoted\" \\ stop", "User:"]);
        assert!(m
            .parameters_text()
            .lines()
            .any(|l| l.starts_with("temperature") && l.ends_with(" 0.2")));
        m.check_values().unwrap();
        let mut bad = m.clone();
        bad.template = Some("{{ if .System }}{{ .System }}{{ end }}".into());
        assert!(bad.check_values().unwrap_err().contains("Go template"));
        bad.template = None;
        bad.parameters.push(("top_k".into(), "1.5".into()));
        assert!(bad.check_values().unwrap_err().contains("top_k 1.5"));
        bad.parameters = vec![("temperature".into(), "warm".into())];
        assert!(bad.check_values().is_err());
        // Over a base: parameters by name, text replaced, licenses added.
        let top = Modelfile {
            from: "mario".into(),
            parameters: vec![("stop".into(), "X".into()), ("top_k".into(), "5".into())],
            system: Some("Be brief.".into()),
            license: vec!["more".into()],
            ..Default::default()
        };
        let merged = top.over(&m);
        assert_eq!(merged.from, "mario");
        assert_eq!(
            merged.parameters,
            [
                ("temperature".into(), "0.2".into()),
                ("stop".into(), "X".into()),
                ("top_k".into(), "5".into())
            ]
        );
        assert_eq!(merged.system.as_deref(), Some("Be brief."));
        assert_eq!(merged.template, m.template);
        assert_eq!(merged.messages, m.messages);
        assert_eq!(merged.license, ["MIT", "Apache\n2.0", "more"]);
    }

    #[test]
    fn num_gpu_is_a_layer_count_or_as_many_as_fit() {
        let of = |t: &str| Modelfile::parse(t).unwrap().num_gpu();
        assert_eq!(of("FROM m\nPARAMETER num_gpu 20"), Some(Some(20)));
        assert_eq!(of("FROM m\nPARAMETER num_gpu -1"), Some(None));
        assert_eq!(of("FROM m\nPARAMETER num_ctx 64"), None);
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
