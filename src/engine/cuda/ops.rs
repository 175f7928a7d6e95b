//! The `Backend` ops of the CUDA backend: the contract's checks, then kernel launches on the trial's stream.

use cudarc::driver::sys;

use super::backend::{at, CudaBackend};
use super::capture_hold;
use super::capture_hold::CaptureHold;
use super::conv_group::group_workspace_len;
use super::launch::{Arg, BLOCK, MAX_BLOCKS};
use super::status::{check, to_u32};
use crate::engine::contract;
use crate::engine::{
    AdamParams, Backend, BackendKind, BiasGrad, BnParams, Conv2dShape, DropoutMask, FusedConv,
    FusedNorm, GemmBatch, GemmShape, PlaneShape, PoolShape, Region, SgdParams, Split, Update,
};
use crate::error::EngineError;

impl Backend for CudaBackend {
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
    ) -> Result<(), EngineError> {
        let [x, gamma, beta, running, saved, y] =
            contract::batchnorm_fwd(s, x, gamma, beta, running, saved, y)?;
        self.norm_fwd(
            "batchnorm_fwd",
            s,
            [x, gamma, beta, running, saved, y],
            p,
            FusedNorm::one(),
        )
    }

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
    ) -> Result<(), EngineError> {
        self.batchnorm_fwd_fused_checked(s, x, gamma, beta, running, saved, y, p, f)
    }

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
    ) -> Result<(), EngineError> {
        let regions = contract::batchnorm_bwd(s, x, gamma, saved, dy, dx, dgamma, dbeta)?;
        self.norm_bwd("batchnorm_bwd", s, regions, FusedNorm::one())
    }

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
    ) -> Result<(), EngineError> {
        self.batchnorm_bwd_fused_checked(s, x, gamma, saved, dy, dx, dgamma, dbeta, f)
    }

    fn avgpool_fwd(&mut self, s: &PlaneShape, x: Region, y: Region) -> Result<(), EngineError> {
        let op = "avgpool_fwd";
        let [x, y] = contract::avgpool_fwd(s, x, y)?;
        let base = self.regions(op, &[x], &[y])?;
        to_u32(op, "elements", s.len())?;
        let args = [
            Arg::Ptr(at(base, x)),
            Arg::Ptr(at(base, y)),
            Arg::U32(to_u32(op, "planes", s.n * s.c)?),
            Arg::U32(to_u32(op, "hw", s.hw)?),
        ];
        let e = self.ctx.enter()?;
        // One thread per plane.
        self.elementwise(&e, op, s.n * s.c, &args)
    }

    fn avgpool_bwd(&mut self, s: &PlaneShape, dy: Region, dx: Region) -> Result<(), EngineError> {
        let op = "avgpool_bwd";
        let [dy, dx] = contract::avgpool_bwd(s, dy, dx)?;
        let base = self.regions(op, &[dy], &[dx])?;
        to_u32(op, "elements", s.len())?;
        let args = [
            Arg::Ptr(at(base, dy)),
            Arg::Ptr(at(base, dx)),
            Arg::U32(to_u32(op, "planes", s.n * s.c)?),
            Arg::U32(to_u32(op, "hw", s.hw)?),
        ];
        let e = self.ctx.enter()?;
        self.elementwise(&e, op, s.len(), &args)
    }

    fn add(&mut self, a: Region, b: Region, y: Region, len: usize) -> Result<(), EngineError> {
        let [a, b, y] = contract::elementwise("add", [("a", a), ("b", b), ("y", y)], len)?;
        let base = self.regions("add", &[a, b], &[y])?;
        let args = [
            Arg::Ptr(at(base, a)),
            Arg::Ptr(at(base, b)),
            Arg::Ptr(at(base, y)),
            Arg::U32(to_u32("add", "len", len)?),
        ];
        let e = self.ctx.enter()?;
        self.elementwise(&e, "add", len, &args)
    }

    fn add_assign(&mut self, y: Region, x: Region, len: usize) -> Result<(), EngineError> {
        let [x, y] = contract::elementwise("add_assign", [("x", x), ("y", y)], len)?;
        let base = self.regions("add_assign", &[x], &[y])?;
        let args = [
            Arg::Ptr(at(base, y)),
            Arg::Ptr(at(base, x)),
            Arg::U32(to_u32("add_assign", "len", len)?),
        ];
        let e = self.ctx.enter()?;
        self.elementwise(&e, "add_assign", len, &args)
    }

    fn copy(&mut self, x: Region, y: Region, len: usize) -> Result<(), EngineError> {
        let [x, y] = contract::elementwise("copy", [("x", x), ("y", y)], len)?;
        let base = self.regions("copy", &[x], &[y])?;
        if len == 0 {
            return Ok(());
        }
        let _in = self.ctx.enter()?;
        // An asynchronous device-to-device copy on the trial's stream (a copy node when captured).
        // SAFETY: both regions lie inside the arena (checked above) and do not overlap.
        let r = unsafe {
            sys::cuMemcpyDtoDAsync_v2(at(base, y), at(base, x), len * 4, self.stream.raw())
        };
        check(r, "cuMemcpyDtoDAsync_v2")
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn alloc_arena(&mut self, elems: usize) -> Result<(), EngineError> {
        self.allocate(elems)
    }

    fn allocated_bytes(&self) -> usize {
        self.allocated()
    }

    fn write(&mut self, dst: Region, src: &[f32]) -> Result<(), EngineError> {
        self.not_capturing("write")?;
        let dst = contract::write(dst, src.len())?;
        let base = self.regions("write", &[], &[dst])?;
        self.copy_in(at(base, dst), src)
    }

    fn read(&mut self, src: Region, dst: &mut [f32]) -> Result<(), EngineError> {
        self.not_capturing("read")?;
        let src = contract::read(src, dst.len())?;
        let base = self.regions("read", &[src], &[])?;
        self.copy_out(at(base, src), dst)
    }

    fn fill(&mut self, dst: Region, value: f32) -> Result<(), EngineError> {
        let base = self.regions("fill", &[], &[dst])?;
        let n = to_u32("fill", "len", dst.len)?;
        let e = self.ctx.enter()?;
        let args = [Arg::Ptr(at(base, dst)), Arg::F32(value), Arg::U32(n)];
        self.elementwise(&e, "fill", dst.len, &args)
    }

    fn split_len(&self, split: Split) -> usize {
        match split {
            Split::Train => self.data.train.len,
            Split::Test => self.data.test.len,
        }
    }

    fn sample_len(&self) -> usize {
        self.data.sample_len
    }

    fn set_train_order(&mut self, order: &[u32]) -> Result<(), EngineError> {
        self.not_capturing("set_train_order")?;
        contract::train_order(order, self.data.train.len)?;
        let dst = self.order_ptr()?;
        self.stage_in(dst, order)
    }

    fn upload(&mut self, dst: Region, src: &[f32]) -> Result<(), EngineError> {
        self.not_capturing("upload")?;
        let dst = contract::write(dst, src.len())?;
        let base = self.regions("upload", &[], &[dst])?;
        self.stage_in(at(base, dst), src)
    }

    fn peek(&mut self, src: Region, dst: &mut [f32]) -> Result<bool, EngineError> {
        self.not_capturing("peek")?;
        let src = contract::read(src, dst.len())?;
        let base = self.regions("peek", &[src], &[])?;
        self.peek_out(at(base, src), dst)
    }

    fn gather_fused(
        &mut self,
        split: Split,
        start: usize,
        rows: usize,
        batch: usize,
        x: Region,
        y: Region,
        trials: usize,
    ) -> Result<(), EngineError> {
        let op = "gather_fused";
        let len = self.data.sample_len;
        let (samples, order) = match split {
            Split::Train => (&self.data.train, self.order_ptr()?),
            Split::Test => (&self.data.test, self.data.test_order.ptr()),
        };
        contract::gather(start, rows, samples.len, len, x, y)?;
        contract::gather_fused(rows, batch, len, trials, x, y)?;
        let x = Region::new(x.offset, trials * batch * len);
        let y = Region::new(y.offset, trials * batch);
        let base = self.regions(op, &[], &[x, y])?;
        let args = [
            Arg::Ptr(samples.images.ptr()),
            Arg::Ptr(samples.labels.ptr()),
            Arg::Ptr(order),
            Arg::Ptr(at(base, x)),
            Arg::Ptr(at(base, y)),
            Arg::U32(to_u32(op, "sample length", len)?),
            Arg::U32(to_u32(op, "start", start)?),
            Arg::U32(to_u32(op, "rows", rows)?),
            Arg::U32(to_u32(op, "batch", batch)?),
            Arg::U32(to_u32(op, "trials", trials)?),
        ];
        let e = self.ctx.enter()?;
        self.elementwise(&e, op, (rows * len).max(rows) * trials, &args)
    }

    fn gather(
        &mut self,
        split: Split,
        start: usize,
        rows: usize,
        x: Region,
        y: Region,
    ) -> Result<(), EngineError> {
        let len = self.data.sample_len;
        let (samples, order) = match split {
            Split::Train => (&self.data.train, self.order_ptr()?),
            Split::Test => (&self.data.test, self.data.test_order.ptr()),
        };
        let (x, y) = contract::gather(start, rows, samples.len, len, x, y)?;
        let base = self.regions("gather", &[], &[x, y])?;
        let args = [
            Arg::Ptr(samples.images.ptr()),
            Arg::Ptr(samples.labels.ptr()),
            Arg::Ptr(order),
            Arg::Ptr(at(base, x)),
            Arg::Ptr(at(base, y)),
            Arg::U32(to_u32("gather", "sample length", len)?),
            Arg::U32(to_u32("gather", "start", start)?),
            Arg::U32(to_u32("gather", "rows", rows)?),
        ];
        let e = self.ctx.enter()?;
        self.elementwise(&e, "gather", rows * len, &args)
    }

    fn gather_train(
        &mut self,
        counter: Region,
        steps_per_epoch: usize,
        batch: usize,
        x: Region,
        y: Region,
    ) -> Result<(), EngineError> {
        let len = self.data.sample_len;
        let (x, y) =
            contract::gather_train(steps_per_epoch, batch, self.data.train.len, len, x, y)?;
        let counter = contract::counter(counter)?;
        let base = self.regions("gather_train", &[counter], &[x, y])?;
        let args = [
            Arg::Ptr(self.data.train.images.ptr()),
            Arg::Ptr(self.data.train.labels.ptr()),
            Arg::Ptr(self.order_ptr()?),
            Arg::Ptr(at(base, counter)),
            Arg::Ptr(at(base, x)),
            Arg::Ptr(at(base, y)),
            Arg::U32(to_u32("gather_train", "sample length", len)?),
            Arg::U32(to_u32("gather_train", "steps per epoch", steps_per_epoch)?),
            Arg::U32(to_u32("gather_train", "batch", batch)?),
        ];
        let e = self.ctx.enter()?;
        self.elementwise(&e, "gather_train", batch * len, &args)
    }

    fn gather_train_fused(
        &mut self,
        counter: Region,
        orders: Region,
        steps_per_epoch: usize,
        batch: usize,
        x: Region,
        y: Region,
        trials: usize,
    ) -> Result<(), EngineError> {
        let op = "gather_train_fused";
        let (n, len) = (self.data.train.len, self.data.sample_len);
        let r =
            contract::gather_train_fused(steps_per_epoch, batch, n, len, trials, [orders, x, y])?;
        let counter = contract::counter(counter)?;
        let base = self.regions(op, &[counter, r.orders], &[r.x, r.y])?;
        let args = [
            Arg::Ptr(self.data.train.images.ptr()),
            Arg::Ptr(self.data.train.labels.ptr()),
            Arg::Ptr(at(base, r.orders)),
            Arg::Ptr(at(base, counter)),
            Arg::Ptr(at(base, r.x)),
            Arg::Ptr(at(base, r.y)),
            Arg::U32(to_u32(op, "sample length", len)?),
            Arg::U32(to_u32(op, "training samples", n)?),
            Arg::U32(to_u32(op, "steps per epoch", steps_per_epoch)?),
            Arg::U32(to_u32(op, "batch", batch)?),
            Arg::U32(to_u32(op, "trials", trials)?),
        ];
        let e = self.ctx.enter()?;
        self.elementwise(&e, op, r.x.len, &args)
    }

    fn advance(&mut self, counter: Region) -> Result<(), EngineError> {
        let counter = contract::counter(counter)?;
        let base = self.regions("advance", &[], &[counter])?;
        let e = self.ctx.enter()?;
        self.kernel(&e, "advance", (1, 1), &[Arg::Ptr(at(base, counter))])
    }

    fn conv_workspace_len(&self, s: &Conv2dShape) -> usize {
        self.conv_workspace(s)
    }

    fn fused_conv_workspace_len(&self, s: &Conv2dShape) -> usize {
        let own = self.conv_workspace(s);
        if self.group_convs || self.dnn_for(s).is_none() {
            own.max(group_workspace_len(s))
        } else {
            own
        }
    }

    fn gemm(&mut self, g: GemmShape, a: Region, b: Region, c: Region) -> Result<(), EngineError> {
        let [a, b, c] = contract::gemm(&g, a, b, c)?;
        let base = self.regions("gemm", &[a, b], &[c])?;
        let e = self.ctx.enter()?;
        self.blas
            .gemm(&e, &g, at(base, a), at(base, b), at(base, c))
    }

    fn gemm_batched(
        &mut self,
        g: GemmShape,
        batch: GemmBatch,
        a: Region,
        b: Region,
        c: Region,
    ) -> Result<(), EngineError> {
        let [a, b, c] = contract::gemm_batched(&g, &batch, a, b, c)?;
        let base = self.regions("gemm_batched", &[a, b], &[c])?;
        if batch.count == 0 {
            return Ok(());
        }
        let e = self.ctx.enter()?;
        self.blas
            .gemm_batched(&e, &g, batch, at(base, a), at(base, b), at(base, c))
    }

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
    ) -> Result<(), EngineError> {
        let op = "dense_fwd";
        let [x, w, y, bias] = contract::dense_fwd(&g, &batch, x, w, y, bias, bias_stride)?;
        let base = self.regions(op, &[x, w, bias], &[y])?;
        if batch.count == 0 {
            return Ok(());
        }
        let args = [
            Arg::Ptr(at(base, y)),
            Arg::Ptr(at(base, bias)),
            Arg::U32(to_u32(op, "rows", g.m)?),
            Arg::U32(to_u32(op, "cols", g.n)?),
            Arg::U32(to_u32(op, "trials", batch.count)?),
            Arg::U32(to_u32(op, "bias stride", bias_stride)?),
            Arg::U32(relu.into()),
        ];
        let e = self.ctx.enter()?;
        let (x, w, y_at) = (at(base, x), at(base, w), at(base, y));
        if batch.count == 1 {
            self.blas.gemm(&e, &g, x, w, y_at)?;
        } else {
            self.blas.gemm_batched(&e, &g, batch, x, w, y_at)?;
        }
        self.elementwise(&e, "bias_act_fused", y.len, &args)
    }

    fn dense_bwd_relu(
        &mut self,
        g: GemmShape,
        batch: GemmBatch,
        dy: Region,
        w: Region,
        dx: Region,
        y: Region,
        db: BiasGrad,
    ) -> Result<(), EngineError> {
        let op = "dense_bwd_relu";
        let stride = db.stride;
        let [dy, w, dx, y, db] = contract::dense_bwd_relu(&g, &batch, dy, w, dx, y, db)?;
        let base = self.regions(op, &[dy, w, y], &[dx, db])?;
        if batch.count == 0 {
            return Ok(());
        }
        let args = [
            Arg::Ptr(at(base, y)),
            Arg::Ptr(at(base, dx)),
            Arg::Ptr(at(base, db)),
            Arg::U32(to_u32(op, "rows", g.m)?),
            Arg::U32(to_u32(op, "cols", g.n)?),
            Arg::U32(to_u32(op, "trials", batch.count)?),
            Arg::U32(to_u32(op, "db stride", stride)?),
        ];
        let e = self.ctx.enter()?;
        let (dy, w, dx) = (at(base, dy), at(base, w), at(base, dx));
        if batch.count == 1 {
            self.blas.gemm(&e, &g, dy, w, dx)?;
        } else {
            self.blas.gemm_batched(&e, &g, batch, dy, w, dx)?;
        }
        // One thread per (trial, column).
        self.elementwise(&e, "relu_bias_grad_fused", g.n * batch.count, &args)
    }

    fn bias_add(
        &mut self,
        y: Region,
        bias: Region,
        rows: usize,
        cols: usize,
    ) -> Result<(), EngineError> {
        let [y, bias] = contract::bias_add(y, bias, rows, cols)?;
        let base = self.regions("bias_add", &[bias], &[y])?;
        let args = [
            Arg::Ptr(at(base, y)),
            Arg::Ptr(at(base, bias)),
            Arg::U32(to_u32("bias_add", "rows", rows)?),
            Arg::U32(to_u32("bias_add", "cols", cols)?),
        ];
        to_u32("bias_add", "rows·cols", rows * cols)?;
        let e = self.ctx.enter()?;
        self.elementwise(&e, "bias_add", rows * cols, &args)
    }

    fn bias_grad(
        &mut self,
        dy: Region,
        db: Region,
        rows: usize,
        cols: usize,
    ) -> Result<(), EngineError> {
        let [dy, db] = contract::bias_grad(dy, db, rows, cols)?;
        let base = self.regions("bias_grad", &[dy], &[db])?;
        let args = [
            Arg::Ptr(at(base, dy)),
            Arg::Ptr(at(base, db)),
            Arg::U32(to_u32("bias_grad", "rows", rows)?),
            Arg::U32(to_u32("bias_grad", "cols", cols)?),
        ];
        to_u32("bias_grad", "rows·cols", rows * cols)?;
        let e = self.ctx.enter()?;
        // One thread per column.
        self.elementwise(&e, "bias_grad", cols, &args)
    }

    fn bias_add_fused(
        &mut self,
        y: Region,
        bias: Region,
        rows: usize,
        cols: usize,
        trials: usize,
        bias_stride: usize,
    ) -> Result<(), EngineError> {
        let op = "bias_add_fused";
        let [y, bias] = contract::bias_add_fused(y, bias, rows, cols, trials, bias_stride)?;
        let base = self.regions(op, &[bias], &[y])?;
        let args = [
            Arg::Ptr(at(base, y)),
            Arg::Ptr(at(base, bias)),
            Arg::U32(to_u32(op, "rows", rows)?),
            Arg::U32(to_u32(op, "cols", cols)?),
            Arg::U32(to_u32(op, "trials", trials)?),
            Arg::U32(to_u32(op, "bias stride", bias_stride)?),
        ];
        let e = self.ctx.enter()?;
        self.elementwise(&e, op, y.len, &args)
    }

    fn bias_grad_fused(
        &mut self,
        dy: Region,
        db: Region,
        rows: usize,
        cols: usize,
        trials: usize,
        db_stride: usize,
    ) -> Result<(), EngineError> {
        let op = "bias_grad_fused";
        let [dy, db] = contract::bias_grad_fused(dy, db, rows, cols, trials, db_stride)?;
        let base = self.regions(op, &[dy], &[db])?;
        let args = [
            Arg::Ptr(at(base, dy)),
            Arg::Ptr(at(base, db)),
            Arg::U32(to_u32(op, "rows", rows)?),
            Arg::U32(to_u32(op, "cols", cols)?),
            Arg::U32(to_u32(op, "trials", trials)?),
            Arg::U32(to_u32(op, "db stride", db_stride)?),
        ];
        let e = self.ctx.enter()?;
        // One thread per (trial, column).
        self.elementwise(&e, op, cols * trials, &args)
    }

    fn relu_fwd(&mut self, x: Region, y: Region, len: usize) -> Result<(), EngineError> {
        let [x, y] = contract::elementwise("relu_fwd", [("x", x), ("y", y)], len)?;
        let base = self.regions("relu_fwd", &[x], &[y])?;
        let n = to_u32("relu_fwd", "len", len)?;
        let e = self.ctx.enter()?;
        let args = [Arg::Ptr(at(base, x)), Arg::Ptr(at(base, y)), Arg::U32(n)];
        self.elementwise(&e, "relu_fwd", len, &args)
    }

    fn relu_bwd(
        &mut self,
        y: Region,
        dy: Region,
        dx: Region,
        len: usize,
    ) -> Result<(), EngineError> {
        let [y, dy, dx] =
            contract::elementwise("relu_bwd", [("y", y), ("dy", dy), ("dx", dx)], len)?;
        let base = self.regions("relu_bwd", &[y, dy], &[dx])?;
        let n = to_u32("relu_bwd", "len", len)?;
        let e = self.ctx.enter()?;
        let args = [
            Arg::Ptr(at(base, y)),
            Arg::Ptr(at(base, dy)),
            Arg::Ptr(at(base, dx)),
            Arg::U32(n),
        ];
        self.elementwise(&e, "relu_bwd", len, &args)
    }

    fn conv2d_fwd(
        &mut self,
        s: &Conv2dShape,
        x: Region,
        w: Region,
        b: Option<Region>,
        y: Region,
        ws: Region,
    ) -> Result<(), EngineError> {
        self.conv2d_fwd_checked(s, x, w, b, y, ws)
    }

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
    ) -> Result<(), EngineError> {
        self.conv2d_bwd_checked(s, x, w, dy, dx, dw, db, ws)
    }

    fn conv2d_fwd_fused(
        &mut self,
        s: &Conv2dShape,
        x: Region,
        w: Region,
        b: Option<Region>,
        y: Region,
        ws: Region,
        f: FusedConv,
    ) -> Result<(), EngineError> {
        self.conv2d_fwd_fused_checked(s, x, w, b, y, ws, f)
    }

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
    ) -> Result<(), EngineError> {
        self.conv2d_bwd_fused_checked(s, x, w, dy, dx, dw, db, ws, f)
    }

    fn maxpool_fwd(&mut self, s: &PoolShape, x: Region, y: Region) -> Result<(), EngineError> {
        let [x, y] = contract::maxpool_fwd(s, x, y)?;
        let base = self.regions("maxpool_fwd", &[x], &[y])?;
        let mut args = vec![Arg::Ptr(at(base, x)), Arg::Ptr(at(base, y))];
        args.extend(pool_dims("maxpool_fwd", s)?);
        let e = self.ctx.enter()?;
        self.elementwise(&e, "maxpool_fwd", s.y_len(), &args)
    }

    fn maxpool_bwd(
        &mut self,
        s: &PoolShape,
        x: Region,
        y: Region,
        dy: Region,
        dx: Region,
    ) -> Result<(), EngineError> {
        let op = "maxpool_bwd";
        let [x, y, dy, dx] = contract::maxpool_bwd(s, x, y, dy, dx)?;
        let base = self.regions(op, &[x, y, dy], &[dx])?;
        let mut args = vec![
            Arg::Ptr(at(base, x)),
            Arg::Ptr(at(base, y)),
            Arg::Ptr(at(base, dy)),
            Arg::Ptr(at(base, dx)),
        ];
        args.extend(pool_dims(op, s)?);
        let e = self.ctx.enter()?;
        // One thread per dx element.
        self.elementwise(&e, op, s.x_len(), &args)
    }

    fn dropout_fwd(
        &mut self,
        x: Region,
        y: Region,
        len: usize,
        mask: DropoutMask,
    ) -> Result<(), EngineError> {
        self.dropout("dropout_fwd", len, mask, x, y)
    }

    fn dropout_bwd(
        &mut self,
        dy: Region,
        dx: Region,
        len: usize,
        mask: DropoutMask,
    ) -> Result<(), EngineError> {
        self.dropout("dropout_bwd", len, mask, dy, dx)
    }

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
    ) -> Result<(), EngineError> {
        let op = "dropout_fused";
        let [src, dst, hyper, counter] =
            contract::dropout_fused(src, dst, len, trials, hyper, counter)?;
        let base = self.regions(op, &[src, hyper, counter], &[dst])?;
        let args = [
            Arg::Ptr(at(base, src)),
            Arg::Ptr(at(base, dst)),
            Arg::U32(to_u32(op, "len", len)?),
            Arg::U32(to_u32(op, "trials", trials)?),
            Arg::Ptr(at(base, hyper)),
            Arg::Ptr(at(base, counter)),
            Arg::U32(layer),
            Arg::U64(first),
        ];
        let e = self.ctx.enter()?;
        self.elementwise(&e, op, len * trials, &args)
    }

    fn softmax_xent(
        &mut self,
        logits: Region,
        labels: Region,
        dlogits: Region,
        stats: Region,
        rows: usize,
        classes: usize,
    ) -> Result<(), EngineError> {
        let op = "softmax_xent";
        let [logits, labels, dlogits, stats] =
            contract::softmax_xent(logits, labels, dlogits, stats, rows, classes)?;
        let base = self.regions(op, &[logits, labels], &[dlogits, stats])?;
        let args = [
            Arg::Ptr(at(base, logits)),
            Arg::Ptr(at(base, labels)),
            Arg::Ptr(at(base, dlogits)),
            Arg::Ptr(at(base, stats)),
            Arg::U32(to_u32(op, "rows", rows)?),
            Arg::U32(to_u32(op, "classes", classes)?),
        ];
        to_u32(op, "rows·classes", rows * classes)?;
        let e = self.ctx.enter()?;
        // One block: its fixed-order reduction makes the sums deterministic.
        self.kernel(&e, op, (1, BLOCK), &args)
    }

    fn softmax_xent_fused(
        &mut self,
        logits: Region,
        labels: Region,
        dlogits: Region,
        stats: Region,
        rows: usize,
        classes: usize,
        trials: usize,
    ) -> Result<(), EngineError> {
        let op = "softmax_xent_fused";
        let [logits, labels, dlogits, stats] =
            contract::softmax_xent_fused(logits, labels, dlogits, stats, rows, classes, trials)?;
        let base = self.regions(op, &[logits, labels], &[dlogits, stats])?;
        let args = [
            Arg::Ptr(at(base, logits)),
            Arg::Ptr(at(base, labels)),
            Arg::Ptr(at(base, dlogits)),
            Arg::Ptr(at(base, stats)),
            Arg::U32(to_u32(op, "rows", rows)?),
            Arg::U32(to_u32(op, "classes", classes)?),
            Arg::U32(to_u32(op, "trials", trials)?),
        ];
        if trials == 0 {
            return Ok(());
        }
        let e = self.ctx.enter()?;
        // One block per trial (blocks loop over trials beyond the grid), each with the single
        // op's fixed-order reduction, so the sums are deterministic.
        let grid = trials.min(MAX_BLOCKS as usize) as u32;
        self.kernel(&e, op, (grid, BLOCK), &args)
    }

    fn eval_xent(
        &mut self,
        logits: Region,
        labels: Region,
        stats: Region,
        rows: usize,
        classes: usize,
    ) -> Result<(), EngineError> {
        let op = "eval_xent";
        let [logits, labels, stats] = contract::eval_xent(logits, labels, stats, rows, classes)?;
        let base = self.regions(op, &[logits, labels], &[stats])?;
        let args = [
            Arg::Ptr(at(base, logits)),
            Arg::Ptr(at(base, labels)),
            Arg::Ptr(at(base, stats)),
            Arg::U32(to_u32(op, "rows", rows)?),
            Arg::U32(to_u32(op, "classes", classes)?),
        ];
        to_u32(op, "rows·classes", rows * classes)?;
        let e = self.ctx.enter()?;
        self.kernel(&e, op, (1, BLOCK), &args)
    }

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
    ) -> Result<(), EngineError> {
        let op = "softmax_xent_bias";
        let [logits, labels, dlogits, stats] =
            contract::softmax_xent_fused(logits, labels, dlogits, stats, rows, classes, trials)?;
        let dbr = contract::xent_bias_grad(classes, trials, db)?;
        let base = self.regions(op, &[logits, labels], &[dlogits, stats, dbr])?;
        let args = [
            Arg::Ptr(at(base, logits)),
            Arg::Ptr(at(base, labels)),
            Arg::Ptr(at(base, dlogits)),
            Arg::Ptr(at(base, stats)),
            Arg::U32(to_u32(op, "rows", rows)?),
            Arg::U32(to_u32(op, "classes", classes)?),
            Arg::U32(to_u32(op, "trials", trials)?),
            Arg::Ptr(at(base, dbr)),
            Arg::U32(to_u32(op, "db stride", db.stride)?),
        ];
        if trials == 0 {
            return Ok(());
        }
        let e = self.ctx.enter()?;
        // One block per trial, as softmax_xent_fused.
        let grid = trials.min(MAX_BLOCKS as usize) as u32;
        self.kernel(&e, op, (grid, BLOCK), &args)
    }

    fn eval_xent_fused(
        &mut self,
        logits: Region,
        labels: Region,
        stats: Region,
        rows: usize,
        batch: usize,
        classes: usize,
        trials: usize,
    ) -> Result<(), EngineError> {
        let op = "eval_xent_fused";
        let [logits, labels, stats] =
            contract::eval_xent_fused(logits, labels, stats, rows, batch, classes, trials)?;
        let base = self.regions(op, &[logits, labels], &[stats])?;
        let args = [
            Arg::Ptr(at(base, logits)),
            Arg::Ptr(at(base, labels)),
            Arg::Ptr(at(base, stats)),
            Arg::U32(to_u32(op, "rows", rows)?),
            Arg::U32(to_u32(op, "batch", batch)?),
            Arg::U32(to_u32(op, "classes", classes)?),
            Arg::U32(to_u32(op, "trials", trials)?),
        ];
        if trials == 0 {
            return Ok(());
        }
        let e = self.ctx.enter()?;
        let grid = trials.min(MAX_BLOCKS as usize) as u32;
        self.kernel(&e, op, (grid, BLOCK), &args)
    }

    fn update(&mut self, u: Update, counter: Region) -> Result<(), EngineError> {
        self.optimizer(u, Some(counter), true)
    }

    fn sgd_step(
        &mut self,
        w: Region,
        g: Region,
        v: Region,
        p: SgdParams,
    ) -> Result<(), EngineError> {
        self.optimizer(Update::Sgd { w, g, v, p }, None, false)
    }

    fn adam_step(
        &mut self,
        w: Region,
        g: Region,
        m: Region,
        v: Region,
        p: AdamParams,
        counter: Region,
    ) -> Result<(), EngineError> {
        self.optimizer(Update::Adam { w, g, m, v, p }, Some(counter), false)
    }

    fn sgd_step_batched(
        &mut self,
        w: Region,
        g: Region,
        v: Region,
        hyper: Region,
        trials: usize,
    ) -> Result<(), EngineError> {
        let u = Update::SgdBatched {
            w,
            g,
            v,
            hyper,
            trials,
        };
        self.optimizer(u, None, false)
    }

    fn adam_step_batched(
        &mut self,
        w: Region,
        g: Region,
        m: Region,
        v: Region,
        hyper: Region,
        trials: usize,
        counter: Region,
    ) -> Result<(), EngineError> {
        let u = Update::AdamBatched {
            w,
            g,
            m,
            v,
            hyper,
            trials,
        };
        self.optimizer(u, Some(counter), false)
    }

    fn synchronize(&mut self) -> Result<(), EngineError> {
        self.not_capturing("synchronize")?;
        self.stream.wait()
    }

    fn pace(&mut self, lead: usize) -> Result<(), EngineError> {
        self.not_capturing("pace")?;
        self.pacer.mark(lead)
    }

    fn supports_graphs(&self) -> bool {
        self.graphs
    }

    fn hold_captures(&self) -> CaptureHold {
        capture_hold::hold()
    }

    fn loaded(&self, signature: u64) -> bool {
        self.ctx.loaded(signature)
    }

    fn mark_loaded(&mut self, signature: u64) {
        self.ctx.mark_loaded(signature)
    }

    fn recycle(self: Box<Self>) {
        super::engine::recycle(self)
    }

    fn begin_capture(&mut self) -> Result<(), EngineError> {
        self.begin()
    }

    fn end_capture_into(&mut self, slot: usize) -> Result<(), EngineError> {
        self.end(slot)
    }

    fn replay_slot(&mut self, slot: usize) -> Result<(), EngineError> {
        self.launch_graph(slot)
    }
}

/// The size arguments of the pooling kernels: `n, c, h, w, k, stride, pad, h_out, w_out`
/// (the shape checked to fit first).
fn pool_dims(op: &'static str, s: &PoolShape) -> Result<[Arg; 9], EngineError> {
    to_u32(op, "input elements", s.x_len())?;
    to_u32(op, "output elements", s.y_len())?;
    Ok([
        Arg::U32(to_u32(op, "n", s.n)?),
        Arg::U32(to_u32(op, "c", s.c)?),
        Arg::U32(to_u32(op, "h", s.h)?),
        Arg::U32(to_u32(op, "w", s.w)?),
        Arg::U32(to_u32(op, "k", s.k)?),
        Arg::U32(to_u32(op, "stride", s.stride)?),
        Arg::U32(to_u32(op, "pad", s.pad)?),
        Arg::U32(to_u32(op, "h_out", s.h_out())?),
        Arg::U32(to_u32(op, "w_out", s.w_out())?),
    ])
}
