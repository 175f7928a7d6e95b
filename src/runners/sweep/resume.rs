//! What a sweep's output folder holds when it starts: its trials and runs read whole, `progress.csv` read row by row (rung values restored, the rows a resume keeps found), and the rows of trials run again dropped.

use std::path::Path;

use super::hyperband;
use super::one_per_epoch::{KeyColumns, OnePerEpoch};
use super::SweepOptions;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::report::{self, ProgressRow, TrialRow};

/// What a sweep found in its output folder as it took it.
pub(super) struct Taken {
    /// The trials' rows a resume goes on from (none without `--resume`).
    pub(super) previous: Vec<TrialRow>,
    /// The results files open for appending, after a resume dropped the rows of trials run again.
    pub(super) resumed: Option<report::ReportWriter>,
}

impl Taken {
    /// Reads the sweep's folder `dir` (a writing run holds its lock from before this to its
    /// end: see [`crate::run::Opened::held_folder`]): every results file read through (`progress.csv` row by
    /// row): one that cannot be read is refused (exit 2) and left as it is, with or without
    /// `--resume`, and a cut last line is dropped. Results there without `--resume` are refused;
    /// with it, the rung values of the trials done are restored into `pruner`, and
    /// `progress.csv` keeps the rows of the trials done only.
    pub(super) fn take(
        dir: &Path,
        opts: &SweepOptions,
        cancel: &Cancel,
        pruner: Option<&hyperband::Pruner>,
    ) -> Result<Taken> {
        let reading = report::Interrupt::OnDrain(cancel.clone());
        let held = Held::read(dir)?;
        check_trials_dir(dir)?;
        let had_rows = held.has_rows();
        let previous = if opts.resume { held.trials } else { Vec::new() };
        let restoring = pruner.filter(|_| opts.resume);
        let scan = scan_progress(dir, &previous, restoring, &reading)?;
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
            keep_complete_progress(dir, &scan.epochs, &reading)?;
            // Drops a cut last line, so that the next row starts on a line of its own.
            let mut writer = report::ReportWriter::append(dir)?;
            writer.interrupted_by(&report::Interrupt::OnAbort(cancel.clone()));
            Some(writer)
        } else {
            None
        };
        drop(scan);
        Ok(Taken { previous, resumed })
    }
}

/// The trials' own folders go under `trials/`: never through a link planted there, nor
/// through a link planted in the place of a trial's folder.
fn check_trials_dir(dir: &Path) -> Result<()> {
    let trials_dir = dir.join("trials");
    if std::fs::symlink_metadata(&trials_dir).is_ok_and(|m| !m.is_dir()) {
        return Err(Error::Usage(format!(
            "{} is a link or a file, not a folder: the trials' folders are made inside the output folder only; move it away",
            trials_dir.display()
        )));
    }
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
    Ok(())
}

/// What an output folder already holds, read with the one reader of results files: its trials
/// and runs (its progress rows are read one at a time by [`scan_progress`]).
pub(super) struct Held {
    pub(super) trials: Vec<TrialRow>,
    pub(super) runs: usize,
}

impl Held {
    pub(super) fn read(dir: &Path) -> Result<Held> {
        // A link, FIFO or folder in a results file's place is refused before anything is read.
        for name in [report::TRIALS_CSV, report::PROGRESS_CSV, report::RUNS_CSV] {
            report::check_regular(&dir.join(name))?;
        }
        let present = |name: &str| dir.join(name).exists();
        Ok(Held {
            trials: if present(report::TRIALS_CSV) {
                report::read_trials(dir)?
            } else {
                Vec::new()
            },
            runs: if present(report::RUNS_CSV) {
                report::read_runs(dir)?.len()
            } else {
                0
            },
        })
    }

    pub(super) fn has_rows(&self) -> bool {
        !self.trials.is_empty() || self.runs > 0
    }
}

/// What one pass over `progress.csv` found.
pub(super) struct ProgressScan<'a> {
    pub(super) rows: u64,
    /// Rung values restored for early termination.
    pub(super) restored: usize,
    /// The rows a resume keeps (see [`keep_complete_progress`]).
    pub(super) epochs: OnePerEpoch<'a>,
}

/// Reads `progress.csv` in `dir` through, row by row (a damaged file is refused, and nothing
/// is held but a key per epoch of the trials done): counts its rows, restores the rungs of
/// `pruner` from the trials done of `trials`, and finds the rows a resume keeps.
pub(super) fn scan_progress<'a>(
    dir: &Path,
    trials: &'a [TrialRow],
    pruner: Option<&hyperband::Pruner>,
    interrupt: &report::Interrupt,
) -> Result<ProgressScan<'a>> {
    let done = hyperband::done_ids(trials);
    let mut scan = ProgressScan {
        rows: 0,
        restored: 0,
        epochs: OnePerEpoch::new(done.iter().map(|id| (*id, 0))),
    };
    let path = dir.join(report::PROGRESS_CSV);
    if !path.exists() {
        return Ok(scan);
    }
    let mut reader = report::RowReader::<ProgressRow>::open(&path)?.interrupted_by(interrupt);
    let key = KeyColumns::of(&reader)?;
    while let Some(mut cells) = reader.next_cells()? {
        let (id, epoch) = key.key(&cells)?;
        scan.epochs.see(scan.rows, 0, (id, epoch));
        let wanted = |p: &&hyperband::Pruner| {
            std::str::from_utf8(id).is_ok_and(|id| p.wants(&done, id, epoch))
        };
        if let Some(p) = pruner.filter(wanted) {
            if p.restore_row(&done, &cells.row()?) {
                scan.restored += 1;
            }
        }
        scan.rows += 1;
    }
    Ok(scan)
}

/// At the start of a resumed sweep, `progress.csv` keeps the rows of done trials only (COMPLETE
/// or PRUNED), one per (trial, epoch) (the last written, where it was written): the trials run
/// again write theirs anew, so that the file never holds one epoch twice. When rows go, the
/// file is replaced whole (temporary file and rename), copied row by row.
pub(super) fn keep_complete_progress(
    dir: &Path,
    epochs: &OnePerEpoch,
    interrupt: &report::Interrupt,
) -> Result<()> {
    let dropped = epochs.dropped();
    if dropped == 0 {
        return Ok(());
    }
    let path = dir.join(report::PROGRESS_CSV);
    tracing::info!(
        "{}: dropping {dropped} rows of trials that did not complete (or of an epoch written twice)",
        path.display(),
    );
    let mut reader = report::RowReader::<ProgressRow>::open(&path)?.interrupted_by(interrupt);
    let columns = reader.extra_columns();
    let (key, plan) = (KeyColumns::of(&reader)?, reader.plan(&columns));
    let mut at = 0u64;
    report::write_lines_from::<ProgressRow>(&path, &columns, interrupt, |out| {
        report::copy_rows(&mut reader, &plan, out, |cells| {
            at += 1;
            Ok(epochs.keeps(at - 1, 0, key.key(cells)?))
        })
        .map(|_| ())
    })?;
    Ok(())
}
