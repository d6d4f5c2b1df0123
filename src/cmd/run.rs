//! `m40-llm run MODEL [PROMPT]`: one-shot generation, or chat without a prompt.

use std::io::Write;

use anyhow::Result;
use m40_llm::chat::{self, ChatOptions};
use m40_llm::client::{self, Client, RemoteChat};
use m40_runtime::{CancelToken, Engine, Message, Prompt, Request, SamplingParams};
use m40_store::Modelfile;
use serde_json::json;

// Negative values after a space (`--temp -1`) are values, so that the
// range check names them, not clap's `-- -1` tip.
#[derive(clap::Args)]
#[command(allow_negative_numbers = true)]
pub struct Args {
    /// A GGUF path or a store name.
    pub model: String,
    /// The prompt; without one, an interactive chat starts. Piped input
    /// (`cat notes.txt | m40-llm run MODEL "summarize"`) comes before it;
    /// all of it is one prompt.
    pub prompt: Option<String>,
    /// Temperature (0 = greedy) [default: 0.8, or a created model's].
    #[arg(long)]
    pub temp: Option<f32>,
    /// [default: 40]
    #[arg(long)]
    pub top_k: Option<usize>,
    /// [default: 0.95]
    #[arg(long)]
    pub top_p: Option<f32>,
    /// [default: 0.05]
    #[arg(long)]
    pub min_p: Option<f32>,
    /// [default: 1.0]
    #[arg(long)]
    pub repeat_penalty: Option<f32>,
    /// Recent tokens the penalties look at [default: 64].
    #[arg(long)]
    pub repeat_last_n: Option<usize>,
    /// [default: 0]
    #[arg(long)]
    pub presence_penalty: Option<f32>,
    /// [default: 0]
    #[arg(long)]
    pub frequency_penalty: Option<f32>,
    /// Random seed (the same seed gives the same output).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Maximum tokens to generate.
    #[arg(short = 'n', long = "num-predict")]
    pub n_predict: Option<usize>,
    /// Stop before this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Send the prompt as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Chat even when stdin is not a terminal: each line is a message, as
    /// typed (without it, piped input is one prompt).
    #[arg(long, conflicts_with = "prompt")]
    pub chat: bool,
    /// After generating, print {"text", "token_ids", "finish_reason", "timings"} on the last line
    /// (in-process: implies --local).
    #[arg(long)]
    pub json: bool,
    /// Context length in tokens (default: the model's, up to 4096; 0: all
    /// the model was made for, which is also the most).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// A system message (chat mode and templated prompts).
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub device: super::DeviceArgs,
    /// Run in this process even when a server (`M40_HOST`, default
    /// 127.0.0.1:11434) has the model loaded.
    #[arg(long)]
    pub local: bool,
}

/// The sampling flags checked as the APIs check them (before any model
/// loads): an error names the flag and its range.
fn check_sampling(opts: &ChatOptions) -> Result<()> {
    opts.sampling.validate().map_err(|e| {
        let flag = match e.name {
            "temperature" => "--temp".to_string(),
            n => format!("--{}", n.replace('_', "-")),
        };
        anyhow::anyhow!("{flag}: {e}")
    })
}

/// A generation stopped by Ctrl-C: the command exits non-zero (130, as a
/// shell reports SIGINT) without an error message.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

/// The prompt: the argument, after whatever was piped into stdin (all of
/// it one prompt); None for a chat (a terminal and no argument).
fn prompt_with_stdin(arg: Option<String>) -> Result<Option<String>> {
    use std::io::{IsTerminal, Read};
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Ok(arg);
    }
    let mut piped = String::new();
    stdin.lock().read_to_string(&mut piped)?;
    let piped = piped.trim_end();
    Ok(match (piped.is_empty(), arg) {
        (true, arg) => arg,
        (false, None) => Some(piped.to_string()),
        (false, Some(a)) => Some(format!("{piped}\n\n{a}")),
    })
}

pub fn run(mut a: Args) -> Result<()> {
    let mf = modelfile_of(&a.model);
    let chat_opts = chat_options(&a, mf.as_ref());
    check_sampling(&chat_opts)?;
    if !a.chat {
        a.prompt = prompt_with_stdin(a.prompt.take())?;
    }
    if !(a.local || a.json || a.device.cpu || a.device.gpu.is_some()) {
        if let Some(client) = Client::probe() {
            match client.serving(&a.model) {
                Ok(Some(name)) => return run_remote(a, client, name, chat_opts),
                Ok(None) => eprintln!(
                    "(the server at {} does not serve {}: running in this process)",
                    client.base(),
                    a.model
                ),
                Err(e) => eprintln!("({e:#}; running in this process)"),
            }
        }
    }
    let path = super::resolve_model(Some(&a.model))?;
    let mut opts = a.device.engine_options(a.ctx.or(param_ctx(mf.as_ref())));
    // A created model's TEMPLATE is the engine's, its num_gpu the layers on
    // GPUs (a flag wins; negative: as many as fit).
    opts.chat_template = mf.as_ref().and_then(|m| m.template.clone());
    if opts.gpu_layers.is_none() && !opts.replicas {
        opts.gpu_layers = mf.as_ref().and_then(|m| m.num_gpu()).flatten();
    }
    let engine = Engine::from_path(&path, opts)?;
    if let Some(why) = engine.backend_note() {
        eprintln!("running on the CPU: {why}");
    }
    if let Some(p) = engine.placement() {
        eprint!("{p}");
    }
    let Some(prompt) = a.prompt else {
        return chat::run(&engine, &chat_opts);
    };
    let prompt = if a.raw {
        Prompt::Text(prompt)
    } else {
        let mut m = Vec::new();
        if let Some(s) = &chat_opts.system {
            m.push(Message::new("system", s.clone()));
        }
        // A created model's MESSAGEs come before the prompt.
        for (role, text) in mf.iter().flat_map(|m| &m.messages) {
            m.push(Message::new(role.clone(), text.clone()));
        }
        m.push(Message::new("user", prompt));
        Prompt::Chat(m)
    };
    let mut req = Request::new(prompt);
    req.sampling = chat_opts.sampling;
    req.max_tokens = chat_opts.max_tokens;
    req.stop = chat_opts.stop;
    let cancel = CancelToken::new();
    chat::cancel_on_ctrl_c(&cancel);
    let stdout = std::io::stdout();
    let mut show = chat::Shown::default();
    let c = engine.generate(&req, &cancel, |ev| {
        let mut out = stdout.lock();
        let _ = out.write_all(show.text(&ev.thinking, &ev.text).as_bytes());
        let _ = out.flush();
    })?;
    println!();
    let t = &c.timings;
    eprintln!(
        "[{}, first token after {:.0} ms, {:?}]",
        chat::rates(
            t.prompt_tokens as u64,
            t.prompt_ms,
            t.generated_tokens as u64,
            t.generation_ms
        ),
        t.time_to_first_token_ms,
        c.finish_reason
    );
    if a.json {
        println!(
            "{}",
            json!({"text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason, "timings": c.timings})
        );
    }
    if c.finish_reason == m40_runtime::FinishReason::Cancelled {
        return Err(Interrupted.into());
    }
    Ok(())
}

/// The options the flags give, over a created model's PARAMETERs and
/// SYSTEM (`m40-llm create`), over the defaults: as the server applies
/// them, so that a created model runs alike in this process and through a
/// server.
fn chat_options(a: &Args, mf: Option<&Modelfile>) -> ChatOptions {
    fn param<T: std::str::FromStr>(mf: Option<&Modelfile>, name: &str) -> Option<T> {
        mf?.parameter(name)?.parse().ok()
    }
    let d = SamplingParams::default();
    ChatOptions {
        sampling: {
            let mut o = SamplingParams::default();
            o.temperature = a.temp.or(param(mf, "temperature")).unwrap_or(d.temperature);
            o.top_k = a.top_k.or(param(mf, "top_k")).unwrap_or(d.top_k);
            o.top_p = a.top_p.or(param(mf, "top_p")).unwrap_or(d.top_p);
            o.min_p = a.min_p.or(param(mf, "min_p")).unwrap_or(d.min_p);
            o.repeat_penalty =
                (a.repeat_penalty.or(param(mf, "repeat_penalty"))).unwrap_or(d.repeat_penalty);
            o.presence_penalty = (a.presence_penalty.or(param(mf, "presence_penalty")))
                .unwrap_or(d.presence_penalty);
            o.frequency_penalty = (a.frequency_penalty.or(param(mf, "frequency_penalty")))
                .unwrap_or(d.frequency_penalty);
            o.penalty_last_n =
                (a.repeat_last_n.or(param(mf, "repeat_last_n"))).unwrap_or(d.penalty_last_n);
            o.seed = a.seed.or(param(mf, "seed"));
            o
        },
        max_tokens: a.n_predict.or(param(mf, "num_predict")),
        system: a.system.clone().or_else(|| mf?.system.clone()),
        stop: match (a.stop.is_empty(), mf) {
            (true, Some(mf)) => mf.stops(),
            _ => a.stop.clone(),
        },
        ..ChatOptions::default()
    }
}

/// A created model's instructions, where `model` names one in the store.
fn modelfile_of(model: &str) -> Option<Modelfile> {
    m40_store::Store::from_env()
        .ok()?
        .manifest(model)
        .ok()??
        .modelfile
}

/// A created model's `num_ctx`.
fn param_ctx(mf: Option<&Modelfile>) -> Option<usize> {
    mf?.parameter("num_ctx")?.parse().ok()
}

/// The same, through a server that has the model loaded as `name` (which
/// applies a created model's instructions itself).
fn run_remote(a: Args, client: Client, name: String, opts: ChatOptions) -> Result<()> {
    eprintln!(
        "(using the server at {}, which has {name} loaded)",
        client.base()
    );
    let Some(prompt) = a.prompt.clone() else {
        let remote = RemoteChat {
            client,
            model: name,
            num_ctx: a.ctx,
        };
        return chat::run(&remote, &opts);
    };
    let options = client::options(&opts, a.ctx);
    let (path, body, field) = if a.raw {
        let body = json!({"model": name, "prompt": prompt, "raw": true, "options": options});
        ("/api/generate", body, "/response")
    } else {
        let mut messages = Vec::new();
        if let Some(s) = &opts.system {
            messages.push(json!({"role": "system", "content": s}));
        }
        messages.push(json!({"role": "user", "content": prompt}));
        let body = json!({"model": name, "messages": messages, "options": options});
        ("/api/chat", body, "/message/content")
    };
    let cancel = CancelToken::new();
    chat::cancel_on_ctrl_c(&cancel);
    let start = std::time::Instant::now();
    let mut first = None;
    let stdout = std::io::stdout();
    let done = client.stream(path, &body, &cancel, &mut |v| {
        if let Some(t) = v.pointer(field).and_then(|t| t.as_str()) {
            first.get_or_insert_with(|| start.elapsed());
            let mut out = stdout.lock();
            let _ = out.write_all(t.as_bytes());
            let _ = out.flush();
        }
    })?;
    println!();
    match done {
        Some(d) => eprintln!("[{}]", client::stats_line(&d, first)),
        None => {
            eprintln!("(stopped)");
            return Err(Interrupted.into());
        }
    }
    Ok(())
}
