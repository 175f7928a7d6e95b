//! Counts what a training asks of its backend: ops launched, and the host reads and waits that stall it, the same way on every backend.
//!
//! [`Counted`] wraps any [`Backend`] and passes every call through. Each call that issues work
//! on the device (a kernel, a copy issued without waiting, a graph replay) counts as a launch;
//! each call that makes the host wait for the device (`read`, `write`, `synchronize`) counts as a
//! host synchronisation, except the reads a training names as its per-epoch metric read
//! ([`Counted::read_metrics`]). [`Backend::pace`], which keeps the host at most a few steps
//! ahead and never drains the queue, counts as neither. Because the count is of backend calls, the
//! CPU backend gives the same counts as the CUDA one for the same training, so the structure of
//! a step (how many launches, how many waits) is checked without a GPU.

use super::launch_ops::launch_ops;
use super::{
    AdamParams, Backend, BackendKind, BiasGrad, BnParams, CaptureHold, Conv2dShape, DropoutMask,
    FusedConv, FusedNorm, GemmBatch, GemmShape, PlaneShape, PoolShape, Region, SgdParams, Split,
    Update,
};
use crate::error::EngineError;

/// What a backend was asked to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Calls that issue work on the device.
    pub launches: u64,
    /// Calls that make the host wait for the device, the metric reads excluded.
    pub host_syncs: u64,
    /// Reads named as a training's per-epoch metric read.
    pub metric_reads: u64,
}

/// A backend whose calls are counted ([`OpCounts`]).
pub struct Counted<'a> {
    inner: &'a mut dyn Backend,
    counts: OpCounts,
}

impl<'a> Counted<'a> {
    pub fn new(inner: &'a mut dyn Backend) -> Counted<'a> {
        Counted {
            inner,
            counts: OpCounts::default(),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> OpCounts {
        self.counts
    }

    /// [`Backend::read`] of a training's per-epoch metrics: counted apart from the other
    /// waits.
    pub fn read_metrics(&mut self, src: Region, dst: &mut [f32]) -> Result<(), EngineError> {
        self.counts.metric_reads += 1;
        self.inner.read(src, dst)
    }
}

/// Forwards each launch op ([`super::launch_ops`]) to the wrapped backend, counting it as one
/// launch (a default body is the wrapped backend's business; the docs are the trait's).
macro_rules! count_launches {
    ($( $(#[$m:meta])* fn $name:ident(&mut $self:ident $(, $arg:ident : $ty:ty)* $(,)?) $tail:tt )*) => {
        $(
            fn $name(&mut $self $(, $arg: $ty)*) -> Result<(), EngineError> {
                $self.counts.launches += 1;
                $self.inner.$name($($arg),*)
            }
        )*
    };
}

impl Backend for Counted<'_> {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
    fn alloc_arena(&mut self, elems: usize) -> Result<(), EngineError> {
        self.inner.alloc_arena(elems)
    }
    fn allocated_bytes(&self) -> usize {
        self.inner.allocated_bytes()
    }
    fn write(&mut self, dst: Region, src: &[f32]) -> Result<(), EngineError> {
        self.counts.host_syncs += 1;
        self.inner.write(dst, src)
    }
    fn read(&mut self, src: Region, dst: &mut [f32]) -> Result<(), EngineError> {
        self.counts.host_syncs += 1;
        self.inner.read(src, dst)
    }
    fn upload(&mut self, dst: Region, src: &[f32]) -> Result<(), EngineError> {
        self.counts.launches += 1;
        self.inner.upload(dst, src)
    }
    fn peek(&mut self, src: Region, dst: &mut [f32]) -> Result<bool, EngineError> {
        self.counts.launches += 1;
        self.inner.peek(src, dst)
    }
    fn split_len(&self, split: Split) -> usize {
        self.inner.split_len(split)
    }
    fn sample_len(&self) -> usize {
        self.inner.sample_len()
    }
    fn set_train_order(&mut self, order: &[u32]) -> Result<(), EngineError> {
        self.counts.launches += 1;
        self.inner.set_train_order(order)
    }
    fn conv_workspace_len(&self, s: &Conv2dShape) -> usize {
        self.inner.conv_workspace_len(s)
    }

    fn fused_conv_workspace_len(&self, s: &Conv2dShape) -> usize {
        self.inner.fused_conv_workspace_len(s)
    }
    fn synchronize(&mut self) -> Result<(), EngineError> {
        self.counts.host_syncs += 1;
        self.inner.synchronize()
    }
    fn pace(&mut self, lead: usize) -> Result<(), EngineError> {
        self.inner.pace(lead)
    }
    fn supports_graphs(&self) -> bool {
        self.inner.supports_graphs()
    }
    fn hold_captures(&self) -> CaptureHold {
        self.inner.hold_captures()
    }
    fn begin_capture(&mut self) -> Result<(), EngineError> {
        self.inner.begin_capture()
    }
    fn end_capture(&mut self) -> Result<(), EngineError> {
        self.inner.end_capture()
    }
    fn end_capture_into(&mut self, slot: usize) -> Result<(), EngineError> {
        self.inner.end_capture_into(slot)
    }
    fn loaded(&self, signature: u64) -> bool {
        self.inner.loaded(signature)
    }
    fn mark_loaded(&mut self, signature: u64) {
        self.inner.mark_loaded(signature)
    }

    launch_ops!(count_launches);
}
