//! A feed-forward network over a Backend: layers planned into one arena, forward, backward and the optimiser step.

use crate::engine::rng::{derive, HostRng};
use crate::engine::{
    AdamParams, Backend, Conv2dShape, GemmShape, PoolShape, Region, SgdParams, COUNTER_LEN,
    STATS_LEN,
};
use crate::error::EngineError;
use crate::job::Optimizer;

use super::memplan::{MemKind, MemoryPlan, ALIGN};

/// One layer as a model describes it (per sample; the batch comes later).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LayerDef {
    /// `y = x·Wᵀ + b`, W stored `[outputs, inputs]` as PyTorch does.
    Dense {
        inputs: usize,
        outputs: usize,
    },
    /// Stride-1 convolution of one sample (`n == 1`; `with_n` gives a batch's).
    Conv(Conv2dShape),
    Relu,
    /// `k×k` max-pooling with stride `k` of one sample (`n == 1`).
    MaxPool(PoolShape),
    /// Inverted dropout, active in training only.
    Dropout {
        p: f32,
    },
}

#[derive(Clone, Debug)]
struct Layer {
    def: LayerDef,
    /// Elements per sample of the layer's input and output.
    in_len: usize,
    out_len: usize,
    /// Weights, bias and their gradients (dense and conv).
    w: Region,
    b: Region,
    dw: Region,
    db: Region,
    /// Fan-in for initialisation.
    fan_in: usize,
    /// im2col scratch (conv).
    ws: Region,
}

/// Optimiser state regions.
#[derive(Clone, Copy, Debug)]
enum OptState {
    Sgd { v: Region },
    Adam { m: Region, v: Region },
}

/// A planned network: every region it uses, for one batch size.
#[derive(Clone, Debug)]
pub struct Network {
    layers: Vec<Layer>,
    pub plan: MemoryPlan,
    pub batch: usize,
    pub classes: usize,
    pub sample_len: usize,
    /// `acts[0]` is the input batch; `acts[i+1]` the output of layer `i`.
    acts: Vec<Region>,
    /// Gradients of `acts[i]` for `i ≥ 1`.
    dacts: Vec<Region>,
    pub labels: Region,
    pub stats: Region,
    pub params: Region,
    grads: Region,
    opt: OptState,
    /// The step counter (see [`crate::engine::COUNTER_LEN`]).
    pub counter: Region,
}

fn out_len(def: &LayerDef, in_len: usize) -> Result<usize, String> {
    Ok(match *def {
        LayerDef::Dense { inputs, outputs } => {
            if inputs != in_len {
                return Err(format!(
                    "dense layer expects {inputs} inputs, gets {in_len}"
                ));
            }
            outputs
        }
        LayerDef::Conv(c) => {
            if c.x_len() != in_len {
                return Err(format!(
                    "conv layer expects {}×{}×{} inputs, gets {in_len}",
                    c.c_in, c.h, c.w
                ));
            }
            c.y_len()
        }
        LayerDef::MaxPool(p) => {
            if p.x_len() != in_len {
                return Err(format!(
                    "max-pool expects {}×{}×{} inputs, gets {in_len}",
                    p.c, p.h, p.w
                ));
            }
            p.y_len()
        }
        LayerDef::Relu | LayerDef::Dropout { .. } => in_len,
    })
}

impl Network {
    /// Plans every tensor of training `defs` on batches of `batch` samples of shape `input`.
    pub fn new(
        defs: &[LayerDef],
        input: [usize; 3],
        classes: usize,
        batch: usize,
        optimizer: Optimizer,
        ws_len: &dyn Fn(&Conv2dShape) -> usize,
    ) -> Result<Network, String> {
        if batch == 0 {
            return Err("batch size must be at least 1".into());
        }
        let sample_len: usize = input.iter().product();
        // Parameters first: one block, each tensor aligned inside it, so one optimiser call covers all.
        let mut layers = Vec::new();
        let mut param_len = 0usize;
        let mut width = sample_len;
        let mut take = |n: usize| {
            let off = param_len.div_ceil(ALIGN) * ALIGN;
            param_len = off + n;
            Region::new(off, n)
        };
        for def in defs {
            let out = out_len(def, width)?;
            let (w, b, fan_in) = match *def {
                LayerDef::Dense { inputs, outputs } => {
                    (take(inputs * outputs), take(outputs), inputs)
                }
                LayerDef::Conv(c) => (take(c.w_len()), take(c.c_out), c.c_in * c.k * c.k),
                _ => (Region::default(), Region::default(), 0),
            };
            layers.push(Layer {
                def: *def,
                in_len: width,
                out_len: out,
                w,
                b,
                dw: w,
                db: b,
                fan_in,
                ws: Region::default(),
            });
            width = out;
        }
        if width != classes {
            return Err(format!(
                "the last layer has {width} outputs for {classes} classes"
            ));
        }
        let mut plan = MemoryPlan::default();
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
        let shift = |r: Region, base: Region| Region::new(base.offset + r.offset, r.len);
        for l in &mut layers {
            (l.dw, l.db) = (shift(l.w, grads), shift(l.b, grads));
            (l.w, l.b) = (shift(l.w, params), shift(l.b, params));
        }
        let mut acts = vec![plan.add("input", MemKind::Activations, batch * sample_len)];
        let mut dacts = vec![Region::default()];
        for (i, l) in layers.iter_mut().enumerate() {
            acts.push(plan.add(
                format!("layer{i}.out"),
                MemKind::Activations,
                batch * l.out_len,
            ));
            dacts.push(plan.add(
                format!("layer{i}.grad"),
                MemKind::Activations,
                batch * l.out_len,
            ));
            if let LayerDef::Conv(c) = l.def {
                let s = c.with_n(batch);
                l.ws = plan.add(format!("layer{i}.im2col"), MemKind::Workspace, ws_len(&s));
            }
        }
        let labels = plan.add("labels", MemKind::Activations, batch);
        let stats = plan.add("stats", MemKind::Workspace, STATS_LEN);
        let counter = plan.add("step counter", MemKind::Workspace, COUNTER_LEN);
        Ok(Network {
            layers,
            plan,
            batch,
            classes,
            sample_len,
            acts,
            dacts,
            labels,
            stats,
            params,
            grads,
            opt,
            counter,
        })
    }

    /// The input batch region (`batch × sample_len`).
    pub fn input(&self) -> Region {
        self.acts[0]
    }

    /// Number of trainable parameters.
    pub fn param_count(&self) -> usize {
        self.layers.iter().map(|l| l.w.len + l.b.len).sum()
    }

    /// Writes initial weights: PyTorch's default, `U(±1/√fan_in)` for weights and biases; zeros
    /// elsewhere in the arena's parameter and optimiser blocks.
    pub fn init(&mut self, be: &mut dyn Backend, seed: u64) -> Result<(), EngineError> {
        let mut rng = HostRng::new(derive(seed, 1));
        for r in [self.params, self.grads] {
            be.fill(r, 0.0)?;
        }
        match self.opt {
            OptState::Sgd { v } => be.fill(v, 0.0)?,
            OptState::Adam { m, v } => {
                be.fill(m, 0.0)?;
                be.fill(v, 0.0)?;
            }
        }
        for l in &self.layers {
            if l.fan_in == 0 {
                continue;
            }
            let bound = 1.0 / (l.fan_in as f32).sqrt();
            for r in [l.w, l.b] {
                let vals: Vec<f32> = (0..r.len).map(|_| rng.uniform_f32(-bound, bound)).collect();
                be.write(r, &vals)?;
            }
        }
        be.write(self.counter, &[f32::from_bits(0)])?;
        Ok(())
    }

    /// Runs the layers on the first `rows` samples of the input batch; returns the logits region.
    /// `train` enables dropout, whose mask depends on `(seed, step counter, layer)`.
    pub fn forward(
        &self,
        be: &mut dyn Backend,
        rows: usize,
        train: bool,
        seed: u64,
    ) -> Result<Region, EngineError> {
        for (i, l) in self.layers.iter().enumerate() {
            let (x, y) = (self.acts[i], self.acts[i + 1]);
            match l.def {
                LayerDef::Dense { inputs, outputs } => {
                    let g = GemmShape {
                        trans_b: true,
                        ..GemmShape::nn(rows, outputs, inputs)
                    };
                    be.gemm(g, x, l.w, y)?;
                    be.bias_add(y, l.b, rows, outputs)?;
                }
                LayerDef::Conv(c) => {
                    be.conv2d_fwd(&c.with_n(rows), x, l.w, l.b, y, l.ws)?;
                }
                LayerDef::Relu => be.relu_fwd(x, y, rows * l.out_len)?,
                LayerDef::MaxPool(p) => be.maxpool_fwd(&p.with_n(rows), x, y)?,
                LayerDef::Dropout { p } => {
                    let p = if train { p } else { 0.0 };
                    be.dropout_fwd(x, y, rows * l.out_len, p, seed, self.counter, i as u32)?;
                }
            }
        }
        Ok(self.logits())
    }

    fn logits(&self) -> Region {
        self.acts[self.layers.len()]
    }

    /// Loss and its gradient on the logits; adds `[Σ loss, #correct]` into the stats region.
    pub fn loss(&self, be: &mut dyn Backend, rows: usize) -> Result<(), EngineError> {
        let last = self.layers.len();
        be.softmax_xent(
            self.acts[last],
            self.labels,
            self.dacts[last],
            self.stats,
            rows,
            self.classes,
        )
    }

    /// Backpropagates from the logits' gradient into every parameter gradient.
    pub fn backward(
        &self,
        be: &mut dyn Backend,
        rows: usize,
        seed: u64,
    ) -> Result<(), EngineError> {
        for (i, l) in self.layers.iter().enumerate().rev() {
            let (x, y, dy) = (self.acts[i], self.acts[i + 1], self.dacts[i + 1]);
            let dx = (i > 0).then(|| self.dacts[i]);
            match l.def {
                LayerDef::Dense { inputs, outputs } => {
                    let gw = GemmShape {
                        trans_a: true,
                        ..GemmShape::nn(outputs, inputs, rows)
                    };
                    be.gemm(gw, dy, x, l.dw)?;
                    be.bias_grad(dy, l.db, rows, outputs)?;
                    if let Some(dx) = dx {
                        be.gemm(GemmShape::nn(rows, inputs, outputs), dy, l.w, dx)?;
                    }
                }
                LayerDef::Conv(c) => {
                    be.conv2d_bwd(&c.with_n(rows), x, l.w, dy, dx, l.dw, l.db, l.ws)?;
                }
                LayerDef::Relu => {
                    if let Some(dx) = dx {
                        be.relu_bwd(y, dy, dx, rows * l.out_len)?;
                    }
                }
                LayerDef::MaxPool(p) => {
                    if let Some(dx) = dx {
                        be.maxpool_bwd(&p.with_n(rows), x, y, dy, dx)?;
                    }
                }
                LayerDef::Dropout { p } => {
                    if let Some(dx) = dx {
                        be.dropout_bwd(dy, dx, rows * l.in_len, p, seed, self.counter, i as u32)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// One training step on the device: gather batch `count % steps_per_epoch` of the epoch's
    /// order, forward, loss, backward, optimiser, and advance the step counter. Every argument is
    /// the same from step to step, so the whole step can be captured once as a graph.
    pub fn train_step(
        &self,
        be: &mut dyn Backend,
        steps_per_epoch: usize,
        seed: u64,
        h: &crate::job::Hyper,
    ) -> Result<(), EngineError> {
        be.gather_train(
            self.counter,
            steps_per_epoch,
            self.batch,
            self.input(),
            self.labels,
        )?;
        self.forward(be, self.batch, true, seed)?;
        self.loss(be, self.batch)?;
        self.backward(be, self.batch, seed)?;
        self.update(be, h)?;
        be.advance(self.counter)
    }

    /// One optimiser step over the whole parameter block (Adam's `t` comes from the step counter).
    pub fn update(&self, be: &mut dyn Backend, h: &crate::job::Hyper) -> Result<(), EngineError> {
        match self.opt {
            OptState::Sgd { v } => be.sgd_step(
                self.params,
                self.grads,
                v,
                SgdParams {
                    lr: h.lr as f32,
                    momentum: h.momentum as f32,
                    weight_decay: h.weight_decay as f32,
                },
            ),
            OptState::Adam { m, v } => be.adam_step(
                self.params,
                self.grads,
                m,
                v,
                AdamParams {
                    lr: h.lr as f32,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay: h.weight_decay as f32,
                },
                self.counter,
            ),
        }
    }

    /// The gradient block (one region for every parameter, laid out as [`Network::params`]).
    pub fn grads(&self) -> Region {
        self.grads
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{ModelKind, ModelSpec};
    use crate::models::build;

    const CPU_WS: fn(&Conv2dShape) -> usize = |s| s.ws_len();

    #[test]
    fn the_default_mlp_has_the_known_parameter_count() {
        let n = build(
            &ModelSpec::of(ModelKind::Mlp),
            [1, 28, 28],
            10,
            64,
            0.0,
            Optimizer::Adam,
            &CPU_WS,
        )
        .unwrap();
        assert_eq!(n.param_count(), 784 * 128 + 128 + 128 * 10 + 10);
        assert!(n.plan.bytes_of(MemKind::OptState) >= 2 * 4 * n.param_count());
    }

    #[test]
    fn the_default_cnn_matches_the_keras_example() {
        let n = build(
            &ModelSpec::of(ModelKind::Cnn),
            [1, 28, 28],
            10,
            32,
            0.25,
            Optimizer::Sgd,
            &CPU_WS,
        )
        .unwrap();
        // conv 1→32 3×3, conv 32→64 3×3, dense 9216→128, dense 128→10.
        let expect = (32 * 9 + 32) + (64 * 32 * 9 + 64) + (9216 * 128 + 128) + (128 * 10 + 10);
        assert_eq!(n.param_count(), expect);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let defs = [LayerDef::Dense {
            inputs: 10,
            outputs: 3,
        }];
        assert!(Network::new(&defs, [1, 2, 5], 2, 4, Optimizer::Sgd, &CPU_WS).is_err());
        assert!(Network::new(&defs, [1, 3, 3], 3, 4, Optimizer::Sgd, &CPU_WS).is_err());
        assert!(Network::new(&defs, [1, 2, 5], 3, 0, Optimizer::Sgd, &CPU_WS).is_err());
    }
}
