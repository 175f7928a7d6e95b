//! `gpumux merge`: the results of several sweep shards (or resumed runs) as one report.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::job::Goal;
use crate::report::{self, Interrupt, ProgressRow, TrialBrief, TrialRow};
use crate::run::Session;

use super::best;
use super::one_per_epoch::{KeyColumns, Met, OnePerEpoch};
use crate::rounds::say;

/// What a merge found.
#[derive(Debug)]
pub struct Merged {
    /// One row per trial id: its latest state across the folders (a COMPLETE row wins), with
    /// its line as its folder wrote it (when its check matched).
    pub trials: Vec<TrialBrief>,
    /// The folder each kept row came from (by index into `folders`), row for row.
    from: Vec<usize>,
    folders: Vec<report::ResultsDir>,
}

/// Reads the trials of every folder with the one reader of results files (a damaged file is
/// refused, a cut last line dropped) and keeps, per trial id, its COMPLETE row when it has one,
/// else its PRUNED row, else its latest row. A folder of a `fib` run (rounds in runs.csv, the
/// same trial id in every round) is refused: one row per trial id would drop its rounds. The
/// folders' progress rows are read later, one at a time, when the merge writes them.
pub fn merge(dirs: &[PathBuf]) -> Result<Merged> {
    if dirs.is_empty() {
        return Err(Error::Usage(
            "give at least one result folder to merge".into(),
        ));
    }
    let folders: Vec<report::ResultsDir> = dirs
        .iter()
        .map(|d| report::ResultsDir::open(d))
        .collect::<std::result::Result<_, _>>()?;
    for d in &folders {
        let runs = d.runs()?;
        if !runs.is_empty() {
            return Err(Error::Usage(format!(
                "{} holds a fib run ({} rounds in {}), not sweep results: `gpumux merge` keeps \
                 one row per trial id, which would drop its rounds; put fib runs together with \
                 `gpumux report DIR... --out DIR`, which keeps every row",
                d.dir().display(),
                runs.len(),
                report::RUNS_CSV
            )));
        }
    }
    let mut read = trials_of(&folders)?;
    // Per trial id, the last COMPLETE row, else the last PRUNED one, else the last row, in the
    // order given: a trial that completed anywhere is COMPLETE, whatever the folders' order.
    let rank = |r: &TrialBrief| match r.state.as_str() {
        report::COMPLETE => 2,
        report::PRUNED => 1,
        _ => 0,
    };
    // Each row as (its folder, its place there), in order of their ids and, per id, as given;
    // then the one kept of each id, moved out once.
    let mut order: Vec<(usize, usize)> = read
        .iter()
        .enumerate()
        .flat_map(|(f, rows)| (0..rows.len()).map(move |i| (f, i)))
        .collect();
    let row = |&(f, i): &(usize, usize)| &read[f][i];
    order.sort_unstable_by(|x, y| row(x).trial_id.cmp(&row(y).trial_id).then(x.cmp(y)));
    let mut kept: Vec<(usize, usize)> = Vec::new();
    for k in order {
        match kept.last_mut() {
            Some(last) if row(last).trial_id == row(&k).trial_id => {
                if rank(row(&k)) >= rank(row(last)) {
                    *last = k;
                }
            }
            _ => kept.push(k),
        }
    }
    let (mut trials, mut from) = (Vec::with_capacity(kept.len()), Vec::new());
    for (f, i) in kept {
        trials.push(std::mem::take(&mut read[f][i]));
        from.push(f);
    }
    // The rows not kept are freed beside the merge.
    free_beside(read);
    Ok(Merged {
        trials,
        from,
        folders,
    })
}

/// The rows of each folder's `trials.csv` with their lines, in the folders' order: as many
/// folders read at once as there are cores (parsing the rows is most of the work).
fn trials_of(folders: &[report::ResultsDir]) -> Result<Vec<Vec<TrialBrief>>> {
    let width = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut read = Vec::with_capacity(folders.len());
    for group in folders.chunks(width) {
        let got: Vec<_> = std::thread::scope(|s| {
            let each: Vec<_> = group
                .iter()
                .map(|d| s.spawn(move || d.trial_briefs()))
                .collect();
            each.into_iter().map(|h| h.join()).collect()
        });
        for (d, trials) in group.iter().zip(got) {
            let Ok(trials) = trials else {
                return Err(Error::Report(crate::error::ReportError::Invalid(format!(
                    "{}: the reading of {} stopped unexpectedly",
                    d.dir().display(),
                    report::TRIALS_CSV
                ))));
            };
            read.push(trials?);
        }
    }
    Ok(read)
}

impl Merged {
    /// Writes `out`'s `progress.csv`: the epochs of each kept row's trial, from the folder
    /// that row came from, one per epoch (the last written), copied row by row. Rows are
    /// written as they are read; only when an epoch turns up twice is that file given up and
    /// the rows copied again in a second pass that keeps the last of each.
    fn write_progress(&self, out_dir: &Path, interrupt: &Interrupt) -> Result<()> {
        let mut epochs = OnePerEpoch::new(
            self.trials
                .iter()
                .zip(&self.from)
                .map(|(t, &i)| (t.trial_id.as_str(), i)),
        );
        let columns = report::union_of_columns(&self.folders);
        let path = out_dir.join(report::PROGRESS_CSV);
        let (mut at, mut again, mut given_up) = (0u64, false, false);
        let once = report::write_lines_from::<ProgressRow>(&path, &columns, interrupt, |out| {
            for (source, d) in self.folders.iter().enumerate() {
                let Some(mut reader) = d.progress(interrupt)? else {
                    continue;
                };
                let (key, plan) = (KeyColumns::of(&reader)?, reader.plan(&columns));
                report::copy_rows(&mut reader, &plan, out, |cells| {
                    let seen = epochs.see(at, source, key.key(cells)?);
                    at += 1;
                    again |= seen == Met::Again;
                    Ok(seen == Met::First && !again)
                })?;
            }
            if again {
                // This file is dropped (its temporary file removed), never put in place.
                given_up = true;
                return Err(crate::error::ReportError::Invalid(
                    "an epoch written twice".into(),
                ));
            }
            Ok(())
        });
        match once {
            Ok(()) => return Ok(()),
            Err(_) if given_up => {}
            Err(e) => return Err(e.into()),
        }
        let mut at = 0u64;
        report::write_lines_from::<ProgressRow>(&path, &columns, interrupt, |out| {
            for (source, d) in self.folders.iter().enumerate() {
                let Some(mut reader) = d.progress(interrupt)? else {
                    continue;
                };
                let (key, plan) = (KeyColumns::of(&reader)?, reader.plan(&columns));
                report::copy_rows(&mut reader, &plan, out, |cells| {
                    at += 1;
                    Ok(epochs.keeps(at - 1, source, key.key(cells)?))
                })?;
            }
            Ok(())
        })?;
        Ok(())
    }
}

/// `gpumux merge DIR... --out OUT`: in a session that holds OUT's lock, merges, and replaces
/// OUT's files whole. Results already in OUT with a COMPLETE trial the merge does not hold (OUT
/// is no input, and not an earlier merge of the same folders) are first moved whole into
/// `OUT/earlier-<seconds>/`. A signal stops the reading or the copying, leaving OUT as it was.
pub fn run(dirs: &[PathBuf], session: &Session, goal: Goal, out: &mut dyn Write) -> Result<()> {
    let out_dir = session.dir()?;
    let interrupt = &Interrupt::OnDrain(session.cancel().clone());
    let m = merge(dirs)?;
    let complete = m.trials.iter().filter(|r| r.state == report::COMPLETE);
    set_aside_unless_kept(out_dir, complete.map(|r| r.trial_id.as_str()))?;
    let written = write(&m, out_dir, goal, interrupt, out);
    free_beside(m);
    written
}

/// Moves the results in `dir` aside whole (`earlier-<seconds>/`) when they hold a COMPLETE trial
/// that is not among the trials about to replace them as COMPLETE (`complete`): no COMPLETE row
/// is lost. Results there that do not read are refused and left as they are.
pub(super) fn set_aside_unless_kept<'a>(
    dir: &Path,
    complete: impl Iterator<Item = &'a str>,
) -> Result<()> {
    if !dir.join(report::TRIALS_CSV).exists() {
        return Ok(());
    }
    let held = report::read_trials(dir)?;
    let kept: HashSet<&str> = complete.collect();
    if held
        .iter()
        .any(|r| r.state == report::COMPLETE && !kept.contains(r.trial_id.as_str()))
    {
        crate::run::set_aside(dir)?;
    }
    Ok(())
}

/// Frees `rows` on a thread of its own: tens of thousands of rows take tens of milliseconds to
/// free, which need not hold up the merge or its exit.
fn free_beside<T: Send + 'static>(rows: T) {
    let _ = std::thread::Builder::new()
        .name("gpumux-free".into())
        .spawn(move || drop(rows));
}

/// Writes a merge into `out` (each file replaced whole, fsynced once; the progress rows before
/// the trials) and prints its counts and best trial.
pub fn write(
    m: &Merged,
    out_dir: &Path,
    goal: Goal,
    interrupt: &Interrupt,
    out: &mut dyn Write,
) -> Result<()> {
    std::fs::create_dir_all(out_dir).map_err(Error::io(format!(
        "cannot make the folder {}",
        out_dir.display()
    )))?;
    m.write_progress(out_dir, interrupt)?;
    report::write_rows::<report::RunRow>(&out_dir.join(report::RUNS_CSV), &[])?;
    // The kept rows as their folders wrote them.
    let trials = out_dir.join(report::TRIALS_CSV);
    report::write_lines_from::<TrialRow>(&trials, &[], interrupt, |out| {
        m.trials.iter().try_for_each(|t| out.write(&t.line))
    })?;
    let count = |s: &str| m.trials.iter().filter(|r| r.state == s).count();
    say(
        out,
        format!(
            "merged {} trials: {} COMPLETE, {} FAIL, {} INTERRUPTED{}; written to {}",
            m.trials.len(),
            count("COMPLETE"),
            count("FAIL"),
            count("INTERRUPTED"),
            match count(report::PRUNED) {
                0 => String::new(),
                p => format!(", {p} PRUNED"),
            },
            out_dir.display()
        ),
    )?;
    say_best(&m.trials, goal, out)
}

/// The line naming the best trial of merged rows, when there is one.
pub(super) fn say_best<R: crate::report::Ranked + HasParams>(
    rows: &[R],
    goal: Goal,
    out: &mut dyn Write,
) -> Result<()> {
    if let Some(b) = best(rows, goal) {
        say(
            out,
            format!(
                "best trial {}: metric {:.4} ({goal:?}), params {}",
                b.id(),
                b.metric().unwrap_or(f64::NAN),
                b.params()
            ),
        )?;
    }
    Ok(())
}

/// The parameters of a results row, as JSON.
pub(super) trait HasParams {
    fn params(&self) -> &str;
}

impl HasParams for TrialRow {
    fn params(&self) -> &str {
        &self.params
    }
}

impl HasParams for TrialBrief {
    fn params(&self) -> &str {
        &self.params
    }
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
        wa.trial(&row("p", "PRUNED")).unwrap();
        let mut wb = report::ReportWriter::create(&b).unwrap();
        wb.trial(&row("x", "INTERRUPTED")).unwrap();
        wb.trial(&row("z", "COMPLETE")).unwrap();
        // A PRUNED trial is done, like a COMPLETE one.
        wb.trial(&row("p", "INTERRUPTED")).unwrap();
        let m = merge(&[a.clone(), b]).unwrap();
        let states: Vec<(&str, &str)> = m
            .trials
            .iter()
            .map(|r| (r.trial_id.as_str(), r.state.as_str()))
            .collect();
        assert_eq!(
            states,
            vec![
                ("p", "PRUNED"),
                ("x", "COMPLETE"),
                ("y", "FAIL"),
                ("z", "COMPLETE")
            ]
        );
        assert!(merge(&[tmp.path().join("nothing")]).is_err());
        assert!(merge(&[]).is_err());
    }

    fn epoch(id: &str, epoch: u32, acc: f64) -> ProgressRow {
        ProgressRow {
            trial_id: id.into(),
            epoch,
            test_acc: acc,
            ..Default::default()
        }
    }

    /// Merges `a` and `b` into `out`: the progress rows written there (trial, epoch, accuracy),
    /// and the files left in `out`.
    fn merged_progress(a: &Path, b: &Path, out: &Path) -> (Vec<(String, u32, f64)>, usize) {
        let m = merge(&[a.to_path_buf(), b.to_path_buf()]).unwrap();
        write(&m, out, Goal::Maximize, &Interrupt::Never, &mut Vec::new()).unwrap();
        let rows = report::read_progress(out)
            .unwrap()
            .into_iter()
            .map(|r| (r.trial_id, r.epoch, r.test_acc))
            .collect();
        (rows, std::fs::read_dir(out).unwrap().count())
    }

    fn owned(rows: &[(&str, u32, f64)]) -> Vec<(String, u32, f64)> {
        rows.iter().map(|&(i, e, v)| (i.into(), e, v)).collect()
    }

    #[test]
    fn progress_rows_are_copied_in_one_pass_or_two_when_an_epoch_is_written_twice() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        let mut wa = report::ReportWriter::create(&a).unwrap();
        let mut wb = report::ReportWriter::create(&b).unwrap();
        for (id, acc) in [("x", 0.1), ("y", 0.2)] {
            wa.progress(&epoch(id, 1, acc)).unwrap();
            wa.progress(&epoch(id, 2, acc + 0.01)).unwrap();
        }
        wa.trial(&row("x", "COMPLETE")).unwrap();
        wa.trial(&row("y", "FAIL")).unwrap();
        // y completed in b: its rows come from b only.
        wb.progress(&epoch("y", 1, 0.5)).unwrap();
        wb.trial(&row("y", "COMPLETE")).unwrap();
        let once = tmp.path().join("once");
        let (rows, files) = merged_progress(&a, &b, &once);
        assert_eq!(rows, owned(&[("x", 1, 0.1), ("x", 2, 0.11), ("y", 1, 0.5)]));
        // An epoch of x written again later in a: the last one is kept, where it stood.
        wa.progress(&epoch("x", 1, 0.9)).unwrap();
        let twice = tmp.path().join("twice");
        let (rows, files_twice) = merged_progress(&a, &b, &twice);
        assert_eq!(rows, owned(&[("x", 2, 0.11), ("x", 1, 0.9), ("y", 1, 0.5)]));
        // The file given up left nothing behind.
        assert_eq!(files, files_twice);
    }
}
