//! `gpumux export --study URL --out DIR`: a study's trials and epochs, from every worker, as one results folder with its plots, at any moment of the study.

use std::io::Write;

use crate::error::{Error, Result};
use crate::report::{self, ProgressRow, TrialRow};
use crate::rounds::say;
use crate::run::Session;

use super::study::{self, Study};

/// Writes the study at `url` into the folder `session` holds: `trials.csv` (one row per trial
/// that ended), `progress.csv` (every epoch recorded, those of running trials too), the plots
/// and the summary; each file replaced whole. A folder holding COMPLETE trials the study does
/// not have is first moved aside whole (`earlier-<seconds>/`), as `merge` does. A study that
/// cannot be opened, or is not a study, is refused (exit 2).
pub fn run(url: &str, session: &Session, out: &mut dyn Write) -> Result<()> {
    let dir = session.dir()?;
    let usage = |e: study::StudyError| Error::Usage(e.to_string());
    let mut store = Study::open_existing(url).map_err(usage)?;
    let (job, goal) = store.job_and_goal().map_err(usage)?;
    let cancel = session.cancel();
    let (mut trials, mut running, mut unread) = (Vec::new(), 0, 0);
    for (index, state, row) in store.trials().map_err(usage)? {
        match (
            state.as_str(),
            row.as_deref().and_then(study::decode_row::<TrialRow>),
        ) {
            ("RUNNING", _) => running += 1,
            ("DUPLICATE", _) => {}
            (_, Some(r)) => trials.push(r),
            (_, None) => {
                unread += 1;
                tracing::debug!("trial {index} ({state}) has no row that reads");
            }
        }
    }
    let mut progress: Vec<ProgressRow> = Vec::new();
    store
        .each_epoch(&mut |e| {
            if cancel.draining() {
                return Err(study::StudyError::Store {
                    url: study::shown(url),
                    why: "stopped by a signal".into(),
                });
            }
            if let Some(row) = study::decode_epoch(&e.row) {
                progress.push(row);
            }
            Ok(())
        })
        .map_err(|e| match cancel.draining() {
            true => Error::Interrupted(format!("{e}: {} is as it was", dir.display())),
            false => usage(e),
        })?;
    // As `merge`: COMPLETE trials there that the study does not hold as COMPLETE are kept aside.
    let complete = trials.iter().filter(|r| r.state == report::COMPLETE);
    super::shards::set_aside_unless_kept(dir, complete.map(|r| r.trial_id.as_str()))?;
    report::write_all(dir, &[], &trials, &progress)?;
    let paths = report::write_report(dir, &[], &trials)?;
    let count = |s: &str| trials.iter().filter(|r| r.state == s).count();
    say(
        out,
        format!(
            "study {} (job {job}): {} trials ended ({} COMPLETE, {} PRUNED, {} FAIL, {} INTERRUPTED), {running} running{}; {} epochs; written to {}",
            study::shown(url),
            trials.len(),
            count(report::COMPLETE),
            count(report::PRUNED),
            count("FAIL"),
            count("INTERRUPTED"),
            match unread {
                0 => String::new(),
                n => format!(", {n} without a row this gpumux reads"),
            },
            progress.len(),
            dir.display()
        ),
    )?;
    super::shards::say_best(&trials, goal, out)?;
    crate::rounds::print_paths(&paths, out)
}
