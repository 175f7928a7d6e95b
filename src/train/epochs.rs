//! The one training loop: epochs of steps over the seed schedule's orders, each epoch's figures and evaluation, and the trial's result, whatever takes the steps (one backend, or the replicas of a mirrored training).

use std::time::Instant;

use super::stop::Stop;
use super::{seeds, EpochStats, Prune, TrialResult};
use crate::cancel::Cancel;
use crate::engine::STATS_LEN;

/// Where a step stands in the training.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepAt {
    /// 1-based.
    pub epoch: u32,
    /// 0-based, within the epoch.
    pub step: usize,
    /// The steps this epoch takes.
    pub steps: usize,
}

/// What takes a training's steps: one backend, or the replicas of a mirrored training.
pub trait Steps {
    /// Starts an epoch: the training samples are visited in `order`, and the epoch's sums of
    /// loss and correct predictions start at zero.
    fn begin_epoch(&mut self, order: Vec<u32>) -> Result<(), Stop>;
    /// Takes one training step (a diverged one fails with `Failure::NonFiniteLoss` (see [`super::stop`])).
    fn step(&mut self, at: StepAt) -> Result<(), Stop>;
    /// Ends epoch `epoch`: the epoch's sums over its training rows (loss, then correct
    /// predictions), and, with `evaluate`, the mean loss and accuracy over the test split (NaN
    /// without). A training whose loss diverged fails with `Failure::NonFiniteLoss` (see [`super::stop`]).
    fn end_epoch(&mut self, epoch: u32, evaluate: bool) -> Result<EpochSums, Stop>;
    /// Waits for the work issued, after the last epoch.
    fn finish(&mut self) -> Result<(), Stop>;
    /// Bytes of the arenas allocated for the training.
    fn arena_bytes(&self) -> u64;
    /// Parameters of the model.
    fn param_count(&self) -> u64;
}

/// An epoch's training sums (loss, then correct predictions) and its test `(loss, accuracy)`.
pub type EpochSums = ([f64; STATS_LEN], (f64, f64));

/// What a training runs: its seed, epochs, and steps of `batch` rows.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub seed: u64,
    pub epochs: u32,
    /// Training samples.
    pub n_train: usize,
    /// Rows of one step (the global batch of a mirrored training); at most `n_train`.
    pub batch: usize,
    /// Stop after this many steps per epoch and skip evaluation (short probes and tests).
    pub max_steps: Option<usize>,
    /// Evaluate after each epoch even with `max_steps` (a warm-up that loads every kernel).
    pub warm_up: bool,
}

impl Schedule {
    /// Steps of a whole epoch: every full batch of the epoch's order.
    pub fn steps_per_epoch(&self) -> usize {
        self.n_train / self.batch.max(1)
    }

    /// Whether each epoch ends with an evaluation: whole epochs, or a warm-up's.
    pub fn evaluates(&self) -> bool {
        self.max_steps.is_none() || self.warm_up
    }

    /// Steps each epoch takes.
    pub fn steps(&self) -> usize {
        let all = self.steps_per_epoch();
        self.max_steps.map_or(all, |m| m.min(all))
    }
}

/// One epoch done.
#[derive(Clone, Debug, PartialEq)]
pub struct Epoch {
    pub stats: EpochStats,
    /// Seconds of the epoch's training steps (evaluation excluded).
    pub train_s: f64,
    /// Seconds of the whole epoch, evaluation included.
    pub epoch_s: f64,
    /// Steps it took.
    pub steps: usize,
}

/// Epoch `epoch`'s figures from its training sums and its test `(loss, accuracy)`.
pub fn epoch_stats(
    epoch: u32,
    plan: &Schedule,
    sums: [f64; STATS_LEN],
    (test_loss, test_acc): (f64, f64),
    started: Instant,
) -> EpochStats {
    let seen = (plan.steps() * plan.batch).max(1) as f64;
    EpochStats {
        epoch,
        train_loss: sums[0] / seen,
        train_acc: sums[1] / seen,
        test_loss,
        test_acc,
        wall_s: started.elapsed().as_secs_f64(),
        extra: Default::default(),
    }
}

/// Trains: for each epoch, its order from the seed schedule, its steps (checking `cancel`
/// before each), its training figures and, unless the steps are capped, an evaluation; then
/// `on_epoch`, which sees the steps as well; then `prune`, which may stop the training there,
/// with the result of the epochs so far. `started` is when the trial started.
pub fn train<S: Steps + ?Sized>(
    s: &mut S,
    plan: &Schedule,
    cancel: &Cancel,
    prune: Option<&Prune>,
    started: Instant,
    on_epoch: &mut dyn FnMut(&mut S, &Epoch),
) -> Result<TrialResult, Stop> {
    let steps = plan.steps();
    let mut last = None;
    for epoch in 1..=plan.epochs {
        let epoch_start = Instant::now();
        s.begin_epoch(seeds::epoch_order(plan.seed, epoch, plan.n_train))?;
        let steps_start = Instant::now();
        for step in 0..steps {
            if cancel.aborted() {
                return Err(Stop::Interrupted);
            }
            s.step(StepAt { epoch, step, steps })?;
        }
        let train_s = steps_start.elapsed().as_secs_f64().max(1e-9);
        // Short runs (max_steps) time training alone and skip evaluation, warm-ups aside.
        let (sums, test) = s.end_epoch(epoch, plan.evaluates())?;
        let e = Epoch {
            stats: epoch_stats(epoch, plan, sums, test, started),
            train_s,
            epoch_s: epoch_start.elapsed().as_secs_f64(),
            steps,
        };
        on_epoch(s, &e);
        if prune.is_some_and(|p| p.stops(&e.stats)) {
            // Stopped early: the result of the epochs trained ([`Prune::stopped`] says so).
            s.finish()?;
            let mut cut = *plan;
            cut.epochs = epoch;
            return Ok(result(
                e.stats,
                &cut,
                started.elapsed().as_secs_f64(),
                s.arena_bytes(),
                s.param_count(),
            ));
        }
        last = Some(e.stats);
    }
    s.finish()?;
    let last = last.ok_or_else(|| Stop::worker("no epoch ran"))?;
    Ok(result(
        last,
        plan,
        started.elapsed().as_secs_f64(),
        s.arena_bytes(),
        s.param_count(),
    ))
}

/// A training's result from its last epoch's figures: `wall_s` seconds in all, `arena_bytes`
/// of memory, `param_count` parameters.
pub fn result(
    last: EpochStats,
    plan: &Schedule,
    wall_s: f64,
    arena_bytes: u64,
    param_count: u64,
) -> TrialResult {
    let train_samples = (plan.steps() * plan.batch) as u64 * plan.epochs as u64;
    let metrics = [
        ("test_acc", last.test_acc),
        ("test_loss", last.test_loss),
        ("final_loss", last.train_loss),
        ("train_acc", last.train_acc),
    ]
    .into_iter()
    .filter(|(_, v)| v.is_finite())
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    TrialResult {
        metrics,
        test_acc: last.test_acc,
        final_loss: last.train_loss,
        epochs: plan.epochs,
        wall_s,
        train_samples,
        samples_per_s: train_samples as f64 / wall_s.max(1e-9),
        peak_mem_bytes: arena_bytes,
        param_count,
        launches_per_step: None,
        host_syncs: None,
    }
}
