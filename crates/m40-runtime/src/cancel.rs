//! Cancelling a request from another thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Cancels a running request from another thread.
///
/// ```
/// let cancel = m40_runtime::CancelToken::new();
/// let other = cancel.clone();
/// std::thread::spawn(move || other.cancel()).join().unwrap();
/// assert!(cancel.is_cancelled());
/// ```
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
    /// Clear a cancellation so the token can be reused.
    pub fn reset(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
