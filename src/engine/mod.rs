//! The `Backend` interface that every engine implements: one arena per trial and the ops that train in it.
//!
//! A trial's tensors all live in one arena of `f32` elements, allocated once from its slice's capped
//! pool before step 0 (the static memory plan of [`crate::models`]). Ops name their operands by
//! [`Region`]s of that arena, so the same model code drives the CPU reference backend and the CUDA one.

pub mod contract;
mod counted;
pub mod cpu;
pub mod cuda;
pub mod fused_hyper;
pub mod options;
pub mod shapes;

use crate::error::EngineError;
pub use counted::{Counted, OpCounts};
pub use cuda::CaptureHold;
pub use options::{ConvEngine, EngineOptions};

/// What a thread that drives a backend holds while it trains: on the CPU backend, its
/// flush-to-zero mode (see `cpu::denormals`); on a GPU, nothing.
pub type ThreadGuard = cpu::denormals::FlushGuard;

/// The guard of a thread that drives all of `backends` (the leader of a mirrored training).
pub fn thread_guard_of<'a>(backends: impl IntoIterator<Item = &'a dyn Backend>) -> ThreadGuard {
    ThreadGuard::when(backends.into_iter().any(|b| b.kind() == BackendKind::Cpu))
}
pub use shapes::{
    BnParams, Conv2dShape, FusedConv, FusedNorm, GemmBatch, GemmShape, PlaneShape, PoolShape,
    Window,
};

/// A span of `f32` elements inside a trial's arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
pub struct Region {
    pub offset: usize,
    pub len: usize,
}

impl Region {
    pub fn new(offset: usize, len: usize) -> Self {
        Region { offset, len }
    }
    pub fn end(&self) -> usize {
        self.offset + self.len
    }
    /// The first `len` elements of this region.
    pub fn prefix(&self, len: usize) -> Region {
        Region {
            offset: self.offset,
            len: len.min(self.len),
        }
    }
    pub fn overlaps(&self, other: &Region) -> bool {
        self.len > 0 && other.len > 0 && self.offset < other.end() && other.offset < self.end()
    }
}

/// Which engine runs a trial.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Cpu,
    Cuda,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        })
    }
}

/// Which part of the resident dataset a gather reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Test,
}

/// SGD with momentum (PyTorch's form: v = μv + g + λw; w -= lr·v).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdParams {
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
}

/// Adam (Kingma & Ba, with PyTorch's bias correction; L2 weight decay added to the gradient).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamParams {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

/// Graphs a backend keeps at once: the training step's (slot 0) and a training's evaluation
/// batches, in at most `GRAPH_SLOTS − 1` chunks.
pub const GRAPH_SLOTS: usize = 33;

/// Training statistics accumulated on the device by [`Backend::softmax_xent`]: `[loss_sum, correct]`.
pub const STATS_LEN: usize = 2;

/// The step counter: arena elements holding `u32`s (their bits, not float values). The first
/// counts the training steps taken. Ops that change from step to step (the batch gathered, the
/// dropout mask, Adam's bias correction) read it on the device, so one captured CUDA graph
/// replays every step. [`Backend::advance`] adds one at the end of each step, or
/// [`Backend::update`] does as its last act. The second is the device's scratch ticket for that
/// (the blocks of an optimizer step count themselves done on it, and the last one advances the
/// count); it is 0 between ops.
pub const COUNTER_LEN: usize = 2;

/// One optimizer step, of a trial or of a fused group, for [`Backend::update`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Update {
    /// [`Backend::sgd_step`].
    Sgd {
        w: Region,
        g: Region,
        v: Region,
        p: SgdParams,
    },
    /// [`Backend::adam_step`] (its `t` from the step counter given to `update`).
    Adam {
        w: Region,
        g: Region,
        m: Region,
        v: Region,
        p: AdamParams,
    },
    /// [`Backend::sgd_step_batched`].
    SgdBatched {
        w: Region,
        g: Region,
        v: Region,
        hyper: Region,
        trials: usize,
    },
    /// [`Backend::adam_step_batched`].
    AdamBatched {
        w: Region,
        g: Region,
        m: Region,
        v: Region,
        hyper: Region,
        trials: usize,
    },
}

/// The bias gradient an op computes on the side: trial `i`'s `Σ_r` of its output rows goes to
/// `db` at `i·stride` (`stride ≥` the columns when there are several trials).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BiasGrad {
    pub db: Region,
    pub stride: usize,
}

/// Which dropout mask an op applies: the mask of `layer` at the step the counter holds, drawn
/// with `seed`, of which the op's element `i` is element `first + i`. A data-parallel replica
/// whose shard starts at row `o` of the global batch sets `first` to `o` × the row's length, so
/// the replicas together apply the mask one slice would apply to the whole batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutMask {
    /// The drop probability (0: the op is a copy).
    pub p: f32,
    pub seed: u64,
    /// The step counter ([`COUNTER_LEN`]).
    pub counter: Region,
    pub layer: u32,
    pub first: u64,
}

/// The dropout stream of `layer` at step `count`: the `counter` argument of [`crate::rng::uniform`].
#[inline]
pub fn dropout_stream(count: u32, layer: u32) -> u64 {
    ((count as u64) << 16) | layer as u64
}

/// One trial's engine: its arena, its resident data, and the ops over them.
///
/// Every op checks that its regions lie inside the arena and that written regions do not overlap
/// the ones read. Ops run in issue order on the trial's stream; [`Backend::read`] synchronises.
pub trait Backend: Send {
    fn kind(&self) -> BackendKind;

    /// The guard a thread holds for as long as it drives this backend ([`ThreadGuard`]):
    /// taken by every training loop, so that it needs to know nothing of the backend's modes.
    fn thread_guard(&self) -> ThreadGuard {
        ThreadGuard::when(self.kind() == BackendKind::Cpu)
    }

    /// Allocates the trial's arena of `elems` `f32` from its slice's pool, once.
    /// Fails with [`EngineError::CapExceeded`] when it does not fit under the cap.
    fn alloc_arena(&mut self, elems: usize) -> Result<(), EngineError>;
    /// Bytes allocated for this trial (the arena; resident data is shared and not counted).
    fn allocated_bytes(&self) -> usize;

    fn write(&mut self, dst: Region, src: &[f32]) -> Result<(), EngineError>;
    fn read(&mut self, src: Region, dst: &mut [f32]) -> Result<(), EngineError>;
    fn fill(&mut self, dst: Region, value: f32) -> Result<(), EngineError>;

    /// Number of samples in a split of the resident dataset.
    fn split_len(&self, split: Split) -> usize;
    /// Elements of one sample of the resident dataset.
    fn sample_len(&self) -> usize;
    /// Sets the order in which the training split is visited this epoch (a permutation).
    fn set_train_order(&mut self, order: &[u32]) -> Result<(), EngineError>;
    /// Gathers samples `start..start+rows` (in the epoch's order for `Train`, in file order for
    /// `Test`) into `x` (rows × sample length) and their labels, as `f32`, into `y` (rows).
    fn gather(
        &mut self,
        split: Split,
        start: usize,
        rows: usize,
        x: Region,
        y: Region,
    ) -> Result<(), EngineError>;
    /// Gathers training batch number `count % steps_per_epoch` of the epoch's order, where
    /// `count` is read from the step counter: samples `start..start+batch` with
    /// `start = (count % steps_per_epoch)·batch`.
    fn gather_train(
        &mut self,
        counter: Region,
        steps_per_epoch: usize,
        batch: usize,
        x: Region,
        y: Region,
    ) -> Result<(), EngineError>;
    /// [`Backend::gather_train`] for a fused group of `trials` trials, each from its own order:
    /// `orders` holds `trials` permutations of the training split one after another (trial `i`'s
    /// starts `i·n_train` elements in), each element a `u32` stored as the bits of an `f32`
    /// (written with `f32::from_bits`). Trial `i`'s batch `count % steps_per_epoch` (count read
    /// from the step counter) goes into `x` at `i·batch·sample_len` and its labels into `y` at
    /// `i·batch`. Each trial gathers what `gather_train` gathers after `set_train_order` with its
    /// order.
    #[allow(clippy::too_many_arguments)]
    fn gather_train_fused(
        &mut self,
        counter: Region,
        orders: Region,
        steps_per_epoch: usize,
        batch: usize,
        x: Region,
        y: Region,
        trials: usize,
    ) -> Result<(), EngineError>;
    /// Adds one to the step counter.
    fn advance(&mut self, counter: Region) -> Result<(), EngineError>;
    /// Elements of convolution workspace the backend needs for `s` (the CPU lowers one sample at a
    /// time; a GPU lowers the whole batch).
    fn conv_workspace_len(&self, s: &Conv2dShape) -> usize {
        s.ws_len()
    }
    /// Elements of convolution workspace each trial of a fused group needs for `s` (at least
    /// [`Backend::conv_workspace_len`]): a GPU may lower the group's convolutions together.
    fn fused_conv_workspace_len(&self, s: &Conv2dShape) -> usize {
        self.conv_workspace_len(s)
    }

    /// Row-major `C = alpha·op(A)·op(B) + beta·C`.
    fn gemm(&mut self, g: GemmShape, a: Region, b: Region, c: Region) -> Result<(), EngineError>;
    /// [`Backend::gemm`] over a batch: `C_i = alpha·op(A_i)·op(B_i) + beta·C_i` for
    /// `i < batch.count`, where `X_i` starts `i·stride_x` elements into region `X` (a stride of 0
    /// shares the operand). Each GEMM computes what [`Backend::gemm`] computes on its operands.
    fn gemm_batched(
        &mut self,
        g: GemmShape,
        batch: GemmBatch,
        a: Region,
        b: Region,
        c: Region,
    ) -> Result<(), EngineError>;
    /// `y[r, c] += bias[c]` for `rows × cols`.
    fn bias_add(
        &mut self,
        y: Region,
        bias: Region,
        rows: usize,
        cols: usize,
    ) -> Result<(), EngineError>;
    /// `db[c] = Σ_r dy[r, c]`.
    fn bias_grad(
        &mut self,
        dy: Region,
        db: Region,
        rows: usize,
        cols: usize,
    ) -> Result<(), EngineError>;
    /// [`Backend::bias_add`] over a fused group of `trials` trials: trial `i`'s `rows × cols`
    /// block of `y` starts `i·rows·cols` elements in, and its bias `i·bias_stride` elements into
    /// `bias` (`bias_stride ≥ cols` when there are several trials). Each trial computes what
    /// [`Backend::bias_add`] computes on its operands.
    fn bias_add_fused(
        &mut self,
        y: Region,
        bias: Region,
        rows: usize,
        cols: usize,
        trials: usize,
        bias_stride: usize,
    ) -> Result<(), EngineError>;
    /// [`Backend::bias_grad`] over a fused group of `trials` trials: trial `i`'s `rows × cols`
    /// block of `dy` starts `i·rows·cols` elements in, and its gradient `i·db_stride` elements
    /// into `db` (`db_stride ≥ cols` when there are several trials; the elements between the
    /// trials' gradients are left as they are). Each trial computes what [`Backend::bias_grad`]
    /// computes on its operands.
    fn bias_grad_fused(
        &mut self,
        dy: Region,
        db: Region,
        rows: usize,
        cols: usize,
        trials: usize,
        db_stride: usize,
    ) -> Result<(), EngineError>;
    /// `y = max(x, 0)` on the first `len` elements.
    fn relu_fwd(&mut self, x: Region, y: Region, len: usize) -> Result<(), EngineError>;
    /// `dx = dy · [y > 0]`.
    fn relu_bwd(
        &mut self,
        y: Region,
        dy: Region,
        dx: Region,
        len: usize,
    ) -> Result<(), EngineError>;
    /// Convolution, NCHW, weights `[c_out, c_in, k, k]`, with a bias `[c_out]` when `b` is given;
    /// `ws` holds [`Backend::conv_workspace_len`] elements of lowering scratch.
    fn conv2d_fwd(
        &mut self,
        s: &Conv2dShape,
        x: Region,
        w: Region,
        b: Option<Region>,
        y: Region,
        ws: Region,
    ) -> Result<(), EngineError>;
    /// Gradients of the convolution: `dw` is overwritten; `db` and `dx` too when given.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<(), EngineError>;
    /// [`Backend::conv2d_fwd`] over a fused group (see [`FusedConv`]): `s` is one trial's
    /// convolution; trial `i`'s `x` and `y` start `i·x_len` and `i·y_len` elements in, its `w`
    /// and `b` `i·w_stride` elements into `w` and `b`, its workspace `i·ws_stride` elements into
    /// `ws` (at least [`Backend::conv_workspace_len`] with several trials). Each trial computes
    /// what [`Backend::conv2d_fwd`] computes on its operands.
    #[allow(clippy::too_many_arguments)]
    fn conv2d_fwd_fused(
        &mut self,
        s: &Conv2dShape,
        x: Region,
        w: Region,
        b: Option<Region>,
        y: Region,
        ws: Region,
        f: FusedConv,
    ) -> Result<(), EngineError>;
    /// [`Backend::conv2d_bwd`] over a fused group, laid out as in
    /// [`Backend::conv2d_fwd_fused`] (`dx` as `x`, `dy` as `y`, `dw` and `db` as `w` and `b`).
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<(), EngineError>;
    /// Batch normalisation per channel (see `cpu::ops::batchnorm_fwd`): `running` holds
    /// `[mean; c] ++ [var; c]`, `saved` receives `[mean; c] ++ [1/√(var+eps); c]` in training.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<(), EngineError>;
    /// Gradients of training-mode batch normalisation: overwrites `dx`, `dgamma` and `dbeta`.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<(), EngineError>;
    /// [`Backend::batchnorm_fwd`] for every trial of a fused group laid out as [`FusedNorm`]
    /// says: `x` and `y` span every trial's copy, the other regions run from trial 0's to the last
    /// trial's. Each trial computes what [`Backend::batchnorm_fwd`] computes on its operands.
    #[allow(clippy::too_many_arguments)]
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
        let op = "batchnorm_fwd_fused";
        let planes = [("x", x), ("y", y)];
        let params = [("gamma", gamma), ("beta", beta)];
        contract::fused_norm(op, s, f, &planes, &params, Some(running), saved)?;
        for i in 0..f.trials {
            let [x, gamma, beta, running, saved, y] =
                f.fwd_trial(s, [x, gamma, beta, running, saved, y], i);
            self.batchnorm_fwd(s, x, gamma, beta, running, saved, y, p)?;
        }
        Ok(())
    }
    /// [`Backend::batchnorm_bwd`] for every trial of a fused group, laid out as in
    /// [`Backend::batchnorm_fwd_fused`] (`dy` and `dx` as `x`, `dgamma` and `dbeta` as `gamma`).
    #[allow(clippy::too_many_arguments)]
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
        let op = "batchnorm_bwd_fused";
        let planes = [("x", x), ("dy", dy), ("dx", dx)];
        let params = [("gamma", gamma), ("dgamma", dgamma), ("dbeta", dbeta)];
        contract::fused_norm(op, s, f, &planes, &params, None, saved)?;
        for i in 0..f.trials {
            let [x, gamma, saved, dy, dx, dgamma, dbeta] =
                f.bwd_trial(s, [x, gamma, saved, dy, dx, dgamma, dbeta], i);
            self.batchnorm_bwd(s, x, gamma, saved, dy, dx, dgamma, dbeta)?;
        }
        Ok(())
    }
    /// Global average pooling: `y[n, c]` is the mean of plane `(n, c)`.
    fn avgpool_fwd(&mut self, s: &PlaneShape, x: Region, y: Region) -> Result<(), EngineError>;
    /// `dx[n, c, :] = dy[n, c] / hw`.
    fn avgpool_bwd(&mut self, s: &PlaneShape, dy: Region, dx: Region) -> Result<(), EngineError>;
    /// `y = a + b` over `len` elements (a residual connection).
    fn add(&mut self, a: Region, b: Region, y: Region, len: usize) -> Result<(), EngineError>;
    /// `y += x` over `len` elements (a gradient reaching a tensor by a second path).
    fn add_assign(&mut self, y: Region, x: Region, len: usize) -> Result<(), EngineError>;
    /// `y = x` over `len` elements.
    fn copy(&mut self, x: Region, y: Region, len: usize) -> Result<(), EngineError>;
    fn maxpool_fwd(&mut self, s: &PoolShape, x: Region, y: Region) -> Result<(), EngineError>;
    fn maxpool_bwd(
        &mut self,
        s: &PoolShape,
        x: Region,
        y: Region,
        dy: Region,
        dx: Region,
    ) -> Result<(), EngineError>;
    /// Inverted dropout with a counter-based mask: element `i` is dropped when
    /// `crate::rng::uniform(seed, dropout_stream(count, layer), first + i) < p`, else scaled by
    /// `1/(1-p)`, where `count` is read from the step counter.
    fn dropout_fwd(
        &mut self,
        x: Region,
        y: Region,
        len: usize,
        mask: DropoutMask,
    ) -> Result<(), EngineError>;
    /// The gradient of [`Backend::dropout_fwd`] with the same mask.
    fn dropout_bwd(
        &mut self,
        dy: Region,
        dx: Region,
        len: usize,
        mask: DropoutMask,
    ) -> Result<(), EngineError>;
    /// Dropout over a fused group, forward or backward alike: trial `i`'s `len` elements at
    /// `i·len` of `src` go to `dst` through the mask of its row of the hyper table `hyper` (its
    /// rate [`fused_hyper::HYPER_DROPOUT`] and its seed, [`fused_hyper::seed_bits`]), the step counter's
    /// count, `layer` and `first`, as [`Backend::dropout_fwd`] applies a [`DropoutMask`]. Each
    /// trial computes what `dropout_fwd` (or `dropout_bwd`) computes with its own mask.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<(), EngineError>;
    /// Softmax cross-entropy over `rows × classes` logits and `f32` labels. Writes
    /// `dlogits = (softmax − onehot)/rows` and adds `[Σ loss, #correct]` into `stats`.
    fn softmax_xent(
        &mut self,
        logits: Region,
        labels: Region,
        dlogits: Region,
        stats: Region,
        rows: usize,
        classes: usize,
    ) -> Result<(), EngineError>;
    /// [`Backend::softmax_xent`] over a fused group of `trials` trials, each operand's copies one
    /// right after another: trial `i`'s logits and dlogits start `i·rows·classes` elements in,
    /// its labels `i·rows` and its stats `i·STATS_LEN`. Each trial computes what
    /// [`Backend::softmax_xent`] computes on its operands (dlogits scaled by `1/rows`, its own
    /// stats).
    #[allow(clippy::too_many_arguments)]
    fn softmax_xent_fused(
        &mut self,
        logits: Region,
        labels: Region,
        dlogits: Region,
        stats: Region,
        rows: usize,
        classes: usize,
        trials: usize,
    ) -> Result<(), EngineError>;
    /// Counts correct predictions (and sums the loss) without a gradient: adds into `stats`.
    fn eval_xent(
        &mut self,
        logits: Region,
        labels: Region,
        stats: Region,
        rows: usize,
        classes: usize,
    ) -> Result<(), EngineError>;
    fn sgd_step(
        &mut self,
        w: Region,
        g: Region,
        v: Region,
        p: SgdParams,
    ) -> Result<(), EngineError>;
    /// Adam with bias correction for step `t = count + 1`, `count` read from the step counter.
    #[allow(clippy::too_many_arguments)]
    fn adam_step(
        &mut self,
        w: Region,
        g: Region,
        m: Region,
        v: Region,
        p: AdamParams,
        counter: Region,
    ) -> Result<(), EngineError>;
    /// [`Backend::sgd_step`] over a fused group of `trials` trials of `w.len / trials`
    /// parameters each (trial `i`'s at `i·P` in `w`, `g` and `v`), each with the lr, momentum and
    /// weight decay of its row of the hyper table `hyper` ([`fused_hyper`]); a trial whose `live` is 0
    /// is left untouched. Each trial computes what [`Backend::sgd_step`] computes.
    fn sgd_step_batched(
        &mut self,
        w: Region,
        g: Region,
        v: Region,
        hyper: Region,
        trials: usize,
    ) -> Result<(), EngineError>;
    /// [`Backend::adam_step`] over a fused group, as [`Backend::sgd_step_batched`] is over
    /// [`Backend::sgd_step`]: one shared step counter, each trial's lr, betas, eps and weight
    /// decay from its row of `hyper`.
    #[allow(clippy::too_many_arguments)]
    fn adam_step_batched(
        &mut self,
        w: Region,
        g: Region,
        m: Region,
        v: Region,
        hyper: Region,
        trials: usize,
        counter: Region,
    ) -> Result<(), EngineError>;
    /// A dense layer over a batch of `batch.count` trials, as one op:
    /// `y_i = op(x_i)·op(w_i)` ([`Backend::gemm_batched`] with `g`), then trial `i`'s bias
    /// (at `i·bias_stride` in `bias`) added to each of its `g.m` rows of `g.n`, then, with
    /// `relu`, `y = max(y, 0)`. Trial `i`'s `y` lies at `i·g.m·g.n` (`batch.stride_c` is that
    /// length). Each trial computes what `gemm`, `bias_add` and `relu_fwd` compute in turn.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<(), EngineError>;
    /// The input gradient of a dense layer whose input came out of a ReLU, with that ReLU's
    /// gradient and the bias gradient of the layer before it, as one op: `dx_i = op(dy_i)·op(w_i)`
    /// ([`Backend::gemm_batched`] with `g`), then `dx = dx · [y > 0]` where `y` (laid out as `dx`,
    /// trial `i`'s at `i·g.m·g.n`) is the ReLU's output, then `db` the sums of `dx`'s rows
    /// ([`Backend::bias_grad_fused`]). Each trial computes what `gemm`, `relu_bwd` and
    /// `bias_grad` compute in turn.
    #[allow(clippy::too_many_arguments)]
    fn dense_bwd_relu(
        &mut self,
        g: GemmShape,
        batch: GemmBatch,
        dy: Region,
        w: Region,
        dx: Region,
        y: Region,
        db: BiasGrad,
    ) -> Result<(), EngineError>;
    /// [`Backend::softmax_xent_fused`] that also writes the bias gradient of the layer that made
    /// the logits: trial `i`'s `Σ_r dlogits[r, :]` into `db` ([`Backend::bias_grad_fused`]).
    #[allow(clippy::too_many_arguments)]
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
        self.softmax_xent_fused(logits, labels, dlogits, stats, rows, classes, trials)?;
        self.bias_grad_fused(dlogits, db.db, rows, classes, trials, db.stride)
    }
    /// [`Backend::gather`] into each of `trials` trials' rows: trial `i`'s samples at
    /// `i·batch·sample_len` of `x` and its labels at `i·batch` of `y` (`rows ≤ batch`).
    #[allow(clippy::too_many_arguments)]
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
        for r in contract::gather_fused(rows, batch, self.sample_len(), trials, x, y)? {
            self.gather(split, start, rows, r.x, r.y)?;
        }
        Ok(())
    }
    /// [`Backend::eval_xent`] over `trials` trials: trial `i`'s logits at `i·batch·classes`,
    /// labels at `i·batch` and stats at `i·STATS_LEN`, each over its first `rows` rows.
    #[allow(clippy::too_many_arguments)]
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
        contract::eval_xent_fused(logits, labels, stats, rows, batch, classes, trials)?;
        for i in 0..trials {
            let l = Region::new(logits.offset + i * batch * classes, rows * classes);
            let y = Region::new(labels.offset + i * batch, rows);
            let s = Region::new(stats.offset + i * STATS_LEN, STATS_LEN);
            self.eval_xent(l, y, s, rows, classes)?;
        }
        Ok(())
    }
    /// One optimizer step and then the step counter's advance, as one op: what the step's op
    /// ([`Update`]) and then [`Backend::advance`] compute. Adam's `t` is read from `counter`
    /// before it advances.
    fn update(&mut self, u: Update, counter: Region) -> Result<(), EngineError> {
        match u {
            Update::Sgd { w, g, v, p } => self.sgd_step(w, g, v, p)?,
            Update::Adam { w, g, m, v, p } => self.adam_step(w, g, m, v, p, counter)?,
            Update::SgdBatched {
                w,
                g,
                v,
                hyper,
                trials,
            } => self.sgd_step_batched(w, g, v, hyper, trials)?,
            Update::AdamBatched {
                w,
                g,
                m,
                v,
                hyper,
                trials,
            } => self.adam_step_batched(w, g, m, v, hyper, trials, counter)?,
        }
        self.advance(counter)
    }
    /// [`Backend::write`] without waiting for the copy: the values are staged on the host side
    /// and copied in stream order, so ops issued later see them. For data that changes once an
    /// epoch (the training orders), written while earlier steps still run.
    fn upload(&mut self, dst: Region, src: &[f32]) -> Result<(), EngineError> {
        self.write(dst, src)
    }
    /// A look at `src` that never waits: returns `true` with `dst` filled with the values `src`
    /// held when an earlier `peek` of it was issued, once that copy has arrived, and issues the
    /// next one; `false` while it is on its way (the first call only issues it). Backends that
    /// finish each op as it is issued give the values of now. For a check every few steps that
    /// must not stall the device (a diverged loss).
    fn peek(&mut self, src: Region, dst: &mut [f32]) -> Result<bool, EngineError> {
        self.read(src, dst)?;
        Ok(true)
    }
    /// Waits until every op issued so far has finished.
    fn synchronize(&mut self) -> Result<(), EngineError>;
    /// Marks the end of a step and waits until at most `lead` marked steps are unfinished, so
    /// that the host never queues more than `lead` steps ahead of the device (a cancel then
    /// waits for those alone). Backends that finish each op as it is issued wait for nothing.
    fn pace(&mut self, lead: usize) -> Result<(), EngineError> {
        let _ = lead;
        Ok(())
    }

    /// Whether work of `signature` (a training's shapes: see [`work_signature`]) has run where
    /// this backend runs, its kernels loaded: its first step and first evaluation then need no
    /// hold on the process's captures ([`Backend::hold_captures`]). Backends that load nothing
    /// say yes.
    fn loaded(&self, signature: u64) -> bool {
        let _ = signature;
        true
    }
    /// Records that work of `signature` has run where this backend runs.
    fn mark_loaded(&mut self, signature: u64) {
        let _ = signature;
    }
    /// Hands the backend back once its trial is over, for the next trial on a slice like its own
    /// to reuse (its stream, memory pool and library handles made once; the arena and graph
    /// released). Backends with nothing worth keeping are dropped.
    fn recycle(self: Box<Self>) {}

    /// Whether ops can be captured into a graph and replayed ([`Backend::begin_capture`]).
    fn supports_graphs(&self) -> bool {
        false
    }
    /// Keeps every graph capture of the process from running while the hold lives: for eager
    /// work that may load kernels lazily (a trial's first step and first evaluation), which
    /// would invalidate another trial's capture. Backends without graphs hold nothing.
    fn hold_captures(&self) -> CaptureHold {
        CaptureHold::none()
    }
    /// Starts recording the ops issued from now on instead of running them.
    fn begin_capture(&mut self) -> Result<(), EngineError> {
        Err(EngineError::Device(
            "this backend cannot capture graphs".into(),
        ))
    }
    /// Ends the recording; the recorded ops become the graph that [`Backend::replay`] runs (the
    /// training step's: graph slot 0).
    fn end_capture(&mut self) -> Result<(), EngineError> {
        self.end_capture_into(0)
    }
    /// Runs the recorded graph once.
    fn replay(&mut self) -> Result<(), EngineError> {
        self.replay_slot(0)
    }
    /// Ends the recording as the graph in `slot` (at most [`GRAPH_SLOTS`]; 0 is the training
    /// step's, the others a training's evaluation batches), replacing the one there.
    fn end_capture_into(&mut self, slot: usize) -> Result<(), EngineError> {
        let _ = slot;
        Err(EngineError::Device(
            "this backend cannot capture graphs".into(),
        ))
    }
    /// Runs the graph in `slot` once.
    fn replay_slot(&mut self, slot: usize) -> Result<(), EngineError> {
        let _ = slot;
        Err(EngineError::Device(
            "this backend cannot capture graphs".into(),
        ))
    }
}

/// The signature of a training's work for [`Backend::loaded`]: what decides which kernels it
/// runs (its `key`: model, shapes, optimizer, engine options; and the fused group's width), and
/// which part (the step, or the evaluation).
pub fn work_signature(key: &str, width: usize, part: WorkPart) -> u64 {
    let part = match part {
        WorkPart::Step => "step",
        WorkPart::Evaluation => "evaluation",
    };
    crate::hash::fnv1a(format!("{key}|{width}|{part}").as_bytes())
}

/// Which part of a training a [`work_signature`] is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkPart {
    Step,
    Evaluation,
}
