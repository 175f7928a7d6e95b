//! Host-to-device copies that do not make the host wait, and looks at device values that never wait: page-locked staging buffers ordered on the trial's stream by events.

use std::sync::Arc;

use cudarc::driver::sys;

use super::capture_hold;
use super::status::check;
use super::stream::Stream;
use crate::error::EngineError;

/// The first capacity of an upload buffer: a few epochs' training orders of a fused group.
const FIRST_UPLOAD_BYTES: usize = 4 << 20;
/// The first capacity of the peek buffer: a fused group's training sums.
const FIRST_PEEK_BYTES: usize = 4 << 10;

/// A page-locked host buffer and the event recorded after the last copy that uses it.
struct Pinned {
    ptr: *mut u8,
    bytes: usize,
    /// Recorded after the last copy issued from or into the buffer; `None` before the first.
    event: Option<sys::CUevent>,
}

impl Pinned {
    fn empty() -> Pinned {
        Pinned {
            ptr: std::ptr::null_mut(),
            bytes: 0,
            event: None,
        }
    }
}

/// One trial's staging: an upload ring and a peek buffer, both on the trial's stream.
pub(crate) struct Staging {
    stream: Arc<Stream>,
    upload: Pinned,
    /// Bytes of `upload` used since its copies last drained.
    used: usize,
    peek: Pinned,
    /// Bytes of the peek copy on its way, if one is.
    posted: Option<usize>,
}

// SAFETY: the host buffers are owned by this value and only touched through `&mut self`; the
// event handles are valid on every thread and used through `Ctx::enter`.
unsafe impl Send for Staging {}

impl Staging {
    /// The staging of a trial's stream, with its first buffers: page-locked memory is made and
    /// freed with every capture of the process held off (both synchronise the device).
    pub(crate) fn new(stream: Arc<Stream>) -> Result<Staging, EngineError> {
        let ctx = Arc::clone(stream.ctx());
        let (upload, peek) = capture_hold::without_captures(|| -> Result<_, EngineError> {
            let upload = allocate(&ctx, FIRST_UPLOAD_BYTES)?;
            match allocate(&ctx, FIRST_PEEK_BYTES) {
                Ok(peek) => Ok((upload, peek)),
                Err(e) => {
                    let mut upload = upload;
                    release(&ctx, &mut upload);
                    Err(e)
                }
            }
        })?;
        Ok(Staging {
            stream,
            upload,
            used: 0,
            peek,
            posted: None,
        })
    }

    /// Forgets a peek on its way: the arena it was copying from has been replaced (a new
    /// trial, or a part of a group), and its values belong to the old one.
    pub(crate) fn forget_peek(&mut self) {
        self.posted = None;
    }

    /// Copies `src` to device address `dst` in stream order without waiting for the copy: `src`
    /// is first copied into the page-locked ring. The host waits only when the ring is full of
    /// copies still on their way (never in a training, which uploads once an epoch).
    pub(crate) fn upload<T: Copy>(
        &mut self,
        dst: sys::CUdeviceptr,
        src: &[T],
    ) -> Result<(), EngineError> {
        let bytes = std::mem::size_of_val(src);
        if bytes == 0 {
            return Ok(());
        }
        if self.used + bytes > self.upload.bytes {
            // Every earlier copy out of the ring must have finished before it is written again.
            self.settle_upload()?;
            self.used = 0;
            if bytes > self.upload.bytes {
                let ctx = Arc::clone(self.stream.ctx());
                let upload = &mut self.upload;
                capture_hold::without_captures(|| {
                    release(&ctx, upload);
                    *upload = allocate(&ctx, (2 * bytes).max(FIRST_UPLOAD_BYTES))?;
                    Ok::<_, EngineError>(())
                })?;
            }
        }
        let at = self.used;
        // SAFETY: the ring holds `upload.bytes ≥ at + bytes` bytes, no copy in flight reads this
        // part of it (settled above when it wrapped), and `T` is plain data.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr().cast::<u8>(),
                self.upload.ptr.add(at),
                bytes,
            );
        }
        {
            let ctx = Arc::clone(self.stream.ctx());
            let _in = ctx.enter()?;
            // SAFETY: `dst` holds `bytes` bytes (checked by the caller); the source is
            // page-locked and stays untouched until the event recorded below has passed.
            let r = unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst,
                    self.upload.ptr.add(at).cast(),
                    bytes,
                    self.stream.raw(),
                )
            };
            check(r, "cuMemcpyHtoDAsync_v2")?;
        }
        self.used = at + bytes;
        record(&self.stream, &mut self.upload)
    }

    /// Fills `dst` with the values of the copy issued by the last call, if it has arrived
    /// (`true`), and issues the next copy of `src`; `false` while the last one is on its way.
    pub(crate) fn peek<T: Copy>(
        &mut self,
        src: sys::CUdeviceptr,
        dst: &mut [T],
    ) -> Result<bool, EngineError> {
        let bytes = std::mem::size_of_val(dst);
        if bytes == 0 {
            return Ok(true);
        }
        let ctx = Arc::clone(self.stream.ctx());
        let mut arrived = false;
        if let Some(posted) = self.posted {
            let done = match self.peek.event {
                // SAFETY: the event belongs to the stream's context, entered for the query.
                Some(ev) => query(&ctx, ev)?,
                None => true,
            };
            if !done {
                return Ok(false);
            }
            if posted == bytes {
                // SAFETY: the copy into the buffer has finished (its event passed); `T` is
                // plain data and the buffer holds `bytes` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.peek.ptr,
                        dst.as_mut_ptr().cast::<u8>(),
                        bytes,
                    );
                }
                arrived = true;
            }
            self.posted = None;
        }
        if bytes > self.peek.bytes {
            let peek = &mut self.peek;
            capture_hold::without_captures(|| {
                release(&ctx, peek);
                *peek = allocate(&ctx, bytes)?;
                Ok::<_, EngineError>(())
            })?;
        }
        {
            let _in = ctx.enter()?;
            // SAFETY: `src` holds `bytes` bytes (checked by the caller); the page-locked buffer
            // holds at least as many and is not read until the event recorded below has passed.
            let r = unsafe {
                sys::cuMemcpyDtoHAsync_v2(self.peek.ptr.cast(), src, bytes, self.stream.raw())
            };
            check(r, "cuMemcpyDtoHAsync_v2")?;
        }
        record(&self.stream, &mut self.peek)?;
        self.posted = Some(bytes);
        Ok(arrived)
    }

    /// Waits until every copy out of the upload ring has finished.
    fn settle_upload(&mut self) -> Result<(), EngineError> {
        match self.upload.event {
            Some(ev) => {
                let ctx = Arc::clone(self.stream.ctx());
                let _in = ctx.enter()?;
                // SAFETY: the event belongs to the current context.
                check(unsafe { sys::cuEventSynchronize(ev) }, "cuEventSynchronize")
            }
            None => Ok(()),
        }
    }
}

/// A page-locked buffer of `bytes` bytes, usable from every context.
fn allocate(ctx: &super::context::Ctx, bytes: usize) -> Result<Pinned, EngineError> {
    let _in = ctx.enter()?;
    let mut ptr = std::ptr::null_mut();
    // SAFETY: writes one host pointer to `bytes` page-locked bytes, freed in `release`.
    let r = unsafe { sys::cuMemHostAlloc(&mut ptr, bytes, sys::CU_MEMHOSTALLOC_PORTABLE) };
    check(r, "cuMemHostAlloc")?;
    Ok(Pinned {
        ptr: ptr.cast(),
        bytes,
        event: None,
    })
}

/// Records `p`'s event after the work issued so far on `stream`, creating it first if needed.
fn record(stream: &Stream, p: &mut Pinned) -> Result<(), EngineError> {
    let _in = stream.ctx().enter()?;
    let ev = match p.event {
        Some(ev) => ev,
        None => {
            let mut ev = std::ptr::null_mut();
            let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
            // SAFETY: writes one event handle of the current context, destroyed in `release`.
            check(
                unsafe { sys::cuEventCreate(&mut ev, flags) },
                "cuEventCreate",
            )?;
            p.event = Some(ev);
            ev
        }
    };
    // SAFETY: the event and the stream belong to the current context.
    check(
        unsafe { sys::cuEventRecord(ev, stream.raw()) },
        "cuEventRecord",
    )
}

/// Whether the work before `ev` has finished, without waiting.
fn query(ctx: &super::context::Ctx, ev: sys::CUevent) -> Result<bool, EngineError> {
    let _in = ctx.enter()?;
    // SAFETY: the event belongs to the current context.
    match unsafe { sys::cuEventQuery(ev) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        other => check(other, "cuEventQuery").map(|()| false),
    }
}

/// Frees `p` once the copies that use it have finished, and its event.
fn release(ctx: &super::context::Ctx, p: &mut Pinned) {
    let Ok(_in) = ctx.enter() else { return };
    if let Some(ev) = p.event.take() {
        // SAFETY: the event belongs to the current context; a copy still on its way must finish
        // before its buffer is freed. Errors cannot be reported from a release.
        unsafe {
            let _ = sys::cuEventSynchronize(ev);
            let _ = sys::cuEventDestroy_v2(ev);
        }
    }
    if !p.ptr.is_null() {
        // SAFETY: the buffer came from cuMemHostAlloc and no copy uses it any more.
        let _ = unsafe { sys::cuMemFreeHost(p.ptr.cast()) };
    }
    *p = Pinned::empty();
}

impl Drop for Staging {
    fn drop(&mut self) {
        let ctx = Arc::clone(self.stream.ctx());
        capture_hold::without_captures(|| {
            release(&ctx, &mut self.upload);
            release(&ctx, &mut self.peek);
        });
    }
}
