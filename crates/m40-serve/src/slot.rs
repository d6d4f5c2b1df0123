//! A model the server serves, by name: its engine while loaded, and its
//! life (`keep_alive.rs`). Requests in flight keep their own handle on the
//! engine, so an unload frees it when the last one ends. `slots.rs` decides
//! which are loaded.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::Instant;

use m40_runtime::Engine;

use crate::defaults::Defaults;
use crate::keep_alive::KeepAlive;

pub(crate) struct Slot {
    /// The name it is served under.
    pub(crate) name: String,
    engine: RwLock<Option<Arc<Engine>>>,
    /// From its first load on: the model's file and shape, and the context
    /// requests get (kept across unloads, for /api/show and tags).
    first: OnceLock<(Arc<m40_runtime::Model>, usize)>,
    loaded_at: Mutex<chrono::DateTime<chrono::Utc>>,
    /// Whether the server can load it again (else it is never unloaded).
    can_unload: bool,
    life: Mutex<Life>,
    /// A created model's instructions (`defaults.rs`).
    modelfile: RwLock<Option<Arc<m40_store::Modelfile>>>,
}

impl Slot {
    /// A model not loaded yet.
    pub(crate) fn new(name: &str, keep_alive: KeepAlive, can_unload: bool) -> Self {
        Slot {
            name: name.to_string(),
            engine: RwLock::new(None),
            first: OnceLock::new(),
            loaded_at: Mutex::new(chrono::Utc::now()),
            can_unload,
            life: Mutex::new(Life::new(keep_alive)),
            modelfile: RwLock::new(None),
        }
    }

    /// Its defaults: a created model's instructions.
    pub(crate) fn defaults(&self) -> Defaults {
        Defaults(
            self.modelfile
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }

    /// A created model's instructions, as the store has them now.
    pub(crate) fn modelfile(&self) -> Option<Arc<m40_store::Modelfile>> {
        self.defaults().0
    }

    pub(crate) fn set_modelfile(&self, m: Option<m40_store::Modelfile>) {
        *self.modelfile.write().unwrap_or_else(|e| e.into_inner()) = m.map(Arc::new);
    }

    /// A model loaded as `engine`.
    pub(crate) fn with(
        engine: Arc<Engine>,
        name: &str,
        keep_alive: KeepAlive,
        can_unload: bool,
    ) -> Self {
        let s = Slot::new(name, keep_alive, can_unload);
        s.set(engine);
        s
    }

    pub(crate) fn life(&self) -> MutexGuard<'_, Life> {
        self.life.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether it can be unloaded (it can be loaded again).
    pub(crate) fn can_unload(&self) -> bool {
        self.can_unload
    }

    /// The engine, if the model is loaded now.
    pub(crate) fn engine(&self) -> Option<Arc<Engine>> {
        self.engine
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The model's file and shape, once it has been loaded.
    pub(crate) fn model(&self) -> Option<&Arc<m40_runtime::Model>> {
        self.first.get().map(|(m, _)| m)
    }

    /// The context requests get, once it has been loaded.
    pub(crate) fn n_ctx(&self) -> Option<usize> {
        self.first.get().map(|&(_, n)| n)
    }

    /// When it was last loaded.
    pub(crate) fn loaded_at(&self) -> chrono::DateTime<chrono::Utc> {
        *self.loaded_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// It is loaded as `engine` (see `AppState::open`).
    pub(crate) fn set(&self, engine: Arc<Engine>) {
        let _ = self.first.set((engine.model().clone(), engine.n_ctx()));
        *self.loaded_at.lock().unwrap_or_else(|e| e.into_inner()) = chrono::Utc::now();
        *self.engine.write().unwrap_or_else(|e| e.into_inner()) = Some(engine);
    }

    /// Unload the model (its engine goes when the requests in flight end);
    /// false where it cannot be loaded again, and stays.
    pub(crate) fn unload(&self) -> bool {
        if !self.can_unload() {
            return false;
        }
        let gone = self
            .engine
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if gone.is_some() {
            tracing::info!("{} unloaded", self.name);
        }
        true
    }
}

/// A loaded model's life: how long it stays once idle (the last request's
/// `keep_alive`, or the server's), the requests in flight, and since when
/// it has been idle.
pub(crate) struct Life {
    keep_alive: KeepAlive,
    in_flight: usize,
    idle_since: Instant,
}

impl Life {
    pub(crate) fn new(keep_alive: KeepAlive) -> Self {
        Life {
            keep_alive,
            in_flight: 0,
            idle_since: Instant::now(),
        }
    }

    /// When the model goes if no request comes: counted from the end of
    /// the last one (from now while some are in flight); None: never.
    fn expiry(&self) -> Option<Instant> {
        match self.in_flight {
            0 => self.keep_alive.expiry(self.idle_since),
            _ => self.keep_alive.expiry(Instant::now()),
        }
    }
}

/// A request's hold on its model: while any is held the model stays
/// loaded; the last one's end starts its `keep_alive`.
pub(crate) struct Lease(Arc<Slot>);

impl Drop for Lease {
    fn drop(&mut self) {
        let mut life = self.0.life();
        life.in_flight -= 1;
        life.idle_since = Instant::now();
    }
}

impl Slot {
    /// Hold the model for a request that keeps it `keep_alive` after.
    pub(crate) fn lease(self: &Arc<Self>, keep_alive: KeepAlive) -> Lease {
        let mut life = self.life();
        life.keep_alive = keep_alive;
        life.in_flight += 1;
        Lease(self.clone())
    }

    /// When the loaded model is unloaded if no request comes; None: never
    /// (or this server cannot load it again, so it keeps it).
    pub(crate) fn expires_at(&self) -> Option<Instant> {
        if !self.can_unload() {
            return None;
        }
        self.life().expiry()
    }

    /// Since when it has been idle; None while requests are in flight.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        let life = self.life();
        (life.in_flight == 0).then_some(life.idle_since)
    }

    /// Unload the model if it is idle and its time has run out; `keep_alive`
    /// set first where given. Returns when it would next be due (None:
    /// never, or it is not loaded).
    pub(crate) fn reap(&self, keep_alive: Option<KeepAlive>) -> Option<Instant> {
        let mut life = self.life();
        if let Some(k) = keep_alive {
            life.keep_alive = k;
        }
        self.engine()?;
        let due = life.expiry()?;
        if life.in_flight == 0 && due <= Instant::now() {
            // Under the life lock: a request that comes now waits, then
            // loads the model again.
            self.unload();
            return None;
        }
        Some(due)
    }

    /// Unload it now if it is idle (under its life lock, so that no
    /// request takes it meanwhile); whether it was.
    pub(crate) fn unload_if_idle(&self) -> bool {
        let life = self.life();
        life.in_flight == 0 && self.engine().is_some() && self.unload()
    }
}
