//! Cancellation: SIGINT/SIGTERM first stop new launches (drain), then, after a grace period, stop running trials (abort).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Default)]
struct Flags {
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

    /// On the first SIGINT or SIGTERM: drain at once, and abort `grace` later (or at a second signal).
    /// Returns an error when the handlers cannot be installed.
    pub fn on_signals(&self, grace: Duration) -> std::io::Result<()> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
        let me = self.clone();
        std::thread::Builder::new()
            .name("gpumux-signals".into())
            .spawn(move || {
                let mut seen = 0;
                for sig in signals.forever() {
                    seen += 1;
                    if seen > 1 {
                        tracing::warn!("second signal {sig}: stopping running trials now");
                        me.abort();
                        continue;
                    }
                    tracing::warn!(
                        "signal {sig}: launching no more trials; running ones get {:.0} s to finish",
                        grace.as_secs_f64()
                    );
                    me.drain();
                    let later = me.clone();
                    let _ = std::thread::Builder::new()
                        .name("gpumux-grace".into())
                        .spawn(move || {
                            std::thread::sleep(grace);
                            later.abort();
                        });
                }
            })?;
        Ok(())
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
}
