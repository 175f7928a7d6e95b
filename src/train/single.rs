//! A single trial's steps on one backend: the first eager, then one captured and replayed, a diverged loss caught every few steps; and its evaluation.

use std::convert::Infallible;
use std::time::Instant;

use super::epochs::{self, only_end, only_order, Ends, EpochSums, Member, Schedule, StepAt, Steps};
use super::fault::{FaultKind, FaultSpec};
use super::fit::largest_fitting;
use super::{seeds, EpochStats, TrialConfig, TrialResult};
use crate::engine::{work_signature, Backend, Counted, Split, WorkPart, GRAPH_SLOTS, STATS_LEN};
use crate::error::EngineError;
use crate::models;
use crate::train::stop::{Failure, Stop};
use crate::units::MIB;

/// Trains one trial on `be`, calling `on_epoch` after each epoch.
///
/// The arena is allocated from the backend's (capped) pool before step 0, so a trial that does not
/// fit fails here, having done nothing. On the CPU backend the calling thread flushes subnormal
/// floats to zero until this returns ([`crate::engine::ThreadGuard`]).
pub fn run_trial(
    be: &mut dyn Backend,
    cfg: &TrialConfig,
    on_epoch: &mut dyn FnMut(&EpochStats),
) -> Result<TrialResult, Stop> {
    let started = Instant::now();
    let _guard = be.thread_guard();
    let h = &cfg.hyper;
    let batch = h.batch_size as usize;
    let n_train = be.split_len(Split::Train);
    let n_test = be.split_len(Split::Test);
    if batch > n_train {
        return Err(Stop::from(crate::error::EngineError::Shape {
            op: "train",
            message: format!("batch size {batch} is larger than the {n_train} training samples"),
        }));
    }
    let plan = |be: &dyn Backend, batch: usize| {
        models::build(
            &cfg.model,
            cfg.input,
            cfg.classes,
            batch,
            h.dropout as f32,
            h.optimizer,
            &|s| be.conv_workspace_len(s),
        )
    };
    let mut net = plan(&*be, batch).map_err(|message| crate::error::EngineError::Shape {
        op: "model",
        message,
    })?;
    match be.alloc_arena(net.plan.total) {
        Err(crate::error::EngineError::CapExceeded { need_mib, cap_mib }) => {
            // What the backend adds to the plan (e.g. its BLAS workspace) does not depend on the
            // batch, and a plan only grows with it: search for the largest batch that fits.
            let extra = need_mib * MIB - net.plan.bytes() as f64;
            let need = |b: usize| plan(&*be, b).map(|n| (n.plan.bytes() as f64 + extra) / MIB);
            let fits = |b: usize| Ok::<_, Infallible>(need(b).is_ok_and(|mib| mib <= cap_mib));
            let Ok(lo) = largest_fitting(0, batch, &mut |b| fits(b));
            return Err(Stop::Failed(Failure::DoesNotFit {
                batch,
                need_mib,
                cap_mib,
                largest: (lo > 0).then_some(lo),
                floor_mib: need(1).unwrap_or(need_mib),
            }));
        }
        r => r?,
    }
    net.init(be, seeds::init(cfg.seed))?;
    let graphs = cfg.engine.graphs && be.supports_graphs();
    let be = Counted::new(be);
    let key = super::group_key(cfg);
    let signatures = Signatures::of(&key, 1);
    let plan = Schedule {
        epochs: cfg.epochs,
        n_train,
        batch,
        max_steps: cfg.max_steps,
        warm_up: cfg.warm_up,
    };
    let mut single = Single {
        be,
        net,
        cfg,
        steps_per_epoch: plan.steps_per_epoch(),
        dropout_seed: seeds::dropout(cfg.seed),
        graphs,
        check_every: cfg.engine.check_every.max(1),
        graph: StepGraph::new(graphs),
        n_test,
        tally: Tally::default(),
        signatures,
        eval_graphs: EvalGraphs::new(graphs),
    };
    let ends = epochs::train(
        &mut single,
        &plan,
        &[Member::of(cfg)],
        &cfg.cancel,
        started,
        &mut |_, _, e| on_epoch(&e.stats),
    );
    let mut result = only_end(ends)?;
    single.tally.fill(&mut result);
    Ok(result)
}

/// What a training asked of its backend, from [`Counted`]'s counts: the backend calls of one
/// training step, and the host waits between the start of its first epoch and the end of its
/// last one.
#[derive(Debug, Default)]
pub(super) struct Tally {
    launches_per_step: Option<u64>,
    syncs_at_start: Option<u64>,
    syncs_at_end: Option<u64>,
}

impl Tally {
    /// At the start of an epoch.
    pub(super) fn epoch_begins(&mut self, be: &Counted) {
        self.syncs_at_start.get_or_insert(be.counts().host_syncs);
    }

    /// Around the issue of one training step (eager or captured): `before` is the launch count
    /// before it.
    pub(super) fn step_issued(&mut self, be: &Counted, before: u64) {
        self.launches_per_step
            .get_or_insert(be.counts().launches - before);
    }

    /// After the last epoch, before the final wait.
    pub(super) fn epochs_end(&mut self, be: &Counted) {
        self.syncs_at_end = Some(be.counts().host_syncs);
    }

    /// Writes the counts into a trial's result.
    pub(super) fn fill(&self, r: &mut TrialResult) {
        r.launches_per_step = self.launches_per_step;
        r.host_syncs = match (self.syncs_at_start, self.syncs_at_end) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
    }
}

/// One trial's network on its backend, taking the steps of [`epochs::train`].
struct Single<'a> {
    be: Counted<'a>,
    net: models::Network,
    cfg: &'a TrialConfig,
    steps_per_epoch: usize,
    dropout_seed: u64,
    graphs: bool,
    /// Steps between reads of the loss, to catch a diverged trial.
    check_every: usize,
    graph: StepGraph,
    n_test: usize,
    tally: Tally,
    signatures: Signatures,
    eval_graphs: EvalGraphs,
}

/// The signatures of a training's step and evaluation ([`crate::engine::work_signature`]): where
/// work of the same signature has run already, its kernels are loaded, and its first step or
/// evaluation holds no capture of the process off.
#[derive(Clone, Copy, Debug)]
pub(super) struct Signatures {
    pub(super) step: u64,
    pub(super) evaluation: u64,
}

impl Signatures {
    /// Of a training with fused-group key `key` (a trial alone: its own key) and `width` trials.
    pub(super) fn of(key: &str, width: usize) -> Signatures {
        Signatures {
            step: work_signature(key, width, WorkPart::Step),
            evaluation: work_signature(key, width, WorkPart::Evaluation),
        }
    }

    /// Whether the first step must hold captures off: it loads kernels unless its signature has
    /// run where `be` runs.
    pub(super) fn step_loads(&self, be: &dyn Backend, warm_up: bool) -> bool {
        warm_up && !be.loaded(self.step)
    }

    /// What the evaluation after epoch `epoch` may load.
    pub(super) fn evaluation_loads(&self, be: &dyn Backend, graphs: bool, epoch: u32) -> Loads {
        if be.loaded(self.evaluation) {
            Loads::Done
        } else {
            Loads::at_epoch(graphs, epoch)
        }
    }
}

impl Steps for Single<'_> {
    fn begin_epoch(&mut self, orders: Vec<Vec<u32>>) -> Result<(), Stop> {
        self.tally.epoch_begins(&self.be);
        self.be.set_train_order(only_order(&orders)?)?;
        self.be.fill(self.net.stats, 0.0)?;
        Ok(())
    }

    fn step(&mut self, at: StepAt, _: &mut Ends) -> Result<(), Stop> {
        let (be, net, h) = (&mut self.be, &self.net, &self.cfg.hyper);
        if at.epoch == 1 {
            inject(be, net, self.cfg.fault.as_ref(), at.step)?;
        }
        // The first step runs eagerly even with graphs: it loads every kernel of the step
        // and makes cuBLAS and cuDNN pick theirs in this trial's context, with every
        // capture of the process held off, since a kernel loaded lazily during another
        // trial's capture can invalidate it. The counter makes the captured step the same
        // computation as an eager one.
        let warm_up = at.epoch == 1 && at.step == 0;
        let (steps, seed) = (self.steps_per_epoch, self.dropout_seed);
        let issued = (&self.signatures, &mut self.tally, warm_up);
        self.graph
            .issue(be, issued, |be| net.train_step(be, steps, seed, h))?;
        be.pace(super::STEPS_AHEAD)?;
        // A diverged trial stops soon rather than training on NaNs: a look at the loss every
        // few steps that never waits (the sums of a step a little earlier).
        if (at.step + 1).is_multiple_of(self.check_every) {
            let mut sums = [0f32; STATS_LEN];
            if be.peek(net.stats, &mut sums)? && !sums[0].is_finite() {
                return Err(Stop::Failed(Failure::NonFiniteLoss {
                    value: f64::from(sums[0]),
                    epoch: at.epoch as usize,
                    step: at.step,
                }));
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
        let net = &self.net;
        let mut sums = [0f32; 2 * STATS_LEN];
        let test = if evaluate && self.n_test > 0 {
            // The first evaluation loads its kernels: issued with captures held off, as the
            // first step is.
            let loads = self
                .signatures
                .evaluation_loads(&self.be, self.graphs, epoch);
            let n_test = warm_up_test_len(self.cfg, self.n_test, net.batch);
            let (cancel, graphs) = (&self.cfg.cancel, &mut self.eval_graphs);
            issue_evaluation(&mut self.be, net, n_test, loads, cancel, graphs)?;
            self.be.mark_loaded(self.signatures.evaluation);
            self.be.read_metrics(net.epoch_stats(), &mut sums)?;
            let n = n_test as f64;
            (sums[STATS_LEN] as f64 / n, sums[STATS_LEN + 1] as f64 / n)
        } else {
            self.be.read_metrics(net.stats, &mut sums[..STATS_LEN])?;
            (f64::NAN, f64::NAN)
        };
        if !sums[0].is_finite() {
            return Err(Stop::Failed(Failure::NonFiniteLoss {
                value: f64::from(sums[0]),
                epoch: epoch as usize,
                step: self.steps_per_epoch.saturating_sub(1),
            }));
        }
        Ok(vec![([sums[0] as f64, sums[1] as f64], test)])
    }

    fn finish(&mut self) -> Result<(), Stop> {
        self.tally.epochs_end(&self.be);
        self.be.synchronize()?;
        Ok(())
    }

    fn arena_bytes(&self) -> u64 {
        self.be.allocated_bytes() as u64
    }

    fn param_count(&self) -> u64 {
        self.net.param_count() as u64
    }
}

/// How a trial's steps run with graphs: the first eagerly, then one captured and replayed from
/// then on. A capture that fails (one invalidated by something outside the trial) is followed by
/// an eager step and tried once more; a second failure fails the trial.
#[derive(Debug)]
pub(super) struct StepGraph {
    enabled: bool,
    pub(super) captured: bool,
    failed: bool,
}

impl StepGraph {
    pub(super) fn new(enabled: bool) -> StepGraph {
        StepGraph {
            enabled,
            captured: false,
            failed: false,
        }
    }

    /// Whether this step is to be captured.
    /// Issues one training step (`step`): captured when it is the one to capture, replayed
    /// once captured, else eager, with the process's captures held off while it loads kernels
    /// (`warm_up`: the first step, unless its [`Signatures`] ran here already); the launches of
    /// an eager step are counted in `tally`.
    pub(super) fn issue(
        &mut self,
        be: &mut Counted,
        (signatures, tally, warm_up): (&Signatures, &mut Tally, bool),
        step: impl Fn(&mut dyn Backend) -> Result<(), EngineError>,
    ) -> Result<(), Stop> {
        let before = be.counts().launches;
        if self.wants_capture(warm_up) {
            let captured = capture_step(be, &step);
            self.outcome(captured)?;
        }
        if self.captured {
            be.replay()?;
        } else {
            let loads = signatures.step_loads(be, warm_up);
            let _hold = self.eager_holds(loads).then(|| be.hold_captures());
            step(be)?;
            tally.step_issued(be, before);
            if warm_up {
                be.mark_loaded(signatures.step);
            }
        }
        Ok(())
    }

    pub(super) fn wants_capture(&self, warm_up: bool) -> bool {
        self.enabled && !warm_up && !self.captured
    }

    /// Takes a capture's outcome: `Ok` when the step goes on (replayed, or run eagerly after a
    /// first failure), the error after a second failure.
    pub(super) fn outcome(&mut self, captured: Result<(), Stop>) -> Result<(), Stop> {
        match captured {
            Ok(()) => {
                self.captured = true;
                Ok(())
            }
            Err(e) if !self.failed => {
                self.failed = true;
                tracing::warn!(
                    "capturing the training step failed ({e}); this step runs eagerly and the \
                     next one is captured again"
                );
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Whether an eager step holds every capture of the process off: the first step, and the
    /// eager step after a failed capture (both may load kernels). Without graphs nothing in the
    /// process captures (every trial of a job has the same engine options), so nothing is held.
    pub(super) fn eager_holds(&self, warm_up: bool) -> bool {
        self.enabled && (warm_up || (self.failed && !self.captured))
    }
}

/// Whether work may load kernels that other trials' captures must be kept from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loads {
    /// Issue the work whose kernels may load with the process's captures held off.
    HoldCaptures,
    /// Its kernels are loaded already, or nothing in the process captures.
    Done,
}

impl Loads {
    /// An evaluation after epoch `epoch`: the first one loads its kernels (the last, partial
    /// batch has shapes of its own), which matters only where steps are captured as graphs.
    pub(crate) fn at_epoch(graphs: bool, epoch: u32) -> Loads {
        if graphs && epoch == 1 {
            Loads::HoldCaptures
        } else {
            Loads::Done
        }
    }
}

/// Records the ops `step` issues into the backend's graph (one training step, of a trial or of a
/// fused group). The capture is ended whatever happened, so that the stream is usable again.
pub(super) fn capture_step(
    be: &mut dyn Backend,
    step: impl FnOnce(&mut dyn Backend) -> Result<(), crate::error::EngineError>,
) -> Result<(), Stop> {
    capture_into(be, 0, step)
}

/// Records the ops `work` issues into the backend's graph in `slot`, ending the capture whatever
/// happened, so that the stream is usable again.
pub(super) fn capture_into(
    be: &mut dyn Backend,
    slot: usize,
    work: impl FnOnce(&mut dyn Backend) -> Result<(), crate::error::EngineError>,
) -> Result<(), Stop> {
    be.begin_capture()?;
    let body = work(&mut *be);
    let end = be.end_capture_into(slot);
    body?;
    end?;
    Ok(())
}

/// An evaluation's test batches run as graphs where the backend has them: captured at a
/// training's second evaluation (its first loads its kernels, eagerly), in at most
/// [`GRAPH_SLOTS`]` − 1` chunks of consecutive batches, one graph each, then replayed at every
/// evaluation after. The host is paced and asked to stop between chunks, as between training
/// steps. A capture that fails leaves the evaluations eager from then on.
#[derive(Debug)]
pub(super) struct EvalGraphs {
    enabled: bool,
    captured: bool,
    failed: bool,
    evaluations: u32,
}

impl EvalGraphs {
    pub(super) fn new(enabled: bool) -> EvalGraphs {
        EvalGraphs {
            enabled,
            captured: false,
            failed: false,
            evaluations: 0,
        }
    }

    /// Runs one evaluation of `n_test` samples in batches of `batch` (the last one partial):
    /// `issue(be, start, rows)` issues one batch's ops. With [`Loads::HoldCaptures`] the first
    /// eager chunk holds the process's captures off. [`Stop::Interrupted`] when `stop`
    /// said to stop.
    pub(super) fn run(
        &mut self,
        be: &mut dyn Backend,
        n_test: usize,
        batch: usize,
        loads: Loads,
        stop: &dyn Fn() -> bool,
        issue: &IssueBatch<'_>,
    ) -> Result<(), Stop> {
        let chunks = eval_chunks(n_test, batch);
        let capture = self.enabled && !self.captured && !self.failed && self.evaluations > 0;
        for (k, chunk) in chunks.iter().enumerate() {
            if stop() {
                return Err(Stop::Interrupted);
            }
            let slot = 1 + k;
            if self.captured {
                be.replay_slot(slot)?;
            } else if capture && !self.failed {
                let captured = capture_into(be, slot, |be| {
                    chunk.iter().try_for_each(|&(s, r)| issue(be, s, r))
                });
                match captured {
                    Ok(()) => be.replay_slot(slot)?,
                    Err(e) => {
                        tracing::warn!(
                            "capturing an evaluation failed ({e}); evaluations run eagerly"
                        );
                        self.failed = true;
                        for &(s, r) in chunk {
                            issue(be, s, r)?;
                        }
                    }
                }
            } else {
                let _hold = (loads == Loads::HoldCaptures && k == 0).then(|| be.hold_captures());
                for &(s, r) in chunk {
                    issue(be, s, r)?;
                }
            }
            be.pace(super::STEPS_AHEAD)?;
        }
        self.evaluations += 1;
        if capture && !self.failed {
            self.captured = true;
        }
        Ok(())
    }
}

/// The test samples an evaluation covers: all of them, or for a warm-up the first batch alone
/// (every batch runs the same shapes, so one loads every kernel an evaluation runs).
pub(super) fn warm_up_test_len(cfg: &TrialConfig, n_test: usize, batch: usize) -> usize {
    if cfg.warm_up {
        n_test.min(batch)
    } else {
        n_test
    }
}

/// Issues one evaluation batch: `(backend, start, rows)`.
pub(super) type IssueBatch<'a> =
    dyn Fn(&mut dyn Backend, usize, usize) -> Result<(), EngineError> + 'a;

/// The test batches `(start, rows)` of `n_test` samples in batches of `batch`, in at most
/// [`GRAPH_SLOTS`]` − 1` chunks of consecutive batches, as even as they can be.
pub(super) fn eval_chunks(n_test: usize, batch: usize) -> Vec<Vec<(usize, usize)>> {
    let batch = batch.max(1);
    let batches: Vec<(usize, usize)> = (0..n_test.div_ceil(batch))
        .map(|b| (b * batch, batch.min(n_test - b * batch)))
        .collect();
    let per = batches.len().div_ceil(GRAPH_SLOTS - 1).max(1);
    batches.chunks(per).map(<[_]>::to_vec).collect()
}

/// Issues an evaluation of the first `n_test` test samples into the network's test sums (zeroed
/// first), in batches (the last one partial; [`models::Network::eval_batch`]) run by `graphs`,
/// paced like the training steps and stopped by `cancel` between batches. Nothing is read.
fn issue_evaluation(
    be: &mut dyn Backend,
    net: &models::Network,
    n_test: usize,
    loads: Loads,
    cancel: &crate::cancel::Cancel,
    graphs: &mut EvalGraphs,
) -> Result<(), Stop> {
    be.fill(net.test_stats, 0.0)?;
    let stop = || cancel.aborted();
    let issue = |be: &mut dyn Backend, start: usize, rows: usize| net.eval_batch(be, start, rows);
    graphs.run(be, n_test, net.batch, loads, &stop, &issue)
}

/// Mean loss and accuracy over the test split ([`issue_evaluation`], then one read of the test
/// sums); NaN for an empty test split.
pub(crate) fn evaluate(
    be: &mut dyn Backend,
    net: &models::Network,
    n_test: usize,
    loads: Loads,
    cancel: &crate::cancel::Cancel,
) -> Result<(f64, f64), Stop> {
    if n_test == 0 {
        return Ok((f64::NAN, f64::NAN));
    }
    issue_evaluation(be, net, n_test, loads, cancel, &mut EvalGraphs::new(false))?;
    let mut stats = [0f32; STATS_LEN];
    be.read(net.test_stats, &mut stats)?;
    Ok((
        stats[0] as f64 / n_test as f64,
        stats[1] as f64 / n_test as f64,
    ))
}

/// Carries out an injected fault at its step.
pub(super) fn inject(
    be: &mut dyn Backend,
    net: &models::Network,
    fault: Option<&FaultSpec>,
    step: usize,
) -> Result<(), Stop> {
    let Some(f) = fault else { return Ok(()) };
    if f.step as usize != step {
        return Ok(());
    }
    match f.kind {
        FaultKind::Panic => panic!("injected panic at step {step}"),
        FaultKind::Nan => be.fill(net.params, f32::NAN)?,
        FaultKind::Abort => std::process::abort(),
        FaultKind::Kill => {
            // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Dataset;
    use crate::engine::cpu::CpuBackend;
    use crate::engine::EngineOptions;
    use crate::models::{Hyper, ModelKind, ModelSpec, Optimizer};
    use std::sync::Arc;

    fn config(batch: u32) -> TrialConfig {
        let mut model = ModelSpec::of(ModelKind::Resnet50);
        model.width = Some(0.0625);
        TrialConfig {
            model,
            hyper: Hyper {
                lr: 0.1,
                batch_size: batch,
                optimizer: Optimizer::Sgd,
                momentum: 0.9,
                weight_decay: 0.0,
                dropout: 0.0,
            },
            epochs: 1,
            seed: 1,
            input: [3, 16, 16],
            classes: 10,
            fault: None,
            engine: EngineOptions::default(),
            max_steps: Some(1),
            warm_up: false,
            cancel: Default::default(),
            prune: None,
        }
    }

    fn backend(cap_mib: f64) -> CpuBackend {
        let data = Dataset::zeros("zeros", [3, 16, 16], 10, 256, 10);
        CpuBackend::new(Arc::new(data), Some((cap_mib * MIB) as u64))
    }

    #[test]
    fn an_aborted_cancel_stops_an_evaluation_between_batches() {
        let mut be = backend(64.0);
        let c = config(4);
        let mut net = models::build(&c.model, c.input, 10, 4, 0.0, Optimizer::Sgd, &|s| {
            be.conv_workspace_len(s)
        })
        .unwrap();
        be.alloc_arena(net.plan.total).unwrap();
        net.init(&mut be, seeds::init(1)).unwrap();
        let cancel = crate::cancel::Cancel::new();
        let (loss, acc) = evaluate(&mut be, &net, 10, Loads::Done, &cancel).unwrap();
        assert!(loss.is_finite() && (0.0..=1.0).contains(&acc));
        cancel.abort();
        let e = evaluate(&mut be, &net, 10, Loads::Done, &cancel).unwrap_err();
        assert!(matches!(e, Stop::Interrupted), "{e}");
    }

    #[test]
    fn evaluation_chunks_cover_every_batch_in_order_within_the_graph_slots() {
        for (n_test, batch) in [
            (2000, 64),
            (10000, 32),
            (7, 4),
            (5, 5),
            (1, 64),
            (0, 8),
            (33, 1),
        ] {
            let chunks = eval_chunks(n_test, batch);
            assert!(
                chunks.len() < GRAPH_SLOTS,
                "{n_test}/{batch}: {}",
                chunks.len()
            );
            let flat: Vec<_> = chunks.concat();
            assert_eq!(flat.iter().map(|b| b.1).sum::<usize>(), n_test);
            let mut next = 0;
            for &(start, rows) in &flat {
                assert_eq!(start, next);
                assert!(rows >= 1 && rows <= batch);
                next += rows;
            }
            // Chunks differ by at most one chunk's share, the last may be shorter.
            if let Some(first) = chunks.first() {
                assert!(chunks.iter().all(|c| c.len() <= first.len()));
            }
        }
        assert_eq!(eval_chunks(2000, 64).len(), 32);
        assert_eq!(eval_chunks(10000, 32).len(), 32);
    }

    #[test]
    fn a_failed_capture_gets_one_eager_step_and_one_more_try() {
        let failed = || Err(Stop::worker("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"));
        // Warm-up: eager and holding captures off; no capture yet.
        let mut g = StepGraph::new(true);
        assert!(!g.wants_capture(true) && g.eager_holds(true));
        // The first capture fails: the step runs eagerly, holding captures off.
        assert!(g.wants_capture(false));
        assert!(g.outcome(failed()).is_ok());
        assert!(!g.captured && g.eager_holds(false));
        // The next step is captured again, and from then on replayed without holding anything.
        assert!(g.wants_capture(false));
        assert!(g.outcome(Ok(())).is_ok());
        assert!(g.captured && !g.wants_capture(false) && !g.eager_holds(false));
        // Two failures in a row fail the trial with the second error.
        let mut g = StepGraph::new(true);
        assert!(g.outcome(failed()).is_ok());
        let e = g.outcome(failed()).unwrap_err();
        assert!(e.to_string().contains("INVALIDATED"), "{e}");
        // Without graphs nothing is captured, and nothing is held.
        let g = StepGraph::new(false);
        assert!(!g.wants_capture(false) && !g.eager_holds(false) && !g.eager_holds(true));
    }

    #[test]
    fn a_batch_over_the_cap_names_the_largest_batch_that_fits() {
        let plan_mib = |b: u32| {
            let c = config(b);
            let n = models::build(
                &c.model,
                c.input,
                10,
                b as usize,
                0.0,
                Optimizer::Sgd,
                &|s| s.ws_len(),
            )
            .unwrap();
            n.plan.bytes() as f64 / MIB
        };
        // A cap between the plans of batch 37 and 38.
        let cap = (plan_mib(37) + plan_mib(38)) / 2.0;
        let e = run_trial(&mut backend(cap), &config(128), &mut |_| {}).unwrap_err();
        match e {
            Stop::Failed(Failure::DoesNotFit { batch, largest, .. }) => {
                assert_eq!((batch, largest), (128, Some(37)), "{e}")
            }
            other => panic!("{other}"),
        }
        assert!(
            e.to_string().contains("the largest batch that fits is 37"),
            "{e}"
        );
        // And batch 37 does run under that cap.
        assert!(run_trial(&mut backend(cap), &config(37), &mut |_| {}).is_ok());
        // Under the parameters' own size, nothing fits.
        let e = run_trial(&mut backend(0.5), &config(8), &mut |_| {}).unwrap_err();
        assert!(
            e.to_string().contains("no batch size fits (batch 1 needs"),
            "{e}"
        );
    }

    #[test]
    fn a_cpu_trial_flushes_subnormals_while_it_runs_and_restores_the_mode() {
        use crate::engine::cpu::denormals::flushing;
        let supported = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));
        std::thread::spawn(move || {
            assert!(!flushing());
            let mut seen = Vec::new();
            run_trial(&mut backend(64.0), &config(8), &mut |_| {
                seen.push(flushing())
            })
            .unwrap();
            assert!(
                !seen.is_empty() && seen.iter().all(|&f| f == supported),
                "{seen:?}"
            );
            assert!(!flushing(), "the trial's thread gets its mode back");
        })
        .join()
        .unwrap();
    }

    /// 20 epochs of an MLP with Adam, with and without flushing subnormals, on fresh threads.
    #[test]
    fn flushing_subnormals_keeps_a_trained_mlp_within_1e_6_of_training_without() {
        use crate::data::synthetic;
        use crate::engine::cpu::denormals::FlushGuard;
        let (train, test) = synthetic::generate([1, 12, 12], 10, 600, 100, 7).unwrap();
        let d = Arc::new(Dataset::in_memory(
            "synthetic",
            [1, 12, 12],
            10,
            train,
            test,
        ));
        let run = |flush: bool| {
            let d = Arc::clone(&d);
            std::thread::spawn(move || {
                let _g = FlushGuard::when(flush);
                let mut spec = ModelSpec::of(ModelKind::Mlp);
                spec.hidden = Some(vec![32]);
                let h = Hyper {
                    lr: 0.002,
                    batch_size: 50,
                    optimizer: Optimizer::Adam,
                    momentum: 0.9,
                    weight_decay: 0.0,
                    dropout: 0.0,
                };
                let mut be = CpuBackend::new(d, None);
                let mut net =
                    crate::train::mirrored::plan_on(&mut be, &spec, [1, 12, 12], 10, 50, &h)
                        .unwrap();
                net.init(&mut be, seeds::init(3)).unwrap();
                for epoch in 1..=20 {
                    be.set_train_order(&seeds::epoch_order(3, epoch, 600))
                        .unwrap();
                    for _ in 0..12 {
                        net.train_step(&mut be, 12, seeds::dropout(3), &h).unwrap();
                    }
                }
                let mut p = vec![0f32; net.params.len];
                be.read(net.params, &mut p).unwrap();
                p
            })
            .join()
            .unwrap()
        };
        let (flushed, kept) = (run(true), run(false));
        assert!(flushed.iter().all(|x| x.is_finite() && !x.is_subnormal()));
        let (mut d2, mut w2, mut worst) = (0f64, 0f64, 0f64);
        for (&a, &b) in flushed.iter().zip(&kept) {
            let (a, b) = (a as f64, b as f64);
            d2 += (a - b).powi(2);
            w2 += b * b;
            worst = worst.max((a - b).abs());
        }
        let subnormal = kept.iter().filter(|x| x.is_subnormal()).count();
        let rel = (d2 / w2).sqrt();
        assert!(
            rel < 1e-6 && worst < 1e-6,
            "‖Δ‖/‖w‖ {rel:.2e}, worst {worst:.2e}, {subnormal} subnormal weights without flushing"
        );
    }
}
