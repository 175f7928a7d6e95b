//! Thread workers (`shared`, `logical`, `green` and `fused`): a trial, or a fused group of trials that takes queued trials into its freed slots, runs on its slice's thread; a panic fails that trial (or every member of that group still training) alone.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;

use super::queue::TrialQueue;
use super::{
    epoch_event, open_backend, outcome, pruned_if_stopped, started_event, BuiltinWork, Event,
    Failure, RoundContext, Stop, TrialOutcome,
};
use crate::engine::cuda::GreenPartition;
use crate::engine::Backend;
use crate::plan::{SliceSpec, TrialSpec};
use crate::train::fused::GroupHooks;
use crate::train::{run_trial, EpochStats, TrialConfig, TrialResult};

/// The backend of a slice, on its device (in its green partition when it has one).
fn open(
    ctx: &RoundContext,
    work: &BuiltinWork,
    slice: &SliceSpec,
    partition: Option<Arc<GreenPartition>>,
) -> Result<Box<dyn Backend>, Stop> {
    let device = ctx
        .devices
        .device(slice.device)
        .map_err(|e| Failure::NoSlice(e.to_string()))?;
    Ok(open_backend(device, Arc::clone(&work.data), slice, partition).map_err(Failure::from)?)
}

/// Whether a trial that ended so leaves its backend fit for the next trial on a slice like its
/// own ([`crate::engine::Backend::recycle`]): after a result, a diverged loss, a batch that does
/// not fit or a stop. An engine error (a kernel fault poisons the context), a panic or anything
/// else drops it.
fn keeps_backend(err: Option<&Stop>) -> bool {
    matches!(
        err,
        None | Some(
            Stop::Failed(Failure::NonFiniteLoss { .. } | Failure::DoesNotFit { .. })
                | Stop::Interrupted
        )
    )
}

/// Runs one trial in this thread.
pub fn run(
    ctx: &RoundContext,
    work: &BuiltinWork,
    slice: &SliceSpec,
    partition: Option<Arc<GreenPartition>>,
    trial: TrialSpec,
    events: &Sender<Event>,
) -> TrialOutcome {
    let started = Instant::now();
    let cfg = work.config(ctx, &trial);
    let res = catch_unwind(AssertUnwindSafe(|| -> Result<_, Stop> {
        let mut be = open(ctx, work, slice, partition)?;
        let r = run_trial(be.as_mut(), &cfg, &mut |s| {
            epoch_event(events, &trial, slice.index, s)
        });
        if keeps_backend(r.as_ref().err()) {
            be.recycle();
        }
        r
    }));
    let res = match res {
        Ok(r) => pruned_if_stopped(r, cfg.prune.as_ref()),
        Err(payload) => Err(Failure::Panic(crate::error::panic_text(payload.as_ref())).into()),
    };
    outcome(trial, slice, res, started.elapsed().as_secs_f64())
}

/// Where a fused group's trials come from and go: the round's queue, for its freed slots, and
/// what reports each trial's end.
pub struct GroupFlow<'a> {
    pub queue: &'a TrialQueue,
    /// Whether a queued trial may join this group (it shares the group's key).
    pub fits: &'a dyn Fn(&TrialSpec) -> bool,
    /// Reports a trial's end.
    pub finish: &'a dyn Fn(TrialOutcome),
}

/// Runs a fused group of compatible trials in this thread, on one backend opened for the group,
/// with `width` slots: each trial's epochs and end are reported as they happen (its `wall_s`
/// from the moment it joined), and a slot freed at an epoch boundary takes the next queued
/// trial that fits ([`TrialQueue::take_if`]), reported started then. A failure to open the
/// backend, or a panic, ends every trial that has not ended alike.
#[allow(clippy::too_many_arguments)]
pub fn run_group(
    ctx: &RoundContext,
    work: &BuiltinWork,
    slice: &SliceSpec,
    partition: Option<Arc<GreenPartition>>,
    trials: Vec<TrialSpec>,
    width: usize,
    events: &Sender<Event>,
    flow: GroupFlow,
) {
    let now = Instant::now();
    let mut members = Members {
        ctx,
        work,
        slice,
        events,
        cfgs: trials.iter().map(|t| work.config(ctx, t)).collect(),
        started: trials.iter().map(|_| now).collect(),
        ended: trials.iter().map(|_| false).collect(),
        trials,
        keep_backend: true,
        flow,
    };
    let res = catch_unwind(AssertUnwindSafe(|| -> Result<(), Stop> {
        let mut be = open(ctx, work, slice, partition)?;
        let cfgs = members.cfgs.clone();
        crate::train::fused::run_refilled(be.as_mut(), cfgs, width, &mut members);
        if members.keep_backend {
            be.recycle();
        }
        Ok(())
    }));
    let stop = match res {
        Ok(Ok(())) => Failure::Panic("the fused group gave this trial no end".into()).into(),
        Ok(Err(stop)) => stop,
        Err(payload) => Failure::Panic(crate::error::panic_text(payload.as_ref())).into(),
    };
    for id in 0..members.trials.len() {
        if !members.ended[id] {
            members.end(id, Err(stop.clone()));
        }
    }
}

/// A fused group's trials as the scheduler sees them: numbered as the group numbers them.
struct Members<'a> {
    ctx: &'a RoundContext,
    work: &'a BuiltinWork,
    slice: &'a SliceSpec,
    events: &'a Sender<Event>,
    trials: Vec<TrialSpec>,
    cfgs: Vec<TrialConfig>,
    started: Vec<Instant>,
    ended: Vec<bool>,
    /// No end so far has spoilt the backend ([`keeps_backend`]).
    keep_backend: bool,
    flow: GroupFlow<'a>,
}

impl GroupHooks for Members<'_> {
    fn epoch(&mut self, id: usize, stats: &EpochStats) {
        if let Some(t) = self.trials.get(id) {
            epoch_event(self.events, t, self.slice.index, stats)
        }
    }

    fn end(&mut self, id: usize, end: Result<TrialResult, Stop>) {
        let (Some(t), Some(cfg), Some(ended)) = (
            self.trials.get(id),
            self.cfgs.get(id),
            self.ended.get_mut(id),
        ) else {
            return;
        };
        if std::mem::replace(ended, true) {
            return;
        }
        self.keep_backend &= keeps_backend(end.as_ref().err());
        let wall_s = self.started[id].elapsed().as_secs_f64();
        let res = pruned_if_stopped(end, cfg.prune.as_ref());
        (self.flow.finish)(outcome(t.clone(), self.slice, res, wall_s));
    }

    fn next(&mut self) -> Option<TrialConfig> {
        if self.ctx.cancel.draining() {
            return None;
        }
        let t = self.flow.queue.take_if(self.flow.fits)?;
        started_event(self.events, &t, self.slice.index);
        let cfg = self.work.config(self.ctx, &t);
        self.trials.push(t);
        self.cfgs.push(cfg.clone());
        self.started.push(Instant::now());
        self.ended.push(false);
        Some(cfg)
    }
}
