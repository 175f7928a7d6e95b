//! `concurrency: auto`: a short probe over the Fibonacci N values picks the N with the lowest time per training.

use std::io::Write;

use crate::error::{Error, Result};
use crate::job::{Job, SplitMode, DEFAULT_N};
use crate::plan::{self, Round, TrialSpec};
use crate::rounds::say;
use crate::run::Resolved;
use crate::sched::{self, RoundContext, TrialEnd};

/// Steps each probe trial starts with (no evaluation).
pub const PROBE_STEPS: usize = 20;
/// A probe round at N=1 should last about this long, so timer noise stays small: the steps are
/// scaled up until it does (up to a whole epoch).
pub const PROBE_TARGET_S: f64 = 0.3;

/// Steps that make one training last about `target` seconds, given that `steps` took `took`.
pub fn calibrate(steps: usize, took: f64, target: f64) -> usize {
    if took >= target || steps == 0 {
        return steps;
    }
    let scaled = (steps as f64 * target / took.max(1e-4)).ceil();
    (scaled as usize).clamp(steps, 100_000)
}

/// The N with the lowest time per training, and the figures it was chosen from.
pub fn pick(times: &[(u32, f64)]) -> Option<u32> {
    times
        .iter()
        .filter(|(_, t)| t.is_finite())
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(n, _)| *n)
}

/// A signal stopped the probe: no N is chosen, and the sweep stops as interrupted.
fn interrupted() -> Error {
    Error::Interrupted("stopped during the concurrency probe; no trial was run".into())
}

/// Probes N = 1, 2, 3, 5, 8, ... (up to the trials to run) with short trainings of the sweep's
/// first trials, stopping after two N in a row that do no better, and says what it chose. A
/// signal during the probe is [`Error::Interrupted`].
pub fn choose(
    job: &Job,
    todo: &[TrialSpec],
    ctx: &RoundContext,
    r: &Resolved,
    split: SplitMode,
    out: &mut dyn Write,
) -> Result<u32> {
    let Some(work) = ctx.builtin() else {
        return Err(Error::Internal(
            "concurrency auto probes built-in models only".into(),
        ));
    };
    let mut probe_ctx = ctx.clone();
    probe_ctx.max_steps = Some(PROBE_STEPS);
    let mut epochs = 1;
    set_epochs(&mut probe_ctx, epochs);
    let time = |n: u32, ctx: &RoundContext| -> Result<Option<f64>> {
        let trials: Vec<TrialSpec> = (0..n as usize)
            .map(|i| todo[i % todo.len()].clone())
            .collect();
        let round = Round {
            index: 1000 + n,
            n,
            split,
            slices: plan::slices(job, n, split, &r.budgets)?,
            trials,
        };
        let outcome = sched::run_round(&round, ctx, &mut |_| {});
        if ctx.cancel.draining() || outcome.outcomes.len() < n as usize {
            return Err(interrupted());
        }
        for o in &outcome.outcomes {
            match &o.end {
                TrialEnd::Complete(_) | TrialEnd::Pruned(_) => {}
                TrialEnd::Interrupted => return Err(interrupted()),
                TrialEnd::Failed(why) => {
                    tracing::info!("probe N={n}: a trial failed ({why}); stopping the probe here");
                    return Ok(None);
                }
            }
        }
        Ok(Some(outcome.makespan_s / n as f64))
    };
    // Calibrate: enough steps that N=1 takes about PROBE_TARGET_S.
    // When an epoch is shorter than that, the probe spans epochs, up to a whole trial.
    let per_epoch = (work.data.train.len() / todo[0].hyper.batch_size.max(1) as usize).max(1);
    if let Some(t1) = time(1, &probe_ctx)? {
        let ran = PROBE_STEPS.min(per_epoch);
        let want = calibrate(ran, t1, PROBE_TARGET_S);
        probe_ctx.max_steps = Some(want.min(per_epoch));
        epochs = (want.div_ceil(per_epoch) as u32).clamp(1, work.epochs.max(1));
        set_epochs(&mut probe_ctx, epochs);
    }
    let steps = probe_ctx.max_steps.unwrap_or(PROBE_STEPS) * epochs as usize;
    let mut times: Vec<(u32, f64)> = Vec::new();
    let mut worse = 0;
    for &n in DEFAULT_N
        .iter()
        .filter(|&&n| n as usize <= todo.len().max(1))
    {
        if ctx.cancel.draining() {
            return Err(interrupted());
        }
        let Some(t) = time(n, &probe_ctx)? else { break };
        tracing::info!("probe N={n}: {t:.4} s per training ({steps} steps each)");
        let best_so_far = times.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
        worse = if t < best_so_far { 0 } else { worse + 1 };
        times.push((n, t));
        if worse >= 2 {
            break;
        }
    }
    let n = pick(&times).ok_or_else(|| {
        Error::Usage("concurrency auto: no probe round completed; set a number instead".into())
    })?;
    let table: Vec<String> = times
        .iter()
        .map(|(n, t)| format!("N={n}: {t:.4} s"))
        .collect();
    say(
        out,
        format!(
            "concurrency auto: probed time per training ({steps} steps each) {}; chose {n}, the lowest",
            table.join(", ")
        ),
    )?;
    Ok(n)
}

/// The epochs each probe trial trains.
fn set_epochs(ctx: &mut RoundContext, epochs: u32) {
    if let Some(work) = ctx.builtin_mut() {
        work.epochs = epochs;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_scales_short_probes_up_only() {
        assert_eq!(calibrate(20, 0.03, 0.3), 200);
        assert_eq!(calibrate(20, 0.5, 0.3), 20);
        assert_eq!(calibrate(20, 0.0, 0.3), 60_000);
        assert_eq!(calibrate(20, 1e-9, 1e9), 100_000);
    }

    #[test]
    fn pick_takes_the_lowest_time_per_training() {
        assert_eq!(pick(&[(1, 0.2), (2, 0.1), (3, 0.11)]), Some(2));
        assert_eq!(pick(&[(1, 0.2), (2, f64::NAN)]), Some(1));
        assert_eq!(
            pick(&[(1, 0.1), (2, 0.1)]),
            Some(1),
            "ties go to the smaller N"
        );
        assert_eq!(pick(&[]), None);
    }
}
