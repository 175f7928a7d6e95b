//! Fused groups: N compatible trials trained as one batched model on one backend (`split: fused`), each with its own hyperparameters, seed, data order, results and failure.

use std::time::Instant;

use super::epochs::{self, Ends, EpochSums, Member, Schedule, StepAt, Steps};
use super::single::{inject, warm_up_test_len, EvalGraphs, Signatures, StepGraph, Tally};
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
    let plan = schedule(first, n_train);
    let graphs = first.engine.graphs && be.supports_graphs();
    let mut group = Group {
        be: Counted::new(be),
        fused,
        cfgs,
        steps: plan.steps(),
        steps_per_epoch: plan.steps_per_epoch(),
        dropout_seeds: cfgs.iter().map(|c| seeds::dropout(c.seed)).collect(),
        check_every: first.engine.check_every.max(1),
        graphs,
        graph: StepGraph::new(graphs),
        signatures: Signatures::of(&key, cfgs.len()),
        eval_graphs: EvalGraphs::new(graphs),
        peeked: vec![0f32; cfgs.len() * STATS_LEN],
        sums: vec![0f32; 2 * cfgs.len() * STATS_LEN],
        tally: Tally::default(),
        params: single.param_count() as u64,
    };
    if let Err(e) = group.start() {
        return cfgs.iter().map(|_| Err(e.clone())).collect();
    }
    let members: Vec<Member> = cfgs
        .iter()
        .map(|c| Member {
            seed: c.seed,
            prune: c.prune.as_ref(),
        })
        .collect();
    let mut ends = epochs::train(
        &mut group,
        &plan,
        &members,
        &first.cancel,
        started,
        &mut |_, i, e| on_epoch(i, &e.stats),
    );
    for r in ends.iter_mut().flatten() {
        group.tally.fill(r);
    }
    ends
}

/// A trial's epochs and steps.
fn schedule(cfg: &TrialConfig, n_train: usize) -> Schedule {
    Schedule {
        epochs: cfg.epochs,
        n_train,
        batch: cfg.hyper.batch_size as usize,
        max_steps: cfg.max_steps,
        warm_up: cfg.warm_up,
    }
}

/// A group in training: its network on its backend, taking the steps of [`epochs::train`] for
/// every trial at once.
struct Group<'a> {
    be: Counted<'a>,
    fused: FusedNetwork,
    cfgs: &'a [TrialConfig],
    /// Steps each epoch takes, and of a whole epoch.
    steps: usize,
    steps_per_epoch: usize,
    dropout_seeds: Vec<u64>,
    /// Steps between looks at the losses, to catch a diverged trial.
    check_every: usize,
    graphs: bool,
    graph: StepGraph,
    signatures: Signatures,
    eval_graphs: EvalGraphs,
    /// Every trial's sums as a look sees them, and as an epoch ends (training, then test).
    peeked: Vec<f32>,
    sums: Vec<f32>,
    /// What the group asked of its backend (every trial's row carries the group's counts).
    tally: Tally,
    /// One trial's parameters.
    params: u64,
}

impl Group<'_> {
    /// Every trial's initial weights and its hyperparameters, written before the first epoch.
    fn start(&mut self) -> Result<(), Stop> {
        for (m, cfg) in self.fused.members.iter_mut().zip(self.cfgs) {
            m.init(&mut self.be, seeds::init(cfg.seed))?;
        }
        let hypers: Vec<_> = self.cfgs.iter().map(|c| c.hyper.clone()).collect();
        self.fused
            .write_hyper(&mut self.be, &hypers, &self.dropout_seeds)?;
        debug_assert_eq!(self.fused.hyper.len, self.cfgs.len() * HYPER_LEN);
        Ok(())
    }

    /// Ends every live trial whose training loss in `sums` (every trial's `[Σ loss, #correct]`)
    /// is not finite, and marks it dead for the optimizer.
    fn kill_diverged(
        be: &mut Counted,
        fused: &mut FusedNetwork,
        sums: &[f32],
        (epoch, step): (u32, usize),
        ends: &mut Ends,
    ) -> Result<(), Stop> {
        for (i, s) in sums.chunks(STATS_LEN).enumerate() {
            let loss = s[0];
            if ends.live(i) && !loss.is_finite() {
                ends.stop(
                    i,
                    Stop::Failed(Failure::NonFiniteLoss {
                        value: f64::from(loss),
                        epoch: epoch as usize,
                        step,
                    }),
                );
                fused.kill(be, i)?;
            }
        }
        Ok(())
    }
}

impl Steps for Group<'_> {
    fn width(&self) -> usize {
        self.cfgs.len()
    }

    fn begin_epoch(&mut self, orders: Vec<Vec<u32>>) -> Result<(), Stop> {
        self.tally.epoch_begins(&self.be);
        // Every trial's order in one upload (a dead trial's too: its regions are its own).
        self.fused.write_orders(&mut self.be, &orders)?;
        self.be.fill(self.fused.stats(), 0.0)?;
        Ok(())
    }

    fn step(&mut self, at: StepAt, ends: &mut Ends) -> Result<(), Stop> {
        let be = &mut self.be;
        if at.epoch == 1 {
            for (m, cfg) in self.fused.members.iter().zip(self.cfgs) {
                inject(be, m, cfg.fault.as_ref(), at.step)?;
            }
        }
        let warm_up = at.epoch == 1 && at.step == 0;
        let (fused, steps, seeds) = (&self.fused, self.steps_per_epoch, &self.dropout_seeds);
        let issued = (&self.signatures, &mut self.tally, warm_up);
        self.graph
            .issue(be, issued, |be| fused.train_step(be, steps, seeds))?;
        be.pace(super::STEPS_AHEAD)?;
        // A diverged trial stops soon, alone; the others go on. The look never waits: it sees
        // the sums of a step a little earlier.
        if (at.step + 1).is_multiple_of(self.check_every)
            && be.peek(self.fused.stats(), &mut self.peeked)?
        {
            let at = (at.epoch, at.step);
            Self::kill_diverged(be, &mut self.fused, &self.peeked, at, ends)?;
        }
        Ok(())
    }

    fn end_epoch(
        &mut self,
        epoch: u32,
        evaluate: bool,
        ends: &mut Ends,
    ) -> Result<Vec<EpochSums>, Stop> {
        let n = self.cfgs.len();
        let first = &self.cfgs[0];
        let n_test = self.be.split_len(Split::Test);
        let be = &mut self.be;
        // Every trial's test figures in one pass over the test split (a dead trial's too,
        // unread: its regions are its own), then one read of every trial's sums.
        let tests = if evaluate && n_test > 0 {
            let loads = self.signatures.evaluation_loads(be, self.graphs, epoch);
            be.fill(self.fused.test_stats(), 0.0)?;
            let stop = || first.cancel.aborted();
            let fused = &self.fused;
            let issue =
                |be: &mut dyn Backend, start: usize, rows: usize| fused.eval_batch(be, start, rows);
            let batch = fused.first_batch();
            let n_test = warm_up_test_len(first, n_test, batch);
            self.eval_graphs
                .run(be, n_test, batch, loads, &stop, &issue)?;
            be.mark_loaded(self.signatures.evaluation);
            be.read_metrics(self.fused.epoch_stats(), &mut self.sums)?;
            let mean = |v: f32| v as f64 / n_test as f64;
            self.sums[n * STATS_LEN..]
                .chunks(STATS_LEN)
                .map(|s| (mean(s[0]), mean(s[1])))
                .collect()
        } else {
            be.read_metrics(self.fused.stats(), &mut self.sums[..n * STATS_LEN])?;
            vec![(f64::NAN, f64::NAN); n]
        };
        let train = &self.sums[..n * STATS_LEN];
        let at = (epoch, self.steps.saturating_sub(1));
        Self::kill_diverged(be, &mut self.fused, train, at, ends)?;
        Ok(train
            .chunks(STATS_LEN)
            .zip(tests)
            .map(|(s, test)| ([s[0] as f64, s[1] as f64], test))
            .collect())
    }

    fn end_member(&mut self, i: usize) -> Result<(), Stop> {
        self.fused.kill(&mut self.be, i)?;
        Ok(())
    }

    fn finish(&mut self) -> Result<(), Stop> {
        self.tally.epochs_end(&self.be);
        self.be.synchronize()?;
        Ok(())
    }

    fn arena_bytes(&self) -> u64 {
        (self.be.allocated_bytes() / self.cfgs.len().max(1)) as u64
    }

    fn param_count(&self) -> u64 {
        self.params
    }
}
