pub mod perplexity;
pub mod run;
pub mod serve;
pub mod show;
pub mod store;
pub mod synth;
pub mod text;

use std::path::PathBuf;

use anyhow::Result;
use m40_runtime::store::Store;

/// A model argument (path, store name, or the default model when absent) as a
/// path, fetching catalog models on first use.
pub fn resolve_model(model: Option<&str>) -> Result<PathBuf> {
    let store = Store::from_env()?;
    let name = model.unwrap_or(m40_runtime::store::DEFAULT_MODEL);
    Ok(store.resolve(name, &mut |msg: &str| eprintln!("{msg}"))?)
}
