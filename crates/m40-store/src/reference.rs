//! What `pull` and `run` take: a catalog name, a Hugging Face reference, a
//! URL or a path, parsed into a [`ModelRef`].

use std::path::{Path, PathBuf};

use super::{catalog_entry, catalog_names, CatalogEntry, PullOptions, Result, StoreError};

/// Which GGUF of a Hugging Face repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HfFile {
    /// A path inside the repository.
    Path(String),
    /// The one `.gguf` whose name carries this quantization (`Q4_K_M`).
    Quant(String),
    /// Q4_K_M if the repository has it, else its only `.gguf`.
    Default,
}

/// What `pull` (and `run`) accept.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelRef {
    /// A catalog name or alias.
    Catalog(&'static CatalogEntry),
    /// `hf.co/OWNER/REPO/FILE.gguf`, `hf.co/OWNER/REPO:QUANT` or `hf.co/OWNER/REPO`
    /// (`huggingface.co/` and `hf://` also work).
    HuggingFace { repo: String, file: HfFile },
    /// An `http://` or `https://` URL of a GGUF file.
    Url(String),
    /// A GGUF on disk, used in place.
    Path(PathBuf),
}

impl PartialEq for CatalogEntry {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl ModelRef {
    /// Parse a reference. An existing file wins over every other reading.
    pub fn parse(s: &str) -> Result<Self> {
        let p = Path::new(s);
        if p.is_file() {
            return Ok(Self::Path(PathBuf::from(s)));
        }
        if p.is_dir() {
            return Err(StoreError::BadRef(
                s.to_string(),
                "a directory, not a GGUF file: name the .gguf file inside it".into(),
            ));
        }
        Self::parse_name(s)
    }

    /// [`ModelRef::parse`] without looking at the disk: a catalog name, a
    /// Hugging Face reference or a URL.
    fn parse_name(s: &str) -> Result<Self> {
        let bad = |why: &str| StoreError::BadRef(s.to_string(), why.to_string());
        if s.starts_with("http://") || s.starts_with("https://") {
            let file = s.rsplit('/').next().unwrap_or("");
            if file.is_empty() || s.split('/').count() < 4 {
                return Err(bad("a URL must name a file"));
            }
            return Ok(Self::Url(s.to_string()));
        }
        let hf = ["hf.co/", "huggingface.co/", "hf://"]
            .iter()
            .find_map(|p| s.strip_prefix(p));
        if let Some(rest) = hf {
            let mut parts = rest.splitn(3, '/');
            let (owner, repo_tag, file) = (parts.next(), parts.next(), parts.next());
            let (Some(owner), Some(repo_tag)) = (owner, repo_tag) else {
                return Err(bad("expected hf.co/OWNER/REPO[/FILE.gguf | :QUANT]"));
            };
            let valid = |x: &str| {
                !x.is_empty()
                    && x != "."
                    && x != ".."
                    && x.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            };
            let (repo, quant) = match repo_tag.split_once(':') {
                Some((r, q)) => (r, Some(q)),
                None => (repo_tag, None),
            };
            if !valid(owner) || !valid(repo) {
                return Err(bad("OWNER and REPO are letters, digits, '-', '_' and '.'"));
            }
            let file = match (file, quant) {
                (Some(_), Some(_)) => return Err(bad("give a file or a :QUANT, not both")),
                (Some(f), None) => {
                    if f.split('/').any(|c| c.is_empty() || c == "..") || !f.ends_with(".gguf") {
                        return Err(bad("the file must be a path ending in .gguf"));
                    }
                    HfFile::Path(f.to_string())
                }
                (None, Some(q)) if valid(q) => HfFile::Quant(q.to_string()),
                (None, Some(_)) => return Err(bad("a quantization tag such as :Q4_K_M")),
                (None, None) => HfFile::Default,
            };
            return Ok(Self::HuggingFace {
                repo: format!("{owner}/{repo}"),
                file,
            });
        }
        if let Some(e) = catalog_entry(s) {
            return Ok(Self::Catalog(e));
        }
        if s.ends_with(".gguf") || s.contains('/') || s.contains(std::path::MAIN_SEPARATOR) {
            return Err(bad(
                "no such file, and not a catalog name or hf.co/ reference",
            ));
        }
        Err(StoreError::UnknownModel(s.to_string(), catalog_names()))
    }

    /// Parse a reference a remote client sent (the server's `/api/pull`):
    /// only catalog names and Hugging Face references, read without looking
    /// at the server's disk; paths and URLs are [`StoreError::NotAllowedRemotely`].
    pub fn parse_remote(s: &str) -> Result<Self> {
        let lower = s.to_ascii_lowercase();
        let url = lower.starts_with("http://") || lower.starts_with("https://");
        let hf = ["hf.co/", "huggingface.co/", "hf://"]
            .iter()
            .any(|p| s.starts_with(p));
        if url || !(hf || catalog_entry(s).is_some()) {
            return Err(StoreError::NotAllowedRemotely(s.to_string()));
        }
        let r = Self::parse_name(s)?;
        match r {
            Self::Catalog(_) | Self::HuggingFace { .. } => Ok(r),
            _ => Err(StoreError::NotAllowedRemotely(s.to_string())),
        }
    }

    /// What can be known before a pull starts about whether its download
    /// can be verified: a URL has no checksum unless `opts` gives one (or
    /// accepts none). Hugging Face files are checked against the listing
    /// once it is fetched.
    pub fn check_verifiable(&self, opts: &PullOptions) -> Result<()> {
        match self {
            Self::Url(url) if opts.sha256.is_none() && !opts.allow_unverified => {
                Err(StoreError::Unverified {
                    what: url.clone(),
                    why: "a URL comes with no checksum".into(),
                })
            }
            _ => Ok(()),
        }
    }

    /// The store name this reference gets unless the user names it.
    pub fn default_name(&self) -> String {
        let stem = |f: &str| {
            let f = f.rsplit('/').next().unwrap_or(f);
            f.strip_suffix(".gguf").unwrap_or(f).to_ascii_lowercase()
        };
        match self {
            Self::Catalog(e) => e.name.to_string(),
            Self::HuggingFace { repo, file } => {
                let tag = match file {
                    HfFile::Path(f) => stem(f),
                    HfFile::Quant(q) => q.to_ascii_lowercase(),
                    HfFile::Default => "latest".into(),
                };
                format!("hf.co/{}:{tag}", repo.to_ascii_lowercase())
            }
            Self::Url(u) => {
                let u = u.split(['?', '#']).next().unwrap_or(u);
                stem(u).replace(':', "-")
            }
            Self::Path(p) => p
                .file_name()
                .map(|f| stem(&f.to_string_lossy()))
                .unwrap_or_else(|| "model".into())
                .replace(':', "-"),
        }
    }
}
