//! Execution contexts (the primary one, or a green one) with their kernels, entered per call on any thread.
//!
//! The driver lets a green context be current to only one thread at a time and does not
//! synchronise calls into it from several threads, while several trials (on several threads) may
//! share one partition. So every call into a green context happens inside [`Ctx::enter`], which
//! holds the context's lock, makes it current, and on leaving makes the primary context current
//! again. The primary context needs no lock.

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys;

use super::capture_hold;
use super::device::Device;
use super::entered::{make_current, Entered};
use super::kernels::CompiledModule;
use super::launch::Kernels;
use super::status::check;
use crate::error::EngineError;

/// A context and the kernels loaded into it.
pub(crate) struct Ctx {
    raw: sys::CUcontext,
    /// The green context behind `raw`; null for the primary context.
    green: sys::CUgreenCtx,
    /// Serialises calls into a green context; `None` for the primary context.
    lock: Option<Mutex<()>>,
    kernels: Kernels,
    /// Signatures of the work that has run in this context (its kernels loaded, cuBLAS's and
    /// cuDNN's included): such work needs no hold on the process's captures again.
    loaded: Mutex<std::collections::HashSet<u64>>,
    /// Keeps the primary context retained for as long as any context is in use.
    device: Arc<Device>,
}

// SAFETY: context, green-context and function handles are plain driver handles valid on every
// thread; every call that uses them goes through `enter`, which serialises green contexts.
unsafe impl Send for Ctx {}
// SAFETY: as above; `enter` is the only way in and it takes the lock where one is needed.
unsafe impl Sync for Ctx {}

impl Ctx {
    /// The device's primary context, with every compiled module loaded into it.
    pub(crate) fn primary(
        device: Arc<Device>,
        compiled: &[CompiledModule],
    ) -> Result<Arc<Ctx>, EngineError> {
        let raw = device.primary;
        let kernels = {
            let entered = make_current(raw, None, None)?;
            Kernels::load(&entered, compiled)?
        };
        Ok(Arc::new(Ctx {
            raw,
            green: std::ptr::null_mut(),
            lock: None,
            kernels,
            loaded: Default::default(),
            device,
        }))
    }

    /// Takes ownership of `green` (destroyed on failure or drop) and loads every module into it.
    pub(crate) fn green(
        device: Arc<Device>,
        green: sys::CUgreenCtx,
        compiled: &[CompiledModule],
    ) -> Result<Arc<Ctx>, EngineError> {
        let destroy = |e: EngineError| {
            // SAFETY: `green` is live, owned here, and nothing was built on it yet.
            let _ = unsafe { sys::cuGreenCtxDestroy(green) };
            e
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one context handle standing for the live green context.
        let r = unsafe { sys::cuCtxFromGreenCtx(&mut raw, green) };
        check(r, "cuCtxFromGreenCtx").map_err(destroy)?;
        // Nobody else can reach this context yet, so no lock is needed for loading. The green
        // context is left (the primary one made current again) before any destruction. Loading
        // modules may synchronise: not while another thread captures a graph.
        let loaded = capture_hold::without_captures(|| {
            make_current(raw, None, Some(device.primary))
                .and_then(|entered| Kernels::load(&entered, compiled))
        });
        let kernels = loaded.map_err(destroy)?;
        Ok(Arc::new(Ctx {
            raw,
            green,
            lock: Some(Mutex::new(())),
            kernels,
            loaded: Default::default(),
            device,
        }))
    }

    /// Makes this context current on the calling thread until the returned value is dropped.
    /// Never call it while already inside: the lock is not re-entrant.
    pub(crate) fn enter(&self) -> Result<Entered<'_>, EngineError> {
        let lock = self
            .lock
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(PoisonError::into_inner));
        let restore = self.is_green().then_some(self.device.primary);
        make_current(self.raw, lock, restore)
    }

    /// Whether work of `signature` has run in this context ([`Ctx::mark_loaded`]).
    pub(crate) fn loaded(&self, signature: u64) -> bool {
        let set = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        set.contains(&signature)
    }

    /// Records that work of `signature` has run in this context, its kernels loaded.
    pub(crate) fn mark_loaded(&self, signature: u64) {
        let mut set = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        set.insert(signature);
    }

    pub(crate) fn is_green(&self) -> bool {
        !self.green.is_null()
    }

    /// The green context, for creating its streams; null for the primary context.
    pub(crate) fn green_handle(&self) -> sys::CUgreenCtx {
        self.green
    }

    pub(crate) fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    pub(crate) fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        let mut kernels = std::mem::replace(&mut self.kernels, Kernels::empty());
        // Unloading modules and destroying a context may synchronise: not while a graph is captured.
        capture_hold::without_captures(|| {
            if let Ok(entered) = self.enter() {
                kernels.unload(&entered);
            }
            if self.is_green() {
                // SAFETY: the last user of the green context is gone (this is its only owner)
                // and the primary context is current again (`entered` was dropped above).
                let _ = unsafe { sys::cuGreenCtxDestroy(self.green) };
            }
        });
    }
}
