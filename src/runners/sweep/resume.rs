//! What a sweep's output folder holds when it starts: its trials and runs read whole, `progress.csv` read row by row (rung values restored, the rows a resume keeps found), and the rows of trials run again dropped.

use std::path::Path;

use super::hyperband;
use super::one_per_epoch::{KeyColumns, OnePerEpoch};
use crate::error::Result;
use crate::report::{self, ProgressRow, TrialRow};

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
        if let Some(p) = pruner.filter(|p| p.wants(&done, id, epoch)) {
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
        report::copy_rows(&mut reader, &plan, out, |cells, _| {
            at += 1;
            Ok(epochs.keeps(at - 1, 0, key.key(cells)?))
        })
        .map(|_| ())
    })?;
    Ok(())
}
