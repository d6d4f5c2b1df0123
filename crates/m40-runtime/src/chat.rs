//! Chat prompts: a conversation rendered with the model's template, with
//! its tools where the template shows them and in the generic format where
//! it does not; and the plan for taking the answer apart (thinking, calls).

use m40_chat::output::parse_generic;
use m40_chat::tools::{generic_schema, generic_system_prompt};
use m40_chat::{Format, FormatError, OutputParser, Parsed, Syntax, Thinking, Tool, ToolChoice};
use m40_tokenizer::template::{ChatTemplate, RenderOptions};
use m40_tokenizer::{Message, Tokenizer};
use serde_json::json;

use crate::request::{Request, Think};

/// A chat prompt that cannot be made: the template failed, or the tools
/// cannot be offered as asked.
#[derive(Debug)]
pub(crate) enum RenderError {
    Template(m40_tokenizer::TokenizerError),
    Format(FormatError),
    /// Thinking asked of a model that does not think.
    NoThinking,
}

impl From<m40_tokenizer::TokenizerError> for RenderError {
    fn from(e: m40_tokenizer::TokenizerError) -> Self {
        Self::Template(e)
    }
}

impl From<FormatError> for RenderError {
    fn from(e: FormatError) -> Self {
        Self::Format(e)
    }
}

type Result<T> = std::result::Result<T, RenderError>;

/// What a model's templates do with tools and thinking (found once, at load).
pub(crate) struct ChatFormat {
    template: ChatTemplate,
    source: String,
    /// `tokenizer.chat_template.tool_use`, where the model has a separate
    /// template for requests with tools (Command R+, Hermes 2 Pro).
    tool_template: Option<ChatTemplate>,
    /// The syntax of calls where a template renders tools; Generic where
    /// none does, or where it writes calls in a syntax not known here.
    syntax: Syntax,
    thinking: Option<Thinking>,
}

/// How one request's answer is taken apart.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    /// Calls to look for (the request has tools).
    calls: Option<Syntax>,
    thinking: Option<Thinking>,
    /// The prompt opened the thinking block.
    in_thinking: bool,
    /// Thinking was turned off: what the model writes as reasoning anyway
    /// is dropped.
    drop_thinking: bool,
}

/// A probe tool, to see whether a template renders `tools`.
const PROBE: &str = "m40_probe_function";

fn renders_tools(t: &ChatTemplate, opts: &RenderOptions) -> bool {
    let mut o = opts.clone();
    o.tools = Some(json!([{"type": "function", "function": {"name": PROBE,
        "description": "probe", "parameters": {"type": "object", "properties": {
            "x": {"type": "string", "description": "probe"}}, "required": ["x"]}}}]));
    t.render(&vec![Message::new("user", "hi")], &o)
        .is_ok_and(|s| s.contains(PROBE))
}

/// Whether a model's templates show tools (its own syntax known here) and
/// mark reasoning: Ollama's "tools" and "thinking" capabilities.
pub(crate) fn capabilities(source: &str, tool_use: Option<&str>) -> (bool, bool) {
    let opts = RenderOptions::default();
    let tools = ChatTemplate::new(source)
        .is_ok_and(|t| ChatFormat::with(t, source, tool_use, &opts).native_tools());
    (tools, Thinking::detect(source).is_some())
}

impl ChatFormat {
    pub fn new(
        template: ChatTemplate,
        source: &str,
        tool_use: Option<&str>,
        tok: &Tokenizer,
    ) -> Self {
        Self::with(template, source, tool_use, &tok.render_options(true))
    }

    fn with(
        template: ChatTemplate,
        source: &str,
        tool_use: Option<&str>,
        opts: &RenderOptions,
    ) -> Self {
        let tool_template = tool_use.and_then(|s| ChatTemplate::new(s).ok());
        let (tsrc, t) = match (&tool_template, tool_use) {
            (Some(t), Some(src)) => (src, t),
            _ => (source, &template),
        };
        let syntax = if renders_tools(t, opts) {
            Syntax::detect(tsrc)
        } else {
            Syntax::Generic
        };
        Self {
            thinking: Thinking::detect(source),
            source: source.to_string(),
            template,
            tool_template,
            syntax,
        }
    }

    /// Whether the model's own template shows tools (Ollama's `tools`
    /// capability; any model can call them in the generic format).
    pub fn native_tools(&self) -> bool {
        self.syntax != Syntax::Generic
    }

    /// How the model marks its reasoning, where it does.
    pub fn thinking(&self) -> Option<Thinking> {
        self.thinking
    }

    /// The template's source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render `req`'s conversation: the prompt, how to read the answer, and
    /// the format forced calls need.
    pub fn render(
        &self,
        messages: &[Message],
        req: &Request,
        mut opts: RenderOptions,
        tok: &Tokenizer,
    ) -> Result<(String, Plan, Option<Format>)> {
        let tools = (!req.tools.is_empty() && req.tool_choice != ToolChoice::None)
            .then_some(&req.tools[..]);
        let mut plan = Plan {
            thinking: self.thinking,
            ..Plan::default()
        };
        match &req.think {
            None => {}
            Some(Think::Off) => {
                opts.extra.insert("enable_thinking".into(), false.into());
                plan.drop_thinking = true;
            }
            Some(_) if self.thinking.is_none() => return Err(RenderError::NoThinking),
            Some(Think::On) => {
                opts.extra.insert("enable_thinking".into(), true.into());
            }
            Some(Think::Effort(e)) => {
                opts.extra.insert("enable_thinking".into(), true.into());
                opts.extra
                    .insert("reasoning_effort".into(), e.as_str().into());
            }
        }
        opts.extra.extend(req.template_vars.clone());
        let Some(tools) = tools else {
            let text = self.template.render(&messages, &opts)?;
            plan.in_thinking = opens_thinking(&text, self.thinking);
            return Ok((text, plan, req.format.clone()));
        };
        if req.format.is_some() {
            return Err(FormatError::Unsupported(
                "a structured output and tools cannot be asked for together; \
                 leave out one, or set tool_choice to none"
                    .into(),
            )
            .into());
        }
        let only = match &req.tool_choice {
            ToolChoice::Function(n) => Some(n.as_str()),
            _ => None,
        };
        if let Some(n) = only {
            if !tools.iter().any(|t| t.name == n) {
                return Err(FormatError::Unsupported(format!(
                    "tool_choice names the function \"{n}\", which is not in tools"
                ))
                .into());
            }
        }
        let forced = matches!(
            req.tool_choice,
            ToolChoice::Required | ToolChoice::Function(_)
        );
        let parallel = req.parallel_tool_calls;
        if self.syntax == Syntax::Generic {
            // The tools in a system message, the answer a JSON object.
            let mut messages = messages.to_vec();
            let note = generic_system_prompt(tools);
            match messages.first_mut() {
                Some(m) if m.role == "system" => m.content = format!("{}\n\n{note}", m.content),
                _ => messages.insert(0, Message::new("system", note)),
            }
            let messages: Vec<Message> = messages.into_iter().map(generic_history).collect();
            let text = self.template.render(&messages, &opts)?;
            let offered: Vec<Tool> = tools
                .iter()
                .filter(|t| only.is_none_or(|n| t.name == n))
                .cloned()
                .collect();
            plan.calls = Some(Syntax::Generic);
            plan.thinking = None;
            let schema = generic_schema(&offered, parallel, forced);
            return Ok((text, plan, Some(Format::JsonSchema(schema))));
        }
        opts.tools = Some(json!(tools
            .iter()
            .map(|t| &t.definition)
            .collect::<Vec<_>>()));
        let t = self.tool_template.as_ref().unwrap_or(&self.template);
        let text = t.render(&messages, &opts)?;
        plan.calls = Some(self.syntax);
        plan.in_thinking = opens_thinking(&text, self.thinking);
        let format = if forced {
            let special = |s: &str| tok.token_id(s);
            let f = self
                .syntax
                .forced(tools, only, parallel, &special)
                .map_err(FormatError::Unsupported)?;
            Some(f)
        } else {
            None
        };
        Ok((text, plan, format))
    }
}

/// In the generic format, past calls and results are shown as the model
/// was asked to write them: JSON in the assistant's turn, results as user
/// turns (templates without tools have no tool role).
fn generic_history(m: Message) -> Message {
    if !m.tool_calls.is_empty() {
        let calls: Vec<_> = m
            .tool_calls
            .iter()
            .map(|c| json!({"name": c.function.name, "arguments": c.function.arguments}))
            .collect();
        return Message::new("assistant", json!({ "tool_calls": calls }).to_string());
    }
    if m.role == "tool" {
        let name = m.name.as_deref().unwrap_or("the function");
        return Message::new("user", format!("The result of {name}: {}", m.content));
    }
    m
}

/// Whether a prompt ends inside an opened thinking block (templates that
/// write `<think>` into the generation prompt).
fn opens_thinking(prompt: &str, thinking: Option<Thinking>) -> bool {
    thinking == Some(Thinking::Tags) && prompt.trim_end().ends_with("<think>")
}

/// Takes a running answer apart as the plan says.
pub(crate) struct Reader {
    how: How,
    drop_thinking: bool,
}

enum How {
    Parse(Box<OutputParser>),
    /// The generic format: the whole answer is one JSON object.
    Generic(String),
}

impl Plan {
    /// Whether the answer needs reading at all (otherwise it is all content).
    pub fn reader(&self) -> Option<Reader> {
        let how = match (self.calls, self.thinking) {
            (Some(Syntax::Generic), _) => How::Generic(String::new()),
            (None, None) => return None,
            (calls, thinking) => How::Parse(Box::new(OutputParser::new(
                calls,
                thinking,
                self.in_thinking,
            ))),
        };
        Some(Reader {
            how,
            drop_thinking: self.drop_thinking,
        })
    }
}

impl Reader {
    pub fn push(&mut self, text: &str) -> Parsed {
        let p = match &mut self.how {
            How::Parse(p) => p.push(text),
            How::Generic(all) => {
                all.push_str(text);
                Parsed::default()
            }
        };
        self.kept(p)
    }

    pub fn finish(&mut self) -> Parsed {
        let p = match &mut self.how {
            How::Parse(p) => p.finish(),
            How::Generic(all) => parse_generic(&std::mem::take(all)),
        };
        self.kept(p)
    }

    fn kept(&self, mut p: Parsed) -> Parsed {
        if self.drop_thinking {
            p.thinking.clear();
        }
        p
    }
}
