//! Tool calls through the real chat templates of ../shared/testdata: each
//! family's template renders an assistant's call, and the parser of the
//! syntax detected from that template reads it back.

use std::path::PathBuf;

use m40_chat::output::{parse_all, OutputParser};
use m40_chat::{Parsed, Syntax, Thinking, Tool, ToolCall};
use m40_tokenizer::template::{ChatTemplate, RenderOptions};
use m40_tokenizer::Message;
use serde_json::json;

fn templates() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/templates");
    if d.is_dir() {
        Some(d)
    } else {
        eprintln!("skipped: ../shared/testdata/templates is absent");
        None
    }
}

fn weather() -> Vec<Tool> {
    Tool::parse_all(&[json!({"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "days": {"type": "integer", "description": "How many days ahead"}},
            "required": ["city"]}}})])
    .unwrap()
}

fn opts(tools: &[Tool], gen: bool) -> RenderOptions {
    RenderOptions {
        add_generation_prompt: gen,
        bos_token: "<s>".into(),
        eos_token: "</s>".into(),
        tools: Some(json!(tools
            .iter()
            .map(|t| t.definition.clone())
            .collect::<Vec<_>>())),
        ..RenderOptions::default()
    }
}

/// What `template` renders for the assistant's turn that calls `calls`:
/// the conversation with the call, less the conversation before it with
/// the generation prompt.
fn rendered_call(src: &str, calls: &[ToolCall]) -> Result<String, String> {
    let t = ChatTemplate::new(src).map_err(|e| e.to_string())?;
    let tools = weather();
    let user = Message::new("user", "What is the weather in Paris?");
    let prompt = t
        .render(&vec![user.clone()], &opts(&tools, true))
        .map_err(|e| e.to_string())?;
    let mut asst = Message::new("assistant", "");
    asst.tool_calls = calls.to_vec();
    let full = t
        .render(&vec![user, asst], &opts(&tools, false))
        .map_err(|e| e.to_string())?;
    let call = full.strip_prefix(&prompt).map(|c| {
        // A model's answer ends at its end-of-turn token, which the engine
        // does not pass on.
        let end = TURN_ENDS
            .iter()
            .filter_map(|e| c.find(e))
            .min()
            .unwrap_or(c.len());
        c[..end].to_string()
    });
    call.ok_or_else(|| {
        format!("the call's rendering does not extend the prompt:\n{prompt}\n---\n{full}")
    })
}

const TURN_ENDS: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "</s>",
    "<|end_of_text|>",
    "<|END_OF_TURN_TOKEN|>",
    "<|call|>",
    "<|return|>",
    "<|endoftext|>",
];

const FAMILIES: &[(&str, Syntax)] = &[
    ("meta-llama-Llama-3.1-8B-Instruct", Syntax::Llama3),
    ("meta-llama-Llama-3.2-3B-Instruct", Syntax::Llama3),
    ("meta-llama-Llama-3.3-70B-Instruct", Syntax::Llama3),
    ("Qwen-Qwen3-0.6B", Syntax::Hermes),
    ("Qwen3-Coder", Syntax::Hermes),
    ("Qwen3.5-4B", Syntax::Hermes),
    (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
        Syntax::Hermes,
    ),
    (
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
        Syntax::Hermes,
    ),
    ("ibm-granite-granite-4.0", Syntax::Hermes),
    ("Mistral-Small-3.2-24B-Instruct-2506", Syntax::MistralArgs),
    (
        "mistralai-Ministral-3-14B-Reasoning-2512",
        Syntax::MistralArgs,
    ),
    (
        "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
        Syntax::CommandR7b,
    ),
    ("openai-gpt-oss-120b", Syntax::Harmony),
];

#[test]
fn every_family_reads_back_the_calls_its_template_writes() {
    let Some(dir) = templates() else { return };
    for (name, syntax) in FAMILIES {
        let src = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
        assert_eq!(Syntax::detect(&src), *syntax, "{name}");
        let call = ToolCall::new(
            "abcDEF123",
            "get_weather",
            json!({"city": "Paris", "days": 2}),
        );
        let text = rendered_call(&src, std::slice::from_ref(&call))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut p = OutputParser::new(Some(*syntax), Thinking::detect(&src), false);
        let got = parse_all(&mut p, &text);
        assert_eq!(got.calls.len(), 1, "{name}: {text:?} gave {got:?}");
        assert_eq!(got.calls[0].function, call.function, "{name}: {text:?}");
        // The content is at most the turn's end marker.
        assert!(
            got.content.trim().len() <= 24,
            "{name}: content {:?} from {text:?}",
            got.content
        );
    }
}

/// Granite 3.x's and Command R+'s templates do not render past calls, so
/// their syntax is read from what the templates tell the model to write.
#[test]
fn templates_that_describe_their_syntax() {
    let Some(dir) = templates() else { return };
    let cases = [
        ("ibm-granite-granite-3.3-2B-Instruct", Syntax::Granite, "respond only with <|tool_call|> followed by a JSON list of tools used",
         "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}]"),
        ("CohereForAI-c4ai-command-r-plus-tool_use", Syntax::CommandR, "Write \\'Action:\\' followed by a json-formatted list of actions",
         "Action: ```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n        \"parameters\": {\"city\": \"Paris\", \"days\": 2}\n    }\n]\n```"),
    ];
    for (name, syntax, instruction, answer) in cases {
        let src = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
        assert!(
            src.contains(instruction),
            "{name} no longer says {instruction:?}"
        );
        assert_eq!(Syntax::detect(&src), syntax, "{name}");
        let got = parse_all(
            &mut OutputParser::new(Some(syntax), Thinking::detect(&src), false),
            answer,
        );
        assert_eq!(got.calls.len(), 1, "{name}: {got:?}");
        assert_eq!(got.calls[0].function.name, "get_weather");
        assert_eq!(
            got.calls[0].function.arguments,
            json!({"city": "Paris", "days": 2})
        );
        assert_eq!(got.content, "", "{name}");
    }
}

/// Answers as models write them (control tokens written out), and what
/// the parser must make of them.
fn cases() -> Vec<(Option<Syntax>, Option<Thinking>, &'static str, Parsed)> {
    let call = |name: &str, args: serde_json::Value| ToolCall::new("", name, args);
    let p = |content: &str, thinking: &str, calls: Vec<ToolCall>| Parsed {
        content: content.into(),
        thinking: thinking.into(),
        calls,
    };
    vec![
        // Qwen3: thinking, then text and two calls.
        (Some(Syntax::Hermes), Some(Thinking::Tags),
         "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": \\\"CET\\\"}\"}\n</tool_call>",
         p("Let me check.\n\n", "\nThe user wants weather.\n",
           vec![call("get_weather", json!({"city": "Paris"})), call("get_time", json!({"zone": "CET"}))])),
        // Thinking without tools; `<` that is no marker stays text.
        (None, Some(Thinking::Tags), "<think>a < b</think>\n\nx <b>bold</b> <thin", p("x <b>bold</b> <thin", "a < b", vec![])),
        // A call that does not parse is text, as written.
        (Some(Syntax::Hermes), None, "<tool_call>\n{\"name\": oops}\n</tool_call> done",
         p("<tool_call>\n{\"name\": oops}\n</tool_call> done", "", vec![])),
        // Llama 3: bare JSON, or after <|python_tag|>; JSON that is no call is text.
        (Some(Syntax::Llama3), None, "  {\"name\": \"f\", \"parameters\": {}}", p("", "", vec![call("f", json!({}))])),
        (Some(Syntax::Llama3), None, "<|python_tag|>{\"type\": \"function\", \"name\": \"f\", \"parameters\": {\"a\": 1}}",
         p("", "", vec![call("f", json!({"a": 1}))])),
        (Some(Syntax::Llama3), None, "{\"answer\": 42}", p("{\"answer\": 42}", "", vec![])),
        (Some(Syntax::Llama3), None, "The answer: {\"name\": \"f\"}", p("The answer: {\"name\": \"f\"}", "", vec![])),
        // Mistral's list with ids, and the [ARGS] form twice.
        (Some(Syntax::Mistral), None, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"abc123XYZ\"}]",
         p("", "", vec![ToolCall::new("abc123XYZ", "f", json!({"a": 1}))])),
        (Some(Syntax::MistralArgs), None, "[TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]g[ARGS]{}",
         p("", "", vec![call("f", json!({"a": 1})), call("g", json!({}))])),
        // Command R7B: plan, action, response markers gone.
        (Some(Syntax::CommandR7b), Some(Thinking::CommandR),
         "<|START_THINKING|>plan<|END_THINKING|><|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"f\", \"parameters\": {}}]<|END_ACTION|>",
         p("", "plan", vec![call("f", json!({}))])),
        (None, Some(Thinking::CommandR), "<|START_RESPONSE|>Hi there<|END_RESPONSE|>", p("Hi there", "", vec![])),
        // gpt-oss: analysis, then a call (recipient after the channel), or a final answer.
        (Some(Syntax::Harmony), Some(Thinking::Harmony),
         "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}",
         p("", "Need weather.", vec![call("get_weather", json!({"city": "Oslo"}))])),
        (None, Some(Thinking::Harmony),
         "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
         p("Hello!", "Simple.", vec![])),
    ]
}

/// Ids are fresh (but for the one the model wrote); compare the rest.
fn without_ids(mut p: Parsed) -> Parsed {
    for c in &mut p.calls {
        if c.id != "abc123XYZ" {
            assert!(c.id.len() == 9 || c.id.starts_with("call_"), "{}", c.id);
            c.id.clear();
        }
    }
    p
}

#[test]
fn answers_are_taken_apart() {
    for (calls, think, text, want) in cases() {
        let got = parse_all(&mut OutputParser::new(calls, think, false), text);
        assert_eq!(without_ids(got), want, "{text:?}");
    }
    // The generic format: calls, a reply, a cut answer's whole calls.
    use m40_chat::output::parse_generic;
    let g = parse_generic("{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"a\": 1}}]}");
    assert_eq!(g.calls[0].function.arguments, json!({"a": 1}));
    assert_eq!(parse_generic("{\"response\": \"Hi!\"}").content, "Hi!");
    let cut = parse_generic(
        "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"argu",
    );
    assert_eq!((cut.calls.len(), cut.content.as_str()), (1, ""));
    assert_eq!(parse_generic("not json").content, "not json");
    // A prompt that opened the thinking block: the answer starts inside it.
    let got = parse_all(
        &mut OutputParser::new(None, Some(Thinking::Tags), true),
        "hmm</think>\n\nYes.",
    );
    assert_eq!(got.thinking, "hmm");
    assert_eq!(got.content, "Yes.");
}

proptest::proptest! {
    /// Streamed in pieces cut anywhere (even inside markers and
    /// characters' bytes are never split: cuts are at char boundaries),
    /// an answer parses as it does whole.
    #[test]
    fn streaming_in_any_pieces_parses_the_same(case in 0usize..13, cuts in proptest::collection::vec(0usize..400, 0..12)) {
        let all = cases();
        let (calls, think, text, want) = &all[case % all.len()];
        let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c % (text.len() + 1)).filter(|&c| text.is_char_boundary(c)).collect();
        bounds.push(0);
        bounds.push(text.len());
        bounds.sort_unstable();
        let mut p = OutputParser::new(*calls, *think, false);
        let mut got = Parsed::default();
        for w in bounds.windows(2) {
            let piece = p.push(&text[w[0]..w[1]]);
            got.content.push_str(&piece.content);
            got.thinking.push_str(&piece.thinking);
            got.calls.extend(piece.calls);
        }
        let rest = p.finish();
        got.content.push_str(&rest.content);
        got.thinking.push_str(&rest.thinking);
        got.calls.extend(rest.calls);
        proptest::prop_assert_eq!(&without_ids(got), want, "{:?}", text);
    }
}
