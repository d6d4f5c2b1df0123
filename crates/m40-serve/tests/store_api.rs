//! The model store over HTTP (`/api/pull`, `/api/tags`, `/api/delete`,
//! names only unless allowed) and unloading with `keep_alive: 0`, against a
//! real server on a loopback port.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;

use common::*;
use m40_serve::{KeepAlive, ServerConfig};
use serde_json::{json, Value};

/// Serves `data` at `/m.gguf` (honouring Range); the first response stops
/// a third of the way through and closes the connection.
fn file_server(data: Vec<u8>) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for (i, c) in l.incoming().enumerate() {
            let Ok(mut c) = c else { continue };
            let mut r = BufReader::new(c.try_clone().unwrap());
            let (mut line, mut start) = (String::new(), 0usize);
            r.read_line(&mut line).unwrap();
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    start = v.trim().trim_end_matches('-').parse().unwrap();
                }
            }
            if !line.starts_with("GET /m.gguf ") {
                let _ = c.write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                continue;
            }
            let rest = &data[start..];
            let range = if start > 0 {
                format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{}/{}\r\n",
                    data.len() - 1,
                    data.len()
                )
            } else {
                "HTTP/1.1 200 OK\r\n".to_string()
            };
            let _ = write!(
                c,
                "{range}Content-Length: {}\r\nConnection: close\r\n\r\n",
                rest.len()
            );
            let body = if i == 0 {
                &rest[..rest.len() / 3]
            } else {
                rest
            };
            let _ = c.write_all(body);
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    });
    base
}

#[test]
fn the_store_api_pulls_lists_and_deletes() {
    let root = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("store-api");
    let _ = std::fs::remove_dir_all(&root);
    let store = m40_store::Store::new(&root);
    // URLs over HTTP only with --allow-any-pull; no sha256 to check them
    // against, so with Ollama's "insecure".
    let base = start(ServerConfig {
        store: Some(store),
        allow_any_pull: true,
        ..Default::default()
    });
    let mut data = b"GGUF".to_vec();
    data.extend((0..3_000_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
    let files = file_server(data.clone());
    let url = format!("{files}/m.gguf");
    let (status, text) = post_raw_at(&base, "/api/pull", &json!({"model": url}).to_string());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("cannot be verified"), "{text}");
    let (status, text) = post_raw_at(
        &base,
        "/api/pull",
        &json!({"model": url, "insecure": true}).to_string(),
    );
    assert_eq!(status, 200, "{text}");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let status_of = |v: &Value| v["status"].as_str().unwrap_or("").to_string();
    assert_eq!(status_of(&lines[0]), "pulling manifest");
    assert_eq!(status_of(lines.last().unwrap()), "success", "{text}");
    assert!(lines.iter().all(|l| l.get("error").is_none()), "{text}");
    assert!(
        lines.iter().any(|l| status_of(l).contains("resuming")),
        "{text}"
    );
    let counts: Vec<(u64, u64)> = lines
        .iter()
        .filter_map(|l| Some((l["completed"].as_u64()?, l["total"].as_u64()?)))
        .collect();
    assert!(!counts.is_empty(), "{text}");
    assert!(counts.iter().all(|&(_, t)| t == data.len() as u64));
    assert!(counts.windows(2).all(|w| w[0].0 <= w[1].0));
    assert_eq!(counts.last().unwrap().0, data.len() as u64);
    // Listed beside the loaded model, with its digest.
    let tags = |base: &str| -> Vec<Value> {
        let mut r = agent().get(&format!("{base}/api/tags")).call().unwrap();
        let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        v["models"].as_array().unwrap().clone()
    };
    let listed = tags(&base);
    let names: Vec<&str> = listed.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, [NAME, "m"]);
    assert_eq!(listed[1]["size"], data.len() as u64);
    assert_eq!(listed[1]["digest"].as_str().unwrap().len(), 64);
    // Pulling what is there: one object without streaming.
    let (status, text) = post_raw_at(
        &base,
        "/api/pull",
        &json!({"name": url, "stream": false, "insecure": true}).to_string(),
    );
    assert_eq!((status, text.as_str()), (200, r#"{"status":"success"}"#));
    // Bad references before any streaming; a missing file inside the stream.
    for (body, code, says) in [
        (
            json!({"model": "no-such-model:7b"}),
            404,
            "no-such-model:7b",
        ),
        (
            json!({"model": "hf.co/only-owner"}),
            400,
            "hf.co/OWNER/REPO",
        ),
        (json!({"stream": false}), 400, "model is required"),
        (
            json!({"model": format!("{files}/gone.gguf"), "stream": false, "insecure": true}),
            502,
            "HTTP 404",
        ),
    ] {
        let (status, text) = post_raw_at(&base, "/api/pull", &body.to_string());
        assert_eq!(status, code, "{body}: {text}");
        assert!(text.contains(says), "{body}: {text}");
    }
    let (status, text) = post_raw_at(
        &base,
        "/api/pull",
        &json!({"model": format!("{files}/gone.gguf"), "insecure": true}).to_string(),
    );
    assert_eq!(status, 200);
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert!(
        last["error"].as_str().unwrap().contains("HTTP 404"),
        "{text}"
    );
    // Delete: gone from the list and the disk; a second delete is 404.
    let del = |name: &str| {
        let mut r = agent()
            .delete(&format!("{base}/api/delete"))
            .force_send_body()
            .send(json!({"model": name}).to_string())
            .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    };
    assert_eq!(del("m").0, 200);
    let names: Vec<String> = tags(&base)
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, [NAME]);
    assert!(std::fs::read_dir(root.join("blobs"))
        .unwrap()
        .next()
        .is_none());
    let (status, text) = del("m");
    assert_eq!(status, 404);
    assert!(text.contains("model 'm' not found"), "{text}");
    // A server without a store says so.
    let (status, text) = post_raw("/api/pull", &json!({"model": url}).to_string());
    assert_eq!(status, 501, "{text}");
}

#[test]
fn pull_over_http_takes_names_only() {
    let root = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("store-locked");
    let _ = std::fs::remove_dir_all(&root);
    let base = start(ServerConfig {
        store: Some(m40_store::Store::new(&root)),
        ..Default::default()
    });
    let secret = root.join("secret.txt");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(&secret, "root:x:0:0:hunter2").unwrap();
    for model in [
        secret.to_str().unwrap().to_string(),
        "/etc/passwd".into(),
        root.to_str().unwrap().to_string(),
        "http://127.0.0.1:9/m.gguf".into(),
        "https://example.invalid/m.gguf".into(),
    ] {
        for stream in [true, false] {
            let body = json!({"model": model, "stream": stream}).to_string();
            let (status, text) = post_raw_at(&base, "/api/pull", &body);
            assert_eq!(status, 403, "{model}: {text}");
            assert!(text.contains("--allow-any-pull"), "{text}");
            assert!(
                !text.contains("hunter2") && !text.contains("root:"),
                "{text}"
            );
            let v: Value = serde_json::from_str(&text).unwrap();
            assert!(v["error"].is_string(), "{text}");
        }
    }
    assert!(!root.join("manifests").exists(), "nothing was named");
}

/// A server that can load its model again (counting the loads), whose
/// model stays `keep_alive` after its last request.
fn reloading_server(keep_alive: KeepAlive) -> (String, Arc<TestLoader>) {
    let loader = TestLoader::new(&[NAME], None);
    let base = loader.serve(ServerConfig {
        keep_alive,
        ..Default::default()
    });
    (base, loader)
}

/// `/api/ps`'s models.
fn ps(base: &str) -> Vec<Value> {
    ps_at(base)
}

/// Seconds from now to a model's `expires_at`.
fn expires_in(m: &Value) -> f64 {
    let at = chrono::DateTime::parse_from_rfc3339(m["expires_at"].as_str().unwrap()).unwrap();
    (at.with_timezone(&chrono::Utc) - chrono::Utc::now()).as_seconds_f64()
}

#[test]
fn keep_alive_zero_unloads_and_the_next_request_loads_again() {
    let (base, loads) = reloading_server(KeepAlive::default());
    assert_eq!(ps(&base).len(), 1);
    let stop = json!({"model": NAME, "keep_alive": 0}).to_string();
    let (s, text) = post_raw_at(&base, "/api/generate", &stop);
    assert_eq!(s, 200, "{text}");
    assert!(text.contains("\"done_reason\":\"unload\""), "{text}");
    assert!(ps(&base).is_empty(), "unloaded");
    // Described and listed while unloaded; the health check says so.
    let (s, show) = post_raw_at(&base, "/api/show", &json!({"model": NAME}).to_string());
    assert_eq!(s, 200, "{show}");
    let mut r = agent().get(&format!("{base}/health")).call().unwrap();
    let h: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(h["loaded"], false, "{h}");
    // "0s" unloads too, and unloading twice is fine.
    let (s, _) = post_raw_at(
        &base,
        "/api/chat",
        &json!({"model": NAME, "keep_alive": "0s"}).to_string(),
    );
    assert_eq!(s, 200);
    assert_eq!(loads.loads(), 0);
    // The next request loads it again, once, and answers as before.
    let body =
        json!({"model": NAME, "prompt": "Hi", "raw": true, "stream": false, "options": greedy(4)});
    let (s, a) = post_raw_at(&base, "/api/generate", &body.to_string());
    assert_eq!(s, 200, "{a}");
    assert_eq!(loads.loads(), 1);
    assert_eq!(ps(&base).len(), 1);
    let (_, b) = post_raw_at(&base, "/api/generate", &body.to_string());
    let text = |t: &str| serde_json::from_str::<Value>(t).unwrap()["response"].clone();
    assert_eq!(text(&a), text(&b));
    assert_eq!(loads.loads(), 1);
    // A server that cannot load its model again does not unload it.
    let (s, text) = post_raw("/api/generate", &stop);
    assert_eq!(s, 400, "{text}");
    assert_eq!(get("/api/ps").1.matches("\"name\"").count(), 1);
}

/// keep_alive as Ollama keeps it: the server's default (here 1 s) counted
/// from the end of the last request, a request's own (`-1`: forever, a
/// duration), shown in `/api/ps`; an idle model whose time ran out is
/// unloaded and the next request loads it again; a request in flight keeps
/// it loaded whatever its keep_alive.
#[test]
fn an_idle_model_is_unloaded_when_its_keep_alive_runs_out() {
    let (base, loads) = reloading_server(KeepAlive::For(std::time::Duration::from_secs(1)));
    let loaded = || loads.loads();
    let gen = |extra: Value| {
        let mut body = json!({"model": NAME, "prompt": "Hi", "raw": true, "stream": false,
                              "options": greedy(2)});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (s, t) = post_raw_at(&base, "/api/generate", &body.to_string());
        assert_eq!(s, 200, "{t}");
    };
    gen(json!({}));
    let m = ps(&base);
    assert_eq!(m.len(), 1);
    let left = expires_in(&m[0]);
    assert!((0.0..=1.05).contains(&left), "{left}");
    std::thread::sleep(std::time::Duration::from_millis(1600));
    assert!(ps(&base).is_empty(), "unloaded after 1 s idle");
    assert_eq!(loaded(), 0);
    // The next request loads it; "-1" keeps it.
    gen(json!({"keep_alive": -1}));
    assert_eq!(loaded(), 1);
    std::thread::sleep(std::time::Duration::from_millis(1300));
    let m = ps(&base);
    assert_eq!(m.len(), 1, "kept");
    assert!(expires_in(&m[0]) > 50.0 * 365.0 * 86400.0);
    // A duration of its own ("3s"), shown as such.
    gen(json!({"keep_alive": "3s"}));
    let left = expires_in(&ps(&base)[0]);
    assert!((2.0..=3.05).contains(&left), "{left}");
    assert_eq!(loaded(), 1);
}

/// A request in flight keeps its model loaded past a keep_alive of 0 (a
/// server whose default is 0): a stream's first token, then a pause far
/// longer than the server's watch takes to unload an idle model, then the
/// rest; once it ends the model goes.
#[test]
fn a_request_in_flight_keeps_its_model_loaded() {
    let (base, loads) = reloading_server(KeepAlive::For(std::time::Duration::ZERO));
    let body = json!({"model": NAME, "prompt": "Once upon a time", "stream": true,
                      "max_tokens": 300, "ignore_eos": true, "temperature": 0});
    let mut r = agent()
        .post(&format!("{base}/v1/completions"))
        .send(body.to_string())
        .unwrap();
    let mut lines = BufReader::new(r.body_mut().as_reader()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("data: {"), "{first}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(ps(&base).len(), 1, "in flight: loaded");
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(rest.iter().any(|l| l == "data: [DONE]"), "{rest:?}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(ps(&base).is_empty(), "keep_alive 0: unloaded once idle");
    // (The server's first engine, idle with a keep_alive of 0, may have
    // gone before the request came: at most that one load.)
    assert!(loads.loads() <= 1);
}
