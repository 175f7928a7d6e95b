//! Thread workers (`shared`, `logical`, `green` and `fused`): a trial, or a fused group of trials, runs on its slice's thread; a panic fails that trial (or every member of that group) alone.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;

use super::{
    epoch_event, open_backend, outcome, pruned_if_stopped, BuiltinWork, Event, Failure,
    RoundContext, Stop, TrialOutcome,
};
use crate::engine::cuda::GreenPartition;
use crate::engine::Backend;
use crate::plan::{SliceSpec, TrialSpec};
use crate::train::run_trial;
use crate::train::TrialResult;

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

/// Runs a fused group of compatible trials in this thread, on one backend opened for the group:
/// each member gets its own epoch events and its own end, and each outcome's `wall_s` is the
/// group's. A failure to open the backend, or a panic, ends every member alike.
pub fn run_group(
    ctx: &RoundContext,
    work: &BuiltinWork,
    slice: &SliceSpec,
    partition: Option<Arc<GreenPartition>>,
    trials: Vec<TrialSpec>,
    events: &Sender<Event>,
) -> Vec<TrialOutcome> {
    let started = Instant::now();
    let cfgs: Vec<_> = trials.iter().map(|t| work.config(ctx, t)).collect();
    let res = catch_unwind(AssertUnwindSafe(|| -> Result<_, Stop> {
        let mut be = open(ctx, work, slice, partition)?;
        let ends = crate::train::fused::run_group(be.as_mut(), &cfgs, &mut |i, s| {
            if let Some(t) = trials.get(i) {
                epoch_event(events, t, slice.index, s)
            }
        });
        if ends.iter().all(|e| keeps_backend(e.as_ref().err())) {
            be.recycle();
        }
        Ok(ends)
    }));
    let ends: Vec<Result<TrialResult, Stop>> = match res {
        Ok(Ok(ends)) => ends,
        Ok(Err(stop)) => vec![Err(stop); trials.len()],
        Err(payload) => {
            let why = Failure::Panic(crate::error::panic_text(payload.as_ref()));
            vec![Err(why.into()); trials.len()]
        }
    };
    let wall_s = started.elapsed().as_secs_f64();
    let mut ends = ends.into_iter();
    trials
        .into_iter()
        .zip(&cfgs)
        .map(|(t, cfg)| {
            let end = ends.next().unwrap_or_else(|| {
                Err(Failure::Panic("the fused group returned no end for this trial".into()).into())
            });
            outcome(t, slice, pruned_if_stopped(end, cfg.prune.as_ref()), wall_s)
        })
        .collect()
}
