//! Chat templates: `tokenizer.chat_template` rendered with minijinja the way
//! Hugging Face transformers renders it (Jinja2 sandbox with `trim_blocks`,
//! `lstrip_blocks`, loop controls, Python's `json.dumps` as `tojson`,
//! `raise_exception`, `strftime_now`, Python string and dict methods).

use std::sync::{Arc, Mutex};

use chrono::{Local, NaiveDateTime};
use minijinja::value::{Kwargs, Rest};
use minijinja::{Environment, Error, ErrorKind, State, Value};
use serde::Serialize;

use crate::error::{Result, TokenizerError};

/// The template used when a model carries none: ChatML, which most small
/// instruction-tuned models (SmolLM2, Qwen2) were trained on.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// One chat message, as chat templates read it: `role` and `content`, and
/// for tool use the assistant's `tool_calls` and a tool result's `name` and
/// `tool_call_id`; `thinking` is an assistant's reasoning (templates that
/// keep it read `reasoning_content` or `thinking`). Empty fields are left
/// out, since templates test for them (`'tool_calls' in message`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A tool result's function name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }
}

/// A function call an assistant made, in the shape templates read
/// (OpenAI's): `{"id", "type": "function", "function": {"name",
/// "arguments"}}` with `arguments` an object.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: serde_json::Value,
}

impl ToolCall {
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: serde_json::Value,
    ) -> Self {
        Self {
            id: id.into(),
            kind: "function".into(),
            function: FunctionCall {
                name: name.into(),
                arguments,
            },
        }
    }
}

/// What a rendering needs besides the messages.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    pub add_generation_prompt: bool,
    pub bos_token: String,
    pub eos_token: String,
    /// The time `strftime_now` formats; `None` is the local time now.
    pub now: Option<NaiveDateTime>,
    /// The `tools` variable: OpenAI-shaped function definitions.
    pub tools: Option<serde_json::Value>,
    /// More variables (`enable_thinking`, `reasoning_effort`).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            add_generation_prompt: true,
            bos_token: String::new(),
            eos_token: String::new(),
            now: None,
            tools: None,
            extra: serde_json::Map::new(),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    raised: Arc<Mutex<Option<String>>>,
    now: Arc<Mutex<Option<NaiveDateTime>>>,
}

/// Python's `json.dumps` separators: `", "` and `": "` on one line, `","` and
/// newline-indented with `indent`.
struct PyJson {
    indent: Option<Vec<u8>>,
    depth: usize,
    has_value: bool,
}

impl PyJson {
    fn newline<W: ?Sized + std::io::Write>(&self, w: &mut W) -> std::io::Result<()> {
        if let Some(ind) = &self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.depth {
                w.write_all(ind)?;
            }
        }
        Ok(())
    }

    /// `[` or `{`: one level deeper, nothing in it yet.
    fn open<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        bracket: &[u8],
    ) -> std::io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(bracket)
    }

    /// `]` or `}`, on its own line when indenting a non-empty container.
    fn close<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        bracket: &[u8],
    ) -> std::io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            self.newline(w)?;
        }
        w.write_all(bracket)
    }

    /// Before an array element or an object key.
    fn item<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if !first {
            w.write_all(if self.indent.is_some() { b"," } else { b", " })?;
        }
        self.newline(w)
    }
}

impl serde_json::ser::Formatter for PyJson {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False,
/// indent=indent, sort_keys=sort_keys)`; the result is not HTML-escaped.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.as_bytes().to_vec()),
            None => Some(vec![b' '; i64::try_from(v)?.max(0) as usize]),
        },
    };
    let mut out = Vec::new();
    let fmt = PyJson {
        indent,
        depth: 0,
        has_value: false,
    };
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    let err =
        |e: serde_json::Error| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}"));
    if sort_keys == Some(true) {
        let v: serde_json::Value = serde_json::to_value(&value).map_err(err)?;
        let sorted = sort_json(v);
        sorted.serialize(&mut ser).map_err(err)?;
    } else {
        value.serialize(&mut ser).map_err(err)?;
    }
    let mut s = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    if ensure_ascii == Some(true) {
        s = s
            .chars()
            .map(|c| {
                if c.is_ascii() {
                    c.to_string()
                } else {
                    let mut buf = [0u16; 2];
                    c.encode_utf16(&mut buf)
                        .iter()
                        .map(|u| format!("\\u{u:04x}"))
                        .collect()
                }
            })
            .collect();
    }
    Ok(Value::from_safe_string(s))
}

fn sort_json(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => {
            let mut entries: Vec<_> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_json(v)))
                    .collect(),
            )
        }
        serde_json::Value::Array(a) => {
            serde_json::Value::Array(a.into_iter().map(sort_json).collect())
        }
        other => other,
    }
}

/// Python's `str.format` with positional `{}`/`{0}` and keyword `{name}` fields.
fn py_format(
    template: &str,
    args: &[Value],
    kwargs: Option<&Value>,
) -> std::result::Result<Value, Error> {
    let mut out = String::new();
    let mut auto = 0usize;
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let mut field = String::new();
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                    field.push(c);
                }
                let name = field.split([':', '!']).next().unwrap_or("");
                let v = if name.is_empty() {
                    auto += 1;
                    args.get(auto - 1).cloned()
                } else if let Ok(i) = name.parse::<usize>() {
                    args.get(i).cloned()
                } else {
                    kwargs
                        .and_then(|k| k.get_attr(name).ok())
                        .filter(|v| !v.is_undefined())
                };
                let v = v.ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!("format: no value for {{{field}}}"),
                    )
                })?;
                out.push_str(&v.to_string());
            }
            c => out.push(c),
        }
    }
    Ok(Value::from(out))
}

fn unknown_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, Error> {
    if method == "format" {
        if let Some(s) = value.as_str() {
            let (pos, kw): (Vec<Value>, Option<Value>) = match args.split_last() {
                Some((last, rest)) if last.is_kwargs() => (rest.to_vec(), Some(last.clone())),
                _ => (args.to_vec(), None),
            };
            return py_format(s, &pos, kw.as_ref());
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

impl ChatTemplate {
    /// Compile `source`; a syntax error is [`TokenizerError::TemplateSyntax`].
    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(unknown_method);
        env.add_filter("tojson", tojson);
        // Python: None and undefined are not iterable (minijinja iterates them as empty).
        env.add_test("iterable", |v: Value| {
            !v.is_none()
                && !v.is_undefined()
                && matches!(
                    v.kind(),
                    minijinja::value::ValueKind::Seq
                        | minijinja::value::ValueKind::Map
                        | minijinja::value::ValueKind::String
                        | minijinja::value::ValueKind::Iterable
                )
        });
        let raised = Arc::new(Mutex::new(None));
        let r = raised.clone();
        env.add_function(
            "raise_exception",
            move |msg: String| -> std::result::Result<Value, Error> {
                *r.lock().unwrap_or_else(|e| e.into_inner()) = Some(msg.clone());
                Err(Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        let now: Arc<Mutex<Option<NaiveDateTime>>> = Arc::new(Mutex::new(None));
        let n = now.clone();
        env.add_function(
            "strftime_now",
            move |fmt: String| -> std::result::Result<Value, Error> {
                let t = n
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .unwrap_or_else(|| Local::now().naive_local());
                let mut s = String::new();
                use std::fmt::Write;
                write!(s, "{}", t.format(&fmt)).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!("strftime_now: bad format {fmt:?}"),
                    )
                })?;
                Ok(Value::from(s))
            },
        );
        // `zip` and `range` as Python has them; minijinja has range built in.
        env.add_function(
            "zip",
            |lists: Rest<Value>| -> std::result::Result<Value, Error> {
                let lists: Vec<Vec<Value>> = lists
                    .iter()
                    .map(|l| l.try_iter().map(|i| i.collect()))
                    .collect::<std::result::Result<_, _>>()?;
                let n = lists.iter().map(Vec::len).min().unwrap_or(0);
                Ok(Value::from(
                    (0..n)
                        .map(|i| {
                            Value::from(lists.iter().map(|l| l[i].clone()).collect::<Vec<_>>())
                        })
                        .collect::<Vec<_>>(),
                ))
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| TokenizerError::TemplateSyntax(describe(&e)))?;
        Ok(Self { env, raised, now })
    }

    /// The documented default (ChatML).
    pub fn chatml() -> Self {
        Self::new(CHATML).expect("the ChatML template compiles")
    }

    /// Render a conversation. `messages` is anything that serializes to a list
    /// of objects with at least `role` and `content`.
    pub fn render<M: Serialize>(&self, messages: &M, opts: &RenderOptions) -> Result<String> {
        *self.raised.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) = opts.now;
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TokenizerError::TemplateSyntax(describe(&e)))?;
        let base = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => opts.add_generation_prompt,
            bos_token => opts.bos_token.clone(),
            eos_token => opts.eos_token.clone(),
            tools => opts.tools.as_ref().map_or(Value::from(()), Value::from_serialize),
            documents => Value::from(()),
        };
        // The extra variables are defined only where given (templates test
        // `enable_thinking is defined`).
        let ctx = minijinja::context! { ..Value::from_serialize(&opts.extra), ..base };
        tmpl.render(ctx).map_err(|e| {
            match self.raised.lock().unwrap_or_else(|p| p.into_inner()).take() {
                Some(msg) => TokenizerError::TemplateRaised(msg),
                None => TokenizerError::TemplateRender(describe(&e)),
            }
        })
    }
}

/// An error with its chain and template location, on one line.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!(": {inner}"));
        src = inner.source();
    }
    s
}

impl crate::Tokenizer {
    /// The model's chat template (`tokenizer.chat_template`), or ChatML when
    /// it has none.
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        match &self.vocab().chat_template {
            Some(src) => ChatTemplate::new(src),
            None => Ok(ChatTemplate::chatml()),
        }
    }

    /// Rendering options with this model's BOS and EOS strings.
    pub fn render_options(&self, add_generation_prompt: bool) -> RenderOptions {
        let text = |id: Option<u32>| {
            id.and_then(|i| self.piece(i))
                .unwrap_or_default()
                .to_string()
        };
        RenderOptions {
            add_generation_prompt,
            bos_token: text(self.bos()),
            eos_token: text(self.eos()),
            ..RenderOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, messages: &serde_json::Value) -> Result<String> {
        ChatTemplate::new(src)?.render(messages, &RenderOptions::default())
    }

    #[test]
    fn chatml_default() {
        let m = [
            Message::new("system", "Be brief."),
            Message::new("user", "Hi"),
        ];
        let out = ChatTemplate::chatml()
            .render(&m, &RenderOptions::default())
            .unwrap();
        assert_eq!(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        let out = ChatTemplate::chatml()
            .render(
                &m,
                &RenderOptions {
                    add_generation_prompt: false,
                    ..Default::default()
                },
            )
            .unwrap();
        assert!(out.ends_with("Hi<|im_end|>\n"));
    }

    #[test]
    fn raise_exception_carries_its_message() {
        let e = render(
            "{{ raise_exception('roles must alternate') }}",
            &serde_json::json!([]),
        )
        .unwrap_err();
        assert!(
            matches!(&e, TokenizerError::TemplateRaised(m) if m == "roles must alternate"),
            "{e}"
        );
    }

    #[test]
    fn syntax_and_render_errors_are_distinguished() {
        assert!(matches!(
            ChatTemplate::new("{% for %}"),
            Err(TokenizerError::TemplateSyntax(_))
        ));
        assert!(matches!(
            ChatTemplate::new("{% generation %}x{% endgeneration %}"),
            Err(TokenizerError::TemplateSyntax(_))
        ));
        let e = render(
            "{{ messages[0].content.nope() }}",
            &serde_json::json!([{"role": "user", "content": "x"}]),
        )
        .unwrap_err();
        assert!(matches!(e, TokenizerError::TemplateRender(_)), "{e}");
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        let m = serde_json::json!([{"role": "user", "content": "é <b> & \"q\"", "n": [1, 2.5, true, null]}]);
        let out = render("{{ messages[0] | tojson }}", &m).unwrap();
        assert_eq!(
            out,
            r#"{"role": "user", "content": "é <b> & \"q\"", "n": [1, 2.5, true, null]}"#
        );
        let out = render("{{ messages[0].n | tojson(indent=2) }}", &m).unwrap();
        assert_eq!(out, "[\n  1,\n  2.5,\n  true,\n  null\n]");
        let out = render("{{ messages[0].content | tojson(ensure_ascii=true) }}", &m).unwrap();
        assert_eq!(out, r#""\u00e9 <b> & \"q\"""#);
        let out = render("{{ {'b': 1, 'a': {}} | tojson(sort_keys=true) }}", &m).unwrap();
        assert_eq!(out, r#"{"a": {}, "b": 1}"#);
    }

    #[test]
    fn python_methods_and_strftime() {
        let m = serde_json::json!([{"role": "user", "content": "  a,b  "}]);
        let out = render("{{ messages[0].content.strip().split(',') | join('|') }} {{ '{}-{x}'.format(1, x=2) }}", &m).unwrap();
        assert_eq!(out, "a|b 1-2");
        let t = ChatTemplate::new("{{ strftime_now('%d %b %Y') }}").unwrap();
        let now = chrono::NaiveDate::from_ymd_opt(2026, 1, 2)
            .unwrap()
            .and_hms_opt(3, 4, 5)
            .unwrap();
        assert_eq!(
            t.render(
                &m,
                &RenderOptions {
                    now: Some(now),
                    ..Default::default()
                }
            )
            .unwrap(),
            "02 Jan 2026"
        );
    }
}
