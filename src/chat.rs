//! An interactive, multi-turn chat in the terminal with streaming output,
//! in-process or through a running server. Ctrl-C stops the answer being
//! written (not the program); `/reset` starts a new conversation, `/exit`
//! (or end of input) quits.

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
        req.truncate_prompt = true;
        let c = self.generate(&req, cancel, |ev| on_text(&ev.text))?;
        Ok(Turn {
            cancelled: c.finish_reason == FinishReason::Cancelled,
            stats: rates(
                c.timings.prompt_tokens as u64,
                c.timings.prompt_tokens_per_s(),
                c.timings.generated_tokens as u64,
                c.timings.generation_tokens_per_s(),
            ),
            text: c.text,
        })
    }
}

/// The figures every answer reports.
pub fn rates(prompt: u64, prompt_per_s: f64, generated: u64, generated_per_s: f64) -> String {
    format!("{prompt} prompt tokens at {prompt_per_s:.1} t/s, {generated} generated at {generated_per_s:.1} t/s")
}

/// Install a Ctrl-C handler that cancels `cancel` (once per process).
pub fn cancel_on_ctrl_c(cancel: &CancelToken) {
    let c = cancel.clone();
    // A second handler cannot be installed; the first keeps working.
    let _ = ctrlc::set_handler(move || c.cancel());
}

/// Run the chat loop on stdin/stdout until `/exit` or end of input.
pub fn run(backend: &dyn ChatBackend, opts: &ChatOptions) -> Result<()> {
    let cancel = CancelToken::new();
    cancel_on_ctrl_c(&cancel);
    let mut history: Vec<Message> = Vec::new();
    let reset = |h: &mut Vec<Message>| {
        h.clear();
        if let Some(s) = &opts.system {
            h.push(Message::new("system", s.clone()));
        }
    };
    reset(&mut history);
    eprintln!("chat: type a message; /reset starts over, /exit quits, Ctrl-C stops an answer");
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
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" | "/bye" => break,
            "/reset" | "/clear" => {
                reset(&mut history);
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        history.push(Message::new("user", line));
        let stdout = std::io::stdout();
        let result = backend.answer(&history, opts, &cancel, &mut |text| {
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
                eprintln!("[{}]", turn.stats);
                history.push(Message::new("assistant", turn.text));
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                history.pop();
            }
        }
    }
    Ok(())
}
