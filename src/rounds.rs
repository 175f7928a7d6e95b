//! What the runners share: the round context of a built-in model, the rows of results files they write, the split check of threaded runs, and their output lines.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::cancel::Cancel;
use crate::data::Dataset;
use crate::error::{Error, ReportError, Result};
use crate::job::{Job, SplitMode};
use crate::plan::{Round, MIB};
use crate::report::{self, ProgressRow, TrialRow};
use crate::run::Resolved;
use crate::sched::{RoundContext, TrialOutcome};

/// Writes one line of a command's output.
pub fn say(out: &mut dyn Write, line: impl std::fmt::Display) -> Result<()> {
    writeln!(out, "{line}").map_err(Error::io("stdout"))
}

/// A batch larger than the training split is a job error, found before anything starts.
pub fn check_batch(job: &Job, data: &Dataset, trials: &[u32]) -> Result<()> {
    for &i in trials {
        let h = job.hyper(i as usize)?;
        if h.batch_size as usize > data.train.len() {
            let key = if job.file.parameters.contains_key("batch_size") {
                "parameters.batch_size"
            } else {
                "train.batch_size"
            };
            return Err(job
                .invalid(
                    key,
                    format!(
                        "{} is larger than the {} training samples of {}",
                        h.batch_size,
                        data.train.len(),
                        data.name
                    ),
                )
                .into());
        }
    }
    Ok(())
}

pub fn print_paths(paths: &report::ReportPaths, out: &mut dyn Write) -> Result<()> {
    for p in [&paths.time_per_training, &paths.samples_per_s]
        .into_iter()
        .flatten()
        .chain([&paths.summary])
    {
        say(out, format!("wrote {}", p.display()))?;
    }
    if paths.time_per_training.is_none() {
        say(out, "no charts: no round completed a trial")?;
    }
    Ok(())
}

/// The model column of a job's rows: the built-in kind, or `external`.
pub fn model_name(job: &Job) -> String {
    job.file
        .model
        .as_ref()
        .map_or_else(|| "external".to_string(), |m| m.kind.to_string())
}

/// What the workers of a built-in model's rounds share: the dataset (on the device too, on a
/// GPU), how a child process finds it again, the model and the engine options.
pub fn builtin_context(
    job: &Job,
    data: &Arc<Dataset>,
    r: &Resolved,
    data_dir: Option<&Path>,
    worker_exe: &Path,
    cancel: &Cancel,
) -> Result<RoundContext> {
    Ok(RoundContext {
        data: Arc::clone(data),
        data_spec: job.data()?.clone(),
        data_base: data_dir.map(Path::to_path_buf),
        data_seed: job.file.seed,
        model: job.model()?.clone(),
        epochs: job.file.train.epochs,
        engine: job.file.engine.clone(),
        devices: r.device_for(data)?,
        worker_exe: worker_exe.to_path_buf(),
        cancel: cancel.clone(),
        max_steps: None,
        warm_up: false,
        external: None,
        metric: None,
        prune: None,
    })
}

/// The `progress.csv` row of one trial's epoch in a round.
pub fn progress_row(
    round: &Round,
    trial_id: &str,
    stats: &crate::train::EpochStats,
) -> ProgressRow {
    ProgressRow {
        round: round.index,
        trial_id: trial_id.to_string(),
        split: round.split.to_string(),
        n: round.n,
        epoch: stats.epoch,
        train_loss: stats.train_loss,
        train_acc: stats.train_acc,
        test_loss: stats.test_loss,
        test_acc: stats.test_acc,
        wall_s: stats.wall_s,
        extra: stats.extra.clone(),
    }
}

/// Why a trial's progress row could not be written.
#[derive(Clone, Debug, PartialEq)]
pub struct LostRow {
    pub why: String,
    /// A signal stopped the write (a rewrite of the file past its grace), not a failure.
    pub by_signal: bool,
}

impl From<&ReportError> for LostRow {
    fn from(e: &ReportError) -> Self {
        LostRow {
            why: e.to_string(),
            by_signal: e.is_interrupted(),
        }
    }
}

/// The trials with a progress row that could not be written, by id (the first reason each).
pub type LostRows = std::collections::HashMap<String, LostRow>;

/// A finished trial's row as it may be recorded, given the trials whose progress rows could
/// not all be written (`lost`, with why): such a trial is never COMPLETE or PRUNED (its epochs
/// would be missing, and `--resume` would not run it again), but a FAIL that says why, or
/// INTERRUPTED when a signal stopped the write.
pub fn unless_progress_lost(mut row: TrialRow, lost: &LostRows) -> TrialRow {
    if let (Some(lost), true) = (lost.get(&row.trial_id), row.done()) {
        row.state = if lost.by_signal {
            "INTERRUPTED"
        } else {
            "FAIL"
        }
        .into();
        row.error = format!("its progress rows could not all be written: {}", lost.why);
    }
    row
}

/// The `trials.csv` row of a trial that ended in round `round` (N trials under `split`).
pub fn trial_row(job: &Job, round: u32, split: SplitMode, n: u32, o: &TrialOutcome) -> TrialRow {
    let h = &o.trial.hyper;
    let r = o.result();
    let metric = |name: &str| r.and_then(|r| r.metrics.get(name).copied());
    TrialRow {
        trial_id: o.trial.id.clone(),
        round,
        split: split.to_string(),
        n,
        slice: o.slice.index,
        model: model_name(job),
        params_lr: h.lr,
        params_batch_size: h.batch_size,
        params_optimizer: h.optimizer.to_string(),
        params_momentum: h.momentum,
        params_weight_decay: h.weight_decay,
        params_dropout: h.dropout,
        seed: o.trial.seed,
        state: o.state().name().to_string(),
        test_acc: metric("test_acc"),
        final_loss: metric("final_loss"),
        epochs: r.map(|r| r.epochs).unwrap_or(0),
        wall_s: o.wall_s,
        samples_per_s: r.map(|r| r.samples_per_s).filter(|x| *x > 0.0),
        peak_mem_mib: r
            .map(|r| r.peak_mem_bytes as f64 / MIB)
            .filter(|x| *x > 0.0),
        mem_cap_mib: o.slice.cap_mib(),
        error: o.error().unwrap_or_default(),
        metric: r.and_then(|r| crate::train::metric_in(&r.metrics, &job.file.metric.name)),
        params: serde_json::to_string(&o.trial.params).unwrap_or_default(),
        launches_per_step: r.and_then(|r| r.launches_per_step),
        host_syncs: r.and_then(|r| r.host_syncs),
    }
}

/// What a round's trials asked of their backends, for `--verbose`: the range of their
/// `launches_per_step` and `host_syncs`; `None` when no trial of them was counted.
pub fn counts_line(rows: &[TrialRow]) -> Option<String> {
    let range = |pick: &dyn Fn(&TrialRow) -> Option<u64>| {
        let vals: Vec<u64> = rows.iter().filter_map(pick).collect();
        let (lo, hi) = (vals.iter().min()?, vals.iter().max()?);
        Some(if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}-{hi}")
        })
    };
    let launches = range(&|r| r.launches_per_step)?;
    let syncs = range(&|r| r.host_syncs).unwrap_or_else(|| "-".into());
    Some(format!(
        "{launches} backend calls per training step, {syncs} host waits inside the epochs \
         (the per-epoch metric read excluded)"
    ))
}

/// A CSV file written a row at a time, each row flushed and fsynced as it is written, so that a
/// signal or a crash loses none of the rows before it.
pub struct CsvFile {
    path: PathBuf,
    w: csv::Writer<std::fs::File>,
}

impl CsvFile {
    pub fn create(path: PathBuf) -> Result<CsvFile> {
        let w = csv::Writer::from_path(&path).map_err(|e| csv_error(&path, e))?;
        Ok(CsvFile { path, w })
    }

    pub fn row<T: Serialize>(&mut self, row: &T) -> Result<()> {
        self.w
            .serialize(row)
            .map_err(|e| csv_error(&self.path, e))?;
        let io = Error::io(self.path.display().to_string());
        self.w
            .flush()
            .map_err(Error::io(self.path.display().to_string()))?;
        self.w.get_ref().sync_data().map_err(io)
    }
}

fn csv_error(path: &Path, source: csv::Error) -> Error {
    Error::Report(crate::error::ReportError::Csv {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{BackendChoice, SplitMode};
    use crate::plan::{Round, SliceSpec};
    use crate::run::{load_data, resolve_backend};
    use crate::sched::{run_round, Device, Devices, TrialState};

    #[test]
    fn a_trial_runs_on_its_slices_device_and_fails_alone_where_there_is_none() {
        let job = Job::parse(
            "model: {kind: mlp, hidden: [16]}\ndata: {source: synthetic, train_samples: 512, test_samples: 128}\ntrain: {epochs: 1, batch_size: 64}\n",
            std::path::Path::new("j.yaml"),
        )
        .unwrap();
        let data = load_data(&job, None).unwrap();
        let found = crate::gpu::discover();
        let r = resolve_backend(BackendChoice::Cpu, &found, &job.file.engine).unwrap();
        let mut ctx = builtin_context(
            &job,
            &data,
            &r,
            None,
            std::path::Path::new("gpumux"),
            &Cancel::new(),
        )
        .unwrap();
        ctx.devices = Devices::with(Device::Cpu, vec![(1, Device::Cpu)]);
        let slice = |index, device| SliceSpec::at(index, device).capped(64 << 20);
        let round = Round {
            index: 0,
            n: 3,
            split: SplitMode::Logical,
            slices: vec![slice(0, 0), slice(1, 1), slice(2, 2)],
            trials: crate::plan::trials(&job, 8).unwrap(),
        };
        let out = run_round(&round, &ctx, &mut |_| {});
        assert_eq!(out.outcomes.len(), 8);
        for o in &out.outcomes {
            if o.slice.device == 2 {
                assert_eq!(o.state(), TrialState::Fail);
                let e = o.error().unwrap_or_default();
                assert!(e.contains("device 2 was not opened"), "{e}");
            } else {
                assert_eq!(o.state(), TrialState::Complete, "{:?}", o.error());
            }
        }
        // Slices on device 1 alone run every trial; on device 2 alone, none.
        let on = |device: u32| Round {
            slices: vec![slice(0, device), slice(1, device)],
            trials: crate::plan::trials(&job, 3).unwrap(),
            ..round.clone()
        };
        let out = run_round(&on(1), &ctx, &mut |_| {});
        assert!(out
            .outcomes
            .iter()
            .all(|o| o.state() == TrialState::Complete && o.slice.device == 1));
        let out = run_round(&on(2), &ctx, &mut |_| {});
        assert_eq!(out.outcomes.len(), 3);
        assert!(out.outcomes.iter().all(|o| o.state() == TrialState::Fail
            && o.error()
                .is_some_and(|e| e.contains("device 2 was not opened"))));
    }

    #[test]
    fn a_fused_round_runs_its_groups_and_a_panic_fails_its_whole_group() {
        use crate::sched::{group::queued, Event};
        let job = Job::parse(
            "model: {kind: mlp, hidden: [8]}\ndata: {source: synthetic, train_samples: 256, test_samples: 64}\ntrain: {epochs: 2, batch_size: 64}\nfaults: [{trial: 1, kind: panic}]\n",
            std::path::Path::new("j.yaml"),
        )
        .unwrap();
        let data = load_data(&job, None).unwrap();
        let found = crate::gpu::discover();
        let r = resolve_backend(BackendChoice::Cpu, &found, &job.file.engine).unwrap();
        let ctx = builtin_context(
            &job,
            &data,
            &r,
            None,
            std::path::Path::new("gpumux"),
            &Cancel::new(),
        )
        .unwrap();
        // Four trials on two slices: groups [t0, t1] and [t2, t3].
        let round = Round {
            index: 0,
            n: 4,
            split: SplitMode::Fused,
            slices: vec![
                SliceSpec::at(0, 0).capped(64 << 20),
                SliceSpec::at(1, 0).capped(64 << 20),
            ],
            trials: crate::plan::trials(&job, 4).unwrap(),
        };
        let ids: Vec<Vec<u32>> = queued(&round, &ctx)
            .iter()
            .map(|g| g.iter().map(|t| t.index).collect())
            .collect();
        assert_eq!(ids, vec![vec![0, 1], vec![2, 3]]);
        let (mut started, mut epochs, mut finished) = (0, 0, 0);
        let out = run_round(&round, &ctx, &mut |e| match e {
            Event::Started { .. } => started += 1,
            Event::Epoch { .. } => epochs += 1,
            Event::Finished(_) => finished += 1,
            Event::Output { .. } => {}
        });
        assert_eq!((started, finished), (4, 4));
        assert!(epochs >= 4, "t2 and t3 report both their epochs: {epochs}");
        let o = &out.outcomes;
        assert_eq!(o.len(), 4);
        for failed in &o[..2] {
            assert_eq!(failed.state(), TrialState::Fail);
            assert!(
                failed.error().is_some_and(|e| e.contains("panic")),
                "{:?}",
                failed.error()
            );
        }
        for done in &o[2..] {
            assert_eq!(done.state(), TrialState::Complete, "{:?}", done.error());
            assert_eq!(done.result().map(|r| r.epochs), Some(2));
        }
        assert_eq!(o[2].wall_s, o[3].wall_s, "a group's members share its time");
    }
}
