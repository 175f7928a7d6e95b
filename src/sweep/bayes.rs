//! `method: bayes` in a sweep: trials proposed one by one from the results so far, what `--resume` and `--shard` keep of them.
//!
//! A bayes sweep of `run_cap` trials proposes its trials as slices come free: each from the
//! trials that ended with the metric (COMPLETE, and PRUNED rows that carry a metric value) and
//! the trials still running, counted at the worst value seen so far (a constant liar), so that
//! the proposals made while others run differ. A FAIL trial is no observation.
//!
//! On `--resume`, the observations are the rows of `trials.csv`; trials that did not complete
//! are not run again: fresh proposals take their place, from the index after the last trial in
//! the file, until `run_cap` trials are COMPLETE. A resumed run proposes what the uninterrupted
//! one would have only when nothing was running when it stopped (the trials in flight then are
//! gone from the history).
//!
//! Shard `i/n` proposes the indices `i-1, i-1+n, ...` below `run_cap` from its own results: the
//! shards do not share their history, and `merge` combines them.

use std::collections::BTreeMap;

use crate::error::JobError;
use crate::job::{Goal, Job};
use crate::plan::{self, TrialSpec};
use crate::report::TrialRow;
use crate::sched::{TrialEnd, TrialOutcome};
use crate::space::tpe::{Observation, Tpe};
use crate::space::ParamValue;

use super::{latest_rows, trial_key, Shard};

/// The state of rows that count as observations: COMPLETE, and PRUNED (a pruned trial, at the
/// value it reached).
const OBSERVED: [&str; 2] = ["COMPLETE", "PRUNED"];

/// Proposes a bayes sweep's trials, one at a time.
pub struct Proposer<'a> {
    job: &'a Job,
    pub tpe: Tpe,
    shard: Option<Shard>,
    done: Vec<Observation>,
    /// The points of the trials proposed and not ended, by index.
    pending: BTreeMap<u32, BTreeMap<String, ParamValue>>,
    /// How many trials this shard has proposed, in this run and before it.
    slot: u32,
    /// Trials still to propose.
    pub left: u32,
    /// The trials with an observation, earlier ones included, and those proposed in this run.
    pub ids: Vec<String>,
    /// The trials this shard runs in all (its part of `run_cap`).
    pub planned: u32,
    /// The first trial that could not be built (a proposal outside what a parameter accepts).
    pub error: Option<JobError>,
}

impl<'a> Proposer<'a> {
    /// A proposer for `job`, continuing from the rows `previous` already in the results.
    pub fn new(job: &'a Job, shard: Option<Shard>, previous: &[TrialRow]) -> Proposer<'a> {
        let run_cap = job.file.run_cap.unwrap_or(0);
        let planned = match shard {
            None => run_cap,
            Some(s) => (run_cap + s.count - s.index) / s.count,
        };
        let latest = latest_rows(previous);
        let mut done = Vec::new();
        let mut ids = Vec::new();
        for r in &latest {
            if let Some(o) = observation(job, r) {
                done.push(o);
                ids.push(r.trial_id.clone());
            }
        }
        Proposer {
            job,
            tpe: Tpe::for_run_cap(planned),
            shard,
            left: planned.saturating_sub(done.len() as u32),
            done,
            pending: BTreeMap::new(),
            slot: latest.len() as u32,
            ids,
            planned,
            error: None,
        }
    }

    /// How many observations the results already hold.
    pub fn observed(&self) -> usize {
        self.done.len()
    }

    /// The trial index of this shard's `slot`-th proposal.
    fn index(&self, slot: u32) -> u32 {
        match self.shard {
            None => slot,
            Some(s) => (s.index - 1).saturating_add(slot.saturating_mul(s.count)),
        }
    }

    /// Takes in how a trial ended (`None` at the start) and proposes the next, if any is left.
    pub fn next(&mut self, ended: Option<&TrialOutcome>) -> Option<TrialSpec> {
        if let Some(o) = ended {
            if let Some(point) = self.pending.remove(&o.trial.index) {
                // A PRUNED trial is observed at the value it reached where it stopped.
                let result = match &o.end {
                    TrialEnd::Complete(r) | TrialEnd::Pruned(r) => Some(r),
                    _ => None,
                };
                let value = result
                    .and_then(|r| r.metrics.get(&self.job.file.metric.name).copied())
                    .filter(|v| v.is_finite());
                if let Some(v) = value {
                    self.done.push(Observation {
                        point,
                        loss: loss(self.job.file.metric.goal, v),
                    });
                }
            }
        }
        if self.left == 0 || self.error.is_some() {
            return None;
        }
        let index = self.index(self.slot);
        let pending: Vec<_> = self.pending.values().cloned().collect();
        let point = self.tpe.propose(
            &self.job.space,
            self.job.file.seed,
            index as usize,
            &self.done,
            &pending,
        );
        match trial(self.job, index, &point) {
            Ok(t) => {
                self.slot += 1;
                self.left -= 1;
                self.pending.insert(index, point);
                self.ids.push(t.id.clone());
                Some(t)
            }
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }

    /// The random trials this shard starts with that are not run yet (what `--dry-run` lists).
    pub fn startup_trials(&self) -> Result<Vec<TrialSpec>, JobError> {
        let first = self.slot;
        let last = (self.tpe.startup as u32).min(first + self.left);
        (first..last)
            .map(|slot| {
                let i = self.index(slot);
                trial(
                    self.job,
                    i,
                    &self.job.space.point(self.job.file.seed, i as usize),
                )
            })
            .collect()
    }
}

/// The trial of index `i` at `point`, with a sweep's id (see [`trial_key`]).
fn trial(job: &Job, i: u32, point: &BTreeMap<String, ParamValue>) -> Result<TrialSpec, JobError> {
    let mut t = plan::trial_at(job, i, point)?;
    t.id = trial_key(job, &t.params, t.seed);
    Ok(t)
}

/// A metric value as a loss: lower is better.
fn loss(goal: Goal, value: f64) -> f64 {
    match goal {
        Goal::Maximize => -value,
        Goal::Minimize => value,
    }
}

/// What a results row tells the sampler: its point and its value, if it has one.
fn observation(job: &Job, row: &TrialRow) -> Option<Observation> {
    if !OBSERVED.contains(&row.state.as_str()) {
        return None;
    }
    let value = row.metric.filter(|v| v.is_finite())?;
    let point: BTreeMap<String, ParamValue> = serde_json::from_str(&row.params).ok()?;
    Some(Observation {
        point,
        loss: loss(job.file.metric.goal, value),
    })
}

/// The line `--dry-run` says of a bayes sweep.
pub fn plan_line(p: &Proposer) -> String {
    format!(
        "bayes: trials are proposed one by one: {} random startup trials, then TPE ({} candidates, γ = {:.0}%, at most {} good); {} observations in the results so far",
        p.tpe.startup,
        p.tpe.candidates,
        crate::space::tpe::GAMMA * 100.0,
        crate::space::tpe::MAX_GOOD,
        p.observed()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_take_their_own_indices() {
        let job = crate::plan::mlp_job(
            "method: bayes\nrun_cap: 10\nparameters:\n  lr: {min: 0.001, max: 0.1}\n",
        );
        let shard = |i| Some(Shard { index: i, count: 3 });
        let plans: Vec<u32> = (1..=3)
            .map(|i| Proposer::new(&job, shard(i), &[]).planned)
            .collect();
        assert_eq!(plans, vec![4, 3, 3]);
        let mut p = Proposer::new(&job, shard(2), &[]);
        let idx: Vec<u32> = std::iter::from_fn(|| p.next(None))
            .map(|t| t.index)
            .collect();
        assert_eq!(idx, vec![1, 4, 7]);
        let mut whole = Proposer::new(&job, None, &[]);
        let first = whole.next(None).expect("a trial");
        assert_eq!(first.index, 0);
        // Its startup trials are those of method: random.
        assert_eq!(first.params, job.params(0).unwrap());
    }
}
