//! The dataset resident on the device, uploaded once and shared read-only by every trial of the process.

use std::sync::Arc;

use cudarc::driver::sys;

use super::capture_hold;
use super::context::Ctx;
use super::status::check;
use crate::data::{Dataset, Samples};
use crate::error::EngineError;

/// Device memory allocated in the primary context (outside every trial's pool), freed on drop.
pub(crate) struct DevBuf {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<Ctx>,
}

// SAFETY: a device pointer is valid on every thread of the process; it is only written at upload
// and freed once, in Drop, after which nobody holds it.
unsafe impl Send for DevBuf {}
// SAFETY: shared use only reads the pointer value; kernels read the memory it points to.
unsafe impl Sync for DevBuf {}

impl DevBuf {
    /// A copy of `host` on the device (no allocation when it is empty: the pointer is 0).
    pub(crate) fn upload<T: Copy>(ctx: &Arc<Ctx>, host: &[T]) -> Result<DevBuf, EngineError> {
        let bytes = std::mem::size_of_val(host);
        let buf = DevBuf::alloc(ctx, bytes)?;
        if bytes > 0 {
            let _in = ctx.enter()?;
            // SAFETY: `buf` holds `bytes` bytes; `host` is `bytes` bytes of plain data that the
            // synchronous copy reads before returning.
            let r = unsafe { sys::cuMemcpyHtoD_v2(buf.ptr, host.as_ptr().cast(), bytes) };
            check(r, "cuMemcpyHtoD_v2")?;
            // From pageable memory the synchronous copy returns once `host` is staged, while the
            // DMA to the device may still run on the legacy stream, which the trials'
            // non-blocking streams do not wait for. Wait for it here.
            // SAFETY: the null stream is the current context's legacy stream.
            let r = unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) };
            check(r, "cuStreamSynchronize")?;
        }
        Ok(buf)
    }

    /// `bytes` of uninitialised device memory.
    pub(crate) fn alloc(ctx: &Arc<Ctx>, bytes: usize) -> Result<DevBuf, EngineError> {
        let mut ptr = 0;
        if bytes > 0 {
            let _in = ctx.enter()?;
            // SAFETY: writes one device pointer; freed in Drop.
            check(
                unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) },
                "cuMemAlloc_v2",
            )?;
        }
        Ok(DevBuf {
            ptr,
            bytes,
            ctx: Arc::clone(ctx),
        })
    }

    /// Copies the whole buffer into `host` (of the same size), synchronously.
    pub(crate) fn download<T: Copy>(&self, host: &mut [T]) -> Result<(), EngineError> {
        let bytes = std::mem::size_of_val(host);
        if bytes != self.bytes {
            return Err(EngineError::Device(format!(
                "download of {bytes} bytes from a buffer of {}",
                self.bytes
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        let _in = self.ctx.enter()?;
        // SAFETY: both sides hold `bytes` bytes; the synchronous copy waits for prior work
        // (the legacy default stream) and finishes before returning. `T` is plain data.
        let r = unsafe { sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), self.ptr, bytes) };
        check(r, "cuMemcpyDtoH_v2")
    }

    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        // cuMemFree may synchronise the device: not while another thread captures a graph.
        capture_hold::without_captures(|| {
            if let Ok(_in) = self.ctx.enter() {
                // SAFETY: allocated by cuMemAlloc_v2 and freed once; cuMemFree waits for work
                // using it to finish. Errors cannot be reported from Drop.
                let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
            }
        });
    }
}

/// One split on the device: images (`n × sample_len` floats) and labels as floats.
pub(crate) struct DeviceSplit {
    pub images: DevBuf,
    pub labels: DevBuf,
    pub len: usize,
}

impl DeviceSplit {
    fn upload(
        ctx: &Arc<Ctx>,
        s: &Samples,
        sample_len: usize,
        name: &str,
    ) -> Result<Self, EngineError> {
        if s.images.len() != s.len() * sample_len {
            return Err(EngineError::Shape {
                op: "upload",
                message: format!(
                    "the {name} split has {} pixels for {} samples of {sample_len}",
                    s.images.len(),
                    s.len()
                ),
            });
        }
        let labels: Vec<f32> = s.labels.iter().map(|&l| l as f32).collect();
        Ok(DeviceSplit {
            images: DevBuf::upload(ctx, &s.images)?,
            labels: DevBuf::upload(ctx, &labels)?,
            len: s.len(),
        })
    }
}

/// A dataset resident on the device: both splits, and the identity order that gathers the test
/// split in file order. Freed when the last trial using it is dropped.
pub struct DeviceData {
    pub(crate) train: DeviceSplit,
    pub(crate) test: DeviceSplit,
    pub(crate) test_order: DevBuf,
    pub(crate) sample_len: usize,
    pub(crate) classes: usize,
    pub(crate) ctx: Arc<Ctx>,
}

impl DeviceData {
    /// Uploads `data` through the primary context `ctx`.
    pub(crate) fn upload(ctx: &Arc<Ctx>, data: &Dataset) -> Result<DeviceData, EngineError> {
        let sample_len = data.sample_len();
        let n_test = u32::try_from(data.test.len()).map_err(|_| EngineError::Shape {
            op: "upload",
            message: format!("{} test samples are too many", data.test.len()),
        })?;
        let identity: Vec<u32> = (0..n_test).collect();
        Ok(DeviceData {
            train: DeviceSplit::upload(ctx, &data.train, sample_len, "training")?,
            test: DeviceSplit::upload(ctx, &data.test, sample_len, "test")?,
            test_order: DevBuf::upload(ctx, &identity)?,
            sample_len,
            classes: data.classes,
            ctx: Arc::clone(ctx),
        })
    }

    /// Elements per sample.
    pub fn sample_len(&self) -> usize {
        self.sample_len
    }

    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Samples in the training and test splits.
    pub fn lens(&self) -> (usize, usize) {
        (self.train.len, self.test.len)
    }
}
