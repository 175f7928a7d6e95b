//! Thread workers (`shared` and `logical`): a trial runs on its slice's thread; a panic fails that trial alone.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;

use super::{epoch_event, open_backend, outcome, Event, Failure, RoundContext, Stop, TrialOutcome};
use crate::engine::cuda::GreenPartition;
use crate::plan::{SliceSpec, TrialSpec};
use crate::train::run_trial;

/// Runs one trial in this thread.
pub fn run(
    ctx: &RoundContext,
    slice: &SliceSpec,
    partition: Option<Arc<GreenPartition>>,
    trial: TrialSpec,
    events: &Sender<Event>,
) -> TrialOutcome {
    let started = Instant::now();
    let cfg = ctx.config(&trial);
    let res = catch_unwind(AssertUnwindSafe(|| -> Result<_, Stop> {
        let device = ctx
            .devices
            .device(slice.device)
            .map_err(|e| Failure::NoSlice(e.to_string()))?;
        let mut be =
            open_backend(device, Arc::clone(&ctx.data), slice, partition).map_err(Failure::from)?;
        Ok(run_trial(be.as_mut(), &cfg, &mut |s| {
            epoch_event(events, &trial, slice.index, s)
        })?)
    }));
    let res = match res {
        Ok(r) => r,
        Err(payload) => Err(Failure::Panic(crate::error::panic_text(payload.as_ref())).into()),
    };
    outcome(trial, slice, res, started.elapsed().as_secs_f64())
}
