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
pub struct CancelToken(Arc<Node>);

#[derive(Debug, Default)]
struct Node {
    cancelled: AtomicBool,
    parent: Option<CancelToken>,
}

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    /// A token cancelled when it is, or when this one is (a request's own
    /// token under its caller's).
    ///
    /// ```
    /// let caller = m40_runtime::CancelToken::new();
    /// let (a, b) = (caller.child(), caller.child());
    /// a.cancel();
    /// assert!(a.is_cancelled() && !b.is_cancelled() && !caller.is_cancelled());
    /// caller.cancel();
    /// assert!(b.is_cancelled());
    /// ```
    pub fn child(&self) -> CancelToken {
        CancelToken(Arc::new(Node {
            cancelled: AtomicBool::new(false),
            parent: Some(self.clone()),
        }))
    }

    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::SeqCst)
            || self.0.parent.as_ref().is_some_and(|p| p.is_cancelled())
    }

    /// Clear this token's own cancellation so it can be reused (a parent's
    /// still counts).
    pub fn reset(&self) {
        self.0.cancelled.store(false, Ordering::SeqCst);
    }
}
