//! Holding graph captures off: while a thread does eager work that may load kernels or synchronise the device, no capture runs anywhere in the process.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use crate::error::EngineError;

/// Captures running in this process (between [`capture_started`] and [`capture_ended`]).
static CAPTURES: Mutex<usize> = Mutex::new(0);
/// Signalled when the last running capture ends.
static NO_CAPTURES: Condvar = Condvar::new();
/// Holds taken in this process so far ([`holds_taken`]).
static HOLDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times a thread of this process has held every capture off so far: a trial whose
/// kernels are loaded already (on a warm slice) takes none.
pub fn holds_taken() -> u64 {
    HOLDS.load(std::sync::atomic::Ordering::Relaxed)
}

thread_local! {
    /// Whether this thread holds captures off ([`hold`]).
    static HOLDING: Cell<bool> = const { Cell::new(false) };
    /// Captures this thread is running: a hold taken on it then does not wait (for itself).
    static CAPTURING: Cell<u32> = const { Cell::new(0) };
}

/// While alive, no graph capture runs in the process and none starts. Held around eager work
/// that may load kernels or synchronise the device (a trial's first step and first evaluation,
/// library handles made or destroyed, teardown): such work during another thread's capture
/// invalidates that capture. Not `Send`: it stays on the thread that took it.
pub struct CaptureHold {
    guard: Option<MutexGuard<'static, usize>>,
}

impl CaptureHold {
    /// A hold that holds nothing (backends without graphs).
    pub fn none() -> CaptureHold {
        CaptureHold { guard: None }
    }
}

impl Drop for CaptureHold {
    fn drop(&mut self) {
        if self.guard.take().is_some() {
            HOLDING.with(|h| h.set(false));
        }
    }
}

/// Waits until no capture is running, then keeps new ones from starting until the hold is
/// dropped. Holds taken again on the same thread are nested in the first, and a thread that is
/// capturing itself does not wait (it would wait for itself): neither deadlocks. Take it with
/// no context entered (it may be held while contexts are entered).
pub(crate) fn hold() -> CaptureHold {
    if HOLDING.with(Cell::get) || CAPTURING.with(Cell::get) > 0 {
        return CaptureHold::none();
    }
    let mut n = CAPTURES.lock().unwrap_or_else(PoisonError::into_inner);
    while *n > 0 {
        n = NO_CAPTURES.wait(n).unwrap_or_else(PoisonError::into_inner);
    }
    HOLDING.with(|h| h.set(true));
    HOLDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    CaptureHold { guard: Some(n) }
}

/// Counts a capture as running; call it before `begin`, with no context entered. Refused on a
/// thread that holds captures off (it would wait for itself).
pub(crate) fn capture_started() -> Result<(), EngineError> {
    if HOLDING.with(Cell::get) {
        return Err(EngineError::Device(
            "a capture cannot start while this thread holds captures off".into(),
        ));
    }
    *CAPTURES.lock().unwrap_or_else(PoisonError::into_inner) += 1;
    CAPTURING.with(|c| c.set(c.get() + 1));
    Ok(())
}

/// Counts a capture as over, whether it ended well or not; call it with no context entered, on
/// the thread that started it.
pub(crate) fn capture_ended() {
    CAPTURING.with(|c| c.set(c.get().saturating_sub(1)));
    let mut n = CAPTURES.lock().unwrap_or_else(PoisonError::into_inner);
    *n = n.saturating_sub(1);
    if *n == 0 {
        NO_CAPTURES.notify_all();
    }
}

/// Whether this thread holds every capture of the process off ([`hold`]).
pub(crate) fn holding() -> bool {
    HOLDING.with(Cell::get)
}

/// Runs `f` once no capture is running in the process, and keeps new ones from starting until it
/// returns ([`hold`]). For teardown that may synchronise the whole device (`cublasDestroy`,
/// `cuMemFree`, module unloading): the thread-local capture mode does not protect a capture on
/// one thread from a device synchronisation on another, which invalidates it. Call it with no
/// context entered (it may enter one inside `f`), and never from a thread with a capture of
/// its own.
pub(crate) fn without_captures<R>(f: impl FnOnce() -> R) -> R {
    let _hold = hold();
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn device_wide_teardown_waits_for_running_captures() {
        let done = Arc::new(AtomicBool::new(false));
        capture_started().unwrap();
        let teardown = {
            let done = Arc::clone(&done);
            std::thread::spawn(move || without_captures(|| done.store(true, Ordering::SeqCst)))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!done.load(Ordering::SeqCst), "ran during a capture");
        capture_ended();
        teardown.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        // With no capture running it runs at once.
        assert_eq!(without_captures(|| 7), 7);
    }

    #[test]
    fn a_hold_keeps_captures_from_starting_and_nests() {
        let hold = hold();
        // Nested holds and teardown on the holding thread do not wait for themselves.
        assert_eq!(without_captures(|| without_captures(|| 3)), 3);
        // This thread cannot start a capture while it holds them off.
        assert!(capture_started().is_err());
        let started = Arc::new(AtomicBool::new(false));
        let other = {
            let started = Arc::clone(&started);
            std::thread::spawn(move || {
                capture_started().unwrap();
                started.store(true, Ordering::SeqCst);
                capture_ended();
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !started.load(Ordering::SeqCst),
            "a capture started during a hold"
        );
        drop(hold);
        other.join().unwrap();
        assert!(started.load(Ordering::SeqCst));
        // Released: this thread may capture again, and while it does, its own teardown does
        // not wait for its capture to end.
        capture_started().unwrap();
        assert_eq!(without_captures(|| 5), 5);
        capture_ended();
    }
}
