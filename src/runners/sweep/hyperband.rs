//! Early termination as W&B's `early_terminate: hyperband`, run asynchronously like ASHA: each rung's metric values, and whether a trial that reaches a rung goes on.
//!
//! A rung is an epoch of the schedule ([`crate::job::EarlyTerminate::rungs`]). When a trial
//! reports the metric after a rung's epoch, its value is recorded there, and it goes on only
//! if it ranks in the top `1/eta` of the values recorded at that rung so far, itself included:
//! with `n` values, its rank (0 the best, ties to the lower trial id) must be below
//! `⌊n/eta⌋`. While fewer than `eta` trials have reached a rung there is too little to judge
//! by, and every trial goes on. No trial waits for a rung to fill.
//!
//! With several brackets (Hyperband's), each trial is given one by a hash of its id: bracket
//! `b` judges its trials at the rungs from the `b`-th on only, against the values of its own
//! trials, so that the later brackets let a late bloomer train longer before it is judged (the
//! last has no rung). A bracket with `s` rungs takes a share of the trials `∝ eta^s/(s+1)`, as
//! Hyperband's brackets do.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use crate::job::{Goal, Job};
use crate::report::{ProgressRow, TrialRow};
use crate::train::EpochStats;

/// Rungs kept where several processes record and judge by them (a study's store).
pub trait SharedRungs: Send + Sync + std::fmt::Debug {
    /// Records trial `trial_id`'s `value` at the rung (`bracket`, `epoch`), and returns every
    /// value recorded there, by trial id.
    fn record(
        &self,
        bracket: usize,
        epoch: u32,
        trial_id: &str,
        value: f64,
    ) -> Result<BTreeMap<String, f64>, String>;
}

/// The early termination of a sweep: its rungs and the values recorded at each.
#[derive(Debug)]
pub struct Pruner {
    rungs: Vec<u32>,
    eta: f64,
    goal: Goal,
    metric: String,
    /// Each bracket's share of the trials, by bracket (summing to 1): one bracket, or
    /// Hyperband's.
    shares: Vec<f64>,
    /// Per bracket and rung epoch, each trial's value there, by trial id.
    seen: Mutex<BTreeMap<(usize, u32), BTreeMap<String, f64>>>,
    /// Where the rungs are shared with other processes (a study's workers): a trial is judged
    /// by every value recorded there.
    shared: Option<Box<dyn SharedRungs>>,
}

impl Pruner {
    /// The pruner of a job with `early_terminate:`; `None` without.
    pub fn of(job: &Job) -> Option<Pruner> {
        let e = job.file.early_terminate.as_ref()?;
        // A built-in trial trains `train.epochs`; a command as many as it does, `max_iter` by
        // the schedule (its last epoch, should it come at a rung, is found when it ends there:
        // see the scheduler's early termination of commands).
        let last = match job.file.command {
            None => job.file.train.epochs,
            Some(_) => e.max_iter(job.file.train.epochs),
        };
        let rungs = e.rungs(last);
        // One bracket by default, as W&B; under `method: bayes` every bracket, so that the
        // slow starters the first rungs stop still reach the sampler's results.
        let brackets = match (e.brackets, job.space.method) {
            (Some(b), _) => b as usize,
            (None, crate::space::Method::Bayes) => rungs.len() + 1,
            (None, _) => 1,
        };
        Some(Pruner::with_brackets(
            rungs,
            e.eta,
            job.file.metric.goal,
            &job.file.metric.name,
            brackets,
        ))
    }

    /// A pruner of one bracket: every trial is judged at every rung.
    pub fn new(rungs: Vec<u32>, eta: f64, goal: Goal, metric: &str) -> Pruner {
        Pruner::with_brackets(rungs, eta, goal, metric, 1)
    }

    /// A pruner of `brackets` brackets (at most one more than the rungs): bracket `b` judges
    /// at the rungs from the `b`-th on, and takes a share `∝ eta^s/(s+1)` of the trials, `s`
    /// its number of rungs.
    pub fn with_brackets(
        rungs: Vec<u32>,
        eta: f64,
        goal: Goal,
        metric: &str,
        brackets: usize,
    ) -> Pruner {
        let eta = eta.max(2.0);
        let n = brackets.clamp(1, rungs.len() + 1);
        let weights: Vec<f64> = (0..n)
            .map(|b| {
                let s = (rungs.len() - b) as i32;
                eta.powi(s) / f64::from(s + 1)
            })
            .collect();
        let sum: f64 = weights.iter().sum();
        Pruner {
            rungs,
            eta,
            goal,
            metric: metric.to_string(),
            shares: weights.iter().map(|w| w / sum).collect(),
            seen: Mutex::default(),
            shared: None,
        }
    }

    /// This pruner, judging by the rungs `shared` with other processes; where they cannot be
    /// reached, by the values this process recorded, said as a warning.
    pub fn shared(self, shared: Box<dyn SharedRungs>) -> Pruner {
        Pruner {
            shared: Some(shared),
            ..self
        }
    }

    pub fn rungs(&self) -> &[u32] {
        &self.rungs
    }

    /// Each bracket's share of the trials.
    pub fn shares(&self) -> &[f64] {
        &self.shares
    }

    /// The bracket of trial `trial_id`: drawn by its id's hash, by the brackets' shares (the
    /// same on every run and resume).
    pub fn bracket_of(&self, trial_id: &str) -> usize {
        if self.shares.len() == 1 {
            return 0;
        }
        // FNV-1a mixes an id's last bytes into its high bits poorly: mixed again before use.
        let h = crate::rng::derive(
            crate::hash::fnv1a(trial_id.as_bytes()),
            0x0062_7261_636b_6574,
        );
        let u = (h >> 11) as f64 / (1u64 << 53) as f64;
        let mut acc = 0.0;
        for (b, share) in self.shares.iter().enumerate() {
            acc += share;
            if u < acc {
                return b;
            }
        }
        self.shares.len() - 1
    }

    /// The rungs trial `trial_id` is judged at (its bracket's).
    pub fn rungs_of(&self, trial_id: &str) -> &[u32] {
        &self.rungs[self.bracket_of(trial_id).min(self.rungs.len())..]
    }

    /// Whether a trial goes on after this epoch; at one of its rungs its value is recorded
    /// first. A value that is missing or not finite cannot be ranked: the trial goes on, and
    /// nothing is recorded.
    pub fn goes_on(&self, trial_id: &str, stats: &EpochStats) -> bool {
        if !self.rungs_of(trial_id).contains(&stats.epoch) {
            return true;
        }
        let Some(value) = stats.metric(&self.metric) else {
            return true;
        };
        let bracket = self.bracket_of(trial_id);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let rung = seen.entry((bracket, stats.epoch)).or_default();
        rung.insert(trial_id.to_string(), value);
        if let Some(shared) = &self.shared {
            match shared.record(bracket, stats.epoch, trial_id, value) {
                Ok(all) => return promoted(&all, trial_id, self.eta, self.goal),
                Err(e) => tracing::warn!(
                    "the shared rungs cannot be read ({e}): trial {trial_id} is judged at epoch {} by this worker's values alone",
                    stats.epoch
                ),
            }
        }
        promoted(rung, trial_id, self.eta, self.goal)
    }

    /// Restores the rungs of a resumed sweep: the values of its COMPLETE and PRUNED trials at
    /// each rung epoch, from `progress.csv`. Trials run again report theirs anew.
    pub fn restore(&self, trials: &[TrialRow], progress: &[ProgressRow]) -> usize {
        let done = done_ids(trials);
        progress
            .iter()
            .filter(|p| self.restore_row(&done, p))
            .count()
    }

    /// [`Pruner::restore`] for one row, as `progress.csv` is read row by row: whether the row
    /// gave a rung value. `done` holds the ids of the trials done ([`done_ids`]).
    pub fn restore_row(&self, done: &HashSet<&str>, p: &ProgressRow) -> bool {
        if !self.wants(done, &p.trial_id, p.epoch) {
            return false;
        }
        let Some(v) = stats_of(p).metric(&self.metric) else {
            return false;
        };
        let bracket = self.bracket_of(&p.trial_id);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.entry((bracket, p.epoch))
            .or_default()
            .insert(p.trial_id.clone(), v);
        true
    }

    /// Whether the row of trial `id` at `epoch` may give a rung value ([`Pruner::restore_row`]):
    /// the epoch is one of the trial's rungs and the trial is done.
    pub fn wants(&self, done: &HashSet<&str>, id: &str, epoch: u32) -> bool {
        self.rungs.contains(&epoch) && done.contains(id) && self.rungs_of(id).contains(&epoch)
    }

    /// The schedule in words, for `--dry-run`.
    pub fn describe(&self) -> String {
        if self.rungs.is_empty() {
            return "early_terminate hyperband: no rung below the last epoch, so no trial is stopped early".into();
        }
        let list: Vec<String> = self.rungs.iter().map(u32::to_string).collect();
        let brackets = match self.shares.len() {
            1 => String::new(),
            n => {
                let shares: Vec<String> = self
                    .shares
                    .iter()
                    .enumerate()
                    .map(|(b, s)| {
                        let from = self
                            .rungs
                            .get(b)
                            .map_or("none".into(), |r| format!("from {r}"));
                        format!("{:.0}% rungs {from}", 100.0 * s)
                    })
                    .collect();
                format!(
                    "; {n} brackets, each judging its own trials: {}",
                    shares.join(", ")
                )
            }
        };
        format!(
            "early_terminate hyperband: rungs at epochs {} (eta {}); past a rung a trial goes on only in the top 1/{} of those that reached it ({} {:?}){brackets}",
            list.join(", "),
            self.eta,
            self.eta,
            self.metric,
            self.goal
        )
    }
}

/// The ids of the trials done (COMPLETE or PRUNED).
pub fn done_ids(trials: &[TrialRow]) -> HashSet<&str> {
    trials
        .iter()
        .filter(|r| r.done())
        .map(|r| r.trial_id.as_str())
        .collect()
}

/// A progress row's figures as an epoch's.
fn stats_of(p: &ProgressRow) -> EpochStats {
    EpochStats {
        epoch: p.epoch,
        train_loss: p.train_loss,
        train_acc: p.train_acc,
        test_loss: p.test_loss,
        test_acc: p.test_acc,
        wall_s: p.wall_s,
        extra: p.extra.clone(),
    }
}

/// The asynchronous rule at one rung: whether `trial` (recorded in `rung`) goes on.
pub fn promoted(rung: &BTreeMap<String, f64>, trial: &str, eta: f64, goal: Goal) -> bool {
    let n = rung.len();
    let eta = eta.max(2.0);
    if (n as f64) < eta {
        return true;
    }
    let Some(&mine) = rung.get(trial) else {
        return true;
    };
    // Better values first; equal values in the order of their trial ids.
    let better = |(id, v): (&String, &f64)| {
        let ahead = match goal {
            Goal::Maximize => *v > mine,
            Goal::Minimize => *v < mine,
        };
        ahead || (*v == mine && id.as_str() < trial)
    };
    let rank = rung.iter().filter(|&e| better(e)).count();
    rank < (n as f64 / eta).floor() as usize
}

/// The trial-epochs pruning saved: what the PRUNED rows did not train of what a trial trains
/// when it is not stopped, and what every finished trial would have trained so. A trial not
/// stopped trains what the COMPLETE rows trained (the most of them: a command may train fewer
/// epochs than `train.epochs`), or `epochs` when none is COMPLETE yet.
pub fn saved(rows: &[&TrialRow], epochs: u32) -> (u64, u64) {
    let full = rows
        .iter()
        .filter(|r| r.state == crate::report::COMPLETE)
        .map(|r| r.epochs)
        .max()
        .unwrap_or(epochs);
    let finished = rows.iter().filter(|r| r.done());
    let all = finished.clone().count() as u64 * u64::from(full);
    let saved = finished
        .filter(|r| r.state == crate::report::PRUNED)
        .map(|r| u64::from(full.saturating_sub(r.epochs)))
        .sum();
    (saved, all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::EarlyTerminate;

    fn stats(epoch: u32, acc: f64) -> EpochStats {
        EpochStats {
            epoch,
            train_loss: 1.0,
            train_acc: 0.5,
            test_loss: 1.0,
            test_acc: acc,
            wall_s: 0.0,
            extra: Default::default(),
        }
    }

    fn hyperband(
        min_iter: Option<u32>,
        max_iter: Option<u32>,
        eta: u32,
        s: Option<u32>,
    ) -> EarlyTerminate {
        let eta = f64::from(eta);
        EarlyTerminate {
            kind: "hyperband".into(),
            min_iter,
            max_iter,
            eta,
            s,
            strict: None,
            brackets: None,
        }
    }

    #[test]
    fn rungs_are_min_iter_times_powers_of_eta_below_the_last_epoch() {
        assert_eq!(hyperband(Some(1), None, 3, None).rungs(9), vec![1, 3]);
        assert_eq!(hyperband(Some(1), None, 3, None).rungs(10), vec![1, 3, 9]);
        assert_eq!(
            hyperband(Some(2), None, 2, None).rungs(20),
            vec![2, 4, 8, 16]
        );
        assert_eq!(
            hyperband(Some(1), Some(27), 3, Some(2)).rungs(5),
            vec![1, 3]
        );
        // min_iter from s: 27/3² = 3; then 9, past the 5 epochs a trial trains.
        assert_eq!(hyperband(None, Some(27), 3, Some(2)).rungs(5), vec![3]);
        // max_iter past the epochs: the last epoch (9) is still no rung.
        assert_eq!(hyperband(Some(1), Some(27), 3, None).rungs(9), vec![1, 3]);
        assert_eq!(
            hyperband(Some(5), None, 3, None).rungs(5),
            Vec::<u32>::new()
        );
        assert_eq!(hyperband(None, None, 3, None).rungs(1), Vec::<u32>::new());
    }

    #[test]
    fn the_first_trials_at_a_rung_go_on_then_only_the_top_third() {
        let p = Pruner::new(vec![1, 3], 3.0, Goal::Maximize, "test_acc");
        assert!(p.goes_on("a", &stats(1, 0.5)));
        assert!(p.goes_on("b", &stats(1, 0.4)));
        // n = 3: one goes on, the best.
        assert!(!p.goes_on("c", &stats(1, 0.45)));
        assert!(p.goes_on("d", &stats(1, 0.9)));
        assert!(!p.goes_on("e", &stats(1, 0.6)));
        // n = 6: two go on; 0.6 is third, but 0.95 is first.
        assert!(p.goes_on("f", &stats(1, 0.95)));
        // Not a rung: nothing is judged.
        assert!(p.goes_on("c", &stats(2, 0.0)));
        // No value to rank by: it goes on, unrecorded.
        assert!(p.goes_on("g", &stats(3, f64::NAN)));
    }

    #[test]
    fn ties_go_to_the_lower_trial_id_and_minimize_ranks_low_first() {
        let mut rung = BTreeMap::new();
        for id in ["a", "b", "c"] {
            rung.insert(id.to_string(), 1.0);
        }
        assert!(promoted(&rung, "a", 3.0, Goal::Maximize));
        assert!(!promoted(&rung, "b", 3.0, Goal::Maximize));
        assert!(!promoted(&rung, "c", 3.0, Goal::Minimize));
        rung.insert("d".into(), 0.5);
        assert!(promoted(&rung, "d", 2.0, Goal::Minimize));
        assert!(!promoted(&rung, "d", 2.0, Goal::Maximize));
    }

    #[test]
    fn restored_rungs_decide_as_before() {
        let row = |id: &str, state: &str| TrialRow {
            trial_id: id.into(),
            state: state.into(),
            ..Default::default()
        };
        let prog = |id: &str, epoch: u32, acc: f64| ProgressRow {
            trial_id: id.into(),
            epoch,
            test_acc: acc,
            ..Default::default()
        };
        let p = Pruner::new(vec![1], 3.0, Goal::Maximize, "test_acc");
        let trials = [
            row("a", "COMPLETE"),
            row("b", "PRUNED"),
            row("x", "INTERRUPTED"),
        ];
        let progress = [
            prog("a", 1, 0.9),
            prog("a", 2, 0.95),
            prog("b", 1, 0.2),
            prog("x", 1, 0.99),
        ];
        assert_eq!(p.restore(&trials, &progress), 2);
        // Third at the rung, between a and b: only the best of three goes on.
        assert!(!p.goes_on("c", &stats(1, 0.5)));
    }

    #[test]
    fn bayes_sweeps_take_every_bracket_by_default_and_the_others_one() {
        let job = |method: &str, brackets: &str| {
            crate::plan::mlp_job(&format!(
                "method: {method}\nrun_cap: 8\ntrain: {{epochs: 27}}\nearly_terminate: {{type: hyperband, min_iter: 1{brackets}}}\nparameters:\n  lr: {{min: 0.001, max: 0.1}}\n"
            ))
        };
        let count = |method: &str, brackets: &str| {
            Pruner::of(&job(method, brackets))
                .expect("a pruner")
                .shares()
                .len()
        };
        // Rungs 1, 3, 9: four brackets in all.
        assert_eq!(count("bayes", ""), 4);
        assert_eq!(count("random", ""), 1);
        assert_eq!(count("bayes", ", brackets: 1"), 1);
        assert_eq!(count("random", ", brackets: 3"), 3);
    }

    #[test]
    fn brackets_share_the_trials_as_hyperband_and_judge_their_own_from_their_rung() {
        let p = Pruner::with_brackets(vec![1, 3, 9], 3.0, Goal::Maximize, "test_acc", 4);
        // eta^s/(s+1) for s = 3, 2, 1, 0 rungs: 27/4, 9/3, 3/2, 1.
        let want = [6.75, 3.0, 1.5, 1.0].map(|w| w / 12.25);
        for (got, want) in p.shares().iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{got} {want}");
        }
        // Ids are spread over the brackets by their shares (within 3% of 4,000).
        let mut counts = [0usize; 4];
        for i in 0..4_000 {
            counts[p.bracket_of(&format!("t{i}"))] += 1;
        }
        for (c, w) in counts.iter().zip(want) {
            assert!((*c as f64 / 4_000.0 - w).abs() < 0.03, "{counts:?}");
        }
        // Bracket b is judged from rung b on; the last never.
        let in_bracket = |b: usize| {
            (0..)
                .map(|i| format!("t{i}"))
                .find(|id| p.bracket_of(id) == b)
        };
        let last = in_bracket(3).unwrap();
        assert!(p.rungs_of(&last).is_empty());
        for k in 0..10 {
            assert!(p.goes_on(&last, &stats(1, 0.01 * f64::from(k))));
        }
        let second = in_bracket(2).unwrap();
        assert_eq!(p.rungs_of(&second), [9]);
        // Trials of the first bracket fill rung 1; one of bracket 2 is not judged there.
        let firsts: Vec<String> = (0..)
            .map(|i| format!("t{i}"))
            .filter(|id| p.bracket_of(id) == 0)
            .take(6)
            .collect();
        for (k, id) in firsts.iter().enumerate() {
            p.goes_on(id, &stats(1, 0.9 - 0.01 * k as f64));
        }
        assert!(
            p.goes_on(&second, &stats(1, 0.0)),
            "bracket 2 has no rung at 1"
        );
        // One bracket: every trial at every rung, as Pruner::new.
        let one = Pruner::with_brackets(vec![1, 3], 3.0, Goal::Maximize, "test_acc", 1);
        assert_eq!(one.shares(), [1.0]);
        assert_eq!(one.rungs_of("any"), [1, 3]);
    }

    #[test]
    fn saved_counts_the_epochs_pruned_trials_did_not_train() {
        let row = |state: &str, epochs: u32| TrialRow {
            state: state.into(),
            epochs,
            ..Default::default()
        };
        let rows = [
            row("COMPLETE", 9),
            row("PRUNED", 1),
            row("PRUNED", 3),
            row("FAIL", 0),
        ];
        let refs: Vec<&TrialRow> = rows.iter().collect();
        assert_eq!(saved(&refs, 9), (14, 27));
        // A command that trains 4 epochs where the job says 9: counted against the 4 trained.
        let short = [row("COMPLETE", 4), row("PRUNED", 1), row("PRUNED", 3)];
        let refs: Vec<&TrialRow> = short.iter().collect();
        assert_eq!(saved(&refs, 9), (4, 12));
        // Before any trial is COMPLETE: against the job's epochs.
        let refs: Vec<&TrialRow> = short[1..].iter().collect();
        assert_eq!(saved(&refs, 9), (14, 18));
    }
}
