//! Making a context current on this thread, and the proof that it is ([`Entered`]): what a launch, a capture or a copy asks for.

use std::sync::MutexGuard;

use cudarc::driver::sys;

use super::status::check;
use crate::error::EngineError;

/// Proof that a context is current on this thread (and, for a green context, that its lock is
/// held). Not `Send`: it cannot leave the thread that entered.
pub(crate) struct Entered<'a> {
    _lock: Option<MutexGuard<'a, ()>>,
    /// The primary context, made current again on leaving a green one.
    restore: Option<sys::CUcontext>,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Some(primary) = self.restore {
            // SAFETY: the primary context stays retained while any Ctx lives. An error here
            // cannot be reported from Drop; the next `enter` sets its own context anyway.
            let _ = unsafe { sys::cuCtxSetCurrent(primary) };
        }
    }
}

/// Makes `raw` current on this thread; `restore` (when given) is made current again on leaving.
pub(crate) fn make_current<'a>(
    raw: sys::CUcontext,
    lock: Option<MutexGuard<'a, ()>>,
    restore: Option<sys::CUcontext>,
) -> Result<Entered<'a>, EngineError> {
    let entered = Entered {
        _lock: lock,
        restore,
    };
    // SAFETY: `raw` is a live context (primary, or from cuCtxFromGreenCtx of a live green one).
    check(unsafe { sys::cuCtxSetCurrent(raw) }, "cuCtxSetCurrent")?;
    Ok(entered)
}
