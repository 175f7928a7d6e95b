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

/// What a fused group tells, and asks of, whoever runs it. Its trials are numbered: those it was
/// given, in order, then those [`GroupHooks::next`] gave it, in the order taken.
pub trait GroupHooks {
    /// Trial `id` trained an epoch.
    fn epoch(&mut self, id: usize, stats: &EpochStats);
    /// Trial `id` ended: its result, or why it has none. Every trial gets one end.
    fn end(&mut self, id: usize, end: Result<TrialResult, Stop>);
    /// A trial for a slot freed at an epoch boundary (of the group's [`group_key`]: another
    /// fails at once); `None` when there is none now.
    fn next(&mut self) -> Option<TrialConfig> {
        None
    }
}

/// Trains `cfgs` (trials of one [`group_key`]) as one fused group on `be`, calling
/// `on_epoch(i, stats)` after each epoch of trial `i`. Returns each trial's end, in order.
/// See [`run_refilled`].
pub fn run_group(
    be: &mut dyn Backend,
    cfgs: &[TrialConfig],
    on_epoch: &mut dyn FnMut(usize, &EpochStats),
) -> GroupEnds {
    struct Collect<'f> {
        on_epoch: &'f mut dyn FnMut(usize, &EpochStats),
        ends: Vec<Option<Result<TrialResult, Stop>>>,
    }
    impl GroupHooks for Collect<'_> {
        fn epoch(&mut self, id: usize, stats: &EpochStats) {
            (self.on_epoch)(id, stats)
        }
        fn end(&mut self, id: usize, end: Result<TrialResult, Stop>) {
            if let Some(slot) = self.ends.get_mut(id) {
                *slot = Some(end);
            }
        }
    }
    let mut hooks = Collect {
        on_epoch,
        ends: cfgs.iter().map(|_| None).collect(),
    };
    run_refilled(be, cfgs.to_vec(), cfgs.len(), &mut hooks);
    hooks
        .ends
        .into_iter()
        .map(|e| e.unwrap_or_else(|| Err(Stop::worker("the fused group gave this trial no end"))))
        .collect()
}

/// Trains `cfgs` (trials of one [`group_key`]) as one fused group of `width` slots (at least
/// one per trial) on `be`: each trial's epochs and end go to `hooks` as they happen. When epochs
/// run whole, a slot that a trial leaves (pruned, diverged, or done), or that no trial held at
/// the start, takes the trial [`GroupHooks::next`] gives it at the next epoch boundary, which
/// then trains from its own first epoch while the others go on: the group stays full as long
/// as trials come. The group ends once no slot holds a trial.
///
/// Each trial computes what it computes alone ([`run_trial`]): on the CPU backend bit for bit,
/// a trial that took a freed slot too. A trial whose loss turns non-finite fails alone and the
/// others go on. A group whose arena does not fit under the backend's cap trains with as many
/// slots as fit (in parts one after another, when slots cannot be refilled); a trial that does
/// not fit alone fails as it would alone.
pub fn run_refilled(
    be: &mut dyn Backend,
    cfgs: Vec<TrialConfig>,
    width: usize,
    hooks: &mut dyn GroupHooks,
) {
    let Some(first) = cfgs.first().cloned() else {
        return;
    };
    let key = group_key(&first);
    if let Some(odd) = cfgs.iter().position(|c| group_key(c) != key) {
        let why = format!("trial {odd} of a fused group does not share the first one's model, batch, optimizer or epochs");
        for id in 0..cfgs.len() {
            hooks.end(id, Err(Stop::worker(why.clone())));
        }
        return;
    }
    let _guard = be.thread_guard();
    let started = Instant::now();
    let alone = |be: &mut dyn Backend, hooks: &mut dyn GroupHooks| {
        for (id, cfg) in cfgs.iter().enumerate() {
            let end = run_trial(be, cfg, &mut |s| hooks.epoch(id, s));
            hooks.end(id, end);
        }
    };
    let fail_all = |hooks: &mut dyn GroupHooks, e: Stop| {
        for id in 0..cfgs.len() {
            hooks.end(id, Err(e.clone()));
        }
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
        _ => return alone(be, hooks),
    };
    let plan = schedule(&first, n_train);
    let network = |width: usize| {
        let dropout: Vec<f32> = (0..width)
            .map(|i| cfgs.get(i).map_or(0.0, |c| c.hyper.dropout as f32))
            .collect();
        FusedNetwork::new(&single, &dropout, n_train).map_err(|message| {
            Stop::from(EngineError::Shape {
                op: "fused",
                message,
            })
        })
    };
    let mut width = width.max(cfgs.len());
    let mut fused = match network(width) {
        Ok(f) => f,
        Err(e) => return fail_all(hooks, e),
    };
    // A slot takes a new trial only at the boundary of a whole epoch (see `epochs::train_slots`).
    let refills = plan.whole_epochs() && fused.restartable();
    if !refills && width > cfgs.len() {
        width = cfgs.len();
        fused = match network(width) {
            Ok(f) => f,
            Err(e) => return fail_all(hooks, e),
        };
    }
    match be.alloc_arena(fused.plan.total) {
        Ok(()) => {}
        Err(EngineError::CapExceeded { need_mib, cap_mib }) => {
            // What the backend adds to the plan does not depend on the group's width.
            let extra = need_mib * MIB - fused.plan.bytes() as f64;
            let per_slot = (fused.plan.bytes() / width) as f64;
            let fit = ((cap_mib * MIB - extra) / per_slot).floor().max(0.0) as usize;
            if fit == 0 {
                return alone(be, hooks);
            }
            let fit = fit.min(width - 1);
            tracing::info!(
                "a fused group of {width} trials needs {need_mib:.1} MiB, above the cap of \
                 {cap_mib:.1} MiB: it trains as groups of {fit}"
            );
            // Parts that fit, one after another; the last keeps its slots full from `hooks`
            // when it refills (its trials taken after the group's own are numbered on from
            // them).
            let parts: Vec<&[TrialConfig]> = cfgs.chunks(fit).collect();
            let count = parts.len();
            for (k, part) in parts.into_iter().enumerate() {
                let last = k + 1 == count;
                let mut part_hooks = Offset {
                    base: k * fit,
                    len: part.len(),
                    taken_base: cfgs.len(),
                    next: last,
                    inner: &mut *hooks,
                };
                let slots = if last && refills { fit } else { part.len() };
                run_refilled(be, part.to_vec(), slots, &mut part_hooks);
            }
            return;
        }
        Err(e) => return fail_all(hooks, e.into()),
    }
    let graphs = first.engine.graphs && be.supports_graphs();
    let slots: Vec<Option<TrialConfig>> = (0..width).map(|i| cfgs.get(i).cloned()).collect();
    let signatures = Signatures::of(&key, width);
    let mut group = Group {
        be: Counted::new(be),
        fused,
        key,
        slots,
        joined: vec![0; width],
        steps: plan.steps(),
        steps_per_epoch: plan.steps_per_epoch(),
        dropout_seeds: (0..width)
            .map(|i| seeds::dropout(cfgs.get(i).unwrap_or(&first).seed))
            .collect(),
        check_every: first.engine.check_every.max(1),
        graphs,
        graph: StepGraph::new(graphs),
        signatures,
        eval_graphs: EvalGraphs::new(graphs),
        peeked: vec![0f32; width * STATS_LEN],
        stale_look: vec![false; width],
        sums: vec![0f32; 2 * width * STATS_LEN],
        tally: Tally::default(),
        training: false,
        params: single.param_count() as u64,
        first,
    };
    if let Err(e) = group.start() {
        return fail_all(hooks, e);
    }
    let members: Vec<Option<Member>> = group
        .slots
        .iter()
        .map(|c| c.as_ref().map(Member::of))
        .collect();
    let cancel = group.first.cancel.clone();
    let mut joins = Joins { hooks, refills };
    epochs::train_slots(&mut group, &plan, members, &cancel, started, &mut joins);
}

/// The hooks of a part of a group of `taken_base` trials: the part's own `len` trials are
/// numbered from `base` in the whole, and those it takes (from `inner`, when `next`) from
/// `taken_base` on.
struct Offset<'h> {
    base: usize,
    len: usize,
    taken_base: usize,
    next: bool,
    inner: &'h mut dyn GroupHooks,
}

impl Offset<'_> {
    fn id(&self, id: usize) -> usize {
        match id.checked_sub(self.len) {
            None => self.base + id,
            Some(taken) => self.taken_base + taken,
        }
    }
}

impl GroupHooks for Offset<'_> {
    fn epoch(&mut self, id: usize, stats: &EpochStats) {
        let id = self.id(id);
        self.inner.epoch(id, stats)
    }
    fn end(&mut self, id: usize, end: Result<TrialResult, Stop>) {
        let id = self.id(id);
        self.inner.end(id, end)
    }
    fn next(&mut self) -> Option<TrialConfig> {
        if self.next {
            self.inner.next()
        } else {
            None
        }
    }
}

/// The training loop's hooks for a group: its trials' epochs and ends passed on (with the
/// group's counts), and a freed slot refilled when `refills`.
struct Joins<'h> {
    hooks: &'h mut dyn GroupHooks,
    refills: bool,
}

impl epochs::Hooks<Group<'_>> for Joins<'_> {
    fn epoch(&mut self, _: &mut Group, id: usize, e: &epochs::Epoch) {
        self.hooks.epoch(id, &e.stats)
    }

    fn end(&mut self, g: &mut Group, id: usize, mut end: Result<TrialResult, Stop>) {
        if let Ok(r) = &mut end {
            if g.training {
                // The host waits so far, for a trial that ends while the group trains on.
                g.tally.epochs_end(&g.be);
            }
            g.tally.fill(r);
        }
        self.hooks.end(id, end)
    }

    fn join(
        &mut self,
        g: &mut Group,
        slot: usize,
        epochs_done: u32,
    ) -> Option<Result<Member, Stop>> {
        if !self.refills {
            return None;
        }
        let cfg = self.hooks.next()?;
        Some(g.restart(slot, cfg, epochs_done))
    }
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

/// A group in training: its network on its backend, taking the steps of
/// [`epochs::train_slots`] for every slot at once.
struct Group<'a> {
    be: Counted<'a>,
    fused: FusedNetwork,
    /// The trials' [`group_key`], and the first trial: what every slot shares.
    key: String,
    first: TrialConfig,
    /// The trial in each slot, while it holds one.
    slots: Vec<Option<TrialConfig>>,
    /// The group's epochs done when each slot's trial joined.
    joined: Vec<u32>,
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
    /// Every slot's sums as a look sees them, and as an epoch ends (training, then test).
    peeked: Vec<f32>,
    /// Slots whose trial joined after the look on its way was issued: that look's sums are the
    /// trial before's (a diverged one's NaN, say), and are not this trial's to judge.
    stale_look: Vec<bool>,
    sums: Vec<f32>,
    /// What the group asked of its backend (every trial's row carries the group's counts).
    tally: Tally,
    /// Between the start of an epoch and the last wait.
    training: bool,
    /// One trial's parameters.
    params: u64,
}

impl Group<'_> {
    /// Every slot's initial weights and hyperparameters, written before the first epoch (a slot
    /// with no trial gets the first's, and is dead until a trial takes it).
    fn start(&mut self) -> Result<(), Stop> {
        let first = &self.first;
        for (m, cfg) in self.fused.members.iter_mut().zip(&self.slots) {
            m.init(
                &mut self.be,
                seeds::init(cfg.as_ref().unwrap_or(first).seed),
            )?;
        }
        let hypers: Vec<_> = self
            .slots
            .iter()
            .map(|c| c.as_ref().unwrap_or(first).hyper.clone())
            .collect();
        self.fused
            .write_hyper(&mut self.be, &hypers, &self.dropout_seeds)?;
        debug_assert_eq!(self.fused.hyper.len, self.slots.len() * HYPER_LEN);
        for (i, cfg) in self.slots.iter().enumerate() {
            if cfg.is_none() {
                self.fused.kill(&mut self.be, i)?;
            }
        }
        Ok(())
    }

    /// Starts `cfg` in the free slot `slot` after the group's `epochs_done` epochs (whole ones):
    /// the trial as it trains in the group from then on.
    fn restart(&mut self, slot: usize, cfg: TrialConfig, epochs_done: u32) -> Result<Member, Stop> {
        if group_key(&cfg) != self.key {
            return Err(Stop::worker(
                "a trial given to a fused group's freed slot does not share the group's model, batch, optimizer or epochs",
            ));
        }
        let step0 = u32::try_from(epochs_done as usize * self.steps_per_epoch)
            .map_err(|_| Stop::worker("a fused group's step counter would overflow"))?;
        let dropout_seed = seeds::dropout(cfg.seed);
        let seeds = (seeds::init(cfg.seed), dropout_seed);
        self.fused
            .restart(&mut self.be, slot, &cfg.hyper, seeds, step0)?;
        let member = Member::of(&cfg);
        self.dropout_seeds[slot] = dropout_seed;
        self.joined[slot] = epochs_done;
        self.stale_look[slot] = true;
        self.slots[slot] = Some(cfg);
        Ok(member)
    }

    /// Ends every live trial whose training loss in `sums` (every slot's `[Σ loss, #correct]`)
    /// is not finite, and marks it dead for the optimizer. `epoch` is the group's; each trial's
    /// failure names its own (`joined`).
    fn kill_diverged(
        be: &mut Counted,
        fused: &mut FusedNetwork,
        sums: &[f32],
        joined: &[u32],
        (epoch, step): (u32, usize),
        ends: &mut Ends,
    ) -> Result<(), Stop> {
        for (i, s) in sums.chunks(STATS_LEN).enumerate() {
            let loss = s[0];
            if ends.live(i) && !loss.is_finite() {
                let own = epoch - joined.get(i).copied().unwrap_or(0);
                ends.stop(
                    i,
                    Stop::Failed(Failure::NonFiniteLoss {
                        value: f64::from(loss),
                        epoch: own as usize,
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
        self.slots.len()
    }

    fn begin_epoch(&mut self, orders: Vec<Vec<u32>>) -> Result<(), Stop> {
        self.training = true;
        self.tally.epoch_begins(&self.be);
        // Every trial's order in one upload (a dead trial's too: its regions are its own).
        self.fused.write_orders(&mut self.be, &orders)?;
        self.be.fill(self.fused.stats(), 0.0)?;
        Ok(())
    }

    fn step(&mut self, at: StepAt, ends: &mut Ends) -> Result<(), Stop> {
        let be = &mut self.be;
        // A trial's faults strike in its own first epoch.
        for ((m, cfg), &joined) in self.fused.members.iter().zip(&self.slots).zip(&self.joined) {
            if let Some(cfg) = cfg.as_ref().filter(|_| at.epoch == joined + 1) {
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
            // A look issued before a trial joined (a backend's look lags a step or more) shows
            // the sums of the trial before it in that slot: skipped, once.
            for (sums, stale) in self
                .peeked
                .chunks_mut(STATS_LEN)
                .zip(self.stale_look.iter_mut())
            {
                if std::mem::take(stale) {
                    sums[0] = 0.0;
                }
            }
            let at = (at.epoch, at.step);
            Self::kill_diverged(be, &mut self.fused, &self.peeked, &self.joined, at, ends)?;
        }
        Ok(())
    }

    fn end_epoch(
        &mut self,
        epoch: u32,
        evaluate: bool,
        ends: &mut Ends,
    ) -> Result<Vec<EpochSums>, Stop> {
        let n = self.slots.len();
        let first = &self.first;
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
        Self::kill_diverged(be, &mut self.fused, train, &self.joined, at, ends)?;
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
        self.training = false;
        self.tally.epochs_end(&self.be);
        self.be.synchronize()?;
        Ok(())
    }

    fn arena_bytes(&self) -> u64 {
        (self.be.allocated_bytes() / self.slots.len().max(1)) as u64
    }

    fn param_count(&self) -> u64 {
        self.params
    }
}
