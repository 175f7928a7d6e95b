//! The process's CUDA engine: one device, its primary context and kernels, cuDNN when used, and the trials' backends made from them.

use std::sync::Arc;

use cudarc::cublas::sys as blas;

use super::backend::{CudaBackend, Idle, WarmKey};
use super::bound;
use super::context::Ctx;
use super::cudnn;
use super::cudnn_probe;
use super::data::{DevBuf, DeviceData};
use super::device::{CudaDeviceInfo, Device};
use super::green::{self, GreenPartition};
use super::kernels::{self, CompiledModule};
use super::launch::{launch, Arg};
use super::status::check_blas;
use super::stream::Stream;
use crate::data::Dataset;
use crate::engine::Backend;
use crate::engine::{ConvEngine, EngineOptions};
use crate::error::EngineError;
use crate::gpu::libs::{self, CudaLib};

/// Threads per block of the SM probe.
const PROBE_BLOCK: u32 = 128;

/// One per process: the device, its primary context with the compiled kernels, and cuBLAS.
pub struct CudaEngine {
    device: Arc<Device>,
    primary: Arc<Ctx>,
    compiled: &'static [CompiledModule],
    opts: EngineOptions,
    /// The cuDNN version the convolutions run on; `None` when they are GEMMs.
    cudnn: Option<usize>,
    /// Backends of finished trials, kept warm for the next trial on a slice like theirs.
    idle: Arc<Idle>,
}

/// The most backends kept warm at once; the oldest beyond it are dropped.
const MAX_IDLE: usize = 64;

/// Keeps a finished trial's backend for the next trial on a slice like its own: its arena and
/// graph are released (the memory goes back to its pool), its stream, pool, library handles,
/// pacing events and staging buffers stay. A backend whose engine is gone, that is still
/// capturing (a trial that stopped mid-capture), or that runs in a green partition (made anew
/// each round, so never asked for again) is dropped instead.
pub(crate) fn recycle(mut be: Box<CudaBackend>) {
    let Some(home) = be.home.as_ref().and_then(std::sync::Weak::upgrade) else {
        return;
    };
    // A green partition is made anew for each round, so its backends could not be taken again.
    if be.capturing || be.ctx.is_green() || be.release().is_err() {
        return;
    }
    let evicted: Vec<Box<CudaBackend>> = {
        let mut q = home
            .backends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        q.push_back(be);
        let extra = q.len().saturating_sub(MAX_IDLE);
        q.drain(..extra).collect()
    };
    // Dropped outside the lock: a backend's teardown may wait for running captures.
    drop(evicted);
}

impl CudaEngine {
    /// Opens device `ordinal`: initialises the driver, retains the primary context, compiles the
    /// kernels for the device's architecture, loads them, and checks that cuBLAS works.
    pub fn open(ordinal: usize, opts: &EngineOptions) -> Result<Arc<CudaEngine>, EngineError> {
        let unavailable = |reason: String| EngineError::Unavailable {
            backend: "cuda".into(),
            reason,
        };
        let device = Arc::new(Device::open(ordinal)?);
        let cublas = libs::preload(CudaLib::Cublas).map_err(|e| unavailable(e.to_string()))?;
        let compiled = kernels::compile_all(Some(device.info.compute_capability))?;
        let nvrtc = libs::preload(CudaLib::Nvrtc).map_err(|e| unavailable(e.to_string()))?;
        libs::record_bound(bound::check(CudaLib::Nvrtc, &nvrtc).map_err(unavailable)?);
        let primary = Ctx::primary(Arc::clone(&device), compiled)?;
        probe_cublas(&primary)?;
        libs::record_bound(bound::check(CudaLib::Cublas, &cublas).map_err(unavailable)?);
        let cudnn = match opts.conv {
            ConvEngine::Gemm => None,
            ConvEngine::Cudnn => {
                Some(
                    open_cudnn(&primary).map_err(|reason| EngineError::Unavailable {
                        backend: "cuda".into(),
                        reason: format!("engine.conv is cudnn, but {reason}"),
                    })?,
                )
            }
            ConvEngine::Auto => match open_cudnn(&primary) {
                Ok(v) => Some(v),
                Err(reason) => {
                    say_once(&format!(
                        "note: {reason}; convolutions run as im2col kernels and cuBLAS GEMMs"
                    ));
                    None
                }
            },
        };
        Ok(Arc::new(CudaEngine {
            device,
            primary,
            compiled,
            opts: opts.clone(),
            cudnn,
            idle: Default::default(),
        }))
    }

    /// Backends kept warm for the next trial ([`crate::engine::Backend::recycle`]).
    pub fn idle_backends(&self) -> usize {
        self.idle
            .backends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// What runs the convolutions: `cudnn 9.x.y` or `gemm` (im2col kernels and cuBLAS).
    pub fn conv_engine(&self) -> String {
        match self.cudnn {
            Some(v) => format!("cudnn {}.{}.{}", v / 10000, (v % 10000) / 100, v % 100),
            None => "gemm".into(),
        }
    }

    pub fn info(&self) -> &CudaDeviceInfo {
        &self.device.info
    }

    /// The driver's CUDA version, e.g. `13000`.
    pub fn driver_version(&self) -> i32 {
        self.device.driver_version
    }

    /// Uploads a dataset once (images, labels as `f32`, and an identity order for the test
    /// split); every trial of the process shares it read-only.
    pub fn upload(&self, data: &Dataset) -> Result<Arc<DeviceData>, EngineError> {
        Ok(Arc::new(DeviceData::upload(&self.primary, data)?))
    }

    /// `count` green contexts on disjoint SM groups of `sms_each` SMs (rounded up to the
    /// device's granularity); an error where green contexts are unsupported or do not fit.
    pub fn green_partitions(
        &self,
        count: u32,
        sms_each: u32,
    ) -> Result<Vec<Arc<GreenPartition>>, EngineError> {
        green::create(&self.device, self.compiled, count, sms_each)
    }

    /// Green contexts on disjoint SM groups of unequal size, one per entry of `sizes` (each
    /// rounded up to the device's granularity); an error where they are unsupported or do not fit.
    pub fn green_partitions_sized(
        &self,
        sizes: &[u32],
    ) -> Result<Vec<Arc<GreenPartition>>, EngineError> {
        green::create_sized(&self.device, self.compiled, sizes)
    }

    /// A trial's backend: its own stream (in the partition's green context when given, else in
    /// the primary context), its own memory pool capped at `cap_bytes`, and its own cuBLAS (and
    /// cuDNN) handles on that stream, whose workspaces come from the pool with the arena.
    pub fn backend(
        &self,
        data: Arc<DeviceData>,
        cap_bytes: Option<u64>,
        partition: Option<Arc<GreenPartition>>,
    ) -> Result<Box<dyn Backend>, EngineError> {
        if !Arc::ptr_eq(data.ctx.device(), &self.device) {
            return Err(EngineError::Device(
                "the dataset was uploaded by another CUDA engine".into(),
            ));
        }
        let ctx = match &partition {
            Some(p) => Arc::clone(&p.ctx),
            None => Arc::clone(&self.primary),
        };
        let key = WarmKey::of(&ctx, &data, cap_bytes);
        let warm = {
            let mut q = self
                .idle
                .backends
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            q.iter()
                .position(|b| b.warm_key == key)
                .and_then(|i| q.remove(i))
        };
        if let Some(b) = warm {
            return Ok(b);
        }
        let cudnn = self.cudnn.is_some();
        let mut b = CudaBackend::new(ctx, self.device.dev, data, cap_bytes, &self.opts, cudnn)?;
        b.warm_key = key;
        b.home = Some(Arc::downgrade(&self.idle));
        Ok(Box::new(b))
    }

    /// Launches `blocks` blocks of `probe::sm_probe` in the partition (or the primary context)
    /// and returns the SM each block ran on.
    pub fn sm_probe(
        &self,
        partition: Option<&GreenPartition>,
        blocks: u32,
    ) -> Result<Vec<u32>, EngineError> {
        let ctx = partition.map_or(&self.primary, |p| &p.ctx);
        let stream = Stream::new(Arc::clone(ctx))?;
        let out = DevBuf::alloc(&self.primary, blocks as usize * 4)?;
        if blocks > 0 {
            let _in = ctx.enter()?;
            let f = ctx.kernels().get("sm_probe")?;
            let args = [Arg::Ptr(out.ptr())];
            launch(
                &_in,
                "sm_probe",
                f,
                (blocks, PROBE_BLOCK),
                stream.raw(),
                &args,
            )?;
        }
        stream.wait()?;
        let mut ids = vec![0u32; blocks as usize];
        out.download(&mut ids)?;
        Ok(ids)
    }
}

/// Loads cuDNN and proves it computes a convolution right in the primary context; its version
/// (and the library recorded as in use), or why not.
fn open_cudnn(primary: &Ctx) -> Result<usize, String> {
    let (version, bound) = cudnn::load()?;
    let entered = primary.enter().map_err(|e| e.to_string())?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cudnn_probe::probe(&entered)
    }))
    .map_err(|_| "cuDNN could not be loaded through cudarc".to_string())?
    .map_err(|e| {
        format!(
            "cuDNN {version} at {} does not initialise: {e}",
            bound.file.display()
        )
    })?;
    libs::record_bound(bound);
    Ok(version)
}

/// Prints `line` on stderr the first time it is asked to in this process.
pub(crate) fn say_once(line: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.iter().any(|l| l == line) {
        crate::note!("{line}");
        said.push(line.to_string());
    }
}

/// Creates and destroys a cuBLAS handle in the primary context: proves the library loads and
/// initialises, where a failure is an error rather than a panic inside cudarc.
fn probe_cublas(primary: &Ctx) -> Result<(), EngineError> {
    let _in = primary.enter()?;
    let mut handle = std::ptr::null_mut();
    // SAFETY: writes one handle, destroyed just below. cudarc panics if it cannot resolve the
    // library (preloaded above); catch_unwind turns that into an error.
    let created = std::panic::catch_unwind(move || {
        let r = unsafe { blas::cublasCreate_v2(&mut handle) };
        (r, handle)
    })
    .map_err(|_| EngineError::Unavailable {
        backend: "cuda".into(),
        reason: "cuBLAS could not be loaded through cudarc".into(),
    })?;
    check_blas(created.0, "cublasCreate_v2")?;
    // SAFETY: the handle was created above and is destroyed once.
    check_blas(
        unsafe { blas::cublasDestroy_v2(created.1) },
        "cublasDestroy_v2",
    )
}
