//! The models a server serves, by name, loaded on demand: a request names
//! one, the first loads it (through the server's [`Loader`]), several stay
//! loaded at once. A load that does not fit (its engine plans weights, KV
//! pages and workspace against the memory free before allocating any)
//! unloads the least recently used idle model and tries again; a model
//! with requests in flight is never unloaded, and when nothing can be
//! freed the request gets a 503 with `Retry-After`.

use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use m40_runtime::{Engine, EngineError};
use m40_store::same_model;

use crate::keep_alive::KeepAlive;
use crate::slot::{Lease, Slot};
use crate::{ApiError, AppState};

/// Where a load may place the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// Where it runs best (the GPU, where the options allow one), failing
    /// when it does not fit there: the server then unloads an idle model
    /// and asks again.
    Best,
    /// Anywhere the options allow (the CPU where the GPU is full).
    Anywhere,
}

/// Loads the models a server serves beside the one it started with
/// (`ServerConfig::loader`), and that one again after an unload.
pub trait Loader: Send + Sync {
    /// The name `requested` is served under, if this server can load it
    /// (a stored model, say); None: a 404.
    fn resolve(&self, requested: &str) -> Option<String>;
    /// Load the model served as `name` (a name from `resolve`, or the one
    /// the server started with), with its TEMPLATE where it was created
    /// with one, taking at most `memory_limit` bytes where given
    /// ([`m40_runtime::EngineOptions::memory_limit`]).
    fn load(&self, name: &str, fit: Fit, memory_limit: Option<u64>) -> Result<Engine, EngineError>;
    /// A created model's instructions (SYSTEM, PARAMETERs, MESSAGEs, ...),
    /// which the server applies beneath each request's own.
    fn modelfile(&self, _name: &str) -> Option<m40_store::Modelfile> {
        None
    }
}

/// The loader of a store's models (the CLI's): any stored model by name,
/// created models with their instructions, and a model served from a path
/// (`serving`), each loaded with the same options.
pub struct StoreLoader {
    store: m40_store::Store,
    opts: m40_runtime::EngineOptions,
    path: Option<(String, std::path::PathBuf)>,
}

impl StoreLoader {
    pub fn new(store: m40_store::Store, opts: m40_runtime::EngineOptions) -> Self {
        StoreLoader {
            store,
            opts,
            path: None,
        }
    }

    /// Serve the file at `path` as `name` too (a model the store may not
    /// hold: the one the server started with).
    pub fn serving(mut self, name: &str, path: &std::path::Path) -> Self {
        self.path = Some((name.to_string(), path.to_path_buf()));
        self
    }
}

impl Loader for StoreLoader {
    fn resolve(&self, requested: &str) -> Option<String> {
        match &self.path {
            Some((name, _)) if same_model(requested, name) => Some(name.clone()),
            _ => Some(self.store.manifest(requested).ok()??.name),
        }
    }

    fn load(&self, name: &str, fit: Fit, memory_limit: Option<u64>) -> Result<Engine, EngineError> {
        let path = match &self.path {
            Some((n, p)) if n == name => p.clone(),
            // Gone since it was resolved: the load says the file is missing.
            _ => (self.store.manifest(name).ok().flatten()).map_or_else(|| name.into(), |m| m.path),
        };
        let mut opts = self.opts.clone();
        opts.memory_limit = match (opts.memory_limit, memory_limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // A created model's TEMPLATE is the engine's, its `num_gpu` (layers
        // on GPUs; negative: as many as fit) the placement's.
        let modelfile = self.modelfile(name);
        if let Some(t) = modelfile.as_ref().and_then(|m| m.template.clone()) {
            opts.chat_template = Some(t);
        }
        // (Replicas hold whole models: no layer count applies.)
        match modelfile.as_ref().and_then(|m| m.num_gpu()) {
            Some(n) if !opts.replicas => opts.gpu_layers = n,
            _ => {}
        }
        // The GPU or nothing, so that the server frees room there first.
        if fit == Fit::Best && opts.backend == m40_runtime::BackendChoice::Auto {
            opts.backend = m40_runtime::BackendChoice::Gpu;
        }
        Engine::from_path(&path, opts)
    }

    fn modelfile(&self, name: &str) -> Option<m40_store::Modelfile> {
        self.store.manifest(name).ok()??.modelfile
    }
}

/// A model opened for one request: loaded, and held loaded until the
/// request ends.
pub(crate) struct Served {
    pub(crate) state: AppState,
    pub(crate) engine: Arc<Engine>,
    pub(crate) lease: Lease,
}

impl Served {
    /// The context every request gets at most.
    pub(crate) fn n_ctx(&self) -> usize {
        self.engine.n_ctx()
    }
}

impl AppState {
    /// Every model this server has served, loaded or not.
    pub(crate) fn slots(&self) -> Vec<Arc<Slot>> {
        self.inner
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The models loaded now, with their engines.
    pub(crate) fn loaded_slots(&self) -> Vec<(Arc<Slot>, Arc<Engine>)> {
        self.slots()
            .into_iter()
            .filter_map(|s| s.engine().map(|e| (s, e)))
            .collect()
    }

    fn find(&self, name: &str) -> Option<Arc<Slot>> {
        self.slots().into_iter().find(|s| same_model(name, &s.name))
    }

    /// The model a request names: one served already, or one the loader
    /// can load (not loaded yet); a 400 without a name, a 404 for a model
    /// this server does not have.
    pub(crate) fn slot_for(&self, requested: Option<&str>) -> Result<Arc<Slot>, ApiError> {
        let Some(m) = requested.map(str::trim).filter(|m| !m.is_empty()) else {
            return Err(ApiError::bad_request("model is required"));
        };
        if let Some(s) = self.find(m) {
            return Ok(s);
        }
        let Some(loader) = &self.inner.config.loader else {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "model '{m}' not found; this server serves '{}'",
                    self.name()
                ),
            ));
        };
        let Some(name) = loader.resolve(m) else {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("model '{m}' not found; pull it first (m40-llm pull {m}, or /api/pull)"),
            ));
        };
        let mut slots = self.inner.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slots.iter().find(|s| same_model(&name, &s.name)) {
            return Ok(s.clone());
        }
        let slot = Arc::new(Slot::new(&name, self.default_keep_alive(), true));
        slot.set_modelfile(loader.modelfile(&name));
        slots.push(slot.clone());
        Ok(slot)
    }

    /// Stop serving `name` (deleted from the store): unloaded once its
    /// requests end, and no longer found by name. The model the server
    /// started with stays.
    pub(crate) fn forget(&self, name: &str) {
        let mut slots = self.inner.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut first = true;
        slots.retain(|s| {
            let keep = std::mem::take(&mut first) || !same_model(name, &s.name);
            if !keep {
                s.unload();
            }
            keep
        });
    }

    /// The model for a request that keeps it `keep_alive` after: held
    /// (so nothing unloads it meanwhile), then loaded if it is not.
    pub(crate) async fn open(
        &self,
        slot: &Arc<Slot>,
        keep_alive: KeepAlive,
    ) -> Result<Served, ApiError> {
        let lease = slot.lease(keep_alive);
        let engine = match slot.engine() {
            Some(e) => e,
            None => self.load(slot).await?,
        };
        Ok(Served {
            state: self.clone(),
            engine,
            lease,
        })
    }

    /// Load `slot`'s model (held by the caller's lease), unloading idle
    /// models while it does not fit or `max_loaded_models` are loaded.
    async fn load(&self, slot: &Arc<Slot>) -> Result<Arc<Engine>, ApiError> {
        let Some(loader) = self.inner.config.loader.clone() else {
            return Err(ApiError::internal(
                "the model was unloaded and this server cannot load it again",
            ));
        };
        // One load at a time: each plans against the memory the others
        // left.
        let _one = self.inner.loading.lock().await;
        if let Some(e) = slot.engine() {
            return Ok(e);
        }
        let max = self.inner.config.max_loaded_models;
        // Where every loaded model runs requests, the load waits this long
        // for one to finish them.
        let deadline = Instant::now() + self.inner.config.wait_for_room;
        let mut anywhere = false;
        loop {
            let others = self.loaded_slots().len();
            if max > 0 && others >= max {
                if self.unload_lru(slot).is_none() && !self.wait_for_idle(slot, deadline).await {
                    return Err(busy(format!(
                        "{others} models are loaded (the server's most) and each is running requests; retry later"
                    )));
                }
                continue;
            }
            // Where nothing could be freed, the CPU is as good as it gets.
            let fit = if anywhere || !self.any_idle(slot) {
                Fit::Anywhere
            } else {
                Fit::Best
            };
            let started = Instant::now();
            slot.set_modelfile(loader.modelfile(&slot.name));
            // What `max_memory` leaves beside the models loaded now.
            let limit = self.inner.config.max_memory.map(|m| {
                let used: u64 = (self.loaded_slots().iter())
                    .map(|(_, e)| e.memory().total())
                    .sum();
                m.saturating_sub(used)
            });
            let (l, name) = (loader.clone(), slot.name.clone());
            let got = tokio::task::spawn_blocking(move || l.load(&name, fit, limit))
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?;
            match got {
                Ok(engine) => {
                    let engine = Arc::new(engine);
                    slot.set(engine.clone());
                    tracing::info!(
                        "{} loaded in {:.1} s ({}, {:.2} GiB)",
                        slot.name,
                        started.elapsed().as_secs_f64(),
                        engine.backend_name(),
                        engine.memory().total() as f64 / (1u64 << 30) as f64
                    );
                    return Ok(engine);
                }
                Err(EngineError::NoGpu(_)) if fit == Fit::Best => anywhere = true,
                Err(e) if fit == Fit::Best && e.is_out_of_memory() => {
                    if self.unload_lru(slot).is_none() {
                        anywhere = true;
                    }
                }
                Err(e) if e.is_out_of_memory() && !self.loaded_slots().is_empty() => {
                    if !self.wait_for_idle(slot, deadline).await {
                        return Err(busy(format!(
                            "{} does not fit beside the models running requests now ({e}); retry later",
                            slot.name
                        )));
                    }
                    // One is idle now: unload it and plan again.
                    anywhere = false;
                }
                Err(e) => {
                    return Err(ApiError::internal(format!(
                        "loading {} failed: {e}",
                        slot.name
                    )))
                }
            }
        }
    }

    /// Wait until a model other than `keep` is loaded and idle (true), or
    /// `deadline` passes (false).
    async fn wait_for_idle(&self, keep: &Arc<Slot>, deadline: Instant) -> bool {
        loop {
            if self.any_idle(keep) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Whether a model other than `keep` is loaded and idle.
    fn any_idle(&self, keep: &Arc<Slot>) -> bool {
        self.loaded_slots()
            .iter()
            .any(|(s, _)| !Arc::ptr_eq(s, keep) && s.can_unload() && s.idle_since().is_some())
    }

    /// Unload the loaded, idle model (other than `keep`) idle the longest;
    /// its name, or None where every loaded model is running requests.
    fn unload_lru(&self, keep: &Arc<Slot>) -> Option<String> {
        let mut idle: Vec<(Instant, Arc<Slot>)> = self
            .loaded_slots()
            .into_iter()
            .filter(|(s, _)| !Arc::ptr_eq(s, keep) && s.can_unload())
            .filter_map(|(s, _)| s.idle_since().map(|t| (t, s)))
            .collect();
        idle.sort_by_key(|(t, _)| *t);
        // A request may have taken one since: the next, then.
        let (_, gone) = idle.into_iter().find(|(_, s)| s.unload_if_idle())?;
        tracing::info!("{} unloaded to make room", gone.name);
        Some(gone.name.clone())
    }
}

/// A 503 that says when to come back.
fn busy(message: String) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message).retry_after(5)
}
