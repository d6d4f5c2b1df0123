//! One prompt, streamed: `cargo run --release -p m40-runtime --example 01_generate [MODEL] [PROMPT]`.
//!
//! MODEL is a GGUF path or a store name (default `smollm2:135m`, fetched on
//! first use); the GPU is used when there is one that fits the model.

use std::io::Write;

use m40_runtime::{CancelToken, Engine, EngineOptions, Message, Prompt, Request, SamplingParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "smollm2:135m".into());
    let prompt = args.next().unwrap_or_else(|| "Name three colors.".into());

    let path = m40_store::Store::from_env()?.resolve(&model, &mut |m: &str| eprintln!("{m}"))?;
    let engine = Engine::from_path(&path, EngineOptions::default())?;
    eprintln!("running on the {}", engine.backend_name());

    let mut req = Request::new(Prompt::Chat(vec![Message::new("user", prompt)]));
    req.sampling = {
        let mut o = SamplingParams::default();
        o.temperature = 0.7;
        o.seed = Some(42);
        o
    };
    req.max_tokens = Some(64);

    let done = engine.generate(&req, &CancelToken::new(), |token| {
        print!("{}", token.text);
        let _ = std::io::stdout().flush();
    })?;
    println!();
    eprintln!(
        "{:?} after {} tokens ({:.1} tokens/s, first token after {:.0} ms)",
        done.finish_reason,
        done.token_ids.len(),
        done.timings.generation_tokens_per_s(),
        done.timings.time_to_first_token_ms
    );
    Ok(())
}
