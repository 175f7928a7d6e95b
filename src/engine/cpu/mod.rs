//! The CPU reference backend: the arena is host memory, every op is a twin in [`ops`].

pub mod denormals;
mod im2col;
pub mod ops;
pub(crate) mod simd;

use std::sync::Arc;

use crate::data::{Dataset, Samples};
use crate::engine::contract::{self, need};
use crate::engine::fused_hyper::{self as fused, HYPER_DROPOUT, HYPER_LEN};
use crate::engine::{
    dropout_stream, AdamParams, Backend, BackendKind, BiasGrad, BnParams, Conv2dShape, DropoutMask,
    FusedConv, GemmBatch, GemmShape, PlaneShape, PoolShape, Region, SgdParams, Split, COUNTER_LEN,
};
use crate::error::EngineError;
use crate::units::MIB;

/// Regions borrowed at once: `R` to read and `W` to write.
type Views<'a, const R: usize, const W: usize> = ([&'a [f32]; R], [&'a mut [f32]; W]);

/// A trial's engine on the host. The dataset is shared read-only by every trial of the process.
pub struct CpuBackend {
    data: Arc<Dataset>,
    cap_bytes: Option<u64>,
    arena: Vec<f32>,
    order: Vec<u32>,
}

impl CpuBackend {
    /// A backend whose arena must fit under `cap_bytes` (no cap when `None`).
    pub fn new(data: Arc<Dataset>, cap_bytes: Option<u64>) -> Self {
        let order = (0..data.train.len() as u32).collect();
        CpuBackend {
            data,
            cap_bytes,
            arena: Vec::new(),
            order,
        }
    }

    /// The step counter's value (a `u32` stored as bits).
    fn count(&mut self, counter: Region) -> Result<u32, EngineError> {
        let counter = contract::counter(counter)?;
        let ([c], []) = self.views("counter", [counter], [])?;
        Ok(c[0].to_bits())
    }

    /// Borrows `R` regions to read and `W` regions to write at once. Written regions must not
    /// overlap each other or any read region.
    fn views<const R: usize, const W: usize>(
        &mut self,
        op: &'static str,
        reads: [Region; R],
        writes: [Region; W],
    ) -> Result<Views<'_, R, W>, EngineError> {
        contract::regions(op, self.arena.len(), &reads, &writes)?;
        let base = self.arena.as_mut_ptr();
        // SAFETY: every region lies inside the arena (checked above), written regions are disjoint
        // from each other and from the read regions, and all borrows end with `&mut self`'s.
        let r = reads
            .map(|g| unsafe { std::slice::from_raw_parts(base.add(g.offset), g.len) as &[f32] });
        let w =
            writes.map(|g| unsafe { std::slice::from_raw_parts_mut(base.add(g.offset), g.len) });
        Ok((r, w))
    }
}

/// Copies samples `rows` of `samples` (each `len` elements) into consecutive rows of `xs`, and
/// their labels, as `f32`, into `ys`.
fn copy_samples(
    samples: &Samples,
    len: usize,
    rows: impl IntoIterator<Item = usize>,
    xs: &mut [f32],
    ys: &mut [f32],
) {
    for (r, i) in rows.into_iter().enumerate() {
        xs[r * len..(r + 1) * len].copy_from_slice(&samples.images[i * len..(i + 1) * len]);
        ys[r] = samples.labels[i] as f32;
    }
}

impl Backend for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn alloc_arena(&mut self, elems: usize) -> Result<(), EngineError> {
        let bytes = (elems * std::mem::size_of::<f32>()) as u64;
        if let Some(cap) = self.cap_bytes {
            if bytes > cap {
                return Err(EngineError::CapExceeded {
                    need_mib: bytes as f64 / MIB,
                    cap_mib: cap as f64 / MIB,
                });
            }
        }
        let mut arena = Vec::new();
        arena.try_reserve_exact(elems).map_err(|_| {
            EngineError::Device(format!(
                "host allocation of {:.1} MiB failed",
                bytes as f64 / MIB
            ))
        })?;
        arena.resize(elems, 0.0);
        self.arena = arena;
        Ok(())
    }

    fn allocated_bytes(&self) -> usize {
        self.arena.len() * std::mem::size_of::<f32>()
    }

    fn write(&mut self, dst: Region, src: &[f32]) -> Result<(), EngineError> {
        let dst = contract::write(dst, src.len())?;
        let ([], [d]) = self.views("write", [], [dst])?;
        d.copy_from_slice(src);
        Ok(())
    }

    fn read(&mut self, src: Region, dst: &mut [f32]) -> Result<(), EngineError> {
        let src = contract::read(src, dst.len())?;
        let ([s], []) = self.views("read", [src], [])?;
        dst.copy_from_slice(s);
        Ok(())
    }

    fn fill(&mut self, dst: Region, value: f32) -> Result<(), EngineError> {
        let ([], [d]) = self.views("fill", [], [dst])?;
        d.fill(value);
        Ok(())
    }

    fn split_len(&self, split: Split) -> usize {
        match split {
            Split::Train => self.data.train.len(),
            Split::Test => self.data.test.len(),
        }
    }

    fn sample_len(&self) -> usize {
        self.data.sample_len()
    }

    fn set_train_order(&mut self, order: &[u32]) -> Result<(), EngineError> {
        contract::train_order(order, self.data.train.len())?;
        self.order.clear();
        self.order.extend_from_slice(order);
        Ok(())
    }

    fn gather(
        &mut self,
        split: Split,
        start: usize,
        rows: usize,
        x: Region,
        y: Region,
    ) -> Result<(), EngineError> {
        let data = Arc::clone(&self.data);
        let len = data.sample_len();
        let samples = match split {
            Split::Train => &data.train,
            Split::Test => &data.test,
        };
        let (x, y) = contract::gather(start, rows, samples.len(), len, x, y)?;
        let order = std::mem::take(&mut self.order);
        let result = (|| {
            let ([], [xs, ys]) = self.views("gather", [], [x, y])?;
            let rows = (start..start + rows).map(|k| match split {
                Split::Train => order[k] as usize,
                Split::Test => k,
            });
            copy_samples(samples, len, rows, xs, ys);
            Ok(())
        })();
        self.order = order;
        result
    }

    fn gather_train(
        &mut self,
        counter: Region,
        steps_per_epoch: usize,
        batch: usize,
        x: Region,
        y: Region,
    ) -> Result<(), EngineError> {
        let (x, y) = contract::gather_train(
            steps_per_epoch,
            batch,
            self.data.train.len(),
            self.data.sample_len(),
            x,
            y,
        )?;
        let count = self.count(counter)? as usize;
        self.gather(Split::Train, (count % steps_per_epoch) * batch, batch, x, y)
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
        let data = Arc::clone(&self.data);
        let (n, len) = (data.train.len(), data.sample_len());
        let r =
            contract::gather_train_fused(steps_per_epoch, batch, n, len, trials, [orders, x, y])?;
        let counter = contract::counter(counter)?;
        let ([c, orders], [xs, ys]) =
            self.views("gather_train_fused", [counter, r.orders], [r.x, r.y])?;
        let start = (c[0].to_bits() as usize % steps_per_epoch) * batch;
        // Every index is checked before anything is written.
        let mut rows = Vec::with_capacity(trials * batch);
        for (t, order) in orders.chunks_exact(n.max(1)).take(trials).enumerate() {
            for &bits in &order[start..start + batch] {
                rows.push(contract::fused_order_index(t, bits, n)?);
            }
        }
        copy_samples(&data.train, len, rows, xs, ys);
        Ok(())
    }

    fn advance(&mut self, counter: Region) -> Result<(), EngineError> {
        let count = self.count(counter)?;
        let ([], [c]) = self.views("advance", [], [counter.prefix(COUNTER_LEN)])?;
        c[0] = f32::from_bits(count.wrapping_add(1));
        Ok(())
    }

    fn gemm(&mut self, g: GemmShape, a: Region, b: Region, c: Region) -> Result<(), EngineError> {
        let [a, b, c] = contract::gemm(&g, a, b, c)?;
        let ([a, b], [c]) = self.views("gemm", [a, b], [c])?;
        ops::gemm(&g, a, b, c);
        Ok(())
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
        let ([a, b], [c]) = self.views("gemm_batched", [a, b], [c])?;
        ops::gemm_batched(&g, &batch, a, b, c);
        Ok(())
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
        let ([x, w, bias], [y]) = self.views(op, [x, w, bias], [y])?;
        ops::gemm_batched(&g, &batch, x, w, y);
        ops::bias_act_fused(y, bias, g.m, g.n, batch.count, bias_stride, relu);
        Ok(())
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
        let [dy, w, dx, y, dbr] = contract::dense_bwd_relu(&g, &batch, dy, w, dx, y, db)?;
        let ([dy, w, y], [dx, dbv]) = self.views(op, [dy, w, y], [dx, dbr])?;
        ops::gemm_batched(&g, &batch, dy, w, dx);
        ops::relu_bias_grad_fused(y, dx, dbv, g.m, g.n, batch.count, db.stride);
        Ok(())
    }

    fn bias_add(
        &mut self,
        y: Region,
        bias: Region,
        rows: usize,
        cols: usize,
    ) -> Result<(), EngineError> {
        let [y, bias] = contract::bias_add(y, bias, rows, cols)?;
        let ([b], [y]) = self.views("bias_add", [bias], [y])?;
        ops::bias_add(y, b, rows, cols);
        Ok(())
    }

    fn bias_grad(
        &mut self,
        dy: Region,
        db: Region,
        rows: usize,
        cols: usize,
    ) -> Result<(), EngineError> {
        let [dy, db] = contract::bias_grad(dy, db, rows, cols)?;
        let ([dy], [db]) = self.views("bias_grad", [dy], [db])?;
        ops::bias_grad(dy, db, rows, cols);
        Ok(())
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
        let ([b], [y]) = self.views(op, [bias], [y])?;
        ops::bias_add_fused(y, b, rows, cols, trials, bias_stride);
        Ok(())
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
        let ([dy], [db]) = self.views(op, [dy], [db])?;
        ops::bias_grad_fused(dy, db, rows, cols, trials, db_stride);
        Ok(())
    }

    fn relu_fwd(&mut self, x: Region, y: Region, len: usize) -> Result<(), EngineError> {
        let [x, y] = contract::elementwise("relu_fwd", [("x", x), ("y", y)], len)?;
        let ([x], [y]) = self.views("relu_fwd", [x], [y])?;
        ops::relu_fwd(x, y);
        Ok(())
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
        let ([y, dy], [dx]) = self.views("relu_bwd", [y, dy], [dx])?;
        ops::relu_bwd(y, dy, dx);
        Ok(())
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
        let op = "conv2d_fwd";
        let r = contract::conv2d_fwd(s, x, w, b, y)?;
        let ws = need(op, "workspace", ws, s.ws_len())?;
        let has_b = r.b.is_some();
        let b = r.b.unwrap_or_default();
        let ([x, w, b], [y, ws]) = self.views(op, [r.x, r.w, b], [r.y, ws])?;
        ops::conv2d_fwd(s, x, w, has_b.then_some(b), y, ws);
        Ok(())
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
        let op = "conv2d_bwd";
        let r = contract::conv2d_bwd(s, x, w, dy, dx, dw, db)?;
        let ws = need(op, "workspace", ws, s.ws_len())?;
        let (has_dx, has_db) = (r.dx.is_some(), r.db.is_some());
        let (dx, db) = (r.dx.unwrap_or_default(), r.db.unwrap_or_default());
        let ([x, w, dy], [dx, dw, db, ws]) =
            self.views(op, [r.x, r.w, r.dy], [dx, r.dw, db, ws])?;
        ops::conv2d_bwd(
            s,
            x,
            w,
            dy,
            has_dx.then_some(dx),
            dw,
            has_db.then_some(db),
            ws,
        );
        Ok(())
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
        let op = "conv2d_fwd_fused";
        let r = contract::conv2d_fwd_fused(s, x, w, b, y, f)?;
        let ws = contract::fused_ws(op, ws, f, s.ws_len())?;
        let (x_len, y_len) = (s.x_len(), s.y_len());
        for i in 0..f.trials {
            let b = r.b.map(|b| FusedConv::at(b, i, f.w_stride, s.c_out));
            self.conv2d_fwd(
                s,
                FusedConv::at(r.x, i, x_len, x_len),
                FusedConv::at(r.w, i, f.w_stride, s.w_len()),
                b,
                FusedConv::at(r.y, i, y_len, y_len),
                FusedConv::at(ws, i, f.ws_stride, s.ws_len()),
            )?;
        }
        Ok(())
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
        let op = "conv2d_bwd_fused";
        let r = contract::conv2d_bwd_fused(s, x, w, dy, dx, dw, db, f)?;
        let ws = contract::fused_ws(op, ws, f, s.ws_len())?;
        let (x_len, y_len, w_len) = (s.x_len(), s.y_len(), s.w_len());
        for i in 0..f.trials {
            self.conv2d_bwd(
                s,
                FusedConv::at(r.x, i, x_len, x_len),
                FusedConv::at(r.w, i, f.w_stride, w_len),
                FusedConv::at(r.dy, i, y_len, y_len),
                r.dx.map(|dx| FusedConv::at(dx, i, x_len, x_len)),
                FusedConv::at(r.dw, i, f.w_stride, w_len),
                r.db.map(|db| FusedConv::at(db, i, f.w_stride, s.c_out)),
                FusedConv::at(ws, i, f.ws_stride, s.ws_len()),
            )?;
        }
        Ok(())
    }

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
        let op = "batchnorm_fwd";
        let [x, gamma, beta, running, saved, y] =
            contract::batchnorm_fwd(s, x, gamma, beta, running, saved, y)?;
        let ([x, gamma, beta], [running, saved, y]) =
            self.views(op, [x, gamma, beta], [running, saved, y])?;
        ops::batchnorm_fwd(s, x, gamma, beta, running, saved, y, p);
        Ok(())
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
        let op = "batchnorm_bwd";
        let [x, gamma, saved, dy, dx, dgamma, dbeta] =
            contract::batchnorm_bwd(s, x, gamma, saved, dy, dx, dgamma, dbeta)?;
        let ([x, gamma, saved, dy], [dx, dgamma, dbeta]) =
            self.views(op, [x, gamma, saved, dy], [dx, dgamma, dbeta])?;
        ops::batchnorm_bwd(s, x, gamma, saved, dy, dx, dgamma, dbeta);
        Ok(())
    }

    fn avgpool_fwd(&mut self, s: &PlaneShape, x: Region, y: Region) -> Result<(), EngineError> {
        let op = "avgpool_fwd";
        let [x, y] = contract::avgpool_fwd(s, x, y)?;
        let ([x], [y]) = self.views(op, [x], [y])?;
        ops::avgpool_fwd(s, x, y);
        Ok(())
    }

    fn avgpool_bwd(&mut self, s: &PlaneShape, dy: Region, dx: Region) -> Result<(), EngineError> {
        let op = "avgpool_bwd";
        let [dy, dx] = contract::avgpool_bwd(s, dy, dx)?;
        let ([dy], [dx]) = self.views(op, [dy], [dx])?;
        ops::avgpool_bwd(s, dy, dx);
        Ok(())
    }

    fn add(&mut self, a: Region, b: Region, y: Region, len: usize) -> Result<(), EngineError> {
        let [a, b, y] = contract::elementwise("add", [("a", a), ("b", b), ("y", y)], len)?;
        let ([a, b], [y]) = self.views("add", [a, b], [y])?;
        ops::add(a, b, y);
        Ok(())
    }

    fn add_assign(&mut self, y: Region, x: Region, len: usize) -> Result<(), EngineError> {
        let [x, y] = contract::elementwise("add_assign", [("x", x), ("y", y)], len)?;
        let ([x], [y]) = self.views("add_assign", [x], [y])?;
        ops::add_assign(y, x);
        Ok(())
    }

    fn copy(&mut self, x: Region, y: Region, len: usize) -> Result<(), EngineError> {
        let [x, y] = contract::elementwise("copy", [("x", x), ("y", y)], len)?;
        let ([x], [y]) = self.views("copy", [x], [y])?;
        y.copy_from_slice(x);
        Ok(())
    }

    fn maxpool_fwd(&mut self, s: &PoolShape, x: Region, y: Region) -> Result<(), EngineError> {
        let [x, y] = contract::maxpool_fwd(s, x, y)?;
        let ([x], [y]) = self.views("maxpool_fwd", [x], [y])?;
        ops::maxpool_fwd(s, x, y);
        Ok(())
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
        let ([x, y, dy], [dx]) = self.views(op, [x, y, dy], [dx])?;
        ops::maxpool_bwd(s, x, y, dy, dx);
        Ok(())
    }

    fn dropout_fwd(
        &mut self,
        x: Region,
        y: Region,
        len: usize,
        m: DropoutMask,
    ) -> Result<(), EngineError> {
        let stream = dropout_stream(self.count(m.counter)?, m.layer);
        let [x, y] = contract::elementwise("dropout_fwd", [("x", x), ("y", y)], len)?;
        let ([x], [y]) = self.views("dropout_fwd", [x], [y])?;
        ops::dropout_fwd(x, y, m.p, m.seed, stream, m.first);
        Ok(())
    }

    fn dropout_bwd(
        &mut self,
        dy: Region,
        dx: Region,
        len: usize,
        m: DropoutMask,
    ) -> Result<(), EngineError> {
        let stream = dropout_stream(self.count(m.counter)?, m.layer);
        let [dy, dx] = contract::elementwise("dropout_bwd", [("dy", dy), ("dx", dx)], len)?;
        let ([dy], [dx]) = self.views("dropout_bwd", [dy], [dx])?;
        ops::dropout_bwd(dy, dx, m.p, m.seed, stream, m.first);
        Ok(())
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
        let count = self.count(counter)?;
        let ([x, h], [y]) = self.views(op, [src, hyper], [dst])?;
        for (t, row) in h.chunks_exact(HYPER_LEN).take(trials).enumerate() {
            let part = t * len..(t + 1) * len;
            let (p, seed) = (row[HYPER_DROPOUT], fused::row_seed(row));
            // Each trial at its own step (the counter less where it started).
            let stream = dropout_stream(fused::row_steps(row, count), layer);
            ops::dropout_fwd(&x[part.clone()], &mut y[part], p, seed, stream, first);
        }
        Ok(())
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
        let ([l, y], [d, s]) = self.views(op, [logits, labels], [dlogits, stats])?;
        contract::labels(y, classes)?;
        let (loss, correct) = ops::softmax_xent(l, y, d, rows, classes);
        s[0] += loss;
        s[1] += correct;
        Ok(())
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
        let ([l, y], [d, s]) = self.views(op, [logits, labels], [dlogits, stats])?;
        contract::labels(y, classes)?;
        ops::softmax_xent_fused(l, y, d, s, rows, classes, trials);
        Ok(())
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
        let ([l, y], [s]) = self.views(op, [logits, labels], [stats])?;
        contract::labels(y, classes)?;
        let (loss, correct) = ops::eval_xent(l, y, rows, classes);
        s[0] += loss;
        s[1] += correct;
        Ok(())
    }

    fn sgd_step(
        &mut self,
        w: Region,
        g: Region,
        v: Region,
        p: SgdParams,
    ) -> Result<(), EngineError> {
        let [g, v] = contract::elementwise("sgd_step", [("g", g), ("v", v)], w.len)?;
        let ([g], [w, v]) = self.views("sgd_step", [g], [w, v])?;
        ops::sgd_step(w, g, v, p.lr, p.momentum, p.weight_decay);
        Ok(())
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
        let t = self.count(counter)?.wrapping_add(1);
        let [g, m, v] = contract::elementwise("adam_step", [("g", g), ("m", m), ("v", v)], w.len)?;
        let ([g], [w, m, v]) = self.views("adam_step", [g], [w, m, v])?;
        ops::adam_step(w, g, m, v, p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, t);
        Ok(())
    }

    fn sgd_step_batched(
        &mut self,
        w: Region,
        g: Region,
        v: Region,
        hyper: Region,
        trials: usize,
    ) -> Result<(), EngineError> {
        let op = "sgd_step_batched";
        let (_, [g, v], hyper) =
            contract::optim_batched(op, w, [("g", g), ("v", v)], hyper, trials)?;
        let ([g, hyper], [w, v]) = self.views(op, [g, hyper], [w, v])?;
        ops::sgd_step_batched(w, g, v, hyper, trials);
        Ok(())
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
        let op = "adam_step_batched";
        let count = self.count(counter)?;
        let (_, [g, m, v], hyper) =
            contract::optim_batched(op, w, [("g", g), ("m", m), ("v", v)], hyper, trials)?;
        let ([g, hyper], [w, m, v]) = self.views(op, [g, hyper], [w, m, v])?;
        ops::adam_step_batched(w, g, m, v, hyper, trials, count);
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), EngineError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
