//! Downloads over HTTP(S) with resume and sha256 checks, and Hugging Face
//! file listings.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{check_gguf_magic, io, sha256_file, HfFile, Progress, Result, Store, StoreError};

/// Connection attempts in a row that may fetch nothing before a pull gives up
/// (the bytes fetched so far stay for the next pull).
pub(super) const MAX_FRUITLESS_ATTEMPTS: u32 = 5;

/// One file of a Hugging Face repository listing.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct HfSibling {
    pub path: String,
    /// sha256 and size, known for files stored with Git LFS (every GGUF).
    pub lfs: Option<(String, u64)>,
}

enum Attempt {
    Complete,
    Interrupted(String),
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(120)))
        // A stalled transfer errors (and is resumed) instead of hanging.
        .timeout_per_read(Some(Duration::from_secs(60)))
        .user_agent(concat!("m40-llm/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

fn http_err(url: &str, detail: impl Into<String>) -> StoreError {
    StoreError::Http {
        url: url.to_string(),
        detail: detail.into(),
    }
}

/// A failure that no retry mends (the host name does not resolve, the
/// address is malformed, TLS refuses the server): an error at once rather
/// than "connection lost" and retries.
fn unreachable(url: &str, e: &ureq::Error) -> Option<StoreError> {
    let detail = match e {
        ureq::Error::HostNotFound => "the host name does not resolve".to_string(),
        ureq::Error::Io(io) if is_resolver_error(io) => {
            format!("the host name does not resolve ({io})")
        }
        ureq::Error::BadUri(_)
        | ureq::Error::Tls(_)
        | ureq::Error::Rustls(_)
        | ureq::Error::RequireHttpsOnly(_)
        | ureq::Error::TooManyRedirects
        | ureq::Error::RedirectFailed => e.to_string(),
        _ => return None,
    };
    Some(StoreError::Unreachable {
        url: url.to_string(),
        detail,
    })
}

/// Whether an I/O error is the system resolver's (getaddrinfo's errors
/// reach Rust as plain text).
fn is_resolver_error(e: &std::io::Error) -> bool {
    let m = e.to_string().to_ascii_lowercase();
    [
        "lookup address",
        "name or service not known",
        "no address associated",
        "temporary failure in name resolution",
        "nodename nor servname",
    ]
    .iter()
    .any(|p| m.contains(p))
}

fn status_error(url: &str, status: u16) -> StoreError {
    let hint = match status {
        401 | 403 => " (a gated or private repository: set HF_TOKEN to a token with access)",
        404 => " (no such file: check the name)",
        _ => "",
    };
    http_err(url, format!("the server answered HTTP {status}{hint}"))
}

/// `bytes START-END/TOTAL` → (START, TOTAL).
fn content_range(v: &str) -> Option<(u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, _) = range.split_once('-')?;
    Some((start.parse().ok()?, total.parse().ok()))
}

/// Whether `quant` names this file: `…-Q4_K_M.gguf` for `q4_k_m`, not `…-Q4_K_M.gguf`
/// for `q4_k` (the tag must end where a name part ends).
fn names_quant(file: &str, quant: &str) -> bool {
    let f = file.rsplit('/').next().unwrap_or(file).to_ascii_uppercase();
    let q = quant.to_ascii_uppercase();
    f.match_indices(&q).any(|(i, _)| {
        let before = f[..i].chars().next_back();
        let after = f[i + q.len()..].chars().next();
        matches!(before, None | Some('-' | '.' | '_')) && matches!(after, Some('.' | '-'))
    })
}

fn is_split_part(file: &str) -> bool {
    // name-00001-of-00003.gguf
    let stem = file.strip_suffix(".gguf").unwrap_or(file);
    let parts: Vec<&str> = stem.rsplitn(3, '-').collect();
    parts.len() == 3
        && parts[1] == "of"
        && parts[0].len() == 5
        && parts[0].bytes().all(|b| b.is_ascii_digit())
        && parts[2].len() >= 5
        && parts[2][parts[2].len() - 5..]
            .bytes()
            .all(|b| b.is_ascii_digit())
}

/// The repository file a reference means, with its LFS sha256 and size.
pub(super) fn choose_hf_file(
    repo: &str,
    want: &HfFile,
    files: &[HfSibling],
) -> Result<(String, Option<(String, u64)>)> {
    let ggufs: Vec<&HfSibling> = files
        .iter()
        .filter(|f| f.path.to_ascii_lowercase().ends_with(".gguf"))
        .collect();
    let list = || {
        if ggufs.is_empty() {
            "it has no .gguf files".to_string()
        } else {
            let names: Vec<&str> = ggufs.iter().map(|f| f.path.as_str()).collect();
            format!("its GGUF files: {}", names.join(", "))
        }
    };
    let err = |detail: String| StoreError::HfSelect {
        repo: repo.to_string(),
        detail,
    };
    let pick = |quant: &str| -> Result<Option<&HfSibling>> {
        let hits: Vec<&&HfSibling> = ggufs
            .iter()
            .filter(|f| names_quant(&f.path, quant))
            .collect();
        let whole: Vec<&&HfSibling> = hits
            .iter()
            .copied()
            .filter(|f| !is_split_part(&f.path))
            .collect();
        match (whole.len(), hits.len()) {
            (1, _) => Ok(Some(whole[0])),
            (0, 0) => Ok(None),
            (0, _) => Err(err(format!(
                "{quant} is split into several files, which m40-llm cannot load yet"
            ))),
            _ => Err(err(format!(
                "several files match {quant}: {}; name one with hf.co/{repo}/FILE.gguf",
                whole
                    .iter()
                    .map(|f| f.path.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    };
    let chosen = match want {
        HfFile::Path(p) => files
            .iter()
            .find(|f| f.path == *p)
            .ok_or_else(|| err(format!("has no file {p}; {}", list())))?,
        HfFile::Quant(q) => {
            pick(q)?.ok_or_else(|| err(format!("has no file for {q}; {}", list())))?
        }
        HfFile::Default => match pick("Q4_K_M")? {
            Some(f) => f,
            None if ggufs.len() == 1 => ggufs[0],
            None => {
                return Err(err(format!(
                    "has no Q4_K_M file: pick one with hf.co/{repo}:QUANT; {}",
                    list()
                )))
            }
        },
    };
    Ok((chosen.path.clone(), chosen.lfs.clone()))
}

impl Store {
    fn hf_token_for(&self, url: &str) -> Option<String> {
        let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty())?;
        url.starts_with(&self.hf_endpoint).then_some(token)
    }

    /// The files of a Hugging Face model repository.
    pub(super) fn hf_listing(&self, repo: &str) -> Result<Vec<HfSibling>> {
        let url = format!("{}/api/models/{repo}?blobs=true", self.hf_endpoint);
        let mut req = agent().get(&url);
        if let Some(t) = self.hf_token_for(&url) {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let mut resp = req
            .call()
            .map_err(|e| unreachable(&url, &e).unwrap_or_else(|| http_err(&url, e.to_string())))?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(status_error(&url, status));
        }
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| http_err(&url, e.to_string()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| http_err(&url, format!("not a model listing: {e}")))?;
        let siblings = v
            .get("siblings")
            .and_then(|s| s.as_array())
            .ok_or_else(|| http_err(&url, "the listing has no `siblings`"))?;
        Ok(siblings
            .iter()
            .filter_map(|s| {
                let path = s.get("rfilename")?.as_str()?.to_string();
                let lfs = s.get("lfs").and_then(|l| {
                    let sha = l.get("sha256")?.as_str()?.to_ascii_lowercase();
                    Some((sha, l.get("size")?.as_u64()?))
                });
                Some(HfSibling { path, lfs })
            })
            .collect())
    }

    /// Fetch `url` into `blobs/sha256-<hex>`, resuming what an earlier pull
    /// left in `partial/`; refuse a file whose sha256 is not `expected`.
    /// Returns (path, sha256, size).
    pub(super) fn download(
        &self,
        url: &str,
        expected: Option<&str>,
        size_hint: Option<u64>,
        progress: &mut dyn Progress,
    ) -> Result<(PathBuf, String, u64)> {
        let blobs = self.root.join("blobs");
        let partials = self.root.join("partial");
        fs::create_dir_all(&blobs).map_err(io(&blobs))?;
        fs::create_dir_all(&partials).map_err(io(&partials))?;
        if let Some(e) = expected {
            let blob = blobs.join(format!("sha256-{e}"));
            if blob.is_file() {
                let size = fs::metadata(&blob).map_err(io(&blob))?.len();
                progress.status(&format!("already have sha256:{e}"));
                return Ok((blob, e.to_string(), size));
            }
        }
        let key = match expected {
            Some(e) => format!("sha256-{e}"),
            None => format!(
                "url-{}",
                &super::sha256_reader(url.as_bytes()).unwrap()[..24]
            ),
        };
        let partial = partials.join(&key);
        let digest = expected.map_or_else(|| url.to_string(), |e| format!("sha256:{e}"));
        progress.status(&format!("pulling {digest}"));
        // One pull per file at a time, across processes: the lock is held
        // until the file is in place, and goes with the process.
        let lock_path = partials.join(format!("{key}.lock"));
        let _lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        match _lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Err(StoreError::Busy(url.to_string())),
            Err(fs::TryLockError::Error(e)) => return Err(io(&lock_path)(e)),
        }
        self.fetch_to(url, &digest, &partial, size_hint, progress)?;
        let refuse = |e: StoreError| {
            let _ = fs::remove_file(&partial);
            e
        };
        check_gguf_magic(&partial, url).map_err(refuse)?;
        progress.status("verifying sha256 digest");
        let sha256 = sha256_file(&partial)?;
        if let Some(e) = expected {
            if e != sha256 {
                return Err(refuse(StoreError::Checksum {
                    what: url.to_string(),
                    expected: e.to_string(),
                    found: sha256,
                }));
            }
        }
        let size = fs::metadata(&partial).map_err(io(&partial))?.len();
        let blob = blobs.join(format!("sha256-{sha256}"));
        fs::rename(&partial, &blob).map_err(io(&blob))?;
        Ok((blob, sha256, size))
    }

    /// Fetch until `partial` holds the whole file, retrying lost connections.
    fn fetch_to(
        &self,
        url: &str,
        digest: &str,
        partial: &Path,
        size_hint: Option<u64>,
        progress: &mut dyn Progress,
    ) -> Result<()> {
        let agent = agent();
        let mut fruitless = 0;
        loop {
            let before = fs::metadata(partial).map_or(0, |m| m.len());
            match self.attempt(&agent, url, digest, partial, size_hint, progress)? {
                Attempt::Complete => break,
                Attempt::Interrupted(why) => {
                    let after = fs::metadata(partial).map_or(0, |m| m.len());
                    fruitless = if after > before { 0 } else { fruitless + 1 };
                    if fruitless >= MAX_FRUITLESS_ATTEMPTS {
                        return Err(http_err(
                            url,
                            format!(
                                "{why}; gave up after {fruitless} attempts in a row that fetched \
                                 nothing ({after} bytes are kept in {} and the next pull resumes)",
                                partial.display()
                            ),
                        ));
                    }
                    progress.status(&format!(
                        "connection lost ({why}); resuming at byte {after}"
                    ));
                    std::thread::sleep(self.retry_delay * (1 << fruitless.min(4)));
                }
            }
        }
        Ok(())
    }

    /// One request: fetch from where `partial` ends to the end of the file.
    fn attempt(
        &self,
        agent: &ureq::Agent,
        url: &str,
        digest: &str,
        partial: &Path,
        size_hint: Option<u64>,
        progress: &mut dyn Progress,
    ) -> Result<Attempt> {
        let offset = fs::metadata(partial).map_or(0, |m| m.len());
        let mut req = agent.get(url);
        if offset > 0 {
            req = req.header("Range", format!("bytes={offset}-"));
        }
        if let Some(t) = self.hf_token_for(url) {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let resp = match req.call() {
            Ok(r) => r,
            Err(e) => match unreachable(url, &e) {
                Some(fatal) => return Err(fatal),
                None => return Ok(Attempt::Interrupted(e.to_string())),
            },
        };
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (start, total) = match status {
            200 => {
                let len = header("content-length").and_then(|v| v.parse().ok());
                (0, len.or(size_hint))
            }
            206 => match header("content-range").as_deref().and_then(content_range) {
                Some((s, t)) if s == offset => (offset, t.or(size_hint)),
                _ => {
                    // A range we did not ask for: start over.
                    let _ = fs::remove_file(partial);
                    return Ok(Attempt::Interrupted(
                        "the server sent an unexpected range".into(),
                    ));
                }
            },
            // The file ends where the partial ends.
            416 if offset > 0 => return Ok(Attempt::Complete),
            408 | 429 | 500..=599 => {
                return Ok(Attempt::Interrupted(format!("HTTP {status}")));
            }
            _ => return Err(status_error(url, status)),
        };
        let mut file = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(start > 0)
            .truncate(start == 0)
            .open(partial)
            .map_err(io(partial))?;
        let mut body = resp.into_body().into_reader();
        let mut buf = vec![0u8; 256 << 10];
        let mut done = start;
        progress.bytes(digest, done, total);
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    file.flush().map_err(io(partial))?;
                    return Ok(Attempt::Interrupted(e.to_string()));
                }
            };
            file.write_all(&buf[..n]).map_err(io(partial))?;
            done += n as u64;
            progress.bytes(digest, done, total);
            if progress.cancelled() {
                file.sync_all().map_err(io(partial))?;
                return Err(StoreError::Cancelled(done));
            }
        }
        file.sync_all().map_err(io(partial))?;
        match total {
            Some(t) if done < t => Ok(Attempt::Interrupted(format!(
                "the connection closed at byte {done} of {t}"
            ))),
            _ => Ok(Attempt::Complete),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolver_and_tls_failures_are_not_retried() {
        let url = "https://nowhere.invalid/m.gguf";
        for e in [
            ureq::Error::HostNotFound,
            ureq::Error::Io(std::io::Error::other(
                "failed to lookup address information: Name or service not known",
            )),
            ureq::Error::Io(std::io::Error::other(
                "failed to lookup address information: Temporary failure in name resolution",
            )),
            ureq::Error::TooManyRedirects,
        ] {
            let fatal = unreachable(url, &e).unwrap_or_else(|| panic!("{e} retried"));
            let text = fatal.to_string();
            assert!(
                text.contains("cannot reach") && text.contains(url),
                "{text}"
            );
        }
        // Lost connections and timeouts are retried.
        for e in [
            ureq::Error::Io(std::io::ErrorKind::ConnectionReset.into()),
            ureq::Error::ConnectionFailed,
        ] {
            assert!(unreachable(url, &e).is_none(), "{e}");
        }
    }

    #[test]
    fn content_ranges_parse() {
        assert_eq!(content_range("bytes 100-199/200"), Some((100, Some(200))));
        assert_eq!(content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(content_range("items 1-2/3"), None);
    }

    #[test]
    fn quant_tags_match_whole_name_parts() {
        assert!(names_quant("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "q4_k_m"));
        assert!(!names_quant("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "q4_k"));
        assert!(names_quant("qwen2.5-0.5b-instruct-q4_0.gguf", "Q4_0"));
        assert!(!names_quant("model-IQ4_0.gguf", "q4_0"));
        assert!(names_quant("sub/dir/m.Q8_0.gguf", "q8_0"));
        assert!(is_split_part("big-Q4_K_M-00001-of-00003.gguf"));
        assert!(!is_split_part("big-Q4_K_M.gguf"));
    }

    #[test]
    fn hf_files_are_chosen_or_refused_with_the_list() {
        let f = |p: &str| HfSibling {
            path: p.into(),
            lfs: Some(("ab".into(), 1)),
        };
        let files = vec![
            f("README.md"),
            f("m-Q4_0.gguf"),
            f("m-Q4_K_M.gguf"),
            f("m-Q4_K_S.gguf"),
            f("big-Q8_0-00001-of-00002.gguf"),
            f("big-Q8_0-00002-of-00002.gguf"),
        ];
        let pick = |w: HfFile| choose_hf_file("o/r", &w, &files).map(|(p, _)| p);
        assert_eq!(pick(HfFile::Default).unwrap(), "m-Q4_K_M.gguf");
        assert_eq!(pick(HfFile::Quant("q4_0".into())).unwrap(), "m-Q4_0.gguf");
        assert_eq!(
            pick(HfFile::Path("m-Q4_K_S.gguf".into())).unwrap(),
            "m-Q4_K_S.gguf"
        );
        let e = pick(HfFile::Quant("q5_k_m".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("m-Q4_0.gguf") && e.contains("q5_k_m"), "{e}");
        let e = pick(HfFile::Quant("Q8_0".into())).unwrap_err().to_string();
        assert!(e.contains("split"), "{e}");
        let e = pick(HfFile::Path("nope.gguf".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no file nope.gguf"), "{e}");
        let two = vec![f("a-Q4_0.gguf"), f("b-Q4_0.gguf")];
        let e = choose_hf_file("o/r", &HfFile::Default, &two)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no Q4_K_M") && e.contains("b-Q4_0.gguf"), "{e}");
        let e = choose_hf_file("o/r", &HfFile::Quant("Q4_0".into()), &two)
            .unwrap_err()
            .to_string();
        assert!(e.contains("several"), "{e}");
    }
}
