//! The rows a round writes for each trial: its `trials.csv` and `progress.csv` rows, the rows a failed write kept from being whole, and the fsynced CSV writer that `parallel` and `batch-scan` write their own rows with.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, ReportError, Result};
use crate::job::{Job, SplitMode};
use crate::plan::{Round, MIB};
use crate::report::{ProgressRow, TrialRow};
use crate::sched::TrialOutcome;

use super::model_name;

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
    let r = o.result();
    let metric = |name: &str| r.and_then(|r| r.metrics.get(name).copied());
    TrialRow {
        round,
        n,
        slice: o.slice.index,
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
        launches_per_step: r.and_then(|r| r.launches_per_step),
        host_syncs: r.and_then(|r| r.host_syncs),
        // The trial's id, model, parameters and seed.
        ..lost_trial_row(job, split, &o.trial)
    }
}

/// The row a study keeps for a trial from its start, should its worker be lost before it ends:
/// `INTERRUPTED`, with the trial's parameters and seed (a trial that ends writes its own).
pub fn lost_trial_row(job: &Job, split: SplitMode, trial: &crate::plan::TrialSpec) -> TrialRow {
    let h = &trial.hyper;
    TrialRow {
        trial_id: trial.id.clone(),
        split: split.to_string(),
        model: model_name(job),
        params_lr: h.lr,
        params_batch_size: h.batch_size,
        params_optimizer: h.optimizer.to_string(),
        params_momentum: h.momentum,
        params_weight_decay: h.weight_decay,
        params_dropout: h.dropout,
        seed: trial.seed,
        state: "INTERRUPTED".into(),
        error: "its worker was lost before the trial ended".into(),
        params: serde_json::to_string(&trial.params).unwrap_or_default(),
        ..TrialRow::default()
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

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
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
