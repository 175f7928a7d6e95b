//! `gpumux parallel`: one model mirrored on several slices, each global batch split by ratios.

use std::io::Write;
use std::path::PathBuf;

use gpumux::error::Error;
use gpumux::job::BatchRatios;
use gpumux::runners::parallel::ParallelOptions;

use super::flags::{load_with, RunFlags, SplitArg};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The job file (YAML); its `parallel:` section, or the flags below, say how.
    job: PathBuf,
    /// Output folder (default out/<job name>-parallel).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Replicas, one per slice; overrides `parallel.slices`.
    #[arg(long)]
    slices: Option<u32>,
    /// How each global batch is split: even, auto, or weights such as 3,2 (or 3:2); overrides `parallel.ratios`.
    #[arg(long)]
    ratios: Option<BatchRatios>,
    /// The global batch (the sum of the shards); overrides `train.batch_size`.
    #[arg(long)]
    batch_size: Option<u32>,
    #[arg(long)]
    epochs: Option<u32>,
    /// Split mode of the slices (shared, logical or green); overrides the job's `split`.
    #[arg(long, value_enum)]
    split: Option<SplitArg>,
    /// Print the slice plan and the shards, and train nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    run: RunFlags,
}

pub fn run(a: Args, out: &mut dyn Write) -> Result<(), Error> {
    let job = load_with(&a.job, |file| {
        a.run.apply(file);
        if let Some(b) = a.batch_size {
            file.train.batch_size = b;
            file.parameters.remove("batch_size");
        }
        if let Some(e) = a.epochs {
            file.train.epochs = e;
        }
        if a.slices.is_some() || a.ratios.is_some() {
            let p = file.parallel.get_or_insert_with(Default::default);
            if let Some(k) = a.slices {
                p.slices = Some(k);
                // Ratios listed for another number of slices no longer apply.
                if matches!(&p.ratios, Some(BatchRatios::Weights(w)) if w.len() != k as usize) {
                    p.ratios = None;
                }
            }
            if let Some(r) = a.ratios.clone() {
                p.ratios = Some(r);
            }
        }
    })?;
    let opts = ParallelOptions {
        out: a.out,
        data_dir: a.run.data_dir,
        split: a.split.map(Into::into),
        dry_run: a.dry_run,
    };
    gpumux::runners::parallel::run(&job, &opts, out).map(|_| ())
}
