//! Several models on one server (issue 59): any model the loader knows is
//! served by name and loaded by its first request; several stay loaded and
//! run at once; `max_loaded_models` and a load that does not fit unload the
//! least recently used idle model; a model running requests is never
//! unloaded (503 with Retry-After when nothing can be freed). Real engines
//! (the default model on the CPU, under several names) behind a real server.

mod common;

use std::io::{BufRead, BufReader};

use common::*;
use m40_serve::{Fit, KeepAlive, ServerConfig};
use serde_json::{json, Value};

const OTHER: &str = "other:135m";
const THIRD: &str = "third:135m";

fn generate(base: &str, model: &str) -> (u16, String) {
    let body = json!({"model": model, "prompt": "The capital of France is", "raw": true,
                      "stream": false, "options": greedy(6)});
    post_raw_at(base, "/api/generate", &body.to_string())
}

fn names(base: &str) -> Vec<String> {
    let mut n: Vec<String> = ps_at(base)
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect();
    n.sort();
    n
}

/// A streamed completion of `model` whose first token has arrived; the
/// rest of its lines (read to the end by the caller).
fn open_stream(base: &str, model: &str) -> std::io::Lines<BufReader<ureq::BodyReader<'static>>> {
    let body = json!({"model": model, "prompt": "Once upon a time", "stream": true,
                      "max_tokens": 200, "ignore_eos": true, "temperature": 0});
    let r = agent()
        .post(&format!("{base}/v1/completions"))
        .send(body.to_string())
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut lines = BufReader::new(r.into_body().into_reader()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("data: {"), "{first}");
    lines
}

#[test]
fn models_by_name_load_on_first_request_and_run_together() {
    let loader = TestLoader::new(&[NAME, OTHER], None);
    let base = loader.serve(ServerConfig::default());
    assert_eq!(names(&base), [NAME]);
    // An unknown name is a 404 that says how to get it; nothing loads.
    let (s, text) = generate(&base, "nope:7b");
    assert_eq!(s, 404, "{text}");
    assert!(text.contains("pull"), "{text}");
    assert_eq!(loader.loads(), 0);
    // The other model: loaded by its first request, answering as the
    // first does (the same weights under another name).
    let (s, a) = generate(&base, NAME);
    assert_eq!(s, 200, "{a}");
    let (s, b) = generate(&base, OTHER);
    assert_eq!(s, 200, "{b}");
    let response = |t: &str| serde_json::from_str::<Value>(t).unwrap()["response"].clone();
    assert_eq!(response(&a), response(&b));
    assert_eq!(loader.loads(), 1);
    assert_eq!(names(&base), [OTHER, NAME]);
    // Each in /api/ps with its own engine's memory; both in the OpenAI list.
    for m in ps_at(&base) {
        assert!(m["size"].as_u64().unwrap() > 0, "{m}");
        assert_eq!(m["context_length"], N_CTX, "{m}");
    }
    let mut r = agent().get(&format!("{base}/v1/models")).call().unwrap();
    let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&NAME) && ids.contains(&OTHER), "{v}");
    // While one model streams, the other answers (their engines step on
    // their own threads).
    let lines = open_stream(&base, NAME);
    let (s, c) = generate(&base, OTHER);
    assert_eq!(s, 200, "{c}");
    assert_eq!(response(&c), response(&b));
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(rest.iter().any(|l| l == "data: [DONE]"), "{rest:?}");
    // Unloading one (keep_alive 0) leaves the other; /metrics labels each.
    let stop = json!({"model": OTHER, "keep_alive": 0}).to_string();
    let (s, text) = post_raw_at(&base, "/api/generate", &stop);
    assert_eq!(s, 200, "{text}");
    assert_eq!(names(&base), [NAME]);
    let mut r = agent().get(&format!("{base}/metrics")).call().unwrap();
    let text = r.body_mut().read_to_string().unwrap();
    assert!(
        text.contains("m40_kv_pages{model=\"smollm2:135m\"}"),
        "{text}"
    );
    assert!(
        !text.contains("m40_kv_pages{model=\"other:135m\"}"),
        "{text}"
    );
}

#[test]
fn max_loaded_models_unloads_the_least_recently_used_idle_model() {
    let loader = TestLoader::new(&[NAME, OTHER, THIRD], None);
    let base = loader.serve(ServerConfig {
        max_loaded_models: 2,
        keep_alive: KeepAlive::Forever,
        // No wait for a busy model to finish: the 503 at once.
        wait_for_room: std::time::Duration::ZERO,
        ..Default::default()
    });
    assert_eq!(generate(&base, OTHER).0, 200);
    assert_eq!(names(&base), [OTHER, NAME]);
    // NAME was used last: the third unloads OTHER, idle the longest.
    assert_eq!(generate(&base, NAME).0, 200);
    assert_eq!(generate(&base, THIRD).0, 200);
    assert_eq!(names(&base), [NAME, THIRD]);
    assert_eq!(loader.loads(), 2);
    // With both loaded ones running requests, nothing can go: a 503 that
    // says when to come back, and the two streams finish untouched.
    let a = open_stream(&base, NAME);
    let b = open_stream(&base, THIRD);
    let mut r = agent()
        .post(&format!("{base}/api/generate"))
        .send(
            json!({"model": OTHER, "prompt": "hi", "stream": false, "options": greedy(1)})
                .to_string(),
        )
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers().get("retry-after").unwrap(), "5");
    let text = r.body_mut().read_to_string().unwrap();
    assert!(text.contains("retry later"), "{text}");
    for lines in [a, b] {
        let rest: Vec<String> = lines.map(Result::unwrap).collect();
        assert!(rest.iter().any(|l| l == "data: [DONE]"), "{rest:?}");
    }
    // Once they end, it loads (unloading the least recently used).
    assert_eq!(generate(&base, OTHER).0, 200);
    assert_eq!(names(&base).len(), 2);
    assert!(names(&base).contains(&OTHER.to_string()));
}

#[test]
fn a_model_that_does_not_fit_unloads_an_idle_one_first() {
    // Room for one model on the pretend GPU, none elsewhere.
    let loader = TestLoader::new(&[NAME, OTHER], Some(1));
    let base = loader.serve(ServerConfig {
        keep_alive: KeepAlive::Forever,
        wait_for_room: std::time::Duration::ZERO,
        ..Default::default()
    });
    // The first is idle: the other's load asks for its best place, does
    // not fit, and the server unloads the idle one and asks again (with
    // nothing left to free, anywhere: the GPU first where it fits, as a
    // server's options choose).
    assert_eq!(generate(&base, OTHER).0, 200);
    assert_eq!(names(&base), [OTHER]);
    assert_eq!(
        *loader.asked.lock().unwrap(),
        [
            (OTHER.to_string(), Fit::Best),
            (OTHER.to_string(), Fit::Anywhere)
        ]
    );
    // With the loaded one running a request, nothing can be freed: the
    // load may go anywhere, does not fit there either, and the request
    // gets a 503 with Retry-After while the stream goes on.
    let a = open_stream(&base, OTHER);
    let mut r = agent()
        .post(&format!("{base}/api/chat"))
        .send(
            json!({"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                     "stream": false})
            .to_string(),
        )
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert!(r.headers().get("retry-after").is_some());
    let text = r.body_mut().read_to_string().unwrap();
    assert!(text.contains("does not fit"), "{text}");
    assert_eq!(
        loader.asked.lock().unwrap().last().unwrap(),
        &(NAME.to_string(), Fit::Anywhere)
    );
    let rest: Vec<String> = a.map(Result::unwrap).collect();
    assert!(rest.iter().any(|l| l == "data: [DONE]"), "{rest:?}");
    assert_eq!(names(&base), [OTHER]);
    // Idle again: the first comes back in its place.
    assert_eq!(generate(&base, NAME).0, 200);
    assert_eq!(names(&base), [NAME]);
}

/// `max_memory`: each load plans within what the loaded models leave (as
/// their engines count their memory); a third model that does not fit
/// beside two unloads the least recently used idle one, and what is loaded
/// never exceeds the cap.
#[test]
fn a_memory_cap_unloads_the_least_recently_used_idle_model() {
    let one = engine_with(m40_runtime::EngineOptions::default())
        .memory()
        .total();
    let cap = 2 * one + one / 2;
    let loader = TestLoader::new(&[NAME, OTHER, THIRD], None);
    let base = loader.serve(ServerConfig {
        max_memory: Some(cap),
        keep_alive: KeepAlive::Forever,
        ..Default::default()
    });
    assert_eq!(generate(&base, OTHER).0, 200);
    assert_eq!(names(&base), [OTHER, NAME]);
    assert_eq!(generate(&base, NAME).0, 200);
    // Half a model's room is left: the third's plan does not fit it, so
    // OTHER (idle the longest) goes and the third loads whole.
    assert_eq!(generate(&base, THIRD).0, 200);
    assert_eq!(names(&base), [NAME, THIRD]);
    let sizes: Vec<u64> = ps_at(&base)
        .iter()
        .map(|m| m["size"].as_u64().unwrap())
        .collect();
    assert!(sizes.iter().sum::<u64>() <= cap, "{sizes:?} within {cap}");
    assert!(
        sizes.iter().all(|&s| s == one),
        "{sizes:?}: each whole ({one})"
    );
    // Three engines began to load: OTHER, the third refused by its plan
    // (no memory allocated), the third again.
    assert_eq!(loader.loads(), 3);
    let asked = loader.asked.lock().unwrap();
    assert_eq!(
        asked.iter().filter(|(n, _)| n == THIRD).count(),
        2,
        "{asked:?}"
    );
}
