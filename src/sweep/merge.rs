//! `gpumux merge`: the results of several sweep shards (or resumed runs) as one report.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::job::Goal;
use crate::report::{self, ProgressRow, TrialRow};

use super::{best, latest_rows};
use crate::commands::say;

/// What a merge found.
#[derive(Clone, Debug, PartialEq)]
pub struct Merged {
    /// One row per trial id: its latest state across the folders (a COMPLETE row wins).
    pub trials: Vec<TrialRow>,
    pub progress: Vec<ProgressRow>,
}

/// Reads every folder's trials.csv (required) and progress.csv (optional) and keeps, per trial
/// id, its COMPLETE row when it has one, else its latest row.
pub fn merge(dirs: &[PathBuf]) -> Result<Merged> {
    if dirs.is_empty() {
        return Err(Error::Usage(
            "give at least one result folder to merge".into(),
        ));
    }
    let mut rows = Vec::new();
    let mut progress = Vec::new();
    for d in dirs {
        if !d.join(report::TRIALS_CSV).exists() {
            return Err(Error::Usage(format!(
                "{} has no {}",
                d.display(),
                report::TRIALS_CSV
            )));
        }
        rows.extend(report::read_trials(d)?);
        if d.join(report::PROGRESS_CSV).exists() {
            progress.extend(report::read_progress(d)?);
        }
    }
    // Non-COMPLETE rows first, so a COMPLETE row of the same id is the one kept.
    let (complete, other): (Vec<TrialRow>, Vec<TrialRow>) =
        rows.into_iter().partition(|r| r.state == "COMPLETE");
    let mut ordered = other;
    ordered.extend(complete);
    let mut trials = latest_rows(&ordered);
    trials.sort_by(|a, b| a.trial_id.cmp(&b.trial_id));
    let ids: HashSet<&str> = trials.iter().map(|r| r.trial_id.as_str()).collect();
    progress.retain(|p| ids.contains(p.trial_id.as_str()));
    Ok(Merged { trials, progress })
}

/// Writes a merge into `out` and prints its counts and best trial.
pub fn write(m: &Merged, out_dir: &Path, goal: Goal, out: &mut dyn Write) -> Result<()> {
    let mut w = report::ReportWriter::create(out_dir)?;
    for r in &m.trials {
        w.trial(r)?;
    }
    for p in &m.progress {
        w.progress(p)?;
    }
    let count = |s: &str| m.trials.iter().filter(|r| r.state == s).count();
    say(
        out,
        format!(
            "merged {} trials: {} COMPLETE, {} FAIL, {} INTERRUPTED; written to {}",
            m.trials.len(),
            count("COMPLETE"),
            count("FAIL"),
            count("INTERRUPTED"),
            out_dir.display()
        ),
    )?;
    if let Some(b) = best(&m.trials, goal) {
        say(
            out,
            format!(
                "best trial {}: metric {:.4} ({goal:?}), params {}",
                b.trial_id,
                b.metric.unwrap_or(f64::NAN),
                b.params
            ),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, state: &str) -> TrialRow {
        TrialRow {
            trial_id: id.into(),
            state: state.into(),
            metric: Some(0.5),
            params: "{}".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_complete_row_wins_over_earlier_and_later_failures() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        let mut wa = report::ReportWriter::create(&a).unwrap();
        wa.trial(&row("x", "COMPLETE")).unwrap();
        wa.trial(&row("y", "FAIL")).unwrap();
        let mut wb = report::ReportWriter::create(&b).unwrap();
        wb.trial(&row("x", "INTERRUPTED")).unwrap();
        wb.trial(&row("z", "COMPLETE")).unwrap();
        let m = merge(&[a.clone(), b]).unwrap();
        let states: Vec<(&str, &str)> = m
            .trials
            .iter()
            .map(|r| (r.trial_id.as_str(), r.state.as_str()))
            .collect();
        assert_eq!(
            states,
            vec![("x", "COMPLETE"), ("y", "FAIL"), ("z", "COMPLETE")]
        );
        assert!(merge(&[tmp.path().join("nothing")]).is_err());
        assert!(merge(&[]).is_err());
    }
}
