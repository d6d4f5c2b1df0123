//! `m40-llm`: the command-line front end.

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "m40-llm",
    version,
    about = "LLM inference for the NVIDIA Tesla M40 (and every later NVIDIA GPU)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate from a prompt, or chat when no prompt is given.
    Run(cmd::run::Args),
    /// Serve the Ollama- and OpenAI-compatible HTTP APIs (127.0.0.1:11434).
    Serve(cmd::serve::Args),
    /// Describe a model: architecture, hyperparameters, tokenizer, tensor types.
    Show(cmd::show::Args),
    /// Benchmark a model (or a random one of a known shape) on the GPU:
    /// pp512, tg128, tg128 at depth 4096, against the measured ceilings.
    Bench(cmd::bench::Args),
    /// Write a random-weight model of a known shape, any architecture m40-llm runs
    /// (for tests and benchmarks; `--shape` lists them).
    Synth(cmd::synth::Args),
    /// Print the token ids of a text as a JSON array.
    Tokenize(cmd::text::TokenizeArgs),
    /// Render a conversation with a chat template.
    Template(cmd::text::TemplateArgs),
    /// Perplexity of a model on a text (llama.cpp's protocol).
    Perplexity(cmd::perplexity::Args),
    /// Embeddings of texts, as JSON (an embedding model, or any chat model).
    Embed(cmd::embed::Args),
    /// Fetch a model into the store: a catalog name, hf.co/OWNER/REPO[/FILE.gguf|:QUANT], a URL, or a path.
    Pull(cmd::store::PullArgs),
    /// List the models in the store.
    #[command(visible_alias = "ls")]
    List,
    /// Remove models from the store.
    Rm(cmd::store::RmArgs),
    /// Make a model from a Modelfile (FROM, SYSTEM, TEMPLATE, PARAMETER,
    /// MESSAGE, LICENSE): a new name for a stored model's file with its own
    /// defaults.
    Create(cmd::store::CreateArgs),
    /// Copy a stored model under another name.
    Cp(cmd::store::CopyArgs),
    /// Show what a running server has loaded.
    Ps,
    /// Unload a model from a running server (it loads again on its next request).
    Stop(cmd::store::StopArgs),
}

/// Output piped into a reader that stops early (`m40-llm show M | head`)
/// ends the command quietly, as it does other Unix tools, instead of a
/// panic in `println!` (Rust ignores SIGPIPE by default). Not for `serve`,
/// which writes to its clients' sockets and must outlive any one of them.
fn end_quietly_on_closed_pipes() {
    #[cfg(unix)]
    // SAFETY: restores the default action of one signal before any thread
    // that could receive it starts; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Library warnings (an unknown pre-tokenizer, an odd special token id) go
    // to stderr; RUST_LOG adjusts the level, and `serve --debug`
    // (M40_DEBUG) shows m40-llm's debug lines (each request).
    let level = match &cli.command {
        Command::Serve(a) if a.debug => "warn,m40_serve=debug,m40_runtime=debug,m40_llm=debug",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours only on a terminal (not in a service's journal or a file).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| level.into())
                // M40_STEP_STATS's lines are the step loop's info events.
                .add_directive(
                    "m40_runtime::steps=info"
                        .parse()
                        .expect("a valid directive"),
                ),
        )
        .without_time()
        .init();
    if !matches!(cli.command, Command::Serve(_)) {
        end_quietly_on_closed_pipes();
    }
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Show(a) => cmd::show::run(a),
        Command::Synth(a) => cmd::synth::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Tokenize(a) => cmd::text::tokenize(a),
        Command::Template(a) => cmd::text::template(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Embed(a) => cmd::embed::run(a),
        Command::Pull(a) => cmd::store::pull(a),
        Command::List => cmd::store::list(),
        Command::Rm(a) => cmd::store::rm(a),
        Command::Create(a) => cmd::store::create(a),
        Command::Cp(a) => cmd::store::copy(a),
        Command::Ps => cmd::store::ps(),
        Command::Stop(a) => cmd::store::stop(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<cmd::run::Interrupted>() => ExitCode::from(130),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
