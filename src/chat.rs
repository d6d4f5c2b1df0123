//! An interactive, multi-turn chat in the terminal with streaming output,
//! in-process or through a running server. Ctrl-C stops the answer being
//! written (not the program). Ollama's commands: `/?` (help), `/set
//! parameter NAME VALUE`, `/set system TEXT`, `/show info`, `/show
//! parameters`, `/clear` (or `/reset`), `/bye` (or `/exit`, end of input).

use std::io::{BufRead, Write};

use anyhow::Result;
use m40_runtime::{CancelToken, Engine, FinishReason, Message, Prompt, Request, SamplingParams};

/// Settings of a chat session.
#[derive(Clone, Debug, Default)]
pub struct ChatOptions {
    pub sampling: SamplingParams,
    pub max_tokens: Option<usize>,
    pub system: Option<String>,
    pub stop: Vec<String>,
    /// A smaller context (`/set parameter num_ctx`).
    pub num_ctx: Option<usize>,
    /// Answers as JSON (`/set format json`).
    pub json: bool,
    /// Thinking on or off (`/set think`, `/set nothink`).
    pub think: Option<m40_runtime::Think>,
    /// No figures after each answer (`/set quiet`; `/set verbose` shows them).
    pub quiet: bool,
}

/// One answer.
pub struct Turn {
    pub text: String,
    /// Stopped by Ctrl-C.
    pub cancelled: bool,
    /// Figures for the user: tokens and rates.
    pub stats: String,
}

/// What answers a conversation: an [`Engine`] here, or a server
/// ([`crate::client::RemoteChat`]).
pub trait ChatBackend {
    /// Where the chat runs and what model: the first line of a chat, and
    /// `/show info`.
    fn describe(&self) -> Vec<String>;
    /// The model's chat template, license or Modelfile (`/show`), where
    /// known.
    fn model_text(&self, what: &str) -> Option<String>;
    /// Answer the conversation so far, streaming text into `on_text`.
    fn answer(
        &self,
        history: &[Message],
        opts: &ChatOptions,
        cancel: &CancelToken,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Turn>;
}

impl ChatBackend for Engine {
    fn model_text(&self, what: &str) -> Option<String> {
        let info = self.info();
        let md = self.model_file().metadata();
        match what {
            "template" => Some(info.chat_template),
            "license" => md
                .opt_str("general.license")
                .ok()
                .flatten()
                .map(str::to_string),
            "modelfile" => Some(format!(
                "FROM {}\nTEMPLATE \"\"\"{}\"\"\"\n",
                info.path.display(),
                info.chat_template
            )),
            _ => None,
        }
    }

    fn describe(&self) -> Vec<String> {
        let h = self.hparams();
        let f = self.model_file();
        let mut lines = vec![
            format!("running on the {} (in this process)", self.backend_name()),
            format!(
                "model: {} ({}, {:.0}M parameters, {} layers, d={})",
                f.path().display(),
                f.architecture().unwrap_or("unknown"),
                f.n_params() as f64 / 1e6,
                h.n_layer,
                h.n_embd
            ),
            format!(
                "context: {} tokens (made for {})",
                self.n_ctx(),
                h.max_context()
            ),
        ];
        if let Some(why) = self.backend_note() {
            lines.insert(1, format!("not on the GPU: {why}"));
        }
        lines
    }

    fn answer(
        &self,
        history: &[Message],
        opts: &ChatOptions,
        cancel: &CancelToken,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Turn> {
        let mut req = Request::new(Prompt::Chat(history.to_vec()));
        req.sampling = opts.sampling.clone();
        req.max_tokens = opts.max_tokens;
        req.stop = opts.stop.clone();
        req.context = opts.num_ctx;
        req.think = opts.think.clone();
        req.format = opts.json.then_some(m40_runtime::Format::Json);
        // A conversation that outgrew the context loses its oldest turns
        // (after the system message), as Ollama's does, and says so; a last
        // message that alone does not fit loses its start.
        req.drop_old_turns = true;
        req.truncate_prompt = true;
        let prepared = self.prepare(req)?;
        if prepared.dropped_messages() > 0 {
            eprintln!(
                "[the context is full: the oldest {} messages are left out]",
                prepared.dropped_messages()
            );
        }
        // The history keeps only the answer.
        let mut show = Shown::default();
        let mut run = self.start(&prepared, cancel);
        for ev in &mut run {
            on_text(&show.text(&ev.thinking, &ev.text));
        }
        let c = run.finish()?;
        Ok(Turn {
            cancelled: c.finish_reason == FinishReason::Cancelled,
            stats: rates(
                c.timings.prompt_tokens as u64,
                c.timings.prompt_ms,
                c.timings.generated_tokens as u64,
                c.timings.generation_ms,
            ),
            text: c.text,
        })
    }
}

/// What the terminal shows of a streamed answer: a model's reasoning
/// before the answer, as Ollama's CLI shows it.
#[derive(Default)]
pub struct Shown {
    thinking: bool,
}

impl Shown {
    /// The terminal text of a piece of reasoning and answer.
    pub fn text(&mut self, thinking: &str, text: &str) -> String {
        let mut s = String::new();
        if !thinking.is_empty() {
            if !self.thinking {
                s.push_str("Thinking...\n");
                self.thinking = true;
            }
            s.push_str(thinking);
        }
        if self.thinking && !text.is_empty() {
            s.push_str("\n...done thinking.\n\n");
            self.thinking = false;
        }
        s.push_str(text);
        s
    }
}

/// The figures every answer reports: counts, and rates where they mean
/// something (a rate over less than a millisecond, or of nothing, does not).
pub fn rates(prompt: u64, prompt_ms: f64, generated: u64, generated_ms: f64) -> String {
    let part = |n: u64, ms: f64, what: &str| {
        if n == 0 || ms < 1.0 {
            format!("{n} {what}")
        } else {
            format!("{n} {what} at {:.1} t/s", n as f64 / (ms / 1e3))
        }
    };
    format!(
        "{}, {}",
        part(prompt, prompt_ms, "prompt tokens"),
        part(generated, generated_ms, "generated")
    )
}

/// Install a Ctrl-C handler that cancels `cancel` (once per process).
pub fn cancel_on_ctrl_c(cancel: &CancelToken) {
    let c = cancel.clone();
    // A second handler cannot be installed; the first keeps working.
    let _ = ctrlc::set_handler(move || c.cancel());
}

const HELP: &str = "\
Commands:
  /set parameter NAME VALUE   temperature, top_k, top_p, min_p, repeat_penalty,
                              repeat_last_n, presence_penalty, frequency_penalty,
                              seed, num_predict, stop (repeat /set to add stops)
                              num_ctx (a smaller context)
  /set system TEXT            a system message (starts the conversation over)
  /set format json            answers as JSON (/set noformat: free text)
  /set think, /set nothink    thinking on or off (models that think)
  /set verbose, /set quiet    figures after each answer, or not
  /set nowordwrap             (m40-llm never wraps words)
  /show info                  the model and where it runs
  /show parameters            the sampling settings in use
  /show system|template|modelfile|license
  \"\"\"                         begins and ends a message of several lines
  /clear                      start the conversation over (also /reset)
  /bye                        quit (also /exit, Ctrl-D)
  /?                          this help
Ctrl-C stops an answer.";

/// What a command line asks the loop to do.
#[derive(Debug, PartialEq)]
enum Action {
    /// Print this (help, settings, info, a confirmation or an error).
    Say(String),
    /// Start the conversation over, saying this.
    Clear(String),
    Quit,
}

/// Apply `/set parameter NAME VALUE` to `opts`; the settings are checked as
/// the APIs check them.
fn set_parameter(opts: &mut ChatOptions, name: &str, value: &str) -> Result<String, String> {
    let float = || -> Result<f32, String> {
        value
            .parse::<f32>()
            .map_err(|_| format!("{name} takes a number, not `{value}`"))
    };
    let int = || -> Result<i64, String> {
        value
            .parse::<i64>()
            .map_err(|_| format!("{name} takes an integer, not `{value}`"))
    };
    let mut next = opts.clone();
    let sp = &mut next.sampling;
    let count = m40_runtime::SamplingParams::count;
    match name {
        "temperature" => sp.temperature = float()?,
        "top_p" => sp.top_p = float()?,
        "min_p" => sp.min_p = float()?,
        "repeat_penalty" => sp.repeat_penalty = float()?,
        "presence_penalty" => sp.presence_penalty = float()?,
        "frequency_penalty" => sp.frequency_penalty = float()?,
        "top_k" => sp.top_k = count("top_k", int()?).map_err(|e| e.to_string())?,
        "repeat_last_n" => {
            sp.penalty_last_n = count("repeat_last_n", int()?).map_err(|e| e.to_string())?
        }
        "seed" => sp.seed = Some(int()? as u64),
        "num_predict" => {
            next.max_tokens = match int()? {
                n if n < 0 => None,
                n => Some(n as usize),
            }
        }
        "stop" => next.stop.push(value.to_string()),
        "num_ctx" => {
            next.num_ctx = match int()? {
                n if n <= 0 => return Err(format!("num_ctx must be positive, not {n}")),
                n => Some(n as usize),
            }
        }
        _ => {
            return Err(format!(
                "unknown parameter `{name}`; see /? for the ones there are"
            ))
        }
    }
    next.sampling.validate().map_err(|e| e.to_string())?;
    *opts = next;
    Ok(format!("set parameter '{name}' to '{value}'"))
}

fn show_parameters(opts: &ChatOptions) -> String {
    let s = &opts.sampling;
    let mut out = format!(
        "temperature {}\ntop_k {}\ntop_p {}\nmin_p {}\nrepeat_penalty {}\nrepeat_last_n {}\npresence_penalty {}\nfrequency_penalty {}",
        s.temperature,
        s.top_k,
        s.top_p,
        s.min_p,
        s.repeat_penalty,
        s.penalty_last_n,
        s.presence_penalty,
        s.frequency_penalty
    );
    if let Some(seed) = s.seed {
        out += &format!("\nseed {seed}");
    }
    if let Some(n) = opts.max_tokens {
        out += &format!("\nnum_predict {n}");
    }
    for stop in &opts.stop {
        out += &format!("\nstop {stop:?}");
    }
    out
}

/// Carry out a line that starts with `/`.
fn command(line: &str, opts: &mut ChatOptions, backend: &dyn ChatBackend) -> Action {
    let mut words = line.split_whitespace();
    let cmd = words.next().unwrap_or("");
    let rest: Vec<&str> = words.collect();
    match (cmd, rest.as_slice()) {
        ("/bye" | "/exit" | "/quit", _) => Action::Quit,
        ("/clear" | "/reset", _) => Action::Clear("(conversation cleared)".into()),
        ("/?" | "/help", _) => Action::Say(HELP.into()),
        ("/show", ["info"]) => Action::Say(backend.describe().join("\n")),
        ("/show", ["parameters"]) => Action::Say(show_parameters(opts)),
        ("/show", ["system"]) => Action::Say(
            opts.system
                .clone()
                .unwrap_or_else(|| "(no system message)".into()),
        ),
        ("/show", [what @ ("template" | "modelfile" | "license")]) => Action::Say(
            backend
                .model_text(what)
                .unwrap_or_else(|| format!("(the model has no {what})")),
        ),
        ("/set", ["format", "json"]) => {
            opts.json = true;
            Action::Say("set format to json".into())
        }
        ("/set", ["noformat"]) => {
            opts.json = false;
            Action::Say("format cleared".into())
        }
        ("/set", ["think"]) => {
            opts.think = Some(m40_runtime::Think::On);
            Action::Say("thinking on".into())
        }
        ("/set", ["nothink"]) => {
            opts.think = Some(m40_runtime::Think::Off);
            Action::Say("thinking off".into())
        }
        ("/set", ["verbose"]) => {
            opts.quiet = false;
            Action::Say("figures on".into())
        }
        ("/set", ["quiet"]) => {
            opts.quiet = true;
            Action::Say("figures off".into())
        }
        ("/set", ["nowordwrap"]) => Action::Say("word wrap is off (m40-llm never wraps)".into()),
        ("/set", ["parameter", name, value @ ..]) if !value.is_empty() => {
            match set_parameter(opts, name, &value.join(" ")) {
                Ok(msg) => Action::Say(msg),
                Err(e) => Action::Say(format!("error: {e}")),
            }
        }
        ("/set", ["system", text @ ..]) if !text.is_empty() => {
            opts.system = Some(text.join(" "));
            Action::Clear("(system message set; conversation cleared)".into())
        }
        ("/set" | "/show", _) => {
            Action::Say(format!("error: incomplete or unknown `{line}`\n{HELP}"))
        }
        _ => Action::Say(format!("unknown command `{cmd}`\n{HELP}")),
    }
}

/// Answer the last message of `history`, printing the answer and its
/// figures; the answer joins the history (a failed one takes the message
/// back out).
fn answer_turn(
    backend: &dyn ChatBackend,
    history: &mut Vec<Message>,
    opts: &ChatOptions,
    cancel: &CancelToken,
) {
    let stdout = std::io::stdout();
    let result = backend.answer(history, opts, cancel, &mut |text| {
        let mut out = stdout.lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    });
    println!();
    match result {
        Ok(turn) => {
            if turn.cancelled {
                eprintln!("(stopped)");
            }
            if !opts.quiet {
                eprintln!("[{}]", turn.stats);
            }
            history.push(Message::new("assistant", turn.text));
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            history.pop();
        }
    }
}

/// Run the chat loop on stdin/stdout until `/bye` or end of input.
pub fn run(backend: &dyn ChatBackend, opts: &ChatOptions) -> Result<()> {
    let cancel = CancelToken::new();
    cancel_on_ctrl_c(&cancel);
    let mut opts = opts.clone();
    let mut history: Vec<Message> = Vec::new();
    let reset = |h: &mut Vec<Message>, opts: &ChatOptions| {
        h.clear();
        if let Some(s) = &opts.system {
            h.push(Message::new("system", s.clone()));
        }
    };
    reset(&mut history, &opts);
    if let Some(first) = backend.describe().first() {
        eprintln!("{first}");
    }
    eprintln!("chat: type a message; /? for help, /bye quits, Ctrl-C stops an answer");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!(">>> ");
        std::io::stderr().flush()?;
        cancel.reset();
        let Some(line) = lines.next() else { break };
        let line = match line {
            Ok(l) => l,
            // Ctrl-C while reading a line interrupts the read: just prompt again.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        let mut line = line.trim().to_string();
        if line.is_empty() {
            continue;
        }
        // `"""` begins a message of several lines, up to a line that ends
        // with `"""`.
        if let Some(first) = line.strip_prefix("\"\"\"") {
            let mut text = first.to_string();
            let mut closed = text.ends_with("\"\"\"") && !text.is_empty();
            while !closed {
                eprint!("... ");
                std::io::stderr().flush()?;
                let Some(next) = lines.next() else { break };
                let next = next?;
                closed = next.trim_end().ends_with("\"\"\"");
                text.push('\n');
                text.push_str(&next);
            }
            let text = text.trim_end();
            line = text
                .strip_suffix("\"\"\"")
                .unwrap_or(text)
                .trim()
                .to_string();
            if line.is_empty() {
                continue;
            }
            history.push(Message::new("user", line.clone()));
            answer_turn(backend, &mut history, &opts, &cancel);
            continue;
        }
        let line = line.as_str();
        if line.starts_with('/') {
            match command(line, &mut opts, backend) {
                Action::Quit => break,
                Action::Say(msg) => eprintln!("{msg}"),
                Action::Clear(msg) => {
                    reset(&mut history, &opts);
                    eprintln!("{msg}");
                }
            }
            continue;
        }
        history.push(Message::new("user", line));
        answer_turn(backend, &mut history, &opts, &cancel);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake;
    impl ChatBackend for Fake {
        fn model_text(&self, what: &str) -> Option<String> {
            (what == "template").then(|| "{{ messages }}".into())
        }
        fn describe(&self) -> Vec<String> {
            vec!["running on the CPU".into(), "model: m".into()]
        }
        fn answer(
            &self,
            _: &[Message],
            _: &ChatOptions,
            _: &CancelToken,
            _: &mut dyn FnMut(&str),
        ) -> Result<Turn> {
            unreachable!("commands never reach the model")
        }
    }

    fn say(a: Action) -> String {
        match a {
            Action::Say(s) => s,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn figures_never_show_a_rate_of_nothing() {
        assert_eq!(
            rates(12, 30.0, 0, 0.0),
            "12 prompt tokens at 400.0 t/s, 0 generated"
        );
        // A prompt served from the prefix cache in no time has no rate.
        assert_eq!(
            rates(5000, 0.2, 3, 60.0),
            "5000 prompt tokens, 3 generated at 50.0 t/s"
        );
    }

    #[test]
    fn ollama_commands() {
        let mut o = ChatOptions::default();
        assert_eq!(command("/bye", &mut o, &Fake), Action::Quit);
        assert!(matches!(command("/clear", &mut o, &Fake), Action::Clear(_)));
        assert!(say(command("/?", &mut o, &Fake)).contains("/set parameter"));
        assert!(say(command("/show info", &mut o, &Fake)).contains("running on the CPU"));
        let m = say(command("/set parameter temperature 0", &mut o, &Fake));
        assert_eq!(m, "set parameter 'temperature' to '0'");
        assert_eq!(o.sampling.temperature, 0.0);
        say(command("/set parameter top_k 7", &mut o, &Fake));
        say(command("/set parameter num_predict 12", &mut o, &Fake));
        say(command("/set parameter stop <end>", &mut o, &Fake));
        assert_eq!((o.sampling.top_k, o.max_tokens), (7, Some(12)));
        assert_eq!(o.stop, ["<end>"]);
        let p = say(command("/show parameters", &mut o, &Fake));
        assert!(p.contains("top_k 7") && p.contains("num_predict 12"), "{p}");
        // Nonsense is refused with the range, and changes nothing.
        let before = o.clone();
        for bad in [
            "/set parameter temperature -1",
            "/set parameter top_p 5",
            "/set parameter repeat_penalty 0",
            "/set parameter top_k -3",
            "/set parameter temperature hot",
            "/set parameter colour blue",
        ] {
            let m = say(command(bad, &mut o, &Fake));
            assert!(m.starts_with("error:"), "{bad}: {m}");
        }
        assert_eq!(o.sampling, before.sampling);
        assert!(say(command("/set parameter temperature -1", &mut o, &Fake))
            .contains("between 0 and 2"));
        // A system message restarts the conversation.
        assert!(matches!(
            command("/set system Be terse.", &mut o, &Fake),
            Action::Clear(_)
        ));
        assert_eq!(o.system.as_deref(), Some("Be terse."));
        // Ollama's other commands.
        assert_eq!(say(command("/show system", &mut o, &Fake)), "Be terse.");
        assert_eq!(
            say(command("/show template", &mut o, &Fake)),
            "{{ messages }}"
        );
        assert!(say(command("/show license", &mut o, &Fake)).contains("no license"));
        say(command("/set format json", &mut o, &Fake));
        say(command("/set nothink", &mut o, &Fake));
        say(command("/set quiet", &mut o, &Fake));
        say(command("/set parameter num_ctx 256", &mut o, &Fake));
        assert!(o.json && o.quiet && o.num_ctx == Some(256));
        assert_eq!(o.think, Some(m40_runtime::Think::Off));
        assert!(say(command("/set parameter num_ctx 0", &mut o, &Fake)).starts_with("error:"));
        say(command("/set noformat", &mut o, &Fake));
        assert!(!o.json);
        // Unknown commands are answered with the help, never sent to the model.
        let m = say(command("/frobnicate now", &mut o, &Fake));
        assert!(
            m.contains("unknown command `/frobnicate`") && m.contains("/bye"),
            "{m}"
        );
        assert!(say(command("/set", &mut o, &Fake)).contains("incomplete"));
    }
}
