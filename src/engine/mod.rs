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
mod launch_ops;
pub mod options;
pub mod shapes;

use crate::error::EngineError;
pub use counted::{Counted, OpCounts};
pub use cuda::CaptureHold;
use launch_ops::{declare_launch_ops, launch_ops};
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
    // The launch ops, each written once in `launch_ops.rs`: declared here, counted by
    // `Counted`, implemented by each backend.
    launch_ops!(declare_launch_ops);

    /// Number of samples in a split of the resident dataset.
    fn split_len(&self, split: Split) -> usize;
    /// Elements of one sample of the resident dataset.
    fn sample_len(&self) -> usize;
    /// Sets the order in which the training split is visited this epoch (a permutation).
    fn set_train_order(&mut self, order: &[u32]) -> Result<(), EngineError>;
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
    /// Ends the recording as the graph in `slot` (at most [`GRAPH_SLOTS`]; 0 is the training
    /// step's, the others a training's evaluation batches), replacing the one there.
    fn end_capture_into(&mut self, slot: usize) -> Result<(), EngineError> {
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
