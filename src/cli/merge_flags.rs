//! `gpumux merge`: the results of sweep shards (or several runs) combined into one folder.

use std::io::Write;
use std::path::PathBuf;

use gpumux::error::Error;

use super::flags::GoalArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Sweep result folders holding trials.csv.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// Where the merged trials.csv and progress.csv go.
    #[arg(long)]
    out: PathBuf,
    /// Whether a larger or smaller metric is better, to name the best trial.
    #[arg(long, value_enum, default_value = "maximize")]
    goal: GoalArg,
}

pub fn run(a: Args, out: &mut dyn Write) -> Result<(), Error> {
    // A signal stops the reading or the copying at once, leaving --out as it was (exit 3).
    let opened = gpumux::run::Setup::results_only("merge").open_results_only();
    let (session, ()) = opened.held_folder(&a.out, true, |_, _| Ok(()))?;
    gpumux::runners::sweep::shards::run(&a.dirs, &session, a.goal.into(), out)
}
