//! A model the server serves: its engine while loaded, how to load it
//! again, and its life (`keep_alive.rs`). Requests in flight keep their own
//! handle on the engine, so an unload frees it when the last one ends.

use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use axum::http::StatusCode;
use m40_runtime::Engine;

use crate::keep_alive::{KeepAlive, Life};
use crate::{ApiError, Reload};

pub(crate) struct Slot {
    /// The name it is served under.
    pub(crate) name: String,
    /// The model's file and shape, kept across unloads (for /api/show, tags).
    pub(crate) model: Arc<m40_runtime::Model>,
    pub(crate) n_ctx: usize,
    pub(crate) loaded_at: chrono::DateTime<chrono::Utc>,
    engine: RwLock<Option<Arc<Engine>>>,
    /// One load at a time.
    loading: tokio::sync::Mutex<()>,
    /// Loads it again after an unload; without it, it is never unloaded.
    reload: Option<Reload>,
    life: Mutex<Life>,
}

impl Slot {
    pub(crate) fn new(
        engine: Arc<Engine>,
        name: &str,
        keep_alive: KeepAlive,
        reload: Option<Reload>,
    ) -> Self {
        Slot {
            name: name.to_string(),
            model: engine.model().clone(),
            n_ctx: engine.n_ctx(),
            loaded_at: chrono::Utc::now(),
            engine: RwLock::new(Some(engine)),
            loading: tokio::sync::Mutex::new(()),
            reload,
            life: Mutex::new(Life::new(keep_alive)),
        }
    }

    pub(crate) fn life(&self) -> MutexGuard<'_, Life> {
        self.life.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether it can be unloaded (it can be loaded again).
    pub(crate) fn can_unload(&self) -> bool {
        self.reload.is_some()
    }

    /// The engine, if the model is loaded now.
    pub(crate) fn engine(&self) -> Option<Arc<Engine>> {
        self.engine
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The engine, loading the model again if it was unloaded.
    pub(crate) async fn loaded(&self) -> Result<Arc<Engine>, ApiError> {
        if let Some(e) = self.engine() {
            return Ok(e);
        }
        let _one = self.loading.lock().await;
        if let Some(e) = self.engine() {
            return Ok(e);
        }
        let Some(reload) = self.reload.clone() else {
            return Err(ApiError::internal(
                "the model was unloaded and this server cannot load it again",
            ));
        };
        let engine = tokio::task::spawn_blocking(move || (reload.0)())
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("loading the model again failed: {e}"),
                )
            })?;
        let engine = Arc::new(engine);
        *self.engine.write().unwrap_or_else(|e| e.into_inner()) = Some(engine.clone());
        tracing::info!("{} loaded again", self.name);
        Ok(engine)
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
