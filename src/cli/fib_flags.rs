//! `gpumux fib`: the experiment, for each N and split mode N trials at once.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use gpumux::error::Error;
use gpumux::run;
use gpumux::runners::fib::FibOptions;

use super::flags::{load_with, EngineFlags, RunFlags, SplitArg};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The job file (YAML).
    job: PathBuf,
    /// Output folder (default out/<job name>).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    run: RunFlags,
    /// Override the job's N list, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',')]
    n: Option<Vec<u32>>,
    /// Override the job's split modes, e.g. shared,logical.
    #[arg(long, value_enum, value_delimiter = ',')]
    splits: Option<Vec<SplitArg>>,
    /// Override the job's epochs.
    #[arg(long)]
    epochs: Option<u32>,
    #[command(flatten)]
    engine: EngineFlags,
}

pub fn run(a: Args, out: &mut dyn Write) -> Result<(), Error> {
    let job = load_with(&a.job, |file| {
        a.run.apply(file);
        if let Some(n) = a.n {
            file.n = n;
        }
        if let Some(s) = a.splits {
            file.splits = s.into_iter().map(Into::into).collect();
        }
        if let Some(e) = a.epochs {
            file.train.epochs = e;
        }
        a.engine.apply(file);
    })?;
    let opts = FibOptions {
        out: a.out,
        data_dir: a.run.data_dir,
        worker_exe: run::worker_exe()?,
        progress: std::io::stderr().is_terminal(),
    };
    gpumux::runners::fib::run(&job, &opts, out).map(|_| ())
}
