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

/// Forwards each listed op to the wrapped backend, counting it as one launch.
macro_rules! launches {
    ($( fn $name:ident(&mut self $(, $arg:ident : $ty:ty)* $(,)?); )*) => {
        $(
            fn $name(&mut self $(, $arg: $ty)*) -> Result<(), EngineError> {
                self.counts.launches += 1;
                self.inner.$name($($arg),*)
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

    launches! {
        fn fill(&mut self, dst: Region, value: f32);
        fn gather(&mut self, split: Split, start: usize, rows: usize, x: Region, y: Region);
        fn gather_train(
            &mut self,
            counter: Region,
            steps_per_epoch: usize,
            batch: usize,
            x: Region,
            y: Region,
        );
        fn gather_train_fused(
            &mut self,
            counter: Region,
            orders: Region,
            steps_per_epoch: usize,
            batch: usize,
            x: Region,
            y: Region,
            trials: usize,
        );
        fn gather_fused(
            &mut self,
            split: Split,
            start: usize,
            rows: usize,
            batch: usize,
            x: Region,
            y: Region,
            trials: usize,
        );
        fn advance(&mut self, counter: Region);
        fn gemm(&mut self, g: GemmShape, a: Region, b: Region, c: Region);
        fn gemm_batched(&mut self, g: GemmShape, batch: GemmBatch, a: Region, b: Region, c: Region);
        fn dense_fwd(
            &mut self,
            g: GemmShape,
            batch: GemmBatch,
            x: Region,
            w: Region,
            y: Region,
            bias: Region,
            bias_stride: usize,
            relu: bool,
        );
        fn dense_bwd_relu(
            &mut self,
            g: GemmShape,
            batch: GemmBatch,
            dy: Region,
            w: Region,
            dx: Region,
            y: Region,
            db: BiasGrad,
        );
        fn bias_add(&mut self, y: Region, bias: Region, rows: usize, cols: usize);
        fn bias_grad(&mut self, dy: Region, db: Region, rows: usize, cols: usize);
        fn bias_add_fused(
            &mut self,
            y: Region,
            bias: Region,
            rows: usize,
            cols: usize,
            trials: usize,
            bias_stride: usize,
        );
        fn bias_grad_fused(
            &mut self,
            dy: Region,
            db: Region,
            rows: usize,
            cols: usize,
            trials: usize,
            db_stride: usize,
        );
        fn relu_fwd(&mut self, x: Region, y: Region, len: usize);
        fn relu_bwd(&mut self, y: Region, dy: Region, dx: Region, len: usize);
        fn conv2d_fwd(
            &mut self,
            s: &Conv2dShape,
            x: Region,
            w: Region,
            b: Option<Region>,
            y: Region,
            ws: Region,
        );
        fn conv2d_bwd(
            &mut self,
            s: &Conv2dShape,
            x: Region,
            w: Region,
            dy: Region,
            dx: Option<Region>,
            dw: Region,
            db: Option<Region>,
            ws: Region,
        );
        fn conv2d_fwd_fused(
            &mut self,
            s: &Conv2dShape,
            x: Region,
            w: Region,
            b: Option<Region>,
            y: Region,
            ws: Region,
            f: FusedConv,
        );
        fn conv2d_bwd_fused(
            &mut self,
            s: &Conv2dShape,
            x: Region,
            w: Region,
            dy: Region,
            dx: Option<Region>,
            dw: Region,
            db: Option<Region>,
            ws: Region,
            f: FusedConv,
        );
        fn batchnorm_fwd(
            &mut self,
            s: &PlaneShape,
            x: Region,
            gamma: Region,
            beta: Region,
            running: Region,
            saved: Region,
            y: Region,
            p: BnParams,
        );
        fn batchnorm_bwd(
            &mut self,
            s: &PlaneShape,
            x: Region,
            gamma: Region,
            saved: Region,
            dy: Region,
            dx: Region,
            dgamma: Region,
            dbeta: Region,
        );
        fn batchnorm_fwd_fused(
            &mut self,
            s: &PlaneShape,
            x: Region,
            gamma: Region,
            beta: Region,
            running: Region,
            saved: Region,
            y: Region,
            p: BnParams,
            f: FusedNorm,
        );
        fn batchnorm_bwd_fused(
            &mut self,
            s: &PlaneShape,
            x: Region,
            gamma: Region,
            saved: Region,
            dy: Region,
            dx: Region,
            dgamma: Region,
            dbeta: Region,
            f: FusedNorm,
        );
        fn avgpool_fwd(&mut self, s: &PlaneShape, x: Region, y: Region);
        fn avgpool_bwd(&mut self, s: &PlaneShape, dy: Region, dx: Region);
        fn add(&mut self, a: Region, b: Region, y: Region, len: usize);
        fn add_assign(&mut self, y: Region, x: Region, len: usize);
        fn copy(&mut self, x: Region, y: Region, len: usize);
        fn maxpool_fwd(&mut self, s: &PoolShape, x: Region, y: Region);
        fn maxpool_bwd(&mut self, s: &PoolShape, x: Region, y: Region, dy: Region, dx: Region);
        fn dropout_fwd(&mut self, x: Region, y: Region, len: usize, mask: DropoutMask);
        fn dropout_bwd(&mut self, dy: Region, dx: Region, len: usize, mask: DropoutMask);
        fn dropout_fused(
            &mut self,
            src: Region,
            dst: Region,
            len: usize,
            trials: usize,
            hyper: Region,
            counter: Region,
            layer: u32,
            first: u64,
        );
        fn softmax_xent(
            &mut self,
            logits: Region,
            labels: Region,
            dlogits: Region,
            stats: Region,
            rows: usize,
            classes: usize,
        );
        fn softmax_xent_fused(
            &mut self,
            logits: Region,
            labels: Region,
            dlogits: Region,
            stats: Region,
            rows: usize,
            classes: usize,
            trials: usize,
        );
        fn softmax_xent_bias(
            &mut self,
            logits: Region,
            labels: Region,
            dlogits: Region,
            stats: Region,
            rows: usize,
            classes: usize,
            trials: usize,
            db: BiasGrad,
        );
        fn eval_xent(
            &mut self,
            logits: Region,
            labels: Region,
            stats: Region,
            rows: usize,
            classes: usize,
        );
        fn eval_xent_fused(
            &mut self,
            logits: Region,
            labels: Region,
            stats: Region,
            rows: usize,
            batch: usize,
            classes: usize,
            trials: usize,
        );
        fn sgd_step(&mut self, w: Region, g: Region, v: Region, p: SgdParams);
        fn adam_step(
            &mut self,
            w: Region,
            g: Region,
            m: Region,
            v: Region,
            p: AdamParams,
            counter: Region,
        );
        fn sgd_step_batched(&mut self, w: Region, g: Region, v: Region, hyper: Region, trials: usize);
        fn adam_step_batched(
            &mut self,
            w: Region,
            g: Region,
            m: Region,
            v: Region,
            hyper: Region,
            trials: usize,
            counter: Region,
        );
        fn update(&mut self, u: Update, counter: Region);
        fn replay(&mut self);
        fn replay_slot(&mut self, slot: usize);
    }
}
