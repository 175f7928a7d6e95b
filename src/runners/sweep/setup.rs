//! A sweep before any trial runs: its trials (the space, this shard's part), its output folder, the checks that need no device, and what it says as it starts or in a dry run.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;

use super::dry_run::{dry_run, slurm_line};
use super::{bayes, hyperband, sweep_trials, target_reached, SweepOptions};
use crate::error::Result;
use crate::job::{Concurrency, Job, SplitMode};
use crate::plan::{self, TrialSpec};
use crate::report::{self, TrialRow};
use crate::rounds::say;
use crate::run;
use crate::run::split_policy::Work;
use crate::space::Method;

/// One sweep of a job, as planned before its folder is read.
pub(super) struct Sweep<'a> {
    pub(super) job: &'a Job,
    pub(super) opts: &'a SweepOptions,
    /// Every trial of the space (none for bayes, whose trials are proposed as it runs).
    all: Vec<TrialSpec>,
    /// This shard's trials (all of them without `--shard`).
    mine: Vec<TrialSpec>,
    pub(super) is_bayes: bool,
    pub(super) split: SplitMode,
    /// What the trials are, which decides the split modes they may use.
    pub(super) work: Work,
    pub(super) concurrency: Concurrency,
    pub(super) dir: PathBuf,
}

impl<'a> Sweep<'a> {
    /// The sweep's trials and folder; refused (exit 2) before anything is opened or read:
    /// `concurrency: auto` where no probe can choose it (the split mode: the session's policy).
    pub(super) fn plan(job: &'a Job, opts: &'a SweepOptions) -> Result<Sweep<'a>> {
        crate::sched::external::check_job(job)?;
        let is_bayes = job.space.method == Method::Bayes;
        // A bayes sweep's trials are proposed as it runs: none is built in advance.
        let all = if is_bayes {
            plan::sweep_count(job)?;
            Vec::new()
        } else {
            sweep_trials(job)?
        };
        let mine: Vec<TrialSpec> = match opts.shard {
            Some(s) => all.iter().filter(|t| s.contains(&t.id)).cloned().collect(),
            None => all.clone(),
        };
        let split = opts.split.unwrap_or(job.file.split);
        let work = match job.file.command {
            Some(_) => Work::Commands,
            None => Work::BuiltinTrials,
        };
        let concurrency = opts.concurrency.unwrap_or(job.file.concurrency);
        check_concurrency(job, concurrency, is_bayes)?;
        Ok(Sweep {
            job,
            opts,
            all,
            mine,
            is_bayes,
            split,
            work,
            concurrency,
            dir: out_dir_of(job, opts),
        })
    }

    /// The trials left to run: this shard's not done in `previous`; for bayes, none in advance
    /// (a dry run lists its random startup trials).
    pub(super) fn todo(
        &self,
        previous: &[TrialRow],
        proposer: Option<&bayes::Proposer>,
    ) -> Result<Vec<TrialSpec>> {
        let done: HashSet<&str> = previous
            .iter()
            .filter(|r| r.done())
            .map(|r| r.trial_id.as_str())
            .collect();
        Ok(match proposer {
            Some(p) if self.opts.dry_run => p.startup_trials()?,
            Some(_) => Vec::new(),
            None => self
                .mine
                .iter()
                .filter(|t| !done.contains(t.id.as_str()))
                .cloned()
                .collect(),
        })
    }

    /// The ids of this sweep's own trials, and how many it plans.
    pub(super) fn ids_planned(&self, proposer: Option<&bayes::Proposer>) -> (Vec<String>, usize) {
        match proposer {
            Some(p) => (p.ids.clone(), p.planned as usize),
            None => (
                self.mine.iter().map(|t| t.id.clone()).collect(),
                self.mine.len(),
            ),
        }
    }

    /// The id of a trial of this sweep's own (not another job's in the folder) that already
    /// reached `metric.target`, if one did.
    pub(super) fn target_reached(
        &self,
        held_latest: &[TrialRow],
        proposer: Option<&bayes::Proposer>,
    ) -> Option<String> {
        let own: HashSet<&str> = match proposer {
            Some(p) => p.ids.iter().map(String::as_str).collect(),
            None => self.mine.iter().map(|t| t.id.as_str()).collect(),
        };
        let held_own: Vec<&TrialRow> = held_latest
            .iter()
            .filter(|r| own.contains(r.trial_id.as_str()))
            .collect();
        target_reached(self.job, &held_own).map(|r| r.trial_id.clone())
    }

    /// The sweep's first line: its trials, what the folder holds of them by state (a PRUNED
    /// trial is done, and said so apart), and what is left to run.
    pub(super) fn say_opening(
        &self,
        out: &mut dyn Write,
        todo: usize,
        held_latest: &[TrialRow],
        proposer: Option<&bayes::Proposer>,
        pruning: bool,
    ) -> Result<()> {
        let (job, split) = (self.job, self.split);
        let shard_note = self
            .opts
            .shard
            .map(|s| format!(", shard {s}"))
            .unwrap_or_default();
        let metric = format!(
            "metric {} ({:?})",
            job.file.metric.name, job.file.metric.goal
        );
        match (&self.opts.study, proposer) {
            // What is done and what is left is the study's, said once joined.
            (Some(url), _) => say(
                out,
                format!(
                    "sweep {}: {}, {} trials, as a worker of study {}: the study gives each trial; split {split}; {metric}",
                    job.name,
                    format!("{:?}", job.space.method).to_lowercase(),
                    proposer.map_or(self.all.len(), |p| p.planned as usize),
                    super::study::shown(url),
                ),
            )?,
            (None, Some(p)) => {
                let n = |state: &str| p.before.get(state).copied().unwrap_or(0);
                let held = already(n("COMPLETE"), n(report::PRUNED), n("FAIL"), pruning);
                say(out, format!(
                    "sweep {}: bayes, {} trials{shard_note}: {held}, {} to propose; split {split}; {metric}",
                    job.name, p.planned, p.left
                ))?;
                if p.ignored > 0 {
                    say(out, format!(
                        "note: {} rows of trials.csv are not this job's (another command, data, space, seed or epochs): they are kept, and ignored",
                        p.ignored
                    ))?;
                }
            }
            (None, None) => {
                let ids: HashSet<&str> = self.mine.iter().map(|t| t.id.as_str()).collect();
                let held: Vec<&TrialRow> = held_latest
                    .iter()
                    .filter(|r| ids.contains(r.trial_id.as_str()))
                    .collect();
                let count_of = |state: &str| held.iter().filter(|r| r.state == state).count();
                let held = already(count_of("COMPLETE"), count_of(report::PRUNED), 0, pruning);
                say(out, format!(
                    "sweep {}: {} trials in the space{shard_note}: {} here, {held}, {todo} to run; split {split}; {metric}",
                    job.name,
                    self.all.len(),
                    self.mine.len(),
                ))?;
            }
        }
        if split == SplitMode::Fused
            && job.file.command.is_none()
            && (proposer.is_some() || pruning)
        {
            say(out, "note: under fused, a trial that ends (pruned, failed or done) frees its slot in its group: the next trial of the same model, batch, optimizer and epochs takes it at the group's next epoch")?;
        }
        Ok(())
    }

    /// `--dry-run`: the rules, the plan, and (for a whole sweep) the `sbatch` line of the array
    /// that fits it.
    pub(super) fn say_dry_run(
        &self,
        todo: &[TrialSpec],
        pruner: Option<&hyperband::Pruner>,
        proposer: Option<&bayes::Proposer>,
        out: &mut dyn Write,
    ) -> Result<()> {
        if let Some(p) = pruner {
            say(out, p.describe())?;
        }
        if let Some(p) = proposer {
            say(out, bayes::plan_line(p))?;
        }
        let (job, concurrency) = (self.job, self.concurrency);
        dry_run(job, todo, self.split, concurrency, &self.dir, out)?;
        if self.opts.shard.is_none() {
            // Every trial of the job, done or not: the array's shape is the whole sweep's.
            let count = proposer.map_or(self.mine.len(), |p| p.planned as usize);
            say(out, slurm_line(job, concurrency, count))?;
        }
        Ok(())
    }
}

/// What the folder holds of a sweep's trials, by state.
fn already(complete: usize, pruned: usize, failed: usize, pruning: bool) -> String {
    let mut parts = vec![format!("{complete} already COMPLETE")];
    if pruned > 0 || pruning {
        parts.push(format!("{pruned} PRUNED"));
    }
    if failed > 0 {
        parts.push(format!("{failed} FAIL"));
    }
    parts.join(", ")
}

/// The output folder of a sweep: `--out`, else `out/<name>-sweep` (with a shard's own folder
/// inside it).
fn out_dir_of(job: &Job, opts: &SweepOptions) -> PathBuf {
    let sweep = || run::out_dir(None, &format!("{}-sweep", job.name));
    match (&opts.out, opts.shard) {
        (Some(out), _) => out.clone(),
        (None, Some(s)) => sweep().join(format!("shard-{}-of-{}", s.index, s.count)),
        (None, None) => sweep(),
    }
}

/// Refuses, before anything is opened or loaded (a GPU, the dataset), and in a dry run too,
/// `concurrency: auto` where no probe can choose it.
fn check_concurrency(job: &Job, concurrency: Concurrency, is_bayes: bool) -> Result<()> {
    if let Concurrency::Auto(_) = concurrency {
        if is_bayes {
            return Err(job
                .invalid(
                    "concurrency",
                    "auto is not available with method: bayes (its trials are proposed as it runs); give a number",
                )
                .into());
        }
        if job.file.command.is_some() {
            return Err(job
                .invalid(
                    "concurrency",
                    "auto probes built-in models only; give a number for an external command",
                )
                .into());
        }
    }
    Ok(())
}
