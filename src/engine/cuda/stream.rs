//! A trial's stream, created in its context, waiting for it without blocking other trials, and pacing the host against it.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys;

use super::context::Ctx;
use super::status::check;
use crate::error::EngineError;

/// Polls before sleeping between polls, when waiting on a stream of a green context.
const SPIN_POLLS: u32 = 64;
/// The first pause between later polls; each pause doubles, up to [`MAX_POLL_PAUSE`].
const POLL_PAUSE: Duration = Duration::from_micros(20);
/// The longest pause between polls: a long step (ResNet-50 on a few SMs takes seconds) is then
/// polled about a thousand times a second, not tens of thousands.
const MAX_POLL_PAUSE: Duration = Duration::from_millis(1);

/// A non-blocking stream of one context.
pub(crate) struct Stream {
    raw: sys::CUstream,
    ctx: Arc<Ctx>,
}

// SAFETY: a stream handle is valid on every thread; calls on it go through `Ctx::enter`.
unsafe impl Send for Stream {}
// SAFETY: as above; `Stream` has no interior mutability.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream in `ctx` (a green context's stream runs on its SMs only).
    pub(crate) fn new(ctx: Arc<Ctx>) -> Result<Arc<Stream>, EngineError> {
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        let mut raw = std::ptr::null_mut();
        {
            let _in = ctx.enter()?;
            if ctx.is_green() {
                // SAFETY: the green context is live; the driver requires CU_STREAM_NON_BLOCKING.
                let r =
                    unsafe { sys::cuGreenCtxStreamCreate(&mut raw, ctx.green_handle(), flags, 0) };
                check(r, "cuGreenCtxStreamCreate")?;
            } else {
                // SAFETY: the primary context is current; writes one stream handle.
                check(
                    unsafe { sys::cuStreamCreate(&mut raw, flags) },
                    "cuStreamCreate",
                )?;
            }
        }
        Ok(Arc::new(Stream { raw, ctx }))
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }

    pub(crate) fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// Waits until all work issued to the stream has finished. In a green context this polls,
    /// entering the context only for each poll, so that trials sharing it can keep issuing work.
    pub(crate) fn wait(&self) -> Result<(), EngineError> {
        if !self.ctx.is_green() {
            let _in = self.ctx.enter()?;
            // SAFETY: the stream belongs to the current (primary) context.
            return check(
                unsafe { sys::cuStreamSynchronize(self.raw) },
                "cuStreamSynchronize",
            );
        }
        // SAFETY: the stream belongs to the context that `poll` enters for each query.
        poll(
            &self.ctx,
            || unsafe { sys::cuStreamQuery(self.raw) },
            "cuStreamQuery",
        )
    }
}

/// Calls `query` (with `ctx` entered for each call only) until it reports done, yielding and
/// then sleeping between calls, so that trials sharing the context keep issuing work meanwhile.
fn poll(
    ctx: &Ctx,
    mut query: impl FnMut() -> sys::CUresult,
    name: &str,
) -> Result<(), EngineError> {
    let (mut polls, mut pause) = (0u32, POLL_PAUSE);
    loop {
        let r = {
            let _in = ctx.enter()?;
            query()
        };
        match r {
            sys::CUresult::CUDA_SUCCESS => return Ok(()),
            sys::CUresult::CUDA_ERROR_NOT_READY => {}
            other => return check(other, name),
        }
        polls += 1;
        if polls < SPIN_POLLS {
            std::thread::yield_now();
        } else {
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_POLL_PAUSE);
        }
    }
}

/// Keeps the host a bounded number of steps ahead of a stream. Kernel launches and graph
/// replays return at once, so without it a trial's thread could queue an epoch of steps; a
/// cancel then waits for all of them (minutes for ResNet-50 on a small green partition). Each
/// [`Pacer::mark`] records an event after the work issued so far and waits for the mark `lead`
/// before it, so at most `lead` steps are queued when the host checks for a cancel.
pub(crate) struct Pacer {
    stream: Arc<Stream>,
    /// Recorded marks, oldest first.
    marks: std::collections::VecDeque<sys::CUevent>,
    /// Events whose marks have passed, for reuse.
    spare: Vec<sys::CUevent>,
}

// SAFETY: event handles are valid on every thread; calls on them go through `Ctx::enter`.
unsafe impl Send for Pacer {}

impl Pacer {
    pub(crate) fn new(stream: Arc<Stream>) -> Pacer {
        Pacer {
            stream,
            marks: Default::default(),
            spare: Vec::new(),
        }
    }

    /// Marks the end of the work issued so far, then waits until no more than `lead` marks
    /// (at least 1) are unfinished. Not while the stream captures a graph.
    pub(crate) fn mark(&mut self, lead: usize) -> Result<(), EngineError> {
        let ctx = Arc::clone(&self.stream.ctx);
        let event = match self.spare.pop() {
            Some(e) => e,
            None => {
                let _in = ctx.enter()?;
                let mut e = std::ptr::null_mut();
                let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
                // SAFETY: writes one event handle of the current context, destroyed on drop.
                check(
                    unsafe { sys::cuEventCreate(&mut e, flags) },
                    "cuEventCreate",
                )?;
                e
            }
        };
        let recorded = ctx.enter().and_then(|_in| {
            // SAFETY: the event and the stream belong to the current context.
            check(
                unsafe { sys::cuEventRecord(event, self.stream.raw) },
                "cuEventRecord",
            )
        });
        if let Err(e) = recorded {
            // Kept for reuse (and destroyed on drop), not leaked.
            self.spare.push(event);
            return Err(e);
        }
        self.marks.push_back(event);
        while self.marks.len() > lead.max(1) {
            let Some(oldest) = self.marks.pop_front() else {
                break;
            };
            // SAFETY: the event belongs to the context `poll` enters, and was recorded above.
            let waited = poll(
                &ctx,
                || unsafe { sys::cuEventQuery(oldest) },
                "cuEventQuery",
            );
            self.spare.push(oldest);
            waited?;
        }
        Ok(())
    }
}

impl Drop for Pacer {
    fn drop(&mut self) {
        if let Ok(_in) = self.stream.ctx.enter() {
            for e in self.marks.drain(..).chain(self.spare.drain(..)) {
                // SAFETY: the event's last user is gone; the driver releases it once its
                // recorded work completes. Errors cannot be reported from Drop.
                let _ = unsafe { sys::cuEventDestroy_v2(e) };
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Destroying a stream may synchronise: not while another thread captures a graph.
        super::capture_hold::without_captures(|| {
            if let Ok(_in) = self.ctx.enter() {
                // SAFETY: the stream's last user is gone; the driver releases it once its
                // pending work (if any) completes. Errors cannot be reported from Drop.
                let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
            }
        });
    }
}
