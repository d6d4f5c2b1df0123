//! Load bench for the HTTP server (not a test): concurrent streaming chat
//! completions on loopback; requests/s, generated tokens/s, time to first
//! token and request latency (p50/p99) at each client count.
//!
//! ```text
//! cargo run --release -p m40-serve --example load -- [--url URL] [--model NAME|PATH]
//!     [--clients 1,8,32] [--requests N] [--max-tokens N] [--ctx N] [--cpu]
//!     [--probe N] [--probe-tokens N] [--probe-steady] [--no-prefix-cache]
//!     [--max-batch-tokens N]
//! ```
//! Without `--url` it loads the model (default: the default model) and
//! serves it in this process on a loopback port.
//!
//! `--probe N`: then the time to first token of a short request alone
//! (median of 5), and of 10 short requests sent while N other clients keep
//! the server busy (each sending requests one after another), against the
//! bound "2x alone plus one step" (a step: the server's steps over the
//! probe's wall time, from /metrics). The probes' first token is the
//! first chunk that carries one; its text may be empty (a character of
//! several tokens, such as an emoji, shows with its last), so the first
//! chunk with text is printed beside it. The table's TTFT is the first
//! text. The busy clients ask for `--probe-tokens N` tokens each
//! (default: `--max-tokens`); each first sends one shorter request
//! (client c of N: 1 + c x tokens / N), so they run out of step with each other, as independent users do, rather than
//! all sending their prompts in the same step. `--probe-steady`: the
//! issue's case instead, a short request arriving while the others decode:
//! the busy clients send their full requests together (`ignore_eos`: each
//! runs its `--probe-tokens`), and the probes start once every one of them
//! has its first token (their requests must outlast the probes:
//! `--probe-tokens` of a few hundred).

use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::time::{Duration, Instant};

use m40_runtime::{BackendChoice, Engine, EngineOptions};
use m40_serve::{AppState, ServerConfig};
use serde_json::{json, Value};

struct Args {
    url: Option<String>,
    model: String,
    clients: Vec<usize>,
    requests: Option<usize>,
    max_tokens: usize,
    ctx: usize,
    cpu: bool,
    probe: Option<usize>,
    no_prefix_cache: bool,
    max_batch_tokens: Option<usize>,
    probe_tokens: Option<usize>,
    probe_steady: bool,
}

const USAGE: &str = "usage: load [--url URL] [--model M] [--clients 1,8,32] [--requests N] \
[--max-tokens N] [--ctx N] [--cpu] [--probe BUSY] [--probe-tokens N] [--probe-steady] [--no-prefix-cache] \
[--max-batch-tokens N]";

fn args() -> Result<Args, String> {
    let mut a = Args {
        url: None,
        model: m40_store::DEFAULT_MODEL.into(),
        clients: vec![1, 8, 32],
        requests: None,
        max_tokens: 32,
        ctx: 2048,
        cpu: false,
        probe: None,
        no_prefix_cache: false,
        max_batch_tokens: None,
        probe_tokens: None,
        probe_steady: false,
    };
    fn num(k: &str, v: &str) -> Result<usize, String> {
        v.parse()
            .map_err(|_| format!("{k} takes a number, not {v:?}"))
    }
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or_else(|| format!("{k} needs a value"));
        match k.as_str() {
            "--url" => a.url = Some(v()?),
            "--model" => a.model = v()?,
            "--clients" => {
                a.clients = v()?
                    .split(',')
                    .map(|c| num("--clients", c))
                    .collect::<Result<_, _>>()?
            }
            "--requests" => a.requests = Some(num(&k, &v()?)?),
            "--max-tokens" => a.max_tokens = num(&k, &v()?)?,
            "--ctx" => a.ctx = num(&k, &v()?)?,
            "--cpu" => a.cpu = true,
            "--no-prefix-cache" => a.no_prefix_cache = true,
            "--probe" => a.probe = Some(num(&k, &v()?)?),
            "--max-batch-tokens" => a.max_batch_tokens = Some(num(&k, &v()?)?),
            "--probe-tokens" => a.probe_tokens = Some(num(&k, &v()?)?),
            "--probe-steady" => a.probe_steady = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// One request's figures.
struct Sample {
    /// The first chunk with a token (its text may be empty: the first
    /// bytes of a character spread over several tokens).
    first: Duration,
    /// The first chunk with text: what a reader sees first.
    ttft: Duration,
    total: Duration,
    tokens: u64,
    /// The first chunks' texts.
    head: Vec<String>,
}

fn one(
    agent: &ureq::Agent,
    url: &str,
    model: &str,
    prompt: &str,
    max_tokens: usize,
) -> Result<Sample, String> {
    request(agent, url, model, prompt, max_tokens, false)
}

/// [`one`], with `ignore_eos` (the steady probe's busy requests: a model
/// that ends its turn would otherwise send a new prompt soon).
fn request(
    agent: &ureq::Agent,
    url: &str,
    model: &str,
    prompt: &str,
    max_tokens: usize,
    ignore_eos: bool,
) -> Result<Sample, String> {
    let body = json!({
        "model": model, "stream": true, "max_tokens": max_tokens, "temperature": 0.7, "seed": 1,
        "stream_options": {"include_usage": true}, "ignore_eos": ignore_eos,
        "messages": [{"role": "user", "content": prompt}],
    });
    let start = Instant::now();
    let r = agent
        .post(&format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .send(body.to_string())
        .map_err(|e| e.to_string())?;
    if r.status() != 200 {
        return Err(format!("HTTP {}", r.status()));
    }
    let (mut first, mut ttft, mut head) = (None, None, Vec::new());
    let mut tokens = 0;
    for line in BufReader::new(r.into_body().into_reader()).lines() {
        let line = line.map_err(|e| e.to_string())?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
        let delta = &v["choices"][0]["delta"];
        // The role's chunk carries no token.
        if let (Some(t), true) = (delta["content"].as_str(), delta["role"].is_null()) {
            first.get_or_insert_with(|| start.elapsed());
            if !t.is_empty() {
                ttft.get_or_insert_with(|| start.elapsed());
            }
            if head.len() < 4 {
                head.push(t.to_string());
            }
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            tokens = n;
        }
    }
    let end = start.elapsed();
    Ok(Sample {
        first: first.unwrap_or(end),
        ttft: ttft.unwrap_or(end),
        total: end,
        tokens,
        head,
    })
}

/// A counter of the server's /metrics.
fn metric(agent: &ureq::Agent, url: &str, name: &str) -> f64 {
    let text = agent
        .get(&format!("{url}/metrics"))
        .call()
        .expect("GET /metrics")
        .into_body()
        .read_to_string()
        .expect("the metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics"))
}

/// `--probe`: a short request's time to first token alone and beside
/// `busy` clients.
fn probe(
    agent: &ureq::Agent,
    url: &str,
    model: &str,
    busy: usize,
    max_tokens: usize,
    steady: bool,
) {
    let short = |i: usize| format!("Say hello to {i}.");
    if steady {
        // Busy requests that end (at the context) or do not fit the pool
        // together (preemptions) make the window anything but steady. (The
        // prompts take more; and each request must outlast the probes.)
        let ctx = metric(agent, url, "m40_kv_cache_capacity_tokens");
        let pool = metric(agent, url, "m40_kv_pages") * metric(agent, url, "m40_kv_page_tokens");
        let need = (busy * max_tokens) as f64;
        if max_tokens as f64 >= ctx {
            eprintln!(
                "load: busy requests of {max_tokens} tokens end at the context ({ctx} tokens) and start again: \
                 fewer --probe-tokens or a larger --ctx keep the window steady"
            );
        } else if need > pool {
            eprintln!(
                "load: {busy} busy requests of {max_tokens} tokens need more than {need} KV tokens, the pool holds {pool}: \
                 expect preemptions (fewer --probe-tokens or a larger --ctx keep the window steady)"
            );
        }
    }
    let mut alone: Vec<Duration> = (0..5)
        .map(|i| one(agent, url, model, &short(i), 4).expect("a probe").first)
        .collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let firsts_served = || metric(agent, url, "m40_time_to_first_token_seconds_count");
    let served0 = firsts_served();
    // Every request's (when its first token came, its TTFT), to set beside
    // the server's own TTFT (from when the engine took the request).
    let firsts = Arc::new(std::sync::Mutex::new(Vec::<(Instant, Duration)>::new()));
    // The busy clients' failed requests (each sends its next one).
    let errors = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handles: Vec<_> = (0..busy)
        .map(|c| {
            let (agent, url, model, stop, firsts, errors) = (
                agent.clone(),
                url.to_string(),
                model.to_string(),
                stop.clone(),
                firsts.clone(),
                errors.clone(),
            );
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let prompt =
                        format!("Client {c}, request {i}: tell a long story about the number {i}.");
                    // The first request's length puts the clients out of step
                    // (unless steady).
                    let tokens = match i {
                        0 if !steady => 1 + c * max_tokens / busy,
                        _ => max_tokens,
                    };
                    let sent = Instant::now();
                    match request(&agent, &url, &model, &prompt, tokens, steady) {
                        Ok(s) => firsts.lock().unwrap().push((sent + s.first, s.first)),
                        Err(e) => {
                            if errors.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                                eprintln!("a busy client's first error: {e}");
                            }
                        }
                    }
                    i += 1;
                }
            })
        })
        .collect();
    if steady {
        // Every busy client's first token served (their prompts done),
        // then a few decode steps.
        let deadline = Instant::now() + Duration::from_secs(120);
        while firsts_served() < served0 + busy as f64 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(100));
    } else {
        std::thread::sleep(Duration::from_secs(2));
    }
    let server_ttft = |agent| {
        let m = |n| metric(agent, url, n);
        (
            m("m40_time_to_first_token_seconds_sum"),
            m("m40_time_to_first_token_seconds_count"),
        )
    };
    let (s0, t0, ttft0, pre0) = (
        metric(agent, url, "m40_steps_total"),
        Instant::now(),
        server_ttft(agent),
        metric(agent, url, "m40_preemptions_total"),
    );
    let mut texts = Vec::new();
    let mut loaded: Vec<Duration> = (0..10)
        .map(|i| {
            std::thread::sleep(Duration::from_millis(100));
            let sent = Instant::now();
            let unix = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64() * 1e3);
            let s = one(agent, url, model, &short(100 + i), 4).expect("a probe");
            firsts.lock().unwrap().push((sent + s.first, s.first));
            // The clock of the server's M40_STEP_STATS lines.
            println!(
                "probe {i}: sent at {unix:.1} ms (Unix time), first token after {:.1} ms, its first text after {:.1} ms ({:?})",
                s.first.as_secs_f64() * 1e3,
                s.ttft.as_secs_f64() * 1e3,
                s.head
            );
            texts.push(s.ttft);
            s.first
        })
        .collect();
    let (s1, wall, ttft1, pre1) = (
        metric(agent, url, "m40_steps_total"),
        t0.elapsed(),
        server_ttft(agent),
        metric(agent, url, "m40_preemptions_total"),
    );
    let t1 = t0 + wall;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for h in handles {
        h.join().unwrap();
    }
    let seen: Vec<f64> = firsts
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| (t0..t1).contains(at))
        .map(|(_, d)| d.as_secs_f64() * 1e3)
        .collect();
    println!(
        "probe window: {} first tokens, TTFT mean {:.2} ms at the clients, {:.2} ms in the server ({} first tokens); \
         {} preemptions; the busy clients' failed requests (whole run): {}",
        seen.len(),
        seen.iter().sum::<f64>() / seen.len().max(1) as f64,
        (ttft1.0 - ttft0.0) * 1e3 / (ttft1.1 - ttft0.1).max(1.0),
        ttft1.1 - ttft0.1,
        pre1 - pre0,
        errors.load(std::sync::atomic::Ordering::SeqCst),
    );
    let step_ms = wall.as_secs_f64() * 1e3 / (s1 - s0).max(1.0);
    let solo = pct(&mut alone, 0.5);
    let bound = 2.0 * solo + step_ms;
    let (p50, worst) = (pct(&mut loaded, 0.5), pct(&mut loaded, 1.0));
    println!(
        "probe{}: TTFT alone {solo:.1} ms (median of 5); beside {busy} busy clients {p50:.1} ms median, \
         {worst:.1} ms worst of 10; a step {step_ms:.1} ms; bound 2x alone + a step = {bound:.1} ms: {}",
        if steady { " (steady: every busy client decoding)" } else { "" },
        if worst <= bound { "met" } else { "not met" }
    );
    // A character of several tokens (an emoji) shows only with its last.
    println!(
        "probe: first text (the first chunk with any): {:.1} ms median, {:.1} ms worst of 10",
        pct(&mut texts, 0.5),
        pct(&mut texts, 1.0)
    );
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e3
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("load: {e}");
            }
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    let (url, model) = match &a.url {
        Some(u) => (u.trim_end_matches('/').to_string(), a.model.clone()),
        None => {
            let opts = {
                let mut o = EngineOptions::default();
                o.n_ctx = Some(a.ctx);
                o.backend = if a.cpu {
                    BackendChoice::Cpu
                } else {
                    BackendChoice::Auto
                };
                o.no_prefix_cache = a.no_prefix_cache;
                o.max_batch_tokens = a.max_batch_tokens;
                o
            };
            let path = m40_store::Store::from_env()
                .and_then(|s| s.resolve(&a.model, &mut |m: &str| eprintln!("{m}")))
                .expect("finding the model");
            let engine = Arc::new(Engine::from_path(&path, opts).expect("loading the model"));
            let config = ServerConfig {
                max_queue: 1024,
                ..Default::default()
            };
            let state = AppState::new(engine, &a.model, config);
            let addr = m40_serve::spawn_loopback(state).expect("starting the server");
            (format!("http://{addr}"), a.model.clone())
        }
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(3600)))
        .build()
        .into();
    // Warm up (first-touch of the weights, thread pools).
    one(&agent, &url, &model, "Hello", 4).expect("warm-up request");
    println!(
        "server {url}, model {model}, {} tokens per request (streaming /v1/chat/completions)",
        a.max_tokens
    );
    println!("| clients | requests | errors | req/s | gen tok/s | TTFT p50 ms | TTFT p99 ms | latency p50 ms | latency p99 ms |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for &c in &a.clients {
        let n = a.requests.unwrap_or((2 * c).max(8));
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let start = Instant::now();
        let handles: Vec<_> = (0..c)
            .map(|_| {
                let (agent, url, model, next) =
                    (agent.clone(), url.clone(), model.clone(), next.clone());
                let max = a.max_tokens;
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if i >= n {
                            break out;
                        }
                        let prompt =
                            format!("Request {i}: write a short line about the number {i}.");
                        out.push(one(&agent, &url, &model, &prompt, max));
                    }
                })
            })
            .collect();
        let results: Vec<Result<Sample, String>> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let wall = start.elapsed().as_secs_f64();
        let ok: Vec<&Sample> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        let errors = results.len() - ok.len();
        if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
            eprintln!("first error: {e}");
        }
        let tokens: u64 = ok.iter().map(|s| s.tokens).sum();
        let mut ttft: Vec<Duration> = ok.iter().map(|s| s.ttft).collect();
        let mut lat: Vec<Duration> = ok.iter().map(|s| s.total).collect();
        if ok.is_empty() {
            println!("| {c} | {n} | {errors} | - | - | - | - | - | - |");
            continue;
        }
        println!(
            "| {c} | {n} | {errors} | {:.2} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} |",
            ok.len() as f64 / wall,
            tokens as f64 / wall,
            pct(&mut ttft, 0.5),
            pct(&mut ttft, 0.99),
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99),
        );
    }
    // What the server did over all of it (the warm-up included): prompt
    // tokens, those the prefix cache saved, and the tokens a step took.
    let m = |name| metric(&agent, &url, name);
    let (prompt, saved, hits) = (
        m("m40_prompt_tokens_total"),
        m("m40_prefill_tokens_saved_total"),
        m("m40_prefix_cache_hits_total"),
    );
    let (steps, step_tokens) = (m("m40_steps_total"), m("m40_step_tokens_total"));
    println!(
        "server: {prompt} prompt tokens, {saved} of them from the prefix cache ({hits} hits); \
         {steps} steps, {:.1} tokens a step",
        step_tokens / steps.max(1.0)
    );
    if let Some(busy) = a.probe {
        probe(
            &agent,
            &url,
            &model,
            busy,
            a.probe_tokens.unwrap_or(a.max_tokens),
            a.probe_steady,
        );
    }
}
