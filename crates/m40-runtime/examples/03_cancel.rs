//! Stopping a generation from another thread (a client that left, a time
//! limit, Ctrl-C): `cargo run --release -p m40-runtime --example 03_cancel [MODEL]`.

use std::time::Duration;

use m40_runtime::{CancelToken, Engine, EngineOptions, FinishReason, Prompt, Request};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "smollm2:135m".into());
    let path = m40_store::Store::from_env()?.resolve(&model, &mut |m: &str| eprintln!("{m}"))?;
    let engine = Engine::from_path(&path, EngineOptions::default())?;

    let cancel = CancelToken::new();
    let timer = cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        timer.cancel();
    });

    // No max_tokens: until the context is full, far longer than 300 ms.
    let req = Request::new(Prompt::Text("Once upon a time".into()));
    let done = engine.generate(&req, &cancel, |t| print!("{}", t.text))?;
    println!();
    assert_eq!(done.finish_reason, FinishReason::Cancelled);
    eprintln!(
        "cancelled after {} tokens; the text so far is kept",
        done.token_ids.len()
    );
    Ok(())
}
