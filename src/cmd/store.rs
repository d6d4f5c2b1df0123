//! `pull`, `list`, `rm` and `ps`: the model store and the running server.

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use m40_llm::client::{server_base, Client};
use m40_store::{Progress, PullOptions, Store};

#[derive(clap::Args)]
pub struct PullArgs {
    /// A catalog name (`smollm2:135m`), a Hugging Face file
    /// (`hf.co/OWNER/REPO/FILE.gguf` or `hf.co/OWNER/REPO:Q4_K_M`), an
    /// http(s) URL, or a GGUF path (named in place, never copied).
    pub model: String,
    /// Store it under this name (default: from the reference).
    #[arg(long)]
    pub name: Option<String>,
    /// The sha256 the file must have.
    #[arg(long)]
    pub sha256: Option<String>,
    /// Accept a file whose sha256 nothing states (a URL without --sha256, a
    /// Hugging Face file without a listing); refused otherwise.
    #[arg(long)]
    pub unverified: bool,
}

#[derive(clap::Args)]
pub struct StopArgs {
    /// The model's name (or its file) as the server has it loaded.
    pub model: String,
}

#[derive(clap::Args)]
pub struct RmArgs {
    /// Names of stored models.
    #[arg(required = true)]
    pub models: Vec<String>,
}

#[derive(clap::Args)]
pub struct CreateArgs {
    /// The new model's name (NAME[:TAG]).
    pub name: String,
    /// The Modelfile: FROM a stored model or a GGUF path, with SYSTEM,
    /// TEMPLATE (Jinja), PARAMETER, MESSAGE and LICENSE lines.
    #[arg(short = 'f', long = "file", default_value = "Modelfile")]
    pub file: std::path::PathBuf,
}

#[derive(clap::Args)]
pub struct CopyArgs {
    pub source: String,
    pub destination: String,
}

/// `m40-llm create NAME -f Modelfile`: a model in the store that points at
/// its FROM's file with the Modelfile's instructions (no copy of the
/// weights).
pub fn create(a: CreateArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let modelfile = m40_store::Modelfile::parse(&text)?;
    let m = Store::from_env()?.create(&a.name, &modelfile)?;
    println!("created '{}' from {}", m.name, modelfile.from);
    Ok(())
}

/// `m40-llm cp SOURCE DESTINATION`.
pub fn copy(a: CopyArgs) -> Result<()> {
    let m = Store::from_env()?.copy(&a.source, &a.destination)?;
    println!("copied '{}' to '{}'", a.source, m.name);
    Ok(())
}

/// Steps on stderr, downloads as a progress bar (drawn only on a terminal).
#[derive(Default)]
pub struct Bar(Option<ProgressBar>);

impl Progress for Bar {
    fn status(&mut self, msg: &str) {
        match &self.0 {
            Some(bar) if msg.starts_with("connection lost") => bar.println(msg),
            _ => {
                if let Some(bar) = self.0.take() {
                    bar.finish();
                }
                eprintln!("{msg}");
            }
        }
    }

    fn bytes(&mut self, _: &str, completed: u64, total: Option<u64>) {
        let bar = self.0.get_or_insert_with(|| {
            let bar = ProgressBar::new(total.unwrap_or(0));
            let style = if total.is_some() {
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta}"
            } else {
                "{spinner} {bytes} {bytes_per_sec}"
            };
            bar.set_style(ProgressStyle::with_template(style).expect("a valid template"));
            bar
        });
        bar.set_position(completed);
    }
}

pub fn pull(a: PullArgs) -> Result<()> {
    let opts = PullOptions {
        name: a.name,
        sha256: a.sha256,
        allow_unverified: a.unverified,
    };
    let m = Store::from_env()?.pull_str(&a.model, &opts, &mut Bar::default())?;
    println!("{}\t{}", m.name, m.path.display());
    Ok(())
}

pub fn list() -> Result<()> {
    let store = Store::from_env()?;
    let models = store.list()?;
    if models.is_empty() {
        eprintln!(
            "no models in {} (try `m40-llm pull smollm2:135m`)",
            store.root().display()
        );
    }
    println!("{:<40} {:<12} {:>10}  SOURCE", "NAME", "ID", "SIZE");
    for m in models {
        println!(
            "{:<40} {:<12} {:>7.1} MB  {}",
            m.name,
            &m.sha256[..m.sha256.len().min(12)],
            m.size as f64 / 1e6,
            m.source
        );
    }
    Ok(())
}

pub fn rm(a: RmArgs) -> Result<()> {
    let store = Store::from_env()?;
    let mut failed = false;
    for name in &a.models {
        match store.remove(name) {
            Ok(m) => println!("deleted '{}'", m.name),
            Err(e) => {
                eprintln!("error: {e}");
                failed = true;
            }
        }
    }
    if failed {
        bail!("some models were not deleted");
    }
    Ok(())
}

/// `m40-llm stop MODEL`: unload a model a running server has loaded (it
/// loads it again on the next request that names it).
pub fn stop(a: StopArgs) -> Result<()> {
    let Some(client) = Client::probe() else {
        bail!(
            "no m40-llm server answers at {} (nothing to stop; set M40_HOST for another)",
            server_base()
        );
    };
    match client.serving(&a.model)? {
        Some(name) => client.unload(&name),
        None => bail!(
            "the server at {} does not have {} loaded (see `m40-llm ps`)",
            client.base(),
            a.model
        ),
    }
}

pub fn ps() -> Result<()> {
    let Some(client) = Client::probe() else {
        bail!(
            "no m40-llm server answers at {} (start one with `m40-llm serve`, or set M40_HOST)",
            server_base()
        );
    };
    let loaded = client.ps()?;
    println!(
        "{:<40} {:>10} {:>9} {:>9}  UNTIL",
        "NAME", "SIZE", "PROCESSOR", "CONTEXT"
    );
    if loaded.is_empty() {
        eprintln!("(no model loaded now: the server loads its model on the next request)");
    }
    for m in loaded {
        let size = m["size"].as_u64().unwrap_or(0);
        let on_gpu = m["size_vram"].as_u64().unwrap_or(0) > 0;
        println!(
            "{:<40} {:>7.1} MB {:>9} {:>9}  {}",
            m["name"].as_str().unwrap_or("?"),
            size as f64 / 1e6,
            if on_gpu { "100% GPU" } else { "100% CPU" },
            m["context_length"].as_u64().unwrap_or(0),
            until(m["expires_at"].as_str()),
        );
    }
    Ok(())
}

/// When a model `expires_at` (RFC 3339) goes, as `ollama ps` says it:
/// "4 minutes from now", "forever" (a model kept).
fn until(expires_at: Option<&str>) -> String {
    let Some(at) = expires_at.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else {
        return "?".into();
    };
    let left = (at.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_seconds();
    match left {
        l if l > 50 * 365 * 86400 => "forever".into(),
        l if l <= 0 => "now (when idle)".into(),
        l if l < 120 => format!("{l} seconds from now"),
        l if l < 2 * 3600 => format!("{} minutes from now", l / 60),
        l if l < 2 * 86400 => format!("{} hours from now", l / 3600),
        l => format!("{} days from now", l / 86400),
    }
}
