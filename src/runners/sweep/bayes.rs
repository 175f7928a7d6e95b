//! `method: bayes` in a sweep: trials proposed one by one from the results so far, what `--resume` and `--shard` keep of them.
//!
//! A bayes sweep of `run_cap` trials proposes its trials as slices come free: each from the
//! trials that ended with the metric (COMPLETE, and PRUNED rows that carry a metric value) and
//! the trials still running, counted at the worst value seen so far (a constant liar), so that
//! the proposals made while others run differ. A FAIL trial (or one that ended without a finite
//! value) is an observation worse than any result: the region that produced it is proposed
//! less, and a value that always fails stops being proposed. Trial `i`'s seed is
//! the one `method: random` gives trial `i`; its first trials take random's points. A PRUNED
//! trial ranks after every trial that trained through, and after those pruned at a later rung
//! (see [`crate::space::tpe`]).
//!
//! On `--resume`, the rows of `trials.csv` that this job made are its history: a row is the
//! job's when its seed is that of one of the sweep's indices, its parameters are what the job
//! gives that index at a point of its space, and its id is theirs. Other rows (another command,
//! another range, another seed) are ignored, and the run says how many. An index with a
//! COMPLETE, PRUNED or FAIL row is done; an INTERRUPTED one runs again at its recorded point; an
//! index without a row (a trial in flight when the sweep was killed, or not proposed yet) is
//! proposed: a startup index at its random point, exactly as the uninterrupted sweep would, a
//! later one by TPE from the whole history. So a resumed sweep runs each of its `run_cap` indices
//! once, no id twice.
//!
//! Shard `i/n` proposes the indices `i-1, i-1+n, ...` below `run_cap` from its own results: the
//! shards do not share their history, and `merge` combines them.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::error::JobError;
use crate::job::{Goal, Job};
use crate::plan::{self, trial_seed, TrialSpec};
use crate::report::TrialRow;
use crate::sched::{TrialEnd, TrialOutcome};
use crate::space::tpe::{History, Observation, Tpe};
use crate::space::ParamValue;

use super::{latest_rows, trial_key, Shard};

/// The state of rows observed at their value: COMPLETE, and PRUNED (a pruned trial, at the
/// value it reached).
const OBSERVED: [&str; 2] = ["COMPLETE", "PRUNED"];

/// The state of rows that are observations: those [`OBSERVED`] at their value, and FAIL (and
/// older files' FAILED: worse than any result, so that the region that failed is proposed less).
const ENDED: [&str; 4] = ["COMPLETE", "PRUNED", "FAIL", "FAILED"];

/// Proposes a bayes sweep's trials, one at a time.
pub struct Proposer<'a> {
    job: &'a Job,
    pub tpe: Tpe,
    shard: Option<Shard>,
    /// The observations so far, by rank.
    done: History,
    /// The points of the trials proposed and not ended, by index.
    pending: BTreeMap<u32, BTreeMap<String, ParamValue>>,
    /// This shard's slots still to run, in order (slot `k` is trial [`Proposer::index`]`(k)`).
    queue: VecDeque<u32>,
    /// The points of INTERRUPTED trials, by index: they run again there.
    again: BTreeMap<u32, BTreeMap<String, ParamValue>>,
    /// Trials still to propose.
    pub left: u32,
    /// The trials with a row of this job that ended (COMPLETE, PRUNED or FAIL), and those
    /// proposed in this run.
    pub ids: Vec<String>,
    /// The trials this shard runs in all (its part of `run_cap`).
    pub planned: u32,
    /// Rows of `trials.csv` that are not this job's (see the module's notes), ignored.
    pub ignored: usize,
    /// This job's rows at the start, by state (COMPLETE, PRUNED, FAIL, INTERRUPTED).
    pub before: BTreeMap<String, usize>,
    /// The first trial that could not be built (a proposal outside what a parameter accepts).
    pub error: Option<JobError>,
}

/// A row of the results that this job made: its index and its point.
struct Own {
    index: u32,
    point: BTreeMap<String, ParamValue>,
}

impl<'a> Proposer<'a> {
    /// A proposer for `job`, continuing from the rows `previous` already in the results.
    pub fn new(job: &'a Job, shard: Option<Shard>, previous: &[TrialRow]) -> Proposer<'a> {
        let run_cap = job.file.run_cap.unwrap_or(0);
        let planned = match shard {
            None => run_cap,
            Some(s) => (run_cap + s.count - s.index) / s.count,
        };
        let mut p = Proposer {
            job,
            tpe: tpe_of(job, planned),
            shard,
            done: History::default(),
            pending: BTreeMap::new(),
            queue: VecDeque::new(),
            again: BTreeMap::new(),
            left: 0,
            ids: Vec::new(),
            planned,
            ignored: 0,
            before: BTreeMap::new(),
            error: None,
        };
        // The seed of each of this shard's indices gives a row's index back.
        let by_seed: HashMap<u64, (u32, u32)> = (0..planned)
            .map(|slot| {
                let i = p.index(slot);
                (trial_seed(job.file.seed, i), (i, slot))
            })
            .collect();
        let mut ended = std::collections::HashSet::new();
        for r in latest_rows(previous) {
            let Some(own) = own_row(job, &by_seed, p.tpe.startup, &r) else {
                p.ignored += 1;
                continue;
            };
            *p.before.entry(r.state.clone()).or_default() += 1;
            if r.state == "INTERRUPTED" {
                p.again.insert(own.index, own.point);
                continue;
            }
            ended.insert(own.index);
            p.ids.push(r.trial_id.clone());
            if let Some(o) = observation(job, &r, own.point) {
                p.done.push(o);
            }
        }
        // An index that ended is done, even where it also has an INTERRUPTED row.
        p.again.retain(|i, _| !ended.contains(i));
        p.queue = (0..planned)
            .filter(|&slot| !ended.contains(&p.index(slot)))
            .collect();
        p.left = p.queue.len() as u32;
        p
    }

    /// How many observations the results already hold.
    pub fn observed(&self) -> usize {
        self.done.len()
    }

    /// How many trials of this shard already ended (COMPLETE, PRUNED or FAIL).
    pub fn ended(&self) -> u32 {
        self.planned - self.left
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
                // A PRUNED trial is observed at the value it reached where it stopped; a trial
                // that failed, or ended without a finite value, as worse than any result; an
                // interrupted one not at all (it runs again).
                let (result, pruned_at) = match &o.end {
                    TrialEnd::Complete(r) => (Some(r), None),
                    TrialEnd::Pruned(r) => (Some(r), Some(r.epochs)),
                    TrialEnd::Failed(_) => (None, None),
                    TrialEnd::Interrupted => return self.propose_next(),
                };
                let value = result
                    .and_then(|r| crate::train::metric_in(&r.metrics, &self.job.file.metric.name));
                self.done
                    .push(observed(self.job.file.metric.goal, point, value, pruned_at));
            }
        }
        self.propose_next()
    }

    /// The next trial of the queue, if any is left.
    fn propose_next(&mut self) -> Option<TrialSpec> {
        if self.error.is_some() {
            return None;
        }
        let slot = *self.queue.front()?;
        let index = self.index(slot);
        let point = match self.again.get(&index) {
            Some(point) => point.clone(),
            // A startup slot takes its random point whatever came before: as uninterrupted.
            None if (slot as usize) < self.tpe.startup => self
                .job
                .space
                .random_point(self.job.file.seed, index as usize),
            None => {
                let pending: Vec<_> = self.pending.values().cloned().collect();
                self.tpe.propose(
                    &self.job.space,
                    self.job.file.seed,
                    index as usize,
                    &self.done,
                    &pending,
                )
            }
        };
        match trial(self.job, index, &point) {
            Ok(t) => {
                self.queue.pop_front();
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
        self.queue
            .iter()
            .filter(|&&slot| (slot as usize) < self.tpe.startup)
            .map(|&slot| {
                let i = self.index(slot);
                let point = match self.again.get(&i) {
                    Some(p) => p.clone(),
                    None => self.job.space.random_point(self.job.file.seed, i as usize),
                };
                trial(self.job, i, &point)
            })
            .collect()
    }
}

/// The sampler of a bayes sweep of `planned` trials (its `bayes:` options applied).
pub fn tpe_of(job: &Job, planned: u32) -> Tpe {
    Tpe {
        multivariate: job
            .file
            .bayes
            .as_ref()
            .and_then(|b| b.multivariate)
            .unwrap_or(true),
        ..Tpe::for_run_cap(planned)
    }
}

/// The point of trial `index` of a study's bayes sweep, from the whole study's `history` at
/// that moment: a startup index takes its random point (as one process would), a later one is
/// proposed by TPE from every worker's ended trials, those running counted as pending. Points
/// of the history that do not read are left out.
pub fn study_point(
    job: &Job,
    tpe: &Tpe,
    index: u32,
    history: &super::study::History,
) -> BTreeMap<String, ParamValue> {
    if (index as usize) < tpe.startup {
        return job.space.random_point(job.file.seed, index as usize);
    }
    let point = |text: &str| serde_json::from_str::<BTreeMap<String, ParamValue>>(text).ok();
    let mut done = History::default();
    for e in &history.ended {
        let Some(p) = point(&e.point) else { continue };
        if let Some(o) = ended_at(job.file.metric.goal, &e.state, e.metric, e.epochs, p) {
            done.push(o);
        }
    }
    let pending: Vec<_> = history.running.iter().filter_map(|t| point(t)).collect();
    tpe.propose(&job.space, job.file.seed, index as usize, &done, &pending)
}

/// The index and point of a row that `job` made (see the module's notes), or `None`: its seed
/// is that of one of the sweep's indices (`by_seed`: index and slot), its parameters are what
/// the job gives that index at a point of its space (a startup slot's own random point), and
/// its id is theirs.
fn own_row(
    job: &Job,
    by_seed: &HashMap<u64, (u32, u32)>,
    startup: usize,
    row: &TrialRow,
) -> Option<Own> {
    let (index, slot) = *by_seed.get(&row.seed)?;
    let params: BTreeMap<String, ParamValue> = serde_json::from_str(&row.params).ok()?;
    let point = job.space.point_in(&params)?;
    if (slot as usize) < startup && point != job.space.random_point(job.file.seed, index as usize) {
        return None;
    }
    let made = job.params_at(index as usize, &point).ok()?;
    (made == params && trial_key(job, &params, row.seed) == row.trial_id)
        .then_some(Own { index, point })
}

/// The trial of index `i` at `point`, with a sweep's id (see [`trial_key`]).
pub fn trial(
    job: &Job,
    i: u32,
    point: &BTreeMap<String, ParamValue>,
) -> Result<TrialSpec, JobError> {
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

/// What a results row of this job tells the sampler: its point and its value, if it has one.
fn observation(
    job: &Job,
    row: &TrialRow,
    point: BTreeMap<String, ParamValue>,
) -> Option<Observation> {
    ended_at(
        job.file.metric.goal,
        &row.state,
        row.metric,
        row.epochs,
        point,
    )
}

/// What a trial that ended in `state` (with its metric value and epochs) tells the sampler, at
/// `point`: `None` unless it ended ([`ENDED`]); its value only where it is [`OBSERVED`]; its
/// epochs as the rung it was pruned at.
fn ended_at(
    goal: Goal,
    state: &str,
    metric: Option<f64>,
    epochs: u32,
    point: BTreeMap<String, ParamValue>,
) -> Option<Observation> {
    if !ENDED.contains(&state) {
        return None;
    }
    let value = metric.filter(|_| OBSERVED.contains(&state));
    let pruned_at = (state == "PRUNED").then_some(epochs);
    Some(observed(goal, point, value, pruned_at))
}

/// The observation of a trial at `point` that ended with the metric `value` (a failure, or a
/// result without a finite value, counts as worse than any result), pruned after epoch
/// `pruned_at` (which only a value can rank).
fn observed(
    goal: Goal,
    point: BTreeMap<String, ParamValue>,
    value: Option<f64>,
    pruned_at: Option<u32>,
) -> Observation {
    let value = value.filter(|v| v.is_finite());
    Observation {
        pruned_at: pruned_at.filter(|_| value.is_some()),
        ..Observation::new(point, value.map_or(f64::NAN, |v| loss(goal, v)))
    }
}

/// The line `--dry-run` says of a bayes sweep.
pub fn plan_line(p: &Proposer) -> String {
    format!(
        "bayes: trials are proposed one by one: {} random startup trials, then {} TPE ({} candidates, γ = {:.0}%, at most {} good); {} observations in the results so far",
        p.tpe.startup,
        if p.tpe.multivariate {
            "multivariate"
        } else {
            "independent"
        },
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

    #[test]
    fn a_pruned_row_is_observed_at_its_epoch_and_the_job_picks_the_estimator() {
        let job = crate::plan::mlp_job(
            "method: bayes\nrun_cap: 10\nparameters:\n  lr: {min: 0.001, max: 0.1}\n",
        );
        let row = |state: &str, metric: f64| TrialRow {
            state: state.into(),
            metric: Some(metric),
            epochs: 3,
            ..TrialRow::default()
        };
        let o = observation(&job, &row("PRUNED", 0.9), BTreeMap::new()).expect("observed");
        assert_eq!((o.loss, o.pruned_at), (-0.9, Some(3)));
        let o = observation(&job, &row("COMPLETE", 0.5), BTreeMap::new()).expect("observed");
        assert_eq!((o.loss, o.pruned_at), (-0.5, None));
        let o = observation(&job, &row("FAIL", 0.5), BTreeMap::new()).expect("observed");
        assert!(o.loss.is_nan() && o.pruned_at.is_none());
        assert!(Proposer::new(&job, None, &[]).tpe.multivariate);
        let independent = crate::plan::mlp_job(
            "method: bayes\nrun_cap: 10\nbayes: {multivariate: false}\nparameters:\n  lr: {min: 0.001, max: 0.1}\n",
        );
        let p = Proposer::new(&independent, None, &[]);
        assert!(!p.tpe.multivariate);
        assert!(
            plan_line(&p).contains("independent TPE"),
            "{}",
            plan_line(&p)
        );
    }
}
