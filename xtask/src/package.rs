//! `cargo xtask package`: every publishable crate packaged and verified
//! (`cargo package --workspace`: each one built from its `.crate` alone), then
//! a program outside the workspace (`xtask/packaged/main.rs`) built against
//! the packaged m40-runtime and m40-store (every `m40-*` dependency patched
//! to its unpacked package under `target/package/`) and run: it must load
//! the default model and answer. What `cargo add m40-runtime` would give a
//! user, short of the registry itself.

use std::path::Path;
use std::process::Command;

/// Package, verify, build the consumer and run it; false on any failure.
pub fn run(root: &Path) -> bool {
    forget_unpacked(root);
    if !crate::cargo(&[
        "package",
        "--workspace",
        "--exclude",
        "xtask",
        "--allow-dirty",
    ]) {
        return false;
    }
    match consumer(root) {
        Ok(ok) => ok,
        Err(e) => {
            eprintln!("error: {e}");
            false
        }
    }
}

/// cargo verifies a crate whose workspace dependencies are unpublished
/// through a local overlay registry, which it unpacks into
/// `$CARGO_HOME/registry/src/-HASH/NAME-VERSION` and reuses by name and
/// version: a second run would build against the first run's sources.
/// Those unpacked `m40-*` folders are removed first (crates.io's own
/// folders, `index.crates.io-*`, are left alone), and so are the dev
/// builds of the `m40-*` crates, which cargo, taking a registry crate of
/// one version to be immutable, would otherwise reuse.
fn forget_unpacked(root: &Path) {
    let debug = root.join("target/debug");
    for dir in [debug.join(".fingerprint"), debug.join("deps")] {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("m40-") || name.starts_with("libm40_") || name.starts_with("m40_") {
                let p = e.path();
                let _ = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
            }
        }
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry/src")) else {
        return;
    };
    let overlays = std::fs::read_dir(&src)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('-'));
    for overlay in overlays {
        for e in std::fs::read_dir(overlay.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with("m40-") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// The unpacked packages under target/package: (name, version, folder).
fn packages(root: &Path) -> std::io::Result<Vec<(String, String, std::path::PathBuf)>> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(root.join("target/package"))?.flatten() {
        let dir = e.path();
        let file = e.file_name().to_string_lossy().into_owned();
        let Some((name, version)) = file.rsplit_once('-') else {
            continue;
        };
        if name.starts_with("m40-") && name != "m40-llm" && dir.join("Cargo.toml").is_file() {
            found.push((name.to_string(), version.to_string(), dir));
        }
    }
    found.sort();
    Ok(found)
}

fn consumer(root: &Path) -> Result<bool, String> {
    let pkgs = packages(root).map_err(|e| format!("target/package: {e}"))?;
    let version = |name: &str| {
        pkgs.iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, v, _)| v.clone())
            .ok_or_else(|| format!("{name} was not packaged"))
    };
    let dir = root.join("target/packaged-consumer");
    std::fs::create_dir_all(dir.join("src")).map_err(|e| e.to_string())?;
    let mut toml = format!(
        "# Written by `cargo xtask package`.\n[package]\nname = \"packaged\"\nversion = \"0.0.0\"\n\
         edition = \"2021\"\npublish = false\n\n[dependencies]\nm40-runtime = \"={}\"\n\
         m40-store = \"={}\"\n\n# Its own workspace, outside m40-llm's.\n[workspace]\n\n\
         # The engine's inner loops optimized, the rest as built for the verification.\n\
         [profile.dev.package.m40-model]\nopt-level = 3\n[profile.dev.package.m40-gguf]\nopt-level = 3\n\n\
         [patch.crates-io]\n",
        version("m40-runtime")?,
        version("m40-store")?
    );
    for (name, _, path) in &pkgs {
        toml.push_str(&format!(
            "{name} = {{ path = {:?} }}\n",
            path.display().to_string()
        ));
    }
    std::fs::write(dir.join("Cargo.toml"), toml).map_err(|e| e.to_string())?;
    std::fs::copy(root.join("xtask/packaged/main.rs"), dir.join("src/main.rs"))
        .map_err(|e| e.to_string())?;
    // The workspace's versions of the registry's crates, as a user's
    // `cargo add` would likely resolve them too.
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).map_err(|e| e.to_string())?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("== cargo run (target/packaged-consumer: the packaged m40-runtime and m40-store)");
    let status = Command::new(cargo)
        .arg("run")
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .arg("--")
        .arg(root.join("target/tmp/models"))
        // The target folder the verification built the dependencies in.
        .env("CARGO_TARGET_DIR", root.join("target"))
        .status()
        .map_err(|e| e.to_string())?;
    Ok(status.success())
}
