//! `gpumux export`: a study's results, from every worker, written as one results folder.

use std::io::Write;
use std::path::PathBuf;

use gpumux::error::Error;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The study (`sqlite:PATH` or `postgresql://…`), as its workers were given it with
    /// `gpumux sweep --study`.
    #[arg(long)]
    study: String,
    /// Where its trials.csv, progress.csv, plots and summary go.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(a: Args, out: &mut dyn Write) -> Result<(), Error> {
    // A bad URL, or a SQLite study that is not there, is said before any folder is made or
    // locked (a PostgreSQL one is found out when it is opened).
    let path = gpumux::runners::sweep::study::sqlite_path(&a.study)
        .map_err(|e| Error::Usage(e.to_string()))?;
    if let Some(p) = path.filter(|p| !p.is_file()) {
        return Err(Error::Usage(format!(
            "study `{}` cannot be opened: there is no file {}",
            a.study,
            p.display()
        )));
    }
    // A signal stops the reading or the writing at once, leaving --out as it was (exit 3).
    let opened = gpumux::run::Setup::results_only("export").open_results_only();
    let (session, ()) = opened.held_folder(&a.out, true, |_, _| Ok(()))?;
    gpumux::runners::sweep::export::run(&a.study, &session, out)
}
