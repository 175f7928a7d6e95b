//! `gpumux batch-scan`: samples/s against batch size for one model on one slice, up to the largest batch that fits its cap.

use std::io::Write;
use std::path::PathBuf;

use gpumux::error::Error;
use gpumux::job::MemorySpec;
use gpumux::runners::batch_scan::ScanOptions;

use super::flags::{load_with, scan_seconds, RunFlags, SplitArg};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The job file (YAML): the model, data, optimiser and the slice plan whose cap applies.
    job: PathBuf,
    /// Output folder (default out/<job name>-batch-scan).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The first batch size; each next one doubles.
    #[arg(long, default_value_t = 1)]
    start: usize,
    /// Stop after this batch size even if larger ones fit.
    #[arg(long)]
    max_batch: Option<usize>,
    /// Which slice of the plan gives the cap.
    #[arg(long, default_value_t = 0)]
    slice: u32,
    /// Seconds of timed training per batch size.
    #[arg(long, default_value_t = gpumux::train::mirrored::ratio_probe::TARGET_S, value_parser = scan_seconds)]
    seconds: f64,
    /// Split mode whose slice plan gives the cap; overrides the job's `split`.
    #[arg(long, value_enum)]
    split: Option<SplitArg>,
    /// Cap the slice at this many MiB; overrides `memory`.
    #[arg(long)]
    mib_per_slice: Option<f64>,
    #[command(flatten)]
    run: RunFlags,
}

pub fn run(a: Args, out: &mut dyn Write) -> Result<(), Error> {
    let job = load_with(&a.job, |file| {
        a.run.apply(file);
        if let Some(m) = a.mib_per_slice {
            file.memory = MemorySpec {
                fraction: None,
                mib_per_slice: Some(m),
            };
        }
    })?;
    let opts = ScanOptions {
        out: a.out,
        data_dir: a.run.data_dir,
        split: a.split.map(Into::into),
        slice: a.slice,
        start: a.start,
        max_batch: a.max_batch,
        seconds: a.seconds,
    };
    gpumux::runners::batch_scan::run(&job, &opts, out).map(|_| ())
}
