//! Tool calling: the function definitions a request brings, the call syntax
//! each model family was trained on (found in its chat template), and the
//! grammar that forces a call when the request demands one.
//!
//! A template that renders `tools` and writes calls in a syntax known here
//! gets the tools through the template and its calls parsed from that
//! syntax. Any other model gets what llama.cpp's server calls the generic
//! format: the tools described in a system message, and the answer
//! constrained to a JSON object that is either a call or a reply.

use serde_json::{json, Map, Value};

use crate::constraint::Format;

/// One function a request offers, as OpenAI and Ollama send it:
/// `{"type": "function", "function": {"name", "description", "parameters"}}`.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// A JSON schema of the arguments object.
    pub parameters: Value,
    /// The whole definition, for the template's `tools` variable.
    pub definition: Value,
}

/// A `tools` entry that is not a function definition.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("tools[{index}]: {message}")]
pub struct ToolError {
    pub index: usize,
    pub message: String,
}

impl Tool {
    /// The tools of a request's `tools` array.
    pub fn parse_all(tools: &[Value]) -> Result<Vec<Tool>, ToolError> {
        tools
            .iter()
            .enumerate()
            .map(|(index, t)| {
                Tool::parse(t).map_err(|message| ToolError {
                    index,
                    message: message.to_string(),
                })
            })
            .collect()
    }

    fn parse(t: &Value) -> Result<Tool, &'static str> {
        let kind = t.get("type").and_then(Value::as_str).unwrap_or("function");
        if kind != "function" {
            return Err("only tools of type \"function\" are supported");
        }
        let f = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or("a function tool needs a \"function\" object")?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or("a function needs a non-empty \"name\"")?;
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err("a function's \"parameters\" must be a JSON schema object"),
        };
        let mut function = f.clone();
        function.insert("parameters".into(), parameters.clone());
        Ok(Tool {
            name: name.to_string(),
            parameters,
            definition: json!({"type": "function", "function": function}),
        })
    }
}

/// Whether and how the model must call: OpenAI's `tool_choice`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (the default).
    #[default]
    Auto,
    /// No calls: the tools are not shown to the model.
    None,
    /// At least one call.
    Required,
    /// A call of this function.
    Function(String),
}

/// How a model family writes its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    /// Llama 3.1-3.3: `{"name": ..., "parameters": {...}}` as the whole
    /// answer, or after `<|python_tag|>`.
    Llama3,
    /// Qwen2.5, Qwen3, Hermes, Granite 4: `<tool_call>{"name", "arguments"}</tool_call>`.
    Hermes,
    /// Mistral: `[TOOL_CALLS][{"name", "arguments", "id"}]`.
    Mistral,
    /// Mistral Small 3.2 and later: `[TOOL_CALLS]name[ARGS]{...}`.
    MistralArgs,
    /// Granite 3.x: `<|tool_call|>[{"name", "arguments"}]`.
    Granite,
    /// Command R7B: `<|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}]<|END_ACTION|>`.
    CommandR7b,
    /// Command R / R+: "Action: ```json [{"tool_name", "parameters"}] ```".
    CommandR,
    /// gpt-oss (harmony): `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`.
    Harmony,
    /// Any other model: a JSON object, `{"tool_calls": [...]}` or `{"response": "..."}`.
    Generic,
}

impl Syntax {
    /// The syntax `template` (a chat template's source) writes calls in;
    /// [`Syntax::Generic`] where none is recognized.
    pub fn detect(template: &str) -> Syntax {
        let has = |s: &str| template.contains(s);
        if has("<|channel|>") && has("to=") {
            Syntax::Harmony
        } else if has("<|START_ACTION|>") {
            Syntax::CommandR7b
        } else if has("[TOOL_CALLS]") && has("[ARGS]") {
            Syntax::MistralArgs
        } else if has("[TOOL_CALLS]") {
            Syntax::Mistral
        } else if has("<|tool_call|>") {
            Syntax::Granite
        } else if has("<tool_call>") {
            Syntax::Hermes
        } else if has("<|start_header_id|>") && (has("<|python_tag|>") || has("\"parameters\": ")) {
            Syntax::Llama3
        } else if has("Action:") && has("```json") {
            Syntax::CommandR
        } else {
            Syntax::Generic
        }
    }

    /// Whether the model can write more than one call in an answer.
    pub fn parallel(self) -> bool {
        !matches!(self, Syntax::Llama3 | Syntax::Harmony)
    }

    /// The grammar of an answer that is one call (or with `parallel`, one
    /// or more) of `tools` (only `only` where named), arguments valid under
    /// each function's schema. `special` gives a control token's id: the
    /// markers that are control tokens must be written as those tokens.
    pub fn forced(
        self,
        tools: &[Tool],
        only: Option<&str>,
        parallel: bool,
        special: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<Format, String> {
        let tools: Vec<&Tool> = tools
            .iter()
            .filter(|t| only.is_none_or(|n| t.name == n))
            .collect();
        if tools.is_empty() {
            return Err(match only {
                Some(n) => format!("tool_choice names \"{n}\", which is not in tools"),
                None => "tool_choice requires a call, but there are no tools".into(),
            });
        }
        let parallel = parallel && self.parallel();
        let tok = |s: &str| -> Result<String, String> {
            special(s)
                .map(|id| format!("<[{id}]>"))
                .ok_or_else(|| format!("the vocabulary has no {s} token"))
        };
        let lit = |s: &str| Value::from(s).to_string();
        // One call as a JSON object with these keys, per tool.
        let object = |name_key: &str, args_key: &str| {
            let alts: Vec<Value> = tools
                .iter()
                .map(|t| call_schema(name_key, &t.name, args_key, &t.parameters))
                .collect();
            json_rule(&any_of(alts))
        };
        let list = |item: &str| {
            if parallel {
                format!("\"[\" {item} (\", \" {item})* \"]\"")
            } else {
                format!("\"[\" {item} \"]\"")
            }
        };
        let repeat = |one: &str| {
            if parallel {
                format!("({one})+")
            } else {
                one.to_string()
            }
        };
        let start = match self {
            Syntax::Llama3 => object("name", "parameters"),
            Syntax::Hermes => repeat(&format!(
                "\"<tool_call>\\n\" {} \"\\n</tool_call>\"",
                object("name", "arguments")
            )),
            Syntax::Mistral => format!(
                "{} {}",
                tok("[TOOL_CALLS]")?,
                list(&object("name", "arguments"))
            ),
            Syntax::MistralArgs => {
                let (calls, args) = (tok("[TOOL_CALLS]")?, tok("[ARGS]")?);
                let one: Vec<String> = tools
                    .iter()
                    .map(|t| {
                        format!(
                            "{calls} {} {args} {}",
                            lit(&t.name),
                            json_rule(&closed(&t.parameters))
                        )
                    })
                    .collect();
                repeat(&format!("({})", one.join(" | ")))
            }
            Syntax::Granite => format!(
                "{} {}",
                tok("<|tool_call|>")?,
                list(&object("name", "arguments"))
            ),
            Syntax::CommandR7b => format!(
                "{} {} {}",
                tok("<|START_ACTION|>")?,
                list(&object("tool_name", "parameters")),
                tok("<|END_ACTION|>")?
            ),
            Syntax::CommandR => format!(
                "\"Action: ```json\\n\" {} \"\\n```\"",
                list(&object("tool_name", "parameters"))
            ),
            Syntax::Harmony => {
                let (channel, constrain, message) = (
                    tok("<|channel|>")?,
                    tok("<|constrain|>")?,
                    tok("<|message|>")?,
                );
                let one: Vec<String> = tools
                    .iter()
                    .map(|t| {
                        format!(
                            "{channel} {} {constrain} \"json\" {message} {}",
                            lit(&format!("commentary to=functions.{} ", t.name)),
                            json_rule(&closed(&t.parameters))
                        )
                    })
                    .collect();
                one.join(" | ")
            }
            Syntax::Generic => {
                return Ok(Format::JsonSchema(generic_schema(
                    &tools.into_iter().cloned().collect::<Vec<_>>(),
                    parallel,
                    true,
                )))
            }
        };
        Ok(Format::Lark(format!("start: {start}\n")))
    }
}

/// A forced call's arguments: the function's schema, with no arguments
/// beyond those it names unless it says otherwise (as OpenAI's strict mode).
fn closed(parameters: &Value) -> Value {
    let mut p = parameters.clone();
    if let Value::Object(m) = &mut p {
        if m.get("type").and_then(Value::as_str) == Some("object") {
            m.entry("additionalProperties")
                .or_insert(Value::Bool(false));
        }
    }
    p
}

/// `{name_key: name, args_key: arguments}` with the arguments' schema.
fn call_schema(name_key: &str, name: &str, args_key: &str, parameters: &Value) -> Value {
    let mut props = Map::new();
    props.insert(name_key.into(), json!({"const": name}));
    props.insert(args_key.into(), closed(parameters));
    json!({"type": "object", "properties": props, "required": [name_key, args_key],
           "additionalProperties": false})
}

fn any_of(mut alts: Vec<Value>) -> Value {
    if alts.len() == 1 {
        alts.remove(0)
    } else {
        json!({ "anyOf": alts })
    }
}

/// A `%json` rule for `schema`, written compactly as the constraint's JSON
/// mode writes it.
fn json_rule(schema: &Value) -> String {
    let mut s = schema.clone();
    crate::constraint::compact_json(&mut s);
    format!("%json {s}")
}

/// The generic format's schema: `{"tool_calls": [calls]}` (with `parallel`
/// several, otherwise one), or unless `required` also `{"response": text}`.
pub fn generic_schema(tools: &[Tool], parallel: bool, required: bool) -> Value {
    let call = any_of(
        tools
            .iter()
            .map(|t| call_schema("name", &t.name, "arguments", &t.parameters))
            .collect(),
    );
    let mut calls = json!({"type": "array", "items": call, "minItems": 1});
    if !parallel {
        calls["maxItems"] = json!(1);
    }
    let calls = json!({"type": "object", "properties": {"tool_calls": calls},
                       "required": ["tool_calls"], "additionalProperties": false});
    if required {
        return calls;
    }
    let reply = json!({"type": "object", "properties": {"response": {"type": "string"}},
                       "required": ["response"], "additionalProperties": false});
    json!({ "anyOf": [calls, reply] })
}

/// The system message that tells a model without a tool template about
/// the tools and the generic format.
pub fn generic_system_prompt(tools: &[Tool]) -> String {
    let mut s =
        String::from("You can call these functions (JSON schemas of their arguments given):\n");
    for t in tools {
        s.push_str(&t.definition["function"].to_string());
        s.push('\n');
    }
    s.push_str(
        "\nRespond in JSON: either {\"tool_calls\": [{\"name\": function name, \"arguments\": \
         {argument name: value}}]} to call functions, or {\"response\": your reply} to answer \
         the user.",
    );
    s
}
