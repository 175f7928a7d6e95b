//! The cancel token every layer checks: drain (launch nothing new), then abort (stop what runs); set by the signal watcher in `sched::cancel`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The state every clone of one [`Cancel`] shares.
#[derive(Debug, Default)]
pub struct Flags {
    draining: AtomicBool,
    aborted: AtomicBool,
}

/// Shared by the supervisor, its workers and the trials they run.
#[derive(Clone, Debug, Default)]
pub struct Cancel {
    flags: Arc<Flags>,
}

impl Cancel {
    pub fn new() -> Self {
        Cancel::default()
    }

    /// Stop launching trials; running ones go on.
    pub fn drain(&self) {
        self.flags.draining.store(true, Ordering::SeqCst);
    }

    /// Stop running trials too (they end as INTERRUPTED).
    pub fn abort(&self) {
        self.drain();
        self.flags.aborted.store(true, Ordering::SeqCst);
    }

    pub fn draining(&self) -> bool {
        self.flags.draining.load(Ordering::SeqCst)
    }

    pub fn aborted(&self) -> bool {
        self.flags.aborted.load(Ordering::SeqCst)
    }

    /// Drains now and aborts `grace` later (at once when it is zero).
    pub fn begin(&self, grace: Duration) {
        if grace.is_zero() {
            self.abort();
            return;
        }
        self.drain();
        let later = Arc::downgrade(&self.flags);
        let _ = std::thread::Builder::new()
            .name("gpumux-grace".into())
            .spawn(move || {
                std::thread::sleep(grace);
                if let Some(flags) = later.upgrade() {
                    Cancel { flags }.abort();
                }
            });
    }

    /// A handle that does not keep the token alive (for the signal watcher's list).
    pub fn downgrade(&self) -> Weak<Flags> {
        Arc::downgrade(&self.flags)
    }

    /// The token behind `weak`, while some holder keeps it alive.
    pub fn upgrade(weak: &Weak<Flags>) -> Option<Cancel> {
        weak.upgrade().map(|flags| Cancel { flags })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abort_implies_drain_and_clones_share_state() {
        let c = Cancel::new();
        let d = c.clone();
        assert!(!d.draining() && !d.aborted());
        c.drain();
        assert!(d.draining() && !d.aborted());
        c.abort();
        assert!(d.aborted());
    }

    #[test]
    fn a_grace_period_ends_in_an_abort_and_zero_aborts_at_once() {
        let c = Cancel::new();
        c.begin(Duration::from_millis(30));
        assert!(c.draining());
        let waited = std::time::Instant::now();
        while !c.aborted() && waited.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(c.aborted());
        let z = Cancel::new();
        z.begin(Duration::ZERO);
        assert!(z.aborted());
    }
}
