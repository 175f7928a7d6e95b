//! `gpumux sweep`: every trial of the job's parameter space, `concurrency` at a time; resumable and shardable.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use gpumux::error::Error;
use gpumux::job::{AutoWord, Concurrency};
use gpumux::run;
use gpumux::runners::sweep::{Shard, SweepOptions};

use super::flags::{grace_seconds, load_with, EngineFlags, RunFlags, SplitArg};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The job file (YAML).
    job: PathBuf,
    /// Output folder (default out/<job name>-sweep[/shard-i-of-n]).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Append to the results in --out and skip trials already COMPLETE there.
    #[arg(long)]
    resume: bool,
    /// Run only part i of n of the trials (by trial id), e.g. 2/4, for job arrays.
    #[arg(long)]
    shard: Option<Shard>,
    /// Print the trials, slices and caps, and run nothing.
    #[arg(long)]
    dry_run: bool,
    /// Seconds running trials may go on after SIGINT, SIGTERM or SIGHUP before they are stopped.
    #[arg(long, default_value_t = 30.0, value_parser = grace_seconds)]
    grace: f64,
    /// Trials at a time (a number or auto); overrides the job's `concurrency`.
    #[arg(long)]
    concurrency: Option<String>,
    /// Split mode; overrides the job's `split`.
    #[arg(long, value_enum)]
    split: Option<SplitArg>,
    /// The sweep's seed; overrides the job's `seed`, so one file runs over several seeds.
    #[arg(long)]
    seed: Option<u64>,
    /// Join the study at this URL (sqlite:PATH, or postgresql://USER@HOST:PORT/DATABASE) as one
    /// of its workers: each trial runs once across every worker of the study, bayes proposals
    /// and hyperband rungs from every worker's results.
    #[arg(long)]
    study: Option<String>,
    #[command(flatten)]
    run: RunFlags,
    #[command(flatten)]
    engine: EngineFlags,
}

pub fn run(a: Args, out: &mut dyn Write) -> Result<(), Error> {
    let job = load_with(&a.job, |file| {
        a.run.apply(file);
        a.engine.apply(file);
        if let Some(seed) = a.seed {
            file.seed = seed;
        }
    })?;
    let concurrency = match a.concurrency.as_deref() {
        None => None,
        Some("auto") => Some(Concurrency::Auto(AutoWord::Auto)),
        Some(n) => match n.parse::<u32>() {
            Ok(n) if n >= 1 => Some(Concurrency::Fixed(n)),
            _ => {
                return Err(Error::Usage(format!(
                    "--concurrency wants a number from 1, or auto, not `{n}`"
                )))
            }
        },
    };
    let opts = SweepOptions {
        out: a.out,
        data_dir: a.run.data_dir,
        resume: a.resume,
        shard: a.shard,
        dry_run: a.dry_run,
        grace: Duration::try_from_secs_f64(a.grace)
            .map_err(|_| Error::Usage(format!("--grace wants seconds, not {}", a.grace)))?,
        concurrency,
        split: a.split.map(Into::into),
        worker_exe: run::worker_exe()?,
        progress: std::io::stderr().is_terminal(),
        verbose: super::verbose(),
        study: a.study,
    };
    gpumux::runners::sweep::run(&job, &opts, out).map(|_| ())
}
