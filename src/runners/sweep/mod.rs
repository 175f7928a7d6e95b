//! The sweep runner: every trial of a job's parameter space, `concurrency` at a time under one split mode; resumable, shardable and interruptible.

pub mod bayes;
pub mod concurrency_probe;
mod dry_run;
pub mod export;
pub mod hyperband;
pub mod identity;
mod one_per_epoch;
mod recorder;
mod resume;
pub mod same_failure;
mod setup;
pub mod shards;
pub mod study;
mod worker;

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::job::{Concurrency, Goal, Job, SplitMode};
use crate::plan::{self, Round, TrialSpec};
use crate::report::{self, Ranked, TrialRow};
use crate::rounds::{counts_line, progress_row, say, trial_row};
use crate::run::{self, Modes, Session, Signals};
use crate::sched::{self, Event, RoundContext};
use crate::space::ParamValue;
pub use dry_run::{DRY_RUN_LISTED, SLURM_SHARDS};
pub use identity::{trial_key, Shard};
use recorder::Recorder;
pub use recorder::PROGRESS_SYNC;
use resume::Taken;
use same_failure::{SameFailures, Seen, Stopped};
use setup::Sweep;

/// Options of `gpumux sweep` beyond the job.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    pub out: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    /// Append to the results in `out` and skip the trials they hold as COMPLETE.
    pub resume: bool,
    pub shard: Option<Shard>,
    /// Print the plan and run nothing.
    pub dry_run: bool,
    /// After SIGINT, SIGTERM or SIGHUP, how long running trials may go on before they are stopped.
    pub grace: Duration,
    pub concurrency: Option<Concurrency>,
    pub split: Option<SplitMode>,
    /// The gpumux executable, for `process` mode.
    pub worker_exe: PathBuf,
    /// Show a progress bar (stderr is a terminal); otherwise log lines.
    pub progress: bool,
    /// Show what every external trial prints as it comes (`--verbose`), not only when the
    /// trials run one at a time.
    pub verbose: bool,
    /// The study this worker joins (`--study URL`): the trials it runs are those the
    /// study gives it, shared with every other worker of the study.
    pub study: Option<String>,
}

/// Every trial of a job's sweep, each once: the grid's points (capped by `run_cap`), or
/// `run_cap` random draws.
pub fn sweep_trials(job: &Job) -> Result<Vec<TrialSpec>> {
    // Checked and bounded (plan::MAX_TRIALS); each trial is computed from its index alone.
    let count = plan::sweep_count(job)?;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for i in 0..count {
        let params = job.params(i as usize)?;
        let seed = plan::trial_seed(job.file.seed, i);
        let id = trial_key(job, &params, seed);
        if !seen.insert(id.clone()) {
            continue; // the same draw twice is one trial
        }
        out.push(TrialSpec {
            id,
            index: i,
            hyper: job.hyper(i as usize)?,
            params,
            seed,
            fault: job.file.faults.iter().find(|f| f.trial == i).cloned(),
        });
    }
    Ok(out)
}

/// The latest row of each trial id, in first-seen order.
pub fn latest_rows(rows: &[TrialRow]) -> Vec<TrialRow> {
    let mut order = Vec::new();
    let mut last: BTreeMap<&str, &TrialRow> = BTreeMap::new();
    for r in rows {
        if last.insert(&r.trial_id, r).is_none() {
            order.push(r.trial_id.as_str());
        }
    }
    order
        .into_iter()
        .filter_map(|id| last.get(id).map(|r| (*r).clone()))
        .collect()
}

/// The best COMPLETE row by the metric column and the goal (ties: the lower trial id).
pub fn best<R: Ranked>(rows: &[R], goal: Goal) -> Option<&R> {
    rows.iter()
        .filter(|r| r.ranks())
        .filter_map(|r| r.metric().map(|m| (m, r)))
        .min_by(|(a, ra), (b, rb)| {
            let ord = match goal {
                Goal::Maximize => b.total_cmp(a),
                Goal::Minimize => a.total_cmp(b),
            };
            ord.then_with(|| ra.id().cmp(rb.id()))
        })
        .map(|(_, r)| r)
}

/// `best.yaml`: the best trial, with the parameters it received as a job's `parameters:`
/// section (for an external command: those its template names).
#[derive(Serialize)]
struct BestFile<'a> {
    job: &'a str,
    trial_id: &'a str,
    metric: BestMetric<'a>,
    seed: u64,
    parameters: BTreeMap<String, BTreeMap<&'static str, ParamValue>>,
}

#[derive(Serialize)]
struct BestMetric<'a> {
    name: &'a str,
    goal: Goal,
    value: f64,
}

/// The parameters a trial received: for an external command, only those its template names
/// (the built-in hyperparameters it never saw are left out); for a built-in model, all.
fn received_params(job: &Job, row: &TrialRow) -> BTreeMap<String, ParamValue> {
    let params: BTreeMap<String, ParamValue> =
        serde_json::from_str(&row.params).unwrap_or_default();
    match &job.file.command {
        Some(template) => {
            crate::sched::external::received(template, params, &run::swept_names(job))
        }
        None => params,
    }
}

/// Parameters as the console shows them: `lr=0.01 opt=adam`.
fn params_line(params: &BTreeMap<String, ParamValue>) -> String {
    if params.is_empty() {
        return "none".into();
    }
    let pairs: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(" ")
}

fn write_best(dir: &Path, job: &Job, row: &TrialRow) -> Result<PathBuf> {
    let params = received_params(job, row);
    let file = BestFile {
        job: &job.name,
        trial_id: &row.trial_id,
        metric: BestMetric {
            name: &job.file.metric.name,
            goal: job.file.metric.goal,
            value: row.metric.unwrap_or(f64::NAN),
        },
        seed: row.seed,
        parameters: params
            .into_iter()
            .map(|(k, v)| (k, BTreeMap::from([("value", v)])))
            .collect(),
    };
    let text =
        serde_yaml::to_string(&file).map_err(|e| Error::Internal(format!("best.yaml: {e}")))?;
    let path = dir.join("best.yaml");
    let body = format!(
        "# the best trial of sweep {}; `parameters` can be pasted into a job\n{text}",
        job.name
    );
    crate::outdir::replace_bytes(&path, body.as_bytes())?;
    Ok(path)
}

/// `gpumux sweep`: runs the trials of this shard that are not COMPLETE yet.
pub fn run(job: &Job, opts: &SweepOptions, out: &mut dyn Write) -> Result<PathBuf> {
    let sweep = Sweep::plan(job, opts)?;
    if let Some(url) = &opts.study {
        check_study(opts, url)?;
    }
    // Early termination resumes where it was: the rungs of the trials done.
    let pruner = hyperband::Pruner::of(job).map(Arc::new);
    // A signal stops the reading of what is there at once (nothing has started yet), and the
    // rewrites of results files once the trials' grace is over. A dry run opens no device.
    let opened = run::Setup {
        command: "sweep",
        modes: Modes::One(sweep.split, sweep.work),
        signals: Signals::Drain(opts.grace),
        opens_device: !opts.dry_run,
        data_dir: opts.data_dir.as_deref(),
    }
    .open(job)?;
    let read = |dir: &Path, cancel: &Cancel| Taken::take(dir, opts, cancel, pruner.as_deref());
    let (session, Taken { previous, resumed }) =
        opened.held_folder(&sweep.dir, !opts.dry_run, read)?;
    let mut proposer = sweep
        .is_bayes
        .then(|| bayes::Proposer::new(job, opts.shard, &previous));
    let todo = sweep.todo(&previous, proposer.as_ref())?;
    let held_latest = latest_rows(&previous);
    let pruning = pruner.is_some();
    sweep.say_opening(out, todo.len(), &held_latest, proposer.as_ref(), pruning)?;
    if opts.dry_run {
        sweep.say_dry_run(&todo, pruner.as_deref(), proposer.as_ref(), out)?;
        return Ok(sweep.dir);
    }
    let mut writer = session.results_writer(resumed)?;
    if let Some(url) = &opts.study {
        let worker = worker::Worker {
            job,
            sweep: &sweep,
            session: &session,
            url,
        };
        return worker.run(previous, &mut writer, out);
    }
    let to_run = proposer.as_ref().map_or(todo.len(), |p| p.left as usize);
    let reached = sweep.target_reached(&held_latest, proposer.as_ref());
    let (ran, stopped) = match reached.filter(|_| to_run > 0) {
        Some(id) => {
            let words = format!("trial {id} already reached metric.target: no trial is started");
            say(out, words)?;
            (Vec::new(), None)
        }
        None => {
            let trials = Trials {
                sweep: &sweep,
                session: &session,
            };
            let ends = (proposer.as_mut(), &mut writer);
            trials.run(&todo, to_run, pruner, ends, None, out)?
        }
    };
    let mut rows = previous;
    rows.extend(ran);
    let (ids, planned) = sweep.ids_planned(proposer.as_ref());
    let stopped = stopped.as_ref();
    let cancel = session.cancel();
    finish(job, &sweep.dir, &ids, planned, &rows, cancel, stopped, out)?;
    Ok(sweep.dir)
}

/// `--study`: refused (exit 2) with `--shard` (two ways to split one sweep), and for a URL
/// that is not a study's (`sqlite:PATH`, `postgresql://…`).
fn check_study(opts: &SweepOptions, url: &str) -> Result<()> {
    study::sqlite_path(url).map_err(|e| Error::Usage(e.to_string()))?;
    if opts.shard.is_some() {
        return Err(Error::Usage(
            "--study and --shard are two ways to split one sweep: give one of them".into(),
        ));
    }
    Ok(())
}

/// What sees a sweep's epochs and ends as this worker records them (a study records them in
/// its store too), and its idle moments.
trait Recorded {
    fn epoch(&mut self, trial: &TrialSpec, row: &report::ProgressRow);
    fn end(&mut self, o: &sched::TrialOutcome, row: &TrialRow);
    fn idle(&mut self);
}

/// What running a sweep's trials needs, once its folder is read and its device open.
struct Trials<'a> {
    sweep: &'a Sweep<'a>,
    session: &'a Session<'a>,
}

impl Trials<'_> {
    /// Runs up to `to_run` trials (`todo`, or those the proposer proposes), `concurrency` at a
    /// time (`auto`: the probe picks it), their rows written by the writer; returns the rows
    /// and why the sweep stopped early, if it did.
    fn run(
        &self,
        todo: &[TrialSpec],
        to_run: usize,
        pruner: Option<Arc<hyperband::Pruner>>,
        (proposer, writer): (Option<&mut bayes::Proposer>, &mut report::ReportWriter),
        given: Option<(sched::Feed, &mut dyn Recorded)>,
        out: &mut dyn Write,
    ) -> Result<(Vec<TrialRow>, Option<Stopped>)> {
        let (job, opts, split) = (self.sweep.job, self.sweep.opts, self.sweep.split);
        if to_run == 0 {
            return Ok((Vec::new(), None));
        }
        let mut ctx = self.session.round_context(job, &opts.worker_exe)?;
        let resolved = self.session.resolved()?;
        let n = match self.sweep.concurrency {
            Concurrency::Fixed(n) => n,
            // Under fused the probe times fused rounds: the N it picks is the number of
            // trials that train at once, in groups over the fused slices.
            Concurrency::Auto(_) => {
                match concurrency_probe::choose(job, todo, &ctx, resolved, split, out) {
                    Ok(n) => n,
                    // A signal during the probe: no trial ran; the end says so (exit 3).
                    Err(Error::Interrupted(why)) => {
                        tracing::warn!("{why}");
                        return Ok((Vec::new(), None));
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let n = n.min(to_run as u32).max(1);
        let round = Round {
            index: 0,
            n,
            split,
            slices: plan::slices(job, n, split, &resolved.budgets)?,
            trials: todo.to_vec(),
        };
        ctx.metric = Some(job.file.metric.name.clone());
        ctx.prune = pruner.map(|p| {
            sched::Pruning(Arc::new(
                move |t: &TrialSpec, s: &crate::train::EpochStats| !p.goes_on(&t.id, s),
            ))
        });
        if let Some(ext) = ctx.external_mut() {
            // One trial at a time, its lines cannot be mixed with another's: they show.
            ext.stream = opts.verbose || n == 1;
        }
        if let Some((feed, on)) = given {
            let feed = Some((to_run, feed));
            return execute(job, &round, &ctx, writer, opts.progress, feed, Some(on));
        }
        match proposer {
            None => execute(job, &round, &ctx, writer, opts.progress, None, None),
            Some(p) => {
                let ran = {
                    let mut feed = |ended: Option<&sched::TrialOutcome>| p.next(ended);
                    execute(
                        job,
                        &round,
                        &ctx,
                        writer,
                        opts.progress,
                        Some((to_run, &mut feed)),
                        None,
                    )?
                };
                match p.error.take() {
                    Some(e) => Err(e.into()),
                    None => Ok(ran),
                }
            }
        }
    }
}

/// Runs the round of the sweep, writing each row as it comes; returns the trial rows written,
/// and why the sweep stopped early when it did: for an external command, once its first
/// [`same_failure::SAME_FAILURES`] trials to end all failed the same way, no more are started
/// and those running are ended (they are recorded INTERRUPTED, and `--resume` runs them).
fn execute(
    job: &Job,
    round: &Round,
    ctx: &RoundContext,
    writer: &mut report::ReportWriter,
    progress: bool,
    feed: Option<(usize, sched::Feed)>,
    on: Option<&mut dyn Recorded>,
) -> Result<(Vec<TrialRow>, Option<Stopped>)> {
    let on = std::cell::RefCell::new(on);
    // A fed round (bayes) runs the trials its run_cap has left.
    let total = feed.as_ref().map_or(round.trials.len(), |(n, _)| *n) as u64;
    let console = Console::new(progress, total);
    let started = Instant::now();
    let recorder = std::cell::RefCell::new(Recorder {
        writer,
        unsynced: false,
        synced: Instant::now(),
        failed: None,
        lost: Default::default(),
    });
    let mut ends = RoundEnds {
        job,
        round,
        ctx,
        console: &console,
        total,
        running: 0,
        failed: 0,
        finished: 0,
        rows: Vec::new(),
        same: SameFailures::default(),
        stopped: None,
    };
    let mut sink = |ev: &Event| {
        let mut rec = recorder.borrow_mut();
        let res = match ev {
            Event::Started { .. } => {
                ends.running += 1;
                Ok(())
            }
            Event::Epoch { trial, stats, .. } => {
                ends.same.ran(&trial.id);
                let row = progress_row(round, &trial.id, stats);
                if let Some(on) = on.borrow_mut().as_mut() {
                    on.epoch(trial, &row);
                }
                rec.progress(&row)
            }
            Event::Finished(o) => {
                let res = ends.finished(o, &mut rec);
                if let (Some(on), Some(row)) = (on.borrow_mut().as_mut(), ends.rows.last()) {
                    on.end(o, row);
                }
                res
            }
            Event::Output { trial_id, line } => {
                // Through the bar, so that it is not drawn over; on stderr, beside the log.
                console.bar.suspend(|| {
                    let _ = writeln!(std::io::stderr(), "[{trial_id}] {line}");
                });
                return;
            }
        };
        console.bar.set_message(ends.counts());
        rec.note(res, &ctx.cancel);
    };
    let mut idle = || {
        let mut rec = recorder.borrow_mut();
        let res = rec.sync();
        rec.note(res, &ctx.cancel);
        if let Some(on) = on.borrow_mut().as_mut() {
            on.idle();
        }
    };
    match feed {
        Some((_, feed)) => sched::run_round_fed(round, ctx, &mut sink, &mut idle, feed),
        None => sched::run_round_with(round, ctx, &mut sink, &mut idle),
    };
    console.bar.finish_and_clear();
    let mut rec = recorder.into_inner();
    let res = rec.sync();
    rec.note(res, &ctx.cancel);
    if let Some(e) = rec.failed {
        return Err(e.into());
    }
    tracing::info!(
        "ran {} trials in {:.1} s with {} at a time",
        ends.rows.len(),
        started.elapsed().as_secs_f64(),
        round.n
    );
    Ok((ends.rows, ends.stopped))
}

/// Where a sweep's lines go as it runs: above its progress bar, or as log lines without one.
struct Console {
    bar: ProgressBar,
    progress: bool,
}

impl Console {
    fn new(progress: bool, total: u64) -> Console {
        let bar = if progress {
            ProgressBar::new(total)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} trials, ETA {eta}  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        Console { bar, progress }
    }

    /// A line above the bar, or logged at info (`warn`: at warning) without one.
    fn say(&self, line: String, warn: bool) {
        match (self.progress, warn) {
            (true, _) => self.bar.println(line),
            (false, false) => tracing::info!("{line}"),
            (false, true) => tracing::warn!("{line}"),
        }
    }
}

/// The trials of a sweep's round as they end: their rows, the counts its lines show, and
/// what stops the sweep early (metric.target reached; the same failure again and again).
struct RoundEnds<'a> {
    job: &'a Job,
    round: &'a Round,
    ctx: &'a RoundContext,
    console: &'a Console,
    total: u64,
    running: u32,
    failed: u32,
    finished: u64,
    rows: Vec<TrialRow>,
    same: SameFailures,
    stopped: Option<Stopped>,
}

impl RoundEnds<'_> {
    fn counts(&self) -> String {
        format!("{} running, {} failed", self.running, self.failed)
    }

    /// A trial ended: its row written, its line said, and the sweep drained when the trial
    /// reached metric.target, or stopped when the trials failed the same way.
    fn finished(
        &mut self,
        o: &sched::TrialOutcome,
        rec: &mut Recorder,
    ) -> std::result::Result<(), crate::error::ReportError> {
        let (job, round, cancel) = (self.job, self.round, &self.ctx.cancel);
        self.running = self.running.saturating_sub(1);
        self.finished += 1;
        let row = rec.checked(trial_row(job, round.index, round.split, round.n, o));
        if !row.done() {
            self.failed += 1;
        }
        if let Some(line) = counts_line(std::slice::from_ref(&row)) {
            tracing::debug!("trial {}: {line}", row.trial_id);
        }
        let seen = if self.ctx.external().is_some() && !cancel.draining() {
            self.same.see(o)
        } else {
            Seen::Nothing
        };
        // A failure the same as an earlier one is said once.
        let error = match &seen {
            Seen::Same { first } => format!(": the same failure as {first}"),
            Seen::Stop(s) => format!(": the same failure as {}", s.trials[0]),
            _ if row.error.is_empty() => String::new(),
            _ => format!(": {}", row.error),
        };
        let metric = row
            .metric
            .map(|m| format!("{} {m:.4}", job.file.metric.name))
            .unwrap_or_default();
        self.console.say(
            format!(
                "trial {}/{} {} {} {metric} in {:.1} s ({}){error}",
                self.finished,
                self.total,
                row.trial_id,
                row.state,
                row.wall_s,
                self.counts(),
            ),
            false,
        );
        self.console.bar.inc(1);
        if let (Some(target), Some(m), true) = (
            job.file.metric.target,
            row.metric,
            row.state == report::COMPLETE,
        ) {
            if reaches(job.file.metric.goal, m, target) && !cancel.draining() {
                let line = format!(
                    "trial {} reached metric.target ({} {m:.4}, target {target}): starting no more trials; the {} running finish",
                    row.trial_id, job.file.metric.name, self.running
                );
                self.console.say(line, false);
                cancel.drain();
            }
        }
        if let Seen::Stop(s) = seen {
            let line = format!(
                "stopping the sweep: its first {} trials to end failed the same way; \
                 starting no more, ending the {} running",
                s.trials.len(),
                self.running
            );
            self.console.say(line, true);
            cancel.abort();
            self.stopped = Some(s);
        }
        let res = rec.trial(&row);
        self.rows.push(row);
        res
    }
}

/// Whether `value` reaches `target` under `goal` (at or past it).
fn reaches(goal: Goal, value: f64, target: f64) -> bool {
    match goal {
        Goal::Maximize => value >= target,
        Goal::Minimize => value <= target,
    }
}

/// The first COMPLETE row that reached the job's `metric.target`, if it has one.
fn target_reached<'a>(job: &Job, rows: &[&'a TrialRow]) -> Option<&'a TrialRow> {
    let target = job.file.metric.target?;
    rows.iter().copied().find(|r| {
        r.state == report::COMPLETE
            && r.metric
                .is_some_and(|m| reaches(job.file.metric.goal, m, target))
    })
}

/// The end of a sweep: counts, the best trial and best.yaml, and the exit status.
#[allow(clippy::too_many_arguments)]
fn finish(
    job: &Job,
    dir: &Path,
    mine: &[String],
    planned: usize,
    rows: &[TrialRow],
    cancel: &Cancel,
    stopped: Option<&Stopped>,
    out: &mut dyn Write,
) -> Result<()> {
    let latest = latest_rows(rows);
    let ids: HashSet<&str> = mine.iter().map(String::as_str).collect();
    let mine_rows: Vec<&TrialRow> = latest
        .iter()
        .filter(|r| ids.contains(r.trial_id.as_str()))
        .collect();
    let count = |state: &str| mine_rows.iter().filter(|r| r.state == state).count();
    let (complete, failed, interrupted) = (count("COMPLETE"), count("FAIL"), count("INTERRUPTED"));
    let pruned = count(report::PRUNED);
    let not_started = planned.saturating_sub(mine_rows.len());
    say(out, format!(
        "{complete} COMPLETE, {failed} FAIL, {interrupted} INTERRUPTED{}, {not_started} not started, of {} trials; results in {}",
        if job.file.early_terminate.is_some() || pruned > 0 {
            format!(", {pruned} PRUNED")
        } else {
            String::new()
        },
        planned,
        dir.display()
    ))?;
    if let Some(e) = &job.file.early_terminate {
        let (saved, all) = hyperband::saved(&mine_rows, e.max_iter(job.file.train.epochs));
        say(out, format!(
            "early termination: {pruned} trials PRUNED; they left {saved} of the {all} trial-epochs of the trials done untrained ({:.0}% saved)",
            100.0 * saved as f64 / all.max(1) as f64
        ))?;
    }
    if let Some(b) = best(&latest, job.file.metric.goal) {
        let path = write_best(dir, job, b)?;
        say(
            out,
            format!(
                "best trial {}: {} {:.4} ({:?}), params {}; written to {}",
                b.trial_id,
                job.file.metric.name,
                b.metric.unwrap_or(f64::NAN),
                job.file.metric.goal,
                params_line(&received_params(job, b)),
                path.display()
            ),
        )?;
    }
    // Stopped for its failures, not by a signal: exit 1, with the shared failure said once.
    if let Some(s) = stopped {
        return Err(Error::TrialsFailed(s.message()));
    }
    // A trial reached metric.target: the sweep is done, as W&B's is, whatever is not started.
    let reached = target_reached(job, &mine_rows);
    if let Some(r) = reached {
        say(
            out,
            format!(
                "metric.target {} reached by trial {}: the sweep is done ({not_started} trials not started)",
                job.file.metric.target.unwrap_or(f64::NAN),
                r.trial_id
            ),
        )?;
    }
    // A signal that came while the last trials were finishing changes nothing when they all
    // did: the sweep (or the shard) is done, and a job array must not wait for a requeue.
    // A PRUNED trial is done: it ran as far as the sweep wanted.
    if cancel.draining() && complete + pruned >= planned {
        sched::signals::settle();
        say(
            out,
            if pruned > 0 {
                "a signal came while the last trials ran, but every trial is COMPLETE or PRUNED: nothing is left to do"
            } else {
                "a signal came while the last trials ran, but every trial is COMPLETE: nothing is left to do"
            },
        )?;
    } else if cancel.draining() && reached.is_none() {
        return Err(Error::Interrupted(format!(
            "{complete} of {} trials COMPLETE{}; run again with --resume to finish",
            planned,
            match pruned {
                0 => String::new(),
                p => format!(", {p} PRUNED"),
            }
        )));
    }
    if failed > 0 {
        return Err(Error::TrialsFailed(format!(
            "{failed} of {} trials failed (see {})",
            planned,
            dir.join(report::TRIALS_CSV).display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::dry_run::slurm_command;
    use super::*;
    use crate::plan::mlp_job;

    fn row(id: &str, state: &str, metric: Option<f64>) -> TrialRow {
        TrialRow {
            trial_id: id.into(),
            state: state.into(),
            metric,
            ..Default::default()
        }
    }

    #[test]
    fn the_slurm_line_fits_the_shards_cpus_and_device() {
        let line = slurm_command(4, 3, true, Path::new("jobs/a.yaml"));
        assert!(
            line.ends_with("sbatch --array=0-3 --cpus-per-task=3 --gres=gpu:1 jobs/slurm/sweep.sbatch jobs/a.yaml"),
            "{line}"
        );
        let line = slurm_command(1, 1, false, Path::new("b.yaml"));
        assert!(
            line.contains(
                "--array=0-0 --cpus-per-task=1 --gres=none jobs/slurm/sweep.sbatch b.yaml"
            ),
            "{line}"
        );
        assert!(line.contains("--gres=gpu:1 on a GPU partition"), "{line}");
    }

    #[test]
    fn latest_rows_keep_the_last_state_in_first_seen_order() {
        let rows = vec![
            row("a", "FAIL", None),
            row("b", "COMPLETE", Some(0.5)),
            row("a", "COMPLETE", Some(0.7)),
        ];
        let l = latest_rows(&rows);
        assert_eq!(l.len(), 2);
        assert_eq!(
            (l[0].trial_id.as_str(), l[0].state.as_str()),
            ("a", "COMPLETE")
        );
    }

    #[test]
    fn best_follows_the_goal_and_skips_failures() {
        let rows = vec![
            row("a", "COMPLETE", Some(0.5)),
            row("b", "COMPLETE", Some(0.9)),
            row("c", "FAIL", Some(0.99)),
        ];
        assert_eq!(
            best(&rows, Goal::Maximize).map(|r| r.trial_id.as_str()),
            Some("b")
        );
        assert_eq!(
            best(&rows, Goal::Minimize).map(|r| r.trial_id.as_str()),
            Some("a")
        );
        assert!(best(&[row("c", "FAIL", Some(1.0))], Goal::Maximize).is_none());
    }

    #[test]
    fn grid_and_random_sweeps_list_each_trial_once() {
        let grid = mlp_job(
            "method: grid\nparameters:\n  lr: {values: [0.1, 0.01, 0.1]}\n  batch_size: {values: [16, 32]}\n",
        );
        let t = sweep_trials(&grid).unwrap();
        assert_eq!(t.len(), 6, "every grid point, each with its own seed");
        let ids: HashSet<&str> = t.iter().map(|x| x.id.as_str()).collect();
        assert_eq!(ids.len(), 6);
        let random = mlp_job(
            "run_cap: 40\nparameters:\n  lr: {min: 0.0001, max: 0.1, distribution: log_uniform_values}\n",
        );
        let t = sweep_trials(&random).unwrap();
        assert_eq!(t.len(), 40);
        assert_eq!(t, sweep_trials(&random).unwrap(), "deterministic");
        let no_cap = mlp_job("parameters:\n  lr: {min: 0.0001, max: 0.1}\n");
        assert!(sweep_trials(&no_cap)
            .unwrap_err()
            .to_string()
            .contains("run_cap"));
    }
}
