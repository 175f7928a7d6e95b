//! `concurrency: auto`: a short probe over the Fibonacci N values picks the N with the lowest time per training.

use std::io::Write;

use crate::commands::Resolved;
use crate::error::{Error, Result};
use crate::job::{Job, SplitMode, DEFAULT_N};
use crate::plan::{self, Round, TrialSpec};
use crate::sched::{self, RoundContext, TrialState};

/// Steps each probe trial trains (no evaluation): long enough to time, short enough to be cheap.
pub const PROBE_STEPS: usize = 20;

/// The N with the lowest time per training, and the figures it was chosen from.
pub fn pick(times: &[(u32, f64)]) -> Option<u32> {
    times
        .iter()
        .filter(|(_, t)| t.is_finite())
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(n, _)| *n)
}

/// Probes N = 1, 2, 3, 5, 8, ... (up to the trials to run) with short trainings of the sweep's
/// first trials, stopping after two N in a row that do no better, and says what it chose.
pub fn choose(
    job: &Job,
    todo: &[TrialSpec],
    ctx: &RoundContext,
    r: &Resolved,
    split: SplitMode,
    out: &mut dyn Write,
) -> Result<u32> {
    let mut probe_ctx = ctx.clone();
    probe_ctx.max_steps = Some(PROBE_STEPS);
    probe_ctx.epochs = 1;
    let mut times: Vec<(u32, f64)> = Vec::new();
    let mut worse = 0;
    for &n in DEFAULT_N
        .iter()
        .filter(|&&n| n as usize <= todo.len().max(1))
    {
        if ctx.cancel.draining() {
            break;
        }
        let trials: Vec<TrialSpec> = (0..n as usize)
            .map(|i| todo[i % todo.len()].clone())
            .collect();
        let round = Round {
            index: 1000 + n,
            n,
            split,
            slices: plan::slices(job, n, split, &r.budget)?,
            trials,
        };
        let outcome = sched::run_round(&round, &probe_ctx, &mut |_| {});
        let ok = outcome
            .outcomes
            .iter()
            .all(|o| o.state == TrialState::Complete);
        if !ok {
            let why = outcome
                .outcomes
                .iter()
                .find_map(|o| o.error.clone())
                .unwrap_or_default();
            tracing::info!("probe N={n}: a trial failed ({why}); stopping the probe here");
            break;
        }
        let t = outcome.makespan_s / n as f64;
        tracing::info!("probe N={n}: {t:.4} s per training ({PROBE_STEPS} steps each)");
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
    writeln!(
        out,
        "concurrency auto: probed time per training ({PROBE_STEPS} steps each) {}; chose {n}, the lowest",
        table.join(", ")
    )
    .map_err(|e| Error::Io {
        context: "stdout".into(),
        source: e,
    })?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

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
