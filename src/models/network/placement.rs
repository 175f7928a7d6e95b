//! Planning a network: the graph checked, its sizes bounded, and every tensor of training placed in one memory plan, gradients of values by liveness.

use super::{Deliver, Fold, Init, Layer, LayerDef, Network, Node, OptState, MAX_PLAN_ELEMENTS};
use crate::engine::{Conv2dShape, Region, COUNTER_LEN, STATS_LEN};
use crate::models::memplan::{MemKind, MemoryPlan, ALIGN};
use crate::models::Optimizer;

/// Elements per sample of a layer's output, checking that its input has the length it expects.
fn out_len(def: &LayerDef, in_len: usize) -> Result<usize, String> {
    let expect = |what: String, want: usize| {
        if want == in_len {
            Ok(())
        } else {
            Err(format!("{what} expects {want} inputs, gets {in_len}"))
        }
    };
    Ok(match *def {
        LayerDef::Dense { inputs, outputs } => {
            expect("dense layer".into(), inputs)?;
            outputs
        }
        LayerDef::Conv { shape: c, .. } => {
            if !c.fits() {
                return Err(format!(
                    "a {}×{} convolution with stride {} and padding {} does not fit a {}×{} input",
                    c.k, c.k, c.stride, c.pad, c.h, c.w
                ));
            }
            expect(
                format!("conv layer ({}×{}×{})", c.c_in, c.h, c.w),
                c.x_len(),
            )?;
            c.y_len()
        }
        LayerDef::MaxPool(p) => {
            if !p.fits() {
                return Err(format!(
                    "a {}×{} max-pool with stride {} and padding {} does not fit a {}×{} input",
                    p.k, p.k, p.stride, p.pad, p.h, p.w
                ));
            }
            expect(format!("max-pool ({}×{}×{})", p.c, p.h, p.w), p.x_len())?;
            p.y_len()
        }
        LayerDef::BatchNorm(p) => {
            expect(format!("batch norm ({}×{})", p.c, p.hw), p.len())?;
            in_len
        }
        LayerDef::GlobalAvgPool(p) => {
            expect(format!("global average pool ({}×{})", p.c, p.hw), p.len())?;
            p.c
        }
        LayerDef::Relu | LayerDef::Dropout { .. } | LayerDef::Add { .. } => in_len,
    })
}

/// First-fit placement of gradient buffers by liveness: offsets relative to the block's start.
#[derive(Default)]
struct Liveness {
    /// Live buffers: `(offset, len, references)`.
    live: Vec<(usize, usize, usize)>,
    peak: usize,
}

impl Liveness {
    /// Places a buffer of `len` elements where no live buffer is; returns its offset.
    fn alloc(&mut self, len: usize) -> usize {
        let mut spans: Vec<(usize, usize)> = self.live.iter().map(|&(o, l, _)| (o, l)).collect();
        spans.sort_unstable();
        let mut at = 0;
        for (o, l) in spans {
            if at + len <= o {
                break;
            }
            at = at.max((o + l).div_ceil(ALIGN) * ALIGN);
        }
        self.live.push((at, len, 1));
        self.peak = self.peak.max(at + len);
        at
    }
    fn retain(&mut self, offset: usize) {
        if let Some(b) = self.live.iter_mut().find(|b| b.0 == offset) {
            b.2 += 1;
        }
    }
    fn release(&mut self, offset: usize) {
        if let Some(i) = self.live.iter().position(|b| b.0 == offset) {
            self.live[i].2 -= 1;
            if self.live[i].2 == 0 {
                self.live.swap_remove(i);
            }
        }
    }
}

/// The values of a checked graph: value 0 is the input, value `i + 1` layer `i`'s output.
struct Values {
    /// Elements per sample of each value.
    lens: Vec<usize>,
    /// How many layers read each value.
    readers: Vec<usize>,
}

/// Checks that every layer reads only values already computed, that adds add equal lengths of
/// two different values, and that each layer fits its input; returns the values' lengths and
/// readers.
fn trace_values(nodes: &[Node], sample_len: usize, batch: usize) -> Result<Values, String> {
    let mut lens = vec![sample_len];
    let mut readers = vec![0usize; nodes.len() + 1];
    for (i, n) in nodes.iter().enumerate() {
        let other = n.def.other();
        for v in std::iter::once(n.src).chain(other) {
            if v > i {
                return Err(format!(
                    "layer {i} reads value {v}, which is not computed yet"
                ));
            }
            readers[v] += 1;
        }
        if let Some(o) = other {
            if o == n.src {
                return Err(format!("layer {i} adds value {o} to itself"));
            }
            if lens[o] != lens[n.src] {
                return Err(format!(
                    "layer {i} adds values of {} and {} elements",
                    lens[n.src], lens[o]
                ));
            }
        }
        let out = out_len(&n.def, lens[n.src]).map_err(|e| format!("layer {i}: {e}"))?;
        if let LayerDef::BatchNorm(p) = n.def {
            if batch * p.hw < 2 {
                return Err(format!(
                    "layer {i}: batch norm over 1×1 planes needs a batch of at least 2"
                ));
            }
        }
        lens.push(out);
    }
    Ok(Values { lens, readers })
}

/// Checks that every layer's output is used and that the last layer gives one output a class.
fn check_outputs(values: &Values, layers: usize, classes: usize) -> Result<(), String> {
    if let Some(v) = (1..layers).find(|&v| values.readers[v] == 0) {
        return Err(format!("the output of layer {} is never used", v - 1));
    }
    if values.lens[layers] != classes {
        return Err(format!(
            "the last layer has {} outputs for {classes} classes",
            values.lens[layers]
        ));
    }
    Ok(())
}

/// Weights and biases of a layer, or `None` when their count overflows.
fn weight_count(def: &LayerDef) -> Option<usize> {
    match *def {
        LayerDef::Dense { inputs, outputs } => inputs
            .checked_mul(outputs)
            .and_then(|w| w.checked_add(outputs)),
        LayerDef::Conv { shape: c, .. } => c
            .c_out
            .checked_mul(c.c_in)
            .and_then(|w| w.checked_mul(c.k.checked_mul(c.k)?))
            .and_then(|w| w.checked_add(c.c_out)),
        LayerDef::BatchNorm(p) => p.c.checked_mul(4),
        _ => Some(0),
    }
}

/// Checks that the parameters, and a batch's values, are at most [`MAX_PLAN_ELEMENTS`] each.
/// Every size planned later is a product of the batch, a layer's length or its weights: bounded
/// here with checked arithmetic, none of them can overflow.
fn check_bounds(nodes: &[Node], lens: &[usize], batch: usize) -> Result<(), String> {
    let params = nodes.iter().try_fold(0usize, |a, n| {
        a.checked_add(weight_count(&n.def)?.checked_add(ALIGN)?)
    });
    let values = lens
        .iter()
        .try_fold(0usize, |a, &l| a.checked_add(l))
        .and_then(|per_sample| per_sample.checked_mul(batch));
    match (params, values) {
        (Some(p), Some(v)) if p <= MAX_PLAN_ELEMENTS && v <= MAX_PLAN_ELEMENTS => Ok(()),
        _ => Err(format!(
            "a batch of {batch} of this model is more than a memory plan may hold \
             ({MAX_PLAN_ELEMENTS} values)"
        )),
    }
}

/// The layers with their parameters laid out in one block (each tensor aligned inside it, so one
/// optimiser call covers all), at offsets relative to the block; and the block's length.
fn lay_out_layers(nodes: &[Node], lens: &[usize]) -> (Vec<Layer>, usize) {
    let mut param_len = 0usize;
    let mut take = |n: usize| {
        let off = param_len.div_ceil(ALIGN) * ALIGN;
        param_len = off + n;
        Region::new(off, n)
    };
    let mut layers = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let none = Region::default();
        let (w, b, init) = match n.def {
            LayerDef::Dense { inputs, outputs } => (
                take(inputs * outputs),
                take(outputs),
                Init::Uniform { fan_in: inputs },
            ),
            LayerDef::Conv { shape: c, bias } => {
                let w = take(c.w_len());
                if bias {
                    let fan_in = c.c_in * c.k * c.k;
                    (w, take(c.c_out), Init::Uniform { fan_in })
                } else {
                    let fan_out = c.c_out * c.k * c.k;
                    (w, none, Init::KaimingFanOut { fan_out })
                }
            }
            LayerDef::BatchNorm(p) => (take(p.c), take(p.c), Init::Affine),
            _ => (none, none, Init::None),
        };
        layers.push(Layer {
            def: n.def,
            src: n.src,
            in_len: lens[n.src],
            out_len: lens[i + 1],
            w,
            b,
            dw: w,
            db: b,
            init,
            running: none,
            saved: none,
            dsrc: Deliver::None,
            dother: Deliver::None,
            fold: Fold::default(),
        });
    }
    (layers, param_len)
}

/// Marks the layers whose work another layer's op does ([`Fold`]): a ReLU right after a dense
/// layer, read by nothing else, is applied by the dense layer's op; when a dense layer reads that
/// ReLU's output alone, its input gradient goes through the ReLU in its own op, with the bias
/// gradient of the dense layer before the ReLU; and the last layer's bias gradient, when it is
/// dense, comes with the loss.
fn fold_layers(layers: &mut [Layer], readers: &[usize]) {
    let dense = |l: &Layer| matches!(l.def, LayerDef::Dense { .. });
    for i in 0..layers.len() {
        let relu_next = layers.get(i + 1).is_some_and(|r| {
            matches!(r.def, LayerDef::Relu) && r.src == i + 1 && readers[i + 1] == 1
        });
        if !dense(&layers[i]) || !relu_next {
            continue;
        }
        layers[i].fold.relu_fwd = true;
        layers[i + 1].fold.by_dense_fwd = true;
        let dense_after = layers
            .get(i + 2)
            .is_some_and(|d| dense(d) && d.src == i + 2 && readers[i + 2] == 1);
        if dense_after {
            layers[i + 2].fold.relu_bwd = true;
            layers[i + 1].fold.by_dense_bwd = true;
            layers[i].fold.bias_grad_elsewhere = true;
        }
    }
    if let Some(last) = layers.last_mut() {
        if dense(last) {
            last.fold.bias_grad_elsewhere = true;
            last.fold.bias_grad_in_loss = true;
        }
    }
}

/// The parameter, gradient and optimiser-state blocks added to `plan`, and every layer's
/// parameters and their gradients moved into them.
fn place_parameters(
    plan: &mut MemoryPlan,
    layers: &mut [Layer],
    param_len: usize,
    optimizer: Optimizer,
) -> (Region, Region, OptState) {
    let params = plan.add("params", MemKind::Params, param_len);
    let grads = plan.add("grads", MemKind::Grads, param_len);
    let opt = match optimizer {
        Optimizer::Sgd => OptState::Sgd {
            v: plan.add("sgd.momentum", MemKind::OptState, param_len),
        },
        Optimizer::Adam => OptState::Adam {
            m: plan.add("adam.m", MemKind::OptState, param_len),
            v: plan.add("adam.v", MemKind::OptState, param_len),
        },
    };
    let shift = |r: Region, base: Region| {
        if r.len == 0 {
            r
        } else {
            Region::new(base.offset + r.offset, r.len)
        }
    };
    for l in layers.iter_mut() {
        (l.dw, l.db) = (shift(l.w, grads), shift(l.b, grads));
        (l.w, l.b) = (shift(l.w, params), shift(l.b, params));
    }
    (params, grads, opt)
}

/// Batch norm's statistics, every value of a batch (the input first) and the convolutions'
/// shared workspace added to `plan`; returns the values' regions and the workspace.
fn place_values(
    plan: &mut MemoryPlan,
    layers: &mut [Layer],
    batch: usize,
    sample_len: usize,
    ws_len: &dyn Fn(&Conv2dShape) -> usize,
) -> (Vec<Region>, Region) {
    for (i, l) in layers.iter_mut().enumerate() {
        if let LayerDef::BatchNorm(p) = l.def {
            l.running = plan.add(format!("layer{i}.running"), MemKind::Params, 2 * p.c);
            l.saved = plan.add(format!("layer{i}.saved"), MemKind::Activations, 2 * p.c);
        }
    }
    let mut acts = vec![plan.add("input", MemKind::Activations, batch * sample_len)];
    for (i, l) in layers.iter().enumerate() {
        acts.push(plan.add(
            format!("layer{i}.out"),
            MemKind::Activations,
            batch * l.out_len,
        ));
    }
    let ws_need = layers
        .iter()
        .filter_map(|l| match l.def {
            LayerDef::Conv { shape, .. } => Some(ws_len(&shape.with_n(batch))),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let ws = plan.add("conv workspace", MemKind::Workspace, ws_need);
    (acts, ws)
}

/// The gradients of values, planned by liveness with offsets relative to one block.
struct GradientPlan {
    /// Each value's gradient buffer (`None` for the input).
    buf: Vec<Option<usize>>,
    /// The block's length.
    peak: usize,
    /// The scratch a gradient added into one already there needs.
    scratch_len: usize,
    /// How layer `i` delivers the gradients of `src` and `other`, in backward order.
    deliveries: Vec<(usize, Deliver, Deliver)>,
}

/// Walks the backward pass: a value's gradient is born when the first layer reading it (the last
/// in forward order) delivers it, and dies once its own layer has run backward.
fn plan_gradients(
    layers: &[Layer],
    values: &Values,
    batch: usize,
    sample_len: usize,
) -> Result<GradientPlan, String> {
    let (lens, readers) = (&values.lens, &values.readers);
    let mut live = Liveness::default();
    let mut buf: Vec<Option<usize>> = vec![None; layers.len() + 1];
    let last = layers.len();
    buf[last] = Some(live.alloc(batch * lens[last]));
    let mut scratch_len = 0;
    let mut deliveries = Vec::new();
    for (i, l) in layers.iter().enumerate().rev() {
        if l.src == 0 && matches!(l.def, LayerDef::BatchNorm(_)) {
            scratch_len = scratch_len.max(batch * sample_len);
        }
        let v = i + 1;
        let dy = buf[v].ok_or_else(|| format!("layer {i} gets no gradient"))?;
        let mut plan_one = |s: usize, buf: &mut Vec<Option<usize>>| -> Deliver {
            if s == 0 {
                return Deliver::None;
            }
            let len = batch * lens[s];
            match buf[s] {
                // A ReLU whose gradient the dense layer after it computes: the gradient of its
                // input is the one that layer writes, in the same buffer.
                None if l.fold.by_dense_bwd => {
                    live.retain(dy);
                    buf[s] = Some(dy);
                    Deliver::Alias
                }
                None if l.def.other().is_some() && readers[s] == 1 => {
                    live.retain(dy);
                    buf[s] = Some(dy);
                    Deliver::Alias
                }
                None => {
                    let at = live.alloc(len);
                    buf[s] = Some(at);
                    Deliver::Write(Region::new(at, len))
                }
                Some(at) => {
                    if l.def.other().is_none() {
                        scratch_len = scratch_len.max(len);
                    }
                    Deliver::Add(Region::new(at, len))
                }
            }
        };
        let dsrc = plan_one(l.src, &mut buf);
        let dother = l
            .def
            .other()
            .map_or(Deliver::None, |o| plan_one(o, &mut buf));
        deliveries.push((i, dsrc, dother));
        live.release(dy);
    }
    Ok(GradientPlan {
        buf,
        peak: live.peak,
        scratch_len,
        deliveries,
    })
}

/// The gradient block and its scratch added to `plan`, and the layers' deliveries moved into it;
/// returns each value's gradient region and the scratch.
fn place_gradients(
    plan: &mut MemoryPlan,
    layers: &mut [Layer],
    grads: GradientPlan,
    lens: &[usize],
    batch: usize,
) -> (Vec<Region>, Region) {
    let block = plan.add(super::GRADIENT_BLOCK, MemKind::Activations, grads.peak);
    let scratch = plan.add("gradient scratch", MemKind::Workspace, grads.scratch_len);
    let place = |r: Region| Region::new(block.offset + r.offset, r.len);
    let deliver = |d: Deliver| match d {
        Deliver::Write(r) => Deliver::Write(place(r)),
        Deliver::Add(r) => Deliver::Add(place(r)),
        d => d,
    };
    for (i, dsrc, dother) in grads.deliveries {
        layers[i].dsrc = deliver(dsrc);
        layers[i].dother = deliver(dother);
    }
    let mut dacts = vec![Region::default(); layers.len() + 1];
    for (v, b) in grads.buf.iter().enumerate().skip(1) {
        if let Some(at) = b {
            dacts[v] = place(Region::new(*at, batch * lens[v]));
        }
    }
    (dacts, scratch)
}

impl Network {
    /// Plans a chain of layers: see [`Network::graph`].
    pub fn new(
        defs: &[LayerDef],
        input: [usize; 3],
        classes: usize,
        batch: usize,
        optimizer: Optimizer,
        ws_len: &dyn Fn(&Conv2dShape) -> usize,
    ) -> Result<Network, String> {
        Self::graph(
            &super::chain(defs),
            input,
            classes,
            batch,
            optimizer,
            ws_len,
        )
    }

    /// Plans every tensor of training the graph `nodes` on batches of `batch` samples of shape
    /// `input` (at most [`MAX_PLAN_ELEMENTS`] values of parameters, and of activations); `ws_len` gives the backend's convolution scratch for a batch's shape.
    pub fn graph(
        nodes: &[Node],
        input: [usize; 3],
        classes: usize,
        batch: usize,
        optimizer: Optimizer,
        ws_len: &dyn Fn(&Conv2dShape) -> usize,
    ) -> Result<Network, String> {
        if batch == 0 {
            return Err("batch size must be at least 1".into());
        }
        if nodes.is_empty() {
            return Err("a network needs at least one layer".into());
        }
        let sample_len: usize = input.iter().product();
        let values = trace_values(nodes, sample_len, batch)?;
        check_outputs(&values, nodes.len(), classes)?;
        check_bounds(nodes, &values.lens, batch)?;

        let (mut layers, param_len) = lay_out_layers(nodes, &values.lens);
        fold_layers(&mut layers, &values.readers);
        let mut plan = MemoryPlan::default();
        let (params, grads, opt) = place_parameters(&mut plan, &mut layers, param_len, optimizer);
        let (acts, ws) = place_values(&mut plan, &mut layers, batch, sample_len, ws_len);
        let gradients = plan_gradients(&layers, &values, batch, sample_len)?;
        let (dacts, scratch) =
            place_gradients(&mut plan, &mut layers, gradients, &values.lens, batch);
        let labels = plan.add("labels", MemKind::Activations, batch);
        // The training sums, then the test sums right after them: one read takes both.
        let stats = plan.add("stats", MemKind::Workspace, STATS_LEN);
        let test_stats = plan.add_next("test stats", MemKind::Workspace, STATS_LEN);
        let counter = plan.add("step counter", MemKind::Workspace, COUNTER_LEN);
        Ok(Network {
            layers,
            plan,
            batch,
            classes,
            sample_len,
            acts,
            dacts,
            scratch,
            ws,
            labels,
            stats,
            test_stats,
            params,
            grads,
            opt,
            counter,
            first_row: 0,
        })
    }
}
