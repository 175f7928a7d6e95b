//! A network over a Backend: a graph of layers planned into one arena, forward, backward and the optimiser step.
//!
//! Layers form a graph in topological order: layer `i` reads value `src` (value 0 is the input
//! batch, value `i + 1` is layer `i`'s output), and an [`LayerDef::Add`] also reads value `other`.
//! A chain of layers (MLP, CNN) is the graph where layer `i` reads value `i`.
//!
//! Every forward value keeps its own region (backward reads them). Gradients of values live only
//! from the step that first writes them to the step that consumes them, so they share one block
//! laid out by liveness; a gradient reaching a value by a second path (a residual's shortcut) is
//! added into it.

use crate::engine::{
    AdamParams, Backend, BiasGrad, BnParams, Conv2dShape, DropoutMask, GemmBatch, GemmShape,
    PlaneShape, PoolShape, Region, SgdParams, Split, Update,
};
use crate::error::EngineError;
use crate::rng::{derive, HostRng};

use super::memplan::MemoryPlan;

#[cfg(test)]
mod graph_tests;
mod placement;
pub mod side_by_side;

pub use side_by_side::FusedNetwork;

/// The plan entry holding the gradients of values, laid out by liveness.
const GRADIENT_BLOCK: &str = "activation gradients";

/// The most `f32` values a memory plan may hold in its parameters, or in its activations
/// (2^40, 4 TiB: more than any device has); every size of a plan is a product of the batch
/// and a layer's length, checked against it before any is computed.
pub const MAX_PLAN_ELEMENTS: usize = 1 << 40;

/// One layer as a model describes it (per sample; the batch comes later).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LayerDef {
    /// `y = x·Wᵀ + b`, W stored `[outputs, inputs]` as PyTorch does.
    Dense {
        inputs: usize,
        outputs: usize,
    },
    /// Convolution of one sample (`n == 1`; `with_n` gives a batch's). With a bias, weights start
    /// as PyTorch's default; without one (it would be cancelled by a following batch norm), as
    /// torchvision's ResNet: Kaiming normal, fan-out, gain √2.
    Conv {
        shape: Conv2dShape,
        bias: bool,
    },
    Relu,
    /// Max-pooling of one sample (`n == 1`).
    MaxPool(PoolShape),
    /// Inverted dropout, active in training only.
    Dropout {
        p: f32,
    },
    /// Batch normalisation of one sample's `c` planes of `hw` (`n == 1`); γ starts at 1, β at 0.
    BatchNorm(PlaneShape),
    /// The mean of each of one sample's `c` planes of `hw` (`n == 1`): `c` outputs.
    GlobalAvgPool(PlaneShape),
    /// `y = value[src] + value[other]`, of equal lengths: a residual connection.
    Add {
        other: usize,
    },
}

impl LayerDef {
    /// The second value a residual add reads; `None` for every other layer.
    fn other(&self) -> Option<usize> {
        match *self {
            LayerDef::Add { other } => Some(other),
            _ => None,
        }
    }
}

/// A layer and the value it reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Node {
    pub def: LayerDef,
    /// The value this layer reads: 0 for the input batch, `j + 1` for layer `j`'s output.
    pub src: usize,
}

/// The graph of a chain of layers, each reading the previous one's output.
pub fn chain(defs: &[LayerDef]) -> Vec<Node> {
    defs.iter()
        .enumerate()
        .map(|(i, &def)| Node { def, src: i })
        .collect()
}

/// How a layer's backward step delivers the gradient of one value it reads.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Deliver {
    /// The value is the network input: nothing to deliver.
    None,
    /// The first gradient to reach the value: written straight into its region.
    Write(Region),
    /// A later one: written into the scratch region, then added into the value's gradient.
    Add(Region),
    /// A residual add passing its gradient on unchanged to a value no one else reads: the value's
    /// gradient is the add's own region.
    Alias,
}

#[derive(Clone, Debug)]
struct Layer {
    def: LayerDef,
    /// The value read (an add also reads `def.other()`).
    src: usize,
    /// Elements per sample of the layer's (first) input and its output.
    in_len: usize,
    out_len: usize,
    /// Weights (γ for batch norm), bias (β) and their gradients; empty when absent.
    w: Region,
    b: Region,
    dw: Region,
    db: Region,
    /// How the weights start.
    init: Init,
    /// Batch norm: running `[mean; c] ++ [var; c]` and the batch's saved `[mean; c] ++ [invstd; c]`.
    running: Region,
    saved: Region,
    /// Where the backward step puts the gradient of `src` and of `other`.
    dsrc: Deliver,
    dother: Deliver,
    /// Work of this layer done by another layer's op, or of another layer done by this one's.
    fold: Fold,
}

/// Which layers' work is folded into fewer ops (see `placement::fold_layers`): a dense layer with the
/// ReLU after it (`dense_fwd`), a dense layer's input gradient with the ReLU before it and that
/// ReLU's dense layer's bias gradient (`dense_bwd_relu`), and the last dense layer's bias gradient
/// with the loss (`softmax_xent_bias`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Fold {
    /// Dense: applies the ReLU that follows it, writing the ReLU's output.
    relu_fwd: bool,
    /// ReLU: applied by the dense layer before it.
    by_dense_fwd: bool,
    /// Dense: its input gradient goes through the ReLU before it, and gives the bias gradient of
    /// the dense layer before that ReLU.
    relu_bwd: bool,
    /// ReLU: its gradient is computed by the dense layer after it.
    by_dense_bwd: bool,
    /// Dense: its bias gradient is computed by a later op (the loss, or the dense layer after
    /// its ReLU).
    bias_grad_elsewhere: bool,
    /// Dense, the last layer: its bias gradient comes with the loss.
    bias_grad_in_loss: bool,
}

/// How a layer's parameters start.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Init {
    None,
    /// PyTorch's default for dense and biased conv layers: `U(±1/√fan_in)` for weights and bias.
    Uniform {
        fan_in: usize,
    },
    /// torchvision's ResNet convolutions: `N(0, 2/fan_out)`, no bias.
    KaimingFanOut {
        fan_out: usize,
    },
    /// Batch norm: γ = 1, β = 0.
    Affine,
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
    /// The gradient of each value at the step that reads it (regions of the liveness block may be
    /// shared by values whose gradients are never alive at once); empty for the input.
    dacts: Vec<Region>,
    /// Scratch for a layer's input gradient that must be added to one already there.
    scratch: Region,
    /// Convolution lowering scratch, shared by every convolution (they run one at a time).
    ws: Region,
    pub labels: Region,
    /// The training sums `[Σ loss, #correct]` of the epoch so far.
    pub stats: Region,
    /// The test sums of an evaluation, right after [`Network::stats`] (one read takes both).
    pub test_stats: Region,
    pub params: Region,
    grads: Region,
    opt: OptState,
    /// The step counter (see [`crate::engine::COUNTER_LEN`]).
    pub counter: Region,
    /// Rows of the global batch before this network's (a data-parallel replica's shard offset):
    /// its dropout masks are those rows' part of the mask of the whole batch. 0 elsewhere.
    pub first_row: usize,
}

impl Network {
    /// The dropout mask of layer `layer`, whose rows have `row_len` elements, from this
    /// network's first row of the global batch.
    fn dropout_mask(&self, p: f32, seed: u64, layer: usize, row_len: usize) -> DropoutMask {
        DropoutMask {
            p,
            seed,
            counter: self.counter,
            layer: layer as u32,
            first: (self.first_row * row_len) as u64,
        }
    }

    /// The input batch region (`batch × sample_len`).
    pub fn input(&self) -> Region {
        self.acts[0]
    }

    /// Number of trainable parameters.
    pub fn param_count(&self) -> usize {
        self.layers.iter().map(|l| l.w.len + l.b.len).sum()
    }

    /// The gradient of every parameter, one block in the same layout as [`Network::params`].
    pub fn grads(&self) -> Region {
        self.grads
    }

    /// Writes initial weights (see [`LayerDef`] for each layer's rule), zeros in the gradient and
    /// optimiser blocks, and batch norm's running statistics at mean 0, variance 1.
    /// The step counter starts at 0.
    pub fn init(&mut self, be: &mut dyn Backend, seed: u64) -> Result<(), EngineError> {
        self.init_weights(be, seed)?;
        be.write(
            self.counter,
            &[f32::from_bits(0); crate::engine::COUNTER_LEN],
        )
    }

    /// [`Network::init`] but for the step counter, which stays as it is: a fused group's member
    /// restarts in its slot this way while the group's one counter goes on.
    pub fn init_weights(&mut self, be: &mut dyn Backend, seed: u64) -> Result<(), EngineError> {
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
            match l.init {
                Init::None => {}
                Init::Uniform { fan_in } => {
                    let bound = 1.0 / (fan_in as f32).sqrt();
                    for r in [l.w, l.b] {
                        let vals: Vec<f32> =
                            (0..r.len).map(|_| rng.uniform_f32(-bound, bound)).collect();
                        be.write(r, &vals)?;
                    }
                }
                Init::KaimingFanOut { fan_out } => {
                    let std = (2.0 / fan_out as f64).sqrt();
                    let vals: Vec<f32> =
                        (0..l.w.len).map(|_| (rng.normal() * std) as f32).collect();
                    be.write(l.w, &vals)?;
                }
                Init::Affine => {
                    be.fill(l.w, 1.0)?;
                    be.fill(l.b, 0.0)?;
                    let c = l.running.len / 2;
                    be.fill(l.running.prefix(c), 0.0)?;
                    be.fill(Region::new(l.running.offset + c, c), 1.0)?;
                }
            }
        }
        Ok(())
    }

    /// Runs the layers on the first `rows` samples of the input batch; returns the logits region.
    /// `train` enables dropout, whose mask depends on `(seed, step counter, layer)`, and batch
    /// statistics in batch norm (which then updates its running ones).
    pub fn forward(
        &self,
        be: &mut dyn Backend,
        rows: usize,
        train: bool,
        seed: u64,
    ) -> Result<Region, EngineError> {
        for i in 0..self.layers.len() {
            self.forward_layer(be, i, rows, train, seed)?;
        }
        Ok(self.logits())
    }

    /// Runs layer `i` of [`Network::forward`].
    fn forward_layer(
        &self,
        be: &mut dyn Backend,
        i: usize,
        rows: usize,
        train: bool,
        seed: u64,
    ) -> Result<(), EngineError> {
        let l = &self.layers[i];
        let (x, y) = (self.acts[l.src], self.acts[i + 1]);
        match l.def {
            LayerDef::Dense { inputs, outputs } => {
                let g = GemmShape {
                    trans_b: true,
                    ..GemmShape::nn(rows, outputs, inputs)
                };
                // With the ReLU after it folded in, the output is the ReLU's.
                let y = if l.fold.relu_fwd { self.acts[i + 2] } else { y };
                be.dense_fwd(g, GemmBatch::one(&g), x, l.w, y, l.b, 0, l.fold.relu_fwd)?;
            }
            LayerDef::Relu if l.fold.by_dense_fwd => {}
            LayerDef::Conv { shape, bias } => {
                let b = bias.then_some(l.b);
                be.conv2d_fwd(&shape.with_n(rows), x, l.w, b, y, self.ws)?;
            }
            LayerDef::Relu => be.relu_fwd(x, y, rows * l.out_len)?,
            LayerDef::MaxPool(p) => be.maxpool_fwd(&p.with_n(rows), x, y)?,
            LayerDef::Dropout { p } => {
                let p = if train { p } else { 0.0 };
                let mask = self.dropout_mask(p, seed, i, l.out_len);
                be.dropout_fwd(x, y, rows * l.out_len, mask)?;
            }
            LayerDef::BatchNorm(p) => {
                let bn = BnParams {
                    train,
                    ..BnParams::default()
                };
                let s = p.with_n(rows);
                be.batchnorm_fwd(&s, x, l.w, l.b, l.running, l.saved, y, bn)?;
            }
            LayerDef::GlobalAvgPool(p) => be.avgpool_fwd(&p.with_n(rows), x, y)?,
            LayerDef::Add { other } => {
                be.add(x, self.acts[other], y, rows * l.out_len)?;
            }
        }
        Ok(())
    }

    fn logits(&self) -> Region {
        self.acts[self.layers.len()]
    }

    /// Loss and its gradient on the logits; adds `[Σ loss, #correct]` into the stats region
    /// (and, when the last layer is dense, writes its bias gradient too).
    pub fn loss(&self, be: &mut dyn Backend, rows: usize) -> Result<(), EngineError> {
        let last = self.layers.len();
        let (logits, dlogits) = (self.acts[last], self.dacts[last]);
        match self.layers.last() {
            Some(l) if l.fold.bias_grad_in_loss => {
                let db = BiasGrad {
                    db: l.db,
                    stride: self.classes,
                };
                be.softmax_xent_bias(
                    logits,
                    self.labels,
                    dlogits,
                    self.stats,
                    rows,
                    self.classes,
                    1,
                    db,
                )
            }
            _ => be.softmax_xent(logits, self.labels, dlogits, self.stats, rows, self.classes),
        }
    }

    /// One evaluation batch: samples `start..start + rows` of the test split gathered into the
    /// input, the forward pass over the whole batch (rows past `rows` hold earlier samples and are
    /// not counted: every batch then runs the same shapes), and the first `rows` rows' loss and
    /// correct predictions added into [`Network::test_stats`].
    pub fn eval_batch(
        &self,
        be: &mut dyn Backend,
        start: usize,
        rows: usize,
    ) -> Result<(), EngineError> {
        be.gather(Split::Test, start, rows, self.input(), self.labels)?;
        let logits = self.forward(be, self.batch, false, 0)?;
        be.eval_xent(logits, self.labels, self.test_stats, rows, self.classes)
    }

    /// The training sums, then the test sums: the region one read takes both from.
    pub fn epoch_stats(&self) -> Region {
        Region::new(self.stats.offset, self.stats.len + self.test_stats.len)
    }

    /// Backpropagates from the logits' gradient into every parameter gradient.
    pub fn backward(
        &self,
        be: &mut dyn Backend,
        rows: usize,
        seed: u64,
    ) -> Result<(), EngineError> {
        for i in (0..self.layers.len()).rev() {
            self.backward_layer(be, i, rows, seed)?;
        }
        Ok(())
    }

    /// Runs layer `i` of [`Network::backward`].
    fn backward_layer(
        &self,
        be: &mut dyn Backend,
        i: usize,
        rows: usize,
        seed: u64,
    ) -> Result<(), EngineError> {
        let l = &self.layers[i];
        let (x, y, dy) = (self.acts[l.src], self.acts[i + 1], self.dacts[i + 1]);
        let n_in = rows * l.in_len;
        // Where this layer writes its input's gradient, and what to add afterwards.
        let (dx, then_add) = match l.dsrc {
            Deliver::None | Deliver::Alias => (None, None),
            Deliver::Write(r) => (Some(r), None),
            Deliver::Add(r) => (Some(self.scratch), Some(r)),
        };
        match l.def {
            LayerDef::Dense { inputs, outputs } => {
                let gw = GemmShape {
                    trans_a: true,
                    ..GemmShape::nn(outputs, inputs, rows)
                };
                be.gemm(gw, dy, x, l.dw)?;
                if !l.fold.bias_grad_elsewhere {
                    be.bias_grad(dy, l.db, rows, outputs)?;
                }
                if let Some(dx) = dx {
                    let g = GemmShape::nn(rows, inputs, outputs);
                    match self.relu_before(i) {
                        // Through the ReLU before, with its dense layer's bias gradient.
                        Some(db) => be.dense_bwd_relu(g, GemmBatch::one(&g), dy, l.w, dx, x, db)?,
                        None => be.gemm(g, dy, l.w, dx)?,
                    }
                }
            }
            LayerDef::Conv { shape, bias } => {
                let db = bias.then_some(l.db);
                be.conv2d_bwd(&shape.with_n(rows), x, l.w, dy, dx, l.dw, db, self.ws)?;
            }
            LayerDef::Relu => {
                if let Some(dx) = dx {
                    be.relu_bwd(y, dy, dx, n_in)?;
                }
            }
            LayerDef::MaxPool(p) => {
                if let Some(dx) = dx {
                    be.maxpool_bwd(&p.with_n(rows), x, y, dy, dx)?;
                }
            }
            LayerDef::Dropout { p } => {
                if let Some(dx) = dx {
                    let mask = self.dropout_mask(p, seed, i, l.in_len);
                    be.dropout_bwd(dy, dx, n_in, mask)?;
                }
            }
            LayerDef::BatchNorm(p) => {
                // γ and β need the pass even when the input (the network's) has no gradient.
                let dx = dx.unwrap_or(self.scratch);
                let s = p.with_n(rows);
                be.batchnorm_bwd(&s, x, l.w, l.saved, dy, dx, l.dw, l.db)?;
            }
            LayerDef::GlobalAvgPool(p) => {
                if let Some(dx) = dx {
                    be.avgpool_bwd(&p.with_n(rows), dy, dx)?;
                }
            }
            LayerDef::Add { .. } => {
                for d in [l.dsrc, l.dother] {
                    match d {
                        Deliver::Write(r) => be.copy(dy, r, n_in)?,
                        Deliver::Add(r) => be.add_assign(r, dy, n_in)?,
                        Deliver::None | Deliver::Alias => {}
                    }
                }
            }
        }
        if let (Some(r), false) = (then_add, matches!(l.def, LayerDef::Add { .. })) {
            be.add_assign(r, self.scratch, n_in)?;
        }
        Ok(())
    }

    /// For a dense layer `i` whose input gradient goes through the ReLU before it, the bias
    /// gradient of the dense layer before that ReLU.
    fn relu_before(&self, i: usize) -> Option<BiasGrad> {
        let l = &self.layers[i];
        if !l.fold.relu_bwd || i < 2 {
            return None;
        }
        let prev = &self.layers[i - 2];
        Some(BiasGrad {
            db: prev.db,
            stride: prev.db.len,
        })
    }

    /// One training step on the device: gather batch `count % steps_per_epoch` of the epoch's
    /// order, forward, loss, backward, optimiser, and advance the step counter. Every argument is
    /// the same from step to step, so the whole step can be captured once as a graph.
    pub fn train_step(
        &self,
        be: &mut dyn Backend,
        steps_per_epoch: usize,
        seed: u64,
        h: &super::Hyper,
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
        be.update(self.update(h), self.counter)
    }

    /// One optimiser step over the whole parameter block (Adam's `t` comes from the step counter).
    pub fn update(&self, h: &super::Hyper) -> Update {
        let (w, g) = (self.params, self.grads);
        match self.opt {
            OptState::Sgd { v } => Update::Sgd {
                w,
                g,
                v,
                p: SgdParams {
                    lr: h.lr as f32,
                    momentum: h.momentum as f32,
                    weight_decay: h.weight_decay as f32,
                },
            },
            OptState::Adam { m, v } => Update::Adam {
                w,
                g,
                m,
                v,
                p: AdamParams {
                    lr: h.lr as f32,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay: h.weight_decay as f32,
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::build;
    use crate::models::{MemKind, Optimizer};
    use crate::models::{ModelKind, ModelSpec};

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
