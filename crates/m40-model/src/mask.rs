//! A token mask the host may still be computing while the device runs the
//! step (a structured output's allowed tokens: the engine's constraint
//! computes it on another thread; the backend waits for it only just
//! before the selection that applies it).

use std::sync::{Arc, Condvar, Mutex};

/// The words of a token mask: bit `id % 32` of word `id / 32` allows `id`
/// (ids past the words are not allowed).
pub type MaskWords = Arc<Vec<u32>>;

type Cell = (Mutex<Option<Result<MaskWords, String>>>, Condvar);

/// One step's mask for one sequence, filled once ([`MaskSlot::fill`]), read
/// by any number of waiters ([`MaskSlot::wait`]).
#[derive(Clone, Default)]
pub struct MaskSlot(Arc<Cell>);

impl MaskSlot {
    pub fn new() -> MaskSlot {
        MaskSlot::default()
    }

    /// The mask (or why there is none); a second fill is ignored.
    pub fn fill(&self, v: Result<MaskWords, String>) {
        let (m, cv) = &*self.0;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(v);
            cv.notify_all();
        }
    }

    /// The mask, once it is filled (whoever fills it must, also on
    /// failure: see [`MaskFiller`]).
    pub fn wait(&self) -> Result<MaskWords, String> {
        let (m, cv) = &*self.0;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        while g.is_none() {
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g.clone().expect("filled")
    }

    /// A filler that fills the slot with an error if it is dropped unfilled
    /// (a panic on the computing thread), so no waiter hangs.
    pub fn filler(&self) -> MaskFiller {
        MaskFiller(self.clone())
    }
}

/// See [`MaskSlot::filler`].
pub struct MaskFiller(MaskSlot);

impl MaskFiller {
    pub fn fill(self, v: Result<MaskWords, String>) {
        self.0.fill(v);
    }
}

impl Drop for MaskFiller {
    fn drop(&mut self) {
        self.0.fill(Err("the token mask was not computed".into()));
    }
}

impl PartialEq for MaskSlot {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for MaskSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let filled = self.0 .0.lock().map(|g| g.is_some()).unwrap_or(false);
        f.debug_struct("MaskSlot").field("filled", &filled).finish()
    }
}

/// Every logit of a token `words` does not allow becomes -inf.
pub fn apply_mask(words: &[u32], logits: &mut [f32]) {
    for (i, l) in logits.iter_mut().enumerate() {
        if words.get(i / 32).is_none_or(|w| w >> (i % 32) & 1 == 0) {
            *l = f32::NEG_INFINITY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_gets_what_is_filled_later_and_a_dropped_filler_fails_it() {
        let s = MaskSlot::new();
        let f = s.filler();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            f.fill(Ok(Arc::new(vec![0b101])));
        });
        assert_eq!(*s.wait().unwrap(), vec![0b101]);
        t.join().unwrap();
        let s = MaskSlot::new();
        drop(s.filler());
        assert!(s.wait().is_err());
        let mut l = vec![1.0f32; 35];
        apply_mask(&[0b101], &mut l);
        assert_eq!(&l[..3], &[1.0, f32::NEG_INFINITY, 1.0]);
        assert!(l[32..].iter().all(|v| *v == f32::NEG_INFINITY));
    }
}
