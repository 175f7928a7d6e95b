//! Merging the report files of several output directories, and drawing a directory's charts and summary.

use std::collections::HashSet;
use std::fmt::Debug;
use std::fs;
use std::path::{Path, PathBuf};

use super::csv::{read_progress, read_runs, read_trials, write_all};
use super::csv::{PROGRESS_CSV, RUNS_CSV, TRIALS_CSV};
use super::plot::{
    plot_samples_per_s, plot_time_per_training, samples_per_s_plottable,
    time_per_training_plottable,
};
use super::summary::summary_text;
use super::{ProgressRow, RunRow, TrialRow};
use crate::error::ReportError;
use crate::outdir::replace_bytes;

/// The chart of time per training against N.
pub const TIME_PER_TRAINING_SVG: &str = "time_per_training.svg";
/// The chart of aggregate samples/s against N.
pub const SAMPLES_PER_S_SVG: &str = "samples_per_s.svg";
/// The text summary: rounds table, fastest N per split, best trial, parity.
pub const SUMMARY_TXT: &str = "summary.txt";

/// The rows of one or more output directories.
pub type Rows = (Vec<RunRow>, Vec<TrialRow>, Vec<ProgressRow>);

/// The files [`write_report`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportPaths {
    /// `None` when no round completed a trial: there is no point to draw.
    pub time_per_training: Option<PathBuf>,
    pub samples_per_s: Option<PathBuf>,
    pub summary: PathBuf,
}

/// Keeps the first of rows that are equal field for field (NaN included).
fn dedup<T: Debug>(rows: Vec<T>) -> Vec<T> {
    let mut seen = HashSet::new();
    rows.into_iter()
        .filter(|row| seen.insert(format!("{row:?}")))
        .collect()
}

/// Reads one results folder with the one reader ([`read_rows`](super::read_rows)):
/// `trials.csv` must be there; `runs.csv` and `progress.csv` may be missing (no rows). A
/// missing folder, a folder without `trials.csv`, and a damaged file are bad input (exit 2).
pub fn read_dir(dir: &Path) -> Result<Rows, ReportError> {
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
    let has = |name: &str| dir.join(name).exists();
    if !has(TRIALS_CSV) {
        return Err(ReportError::Invalid(format!(
            "{}: no {TRIALS_CSV} in this folder: not a folder of gpumux results",
            dir.display()
        )));
    }
    let optional = |name: &str| has(name).then_some(());
    let runs = match optional(RUNS_CSV) {
        Some(()) => read_runs(dir)?,
        None => Vec::new(),
    };
    let progress = match optional(PROGRESS_CSV) {
        Some(()) => read_progress(dir)?,
        None => Vec::new(),
    };
    Ok((runs, read_trials(dir)?, progress))
}

/// Reads the report files of every directory, in order, and drops rows repeated exactly
/// (a directory given twice, or rows copied between directories).
pub fn merge_dirs(dirs: &[PathBuf]) -> Result<Rows, ReportError> {
    if dirs.is_empty() {
        return Err(ReportError::Invalid("no directories to merge".into()));
    }
    let (mut runs, mut trials, mut progress) = (Vec::new(), Vec::new(), Vec::new());
    for dir in dirs {
        let (r, t, p) = read_dir(dir)?;
        runs.extend(r);
        trials.extend(t);
        progress.extend(p);
    }
    Ok((dedup(runs), dedup(trials), dedup(progress)))
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

/// Merges `dirs` into `out`: the deduplicated CSV files, then the charts and summary.
pub fn merge_into(dirs: &[PathBuf], out: &Path) -> Result<ReportPaths, ReportError> {
    let (runs, trials, progress) = merge_dirs(dirs)?;
    write_merged(out, &runs, &trials, &progress)?;
    write_report(out, &runs, &trials)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::csv::tests::{run_row, trial_row};

    fn write_dir(dir: &Path, runs: &[RunRow], trials: &[TrialRow]) {
        write_merged(dir, runs, trials, &[]).unwrap();
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
        let (runs, trials, progress) = merge_dirs(&[a.clone(), b]).unwrap();
        let got: Vec<(&str, u32)> = runs.iter().map(|r| (r.split.as_str(), r.n)).collect();
        assert_eq!(got, vec![("shared", 1), ("shared", 2), ("mps", 2)]);
        assert_eq!(trials.len(), 2);
        assert!(progress.is_empty());
        let (again, _, _) = merge_dirs(&[a.clone(), a]).unwrap();
        assert_eq!(again.len(), 2);
    }

    #[test]
    fn a_dir_without_report_files_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let empty = tmp.path().join("nothing-here");
        fs::create_dir(&empty).unwrap();
        let err = merge_dirs(&[empty]).unwrap_err().to_string();
        assert!(
            err.contains("nothing-here") && err.contains("no trials.csv"),
            "{err}"
        );
        assert!(merge_dirs(&[]).is_err());
    }

    #[test]
    fn a_dir_without_trials_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        write_dir(tmp.path(), &[run_row("shared", 1, 1.0)], &[]);
        fs::remove_file(tmp.path().join(TRIALS_CSV)).unwrap();
        let err = merge_dirs(&[tmp.path().to_path_buf()])
            .unwrap_err()
            .to_string();
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
        let paths = merge_into(&[a], &out).unwrap();
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
