//! `tokenize` and `template`.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use m40_gguf::GgufFile;
use m40_tokenizer::template::ChatTemplate;
use m40_tokenizer::{Encode, Tokenizer};
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// A GGUF path or a store name.
    pub model: String,
    /// The text to tokenize (or use --stdin-jsonl).
    pub text: Option<String>,
    /// Treat control tokens written in the text (`<|im_start|>`) as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Add BOS (and EOS) as the model's metadata asks.
    #[arg(long)]
    pub add_bos: bool,
    /// Print `[[id, "piece"], ...]` instead of ids alone.
    #[arg(long)]
    pub pieces: bool,
    /// Read one JSON string per line from stdin; print one JSON array per line.
    #[arg(long, conflicts_with = "text")]
    pub stdin_jsonl: bool,
}

fn load_tokenizer(model: &str) -> Result<Tokenizer> {
    let path = super::resolve_model(Some(model))?;
    let f = GgufFile::open(&path)?;
    Tokenizer::from_gguf(&f).with_context(|| format!("loading the tokenizer of {}", path.display()))
}

pub fn tokenize(a: TokenizeArgs) -> Result<()> {
    let tok = load_tokenizer(&a.model)?;
    let opts = Encode {
        parse_special: !a.no_parse_special,
        add_special: a.add_bos,
    };
    let line = |text: &str| -> Result<String> {
        let ids = tok.encode(text, opts)?;
        let v = if a.pieces {
            Value::Array(
                ids.iter()
                    .map(|&i| json!([i, tok.piece(i).unwrap_or_default()]))
                    .collect(),
            )
        } else {
            json!(ids)
        };
        Ok(v.to_string())
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if a.stdin_jsonl {
        for (n, l) in std::io::stdin().lock().lines().enumerate() {
            let l = l.context("reading stdin")?;
            let text: String = serde_json::from_str(&l)
                .with_context(|| format!("stdin line {}: expected a JSON string", n + 1))?;
            writeln!(out, "{}", line(&text)?)?;
        }
        return Ok(());
    }
    let Some(text) = a.text else {
        bail!("give TEXT or --stdin-jsonl")
    };
    writeln!(out, "{}", line(&text)?)?;
    Ok(())
}

#[derive(clap::Args)]
pub struct TemplateArgs {
    /// A GGUF path or a store name whose tokenizer.chat_template to use.
    #[arg(required_unless_present = "template")]
    pub model: Option<String>,
    /// A Jinja template file instead of the model's.
    #[arg(long, conflicts_with = "model")]
    pub template: Option<PathBuf>,
    /// A JSON file holding the messages: [{"role": ..., "content": ...}, ...].
    #[arg(long)]
    pub messages: PathBuf,
    /// The bos_token string (default: the model's BOS token).
    #[arg(long)]
    pub bos: Option<String>,
    /// The eos_token string (default: the model's EOS token).
    #[arg(long)]
    pub eos: Option<String>,
    /// Leave out the assistant prompt at the end.
    #[arg(long)]
    pub no_generation_prompt: bool,
}

pub fn template(a: TemplateArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.messages)
        .with_context(|| format!("reading {}", a.messages.display()))?;
    let messages: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", a.messages.display()))?;
    if !messages
        .as_array()
        .is_some_and(|m| m.iter().all(Value::is_object))
    {
        bail!(
            "{}: expected a JSON array of message objects",
            a.messages.display()
        );
    }
    let (tmpl, mut opts) = match (&a.template, &a.model) {
        (Some(path), _) => {
            let src = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            (
                ChatTemplate::new(&src)?,
                m40_tokenizer::template::RenderOptions::default(),
            )
        }
        (None, Some(model)) => {
            let tok = load_tokenizer(model)?;
            (tok.chat_template()?, tok.render_options(true))
        }
        (None, None) => bail!("give MODEL or --template"),
    };
    opts.add_generation_prompt = !a.no_generation_prompt;
    if let Some(b) = a.bos {
        opts.bos_token = b;
    }
    if let Some(e) = a.eos {
        opts.eos_token = e;
    }
    let out = tmpl.render(&messages, &opts)?;
    print!("{out}");
    Ok(())
}
