//! The `fib` runner: for each N and split mode, a round of N trials at once; the CSVs written row by row, then the plots and the summary.

mod run_rows;

use std::io::Write;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use crate::error::{Error, Result};
use crate::job::Job;
use crate::plan::{self, Round};
use crate::report::{self, RunRow, TrialRow};
use crate::rounds::{check_batch, counts_line, print_paths, progress_row, say, trial_row};
use crate::run::{self, Modes, Session, Signals};
use crate::sched::{self, Event, TrialState};
use crate::telemetry::Sampler;

/// Options of `gpumux fib` beyond the job.
#[derive(Clone, Debug, Default)]
pub struct FibOptions {
    pub out: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    /// The gpumux executable, for `process` mode.
    pub worker_exe: PathBuf,
    /// Show a progress bar (stderr is a terminal).
    pub progress: bool,
}

/// `gpumux fib`: every round of the job; writes the CSVs row by row, the plots and the summary.
pub fn run(job: &Job, opts: &FibOptions, out: &mut dyn Write) -> Result<PathBuf> {
    job.model()?;
    // A signal stops the experiment: running trials end as INTERRUPTED, the round is not
    // recorded (its makespan would be wrong), and gpumux exits with code 3.
    let opened = run::Setup {
        command: "fib",
        modes: Modes::Listed,
        signals: Signals::Stop,
        opens_device: true,
        data_dir: opts.data_dir.as_deref(),
    }
    .open(job)?;
    let (r, data) = (opened.resolved()?, opened.data()?);
    let max_n = job.file.n.iter().copied().max().unwrap_or(1);
    check_batch(job, data, &(0..max_n).collect::<Vec<_>>())?;
    let rounds = plan::rounds(job, &r.budgets, opened.modes())?;
    let dir = run::out_dir(opts.out.as_deref(), &job.name);
    let session = opened.fresh_folder(&dir)?;
    let (r, data) = (session.resolved()?, session.data()?);
    let mut writer = session.results_writer(None)?;
    let ctx = session.round_context(job, &opts.worker_exe)?;
    let total: u64 = rounds.iter().map(|r| r.n as u64).sum();
    let names: Vec<&str> = session.modes().iter().map(|s| s.name()).collect();
    crate::note!(
        "{}: {} rounds ({total} trials) of {} on {}, N = {:?}, splits {}; writing {}",
        job.name,
        rounds.len(),
        job.model()?.kind,
        data.name,
        job.file.n,
        names.join(", "),
        dir.display()
    );
    warm_up(&rounds, &ctx)?;
    let bar = progress_bar(total, opts.progress);
    let mut runs = Vec::new();
    let mut trials = Vec::new();
    for round in &rounds {
        let at = Timed {
            job,
            ctx: &ctx,
            data,
            r,
            session: &session,
            bar: &bar,
        };
        let row = at
            .round(round, &mut writer, &mut trials)
            .map_err(|e| match e {
                Error::Interrupted(what) => Error::Interrupted(format!(
                    "{what}; {} rounds recorded in {}",
                    runs.len(),
                    dir.display()
                )),
                other => other,
            })?;
        say_round(&bar, round, &row, rounds.len(), opts.progress);
        runs.push(row);
    }
    bar.finish_and_clear();
    finish(&dir, &runs, &trials, out)?;
    let ok: u32 = runs.iter().map(|r| r.ok).sum();
    if ok == 0 && !runs.is_empty() {
        return Err(Error::TrialsFailed(format!(
            "every trial failed ({total} of {total}); trials.csv in {} gives each one's reason",
            dir.display()
        )));
    }
    Ok(dir)
}

/// What every timed round of a fib run shares.
struct Timed<'a> {
    job: &'a Job,
    ctx: &'a sched::RoundContext,
    data: &'a crate::data::Dataset,
    r: &'a run::Resolved,
    session: &'a Session<'a>,
    bar: &'a ProgressBar,
}

impl Timed<'_> {
    /// Runs one timed round: its trials' rows written as they come (appended to `trials`),
    /// its `runs.csv` row returned once it ends. A signal during it records no row for it.
    fn round(
        &self,
        round: &Round,
        writer: &mut report::ReportWriter,
        trials: &mut Vec<TrialRow>,
    ) -> Result<RunRow> {
        let (job, bar) = (self.job, self.bar);
        let mut states = StateCounts {
            queued: round.n,
            ..Default::default()
        };
        bar.set_message(states.line(round));
        let mut write_err = None;
        // Trials with a progress row that could not be written: never recorded COMPLETE.
        let mut lost = crate::rounds::LostRows::default();
        // NVML samples the device at 20 Hz while the round runs (GPU only).
        let sampler = self.session.telemetry(20.0);
        let outcome = sched::run_round(round, self.ctx, &mut |ev| {
            let res = match ev {
                Event::Started { .. } => {
                    states.queued -= 1;
                    states.running += 1;
                    bar.set_message(states.line(round));
                    Ok(())
                }
                Event::Epoch { trial, stats, .. } => {
                    let res = writer.progress(&progress_row(round, &trial.id, stats));
                    if let Err(e) = &res {
                        lost.entry(trial.id.clone()).or_insert_with(|| e.into());
                    }
                    res
                }
                Event::Finished(o) => {
                    bar.inc(1);
                    states.running -= 1;
                    match o.state() {
                        TrialState::Complete => states.complete += 1,
                        _ => states.failed += 1,
                    }
                    bar.set_message(states.line(round));
                    let row = crate::rounds::unless_progress_lost(
                        trial_row(job, round.index, round.split, round.n, o),
                        &lost,
                    );
                    let res = writer.trial(&row);
                    trials.push(row);
                    res
                }
                // fib runs built-in models only: no external trial prints.
                Event::Output { .. } => Ok(()),
            };
            if let Err(e) = res {
                write_err.get_or_insert(e);
            }
        });
        if let Some(e) = write_err {
            return Err(e.into());
        }
        let telemetry = sampler.map(Sampler::stop).unwrap_or_default();
        if self.ctx.cancel.draining() {
            bar.finish_and_clear();
            return Err(Error::Interrupted(format!(
                "stopped during round {} (N={} {})",
                round.index, round.n, round.split
            )));
        }
        let row = run_rows::run_row(job, round, &outcome, self.data, self.r, &telemetry);
        writer.run(&row)?;
        let this_round: Vec<_> = trials
            .iter()
            .filter(|t| t.round == round.index)
            .cloned()
            .collect();
        if let Some(line) = counts_line(&this_round) {
            tracing::debug!(
                "round {} (N={} {}): {line}",
                round.index,
                round.n,
                round.split
            );
        }
        Ok(row)
    }
}

/// The progress bar of a fib run (hidden when stderr is no terminal).
fn progress_bar(total: u64, show: bool) -> ProgressBar {
    let bar = if show {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} trials  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

/// A round's line: above the progress bar, and as a note when there is no bar.
fn say_round(bar: &ProgressBar, round: &Round, row: &RunRow, rounds: usize, progress: bool) {
    bar.println(format!(
        "round {:>3}: N={:<3} {:<8} makespan {:>8.2} s  time/training {:>7.3} s  ok {}  failed {}",
        round.index,
        round.n,
        round.split.name(),
        row.makespan_s,
        row.time_per_training_s,
        row.ok,
        row.failed
    ));
    if !progress {
        crate::note!(
            "round {}/{}: N={} {} makespan {:.2} s, time per training {:.3} s, ok {}, failed {}",
            round.index + 1,
            rounds,
            round.n,
            round.split,
            row.makespan_s,
            row.time_per_training_s,
            row.ok,
            row.failed
        );
    }
}

/// An untimed warm-up round per in-process split mode before the timed rounds: each
/// mode's first round (fused: its first with two trials or more, so that the group's kernels
/// load) for two steps of one epoch and one evaluation, its rows unwritten. Without it the first timed round pays
/// the process's one-time costs (on a GPU: kernel modules, cuBLAS and cuDNN initialisation, the
/// first graph capture; on an H200 the MLP's first N=1 round took 0.16 s against 0.046 s for the
/// next mode's), and the first mode's N=1 baseline inflates its speedups. `process` and `mps`
/// workers start afresh each round, so they are not warmed.
fn warm_up(rounds: &[Round], ctx: &sched::RoundContext) -> Result<()> {
    let mut warm = ctx.clone();
    if let Some(work) = warm.builtin_mut() {
        work.epochs = 1;
    }
    warm.max_steps = Some(2);
    warm.warm_up = true;
    let mut seen = Vec::new();
    for round in rounds {
        let split = round.split;
        let least = if split == crate::job::SplitMode::Fused {
            2
        } else {
            1
        };
        if split.one_process_per_trial() || seen.contains(&split) || round.n < least {
            continue;
        }
        seen.push(split);
        let started = std::time::Instant::now();
        let outcome = sched::run_round(round, &warm, &mut |_| {});
        if ctx.cancel.draining() {
            return Err(Error::Interrupted(format!(
                "stopped while warming up {split}; no round recorded"
            )));
        }
        let failed = outcome
            .outcomes
            .iter()
            .filter(|o| o.state() != TrialState::Complete)
            .count();
        crate::note!(
            "warm-up: {split}, N={}, 2 steps and an evaluation, {:.2} s (untimed){}",
            round.n,
            started.elapsed().as_secs_f64(),
            if failed > 0 {
                format!(
                    "; {failed} of {} failed, the timed rounds will say why",
                    round.n
                )
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

/// How many trials of a round are in each state, for the progress line.
#[derive(Default)]
struct StateCounts {
    queued: u32,
    running: u32,
    complete: u32,
    failed: u32,
}

impl StateCounts {
    fn line(&self, round: &Round) -> String {
        format!(
            "N={} {}: {} QUEUED, {} RUNNING, {} COMPLETE, {} FAIL",
            round.n, round.split, self.queued, self.running, self.complete, self.failed
        )
    }
}

fn finish(dir: &Path, runs: &[RunRow], trials: &[TrialRow], out: &mut dyn Write) -> Result<()> {
    let paths = report::write_report(dir, runs, trials)?;
    let text = report::summary_text(runs, trials);
    write!(out, "{text}").map_err(Error::io("stdout"))?;
    say(out, format!("results: {}", dir.display()))?;
    print_paths(&paths, out)
}
