//! A program outside the workspace that depends on m40-runtime and m40-store
//! as crates.io would serve them: `cargo xtask package` packages every crate,
//! points this program's dependencies at the packaged sources (not the
//! workspace's) and runs it. It loads SmolLM2-135M on the CPU and answers one
//! question greedily.
//!
//! Usage: packaged STORE_ROOT (the store that holds, or will fetch, the
//! default model).

use m40_runtime::{BackendChoice, CancelToken, Engine, EngineOptions, Message, Prompt, Request};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::env::args().nth(1).ok_or("usage: packaged STORE_ROOT")?;
    let path = m40_store::Store::new(root).ensure_default(&mut |m: &str| eprintln!("{m}"))?;
    let opts = EngineOptions {
        backend: BackendChoice::Cpu,
        n_ctx: Some(256),
        ..Default::default()
    };
    let engine = Engine::from_path(&path, opts)?;
    let question = "What is the capital of France? Answer in one sentence.";
    let mut req = Request::new(Prompt::Chat(vec![Message::new("user", question)]));
    req.max_tokens = Some(16);
    let mut text = String::new();
    let done = engine.generate(&req, &CancelToken::new(), |t| text.push_str(&t.text))?;
    println!("{question}\n{text}");
    println!(
        "{} tokens, {:?}, {:.1} tokens/s on the {}",
        done.token_ids.len(),
        done.finish_reason,
        done.timings.generation_tokens_per_s(),
        engine.backend_name()
    );
    // Greedy SmolLM2-135M-Instruct knows this one.
    if !text.contains("Paris") {
        return Err(format!("expected Paris in the answer, got {text:?}").into());
    }
    Ok(())
}
