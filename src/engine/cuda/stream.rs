//! A trial's stream, created in its context, and waiting for it without blocking other trials.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys;

use super::check::check;
use super::context::Ctx;
use crate::error::EngineError;

/// Polls before sleeping between polls, when waiting on a stream of a green context.
const SPIN_POLLS: u32 = 64;
/// The pause between later polls.
const POLL_PAUSE: Duration = Duration::from_micros(20);

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
        let mut polls = 0u32;
        loop {
            let r = {
                let _in = self.ctx.enter()?;
                // SAFETY: the stream belongs to the current context.
                unsafe { sys::cuStreamQuery(self.raw) }
            };
            match r {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                other => return check(other, "cuStreamQuery"),
            }
            polls += 1;
            if polls < SPIN_POLLS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(POLL_PAUSE);
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Destroying a stream may synchronise: not while another thread captures a graph.
        super::graph::without_captures(|| {
            if let Ok(_in) = self.ctx.enter() {
                // SAFETY: the stream's last user is gone; the driver releases it once its
                // pending work (if any) completes. Errors cannot be reported from Drop.
                let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
            }
        });
    }
}
