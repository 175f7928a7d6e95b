//! The sweep runner: every trial of a job's parameter space, `concurrency` at a time under one split mode; resumable, shardable and interruptible.

pub mod bayes;
pub mod concurrency_probe;
mod dry_run;
pub mod hyperband;
pub mod identity;
mod one_per_epoch;
mod recorder;
mod resume;
pub mod same_failure;
pub mod shards;

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::cancel::Cancel;
use crate::engine::cuda::CudaEngine;
use crate::error::{Error, Result};
use crate::job::{Concurrency, Goal, Job, SplitMode};
use crate::plan::{self, Round, TrialSpec};
use crate::report::{self, TrialRow};
use crate::rounds::{builtin_context, counts_line, progress_row, say, trial_row};
use crate::run::split_policy::{check_here, check_use, Work};
use crate::run::{self, OutFolder, Resolved};
use crate::sched::external::ExternalEnv;
use crate::sched::{self, Device, Devices, Event, ExternalTrials, RoundContext};
use crate::space::{Method, ParamValue};
use dry_run::{dry_run, slurm_line};
pub use dry_run::{DRY_RUN_LISTED, SLURM_SHARDS};
pub use identity::{trial_key, Shard};
use recorder::Recorder;
pub use recorder::PROGRESS_SYNC;
use resume::{keep_complete_progress, scan_progress, Held};
use same_failure::{SameFailures, Seen, Stopped};

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
pub fn best(rows: &[TrialRow], goal: Goal) -> Option<&TrialRow> {
    rows.iter()
        .filter(|r| r.ranks())
        .filter_map(|r| r.metric.map(|m| (m, r)))
        .min_by(|(a, ra), (b, rb)| {
            let ord = match goal {
                Goal::Maximize => b.total_cmp(a),
                Goal::Minimize => a.total_cmp(b),
            };
            ord.then_with(|| ra.trial_id.cmp(&rb.trial_id))
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
        Some(template) => crate::sched::external::received(template, params, &swept_names(job)),
        None => params,
    }
}

/// The names of the sweep's own parameters (its space's), in name order.
fn swept_names(job: &Job) -> Vec<String> {
    job.space.dists.keys().cloned().collect()
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
    let dir = match (&opts.out, opts.shard) {
        (Some(out), _) => out.clone(),
        (None, Some(s)) => run::out_dir(None, &format!("{}-sweep", job.name))
            .join(format!("shard-{}-of-{}", s.index, s.count)),
        (None, None) => run::out_dir(None, &format!("{}-sweep", job.name)),
    };
    // A writing run holds the folder's lock from before it reads what is there to its end.
    let lock = if opts.dry_run {
        None
    } else {
        Some(OutFolder::lock(&dir)?)
    };
    // A signal stops the reading of what is there at once (nothing has started yet), and the
    // rewrites of results files once the trials' grace is over.
    let cancel = run::cancel_on_signals(opts.grace);
    let reading = report::Interrupt::OnDrain(cancel.clone());
    // Every results file there is read through first (progress.csv row by row): one that
    // cannot be read is refused (exit 2) and left as it is, with or without --resume; a cut
    // last line is dropped.
    let held = Held::read(&dir)?;
    // The trials' own folders go under `trials/`: never through a link planted there.
    let trials_dir = dir.join("trials");
    if std::fs::symlink_metadata(&trials_dir).is_ok_and(|m| !m.is_dir()) {
        return Err(Error::Usage(format!(
            "{} is a link or a file, not a folder: the trials' folders are made inside the output folder only; move it away",
            trials_dir.display()
        )));
    }
    // Nor through a link planted in its place of a trial's folder.
    if let Ok(entries) = std::fs::read_dir(&trials_dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_symlink()) {
                return Err(Error::Usage(format!(
                    "{} is a link: the trials' folders are made inside the output folder only; move it away",
                    entry.path().display()
                )));
            }
        }
    }
    let had_rows = held.has_rows();
    let previous = if opts.resume { held.trials } else { Vec::new() };
    // Early termination resumes where it was: the rungs of the trials done.
    let pruner = hyperband::Pruner::of(job).map(Arc::new);
    let restoring = pruner.as_deref().filter(|_| opts.resume);
    let scan = scan_progress(&dir, &previous, restoring, &reading)?;
    if (had_rows || scan.rows > 0) && !opts.resume && !opts.dry_run {
        return Err(Error::Usage(format!(
            "{} already holds sweep results: add --resume to finish them, or choose another --out",
            dir.display()
        )));
    }
    if scan.restored > 0 {
        tracing::info!(
            "early termination: {} rung values restored from the trials done",
            scan.restored
        );
    }
    let resumed = if opts.resume && !opts.dry_run {
        keep_complete_progress(&dir, &scan.epochs, &reading)?;
        // Drops a cut last line, so that the next row starts on a line of its own.
        let mut writer = report::ReportWriter::append(&dir)?;
        writer.interrupted_by(&report::Interrupt::OnAbort(cancel.clone()));
        Some(writer)
    } else {
        None
    };
    drop(scan);
    let done: HashSet<&str> = previous
        .iter()
        .filter(|r| r.done())
        .map(|r| r.trial_id.as_str())
        .collect();
    let mut proposer = is_bayes.then(|| bayes::Proposer::new(job, opts.shard, &previous));
    let todo: Vec<TrialSpec> = match &proposer {
        // What a dry run lists of a bayes sweep: its random startup trials.
        Some(p) if opts.dry_run => p.startup_trials()?,
        Some(_) => Vec::new(),
        None => mine
            .iter()
            .filter(|t| !done.contains(t.id.as_str()))
            .cloned()
            .collect(),
    };
    let split = opts.split.unwrap_or(job.file.split);
    let work = match job.file.command {
        Some(_) => Work::Commands,
        None => Work::BuiltinTrials,
    };
    check_use(split, work)?;
    let concurrency = opts.concurrency.unwrap_or(job.file.concurrency);
    // Refused before anything is opened or loaded (a GPU, the dataset), and in a dry run too.
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
    let shard_note = opts
        .shard
        .map(|s| format!(", shard {s}"))
        .unwrap_or_default();
    // What is there already, by state: a PRUNED trial is done, and said so apart.
    let held_latest = latest_rows(&previous);
    match &proposer {
        Some(p) => {
            let n = |state: &str| p.before.get(state).copied().unwrap_or(0);
            say(out, format!(
                "sweep {}: bayes, {} trials{shard_note}: {}, {} to propose; split {split}; metric {} ({:?})",
                job.name,
                p.planned,
                already(n("COMPLETE"), n(report::PRUNED), n("FAIL"), pruner.is_some()),
                p.left,
                job.file.metric.name,
                job.file.metric.goal
            ))?;
            if p.ignored > 0 {
                say(out, format!(
                    "note: {} rows of trials.csv are not this job's (another command, data, space, seed or epochs): they are kept, and ignored",
                    p.ignored
                ))?;
            }
        }
        None => {
            let ids: HashSet<&str> = mine.iter().map(|t| t.id.as_str()).collect();
            let held: Vec<&TrialRow> = held_latest
                .iter()
                .filter(|r| ids.contains(r.trial_id.as_str()))
                .collect();
            let count_of = |state: &str| held.iter().filter(|r| r.state == state).count();
            say(out, format!(
                "sweep {}: {} trials in the space{shard_note}: {} here, {}, {} to run; split {split}; metric {} ({:?})",
                job.name,
                all.len(),
                mine.len(),
                already(
                    count_of("COMPLETE"),
                    count_of(report::PRUNED),
                    0,
                    pruner.is_some()
                ),
                todo.len(),
                job.file.metric.name,
                job.file.metric.goal
            ))?;
        }
    }
    if opts.dry_run {
        if let Some(p) = &pruner {
            say(out, p.describe())?;
        }
        if let Some(p) = &proposer {
            say(out, bayes::plan_line(p))?;
        }
        dry_run(job, &todo, split, concurrency, &dir, out)?;
        if opts.shard.is_none() {
            // Every trial of the job, done or not: the array's shape is the whole sweep's.
            let count = proposer.as_ref().map_or(mine.len(), |p| p.planned as usize);
            say(out, slurm_line(job, concurrency, count))?;
        }
        return Ok(dir);
    }
    let resolved = run::backend(job)?;
    check_here(split, work, &resolved)?;
    // The command line and device next to the results, as every command writes them (a resume
    // records its own).
    if let Some(folder) = &lock {
        folder.record_command(&run::command_line(), &resolved.device)?;
    }
    let mut writer = match resumed {
        Some(w) => w,
        None => {
            let mut w = report::ReportWriter::create(&dir)?;
            w.interrupted_by(&report::Interrupt::OnAbort(cancel.clone()));
            w
        }
    };
    let mut rows = previous.clone();
    let mut stopped = None;
    let mut to_run = proposer.as_ref().map_or(todo.len(), |p| p.left as usize);
    // Only this job's own rows can have reached its target (not another job's in the folder).
    let own: HashSet<&str> = match &proposer {
        Some(p) => p.ids.iter().map(String::as_str).collect(),
        None => mine.iter().map(|t| t.id.as_str()).collect(),
    };
    let held_refs: Vec<&TrialRow> = held_latest
        .iter()
        .filter(|r| own.contains(r.trial_id.as_str()))
        .collect();
    if to_run > 0 {
        if let Some(r) = target_reached(job, &held_refs) {
            say(
                out,
                format!(
                    "trial {} already reached metric.target: no trial is started",
                    r.trial_id
                ),
            )?;
            to_run = 0;
        }
    }
    if to_run > 0 {
        let mut ctx = context(job, opts, &resolved, &cancel, &dir)?;
        let n = match concurrency {
            Concurrency::Fixed(n) => Some(n),
            // Under fused the probe times fused rounds: the N it picks is the number of
            // trials that train at once, in groups over the fused slices.
            Concurrency::Auto(_) => {
                match concurrency_probe::choose(job, &todo, &ctx, &resolved, split, out) {
                    Ok(n) => Some(n),
                    // A signal during the probe: no trial ran; the end below says so (exit 3).
                    Err(Error::Interrupted(why)) => {
                        tracing::warn!("{why}");
                        None
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        if let Some(n) = n {
            let n = n.min(to_run as u32).max(1);
            let round = Round {
                index: 0,
                n,
                split,
                slices: plan::slices(job, n, split, &resolved.budgets)?,
                trials: todo.clone(),
            };
            ctx.metric = Some(job.file.metric.name.clone());
            ctx.prune = pruner.clone().map(|p| {
                sched::Pruning(Arc::new(
                    move |t: &TrialSpec, s: &crate::train::EpochStats| !p.goes_on(&t.id, s),
                ))
            });
            if let Some(ext) = ctx.external.as_mut() {
                // One trial at a time, its lines cannot be mixed with another's: they show.
                ext.stream = opts.verbose || n == 1;
            }
            let (ran, stop) = match proposer.as_mut() {
                None => execute(job, &round, &ctx, &mut writer, opts.progress, None)?,
                Some(p) => {
                    let mut feed = |ended: Option<&sched::TrialOutcome>| p.next(ended);
                    execute(
                        job,
                        &round,
                        &ctx,
                        &mut writer,
                        opts.progress,
                        Some((to_run, &mut feed)),
                    )?
                }
            };
            rows.extend(ran);
            stopped = stop;
            if let Some(e) = proposer.as_mut().and_then(|p| p.error.take()) {
                return Err(e.into());
            }
        }
    }
    let (ids, planned) = match &proposer {
        Some(p) => (p.ids.clone(), p.planned as usize),
        None => (mine.iter().map(|t| t.id.clone()).collect(), mine.len()),
    };
    finish(
        job,
        &dir,
        &ids,
        planned,
        &rows,
        &cancel,
        stopped.as_ref(),
        out,
    )?;
    Ok(dir)
}

/// What a sweep's start says it holds already: its COMPLETE trials, its PRUNED ones (when
/// there are any, or early termination is on), and its FAIL ones (when there are any).
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

/// The context every worker of the sweep shares.
fn context(
    job: &Job,
    opts: &SweepOptions,
    r: &Resolved,
    cancel: &Cancel,
    dir: &Path,
) -> Result<RoundContext> {
    match (&job.file.model, &job.file.command) {
        (Some(_), _) => {
            let data = run::load_data(job, opts.data_dir.as_deref())?;
            builtin_context(
                job,
                &data,
                r,
                opts.data_dir.as_deref(),
                &opts.worker_exe,
                cancel,
            )
        }
        (None, Some(template)) => Ok(external_context(job, template, opts, r, cancel, dir)),
        (None, None) => Err(job
            .invalid("model", "is missing: give model (with data), or command")
            .into()),
    }
}

/// An external command's trials: no dataset or model of ours; the command gets the device by
/// UUID (CUDA_VISIBLE_DEVICES), its cap, and an NVML watchdog on a GPU.
fn external_context(
    job: &Job,
    template: &str,
    opts: &SweepOptions,
    r: &Resolved,
    cancel: &Cancel,
    out: &Path,
) -> RoundContext {
    let env_of = |engine: Option<&Arc<CudaEngine>>| {
        let info = engine.map(|e| e.info());
        ExternalEnv {
            cuda_visible_devices: info.map(|i| i.uuid.clone()),
            device_mem_bytes: info.map(|i| i.total_mem_bytes),
            watch_uuid: info.map(|i| i.uuid.clone()),
            cwd: None,
            on_gpu: info.is_some(),
            ..ExternalEnv::default()
        }
    };
    let more = r.more.iter().map(|(d, e)| (*d, env_of(Some(e)))).collect();
    let envs = plan::PerDevice::with(env_of(r.engine.as_ref()), more);
    RoundContext {
        // Placeholders: an external trial never reads them.
        data: Arc::new(crate::data::Dataset {
            name: "external".into(),
            shape: [1, 1, 1],
            classes: 2,
            train: Default::default(),
            test: Default::default(),
        }),
        data_spec: crate::data::DataSpec::of(crate::data::Source::Synthetic),
        data_base: opts.data_dir.clone(),
        data_seed: job.file.seed,
        model: crate::job::ModelSpec::of(crate::job::ModelKind::Mlp),
        epochs: job.file.train.epochs,
        engine: job.file.engine.clone(),
        devices: Devices::one(Device::Cpu),
        worker_exe: opts.worker_exe.clone(),
        cancel: cancel.clone(),
        max_steps: None,
        warm_up: false,
        external: Some(ExternalTrials {
            template: template.to_string(),
            program: job.file.program.clone(),
            swept: swept_names(job),
            trials_dir: out.join("trials"),
            envs,
            // Set once the round's concurrency is known (see `run`).
            stream: false,
        }),
        metric: None,
        prune: None,
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
) -> Result<(Vec<TrialRow>, Option<Stopped>)> {
    // A fed round (bayes) runs the trials its run_cap has left.
    let total = feed.as_ref().map_or(round.trials.len(), |(n, _)| *n) as u64;
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
    let started = Instant::now();
    let (mut running, mut failed, mut finished) = (0u32, 0u32, 0u64);
    let mut rows = Vec::new();
    let mut same = SameFailures::default();
    let mut stopped = None;
    let recorder = std::cell::RefCell::new(Recorder {
        writer,
        unsynced: false,
        synced: Instant::now(),
        failed: None,
        lost: Default::default(),
    });
    let mut sink = |ev: &Event| {
        let mut rec = recorder.borrow_mut();
        let res = match ev {
            Event::Started { .. } => {
                running += 1;
                Ok(())
            }
            Event::Epoch { trial, stats, .. } => {
                same.ran(&trial.id);
                rec.progress(&progress_row(round, &trial.id, stats))
            }
            Event::Finished(o) => {
                running = running.saturating_sub(1);
                finished += 1;
                let row = rec.checked(trial_row(job, round.index, round.split, round.n, o));
                if !row.done() {
                    failed += 1;
                }
                if let Some(line) = counts_line(std::slice::from_ref(&row)) {
                    tracing::debug!("trial {}: {line}", row.trial_id);
                }
                let seen = if ctx.external.is_some() && !ctx.cancel.draining() {
                    same.see(o)
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
                let line = format!(
                    "trial {finished}/{total} {} {} {metric} in {:.1} s ({running} running, {failed} failed){error}",
                    row.trial_id,
                    row.state,
                    row.wall_s,
                );
                if progress {
                    bar.println(line);
                } else {
                    tracing::info!("{line}");
                }
                bar.inc(1);
                if let (Some(target), Some(m), true) = (
                    job.file.metric.target,
                    row.metric,
                    row.state == report::COMPLETE,
                ) {
                    if reaches(job.file.metric.goal, m, target) && !ctx.cancel.draining() {
                        let line = format!(
                            "trial {} reached metric.target ({} {m:.4}, target {target}): starting no more trials; the {running} running finish",
                            row.trial_id, job.file.metric.name
                        );
                        if progress {
                            bar.println(line);
                        } else {
                            tracing::info!("{line}");
                        }
                        ctx.cancel.drain();
                    }
                }
                if let Seen::Stop(s) = seen {
                    let line = format!(
                        "stopping the sweep: its first {} trials to end failed the same way; \
                         starting no more, ending the {running} running",
                        s.trials.len()
                    );
                    if progress {
                        bar.println(line);
                    } else {
                        tracing::warn!("{line}");
                    }
                    ctx.cancel.abort();
                    stopped = Some(s);
                }
                let res = rec.trial(&row);
                rows.push(row);
                res
            }
            Event::Output { trial_id, line } => {
                // Through the bar, so that it is not drawn over; on stderr, beside the log.
                bar.suspend(|| {
                    let _ = writeln!(std::io::stderr(), "[{trial_id}] {line}");
                });
                return;
            }
        };
        bar.set_message(format!("{running} running, {failed} failed"));
        rec.note(res, &ctx.cancel);
    };
    let mut idle = || {
        let mut rec = recorder.borrow_mut();
        let res = rec.sync();
        rec.note(res, &ctx.cancel);
    };
    match feed {
        Some((_, feed)) => sched::run_round_fed(round, ctx, &mut sink, &mut idle, feed),
        None => sched::run_round_with(round, ctx, &mut sink, &mut idle),
    };
    bar.finish_and_clear();
    let mut rec = recorder.into_inner();
    let res = rec.sync();
    rec.note(res, &ctx.cancel);
    if let Some(e) = rec.failed {
        return Err(e.into());
    }
    tracing::info!(
        "ran {} trials in {:.1} s with {} at a time",
        rows.len(),
        started.elapsed().as_secs_f64(),
        round.n
    );
    Ok((rows, stopped))
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
