//! A client of a running `m40-llm serve` (Ollama's API): `run` uses it when a
//! server answers with the asked-for model loaded, `ps` asks it what runs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use m40_runtime::{CancelToken, Message};
use m40_store::{same_model, Store};
use serde_json::{json, Value};

use crate::chat::{ChatBackend, ChatOptions, Turn};

/// The default address of `m40-llm serve`.
pub const DEFAULT_HOST: &str = "127.0.0.1";
pub const DEFAULT_PORT: u16 = 11434;

/// What `M40_HOST` says (`host`, `host:port`, or `http://host:port`), if set:
/// the host and, when it names one, the port.
pub fn env_host() -> Option<(String, Option<u16>)> {
    let raw = std::env::var("M40_HOST").ok().filter(|h| !h.is_empty())?;
    let raw = raw
        .strip_prefix("http://")
        .unwrap_or(&raw)
        .trim_end_matches('/');
    Some(match raw.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(':') => match p.parse() {
            Ok(port) => (h.to_string(), Some(port)),
            Err(_) => (raw.to_string(), None),
        },
        _ => (raw.to_string(), None),
    })
}

/// The server `M40_HOST` names, else 127.0.0.1:11434, as a URL; a wildcard
/// bind address is reached on loopback.
pub fn server_base() -> String {
    let (host, port) = env_host().unwrap_or((DEFAULT_HOST.into(), None));
    let host = match host.as_str() {
        "" | "0.0.0.0" => DEFAULT_HOST,
        "[::]" => "[::1]",
        h => h,
    };
    format!("http://{host}:{}", port.unwrap_or(DEFAULT_PORT))
}

/// A server's 401: what to do about it.
#[derive(Debug)]
pub struct Unauthorized {
    base: String,
    key_sent: bool,
}

impl std::fmt::Display for Unauthorized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key_sent {
            write!(
                f,
                "the server at {} refused the API key in M40_API_KEY: set it to the key the server was started with (--api-key or its M40_API_KEY)",
                self.base
            )
        } else {
            write!(
                f,
                "the server at {} needs an API key: set M40_API_KEY to the key it was started with (--api-key or its M40_API_KEY)",
                self.base
            )
        }
    }
}

impl std::error::Error for Unauthorized {}

/// A running server.
pub struct Client {
    base: String,
    agent: ureq::Agent,
    key: Option<String>,
}

fn agent(timeout: Option<Duration>) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_millis(500)))
        .timeout_global(timeout)
        .build()
        .into()
}

impl Client {
    /// The server at [`server_base`], if one answers (within about a second).
    pub fn probe() -> Option<Client> {
        let base = server_base();
        let c = Client {
            agent: agent(Some(Duration::from_secs(2))),
            base,
            key: std::env::var("M40_API_KEY").ok().filter(|k| !k.is_empty()),
        };
        // A server that wants a key answers 401 here: it is still a server
        // (its calls then say that a key is needed).
        match c.get("/api/version") {
            Ok(v) => {
                v.get("version")?;
            }
            Err(e) if e.downcast_ref::<Unauthorized>().is_some() => {}
            Err(_) => return None,
        }
        Some(Client {
            agent: agent(None),
            ..c
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn get(&self, path: &str) -> Result<Value> {
        let mut req = self.agent.get(&format!("{}{path}", self.base));
        if let Some(k) = &self.key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let mut r = req.call()?;
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string()?;
        self.check_status(path, status, &text)?;
        Ok(serde_json::from_str(&text)?)
    }

    /// An answer other than 200 as an error; 401 as [`Unauthorized`].
    fn check_status(&self, path: &str, status: u16, text: &str) -> Result<()> {
        match status {
            200 => Ok(()),
            401 => Err(Unauthorized {
                base: self.base.clone(),
                key_sent: self.key.is_some(),
            }
            .into()),
            _ => {
                let msg = serde_json::from_str::<Value>(text)
                    .ok()
                    .and_then(|v| v["error"].as_str().map(str::to_string))
                    .unwrap_or_else(|| text.to_string());
                bail!("{}{path}: HTTP {status}: {msg}", self.base)
            }
        }
    }

    /// The models the server has loaded (`/api/ps`).
    pub fn ps(&self) -> Result<Vec<Value>> {
        let v = self.get("/api/ps")?;
        Ok(v["models"].as_array().cloned().unwrap_or_default())
    }

    /// The name under which the server serves `model`, if it does: loaded
    /// or in its store (it loads it on demand), by the same name (catalog
    /// aliases and `:latest` aside), or a loaded model of the same file.
    /// An error when the server cannot be asked (an API key is needed).
    pub fn serving(&self, model: &str) -> Result<Option<String>> {
        let local_path = local_path(model);
        let mut names: Vec<String> = self
            .ps()?
            .iter()
            .filter_map(|m| m["name"].as_str().map(str::to_string))
            .collect();
        // Unloaded (`stop`): the server still serves it, loading it again.
        names.extend(self.get("/health")?["model"].as_str().map(str::to_string));
        let stored = self.get("/api/tags")?;
        let stored = stored["models"].as_array().into_iter().flatten();
        if let Some(name) = stored
            .filter_map(|m| m["name"].as_str())
            .find(|n| same_model(n, model))
        {
            return Ok(Some(name.to_string()));
        }
        for name in names {
            if same_model(&name, model) {
                return Ok(Some(name));
            }
            let Ok(show) = self.post_json("/api/show", &json!({ "model": name })) else {
                continue;
            };
            let from = show["modelfile"]
                .as_str()
                .and_then(|m| m.strip_prefix("FROM "))
                .map(str::trim);
            let served = from.and_then(|f| Path::new(f).canonicalize().ok());
            if served.is_some() && served == local_path {
                return Ok(Some(name));
            }
        }
        Ok(None)
    }

    /// Unload the model the server has loaded as `name` (Ollama's
    /// `keep_alive: 0`); the server loads it again on its next request.
    pub fn unload(&self, name: &str) -> Result<()> {
        let v = self.post_json("/api/generate", &json!({ "model": name, "keep_alive": 0 }))?;
        match v["done_reason"].as_str() {
            Some("unload") => Ok(()),
            other => bail!("the server did not unload {name} (it answered {other:?})"),
        }
    }

    fn post(&self, path: &str, body: &Value) -> Result<ureq::http::Response<ureq::Body>> {
        let mut req = self
            .agent
            .post(&format!("{}{path}", self.base))
            .header("Content-Type", "application/json");
        if let Some(k) = &self.key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        Ok(req.send(body.to_string())?)
    }

    fn post_json(&self, path: &str, body: &Value) -> Result<Value> {
        let mut r = self.post(path, body)?;
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string()?;
        self.check_status(path, status, &text)?;
        Ok(serde_json::from_str(&text)?)
    }

    /// POST a streaming request and feed each NDJSON object to `on_line`
    /// until the object with `done: true`, which is returned. Returns None
    /// when `cancel` fires first (closing the connection cancels the
    /// request on the server).
    pub fn stream(
        &self,
        path: &str,
        body: &Value,
        cancel: &CancelToken,
        on_line: &mut dyn FnMut(&Value),
    ) -> Result<Option<Value>> {
        let r = self.post(path, body)?;
        let status = r.status().as_u16();
        let mut body = r.into_body();
        if status != 200 {
            let text = body.read_to_string().unwrap_or_default();
            self.check_status(path, status, &text)?;
        }
        let reader = BufReader::new(body.into_reader());
        for line in reader.lines() {
            if cancel.is_cancelled() {
                return Ok(None);
            }
            let line = line.context("reading the server's answer")?;
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&line)
                .with_context(|| format!("the server sent something that is not JSON: {line}"))?;
            if let Some(e) = v["error"].as_str() {
                bail!("the server: {e}");
            }
            if v["done"] == json!(true) {
                return Ok(Some(v));
            }
            on_line(&v);
        }
        if cancel.is_cancelled() {
            return Ok(None);
        }
        Err(anyhow!("the server closed the stream before it was done"))
    }
}

/// Where `model` is on this machine, without fetching anything.
fn local_path(model: &str) -> Option<PathBuf> {
    let p = Path::new(model);
    if p.is_file() {
        return p.canonicalize().ok();
    }
    let m = Store::from_env().ok()?.manifest(model).ok()??;
    m.path.canonicalize().ok()
}

/// Ollama's `options` for these settings.
pub fn options(opts: &ChatOptions, num_ctx: Option<usize>) -> Value {
    let s = &opts.sampling;
    let mut o = json!({
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repeat_penalty": s.repeat_penalty,
        "repeat_last_n": s.penalty_last_n,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
    });
    if let Some(seed) = s.seed {
        o["seed"] = json!(seed);
    }
    if let Some(n) = opts.max_tokens {
        o["num_predict"] = json!(n);
    }
    if !opts.stop.is_empty() {
        o["stop"] = json!(opts.stop);
    }
    if let Some(n) = num_ctx {
        o["num_ctx"] = json!(n);
    }
    o
}

/// One line of figures from a final Ollama object.
pub fn stats_line(done: &Value, first_token: Option<Duration>) -> String {
    let n = |k: &str| done[k].as_u64().unwrap_or(0);
    let ms = |k: &str| n(k) as f64 / 1e6;
    let mut s = crate::chat::rates(
        n("prompt_eval_count"),
        ms("prompt_eval_duration"),
        n("eval_count"),
        ms("eval_duration"),
    );
    if let Some(t) = first_token {
        s += &format!(", first token after {:.0} ms", t.as_secs_f64() * 1e3);
    }
    if let Some(r) = done["done_reason"].as_str() {
        s += &format!(", {r}");
    }
    s
}

/// A conversation with a model a server has loaded.
pub struct RemoteChat {
    pub client: Client,
    pub model: String,
    pub num_ctx: Option<usize>,
}

impl ChatBackend for RemoteChat {
    fn model_text(&self, what: &str) -> Option<String> {
        let show = self
            .client
            .post_json("/api/show", &json!({ "model": self.model }))
            .ok()?;
        show[what]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    }

    fn describe(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "running on the server at {} ({} loaded there)",
            self.client.base(),
            self.model
        )];
        if let Ok(show) = self
            .client
            .post_json("/api/show", &json!({ "model": self.model }))
        {
            let d = &show["details"];
            lines.push(format!(
                "model: {} ({}, {} parameters, {})",
                self.model,
                d["family"].as_str().unwrap_or("?"),
                d["parameter_size"].as_str().unwrap_or("?"),
                d["quantization_level"].as_str().unwrap_or("?")
            ));
        }
        let loaded = self.client.ps().unwrap_or_default();
        if let Some(dev) = loaded
            .iter()
            .find(|m| m["name"] == json!(self.model))
            .and_then(|m| m["m40_backend"].as_str())
        {
            lines[0] += &format!(", on its {dev}");
        }
        lines
    }

    fn answer(
        &self,
        history: &[Message],
        opts: &ChatOptions,
        cancel: &CancelToken,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Turn> {
        let messages: Vec<Value> = history
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "stream": true,
            "options": options(opts, opts.num_ctx.or(self.num_ctx)),
        });
        if opts.json {
            body["format"] = json!("json");
        }
        match opts.think {
            Some(m40_runtime::Think::On) => body["think"] = json!(true),
            Some(m40_runtime::Think::Off) => body["think"] = json!(false),
            Some(m40_runtime::Think::Effort(ref e)) => body["think"] = json!(e),
            None => {}
        }
        let start = Instant::now();
        let mut first = None;
        let mut text = String::new();
        let mut show = crate::chat::Shown::default();
        let done = self.client.stream("/api/chat", &body, cancel, &mut |v| {
            let m = &v["message"];
            let thinking = m["thinking"].as_str().unwrap_or("");
            let content = m["content"].as_str().unwrap_or("");
            if !content.is_empty() {
                first.get_or_insert_with(|| start.elapsed());
                text.push_str(content);
            }
            let shown = show.text(thinking, content);
            if !shown.is_empty() {
                on_text(&shown);
            }
        })?;
        Ok(match done {
            Some(d) => Turn {
                text,
                cancelled: false,
                stats: stats_line(&d, None),
            },
            None => Turn {
                text,
                cancelled: true,
                stats: format!("stopped after {:.1} s", start.elapsed().as_secs_f64()),
            },
        })
    }
}
