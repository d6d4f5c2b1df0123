//! A conversation kept across turns: `cargo run --release -p m40-runtime --example 02_chat_history [MODEL]`.
//!
//! Each turn sends the whole history through the model's chat template; the
//! answer joins the history for the next turn.

use m40_runtime::{CancelToken, Engine, EngineOptions, Message, Prompt, Request, SamplingParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "smollm2:135m".into());
    let path = m40_store::Store::from_env()?.resolve(&model, &mut |m: &str| eprintln!("{m}"))?;
    let engine = Engine::from_path(&path, EngineOptions::default())?;

    let mut history = vec![Message::new("system", "You are a terse assistant.")];
    for question in ["What is the capital of France?", "And of Italy?"] {
        println!(">>> {question}");
        history.push(Message::new("user", question));
        let mut req = Request::new(Prompt::Chat(history.clone()));
        req.sampling = SamplingParams::greedy();
        req.max_tokens = Some(48);
        // A long conversation drops its oldest tokens instead of failing.
        req.truncate_prompt = true;
        let done = engine.generate(&req, &CancelToken::new(), |t| print!("{}", t.text))?;
        println!();
        history.push(Message::new("assistant", done.text));
    }
    Ok(())
}
