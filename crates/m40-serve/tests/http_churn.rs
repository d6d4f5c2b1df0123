//! A server with several models under churn (issue 59): 200 mixed
//! requests over two synth models (generate, chat, OpenAI's routes, streamed
//! or not, embeddings), a quarter of them cancelled by their client, and a
//! third model asked for midway, which waits for a loaded one to finish its
//! requests and unloads it (at most two loaded). Nothing may fail (a 503
//! would need a wait past `wait_for_room`); greedy answers are each
//! model's own; at the end nothing runs, no KV page is held, and the
//! process's memory is back where a warm server's was.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{agent, ps_at};
use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
use m40_runtime::{BackendChoice, Engine, EngineError, EngineOptions};
use m40_serve::{AppState, Fit, KeepAlive, Loader, ServerConfig};
use serde_json::{json, Value};

const MODELS: [&str; 3] = ["tiny-a", "tiny-b", "tiny-c"];

/// Three random tiny models (different seeds: different answers).
struct Synth {
    paths: Vec<(String, PathBuf)>,
    loads: AtomicUsize,
}

impl Synth {
    fn new(dir: &std::path::Path) -> Synth {
        let paths = MODELS
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let path = dir.join(format!("{name}.gguf"));
                let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
                let opts = SynthOptions {
                    shape: Shape::find("tiny").unwrap(),
                    ty: FileType::All(m40_gguf::GgmlType::Q8_0),
                    seed: 40 + i as u64,
                };
                write_model(f, &opts, |_, _| {}).unwrap();
                (name.to_string(), path)
            })
            .collect();
        Synth {
            paths,
            loads: AtomicUsize::new(0),
        }
    }

    fn engine(&self, name: &str) -> Result<Engine, EngineError> {
        let path = &self.paths.iter().find(|(n, _)| n == name).unwrap().1;
        let mut o = EngineOptions::default();
        o.n_ctx = Some(256);
        o.backend = BackendChoice::Cpu;
        Engine::from_path(path, o)
    }
}

impl Loader for Synth {
    fn resolve(&self, requested: &str) -> Option<String> {
        MODELS
            .iter()
            .find(|n| m40_store::same_model(requested, n))
            .map(|n| n.to_string())
    }

    fn load(&self, name: &str, _: Fit, _: Option<u64>) -> Result<Engine, EngineError> {
        self.loads.fetch_add(1, Ordering::SeqCst);
        self.engine(name)
    }
}

/// The process's resident memory, bytes (Linux).
fn rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// What one request ended as.
enum Outcome {
    /// A greedy non-streamed generate: its text.
    Greedy(String, String),
    Done,
    Busy,
}

/// One request of kind `kind` to `model`; `cancel`: the client goes after
/// the first streamed line.
fn request(base: &str, model: &str, kind: u64, cancel: bool) -> Outcome {
    let greedy = json!({"temperature": 0, "num_predict": 8});
    let (path, body, streamed) = match kind {
        0 => (
            "/api/generate",
            json!({"model": model, "prompt": "Once upon a time", "raw": true,
                   "stream": false, "options": greedy}),
            false,
        ),
        1 => (
            "/api/generate",
            json!({"model": model, "prompt": "The sea", "options": {"num_predict": 24, "seed": 1}}),
            true,
        ),
        2 => (
            "/api/chat",
            json!({"model": model, "messages": [{"role": "user", "content": "Hi there"}],
                   "options": {"num_predict": 24}}),
            true,
        ),
        3 => (
            "/v1/chat/completions",
            json!({"model": model, "messages": [{"role": "user", "content": "Hello"}],
                   "max_tokens": 16, "stream": true}),
            true,
        ),
        4 => (
            "/v1/completions",
            json!({"model": model, "prompt": "A long time ago", "max_tokens": 12}),
            false,
        ),
        _ => (
            "/api/embed",
            json!({"model": model, "input": ["one text", "and another"]}),
            false,
        ),
    };
    let r = agent()
        .post(&format!("{base}{path}"))
        .send(body.to_string())
        .unwrap();
    let status = r.status().as_u16();
    if status == 503 {
        assert!(r.headers().get("retry-after").is_some(), "a 503 says when");
        return Outcome::Busy;
    }
    let mut reader = BufReader::new(r.into_body().into_reader());
    if status != 200 {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut reader, &mut text);
        panic!("{path} {body}: {status} {text}");
    }
    if streamed {
        let mut first = String::new();
        reader.read_line(&mut first).unwrap();
        assert!(!first.contains("\"error\""), "{first}");
        if cancel {
            return Outcome::Done; // the connection closes with the reader
        }
        let rest: Vec<String> = reader.lines().map(Result::unwrap).collect();
        let last = rest.iter().rev().find(|l| !l.trim().is_empty()).unwrap();
        assert!(
            last.contains("\"done\":true") || last == "data: [DONE]",
            "{path}: {last}"
        );
        return Outcome::Done;
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut reader, &mut text).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v.get("error").is_none(), "{v}");
    match kind {
        0 => Outcome::Greedy(model.to_string(), v["response"].as_str().unwrap().into()),
        _ => Outcome::Done,
    }
}

/// Every loaded model idle: nothing running or waiting, no KV page held.
fn all_idle(base: &str) -> bool {
    ps_at(base).iter().all(|m| {
        let a = &m["m40_activity"];
        a["running"] == 0 && a["waiting"] == 0 && a["kv_pages_used"] == 0
    })
}

fn wait_idle(base: &str) {
    let t = std::time::Instant::now();
    while !all_idle(base) {
        assert!(t.elapsed().as_secs() < 60, "never idle: {:?}", ps_at(base));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn two_hundred_mixed_requests_over_two_models_with_cancels_and_an_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let synth = Arc::new(Synth::new(dir.path()));
    // Each model's greedy answer, from an engine of its own.
    let want: Vec<(String, String)> = MODELS
        .iter()
        .map(|m| {
            let e = synth.engine(m).unwrap();
            let mut req =
                m40_runtime::Request::new(m40_runtime::Prompt::Text("Once upon a time".into()));
            req.sampling = m40_runtime::SamplingParams::greedy();
            req.max_tokens = Some(8);
            let done = e
                .generate(&req, &m40_runtime::CancelToken::new(), |_| {})
                .unwrap();
            (m.to_string(), done.text)
        })
        .collect();
    assert_ne!(want[0].1, want[1].1, "two different models");
    let first = Arc::new(synth.engine(MODELS[0]).unwrap());
    let state = AppState::new(
        first,
        MODELS[0],
        ServerConfig {
            loader: Some(synth.clone()),
            max_loaded_models: 2,
            keep_alive: KeepAlive::Forever,
            max_queue: 256,
            ..Default::default()
        },
    );
    let base = format!("http://{}", m40_serve::spawn_loopback(state).unwrap());
    let check = |o: Outcome| match o {
        Outcome::Greedy(model, text) => {
            let w = &want.iter().find(|(m, _)| *m == model).unwrap().1;
            assert_eq!(&text, w, "{model}'s greedy answer");
            0
        }
        Outcome::Done => 0,
        Outcome::Busy => 1,
    };
    // Warm: both models loaded and each kind of request served once.
    for kind in 0..6 {
        for m in &MODELS[..2] {
            check(request(&base, m, kind, false));
        }
    }
    wait_idle(&base);
    let warm = rss();
    let busy = AtomicUsize::new(0);
    let third_asked = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (base, busy, third_asked, check) = (&base, &busy, &third_asked, &check);
            s.spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                for i in 0..25 {
                    // Midway, one client asks for the third model.
                    let model = if t == 0 && i == 12 {
                        third_asked.fetch_add(1, Ordering::SeqCst);
                        MODELS[2]
                    } else {
                        MODELS[rng.below(2) as usize]
                    };
                    let kind = rng.below(6);
                    let cancel = rng.below(4) == 0;
                    busy.fetch_add(check(request(base, model, kind, cancel)), Ordering::SeqCst);
                }
            });
        }
    });
    wait_idle(&base);
    let loaded: Vec<String> = ps_at(&base)
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect();
    println!(
        "200 requests: {} answered 503, {} loads, loaded at the end {loaded:?}; \
         RSS warm {:?} MiB, after {:?} MiB",
        busy.load(Ordering::SeqCst),
        synth.loads.load(Ordering::SeqCst),
        warm.map(|b| b >> 20),
        rss().map(|b| b >> 20)
    );
    assert!(loaded.len() <= 2, "{loaded:?}");
    // The third model was loaded, one unloaded for it (and loaded again
    // when asked for after).
    assert_eq!(busy.load(Ordering::SeqCst), 0);
    assert!(synth.loads.load(Ordering::SeqCst) >= 1);
    assert_eq!(third_asked.load(Ordering::SeqCst), 1);
    // The server's own counters are back to idle.
    let mut r = agent().get(&format!("{base}/metrics")).call().unwrap();
    let text = r.body_mut().read_to_string().unwrap();
    for line in ["m40_requests_running 0", "m40_kv_cache_tokens 0"] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    if let (Some(warm), Some(now)) = (warm, rss()) {
        assert!(
            now < warm + (64 << 20),
            "resident memory grew from {warm} to {now} bytes"
        );
    }
}
