use anyhow::{anyhow, Result};
use m40_runtime::store::{catalog_entry, Store, CATALOG};

#[derive(clap::Args)]
pub struct PullArgs {
    /// Catalog name, e.g. `smollm2:135m`.
    pub name: String,
}

pub fn pull(a: PullArgs) -> Result<()> {
    let entry = catalog_entry(&a.name).ok_or_else(|| {
        anyhow!(
            "`{}` is not in the catalog (known: {})",
            a.name,
            CATALOG
                .iter()
                .map(|e| e.name)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let m = Store::from_env()?.pull(entry, &mut |msg: &str| eprintln!("{msg}"))?;
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
    println!("{:<24} {:>10}  PATH", "NAME", "SIZE");
    for m in models {
        println!(
            "{:<24} {:>7.1} MB  {}",
            m.name,
            m.size as f64 / 1e6,
            m.path.display()
        );
    }
    Ok(())
}
