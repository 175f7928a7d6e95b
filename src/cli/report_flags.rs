//! `gpumux report`: the plots and summary redrawn from result folders, several merged with `--out`.

use std::io::Write;
use std::path::{Path, PathBuf};

use gpumux::error::{Error, ReportError};
use gpumux::report;
use gpumux::rounds::print_paths;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Result folders holding runs.csv and trials.csv.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// Write the merged CSVs and plots here.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(a: Args, out: &mut dyn Write) -> Result<(), Error> {
    redraw(&a.dirs, a.out.as_deref(), out)
}

/// `gpumux report`: redraws plots and the summary from result folders, merging several into `out`.
fn redraw(dirs: &[PathBuf], out_dir: Option<&Path>, out: &mut dyn Write) -> Result<(), Error> {
    if dirs.is_empty() {
        return Err(Error::Usage("give at least one result folder".into()));
    }
    let target = match (out_dir, dirs) {
        (Some(o), _) => o.to_path_buf(),
        (None, [one]) => one.clone(),
        (None, _) => {
            return Err(Error::Usage(
                "merging several folders needs --out DIR".into(),
            ))
        }
    };
    // A missing folder is said as such (exit 2) before any folder is made or locked.
    for d in dirs {
        std::fs::metadata(d).map_err(|source| ReportError::Read {
            path: d.clone(),
            source,
        })?;
    }
    // The folder written is held from before the reading, as every writing command does. A
    // signal stops the reading or the copying at once, leaving every file as it was (exit 3).
    let opened = gpumux::run::Setup::results_only("report").open_results_only();
    let (session, ()) = opened.held_folder(&target, true, |_, _| Ok(()))?;
    let interrupt = report::Interrupt::OnDrain(session.cancel().clone());
    let (runs, trials) = match out_dir {
        Some(_) => report::merge_files(dirs, &target, &interrupt)?,
        None => {
            // One folder: every file is read through (a damaged one refused), progress row by row.
            let folder = report::ResultsDir::open(&target)?;
            folder.check_progress(&interrupt)?;
            (folder.runs()?, folder.trials()?)
        }
    };
    let paths = report::write_report(&target, &runs, &trials)?;
    write!(out, "{}", report::summary_text(&runs, &trials)).map_err(Error::io("stdout"))?;
    print_paths(&paths, out)
}
