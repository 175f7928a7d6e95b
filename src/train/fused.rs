//! Fused groups: N compatible trials trained as one batched model on one backend (`split: fused`), each with its own hyperparameters, seed, data order, results and failure.

use std::time::Instant;

use super::epochs::{self, Schedule};
use super::single::{
    capture_step, inject, warm_up_test_len, EvalGraphs, Signatures, StepGraph, Tally,
};
use super::{group_key, run_trial, seeds, EpochStats, TrialConfig, TrialResult};
use crate::engine::fused_hyper::HYPER_LEN;
use crate::engine::{Backend, Counted, Split, STATS_LEN};
use crate::error::EngineError;
use crate::models::{self, FusedNetwork};
use crate::train::stop::{Failure, Stop};
use crate::units::MIB;

/// Each trial's end, in the group's order.
pub type GroupEnds = Vec<Result<TrialResult, Stop>>;

/// Trains `cfgs` (trials of one [`group_key`]) as one fused group on `be`, calling
/// `on_epoch(i, stats)` after each epoch of trial `i`. Returns each trial's end, in order.
///
/// Each trial computes what it computes alone ([`run_trial`]): on the CPU backend bit for bit.
/// A trial whose loss turns non-finite fails alone and the others go on. A group whose arena
/// does not fit under the backend's cap trains in parts that fit, one after another; a trial
/// that does not fit alone fails as it would alone.
pub fn run_group(
    be: &mut dyn Backend,
    cfgs: &[TrialConfig],
    on_epoch: &mut dyn FnMut(usize, &EpochStats),
) -> GroupEnds {
    let Some(first) = cfgs.first() else {
        return Vec::new();
    };
    let key = group_key(first);
    if let Some(odd) = cfgs.iter().position(|c| group_key(c) != key) {
        let why = format!("trial {odd} of a fused group does not share the first one's model, batch, optimizer or epochs");
        return cfgs
            .iter()
            .map(|_| Err(Stop::worker(why.clone())))
            .collect();
    }
    let _guard = be.thread_guard();
    let started = Instant::now();
    let alone = |be: &mut dyn Backend, on_epoch: &mut dyn FnMut(usize, &EpochStats)| {
        cfgs.iter()
            .enumerate()
            .map(|(i, cfg)| run_trial(be, cfg, &mut |s| on_epoch(i, s)))
            .collect::<GroupEnds>()
    };
    let n_train = be.split_len(Split::Train);
    let batch = first.hyper.batch_size as usize;
    let single = match models::build(
        &first.model,
        first.input,
        first.classes,
        batch,
        first.hyper.dropout as f32,
        first.hyper.optimizer,
        &|s| be.fused_conv_workspace_len(s),
    ) {
        Ok(net) if batch <= n_train => net,
        // Each trial fails alone with the error it meets alone.
        _ => return alone(be, on_epoch),
    };
    let dropout: Vec<f32> = cfgs.iter().map(|c| c.hyper.dropout as f32).collect();
    let fused = match FusedNetwork::new(&single, &dropout, n_train) {
        Ok(f) => f,
        Err(message) => {
            let e = EngineError::Shape {
                op: "fused",
                message,
            };
            return cfgs.iter().map(|_| Err(e.clone().into())).collect();
        }
    };
    match be.alloc_arena(fused.plan.total) {
        Ok(()) => {}
        Err(EngineError::CapExceeded { need_mib, cap_mib }) => {
            // What the backend adds to the plan does not depend on the group's width.
            let extra = need_mib * MIB - fused.plan.bytes() as f64;
            let per_trial = (fused.plan.bytes() / cfgs.len()) as f64;
            let width = ((cap_mib * MIB - extra) / per_trial).floor().max(0.0) as usize;
            if width == 0 {
                return alone(be, on_epoch);
            }
            let width = width.min(cfgs.len() - 1);
            tracing::info!(
                "a fused group of {} trials needs {need_mib:.1} MiB, above the cap of \
                 {cap_mib:.1} MiB: it trains as groups of {width}",
                cfgs.len()
            );
            let mut ends = Vec::with_capacity(cfgs.len());
            for (k, part) in cfgs.chunks(width).enumerate() {
                ends.extend(run_group(be, part, &mut |i, s| on_epoch(k * width + i, s)));
            }
            return ends;
        }
        Err(e) => return cfgs.iter().map(|_| Err(e.clone().into())).collect(),
    }
    let mut group = Group {
        fused,
        cfgs,
        ends: cfgs.iter().map(|_| None).collect(),
        last: cfgs.iter().map(|_| None).collect(),
        tally: Tally::default(),
    };
    let mut counted = Counted::new(be);
    if let Err(e) = group.train(&mut counted, started, on_epoch) {
        group.end_all(&e);
    }
    let wall_s = started.elapsed().as_secs_f64();
    let arena = (be.allocated_bytes() / cfgs.len()) as u64;
    let params = single.param_count() as u64;
    let Group {
        ends, last, tally, ..
    } = group;
    let counted = |mut r: TrialResult| {
        tally.fill(&mut r);
        r
    };
    ends.into_iter()
        .zip(last)
        .zip(cfgs)
        .map(|((end, last), cfg)| match (end, last) {
            // Pruned: the result of the epochs it trained.
            (Some(Ok(_)), Some(last)) => {
                let mut cut = schedule(cfg, n_train);
                cut.epochs = last.epoch;
                Ok(counted(epochs::result(last, &cut, wall_s, arena, params)))
            }
            (Some(end), _) => end,
            (None, Some(last)) => Ok(counted(epochs::result(
                last,
                &schedule(cfg, n_train),
                wall_s,
                arena,
                params,
            ))),
            (None, None) => Err(Stop::worker("no epoch ran")),
        })
        .collect()
}

/// A trial's epochs and steps.
fn schedule(cfg: &TrialConfig, n_train: usize) -> Schedule {
    Schedule {
        seed: cfg.seed,
        epochs: cfg.epochs,
        n_train,
        batch: cfg.hyper.batch_size as usize,
        max_steps: cfg.max_steps,
        warm_up: cfg.warm_up,
    }
}

/// A group in training: its network, and each trial's end once it has one.
struct Group<'a> {
    fused: FusedNetwork,
    cfgs: &'a [TrialConfig],
    /// `Some` once the trial has ended (failed or interrupted, or `Ok` when pruned); a trial
    /// still `None` at the end has completed.
    ends: Vec<Option<Result<TrialResult, Stop>>>,
    /// Each trial's last epoch's figures.
    last: Vec<Option<EpochStats>>,
    /// What the group asked of its backend (every trial's row carries the group's counts).
    tally: Tally,
}

impl Group<'_> {
    fn live(&self, i: usize) -> bool {
        self.ends[i].is_none()
    }

    fn any_live(&self) -> bool {
        self.ends.iter().any(Option::is_none)
    }

    /// Ends every trial still training with (a copy of) `e`.
    fn end_all(&mut self, e: &Stop) {
        for end in self.ends.iter_mut().filter(|e| e.is_none()) {
            *end = Some(Err(e.clone()));
        }
    }

    /// Every epoch of every trial; returns early once no trial is live. An error not of one
    /// trial (the device's, a cancel) is returned for [`Group::end_all`].
    fn train(
        &mut self,
        be: &mut Counted,
        started: Instant,
        on_epoch: &mut dyn FnMut(usize, &EpochStats),
    ) -> Result<(), Stop> {
        let first = &self.cfgs[0];
        let n = self.cfgs.len();
        let n_train = self.fused.n_train;
        let n_test = be.split_len(Split::Test);
        for (m, cfg) in self.fused.members.iter_mut().zip(self.cfgs) {
            m.init(be, seeds::init(cfg.seed))?;
        }
        let hypers: Vec<_> = self.cfgs.iter().map(|c| c.hyper.clone()).collect();
        let dropout_seeds: Vec<u64> = self.cfgs.iter().map(|c| seeds::dropout(c.seed)).collect();
        self.fused.write_hyper(be, &hypers, &dropout_seeds)?;
        debug_assert_eq!(self.fused.hyper.len, n * HYPER_LEN);
        let plan = schedule(first, n_train);
        let (steps, steps_per_epoch) = (plan.steps(), plan.steps_per_epoch());
        let graphs = first.engine.graphs && be.supports_graphs();
        let mut graph = StepGraph::new(graphs);
        let signatures = Signatures::of(&group_key(first), n);
        let mut eval_graphs = EvalGraphs::new(graphs);
        let check_every = first.engine.check_every.max(1);
        let evaluate = plan.evaluates() && n_test > 0;
        let mut peeked = vec![0f32; n * STATS_LEN];
        let mut sums = vec![0f32; 2 * n * STATS_LEN];
        for epoch in 1..=plan.epochs {
            self.tally.epoch_begins(be);
            // Every trial's order in one upload (a dead trial's too: its regions are its own).
            let orders: Vec<Vec<u32>> = self
                .cfgs
                .iter()
                .map(|cfg| seeds::epoch_order(cfg.seed, epoch, n_train))
                .collect();
            self.fused.write_orders(be, &orders)?;
            be.fill(self.fused.stats(), 0.0)?;
            for step in 0..steps {
                if first.cancel.aborted() {
                    return Err(Stop::Interrupted);
                }
                if epoch == 1 {
                    for (m, cfg) in self.fused.members.iter().zip(self.cfgs) {
                        inject(be, m, cfg.fault.as_ref(), step)?;
                    }
                }
                let warm_up = epoch == 1 && step == 0;
                let before = be.counts().launches;
                if graph.wants_capture(warm_up) {
                    let fused = &self.fused;
                    let captured = capture_step(be, |be| {
                        fused.train_step(be, steps_per_epoch, &dropout_seeds)
                    });
                    graph.outcome(captured)?;
                }
                if graph.captured {
                    be.replay()?;
                } else {
                    let loads = signatures.step_loads(be, warm_up);
                    let _hold = graph.eager_holds(loads).then(|| be.hold_captures());
                    self.fused.train_step(be, steps_per_epoch, &dropout_seeds)?;
                    self.tally.step_issued(be, before);
                    if warm_up {
                        be.mark_loaded(signatures.step);
                    }
                }
                be.pace(super::STEPS_AHEAD)?;
                // A diverged trial stops soon, alone; the others go on. The look never waits:
                // it sees the sums of a step a little earlier.
                if (step + 1) % check_every == 0 && be.peek(self.fused.stats(), &mut peeked)? {
                    self.kill_diverged(be, &peeked, epoch, step)?;
                    if !self.any_live() {
                        return Ok(());
                    }
                }
            }
            // Every trial's test figures in one pass over the test split (a dead trial's too,
            // unread: its regions are its own), then one read of every trial's sums.
            let tests = if evaluate {
                let loads = signatures.evaluation_loads(be, graphs, epoch);
                be.fill(self.fused.test_stats(), 0.0)?;
                let stop = || first.cancel.aborted();
                let fused = &self.fused;
                let issue = |be: &mut dyn Backend, start: usize, rows: usize| {
                    fused.eval_batch(be, start, rows)
                };
                let batch = fused.first_batch();
                let n_test = warm_up_test_len(first, n_test, batch);
                eval_graphs.run(be, n_test, batch, loads, &stop, &issue)?;
                be.mark_loaded(signatures.evaluation);
                be.read_metrics(self.fused.epoch_stats(), &mut sums)?;
                let mean = |v: f32| v as f64 / n_test as f64;
                sums[n * STATS_LEN..]
                    .chunks(STATS_LEN)
                    .map(|s| (mean(s[0]), mean(s[1])))
                    .collect()
            } else {
                be.read_metrics(self.fused.stats(), &mut sums[..n * STATS_LEN])?;
                vec![(f64::NAN, f64::NAN); n]
            };
            let train = sums[..n * STATS_LEN].to_vec();
            self.kill_diverged(be, &train, epoch, steps.saturating_sub(1))?;
            for (i, &test) in tests.iter().enumerate() {
                if !self.live(i) {
                    continue;
                }
                let s = &train[i * STATS_LEN..(i + 1) * STATS_LEN];
                let e =
                    epochs::epoch_stats(epoch, &plan, [s[0] as f64, s[1] as f64], test, started);
                on_epoch(i, &e);
                // A pruned trial ends here, alone; its result is made from `last` at the end.
                let pruned = self.cfgs[i].prune.as_ref().is_some_and(|p| p.stops(&e));
                self.last[i] = Some(e);
                if pruned {
                    self.ends[i] = Some(Ok(TrialResult::default()));
                    self.fused.kill(be, i)?;
                }
            }
            if !self.any_live() {
                break;
            }
        }
        self.tally.epochs_end(be);
        be.synchronize()?;
        Ok(())
    }

    /// Ends every live trial whose training loss in `sums` (every trial's `[Σ loss, #correct]`)
    /// is not finite, and marks it dead for the optimizer.
    fn kill_diverged(
        &mut self,
        be: &mut dyn Backend,
        sums: &[f32],
        epoch: u32,
        step: usize,
    ) -> Result<(), Stop> {
        for i in 0..self.cfgs.len() {
            let loss = sums[i * STATS_LEN];
            if self.live(i) && !loss.is_finite() {
                self.ends[i] = Some(Err(Stop::Failed(Failure::NonFiniteLoss {
                    value: f64::from(loss),
                    epoch: epoch as usize,
                    step,
                })));
                self.fused.kill(be, i)?;
            }
        }
        Ok(())
    }
}
