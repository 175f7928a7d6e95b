//! A trial's CUDA backend: its stream, pool, cuBLAS and cuDNN handles and arena, region checks through the contract, and the host-facing ops.

use std::sync::Arc;

use cudarc::driver::sys;

use super::blas::Blas;
use super::capture_hold;
use super::context::Ctx;
use super::cudnn::Dnn;
use super::data::DeviceData;
use super::entered::Entered;
use super::graph::{self, GraphExec};
use super::launch::{grid_for, launch, launch_2d, Arg, BLOCK};
use super::mem_pool::{blas_workspace_bytes, layout, Allocation, Layout, Pool};
use super::staging::Staging;
use super::status::{check, to_u32};
use super::stream::{Pacer, Stream};
use crate::engine::{contract, ConvEngine, EngineOptions, Region};
use crate::error::EngineError;

/// The trial's one allocation and where its parts lie.
pub(crate) struct Arena {
    alloc: Allocation,
    layout: Layout,
    elems: usize,
}

/// One trial's engine on the GPU. Ops are issued in order on the trial's stream.
pub struct CudaBackend {
    // Fields drop in this order: the graph and the library handles before the memory they use, the
    // memory before its pool. Each of them also holds the stream (and so the context) alive.
    /// Captured graphs by slot: the training step's in 0, evaluation batches after it.
    pub(crate) execs: Vec<Option<GraphExec>>,
    pub(crate) blas: Blas,
    /// cuDNN for the convolutions; `None` runs them as im2col and cuBLAS GEMMs.
    pub(crate) dnn: Option<Dnn>,
    /// Convolution shapes cuDNN could not plan: they run as im2col and GEMMs (sized so in the plan).
    pub(crate) lowered: std::sync::Mutex<Vec<crate::engine::Conv2dShape>>,
    pub(crate) arena: Option<Arena>,
    pub(crate) pool: Arc<Pool>,
    /// Keeps the host a few steps ahead of the stream at most ([`Backend::pace`]).
    pub(crate) pacer: Pacer,
    /// Uploads that do not wait, and peeks ([`Backend::upload`], [`Backend::peek`]).
    pub(crate) staging: Staging,
    pub(crate) stream: Arc<Stream>,
    pub(crate) ctx: Arc<Ctx>,
    pub(crate) data: Arc<DeviceData>,
    pub(crate) graphs: bool,
    /// Whether a fused group's convolutions run as one lowering over the group even where cuDNN
    /// could run them trial by trial (not with `engine.conv: cudnn`).
    pub(crate) group_convs: bool,
    pub(crate) capturing: bool,
    /// Where a finished trial's backend goes to be reused ([`super::engine::recycle`]), and
    /// what a slice must share with it to take it.
    pub(crate) home: Option<std::sync::Weak<Idle>>,
    pub(crate) warm_key: WarmKey,
}

/// Device address of `r` in an arena starting at `base`.
pub(crate) fn at(base: sys::CUdeviceptr, r: Region) -> sys::CUdeviceptr {
    base + (r.offset as u64) * 4
}

impl CudaBackend {
    pub(crate) fn new(
        ctx: Arc<Ctx>,
        dev: sys::CUdevice,
        data: Arc<DeviceData>,
        cap: Option<u64>,
        opts: &EngineOptions,
        cudnn: bool,
    ) -> Result<CudaBackend, EngineError> {
        let stream = Stream::new(Arc::clone(&ctx))?;
        let granule = ctx.device().info.mem_granularity;
        let pool = Arc::new(Pool::new(Arc::clone(&stream), dev, cap, granule)?);
        let blas = Blas::new(Arc::clone(&stream), opts.tf32)?;
        let dnn = if cudnn {
            Some(Dnn::new(
                Arc::clone(&stream),
                opts.tf32,
                opts.deterministic,
            )?)
        } else {
            None
        };
        Ok(CudaBackend {
            execs: Vec::new(),
            blas,
            dnn,
            lowered: std::sync::Mutex::new(Vec::new()),
            arena: None,
            pool,
            pacer: Pacer::new(Arc::clone(&stream)),
            staging: Staging::new(Arc::clone(&stream))?,
            stream,
            ctx,
            data,
            graphs: opts.graphs,
            group_convs: opts.conv != ConvEngine::Cudnn,
            capturing: false,
            home: None,
            warm_key: Default::default(),
        })
    }

    /// The cap of the trial's pool.
    pub fn cap_bytes(&self) -> Option<u64> {
        self.pool.cap()
    }

    /// Checks that every region lies inside the arena and that written regions overlap neither
    /// each other nor a read region; returns the arena's device address.
    pub(crate) fn regions(
        &self,
        op: &'static str,
        reads: &[Region],
        writes: &[Region],
    ) -> Result<sys::CUdeviceptr, EngineError> {
        let elems = self.arena.as_ref().map_or(0, |a| a.elems);
        contract::regions(op, elems, reads, writes)?;
        let arena = self.arena.as_ref().ok_or(EngineError::NoArena)?;
        Ok(arena.alloc.ptr() + arena.layout.arena_offset as u64)
    }

    /// Device address of the training split's order buffer.
    pub(crate) fn order_ptr(&self) -> Result<sys::CUdeviceptr, EngineError> {
        let arena = self.arena.as_ref().ok_or(EngineError::NoArena)?;
        Ok(arena.alloc.ptr() + arena.layout.order_offset as u64)
    }

    /// Device address of the reductions' scratch ([`super::mem_pool::REDUCE_SCRATCH_BYTES`]): the
    /// partial pairs, the channels' means, the tickets (zero between ops).
    pub(crate) fn scratch_ptrs(&self) -> Result<[sys::CUdeviceptr; 3], EngineError> {
        use super::mem_pool::{REDUCE_CHANNELS, REDUCE_PARTIALS};
        let arena = self.arena.as_ref().ok_or(EngineError::NoArena)?;
        let base = arena.alloc.ptr() + arena.layout.scratch_offset as u64;
        let means = base + (REDUCE_PARTIALS * 16) as u64;
        let tickets = means + (REDUCE_CHANNELS * 8) as u64;
        Ok([base, means, tickets])
    }

    /// Host-side copies and waits are not allowed while ops are being recorded.
    pub(crate) fn not_capturing(&self, op: &str) -> Result<(), EngineError> {
        if self.capturing {
            return Err(EngineError::Device(format!(
                "{op} cannot run while a graph is being captured"
            )));
        }
        Ok(())
    }

    /// Launches kernel `name` as `(grid, block)` on the trial's stream.
    pub(crate) fn kernel(
        &self,
        entered: &Entered,
        name: &'static str,
        shape: (u32, u32),
        args: &[Arg],
    ) -> Result<(), EngineError> {
        let f = self.ctx.kernels().get(name)?;
        launch(entered, name, f, shape, self.stream.raw(), args)
    }

    /// Launches kernel `name` as a `grid.0 × grid.1` grid of `block`-thread blocks on the trial's
    /// stream.
    pub(crate) fn kernel2(
        &self,
        entered: &Entered,
        name: &'static str,
        grid: (u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<(), EngineError> {
        let f = self.ctx.kernels().get(name)?;
        launch_2d(entered, name, f, grid, block, self.stream.raw(), args)
    }

    /// Launches an element-wise (grid-stride) kernel sized for `n` elements.
    pub(crate) fn elementwise(
        &self,
        entered: &Entered,
        name: &'static str,
        n: usize,
        args: &[Arg],
    ) -> Result<(), EngineError> {
        self.kernel(entered, name, (grid_for(n), BLOCK), args)
    }

    /// Copies `src` to device address `dst` on the trial's stream and waits for the copy.
    pub(crate) fn copy_in<T: Copy>(
        &self,
        dst: sys::CUdeviceptr,
        src: &[T],
    ) -> Result<(), EngineError> {
        let bytes = std::mem::size_of_val(src);
        if bytes == 0 {
            return Ok(());
        }
        // A copy from pageable memory waits for the stream; wait first, outside the context's
        // lock, so that the copy itself does not hold the lock while the stream drains.
        self.stream.wait()?;
        {
            let _in = self.ctx.enter()?;
            // SAFETY: `dst` holds `bytes` bytes (checked by the caller); `src` stays borrowed
            // until the wait below has seen the copy finish.
            let r = unsafe {
                sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), bytes, self.stream.raw())
            };
            check(r, "cuMemcpyHtoDAsync_v2")?;
        }
        self.stream.wait()
    }

    /// Copies `src` to device address `dst` in stream order without waiting for the copy
    /// (through the page-locked staging ring).
    pub(crate) fn stage_in<T: Copy>(
        &mut self,
        dst: sys::CUdeviceptr,
        src: &[T],
    ) -> Result<(), EngineError> {
        self.staging.upload(dst, src)
    }

    /// A look at device address `src` that never waits ([`Backend::peek`]).
    pub(crate) fn peek_out<T: Copy>(
        &mut self,
        src: sys::CUdeviceptr,
        dst: &mut [T],
    ) -> Result<bool, EngineError> {
        self.staging.peek(src, dst)
    }

    /// Copies from device address `src` into `dst` on the trial's stream and waits for it.
    pub(crate) fn copy_out<T: Copy>(
        &self,
        src: sys::CUdeviceptr,
        dst: &mut [T],
    ) -> Result<(), EngineError> {
        let bytes = std::mem::size_of_val(dst);
        if bytes == 0 {
            return Ok(());
        }
        self.stream.wait()?;
        {
            let _in = self.ctx.enter()?;
            // SAFETY: `src` holds `bytes` bytes (checked by the caller); `dst` stays borrowed
            // until the wait below has seen the copy finish; `T` is plain data.
            let r = unsafe {
                sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, bytes, self.stream.raw())
            };
            check(r, "cuMemcpyDtoHAsync_v2")?;
        }
        self.stream.wait()
    }

    /// Allocates the trial's one block from its pool: cuBLAS workspace (32 MiB on Hopper and
    /// newer, 4 MiB before), arena (zeroed) and the training order (identity), replacing any
    /// earlier arena and graph.
    pub(crate) fn allocate(&mut self, elems: usize) -> Result<(), EngineError> {
        self.not_capturing("alloc_arena")?;
        // A graph records the old arena's addresses, and the old arena counts against the cap.
        self.execs.clear();
        self.arena = None;
        // A peek on its way reads the old arena: its values are not this one's.
        self.staging.forget_peek();
        let n_train = self.data.train.len;
        let cc = self.ctx.device().info.compute_capability;
        let layout = layout(blas_workspace_bytes(cc), elems, n_train)?;
        let alloc = self.pool.alloc(layout.total)?;
        {
            let entered = self.ctx.enter()?;
            let words = layout.total / 4;
            // SAFETY: the allocation holds `total` bytes, a multiple of 4; ordered on the stream.
            let r = unsafe { sys::cuMemsetD32Async(alloc.ptr(), 0, words, self.stream.raw()) };
            check(r, "cuMemsetD32Async")?;
            self.blas
                .set_workspace(&entered, alloc.ptr(), layout.blas_bytes)?;
        }
        self.arena = Some(Arena {
            alloc,
            layout,
            elems,
        });
        let identity: Vec<u32> = (0..to_u32("alloc_arena", "training samples", n_train)?).collect();
        self.copy_in(self.order_ptr()?, &identity)
    }

    /// Releases the trial's arena and graph (the memory goes back to the pool) once its work
    /// has finished, keeping everything else for the next trial.
    pub(crate) fn release(&mut self) -> Result<(), EngineError> {
        self.not_capturing("release")?;
        self.stream.wait()?;
        self.execs.clear();
        self.arena = None;
        self.staging.forget_peek();
        Ok(())
    }

    pub(crate) fn allocated(&self) -> usize {
        self.arena.as_ref().map_or(0, |a| a.alloc.bytes())
    }

    pub(crate) fn begin(&mut self) -> Result<(), EngineError> {
        if !self.graphs {
            return Err(EngineError::Device(
                "graphs are turned off for this engine".into(),
            ));
        }
        if self.capturing {
            return Err(EngineError::Device("a capture is already running".into()));
        }
        // Counted outside the context, whose lock a device-wide teardown may be waiting for.
        capture_hold::capture_started()?;
        let begun = self
            .ctx
            .enter()
            .and_then(|entered| graph::begin(&entered, &self.stream));
        if let Err(e) = begun {
            capture_hold::capture_ended();
            return Err(e);
        }
        self.capturing = true;
        Ok(())
    }

    pub(crate) fn end(&mut self, slot: usize) -> Result<(), EngineError> {
        if !self.capturing {
            return Err(EngineError::Device("no capture is running".into()));
        }
        self.capturing = false;
        let exec = self
            .ctx
            .enter()
            .and_then(|entered| graph::end(&entered, &self.stream));
        capture_hold::capture_ended();
        let exec = exec?;
        if slot >= crate::engine::GRAPH_SLOTS {
            return Err(EngineError::Device(format!(
                "graph slot {slot} is beyond the {} a backend keeps",
                crate::engine::GRAPH_SLOTS
            )));
        }
        if self.execs.len() <= slot {
            self.execs.resize_with(slot + 1, || None);
        }
        // Replacing the old graph enters the context to destroy it: not while entered above.
        self.execs[slot] = Some(exec);
        Ok(())
    }

    pub(crate) fn launch_graph(&self, slot: usize) -> Result<(), EngineError> {
        let g = self
            .execs
            .get(slot)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                EngineError::Device(format!("no graph has been captured in slot {slot}"))
            })?;
        let entered = self.ctx.enter()?;
        g.launch(&entered)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Dropped between begin and end capture (a panic mid-step): end the capture first, so
        // that the frees below run instead of being recorded, and the process's count of running
        // captures, which device-wide teardown waits on, goes back down. The fields then drop in
        // their declared order.
        if self.capturing {
            let _ = self.end(0);
        }
    }
}

/// Backends of finished trials, oldest first, each ready for a new arena ([`recycle`]).
#[derive(Default)]
pub(crate) struct Idle {
    pub(crate) backends: std::sync::Mutex<std::collections::VecDeque<Box<CudaBackend>>>,
}

/// What a kept backend must share with the slice that takes it: its context (the primary one or
/// a green partition's), the resident data set, and the cap its memory pool was made with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WarmKey {
    ctx: usize,
    data: usize,
    cap: Option<u64>,
}

impl WarmKey {
    pub(crate) fn of(ctx: &Arc<Ctx>, data: &Arc<DeviceData>, cap: Option<u64>) -> WarmKey {
        WarmKey {
            ctx: Arc::as_ptr(ctx) as usize,
            data: Arc::as_ptr(data) as usize,
            cap,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_addresses_are_float_offsets() {
        assert_eq!(at(0x1000, Region::new(3, 1)), 0x100c);
    }
}
