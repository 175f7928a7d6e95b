//! Data-parallel training: one model mirrored on several slices, each global batch split into shards, and their gradients reduced into one synchronous update.
//!
//! As in TensorFlow's MirroredStrategy, with the batch split by ratios (for devices of unequal
//! speed, as Keras's multi-GPU model for GPUs of different sizes does) or evenly as Keras's
//! `make_parallel` does. Each replica is one [`Backend`] (its own arena and
//! stream, and on a GPU its slice's capped pool and green context) driven by a thread of its own.
//! One step:
//!
//! 1. every replica gathers its shard of the global batch, rows `[off_i, off_i + n_i)` of the
//!    batch in the epoch's order (the same order on every replica), and runs forward, loss and
//!    backward on it; the replicas do this at the same time;
//! 2. the gradients are read to the host and reduced: `g = Σ_i (n_i / N)·g_i`. Each shard's loss
//!    is the mean over its `n_i` rows, so `g` is the gradient of the mean over all `N` rows;
//! 3. every replica writes `g` and takes the same optimiser step from the same parameters, so
//!    the replicas stay identical without sending weights around.
//!
//! The result is single-slice training on the global batch, up to floating-point order. The
//! reduction goes through the host: per step and replica, one copy of the gradient out and one
//! in, which is cheap on the CPU and costs two PCIe transfers of the parameter block on a GPU.
//! The step runs eagerly (no CUDA graph), since the host reduction sits in the middle of it.
//!
//! Dropout masks are drawn by an element's index within the global batch: each replica's
//! network starts its rows at its shard's offset (`Network::first_row`), so a shard's rows get
//! their part of the whole batch's mask, and dropout too matches single-slice training up to
//! floating-point order.
//!
//! The epochs, their order of samples and the seeds are those of single trials: the loop is
//! [`crate::train::epochs::train`], with the replicas taking its steps.

pub mod ratio_probe;
#[cfg(test)]
mod tests;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::engine::{Backend, Split, STATS_LEN};
use crate::error::EngineError;
use crate::models::{self, Network};
use crate::models::{Hyper, ModelSpec};
use crate::train::epochs::{
    self, only_end, only_order, Ends, EpochSums, Member, Schedule, StepAt, Steps,
};
use crate::train::stop::{Failure, Stop};
use crate::train::{seeds, EpochStats, TrialConfig, TrialResult};

/// What a data-parallel training trains, and how each global batch is split.
#[derive(Clone, Debug)]
pub struct ParallelConfig {
    /// What is trained, as a single trial would be: `hyper.batch_size` is the global batch, the
    /// sum of the shards; `max_steps` stops each epoch early and skips evaluation (tests and
    /// probes). Its `fault` and its engine's graphs do not apply: the steps run eagerly.
    pub trial: TrialConfig,
    /// Rows of each global batch that each replica takes, in slice order.
    pub shards: Vec<usize>,
}

/// One slice's share of an epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct SliceSpeed {
    pub slice: u32,
    /// Rows of each global batch this slice takes.
    pub rows: usize,
    /// Its rows per second of the epoch's training time. Steps are synchronous, so every slice
    /// moves at the pace of the slowest, as the per-GPU figures of Keras's multi-GPU model on GPUs of different sizes show.
    pub samples_per_s: f64,
    /// Seconds it spent computing (gather, forward, loss, backward, gradient read, optimiser
    /// step); for the rest of the epoch it waited for the others and for the reduction.
    pub busy_s: f64,
}

/// The figures of one epoch of a data-parallel training.
#[derive(Clone, Debug, PartialEq)]
pub struct ParallelEpoch {
    pub stats: EpochStats,
    /// Seconds of the epoch's training steps (evaluation excluded).
    pub train_s: f64,
    /// Seconds of the whole epoch, evaluation included.
    pub epoch_s: f64,
    pub steps: usize,
    pub slices: Vec<SliceSpeed>,
    /// Training samples of all slices per second of `train_s`.
    pub samples_per_s: f64,
}

impl ParallelEpoch {
    /// The line of samples/s per slice: `slice 0 [820] 1257 sps · slice 1 [568] 871 sps · total [1388] 2123 sps`.
    pub fn speed_line(&self) -> String {
        let mut parts: Vec<String> = self
            .slices
            .iter()
            .map(|s| format!("slice {} [{}] {:.0} sps", s.slice, s.rows, s.samples_per_s))
            .collect();
        let total: usize = self.slices.iter().map(|s| s.rows).sum();
        parts.push(format!("total [{total}] {:.0} sps", self.samples_per_s));
        parts.join(" · ")
    }
}

/// A finished data-parallel training.
#[derive(Clone, Debug)]
pub struct ParallelOutcome {
    pub result: TrialResult,
    pub epochs: Vec<ParallelEpoch>,
    /// The final parameters (replica 0's).
    pub params: Vec<f32>,
    /// The largest difference between any replica's parameters and replica 0's (0 when they
    /// stayed identical, as they should).
    pub replica_spread: f32,
}

/// One replica: a slice's backend and the network planned for its shard.
struct Replica {
    slice: u32,
    be: Box<dyn Backend>,
    net: Network,
    /// Where its shard starts in the global batch, and its rows.
    offset: usize,
    rows: usize,
}

/// What a replica's thread sends back.
enum Reply {
    Done,
    Applied(f64),
    Grads(Vec<f32>, f64),
    Stats([f32; STATS_LEN]),
    Eval(f64, f64),
    Params(Vec<f32>),
}

type Task = Box<dyn FnOnce(&mut Replica) -> Result<Reply, Stop> + Send>;

/// The replicas' threads, each answering one task at a time in order.
struct Crew {
    slices: Vec<u32>,
    tasks: Vec<Sender<Task>>,
    replies: Vec<Receiver<Result<Reply, Stop>>>,
}

impl Crew {
    /// Gives every replica its task at once, then waits for all the answers.
    fn all(&self, make: impl Fn(usize) -> Task) -> Result<Vec<Reply>, Stop> {
        for (i, tx) in self.tasks.iter().enumerate() {
            tx.send(make(i)).map_err(|_| self.gone(i))?;
        }
        let mut out = Vec::with_capacity(self.tasks.len());
        let mut first_err = None;
        // Every answer is collected, even after an error, so the replicas stay in step.
        for (i, rx) in self.replies.iter().enumerate() {
            match rx.recv() {
                Ok(Ok(r)) => out.push(r),
                Ok(Err(e)) => {
                    first_err.get_or_insert(self.on_slice(i, e));
                }
                Err(_) => {
                    first_err.get_or_insert(self.gone(i));
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Runs a task on replica `i` alone.
    fn one(&self, i: usize, task: Task) -> Result<Reply, Stop> {
        self.tasks[i].send(task).map_err(|_| self.gone(i))?;
        match self.replies[i].recv() {
            Ok(r) => r.map_err(|e| self.on_slice(i, e)),
            Err(_) => Err(self.gone(i)),
        }
    }

    fn on_slice(&self, i: usize, e: Stop) -> Stop {
        match e {
            Stop::Interrupted | Stop::Failed(Failure::NonFiniteLoss { .. }) => e,
            other => other.in_slice(self.slices[i]),
        }
    }

    fn gone(&self, i: usize) -> Stop {
        Stop::from(EngineError::Device("its thread has ended".into())).in_slice(self.slices[i])
    }
}

/// Where each shard starts in the global batch.
pub fn offsets(shards: &[usize]) -> Vec<usize> {
    shards
        .iter()
        .scan(0, |at, &n| {
            let start = *at;
            *at += n;
            Some(start)
        })
        .collect()
}

/// Plans a network for `rows` rows on `be` and allocates its arena (from the slice's capped
/// pool); fails with the cap error when it does not fit.
pub(crate) fn plan_on(
    be: &mut dyn Backend,
    model: &ModelSpec,
    input: [usize; 3],
    classes: usize,
    rows: usize,
    h: &Hyper,
) -> Result<Network, Stop> {
    let net = models::build(
        model,
        input,
        classes,
        rows,
        h.dropout as f32,
        h.optimizer,
        &|s| be.conv_workspace_len(s),
    )
    .map_err(|message| EngineError::Shape {
        op: "model",
        message,
    })?;
    be.alloc_arena(net.plan.total)?;
    Ok(net)
}

/// Trains one model mirrored on `backends` (one per slice, with its slice index), calling
/// `on_epoch` after each epoch. Threads that run CPU replicas, and the calling thread when any
/// replica is on the CPU, flush subnormal floats to zero until this returns ([`crate::engine::ThreadGuard`]).
pub fn train(
    backends: Vec<(u32, Box<dyn Backend>)>,
    cfg: &ParallelConfig,
    on_epoch: &mut dyn FnMut(&ParallelEpoch),
) -> Result<ParallelOutcome, Stop> {
    let started = Instant::now();
    let shape = |message: String| {
        Stop::from(EngineError::Shape {
            op: "parallel",
            message,
        })
    };
    if backends.len() != cfg.shards.len() || backends.is_empty() {
        return Err(shape(format!(
            "{} shards for {} slices",
            cfg.shards.len(),
            backends.len()
        )));
    }
    if let Some(i) = cfg.shards.iter().position(|&n| n == 0) {
        return Err(shape(format!("slice {i} has no rows of the global batch")));
    }
    let _guard = crate::engine::thread_guard_of(backends.iter().map(|(_, b)| b.as_ref()));
    let global: usize = cfg.shards.iter().sum();
    let n_train = backends[0].1.split_len(Split::Train);
    let n_test = backends[0].1.split_len(Split::Test);
    if global > n_train {
        return Err(shape(format!(
            "the global batch of {global} is larger than the {n_train} training samples"
        )));
    }
    let mut replicas = Vec::with_capacity(backends.len());
    for ((slice, mut be), (&rows, offset)) in backends
        .into_iter()
        .zip(cfg.shards.iter().zip(offsets(&cfg.shards)))
    {
        let t = &cfg.trial;
        let mut net = plan_on(be.as_mut(), &t.model, t.input, t.classes, rows, &t.hyper)
            .map_err(|e| e.in_slice(slice))?;
        // The same seed on every replica: identical initial weights.
        net.init(be.as_mut(), seeds::init(t.seed))?;
        // Each replica's dropout masks are its rows' part of the whole batch's.
        net.first_row = offset;
        replicas.push(Replica {
            slice,
            be,
            net,
            offset,
            rows,
        });
    }
    let slices: Vec<u32> = replicas.iter().map(|r| r.slice).collect();
    let param_count = replicas[0].net.param_count() as u64;
    let arena_bytes: u64 = replicas.iter().map(|r| r.be.allocated_bytes() as u64).sum();
    let (tasks, task_rx): (Vec<_>, Vec<_>) = replicas.iter().map(|_| bounded::<Task>(1)).unzip();
    let (reply_tx, replies): (Vec<_>, Vec<_>) = replicas
        .iter()
        .map(|_| bounded::<Result<Reply, Stop>>(1))
        .unzip();
    std::thread::scope(|s| {
        for ((mut rep, rx), tx) in replicas.into_iter().zip(task_rx).zip(reply_tx) {
            s.spawn(move || serve(&mut rep, &rx, &tx));
        }
        let crew = Crew {
            slices,
            tasks,
            replies,
        };
        // The crew is dropped when this returns, which ends the replicas' threads.
        let sizes = Sizes {
            global,
            n_train,
            n_test,
            param_count,
            arena_bytes,
        };
        drive(&crew, cfg, &sizes, started, on_epoch)
    })
}

/// A replica's thread: runs each task it is given, a panic included, and answers.
fn serve(rep: &mut Replica, tasks: &Receiver<Task>, replies: &Sender<Result<Reply, Stop>>) {
    let _guard = rep.be.thread_guard();
    while let Ok(task) = tasks.recv() {
        let answer = match catch_unwind(AssertUnwindSafe(|| task(rep))) {
            Ok(r) => r,
            Err(payload) => Err(Stop::Failed(Failure::Panic(crate::error::panic_text(
                payload.as_ref(),
            )))),
        };
        let failed = answer.is_err();
        if replies.send(answer).is_err() || failed {
            break;
        }
    }
}

/// What the training loop needs to know about the data and the replicas.
struct Sizes {
    global: usize,
    n_train: usize,
    n_test: usize,
    param_count: u64,
    arena_bytes: u64,
}

/// The training loop on the calling thread: [`epochs::train`], with the crew taking its steps.
fn drive(
    crew: &Crew,
    cfg: &ParallelConfig,
    sizes: &Sizes,
    started: Instant,
    on_epoch: &mut dyn FnMut(&ParallelEpoch),
) -> Result<ParallelOutcome, Stop> {
    let t = &cfg.trial;
    let global = sizes.global;
    let plan = Schedule {
        epochs: t.epochs,
        n_train: sizes.n_train,
        batch: global,
        max_steps: t.max_steps,
        warm_up: t.warm_up,
    };
    let mut mirrored = Mirrored {
        crew,
        hyper: &t.hyper,
        weights: cfg
            .shards
            .iter()
            .map(|&n| n as f64 / global as f64)
            .collect(),
        global,
        steps_per_epoch: plan.steps_per_epoch(),
        dropout_seed: seeds::dropout(t.seed),
        done: 0,
        busy: Vec::new(),
        sizes,
        params: Vec::new(),
        cancel: t.cancel.clone(),
    };
    let mut epochs = Vec::new();
    let member = Member {
        seed: t.seed,
        prune: None,
    };
    let ends = epochs::train(
        &mut mirrored,
        &plan,
        &[member],
        &t.cancel,
        started,
        &mut |m: &mut Mirrored, _, e| {
            let seen = (e.steps * global).max(1) as f64;
            let pe = ParallelEpoch {
                stats: e.stats.clone(),
                train_s: e.train_s,
                epoch_s: e.epoch_s,
                steps: e.steps,
                slices: crew
                    .slices
                    .iter()
                    .zip(&cfg.shards)
                    .zip(&m.busy)
                    .map(|((&slice, &rows), &busy_s)| SliceSpeed {
                        slice,
                        rows,
                        samples_per_s: (rows * e.steps) as f64 / e.train_s,
                        busy_s,
                    })
                    .collect(),
                samples_per_s: seen / e.train_s,
            };
            on_epoch(&pe);
            epochs.push(pe);
        },
    );
    let result = only_end(ends)?;
    let params = mirrored.params;
    let replica_spread = params
        .iter()
        .flat_map(|p| p.iter().zip(&params[0]).map(|(a, b)| (a - b).abs()))
        .fold(0f32, f32::max);
    Ok(ParallelOutcome {
        result,
        epochs,
        params: params.into_iter().next().unwrap_or_default(),
        replica_spread,
    })
}

/// The replicas taking the steps of one training loop.
struct Mirrored<'a> {
    crew: &'a Crew,
    hyper: &'a Hyper,
    /// Each shard's share of the global batch, `n_i / N`.
    weights: Vec<f64>,
    global: usize,
    steps_per_epoch: usize,
    dropout_seed: u64,
    /// Steps taken so far: batch `done % steps_per_epoch` of the epoch's order comes next, as
    /// the step counter picks it in single-slice training.
    done: usize,
    /// Seconds each replica computed this epoch.
    busy: Vec<f64>,
    sizes: &'a Sizes,
    /// Every replica's final parameters, once finished.
    params: Vec<Vec<f32>>,
    /// Stops an evaluation between its batches.
    cancel: crate::cancel::Cancel,
}

impl Steps for Mirrored<'_> {
    fn begin_epoch(&mut self, orders: Vec<Vec<u32>>) -> Result<(), Stop> {
        // The epoch's order, as a single-slice training of the same seed visits it.
        let order = std::sync::Arc::new(only_order(&orders)?.to_vec());
        self.crew.all(|_| {
            let order = std::sync::Arc::clone(&order);
            Box::new(move |r: &mut Replica| {
                r.be.set_train_order(&order)?;
                r.be.fill(r.net.stats, 0.0)?;
                Ok(Reply::Done)
            })
        })?;
        self.busy = vec![0f64; self.weights.len()];
        Ok(())
    }

    fn step(&mut self, at: StepAt, _: &mut Ends) -> Result<(), Stop> {
        let start = (self.done % self.steps_per_epoch) * self.global;
        self.done += 1;
        let dropout_seed = self.dropout_seed;
        let answers = self.crew.all(|_| compute(start, dropout_seed))?;
        // g = Σ_i (n_i / N)·g_i, accumulated into the first replica's gradient.
        let mut reduced: Vec<f32> = Vec::new();
        for (i, a) in answers.into_iter().enumerate() {
            let Reply::Grads(g, took) = a else {
                return Err(Stop::worker("a replica answered out of turn"));
            };
            self.busy[i] += took;
            let w = self.weights[i] as f32;
            if reduced.is_empty() {
                reduced = g;
                reduced.iter_mut().for_each(|x| *x *= w);
            } else {
                for (s, x) in reduced.iter_mut().zip(&g) {
                    *s += w * x;
                }
            }
        }
        if reduced.iter().any(|x| !x.is_finite()) {
            return Err(Stop::Failed(Failure::NonFiniteLoss {
                value: f64::NAN,
                epoch: at.epoch as usize,
                step: at.step,
            }));
        }
        let reduced = std::sync::Arc::new(reduced);
        let h = self.hyper.clone();
        let applied = self.crew.all(|_| {
            let (g, h) = (std::sync::Arc::clone(&reduced), h.clone());
            Box::new(move |r: &mut Replica| {
                let t = Instant::now();
                r.be.write(r.net.grads(), &g)?;
                r.be.update(r.net.update(&h), r.net.counter)?;
                r.be.synchronize()?;
                Ok(Reply::Applied(t.elapsed().as_secs_f64()))
            })
        })?;
        for (i, a) in applied.into_iter().enumerate() {
            if let Reply::Applied(took) = a {
                self.busy[i] += took;
            }
        }
        Ok(())
    }

    fn end_epoch(
        &mut self,
        epoch: u32,
        evaluate: bool,
        _: &mut Ends,
    ) -> Result<Vec<EpochSums>, Stop> {
        let sums = self.train_sums()?;
        let test = if evaluate {
            self.evaluate(epoch)?
        } else {
            (f64::NAN, f64::NAN)
        };
        Ok(vec![(sums, test)])
    }

    fn finish(&mut self) -> Result<(), Stop> {
        self.params = self
            .crew
            .all(|_| {
                Box::new(|r: &mut Replica| {
                    r.be.synchronize()?;
                    let mut p = vec![0f32; r.net.params.len];
                    r.be.read(r.net.params, &mut p)?;
                    Ok(Reply::Params(p))
                })
            })?
            .into_iter()
            .filter_map(|a| match a {
                Reply::Params(p) => Some(p),
                _ => None,
            })
            .collect();
        Ok(())
    }

    fn arena_bytes(&self) -> u64 {
        self.sizes.arena_bytes
    }

    fn param_count(&self) -> u64 {
        self.sizes.param_count
    }
}

impl Mirrored<'_> {
    fn train_sums(&mut self) -> Result<[f64; STATS_LEN], Stop> {
        let mut stats = [0f64; STATS_LEN];
        for a in self.crew.all(|_| {
            Box::new(|r: &mut Replica| {
                let mut s = [0f32; STATS_LEN];
                r.be.read(r.net.stats, &mut s)?;
                Ok(Reply::Stats(s))
            })
        })? {
            if let Reply::Stats(s) = a {
                for (t, x) in stats.iter_mut().zip(s) {
                    *t += x as f64;
                }
            }
        }
        Ok(stats)
    }

    fn evaluate(&mut self, _epoch: u32) -> Result<(f64, f64), Stop> {
        let (n_test, cancel) = (self.sizes.n_test, self.cancel.clone());
        let answer = self.crew.one(
            0,
            Box::new(move |r: &mut Replica| {
                let (l, a) = crate::train::evaluate(
                    r.be.as_mut(),
                    &r.net,
                    n_test,
                    crate::train::Loads::Done,
                    &cancel,
                )?;
                Ok(Reply::Eval(l, a))
            }),
        )?;
        Ok(match answer {
            Reply::Eval(l, a) => (l, a),
            _ => (f64::NAN, f64::NAN),
        })
    }
}

/// A replica's part of a step whose global batch starts at `batch_start` of the epoch's order:
/// gather its shard, forward, loss, backward, and read its gradient.
fn compute(batch_start: usize, dropout_seed: u64) -> Task {
    Box::new(move |r: &mut Replica| {
        let t = Instant::now();
        let (be, net) = (r.be.as_mut(), &r.net);
        be.gather(
            Split::Train,
            batch_start + r.offset,
            r.rows,
            net.input(),
            net.labels,
        )?;
        net.forward(be, r.rows, true, dropout_seed)?;
        net.loss(be, r.rows)?;
        net.backward(be, r.rows, dropout_seed)?;
        let mut g = vec![0f32; net.grads().len];
        be.read(net.grads(), &mut g)?;
        Ok(Reply::Grads(g, t.elapsed().as_secs_f64()))
    })
}
