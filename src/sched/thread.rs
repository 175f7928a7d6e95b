//! Thread workers (`shared` and `logical`): a trial runs on its slice's thread; a panic fails that trial alone.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;

use super::{epoch_event, open_backend, outcome, panic_text, Event, RoundContext, TrialOutcome};
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
    let res = catch_unwind(AssertUnwindSafe(|| {
        let device = ctx
            .devices
            .device(slice.device)
            .map_err(|e| e.to_string())?;
        let mut be = open_backend(device, Arc::clone(&ctx.data), slice, partition)
            .map_err(|e| e.to_string())?;
        run_trial(be.as_mut(), &cfg, &mut |s| {
            epoch_event(events, &trial, slice.index, s)
        })
        .map_err(|e| e.to_string())
    }));
    let res = match res {
        Ok(r) => r,
        Err(payload) => Err(format!("panic: {}", panic_text(payload.as_ref()))),
    };
    outcome(trial, slice, res, started.elapsed().as_secs_f64())
}
