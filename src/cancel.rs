//! The cancel token every layer checks: drain (launch nothing new), then abort (stop what runs); set by the signal watcher in `sched::signals`.

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
    /// A trial's own token ([`Cancel::child`]) also sees the run's.
    parent: Option<Arc<Flags>>,
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
        let seen = |f: &Flags| f.draining.load(Ordering::SeqCst);
        seen(&self.flags) || self.parent.as_deref().is_some_and(seen)
    }

    pub fn aborted(&self) -> bool {
        let seen = |f: &Flags| f.aborted.load(Ordering::SeqCst);
        seen(&self.flags) || self.parent.as_deref().is_some_and(seen)
    }

    /// A token of one trial's own: aborting it stops that trial alone (an early termination),
    /// and it is aborted (or draining) whenever this one is.
    pub fn child(&self) -> Cancel {
        Cancel {
            flags: Arc::default(),
            parent: Some(Arc::clone(&self.flags)),
        }
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
                    Cancel {
                        flags,
                        parent: None,
                    }
                    .abort();
                }
            });
    }

    /// A handle that does not keep the token alive (for the signal watcher's list).
    pub fn downgrade(&self) -> Weak<Flags> {
        Arc::downgrade(&self.flags)
    }

    /// The token behind `weak`, while some holder keeps it alive.
    pub fn upgrade(weak: &Weak<Flags>) -> Option<Cancel> {
        weak.upgrade().map(|flags| Cancel {
            flags,
            parent: None,
        })
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
    fn a_child_token_stops_alone_and_follows_its_parent() {
        let run = Cancel::new();
        let one = run.child();
        let other = run.child();
        one.abort();
        assert!(one.aborted() && !other.aborted() && !run.aborted());
        run.drain();
        assert!(other.draining() && !other.aborted());
        run.abort();
        assert!(other.aborted());
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
