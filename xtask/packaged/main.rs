//! A program outside the workspace that depends on m40-runtime and m40-store
//! as crates.io would serve them: `cargo xtask package` packages every crate,
//! points this program's dependencies at the packaged sources (not the
//! workspace's) and runs it. It loads SmolLM2-135M on the CPU and continues
//! a prompt greedily (the continuation llama.cpp gives, tests/engine.rs).
//!
//! Usage: packaged STORE_ROOT (the store that holds, or will fetch, the
//! default model).

use m40_runtime::{
    BackendChoice, CancelToken, Engine, EngineOptions, Prompt, Request, SamplingParams,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::env::args().nth(1).ok_or("usage: packaged STORE_ROOT")?;
    let path = m40_store::Store::new(root).ensure_default(&mut |m: &str| eprintln!("{m}"))?;
    let opts = {
let mut o = EngineOptions::default();
o.backend = BackendChoice::Cpu;
o.n_ctx = Some(256);
o
};
    let engine = Engine::from_path(&path, opts)?;
    let prompt = "The capital of France is";
    let mut req = Request::new(Prompt::Text(prompt.into()));
    req.sampling = SamplingParams::greedy();
    req.max_tokens = Some(5);
    let mut text = String::new();
    let done = engine.generate(&req, &CancelToken::new(), |t| text.push_str(&t.text))?;
    println!("{prompt}{text}");
    println!(
        "{} tokens, {:?}, {:.1} tokens/s on the {}",
        done.token_ids.len(),
        done.finish_reason,
        done.timings.generation_tokens_per_s(),
        engine.backend_name()
    );
    // llama.cpp's greedy continuation of this prompt (tests/engine.rs).
    if text != " Paris.\n\nThe" {
        return Err(format!("expected \" Paris.\\n\\nThe\", got {text:?}").into());
    }
    Ok(())
}
