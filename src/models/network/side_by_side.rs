//! A fused group's network: N copies of one trial's network in one arena, each trial's tensors side by side, trained by batched ops where the engine has them and the single ops trial by trial elsewhere.
//!
//! Layout. The fused plan is the single trial's plan with every tensor repeated N times in
//! place: the plan entry `(o, L)` becomes `(o·N, N·L)`, and trial `i`'s copy of a region inside it
//! sits `i·L` further on, at the same place within its copy. A parameter block therefore holds
//! every trial's parameters one trial after another (what the batched optimizer steps expect),
//! and a whole-batch activation holds the N trials' batches one after another (what a flat
//! elementwise op over `N·L` needs). The gradients of values share one block by liveness, where
//! regions of values never alive at once overlap: there each region `(o, L)` becomes
//! `(o·N, N·L)` on its own, which keeps the regions alive at the same time disjoint across trials.
//! The step counter is one for the group. After the copies come the hyper table
//! ([`crate::engine::fused_hyper`]) and the trials' data orders.
//!
//! Each trial's copy is a whole [`Network`] whose regions point into the fused arena, so every
//! op of a trial is the op it would run alone, on its own operands: the CPU backend computes
//! bit for bit what the trial computes alone.

use crate::engine::fused_hyper::{
    seed_bits, HYPER_BETA1, HYPER_BETA2, HYPER_DROPOUT, HYPER_EPS, HYPER_LEN, HYPER_LIVE, HYPER_LR,
    HYPER_MOMENTUM, HYPER_SEED_HI, HYPER_SEED_LO, HYPER_STEP0, HYPER_WD,
};
use crate::engine::{
    Backend, BiasGrad, BnParams, FusedConv, FusedNorm, GemmBatch, GemmShape, Region, Split, Update,
    STATS_LEN,
};
use crate::error::EngineError;
use crate::models::memplan::{MemKind, MemoryPlan, PlanEntry};
use crate::models::{Hyper, Optimizer};

use super::{Deliver, Layer, LayerDef, Network, OptState, GRADIENT_BLOCK};

/// The networks of a fused group's trials, in one arena.
#[derive(Clone, Debug)]
pub struct FusedNetwork {
    /// The plan of the whole group's arena.
    pub plan: MemoryPlan,
    /// Trial `i`'s network, its regions in the group's arena.
    pub members: Vec<Network>,
    /// The hyper table: [`HYPER_LEN`] values per trial.
    pub hyper: Region,
    /// Every trial's order of the training split this epoch, `n_train` `u32` each.
    pub orders: Region,
    pub n_train: usize,
    /// Adam's or SGD's state.
    optimizer: Optimizer,
}

impl FusedNetwork {
    /// The group of `dropout.len()` trials of `single`'s network, trial `i` with dropout rate
    /// `dropout[i]` in every dropout layer, over a training split of `n_train` samples.
    pub fn new(single: &Network, dropout: &[f32], n_train: usize) -> Result<Self, String> {
        let n = dropout.len();
        if n == 0 {
            return Err("a fused group needs at least one trial".into());
        }
        let too_big = || format!("a fused group of {n} trials does not fit in memory");
        let mut plan = MemoryPlan::default();
        for e in &single.plan.entries {
            let len = e.region.len.checked_mul(n).ok_or_else(too_big)?;
            let region = Region::new(e.region.offset.checked_mul(n).ok_or_else(too_big)?, len);
            plan.entries.push(PlanEntry {
                name: e.name.clone(),
                kind: e.kind,
                region,
            });
        }
        plan.total = single.plan.total.checked_mul(n).ok_or_else(too_big)?;
        let hyper = plan.add("hyper table", MemKind::Workspace, n * HYPER_LEN);
        let orders_len = n_train.checked_mul(n).ok_or_else(too_big)?;
        let orders = plan.add("data orders", MemKind::Workspace, orders_len);
        let optimizer = match single.opt {
            OptState::Sgd { .. } => Optimizer::Sgd,
            OptState::Adam { .. } => Optimizer::Adam,
        };
        let map = Mapper::new(single, n);
        let members = dropout
            .iter()
            .enumerate()
            .map(|(i, &p)| map.member(single, i, p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FusedNetwork {
            plan,
            members,
            hyper,
            orders,
            n_train,
            optimizer,
        })
    }

    /// The batch each trial trains on.
    pub fn first_batch(&self) -> usize {
        self.first().batch
    }

    /// Trials in the group.
    pub fn trials(&self) -> usize {
        self.members.len()
    }

    fn first(&self) -> &Network {
        &self.members[0]
    }

    /// Writes each trial's row of the hyper table, every trial live: its rates, and its dropout
    /// seed (`dropout_seeds[i]`, what its dropout layers draw their masks from). Every trial
    /// starts with the group, at its counter's 0.
    pub fn write_hyper(
        &self,
        be: &mut dyn Backend,
        hypers: &[Hyper],
        dropout_seeds: &[u64],
    ) -> Result<(), EngineError> {
        let mut table = vec![0f32; self.hyper.len];
        for ((row, h), &seed) in table
            .chunks_exact_mut(HYPER_LEN)
            .zip(hypers)
            .zip(dropout_seeds)
        {
            row.copy_from_slice(&hyper_row(h, seed, 0));
        }
        be.write(self.hyper, &table)
    }

    /// Whether a trial can take a slot of a group already training ([`FusedNetwork::restart`]):
    /// every dropout layer runs as one op over the group, which counts each trial's steps from
    /// where it started (a layer run trial by trial would count the group's).
    pub fn restartable(&self) -> bool {
        let net = self.first();
        let rows = net.batch;
        net.layers.iter().enumerate().all(|(i, l)| {
            if !matches!(l.def, LayerDef::Dropout { .. }) {
                return true;
            }
            let (out, n_in) = (rows * l.out_len, rows * l.in_len);
            let forward = self.flat(|m| m.acts[l.src], out).is_some()
                && self.flat(|m| m.acts[i + 1], out).is_some();
            let backward = !matches!(l.dsrc, Deliver::Write(_) | Deliver::Add(_))
                || (self.flat(|m| m.dacts[i + 1], n_in).is_some()
                    && self.group_dx(i, n_in).is_some());
            forward && backward
        })
    }

    /// Starts a new trial in slot `i` of a group that trains on: its initial weights from
    /// `init_seed` and zeroed optimizer state, its dropout rate, and its row of the hyper table,
    /// live, with `step0` (the group's counter now) where its own steps start. From the next
    /// step on it trains as it would alone. See [`FusedNetwork::restartable`].
    pub fn restart(
        &mut self,
        be: &mut dyn Backend,
        i: usize,
        hyper: &Hyper,
        (init_seed, dropout_seed): (u64, u64),
        step0: u32,
    ) -> Result<(), EngineError> {
        let Some(m) = self.members.get_mut(i) else {
            return Err(EngineError::Shape {
                op: "restart",
                message: format!("slot {i} of a fused group of {}", self.trials()),
            });
        };
        m.init_weights(be, init_seed)?;
        for l in &mut m.layers {
            if let LayerDef::Dropout { p } = &mut l.def {
                *p = hyper.dropout as f32;
            }
        }
        let at = Region::new(self.hyper.offset + i * HYPER_LEN, HYPER_LEN);
        be.write(at, &hyper_row(hyper, dropout_seed, step0))
    }

    /// Marks trial `i` dead: from the next step on, the optimizer leaves its parameters alone.
    pub fn kill(&self, be: &mut dyn Backend, i: usize) -> Result<(), EngineError> {
        let at = Region::new(self.hyper.offset + i * HYPER_LEN + HYPER_LIVE, 1);
        be.upload(at, &[0.0])
    }

    /// Uploads every trial's order of the training split for this epoch (`orders[i]` is trial
    /// `i`'s), in one copy that the host does not wait for.
    pub fn write_orders(
        &self,
        be: &mut dyn Backend,
        orders: &[Vec<u32>],
    ) -> Result<(), EngineError> {
        if orders.len() != self.trials() {
            return Err(EngineError::Shape {
                op: "set_train_order",
                message: format!(
                    "{} orders for a fused group of {} trials",
                    orders.len(),
                    self.trials()
                ),
            });
        }
        let mut bits = Vec::with_capacity(self.orders.len);
        for order in orders {
            crate::engine::contract::train_order(order, self.n_train)?;
            bits.extend(order.iter().map(|&o| f32::from_bits(o)));
        }
        be.upload(self.orders, &bits)
    }

    /// Every trial's `[Σ loss, #correct]`, one after another.
    pub fn stats(&self) -> Region {
        let first = self.first().stats;
        Region::new(first.offset, first.len * self.trials())
    }

    /// Every trial's test sums, one after another.
    pub fn test_stats(&self) -> Region {
        let first = self.first().test_stats;
        Region::new(first.offset, first.len * self.trials())
    }

    /// Every trial's training sums, then every trial's test sums: what one read takes at an
    /// epoch's end.
    pub fn epoch_stats(&self) -> Region {
        let (train, test) = (self.stats(), self.test_stats());
        debug_assert_eq!(
            train.end(),
            test.offset,
            "the test sums follow the training sums"
        );
        Region::new(train.offset, train.len + test.len)
    }

    /// The region spanning every trial's copy of `pick`'s region, and the stride between copies.
    fn span(&self, pick: impl Fn(&Network) -> Region) -> (Region, usize) {
        let first = pick(self.first());
        let last = pick(&self.members[self.trials() - 1]);
        let stride = match self.members.get(1) {
            Some(m) => pick(m).offset - first.offset,
            None => 0,
        };
        (Region::new(first.offset, last.end() - first.offset), stride)
    }

    /// [`Backend::gemm_batched`] over the group: trial `i` computes `g` on its copies of the
    /// regions `a`, `b` and `c` pick.
    fn gemm(
        &self,
        be: &mut dyn Backend,
        g: GemmShape,
        a: impl Fn(&Network) -> Region,
        b: impl Fn(&Network) -> Region,
        c: impl Fn(&Network) -> Region,
    ) -> Result<(), EngineError> {
        let ((a, stride_a), (b, stride_b), (c, stride_c)) =
            (self.span(a), self.span(b), self.span(c));
        let batch = GemmBatch {
            count: self.trials(),
            stride_a,
            stride_b,
            stride_c,
        };
        be.gemm_batched(g, batch, a, b, c)
    }

    /// The layout of convolution layer `i` over the group (its weights' stride, the workspace's),
    /// when its parameters `pick` (the weights and, with a bias, the bias) repeat at one stride;
    /// `None` when they do not.
    fn conv_layout(
        &self,
        bias: bool,
        w: impl Fn(&Network) -> Region,
        b: impl Fn(&Network) -> Region,
    ) -> Option<FusedConv> {
        let (w, b) = (self.span(w).1, self.span(b).1);
        let f = FusedConv {
            trials: self.trials(),
            w_stride: w,
            ws_stride: self.span(|m| m.ws).1,
        };
        (self.trials() == 1 || !bias || b == w).then_some(f)
    }

    /// The first `len` elements of the group's gradient scratch as one region of `len` per
    /// trial: the scratch is free between one op and the add that follows it, so a group op may
    /// use all of it (every trial's copy) when each copy holds `len`.
    fn group_scratch(&self, len: usize) -> Option<Region> {
        let (scratch, stride) = self.span(|m| m.scratch);
        let total = len.checked_mul(self.trials())?;
        // The copies lie one right after another: the span is the group's whole scratch.
        let whole = self.trials() == 1 || stride == self.first().scratch.len;
        let fits = total <= u32::MAX as usize && scratch.len >= total;
        (whole && fits).then(|| Region::new(scratch.offset, total))
    }

    /// Where layer `i`'s input gradient (`len` elements a trial) goes over the whole group, when
    /// it lies one trial after another; `None` when it does not.
    fn group_dx(&self, i: usize, len: usize) -> Option<GroupDx> {
        match self.first().layers[i].dsrc {
            Deliver::None | Deliver::Alias => Some(GroupDx::None),
            Deliver::Write(_) => self.flat(|m| deliver_region(m, i), len).map(GroupDx::Write),
            Deliver::Add(_) => {
                let into = self.flat(
                    |m| match m.layers[i].dsrc {
                        Deliver::Add(r) => r,
                        _ => m.scratch,
                    },
                    len,
                )?;
                let scratch = self.group_scratch(len)?;
                Some(GroupDx::Add { scratch, into })
            }
        }
    }

    /// The layout of batch-norm layer `i` over the group, when its two parameters (`γ` and `β`,
    /// or their gradients) repeat at one stride; `None` when they do not.
    fn norm_layout(
        &self,
        i: usize,
        gamma: impl Fn(&Network) -> Region,
        beta: impl Fn(&Network) -> Region,
    ) -> Option<FusedNorm> {
        let (g, b) = (self.span(gamma).1, self.span(beta).1);
        let f = FusedNorm {
            trials: self.trials(),
            param_stride: g,
            running_stride: self.span(|m| m.layers[i].running).1,
            saved_stride: self.span(|m| m.layers[i].saved).1,
        };
        (self.trials() == 1 || g == b).then_some(f)
    }

    /// The region covering the first `len` elements of every trial's copy of `pick`'s region
    /// when they lie one right after another (so that one elementwise op covers them all);
    /// `None` when they do not.
    fn flat(&self, pick: impl Fn(&Network) -> Region, len: usize) -> Option<Region> {
        let first = pick(self.first()).offset;
        let contiguous = self.members.iter().enumerate().all(|(i, m)| {
            let r = pick(m);
            r.len >= len && r.offset == first + i * len
        });
        contiguous.then(|| Region::new(first, len * self.trials()))
    }

    /// One training step of every trial: gather each trial's batch from its own order, forward,
    /// loss, backward, the optimizer over every trial's row of the hyper table, and the step
    /// counter advanced. `seeds[i]` is trial `i`'s dropout seed. Every argument is the same from
    /// step to step, so the step can be captured once as a graph.
    pub fn train_step(
        &self,
        be: &mut dyn Backend,
        steps_per_epoch: usize,
        seeds: &[u64],
    ) -> Result<(), EngineError> {
        let net = self.first();
        let rows = net.batch;
        be.gather_train_fused(
            net.counter,
            self.orders,
            steps_per_epoch,
            rows,
            self.span(|m| m.input()).0,
            self.span(|m| m.labels).0,
            self.trials(),
        )?;
        for i in 0..net.layers.len() {
            self.forward_layer(be, i, rows, true, seeds)?;
        }
        self.loss(be, rows)?;
        for i in (0..net.layers.len()).rev() {
            self.backward_layer(be, i, rows, seeds)?;
        }
        self.update(be)
    }

    /// One evaluation batch of every trial: samples `start..start + rows` of the test split
    /// gathered into every trial's input by one op, one forward pass over the group on whole
    /// batches (rows past `rows` hold earlier samples and are not counted) and one op adding
    /// every trial's sums for its first `rows` rows into [`FusedNetwork::test_stats`]. Each trial
    /// computes what [`Network::eval_batch`] computes for it alone.
    pub fn eval_batch(
        &self,
        be: &mut dyn Backend,
        start: usize,
        rows: usize,
    ) -> Result<(), EngineError> {
        let n = self.trials();
        let net = self.first();
        let (input, labels) = (self.span(|m| m.input()).0, self.span(|m| m.labels).0);
        let last = net.layers.len();
        be.gather_fused(Split::Test, start, rows, net.batch, input, labels, n)?;
        for i in 0..last {
            self.forward_layer(be, i, net.batch, false, &[])?;
        }
        let logits = self.span(|m| m.acts[last]).0;
        let stats = self.test_stats();
        be.eval_xent_fused(logits, labels, stats, rows, net.batch, net.classes, n)
    }

    /// Every trial's softmax cross-entropy: one fused op when each operand's copies lie one
    /// right after another, else one op per trial.
    fn loss(&self, be: &mut dyn Backend, rows: usize) -> Result<(), EngineError> {
        let net = self.first();
        let (last, classes) = (net.layers.len(), net.classes);
        let logits = self.flat(|m| m.acts[last], rows * classes);
        let labels = self.flat(|m| m.labels, rows);
        let dlogits = self.flat(|m| m.dacts[last], rows * classes);
        let stats = self.flat(|m| m.stats, STATS_LEN);
        if let (Some(l), Some(y), Some(d), Some(s)) = (logits, labels, dlogits, stats) {
            let n = self.trials();
            return match net.layers.last() {
                Some(lay) if lay.fold.bias_grad_in_loss => {
                    let (db, stride) = self.span(|m| m.layers[last - 1].db);
                    let db = BiasGrad {
                        db,
                        stride: if n > 1 { stride } else { classes },
                    };
                    be.softmax_xent_bias(l, y, d, s, rows, classes, n, db)
                }
                _ => be.softmax_xent_fused(l, y, d, s, rows, classes, n),
            };
        }
        for m in &self.members {
            m.loss(be, rows)?;
        }
        Ok(())
    }

    /// Layer `i` of every trial's forward pass, training (dropout with trial `t`'s seed
    /// `seeds[t]`, batch norm on the batch's statistics) or not (`seeds` unused).
    fn forward_layer(
        &self,
        be: &mut dyn Backend,
        i: usize,
        rows: usize,
        train: bool,
        seeds: &[u64],
    ) -> Result<(), EngineError> {
        let l = &self.first().layers[i];
        let n = self.trials();
        let out = rows * l.out_len;
        let src = l.src;
        match l.def {
            LayerDef::Dense { inputs, outputs } => {
                let g = GemmShape {
                    trans_b: true,
                    ..GemmShape::nn(rows, outputs, inputs)
                };
                let relu = l.fold.relu_fwd;
                let out = if relu { i + 2 } else { i + 1 };
                if let Some(y) = self.flat(|m| m.acts[out], rows * outputs) {
                    let (x, sx) = self.span(|m| m.acts[src]);
                    let (w, sw) = self.span(|m| m.layers[i].w);
                    let (b, sb) = self.span(|m| m.layers[i].b);
                    let batch = GemmBatch {
                        count: n,
                        stride_a: sx,
                        stride_b: sw,
                        stride_c: rows * outputs,
                    };
                    return be.dense_fwd(g, batch, x, w, y, b, sb, relu);
                }
            }
            LayerDef::Relu if l.fold.by_dense_fwd => return Ok(()),
            LayerDef::Relu => {
                let x = self.flat(|m| m.acts[src], out);
                let y = self.flat(|m| m.acts[i + 1], out);
                if let (Some(x), Some(y)) = (x, y) {
                    return be.relu_fwd(x, y, out * n);
                }
            }
            LayerDef::MaxPool(p) => {
                let x = self.flat(|m| m.acts[src], rows * l.in_len);
                let y = self.flat(|m| m.acts[i + 1], out);
                if let (Some(x), Some(y)) = (x, y) {
                    return be.maxpool_fwd(&p.with_n(rows * n), x, y);
                }
            }
            LayerDef::GlobalAvgPool(p) => {
                let x = self.flat(|m| m.acts[src], rows * l.in_len);
                let y = self.flat(|m| m.acts[i + 1], out);
                if let (Some(x), Some(y)) = (x, y) {
                    return be.avgpool_fwd(&p.with_n(rows * n), x, y);
                }
            }
            LayerDef::Add { other } => {
                let a = self.flat(|m| m.acts[src], out);
                let b = self.flat(|m| m.acts[other], out);
                let y = self.flat(|m| m.acts[i + 1], out);
                if let (Some(a), Some(b), Some(y)) = (a, b, y) {
                    return be.add(a, b, y, out * n);
                }
            }
            LayerDef::Conv { shape, bias } => {
                let s = shape.with_n(rows);
                let x = self.flat(|m| m.acts[src], s.x_len());
                let y = self.flat(|m| m.acts[i + 1], s.y_len());
                let (w, b) = (|m: &Network| m.layers[i].w, |m: &Network| m.layers[i].b);
                let f = self.conv_layout(bias, w, b);
                if let (Some(x), Some(y), Some(f)) = (x, y, f) {
                    let b = bias.then_some(self.span(b).0);
                    let (w, ws) = (self.span(w).0, self.span(|m| m.ws).0);
                    return be.conv2d_fwd_fused(&s, x, w, b, y, ws, f);
                }
            }
            LayerDef::Dropout { .. } => {
                let x = self.flat(|m| m.acts[src], out);
                let y = self.flat(|m| m.acts[i + 1], out);
                if let (Some(x), Some(y)) = (x, y) {
                    if !train {
                        // Dropout is off outside training: a copy, as each trial's own.
                        return be.copy(x, y, out * n);
                    }
                    let counter = self.first().counter;
                    return be.dropout_fused(x, y, out, n, self.hyper, counter, i as u32, 0);
                }
            }
            LayerDef::BatchNorm(p) => {
                let s = p.with_n(rows);
                let x = self.flat(|m| m.acts[src], s.len());
                let y = self.flat(|m| m.acts[i + 1], s.len());
                let (gamma, beta) = (|m: &Network| m.layers[i].w, |m: &Network| m.layers[i].b);
                if let (Some(x), Some(y), Some(f)) = (x, y, self.norm_layout(i, gamma, beta)) {
                    let bn = BnParams {
                        train,
                        ..BnParams::default()
                    };
                    let (gamma, beta) = (self.span(gamma).0, self.span(beta).0);
                    let running = self.span(|m| m.layers[i].running).0;
                    let saved = self.span(|m| m.layers[i].saved).0;
                    return be.batchnorm_fwd_fused(&s, x, gamma, beta, running, saved, y, bn, f);
                }
            }
        }
        debug_assert!(!train || seeds.len() == n, "a dropout seed per trial");
        for (t, m) in self.members.iter().enumerate() {
            let seed = seeds.get(t).copied().unwrap_or(0);
            m.forward_layer(be, i, rows, train, seed)?;
        }
        Ok(())
    }

    /// Layer `i` of every trial's backward pass.
    fn backward_layer(
        &self,
        be: &mut dyn Backend,
        i: usize,
        rows: usize,
        seeds: &[u64],
    ) -> Result<(), EngineError> {
        let l = &self.first().layers[i];
        let n = self.trials();
        let n_in = rows * l.in_len;
        let src = l.src;
        match (l.def, l.dsrc) {
            (LayerDef::Dense { inputs, outputs }, dsrc) => {
                let gw = GemmShape {
                    trans_a: true,
                    ..GemmShape::nn(outputs, inputs, rows)
                };
                let dy = |m: &Network| m.dacts[i + 1];
                self.gemm(be, gw, dy, |m| m.acts[src], |m| m.layers[i].dw)?;
                let (db, sdb) = self.span(|m| m.layers[i].db);
                match self.flat(|m| m.dacts[i + 1], rows * outputs) {
                    _ if l.fold.bias_grad_elsewhere => {}
                    Some(dy) => be.bias_grad_fused(dy, db, rows, outputs, n, sdb)?,
                    None => {
                        for m in &self.members {
                            be.bias_grad(m.dacts[i + 1], m.layers[i].db, rows, outputs)?;
                        }
                    }
                }
                if let (true, Deliver::Write(_)) = (l.fold.relu_bwd, dsrc) {
                    return self.dense_bwd_relu(be, i, rows, inputs, outputs);
                }
                if matches!(dsrc, Deliver::Write(_) | Deliver::Add(_)) {
                    let g = GemmShape::nn(rows, inputs, outputs);
                    self.gemm(be, g, dy, |m| m.layers[i].w, |m| deliver_region(m, i))?;
                    if let Deliver::Add(_) = dsrc {
                        for m in &self.members {
                            if let Deliver::Add(r) = m.layers[i].dsrc {
                                be.add_assign(r, m.scratch, n_in)?;
                            }
                        }
                    }
                }
                return Ok(());
            }
            (LayerDef::Relu, Deliver::Write(_) | Deliver::Add(_)) => {
                let y = self.flat(|m| m.acts[i + 1], n_in);
                let dy = self.flat(|m| m.dacts[i + 1], n_in);
                if let (Some(y), Some(dy), Some(dx)) = (y, dy, self.group_dx(i, n_in)) {
                    if let Some(target) = dx.target() {
                        be.relu_bwd(y, dy, target, n_in * n)?;
                    }
                    return dx.finish(be);
                }
            }
            (LayerDef::Dropout { .. }, Deliver::Write(_) | Deliver::Add(_)) => {
                let dy = self.flat(|m| m.dacts[i + 1], n_in);
                if let (Some(dy), Some(dx)) = (dy, self.group_dx(i, n_in)) {
                    if let Some(target) = dx.target() {
                        let counter = self.first().counter;
                        let (hyper, layer) = (self.hyper, i as u32);
                        be.dropout_fused(dy, target, n_in, n, hyper, counter, layer, 0)?;
                    }
                    return dx.finish(be);
                }
            }
            (LayerDef::MaxPool(p), Deliver::Write(_) | Deliver::Add(_)) => {
                let out = rows * l.out_len;
                let x = self.flat(|m| m.acts[src], n_in);
                let y = self.flat(|m| m.acts[i + 1], out);
                let dy = self.flat(|m| m.dacts[i + 1], out);
                let dx = self.group_dx(i, n_in);
                if let (Some(x), Some(y), Some(dy), Some(dx)) = (x, y, dy, dx) {
                    if let Some(target) = dx.target() {
                        be.maxpool_bwd(&p.with_n(rows * n), x, y, dy, target)?;
                    }
                    return dx.finish(be);
                }
            }
            (LayerDef::GlobalAvgPool(p), Deliver::Write(_) | Deliver::Add(_)) => {
                let dy = self.flat(|m| m.dacts[i + 1], rows * l.out_len);
                if let (Some(dy), Some(dx)) = (dy, self.group_dx(i, n_in)) {
                    if let Some(target) = dx.target() {
                        be.avgpool_bwd(&p.with_n(rows * n), dy, target)?;
                    }
                    return dx.finish(be);
                }
            }
            (LayerDef::BatchNorm(p), _) => {
                let s = p.with_n(rows);
                let x = self.flat(|m| m.acts[src], s.len());
                let dy = self.flat(|m| m.dacts[i + 1], s.len());
                // γ and β need the pass even when the input has no gradient: into the scratch.
                let dx = self.group_dx(i, s.len());
                let target = dx.and_then(|d| d.target().or_else(|| self.group_scratch(s.len())));
                let (gamma, beta) = (|m: &Network| m.layers[i].w, |m: &Network| m.layers[i].b);
                let (dgamma, dbeta) = (|m: &Network| m.layers[i].dw, |m: &Network| m.layers[i].db);
                let f = self.norm_layout(i, gamma, beta);
                let fd = self.norm_layout(i, dgamma, dbeta);
                let f = f.filter(|f| fd.is_some_and(|d| d.param_stride == f.param_stride));
                if let (Some(x), Some(dy), Some(dx), Some(target), Some(f)) = (x, dy, dx, target, f)
                {
                    let saved = self.span(|m| m.layers[i].saved).0;
                    let (gamma, dgamma, dbeta) =
                        (self.span(gamma).0, self.span(dgamma).0, self.span(dbeta).0);
                    be.batchnorm_bwd_fused(&s, x, gamma, saved, dy, target, dgamma, dbeta, f)?;
                    return dx.finish(be);
                }
            }
            (LayerDef::Conv { shape, bias }, _) => {
                let s = shape.with_n(rows);
                let x = self.flat(|m| m.acts[src], s.x_len());
                let dy = self.flat(|m| m.dacts[i + 1], s.y_len());
                let dx = self.group_dx(i, s.x_len());
                let (w, b) = (|m: &Network| m.layers[i].w, |m: &Network| m.layers[i].b);
                let (dw, db) = (|m: &Network| m.layers[i].dw, |m: &Network| m.layers[i].db);
                let f = self.conv_layout(bias, w, b);
                let fd = self.conv_layout(bias, dw, db);
                let f = f.filter(|f| fd.is_some_and(|d| d.w_stride == f.w_stride));
                if let (Some(x), Some(dy), Some(dx), Some(f)) = (x, dy, dx, f) {
                    let db = bias.then_some(self.span(db).0);
                    let (w, dw, ws) = (self.span(w).0, self.span(dw).0, self.span(|m| m.ws).0);
                    be.conv2d_bwd_fused(&s, x, w, dy, dx.target(), dw, db, ws, f)?;
                    return dx.finish(be);
                }
            }
            (LayerDef::Add { .. }, _) => {
                // The gradient goes on, unchanged, to both inputs.
                let dy = self.flat(|m| m.dacts[i + 1], n_in);
                let to = |d: fn(&Layer) -> Deliver| {
                    let first = d(&self.first().layers[i]);
                    let r = self.flat(
                        |m| match d(&m.layers[i]) {
                            Deliver::Write(r) | Deliver::Add(r) => r,
                            Deliver::None | Deliver::Alias => m.scratch,
                        },
                        n_in,
                    );
                    match first {
                        Deliver::None | Deliver::Alias => Some(None),
                        Deliver::Write(_) | Deliver::Add(_) => r.map(|r| Some((first, r))),
                    }
                };
                if let (Some(dy), Some(a), Some(b)) = (dy, to(|l| l.dsrc), to(|l| l.dother)) {
                    for (deliver, r) in [a, b].into_iter().flatten() {
                        match deliver {
                            Deliver::Add(_) => be.add_assign(r, dy, n_in * n)?,
                            _ => be.copy(dy, r, n_in * n)?,
                        }
                    }
                    return Ok(());
                }
            }
            _ => {}
        }
        for (m, &seed) in self.members.iter().zip(seeds) {
            m.backward_layer(be, i, rows, seed)?;
        }
        Ok(())
    }

    /// Dense layer `i`'s input gradient through the ReLU before it, with the bias gradient of
    /// the dense layer before that ReLU, for every trial: one op when the gradients and the ReLU's
    /// outputs lie one right after another, else one op per trial.
    fn dense_bwd_relu(
        &self,
        be: &mut dyn Backend,
        i: usize,
        rows: usize,
        inputs: usize,
        outputs: usize,
    ) -> Result<(), EngineError> {
        let n = self.trials();
        let src = self.first().layers[i].src;
        let g = GemmShape::nn(rows, inputs, outputs);
        let dx = self.flat(|m| deliver_region(m, i), rows * inputs);
        let y = self.flat(|m| m.acts[src], rows * inputs);
        if let (Some(dx), Some(y)) = (dx, y) {
            let (dy, sdy) = self.span(|m| m.dacts[i + 1]);
            let (w, sw) = self.span(|m| m.layers[i].w);
            let (db, sdb) = self.span(|m| m.layers[i - 2].db);
            let batch = GemmBatch {
                count: n,
                stride_a: sdy,
                stride_b: sw,
                stride_c: rows * inputs,
            };
            let db = BiasGrad {
                db,
                stride: if n > 1 { sdb } else { db.len },
            };
            return be.dense_bwd_relu(g, batch, dy, w, dx, y, db);
        }
        for m in &self.members {
            let db = BiasGrad {
                db: m.layers[i - 2].db,
                stride: m.layers[i - 2].db.len,
            };
            let dx = deliver_region(m, i);
            be.dense_bwd_relu(
                g,
                GemmBatch::one(&g),
                m.dacts[i + 1],
                m.layers[i].w,
                dx,
                m.acts[src],
                db,
            )?;
        }
        Ok(())
    }

    /// One optimizer step of every trial, each with its row of the hyper table (a dead trial's
    /// parameters stay as they are), and the group's step counter advanced.
    fn update(&self, be: &mut dyn Backend) -> Result<(), EngineError> {
        let n = self.trials();
        let whole = |pick: &dyn Fn(&Network) -> Region| self.span(pick).0;
        let (w, g) = (whole(&|m| m.params), whole(&|m| m.grads));
        let v = whole(&|net| match net.opt {
            OptState::Sgd { v } | OptState::Adam { v, .. } => v,
        });
        let u = match self.optimizer {
            Optimizer::Sgd => Update::SgdBatched {
                w,
                g,
                v,
                hyper: self.hyper,
                trials: n,
            },
            Optimizer::Adam => Update::AdamBatched {
                w,
                g,
                m: whole(&|net| match net.opt {
                    OptState::Adam { m, .. } | OptState::Sgd { v: m } => m,
                }),
                v,
                hyper: self.hyper,
                trials: n,
            },
        };
        be.update(u, self.first().counter)
    }
}

/// A trial's row of the hyper table: its rates, live, its dropout seed, and `step0`, the group's
/// counter when it started.
fn hyper_row(h: &Hyper, dropout_seed: u64, step0: u32) -> [f32; HYPER_LEN] {
    let mut row = [0f32; HYPER_LEN];
    let [lo, hi] = seed_bits(dropout_seed);
    row[HYPER_DROPOUT] = h.dropout as f32;
    row[HYPER_SEED_LO] = lo;
    row[HYPER_SEED_HI] = hi;
    row[HYPER_LR] = h.lr as f32;
    row[HYPER_WD] = h.weight_decay as f32;
    row[HYPER_MOMENTUM] = h.momentum as f32;
    // What `Network::update` gives Adam.
    row[HYPER_BETA1] = 0.9;
    row[HYPER_BETA2] = 0.999;
    row[HYPER_EPS] = 1e-8;
    row[HYPER_LIVE] = 1.0;
    row[HYPER_STEP0] = f32::from_bits(step0);
    row
}

/// Where layer `i` of `m` writes its input's gradient (its own region, or the scratch it then
/// adds from).
fn deliver_region(m: &Network, i: usize) -> Region {
    match m.layers[i].dsrc {
        Deliver::Write(r) => r,
        _ => m.scratch,
    }
}

/// Where a layer's input gradient goes over a fused group ([`FusedNetwork::group_dx`]).
#[derive(Clone, Copy, Debug)]
enum GroupDx {
    /// Nowhere: the input has no gradient.
    None,
    /// Written into this region, every trial's copy one after another.
    Write(Region),
    /// Written into the group's scratch, then added into `into`, laid out alike.
    Add { scratch: Region, into: Region },
}

impl GroupDx {
    /// The region the layer's op writes the gradient into.
    fn target(&self) -> Option<Region> {
        match *self {
            GroupDx::None => None,
            GroupDx::Write(r) => Some(r),
            GroupDx::Add { scratch, .. } => Some(scratch),
        }
    }

    /// Adds the gradient where it is added rather than written: one add over the group.
    fn finish(&self, be: &mut dyn Backend) -> Result<(), EngineError> {
        match *self {
            GroupDx::Add { scratch, into } => be.add_assign(into, scratch, scratch.len),
            _ => Ok(()),
        }
    }
}

/// Maps a single trial's regions to trial `i`'s copies in the fused arena.
struct Mapper {
    trials: usize,
    /// The single plan's entries with a length, by offset.
    entries: Vec<Region>,
    /// The gradient block, mapped region by region.
    gradients: Option<Region>,
    counter: Region,
}

impl Mapper {
    fn new(single: &Network, trials: usize) -> Mapper {
        let mut entries: Vec<Region> = single
            .plan
            .entries
            .iter()
            .filter(|e| e.region.len > 0)
            .map(|e| e.region)
            .collect();
        entries.sort_by_key(|r| r.offset);
        let gradients = single
            .plan
            .entries
            .iter()
            .find(|e| e.name == GRADIENT_BLOCK)
            .map(|e| e.region);
        Mapper {
            trials,
            entries,
            gradients,
            counter: single.counter,
        }
    }

    /// Trial `i`'s copy of `r`.
    fn region(&self, r: Region, i: usize) -> Result<Region, String> {
        if r.len == 0 {
            return Ok(Region::new(r.offset * self.trials, 0));
        }
        if r == self.counter {
            // One counter for the group.
            return Ok(Region::new(r.offset * self.trials, r.len));
        }
        if self
            .gradients
            .is_some_and(|g| g.offset <= r.offset && r.end() <= g.end())
        {
            return Ok(Region::new(r.offset * self.trials + i * r.len, r.len));
        }
        let at = self.entries.partition_point(|e| e.offset <= r.offset);
        let e = at
            .checked_sub(1)
            .map(|k| self.entries[k])
            .filter(|e| r.end() <= e.end())
            .ok_or_else(|| format!("region {r:?} lies in no tensor of the plan"))?;
        Ok(Region::new(
            e.offset * self.trials + i * e.len + (r.offset - e.offset),
            r.len,
        ))
    }

    /// Trial `i`'s network: `single` with every region mapped, and dropout rate `p`.
    fn member(&self, single: &Network, i: usize, p: f32) -> Result<Network, String> {
        let map = |r: Region| self.region(r, i);
        let deliver = |d: Deliver| -> Result<Deliver, String> {
            Ok(match d {
                Deliver::Write(r) => Deliver::Write(map(r)?),
                Deliver::Add(r) => Deliver::Add(map(r)?),
                d => d,
            })
        };
        let mut m = single.clone();
        for l in &mut m.layers {
            for r in [
                &mut l.w,
                &mut l.b,
                &mut l.dw,
                &mut l.db,
                &mut l.running,
                &mut l.saved,
            ] {
                *r = map(*r)?;
            }
            l.dsrc = deliver(l.dsrc)?;
            l.dother = deliver(l.dother)?;
            if let LayerDef::Dropout { .. } = l.def {
                l.def = LayerDef::Dropout { p };
            }
        }
        for r in m.acts.iter_mut().chain(m.dacts.iter_mut()) {
            *r = map(*r)?;
        }
        for r in [
            &mut m.scratch,
            &mut m.ws,
            &mut m.labels,
            &mut m.stats,
            &mut m.test_stats,
            &mut m.params,
            &mut m.grads,
            &mut m.counter,
        ] {
            *r = map(*r)?;
        }
        m.opt = match m.opt {
            OptState::Sgd { v } => OptState::Sgd { v: map(v)? },
            OptState::Adam { m: am, v } => OptState::Adam {
                m: map(am)?,
                v: map(v)?,
            },
        };
        Ok(m)
    }
}
