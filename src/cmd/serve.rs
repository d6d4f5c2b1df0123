//! `m40-llm serve [MODEL]`: the Ollama- and OpenAI-compatible HTTP server.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use m40_llm::client;
use m40_serve::{AppState, Fit, KeepAlive, Loader, ServerConfig, StoreLoader};

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF path or a store name (default: the default model).
    pub model: Option<String>,
    /// Address to bind (`M40_HOST` also sets it, as host or host:port).
    #[arg(long)]
    pub host: Option<String>,
    #[arg(long)]
    pub port: Option<u16>,
    /// Require `Authorization: Bearer KEY` (`M40_API_KEY` also sets it);
    /// needed to bind anything but a loopback address.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Requests that may wait for the engine before new ones get 503
    /// (Ollama's OLLAMA_MAX_QUEUE).
    #[arg(long, default_value_t = 64, env = "M40_MAX_QUEUE")]
    pub max_queue: usize,
    /// Seconds a request may run before it is cancelled.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Context length in tokens (default: the model's, up to 4096; 0: all
    /// the model was made for, which is also the most; Ollama's
    /// OLLAMA_CONTEXT_LENGTH).
    #[arg(long, env = "M40_CONTEXT_LENGTH")]
    pub ctx: Option<usize>,
    /// Let HTTP clients pull by a path on this machine or by any URL (by
    /// default `/api/pull` takes catalog names and hf.co/ references only).
    #[arg(long)]
    pub allow_any_pull: bool,
    /// How long the model stays loaded after its last request, where a
    /// request does not say: a duration ("5m", "1h30m") or seconds; 0
    /// unloads it at once, a negative one keeps it (Ollama's
    /// OLLAMA_KEEP_ALIVE).
    #[arg(long, env = "M40_KEEP_ALIVE", default_value = "5m", value_parser = KeepAlive::parse)]
    pub keep_alive: KeepAlive,
    /// Browser origins allowed to call the server beside this machine's
    /// pages and app webviews, comma-separated, `*` for any run of
    /// characters ("https://*.example.com"; Ollama's OLLAMA_ORIGINS).
    #[arg(long, env = "M40_ORIGINS", value_delimiter = ',')]
    pub origins: Vec<String>,
    /// The model store's folder (Ollama's OLLAMA_MODELS; default: the
    /// user's data folder's m40-llm/models).
    #[arg(long, env = "M40_MODELS", value_name = "DIR")]
    pub models: Option<std::path::PathBuf>,
    /// Models loaded at once at most; 0: as many as fit (Ollama's
    /// OLLAMA_MAX_LOADED_MODELS). Any stored model is served by name and
    /// loaded by its first request; one that does not fit unloads the
    /// least recently used idle model first.
    #[arg(long, env = "M40_MAX_LOADED_MODELS", default_value_t = 0)]
    pub max_loaded_models: usize,
    /// GiB all loaded models may take together (weights, KV caches,
    /// workspaces); a load that does not fit what the others leave unloads
    /// the least recently used idle model. Default: the GPU's or the
    /// machine's free memory decides (a 24 GB M40 on a larger GPU: 24).
    #[arg(long, env = "M40_MAX_MEMORY", value_name = "GIB")]
    pub max_memory: Option<f64>,
    /// Log each request and the engine's steps (Ollama's OLLAMA_DEBUG).
    #[arg(long, env = "M40_DEBUG", value_parser = clap::builder::BoolishValueParser::new())]
    pub debug: bool,
    #[command(flatten)]
    pub device: super::DeviceArgs,
}

/// host and port from the flags, else `M40_HOST`, else 127.0.0.1:11434.
fn bind_address(a: &Args) -> String {
    let (env_host, env_port) = client::env_host().map_or((None, None), |(h, p)| (Some(h), p));
    let host = a
        .host
        .clone()
        .or(env_host)
        .unwrap_or_else(|| client::DEFAULT_HOST.into());
    format!(
        "{host}:{}",
        a.port.or(env_port).unwrap_or(client::DEFAULT_PORT)
    )
}

pub fn run(a: Args) -> Result<()> {
    let addr = bind_address(&a);
    let api_key = a
        .api_key
        .clone()
        .or_else(|| std::env::var("M40_API_KEY").ok());
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        if !local.ip().is_loopback() && api_key.is_none() {
            bail!("{local} is not a loopback address: set --api-key (or M40_API_KEY) to serve beyond this machine");
        }
        let name = a.model.clone().unwrap_or_else(|| m40_store::DEFAULT_MODEL.to_string());
        let store = match &a.models {
            Some(dir) => m40_store::Store::new(dir),
            None => m40_store::Store::from_env()?,
        };
        let path = super::resolve_in(&store, Some(&name))?;
        let opts = a.device.engine_options(a.ctx);
        // Every stored model by name, and this one again after an unload
        // (`m40-llm stop`), loaded with the same options.
        let loader = Arc::new(StoreLoader::new(store.clone(), opts.clone()).serving(&name, &path));
        let max_memory = match a.max_memory {
            Some(g) if !(g.is_finite() && g > 0.0) => {
                bail!("--max-memory {g}: give a number of GiB above 0")
            }
            g => g.map(super::gib_bytes),
        };
        let limit = max_memory;
        let engine = {
            let (loader, name) = (loader.clone(), name.clone());
            tokio::task::spawn_blocking(move || loader.load(&name, Fit::Anywhere, limit)).await??
        };
        super::report_backend(&engine);
        super::report_limits(&engine);
        let config = ServerConfig {
            max_queue: a.max_queue,
            request_timeout: Duration::from_secs(a.timeout),
            api_key,
            store: Some(store),
            allow_any_pull: a.allow_any_pull,
            loader: Some(loader),
            max_loaded_models: a.max_loaded_models,
            max_memory,
            keep_alive: a.keep_alive,
            origins: a.origins.clone(),
            ..Default::default()
        };
        let state = AppState::new(Arc::new(engine), &name, config);
        eprintln!("m40-llm serving {name} on http://{local}");
        m40_serve::serve(listener, state, async {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("shutting down: finishing requests in flight (Ctrl-C again stops at once)");
            // A second Ctrl-C does not wait for them.
            tokio::spawn(async {
                let _ = tokio::signal::ctrl_c().await;
                eprintln!("stopped");
                std::process::exit(130);
            });
        })
        .await?;
        Ok(())
    })
}
