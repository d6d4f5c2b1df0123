//! m40-serve: Ollama- and OpenAI-compatible HTTP APIs over one loaded
//! [`m40_runtime::Engine`]. A thin layer: requests are parsed and checked
//! here, generation is the engine's.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! let path = m40_store::Store::from_env()?.resolve("smollm2:135m", &mut |_: &str| {})?;
//! let engine = m40_runtime::Engine::from_path(&path, Default::default())?;
//! let state = m40_serve::AppState::new(Arc::new(engine), "smollm2:135m", Default::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:11434").await?;
//! m40_serve::serve(listener, state, async { tokio::signal::ctrl_c().await.ok(); }).await?;
//! # Ok(()) }
//! ```
//!
//! Requests run together: the engine batches every sequence in flight
//! (continuous batching, m40-sched), admitting them first come, first
//! served while its KV cache has room. When `max_queue` sequences already
//! wait for admission, a request is answered 503 with `Retry-After`. A
//! client that disconnects cancels its request (its KV pages are freed at
//! the engine's next step).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use m40_runtime::{CancelToken, Completion, Engine, Request, TokenEvent};
use m40_store::Store;
use serde::de::DeserializeOwned;

mod create;
mod defaults;
mod embed;
mod format;
mod keep_alive;
mod layers;
mod metrics;
mod models;
mod ollama;
mod openai;
mod slot;
mod slots;
mod store_api;
mod tools;

pub use keep_alive::KeepAlive;
pub use layers::DEFAULT_ORIGINS;
use metrics::Metrics;
use slot::Slot;
use slots::Served;
pub use slots::{Fit, Loader, StoreLoader};

/// Server limits.
#[derive(Clone)]
pub struct ServerConfig {
    /// Requests waiting for admission (the engine's KV cache or its
    /// `parallel` limit full) beyond this are refused with 503.
    pub max_queue: usize,
    /// A request running longer than this is cancelled (its output so far
    /// is returned, finish reason `cancelled`/`length`).
    pub request_timeout: Duration,
    /// Largest request body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// `Authorization: Bearer <key>` required on every route but `/` and
    /// `/health` when set.
    pub api_key: Option<String>,
    /// The model store behind `/api/tags`, `/api/pull` and `/api/delete`
    /// (without one, tags lists the loaded model and the others are 501).
    pub store: Option<Store>,
    /// Let `/api/pull` take what the local CLI takes: a path on the
    /// server's disk or any URL (`serve --allow-any-pull`). Off, clients
    /// pull catalog names and Hugging Face references only.
    pub allow_any_pull: bool,
    /// Loads models by name: any the server may serve beside the one it
    /// started with, and that one again after an unload (`keep_alive: 0`,
    /// as `m40-llm stop` and `ollama stop` send). Without one, the server
    /// serves its first model only and never unloads it.
    pub loader: Option<Arc<dyn Loader>>,
    /// Models loaded at once at most (`--max-loaded-models`,
    /// `M40_MAX_LOADED_MODELS`; Ollama's `OLLAMA_MAX_LOADED_MODELS`); 0:
    /// as many as fit.
    pub max_loaded_models: usize,
    /// Bytes all loaded models may take together (weights, KV caches,
    /// workspaces, as [`Engine::memory`] counts them), where given: each
    /// load plans within what the others leave (its KV cache shrinks to
    /// fit, down to one context), and one that does not fit unloads the
    /// least recently used idle model first (`serve --max-memory`,
    /// `M40_MAX_MEMORY`; a 24 GB M40's budget on a larger GPU).
    pub max_memory: Option<u64>,
    /// How long a load waits for a loaded model to finish its requests
    /// (so that it can be unloaded) where nothing else frees room, before
    /// the request gets a 503 with `Retry-After` (default 30 s).
    pub wait_for_room: Duration,
    /// How long the model stays loaded after its last request ends,
    /// where a request does not say (Ollama's default: 5 minutes;
    /// `serve --keep-alive`, `M40_KEEP_ALIVE`). Only a server with
    /// `reload` unloads it.
    pub keep_alive: KeepAlive,
    /// Browser origins allowed beside [`DEFAULT_ORIGINS`] (Ollama's:
    /// this machine's pages and app webviews), each a pattern where `*`
    /// stands for anything (`--origins`, `M40_ORIGINS`; `OLLAMA_ORIGINS`).
    pub origins: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_queue: 64,
            request_timeout: Duration::from_secs(600),
            max_body_bytes: 8 << 20,
            api_key: None,
            store: None,
            allow_any_pull: false,
            loader: None,
            max_loaded_models: 0,
            max_memory: None,
            wait_for_room: Duration::from_secs(30),
            keep_alive: KeepAlive::default(),
            origins: Vec::new(),
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    /// The models served, loaded or not (`slots.rs`); the first is the
    /// one the server started with.
    slots: std::sync::Mutex<Vec<Arc<Slot>>>,
    /// One load at a time.
    loading: tokio::sync::Mutex<()>,
    config: ServerConfig,
    metrics: Metrics,
}

impl AppState {
    /// Serve `engine` under `name` (e.g. `smollm2:135m`; requests may also
    /// say `smollm2:135m:latest`-style tags of it or leave the tag out),
    /// and any model `config.loader` can load.
    pub fn new(engine: Arc<Engine>, name: &str, config: ServerConfig) -> Self {
        let first = Slot::with(engine, name, config.keep_alive, config.loader.is_some());
        if let Some(l) = &config.loader {
            first.set_modelfile(l.modelfile(name));
        }
        Self {
            inner: Arc::new(Inner {
                slots: std::sync::Mutex::new(vec![Arc::new(first)]),
                loading: tokio::sync::Mutex::new(()),
                config,
                metrics: Metrics::default(),
            }),
        }
    }

    /// The model the server started with, loaded or not.
    pub(crate) fn first(&self) -> Arc<Slot> {
        let slots = self.inner.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots[0].clone()
    }

    /// The name of the model the server started with.
    pub(crate) fn name(&self) -> String {
        self.first().name.clone()
    }

    pub(crate) fn store(&self) -> Option<&Store> {
        self.inner.config.store.as_ref()
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// A 503 with `Retry-After` while `max_queue` sequences wait.
    pub(crate) fn check_queue(&self, engine: &Engine) -> Result<(), ApiError> {
        let waiting = engine.activity().waiting;
        if waiting >= self.inner.config.max_queue {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the server is busy ({waiting} requests waiting); retry later"),
            )
            .retry_after(5));
        }
        Ok(())
    }
}

impl Served {
    /// Check a request against the context (the loaded one, or `ctx` where
    /// a request asks for less) and hand it to the engine, which runs it
    /// with the others in flight; it streams into the returned [`Running`].
    pub(crate) fn start(self, mut req: Request, ctx: Option<usize>) -> Result<Running, ApiError> {
        let received = Instant::now();
        let Served {
            state,
            engine,
            lease,
        } = self;
        // Generation stops where the context ends.
        req.context = ctx;
        req.fit_max_tokens = true;
        let prepared = engine
            .prepare(req)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let clock = RequestClock::start(received);
        state.check_queue(&engine)?;
        let cancel = CancelToken::new();
        let metrics = state.inner.metrics.clone();
        let prompt_ids = prepared.prompt_tokens().to_vec();
        metrics.started(prompt_ids.len());
        let timeout = state.inner.config.request_timeout;
        let timer = {
            let c = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                c.cancel();
            })
        };
        // The engine's step loop runs it; its tokens arrive on this task
        // as they are sampled (no thread of its own).
        let generation = engine.start(&prepared, &cancel);
        Ok(Running {
            generation: Some(generation),
            timer,
            metrics,
            started: Instant::now(),
            last: None,
            events: 0,
            prompt_ids,
            engine,
            clock,
            _lease: lease,
        })
    }
}

/// `M40_REQUEST_STATS=1`: each request's hand-offs to stderr, from when
/// `start` took it: its prompt prepared, its generation started, and its
/// first token taken by the response (`Running::recv`). What a client sees
/// past that is the response's writing and the network.
#[derive(Clone)]
struct RequestClock {
    id: u64,
    received: Instant,
    prepared: Instant,
    unix_ms: f64,
}

impl RequestClock {
    fn start(received: Instant) -> Option<RequestClock> {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if !*ON.get_or_init(|| std::env::var("M40_REQUEST_STATS").is_ok_and(|v| v == "1")) {
            return None;
        }
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
            - received.elapsed().as_secs_f64() * 1e3;
        Some(RequestClock {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            received,
            prepared: Instant::now(),
            unix_ms,
        })
    }

    fn ms(&self, at: Instant) -> f64 {
        (at - self.received).as_secs_f64() * 1e3
    }

    fn first_token(&self, started: Instant, token: Instant) {
        eprintln!(
            "request {}: taken at {:.1} ms (Unix time); prepared +{:.3} ms, started +{:.3}, first token taken +{:.3}",
            self.id,
            self.unix_ms,
            self.ms(self.prepared),
            self.ms(started),
            self.ms(token)
        );
    }
}

/// What a running request streams.
pub(crate) enum Event {
    Token(TokenEvent),
    Done(Result<Completion, String>),
}

/// A generation in progress; dropping it (a client that went away)
/// cancels it.
pub(crate) struct Running {
    /// None once its end was taken.
    generation: Option<m40_runtime::Generation>,
    /// Cancels it at the request timeout.
    timer: tokio::task::JoinHandle<()>,
    metrics: metrics::Metrics,
    started: Instant,
    last: Option<Instant>,
    /// Events taken (the KV tokens it holds beyond its prompt).
    events: usize,
    pub prompt_ids: Vec<u32>,
    /// The engine it runs on.
    pub engine: Arc<Engine>,
    /// `M40_REQUEST_STATS`: until its first token is taken.
    clock: Option<RequestClock>,
    /// Keeps the model loaded until the request ends.
    _lease: slot::Lease,
}

impl Running {
    /// The next event: its tokens, then once its end.
    pub async fn recv(&mut self) -> Option<Event> {
        let generation = self.generation.as_mut()?;
        let Some(t) = generation.recv().await else {
            let done = self.generation.take()?.finish();
            self.ended(done.as_ref().map_or(0, |d| d.token_ids.len()));
            return Some(Event::Done(done.map_err(|e| e.to_string())));
        };
        self.events += 1;
        let now = Instant::now();
        match self.last {
            None => {
                self.metrics.first_token(now - self.started);
                if let Some(c) = self.clock.take() {
                    c.first_token(self.started, now);
                }
            }
            Some(prev) => self.metrics.next_token(now - prev),
        }
        self.last = Some(now);
        Some(Event::Token(t))
    }

    fn ended(&mut self, generated: usize) {
        self.timer.abort();
        self.metrics
            .finished(generated, self.prompt_ids.len() + self.events);
    }

    /// Wait for the whole output: the tokens and the completion.
    pub async fn collect(mut self) -> Result<(Vec<TokenEvent>, Completion), ApiError> {
        let mut tokens = Vec::new();
        while let Some(ev) = self.recv().await {
            match ev {
                Event::Token(t) => tokens.push(t),
                Event::Done(Ok(done)) => return Ok((tokens, done)),
                Event::Done(Err(e)) => {
                    return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))
                }
            }
        }
        Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "generation ended without a result",
        ))
    }
}

impl Drop for Running {
    /// A request given up before its end (the client went away): the
    /// generation's drop cancels it; its counts end here.
    fn drop(&mut self) {
        if let Some(g) = self.generation.take() {
            let generated = g.token_ids().len();
            drop(g);
            self.ended(generated);
        }
    }
}

/// An error answered as `{"error": "..."}` with a status.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
    retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            axum::Json(serde_json::json!({ "error": self.message })),
        )
            .into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// A JSON body parsed by serde, every failure (syntax, wrong types, missing
/// fields) a 400 that says what was wrong. The content type is not checked
/// (Ollama's clients do not always send one).
pub(crate) fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        let inner = e.into_inner();
        if at == "." {
            ApiError::bad_request(format!("invalid request body: {inner}"))
        } else {
            ApiError::bad_request(format!("invalid request body: {at}: {inner}"))
        }
    })
}

/// The router: Ollama's `/api/*`, OpenAI's `/v1/*`, `/health`, `/metrics`.
pub fn router(state: AppState) -> Router {
    let limit = state.inner.config.max_body_bytes;
    let key = state.inner.config.api_key.clone();
    let cors = layers::cors(&state.inner.config.origins);
    Router::new()
        .route("/", get(root).head(root))
        .route("/health", get(health))
        .route("/metrics", get(metrics::render))
        .route("/api/version", get(ollama::version))
        .route("/api/tags", get(store_api::tags))
        .route("/api/pull", post(store_api::pull))
        .route("/api/delete", delete(store_api::delete))
        .route("/api/create", post(create::create))
        .route("/api/copy", post(create::copy))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/generate", post(ollama::generate))
        .route("/api/chat", post(ollama::chat))
        .route("/api/embed", post(embed::ollama_embed))
        .route("/api/embeddings", post(embed::ollama_embeddings))
        .route("/v1/embeddings", post(embed::openai_embeddings))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*id}", get(openai::model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        // Unknown OpenAI routes answer in OpenAI's error shape.
        .route(
            "/v1/{*rest}",
            axum::routing::any(|| async {
                openai::OaiError::from(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "no such endpoint: m40-llm serves /v1/chat/completions, /v1/completions, /v1/embeddings and /v1/models",
                ))
            }),
        )
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint") })
        // Refuses an oversize Content-Length before reading the body (413),
        // and stops a streamed body at the limit.
        .layer(DefaultBodyLimit::disable())
        .layer(tower_http::limit::RequestBodyLimitLayer::new(limit))
        .layer(axum::middleware::map_response(
            move |r: Response| async move { json_413(r, limit) },
        ))
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let key = key.clone();
                async move { check_key(key.as_deref(), req, next).await }
            },
        ))
        .layer(axum::middleware::from_fn(layers::access_log))
        // Outermost: a browser's preflight is answered before the key check.
        .layer(cors)
        .with_state(state)
}

/// The body limit's 413 (plain text from tower-http or axum) as the JSON
/// error every other answer is.
fn json_413(r: Response, limit: usize) -> Response {
    if r.status() != StatusCode::PAYLOAD_TOO_LARGE {
        return r;
    }
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is larger than this server's limit of {limit} bytes"),
    )
    .into_response()
}

async fn check_key(
    key: Option<&str>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let open = matches!(req.uri().path(), "/" | "/health");
    if let (Some(key), false) = (key, open) {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        if !given.is_some_and(|g| same_key(g, key)) {
            let why = if given.is_some() {
                "wrong API key"
            } else {
                "an API key is needed: send Authorization: Bearer KEY (m40-llm's CLI sends M40_API_KEY)"
            };
            let mut r = ApiError::new(StatusCode::UNAUTHORIZED, why).into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"m40-llm\""),
            );
            return r;
        }
    }
    next.run(req).await
}

/// The credentials of an `Authorization` value whose scheme is Bearer
/// (schemes are case-insensitive: RFC 9110 11.1).
fn bearer_token(v: &str) -> Option<&str> {
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Key comparison whose time does not depend on where the keys differ.
fn same_key(given: &str, key: &str) -> bool {
    let (a, b) = (given.as_bytes(), key.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The chat page (`page/chat.html`): plain HTML and JS on the public API.
const CHAT_PAGE: &str = include_str!("page/chat.html");

/// `GET /` and `HEAD /`: the chat page for a browser (a request that
/// accepts HTML); for anything else Ollama's health answer, word for word
/// (health probes and scripts look for it).
async fn root(headers: axum::http::HeaderMap) -> Response {
    let browser = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    if browser {
        (
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                // Nothing but this page's own script and the API it calls.
                (
                    header::CONTENT_SECURITY_POLICY,
                    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'",
                ),
            ],
            CHAT_PAGE,
        )
            .into_response()
    } else {
        "Ollama is running".into_response()
    }
}

async fn health(axum::extract::State(s): axum::extract::State<AppState>) -> Response {
    let first = s.first();
    let loaded: Vec<String> = s
        .loaded_slots()
        .iter()
        .map(|(m, _)| m.name.clone())
        .collect();
    axum::Json(serde_json::json!({
        "status": "ok",
        "model": first.name,
        "n_ctx": first.n_ctx(),
        "loaded": first.engine().is_some(),
        "loaded_models": loaded,
    }))
    .into_response()
}

/// Serve until `shutdown` resolves, then stop accepting and let the
/// requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let idle = tokio::spawn(state.clone().watch_idle());
    let served = axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await;
    idle.abort();
    served
}

/// Serve `state` on a loopback port from a thread with its own runtime, for
/// the life of the process (tests, benches, an embedding program that has no
/// runtime of its own). Returns the address.
pub fn spawn_loopback(state: AppState) -> std::io::Result<std::net::SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let rt = tokio::runtime::Runtime::new()?;
    std::thread::Builder::new()
        .name("m40-serve".into())
        .spawn(move || {
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(listener)?;
                serve(l, state, std::future::pending()).await
            })
        })?;
    Ok(addr)
}
