//! The CPU reference backend: the arena is host memory, every op is a twin in [`ops`].

pub mod denormals;
mod im2col;
pub mod ops;

use std::sync::Arc;

use crate::data::{Dataset, Samples};
use crate::engine::contract::{self, need};
use crate::engine::{
    dropout_stream, AdamParams, Backend, BackendKind, BnParams, Conv2dShape, DropoutMask,
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
        let t = self.count(counter)?.wrapping_add(1);
        let (_, [g, m, v], hyper) =
            contract::optim_batched(op, w, [("g", g), ("m", m), ("v", v)], hyper, trials)?;
        let ([g, hyper], [w, m, v]) = self.views(op, [g, hyper], [w, m, v])?;
        ops::adam_step_batched(w, g, m, v, hyper, trials, t);
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), EngineError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Dataset, Samples};

    fn tiny() -> Arc<Dataset> {
        Arc::new(Dataset::in_memory(
            "tiny",
            [1, 1, 2],
            2,
            Samples::of(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0], vec![0, 1, 0]),
            Samples::of(vec![9.0, 8.0], vec![1]),
        ))
    }

    #[test]
    fn the_cap_is_checked_before_allocating() {
        let mut b = CpuBackend::new(tiny(), Some(1 << 20));
        let e = b.alloc_arena(1 << 20).unwrap_err();
        assert_eq!(e.to_string(), "needs 4.0 MiB, slice cap 1.0 MiB");
        assert!(b.alloc_arena(1000).is_ok());
        assert_eq!(b.allocated_bytes(), 4000);
    }

    #[test]
    fn regions_are_checked() {
        let mut b = CpuBackend::new(tiny(), None);
        assert!(matches!(
            b.fill(Region::new(0, 1), 0.0),
            Err(EngineError::NoArena)
        ));
        b.alloc_arena(10).unwrap();
        assert!(matches!(
            b.fill(Region::new(5, 6), 0.0),
            Err(EngineError::OutOfArena { .. })
        ));
        let e = b
            .relu_fwd(Region::new(0, 4), Region::new(2, 4), 4)
            .unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
    }

    #[test]
    fn gather_follows_the_epoch_order() {
        let mut b = CpuBackend::new(tiny(), None);
        b.alloc_arena(16).unwrap();
        b.set_train_order(&[2, 0, 1]).unwrap();
        b.gather(Split::Train, 0, 2, Region::new(0, 4), Region::new(4, 2))
            .unwrap();
        let mut out = [0.0; 6];
        b.read(Region::new(0, 6), &mut out).unwrap();
        assert_eq!(out, [4.0, 5.0, 0.0, 1.0, 0.0, 0.0]);
        assert!(b.set_train_order(&[0, 1]).is_err());
        assert!(b
            .gather(Split::Test, 0, 2, Region::new(0, 4), Region::new(4, 2))
            .is_err());
    }

    /// 20 training samples of 1×2×3, 5 classes.
    fn twenty() -> Arc<Dataset> {
        let mut rng = crate::rng::HostRng::new(3);
        let images = (0..20 * 6).map(|_| rng.uniform_f32(-1.0, 1.0)).collect();
        let labels = (0..20).map(|i| i % 5).collect();
        let test = Samples::of(vec![0.0; 6], vec![0]);
        Arc::new(Dataset::in_memory(
            "twenty",
            [1, 2, 3],
            5,
            Samples::of(images, labels),
            test,
        ))
    }

    /// The orders of `trials` trials as a fused group's `orders` region holds them.
    fn order_bits(orders: &[Vec<u32>]) -> Vec<f32> {
        orders
            .iter()
            .flatten()
            .map(|&i| f32::from_bits(i))
            .collect()
    }

    #[test]
    fn fused_convolutions_are_each_trials_own_bit_for_bit() {
        // 3 trials of 2 samples, 2→3 channels, 3×3 padded on 5×4, with a bias; each trial's
        // parameter block holds its weights then its bias, with room between the blocks.
        let s = Conv2dShape {
            n: 2,
            c_in: 2,
            h: 5,
            w: 4,
            c_out: 3,
            k: 3,
            pad: 1,
            stride: 2,
        };
        let trials = 3;
        let f = FusedConv {
            trials,
            w_stride: s.w_len() + s.c_out + 3,
            ws_stride: s.ws_len() + 2,
        };
        let (xl, yl) = (s.x_len() * trials, s.y_len() * trials);
        let pl = f.w_stride * trials;
        let x = Region::new(0, xl);
        let y = Region::new(xl, yl);
        let w = Region::new(xl + yl, pl);
        let b = Region::new(w.offset + s.w_len(), pl - s.w_len());
        let dw = Region::new(w.end(), pl);
        let db = Region::new(dw.offset + s.w_len(), pl - s.w_len());
        let dx = Region::new(dw.end(), xl);
        let ws = Region::new(dx.end(), f.ws_stride * trials);
        let total = ws.end();
        let mut rng = crate::rng::HostRng::new(7);
        let init: Vec<f32> = (0..total).map(|_| rng.uniform_f32(-1.0, 1.0)).collect();
        let fresh = || {
            let mut be = CpuBackend::new(tiny(), None);
            be.alloc_arena(total).unwrap();
            be.write(Region::new(0, total), &init).unwrap();
            be
        };
        let all = |be: &mut CpuBackend| {
            let mut out = vec![0.0f32; total];
            be.read(Region::new(0, total), &mut out).unwrap();
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let mut fused = fresh();
        fused.conv2d_fwd_fused(&s, x, w, Some(b), y, ws, f).unwrap();
        fused
            .conv2d_bwd_fused(&s, x, w, y, Some(dx), dw, Some(db), ws, f)
            .unwrap();
        let mut alone = fresh();
        let (x_len, y_len) = (s.x_len(), s.y_len());
        for i in 0..trials {
            let at = |r: Region, stride, len| FusedConv::at(r, i, stride, len);
            let ws_i = at(ws, f.ws_stride, s.ws_len());
            let (x_i, y_i) = (at(x, x_len, x_len), at(y, y_len, y_len));
            let (w_i, b_i) = (at(w, f.w_stride, s.w_len()), at(b, f.w_stride, s.c_out));
            alone
                .conv2d_fwd(&s, x_i, w_i, Some(b_i), y_i, ws_i)
                .unwrap();
        }
        for i in 0..trials {
            let at = |r: Region, stride, len| FusedConv::at(r, i, stride, len);
            let ws_i = at(ws, f.ws_stride, s.ws_len());
            let (x_i, y_i) = (at(x, x_len, x_len), at(y, y_len, y_len));
            let (w_i, dw_i) = (at(w, f.w_stride, s.w_len()), at(dw, f.w_stride, s.w_len()));
            let (db_i, dx_i) = (at(db, f.w_stride, s.c_out), at(dx, x_len, x_len));
            alone
                .conv2d_bwd(&s, x_i, w_i, y_i, Some(dx_i), dw_i, Some(db_i), ws_i)
                .unwrap();
        }
        assert_eq!(all(&mut fused), all(&mut alone));
        // A workspace stride under one convolution's need is a shape error.
        let short = FusedConv {
            ws_stride: s.ws_len() - 1,
            ..f
        };
        let e = fused
            .conv2d_fwd_fused(&s, x, w, None, y, ws, short)
            .unwrap_err();
        assert!(e.to_string().contains("workspace's stride"), "{e}");
    }

    #[test]
    fn a_fused_gather_is_each_trials_own_gather() {
        let (trials, steps, batch, len) = (3, 3, 6, 6);
        let orders: Vec<Vec<u32>> = (0..trials)
            .map(|t| crate::rng::HostRng::new(40 + t as u64).permutation(20))
            .collect();
        assert_ne!(orders[0], orders[1]);
        let (counter, ord) = (Region::new(0, 1), Region::new(1, trials * 20));
        let x = Region::new(64, trials * batch * len);
        let y = Region::new(192, trials * batch);
        // Past one epoch: batch 7 % 3 = 1 of each order.
        let count = [f32::from_bits(7)];
        let mut fused = CpuBackend::new(twenty(), None);
        fused.alloc_arena(256).unwrap();
        fused.write(counter, &count).unwrap();
        fused.write(ord, &order_bits(&orders)).unwrap();
        fused
            .gather_train_fused(counter, ord, steps, batch, x, y, trials)
            .unwrap();
        let (mut xs, mut ys) = (vec![0.0; x.len], vec![0.0; y.len]);
        fused.read(x, &mut xs).unwrap();
        fused.read(y, &mut ys).unwrap();
        for (t, order) in orders.iter().enumerate() {
            let mut one = CpuBackend::new(twenty(), None);
            one.alloc_arena(64).unwrap();
            one.write(counter, &count).unwrap();
            one.set_train_order(order).unwrap();
            let (x1, y1) = (Region::new(8, batch * len), Region::new(48, batch));
            one.gather_train(counter, steps, batch, x1, y1).unwrap();
            let (mut want_x, mut want_y) = (vec![0.0f32; x1.len], vec![0.0f32; y1.len]);
            one.read(x1, &mut want_x).unwrap();
            one.read(y1, &mut want_y).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let got_x = &xs[t * batch * len..(t + 1) * batch * len];
            assert_eq!(bits(got_x), bits(&want_x), "trial {t}'s x");
            assert_eq!(
                bits(&ys[t * batch..(t + 1) * batch]),
                bits(&want_y),
                "trial {t}'s y"
            );
        }
    }

    #[test]
    fn a_fused_gather_refuses_an_index_beyond_the_split() {
        let mut b = CpuBackend::new(twenty(), None);
        b.alloc_arena(256).unwrap();
        let mut orders = vec![(0..20).collect::<Vec<u32>>(); 2];
        orders[1][5] = 20;
        let (counter, ord) = (Region::new(0, 1), Region::new(1, 40));
        let (x, y) = (Region::new(64, 2 * 4 * 6), Region::new(128, 8));
        b.write(counter, &[f32::from_bits(1)]).unwrap();
        b.write(ord, &order_bits(&orders)).unwrap();
        b.fill(x, 7.0).unwrap();
        let e = b
            .gather_train_fused(counter, ord, 2, 4, x, y, 2)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "shape mismatch in gather_train_fused: trial 1's order holds sample 20, beyond 20 \
             training samples"
        );
        let mut xs = vec![0.0; x.len];
        b.read(x, &mut xs).unwrap();
        assert!(xs.iter().all(|&v| v == 7.0), "nothing is written");
        // Batch 0 does not reach the bad index.
        b.write(counter, &[f32::from_bits(2)]).unwrap();
        b.gather_train_fused(counter, ord, 2, 4, x, y, 2).unwrap();
        // Nor do the orders overlap what is written.
        let e = b
            .gather_train_fused(counter, ord, 2, 4, Region::new(30, 48), y, 2)
            .unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
    }
}
