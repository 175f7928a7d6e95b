//! CUDA graphs for a trial: capture the ops issued on its stream once, then replay them.

use std::sync::Arc;

use cudarc::driver::sys;

use super::entered::Entered;
use super::status::check;
use super::stream::Stream;
use crate::error::EngineError;

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
