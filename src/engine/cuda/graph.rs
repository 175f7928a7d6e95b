//! CUDA graphs for a trial: capture the ops issued on its stream once, then replay them.

use std::cell::Cell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use cudarc::driver::sys;

use super::context::Entered;
use super::status::check;
use super::stream::Stream;
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

/// Runs `f` once no capture is running in the process, and keeps new ones from starting until it
/// returns ([`hold`]). For teardown that may synchronise the whole device (`cublasDestroy`,
/// `cuMemFree`, module unloading): the thread-local capture mode does not protect a capture on
/// one thread from a device synchronisation on another, which invalidates it. Call it with no
/// context entered (it may enter one inside `f`), and never from a thread with a capture of
/// its own.
/// Whether this thread holds every capture of the process off ([`hold`]).
pub(crate) fn holding() -> bool {
    HOLDING.with(Cell::get)
}

pub(crate) fn without_captures<R>(f: impl FnOnce() -> R) -> R {
    let _hold = hold();
    f()
}

/// Starts capturing `stream`. Thread-local mode: only this thread's unsafe calls (allocations,
/// synchronous copies) are forbidden meanwhile, so other trials' threads carry on; teardown that
/// synchronises the device waits for the capture to end ([`without_captures`]).
pub(crate) fn begin(_in: &Entered, stream: &Stream) -> Result<(), EngineError> {
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    // SAFETY: the stream belongs to the current context and is not capturing.
    let r = unsafe { sys::cuStreamBeginCapture_v2(stream.raw(), mode) };
    check(r, "cuStreamBeginCapture_v2")
}

/// An instantiated graph, ready to launch.
pub(crate) struct GraphExec {
    raw: sys::CUgraphExec,
    stream: Arc<Stream>,
}

// SAFETY: an executable-graph handle is valid on every thread; the owning backend uses it from one
// thread at a time, entering the stream's context.
unsafe impl Send for GraphExec {}

/// Ends the capture of `stream` (always, even when it failed, so the stream is usable again) and
/// instantiates what was recorded.
pub(crate) fn end(_in: &Entered, stream: &Arc<Stream>) -> Result<GraphExec, EngineError> {
    let mut graph = std::ptr::null_mut();
    // SAFETY: the stream is capturing on this thread; writes one graph handle (null on failure).
    let r = unsafe { sys::cuStreamEndCapture(stream.raw(), &mut graph) };
    check(r, "cuStreamEndCapture")?;
    if graph.is_null() {
        return Err(EngineError::Device(
            "cuStreamEndCapture: no graph was recorded".into(),
        ));
    }
    let mut exec = std::ptr::null_mut();
    // SAFETY: `graph` is the live graph just recorded; writes one executable handle.
    let instantiated = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
    // The executable graph does not need its source graph.
    // SAFETY: `graph` is live and destroyed once.
    let destroyed = unsafe { sys::cuGraphDestroy(graph) };
    check(instantiated, "cuGraphInstantiateWithFlags")?;
    if let Err(e) = check(destroyed, "cuGraphDestroy") {
        // Destroyed here, inside the context, rather than by Drop (which enters it).
        // SAFETY: `exec` was just instantiated and is destroyed once.
        let _ = unsafe { sys::cuGraphExecDestroy(exec) };
        return Err(e);
    }
    Ok(GraphExec {
        raw: exec,
        stream: Arc::clone(stream),
    })
}

impl GraphExec {
    /// Runs the graph once on its stream.
    pub(crate) fn launch(&self, _in: &Entered) -> Result<(), EngineError> {
        // SAFETY: the executable graph and its stream are live, in the current context.
        check(
            unsafe { sys::cuGraphLaunch(self.raw, self.stream.raw()) },
            "cuGraphLaunch",
        )
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        if let Ok(_in) = self.stream.ctx().enter() {
            // SAFETY: the handle is live and destroyed once; a launch still running keeps its
            // own resources until it completes. Errors cannot be reported from Drop.
            let _ = unsafe { sys::cuGraphExecDestroy(self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
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
