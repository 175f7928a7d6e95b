//! Results folders: each one opened and its files read, several merged into one, and a folder's charts and summary drawn.

use std::collections::HashSet;
use std::fmt::Debug;
use std::fs;
use std::path::{Path, PathBuf};

use super::line::{check_regular, Interrupt, PROGRESS_CSV, RUNS_CSV, TRIALS_CSV};
use super::plot::{
    plot_samples_per_s, plot_time_per_training, samples_per_s_plottable,
    time_per_training_plottable,
};
use super::read::{
    check_rows, existing_extra, read_rows_and_lines, read_runs, read_trial_briefs, read_trials,
    RowReader,
};
use super::summary::summary_text;
use super::write::{write_all, write_lines_from, write_rows, LineOut};
use super::{ProgressRow, RunRow, TrialBrief, TrialRow};
use crate::error::ReportError;
use crate::hash::{digest_bytes, DigestSet};
use crate::outdir::replace_bytes;

/// The chart of time per training against N.
pub const TIME_PER_TRAINING_SVG: &str = "time_per_training.svg";
/// The chart of aggregate samples/s against N.
pub const SAMPLES_PER_S_SVG: &str = "samples_per_s.svg";
/// The text summary: rounds table, fastest N per split, best trial, parity.
pub const SUMMARY_TXT: &str = "summary.txt";

/// The files [`write_report`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportPaths {
    /// `None` when no round completed a trial: there is no point to draw.
    pub time_per_training: Option<PathBuf>,
    pub samples_per_s: Option<PathBuf>,
    pub summary: PathBuf,
}

/// Keeps the first of rows that are equal field for field (NaN included), by their
/// [`digest`](crate::hash::digest).
fn dedup<T: Debug>(rows: Vec<T>) -> Vec<T> {
    let mut seen = HashSet::new();
    rows.into_iter()
        .filter(|row| seen.insert(crate::hash::digest(row)))
        .collect()
}

/// One folder of results files, checked before any is read: `trials.csv` must be there;
/// `runs.csv` and `progress.csv` may be missing (no rows). A missing folder, a folder without
/// `trials.csv`, and a link, FIFO or folder in a results file's place are bad input (exit 2).
#[derive(Clone, Debug)]
pub struct ResultsDir {
    dir: PathBuf,
    runs: bool,
    progress: bool,
}

impl ResultsDir {
    pub fn open(dir: &Path) -> Result<Self, ReportError> {
        let meta = fs::metadata(dir).map_err(|source| ReportError::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(ReportError::Invalid(format!(
                "{}: not a folder: give a folder of gpumux results",
                dir.display()
            )));
        }
        for name in [RUNS_CSV, TRIALS_CSV, PROGRESS_CSV] {
            check_regular(&dir.join(name))?;
        }
        let has = |name: &str| dir.join(name).exists();
        if !has(TRIALS_CSV) {
            return Err(ReportError::Invalid(format!(
                "{}: no {TRIALS_CSV} in this folder: not a folder of gpumux results",
                dir.display()
            )));
        }
        Ok(ResultsDir {
            dir: dir.to_path_buf(),
            runs: has(RUNS_CSV),
            progress: has(PROGRESS_CSV),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The rows of `runs.csv` (one per round: few).
    pub fn runs(&self) -> Result<Vec<RunRow>, ReportError> {
        if self.runs {
            read_runs(&self.dir)
        } else {
            Ok(Vec::new())
        }
    }

    /// The rows of `trials.csv` (one per trial).
    pub fn trials(&self) -> Result<Vec<TrialRow>, ReportError> {
        read_trials(&self.dir)
    }

    /// The rows of `trials.csv` as a merge keeps them ([`read_trial_briefs`]).
    pub fn trial_briefs(&self) -> Result<Vec<TrialBrief>, ReportError> {
        read_trial_briefs(&self.dir.join(TRIALS_CSV))
    }

    /// The rows of `trials.csv`, each with its line ([`read_rows_and_lines`]).
    pub fn trials_and_lines(&self) -> Result<Vec<(TrialRow, Vec<u8>)>, ReportError> {
        read_rows_and_lines(&self.dir.join(TRIALS_CSV))
    }

    /// The rows of `progress.csv`, one at a time (none when there is no such file).
    pub fn progress(
        &self,
        interrupt: &Interrupt,
    ) -> Result<Option<RowReader<ProgressRow>>, ReportError> {
        if !self.progress {
            return Ok(None);
        }
        Ok(Some(
            RowReader::open(&self.dir.join(PROGRESS_CSV))?.interrupted_by(interrupt),
        ))
    }

    /// The size of `progress.csv` in bytes (0 when there is none).
    pub fn progress_bytes(&self) -> u64 {
        let path = self.dir.join(PROGRESS_CSV);
        fs::symlink_metadata(path).map_or(0, |m| m.len())
    }

    /// The extra columns of `progress.csv`'s header (see [`super::extra`]).
    pub fn progress_columns(&self) -> Vec<String> {
        if !self.progress {
            return Vec::new();
        }
        existing_extra(
            &self.dir.join(PROGRESS_CSV),
            &super::line::columns_of::<ProgressRow>().unwrap_or_default(),
        )
    }

    /// Reads `progress.csv` through, keeping nothing: whether it reads whole.
    pub fn check_progress(&self, interrupt: &Interrupt) -> Result<(), ReportError> {
        if self.progress {
            check_rows::<ProgressRow>(&self.dir.join(PROGRESS_CSV), interrupt)?;
        }
        Ok(())
    }
}

/// The extra columns of several `progress.csv` files as one header: each file's in its order,
/// the columns of the first first, at most [`super::extra::MAX_EXTRA`] (the values of any
/// past it are dropped, and said).
pub fn union_of_columns(dirs: &[ResultsDir]) -> Vec<String> {
    let mut columns: Vec<String> = Vec::new();
    for d in dirs {
        for c in d.progress_columns() {
            if columns.contains(&c) {
                continue;
            }
            if columns.len() >= super::extra::MAX_EXTRA {
                tracing::warn!(
                    "{}: the column `{c}` is not kept: the merged file has {} extra columns already",
                    d.dir.join(PROGRESS_CSV).display(),
                    super::extra::MAX_EXTRA
                );
                continue;
            }
            columns.push(c);
        }
    }
    columns
}

/// Merges the report files of every directory into `out`, in order, without the rows a
/// directory before holds exactly (a directory given twice, or rows copied between
/// directories; a progress row repeated within one directory is kept, as `report DIR` keeps
/// it): the rows of
/// `runs.csv` and `trials.csv` are held (those of `trials.csv` with their lines, copied as
/// written), those of `progress.csv` copied one at a time (the digests of those seen are held). Each file is replaced whole; a damaged input, or a stop by
/// `interrupt`, leaves `out` as it was. Returns the runs and trials merged.
pub fn merge_files(
    dirs: &[PathBuf],
    out: &Path,
    interrupt: &Interrupt,
) -> Result<(Vec<RunRow>, Vec<TrialRow>), ReportError> {
    if dirs.is_empty() {
        return Err(ReportError::Invalid("no directories to merge".into()));
    }
    let folders: Vec<ResultsDir> = dirs
        .iter()
        .map(|d| ResultsDir::open(d))
        .collect::<Result<_, _>>()?;
    let (mut runs, mut trials) = (Vec::new(), Vec::new());
    for d in &folders {
        runs.extend(d.runs()?);
        trials.extend(d.trials_and_lines()?);
    }
    let runs = dedup(runs);
    // A trial's row is dropped when its line, as written, was met already.
    let mut seen = HashSet::new();
    trials.retain(|(_, line)| seen.insert(digest_bytes(line)));
    fs::create_dir_all(out).map_err(|source| ReportError::Write {
        path: out.to_path_buf(),
        source,
    })?;
    let columns = union_of_columns(&folders);
    // A row is dropped when a folder before holds its line, as written: the digests of each
    // folder's lines are held for the folders after it (about one row per 128 bytes, so that
    // the set grows once or twice rather than twenty times). One folder needs none.
    let last = folders.len() - 1;
    let bytes: u64 = folders[..last].iter().map(ResultsDir::progress_bytes).sum();
    let mut earlier = DigestSet::with_capacity((bytes / 128).min(1 << 24) as usize);
    write_lines_from::<ProgressRow>(&out.join(PROGRESS_CSV), &columns, interrupt, |out| {
        let mut batch = Batch::default();
        let mut this_folder = Vec::new();
        for (k, d) in folders.iter().enumerate() {
            let Some(mut reader) = d.progress(interrupt)? else {
                continue;
            };
            let (look, keep) = (k > 0, k < last);
            let plan = reader.plan(&columns);
            while let Some(mut cells) = reader.next_cells()? {
                let start = batch.lines.len();
                cells.line_into(&plan, &mut batch.lines)?;
                batch.push(start, look || keep);
                if batch.starts.len() == BATCH {
                    batch.flush(
                        look.then_some(&earlier),
                        keep.then_some(&mut this_folder),
                        out,
                    )?;
                }
            }
            batch.flush(
                look.then_some(&earlier),
                keep.then_some(&mut this_folder),
                out,
            )?;
            for d in this_folder.drain(..) {
                earlier.insert(d);
            }
        }
        Ok(())
    })?;
    write_rows(&out.join(RUNS_CSV), &runs)?;
    write_lines_from::<TrialRow>(&out.join(TRIALS_CSV), &[], interrupt, |out| {
        trials.iter().try_for_each(|(_, line)| out.write(line))
    })?;
    Ok((runs, trials.into_iter().map(|(row, _)| row).collect()))
}

/// How many lines a merge compares with those of the folders before in one go.
const BATCH: usize = 16;

/// Lines of a merge waiting to be compared with those of the folders before.
#[derive(Default)]
struct Batch {
    lines: Vec<u8>,
    /// Where each line starts in `lines`.
    starts: Vec<usize>,
    /// Each line's digest, when lines are compared or remembered.
    digests: Vec<u128>,
    held: Vec<bool>,
}

impl Batch {
    /// Takes the line that starts at `start` in `lines`, with its digest when `digest`.
    fn push(&mut self, start: usize, digest: bool) {
        self.starts.push(start);
        if digest {
            self.digests.push(digest_bytes(&self.lines[start..]));
        }
    }

    /// Writes the lines that `earlier` does not hold (all of them without it), adds their
    /// digests to `remembered` when given, and starts again with none.
    fn flush(
        &mut self,
        earlier: Option<&DigestSet>,
        remembered: Option<&mut Vec<u128>>,
        out: &mut LineOut,
    ) -> Result<(), ReportError> {
        self.held.clear();
        if let Some(set) = earlier {
            set.contains_batch(&self.digests, &mut self.held);
        }
        let ends = self
            .starts
            .iter()
            .skip(1)
            .copied()
            .chain([self.lines.len()]);
        for (k, (&start, end)) in self.starts.iter().zip(ends).enumerate() {
            if !self.held.get(k).copied().unwrap_or(false) {
                out.write(&self.lines[start..end])?;
            }
        }
        if let Some(kept) = remembered {
            kept.extend_from_slice(&self.digests);
        }
        self.lines.clear();
        self.starts.clear();
        self.digests.clear();
        Ok(())
    }
}

/// Replaces the results files in `out` (created if needed) with these rows, each file whole.
pub fn write_merged(
    out: &Path,
    runs: &[RunRow],
    trials: &[TrialRow],
    progress: &[ProgressRow],
) -> Result<(), ReportError> {
    write_all(out, runs, trials, progress)
}

/// A chart title naming the model and dataset when all rounds share them.
fn chart_title(what: &str, runs: &[RunRow]) -> String {
    let first = runs.first().map(|r| (&r.model, &r.dataset));
    match first {
        Some((m, d)) if runs.iter().all(|r| (&r.model, &r.dataset) == (m, d)) => {
            format!("{what} against N: {m} on {d}")
        }
        _ => format!("{what} against N"),
    }
}

/// (Re)draws the two charts and the text summary of `runs` and `trials` into `dir`.
pub fn write_report(
    dir: &Path,
    runs: &[RunRow],
    trials: &[TrialRow],
) -> Result<ReportPaths, ReportError> {
    fs::create_dir_all(dir).map_err(|source| ReportError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let time_per_training = chart(
        &dir.join(TIME_PER_TRAINING_SVG),
        time_per_training_plottable(runs),
        |path| plot_time_per_training(runs, path, &chart_title("Time per training", runs)),
    )?;
    let samples_per_s = chart(
        &dir.join(SAMPLES_PER_S_SVG),
        samples_per_s_plottable(runs),
        |path| plot_samples_per_s(runs, path, &chart_title("Training samples/s", runs)),
    )?;
    let paths = ReportPaths {
        time_per_training,
        samples_per_s,
        summary: dir.join(SUMMARY_TXT),
    };
    replace_bytes(&paths.summary, summary_text(runs, trials).as_bytes())?;
    Ok(paths)
}

/// Draws the chart at `path` when it has points, else removes an earlier one there.
fn chart(
    path: &Path,
    plottable: bool,
    draw: impl FnOnce(&Path) -> Result<(), ReportError>,
) -> Result<Option<PathBuf>, ReportError> {
    if plottable {
        draw(path)?;
        Ok(Some(path.to_path_buf()))
    } else {
        remove_stale(path)?;
        Ok(None)
    }
}

/// Removes a chart left by an earlier run in the same folder, which would no longer match its CSVs.
fn remove_stale(path: &Path) -> Result<(), ReportError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(ReportError::Write {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Merges `dirs` into `out` ([`merge_files`]), then draws the charts and summary.
pub fn merge_into(
    dirs: &[PathBuf],
    out: &Path,
    interrupt: &Interrupt,
) -> Result<ReportPaths, ReportError> {
    let (runs, trials) = merge_files(dirs, out, interrupt)?;
    write_report(out, &runs, &trials)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{run_row, trial_row};

    /// The rows of one or more output directories.
    type Rows = (Vec<RunRow>, Vec<TrialRow>, Vec<ProgressRow>);

    /// Reads one results folder whole.
    fn read_dir(dir: &Path) -> Result<Rows, ReportError> {
        let d = ResultsDir::open(dir)?;
        let progress = match d.progress(&Interrupt::Never)? {
            Some(rows) => rows.collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        Ok((d.runs()?, d.trials()?, progress))
    }

    fn write_dir(dir: &Path, runs: &[RunRow], trials: &[TrialRow]) {
        write_merged(dir, runs, trials, &[]).unwrap();
    }

    fn merged(dirs: &[PathBuf]) -> Result<Rows, ReportError> {
        let out = tempfile::tempdir().unwrap();
        merge_files(dirs, out.path(), &Interrupt::Never)?;
        read_dir(out.path())
    }

    #[test]
    fn a_row_a_folder_before_holds_is_dropped_and_one_repeated_within_a_folder_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = ["a", "b", "c"].iter().map(|d| tmp.path().join(d)).collect();
        let row = |id: &str, epoch: u32| ProgressRow {
            trial_id: id.into(),
            epoch,
            ..Default::default()
        };
        let trials = [trial_row("t0", "shared", None, None)];
        write_merged(&dirs[0], &[], &trials, &[row("t0", 1), row("t0", 1)]).unwrap();
        write_merged(
            &dirs[1],
            &[],
            &trials,
            &[row("t0", 1), row("t1", 1), row("t1", 1)],
        )
        .unwrap();
        write_merged(&dirs[2], &[], &trials, &[row("t1", 1), row("t2", 1)]).unwrap();
        let (_, trials, progress) = merged(&dirs).unwrap();
        assert_eq!(trials.len(), 1);
        let got: Vec<&str> = progress.iter().map(|p| p.trial_id.as_str()).collect();
        assert_eq!(got, ["t0", "t0", "t1", "t1", "t2"]);
        // One folder alone is copied whole.
        let (_, _, alone) = merged(&dirs[1..2]).unwrap();
        assert_eq!(alone.len(), 3);
    }

    #[test]
    fn two_dirs_merge_without_duplicate_rows() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        let shared = run_row("shared", 1, 8.0);
        write_dir(
            &a,
            &[shared.clone(), run_row("shared", 2, 5.0)],
            &[trial_row("t0", "shared", Some(0.5), None)],
        );
        write_dir(
            &b,
            &[shared, run_row("mps", 2, 3.0)],
            &[trial_row("t0", "mps", Some(0.5), None)],
        );
        fs::remove_file(b.join(PROGRESS_CSV)).unwrap();
        let (runs, trials, progress) = merged(&[a.clone(), b]).unwrap();
        let got: Vec<(&str, u32)> = runs.iter().map(|r| (r.split.as_str(), r.n)).collect();
        assert_eq!(got, vec![("shared", 1), ("shared", 2), ("mps", 2)]);
        assert_eq!(trials.len(), 2);
        assert!(progress.is_empty());
        let (again, _, _) = merged(&[a.clone(), a]).unwrap();
        assert_eq!(again.len(), 2);
    }

    #[test]
    fn progress_rows_are_copied_once_each_and_a_damaged_input_leaves_out_as_it_was() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b, out) = (
            tmp.path().join("a"),
            tmp.path().join("b"),
            tmp.path().join("out"),
        );
        let row = |id: &str, epoch: u32, acc: f64| ProgressRow {
            trial_id: id.into(),
            epoch,
            test_acc: acc,
            ..Default::default()
        };
        let (pa, pb) = (
            vec![row("t0", 1, 0.5), row("t0", 2, f64::NAN)],
            vec![row("t0", 2, f64::NAN), row("t1", 1, 0.7), row("t0", 1, 0.5)],
        );
        write_merged(&a, &[], &[trial_row("t0", "shared", None, None)], &pa).unwrap();
        write_merged(&b, &[], &[trial_row("t1", "shared", None, None)], &pb).unwrap();
        merge_files(&[a.clone(), b.clone()], &out, &Interrupt::Never).unwrap();
        let (_, trials, progress) = read_dir(&out).unwrap();
        assert_eq!(trials.len(), 2);
        let got: Vec<(&str, u32)> = progress
            .iter()
            .map(|p| (p.trial_id.as_str(), p.epoch))
            .collect();
        assert_eq!(got, vec![("t0", 1), ("t0", 2), ("t1", 1)]);
        // A damaged line in the second folder: out keeps what it had, and no file is left over.
        let before = fs::read(out.join(PROGRESS_CSV)).unwrap();
        let text = fs::read_to_string(b.join(PROGRESS_CSV)).unwrap();
        fs::write(b.join(PROGRESS_CSV), text.replacen(",0.7,", ",0.8,", 1)).unwrap();
        let err = merge_files(&[a, b], &out, &Interrupt::Never).unwrap_err();
        assert!(err.to_string().contains("line 3"), "{err}");
        assert_eq!(fs::read(out.join(PROGRESS_CSV)).unwrap(), before);
        assert_eq!(fs::read_dir(&out).unwrap().count(), 3);
    }

    #[test]
    fn an_interrupted_merge_stops_and_leaves_out_as_it_was() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, out) = (tmp.path().join("a"), tmp.path().join("out"));
        let rows: Vec<ProgressRow> = (0..3 * super::super::line::CHECK_EVERY as u32)
            .map(|e| ProgressRow {
                trial_id: "t0".into(),
                epoch: e + 1,
                ..Default::default()
            })
            .collect();
        write_merged(&a, &[], &[trial_row("t0", "shared", None, None)], &rows).unwrap();
        let cancel = crate::cancel::Cancel::new();
        cancel.abort();
        let err = merge_files(&[a], &out, &Interrupt::OnAbort(cancel)).unwrap_err();
        assert!(err.is_interrupted(), "{err}");
        assert!(!out.join(PROGRESS_CSV).exists());
        assert_eq!(fs::read_dir(&out).unwrap().count(), 0);
    }

    #[test]
    fn a_dir_without_report_files_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let empty = tmp.path().join("nothing-here");
        fs::create_dir(&empty).unwrap();
        let err = merged(&[empty]).unwrap_err().to_string();
        assert!(
            err.contains("nothing-here") && err.contains("no trials.csv"),
            "{err}"
        );
        assert!(merged(&[]).is_err());
    }

    #[test]
    fn a_dir_without_trials_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        write_dir(tmp.path(), &[run_row("shared", 1, 1.0)], &[]);
        fs::remove_file(tmp.path().join(TRIALS_CSV)).unwrap();
        let err = merged(&[tmp.path().to_path_buf()]).unwrap_err().to_string();
        assert!(err.contains(TRIALS_CSV), "{err}");
    }

    #[test]
    fn merge_into_writes_csvs_charts_and_summary() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, out) = (tmp.path().join("a"), tmp.path().join("out"));
        let runs = vec![
            run_row("shared", 1, 8.0),
            run_row("green", 1, 7.0),
            run_row("green", 2, 3.0),
        ];
        write_dir(
            &a,
            &runs,
            &[trial_row("t0", "green", Some(0.75), Some(0.5))],
        );
        let paths = merge_into(&[a], &out, &Interrupt::Never).unwrap();
        assert_eq!(read_runs(&out).unwrap(), runs);
        let svg = fs::read_to_string(paths.time_per_training.unwrap()).unwrap();
        assert!(svg.contains("Time per training against N: mlp on mnist-10k"));
        assert!(fs::metadata(paths.samples_per_s.unwrap()).unwrap().len() > 1000);
        let summary = fs::read_to_string(&paths.summary).unwrap();
        assert!(
            summary.contains("green: N = 2") && summary.contains("best trial t0"),
            "{summary}"
        );
    }
}
