//! The sweep's results files while its round runs: trial rows fsynced one by one, progress rows in groups, and no trial COMPLETE whose progress rows were not all written.

use std::time::{Duration, Instant};

use crate::cancel::Cancel;
use crate::error::ReportError;
use crate::report::{self, ProgressRow, TrialRow};
use crate::rounds::unless_progress_lost;

/// How long progress rows written in a burst may wait for their fsync while more keep coming.
pub const PROGRESS_SYNC: Duration = Duration::from_millis(100);

/// The sweep's results files while its round runs: each trial row appended and fsynced on its
/// own; progress rows appended as they come and fsynced in groups (when no more are waiting,
/// at least every [`PROGRESS_SYNC`] while they keep coming, and always before a trial row), so
/// that a trial printing epochs faster than a disk syncs them is not slowed to the disk's pace.
pub(super) struct Recorder<'a> {
    pub(super) writer: &'a mut report::ReportWriter,
    /// Whether progress rows were written since the last fsync.
    pub(super) unsynced: bool,
    pub(super) synced: Instant,
    /// The first row that could not be recorded.
    pub(super) failed: Option<ReportError>,
    /// The trials with a progress row that could not be written, and why: such a trial is
    /// never recorded COMPLETE (its epochs would be missing, and `--resume` would not run it).
    pub(super) lost: crate::rounds::LostRows,
}

impl Recorder<'_> {
    pub(super) fn progress(&mut self, row: &ProgressRow) -> std::result::Result<(), ReportError> {
        let res = self.writer.progress_unsynced(row).and_then(|()| {
            self.unsynced = true;
            if self.synced.elapsed() >= PROGRESS_SYNC {
                self.sync()?;
            }
            Ok(())
        });
        if let Err(e) = &res {
            self.lost
                .entry(row.trial_id.clone())
                .or_insert_with(|| e.into());
        }
        res
    }

    /// A finished trial's row as it may be recorded ([`unless_progress_lost`]).
    pub(super) fn checked(&self, row: TrialRow) -> TrialRow {
        unless_progress_lost(row, &self.lost)
    }

    /// Fsyncs the progress rows written since the last time.
    pub(super) fn sync(&mut self) -> std::result::Result<(), ReportError> {
        if self.unsynced {
            self.writer.sync_progress()?;
            self.unsynced = false;
            self.synced = Instant::now();
        }
        Ok(())
    }

    /// A trial's row, after its progress rows are on disk.
    pub(super) fn trial(&mut self, row: &TrialRow) -> std::result::Result<(), ReportError> {
        self.sync()?;
        self.writer.trial(row)
    }

    /// Keeps the first failure to record a row: a row that cannot be recorded (a full disk)
    /// stops the sweep rather than run trials whose results would be lost; the rows written
    /// so far stay whole.
    pub(super) fn note(&mut self, res: std::result::Result<(), ReportError>, cancel: &Cancel) {
        if let Err(e) = res {
            if self.failed.is_none() && e.is_interrupted() {
                tracing::warn!("{e}");
            } else if self.failed.is_none() {
                tracing::error!("{e}: stopping the sweep");
                cancel.abort();
            }
            self.failed.get_or_insert(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, state: &str, metric: Option<f64>) -> TrialRow {
        TrialRow {
            trial_id: id.into(),
            state: state.into(),
            metric,
            ..Default::default()
        }
    }

    #[test]
    fn a_trial_with_a_lost_progress_row_is_recorded_fail_not_complete() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = report::ReportWriter::create(dir.path()).unwrap();
        let mut rec = Recorder {
            writer: &mut writer,
            unsynced: false,
            synced: Instant::now(),
            failed: None,
            lost: Default::default(),
        };
        let full = |by_signal| crate::rounds::LostRow {
            why: "disk full".into(),
            by_signal,
        };
        rec.lost.insert("a".into(), full(false));
        let done = rec.checked(row("a", "COMPLETE", Some(0.5)));
        assert_eq!(
            (done.state.as_str(), done.error.as_str()),
            (
                "FAIL",
                "its progress rows could not all be written: disk full"
            )
        );
        assert_eq!(rec.checked(row("a", "PRUNED", Some(0.5))).state, "FAIL");
        // A trial that failed anyway keeps its own reason; other trials are untouched.
        assert_eq!(
            rec.checked(row("a", "INTERRUPTED", None)).state,
            "INTERRUPTED"
        );
        assert_eq!(
            rec.checked(row("b", "COMPLETE", Some(0.5))).state,
            "COMPLETE"
        );
        // A write a signal stopped: the trial is INTERRUPTED, and --resume runs it again.
        rec.lost.insert("b".into(), full(true));
        assert_eq!(
            rec.checked(row("b", "COMPLETE", Some(0.5))).state,
            "INTERRUPTED"
        );
    }
}
