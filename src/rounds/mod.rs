//! What the runners share: the batch check, a lone trial's configuration and their output lines; the rows they write are in `rows.rs`.

use std::io::Write;

use crate::cancel::Cancel;
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::report;

mod rows;
pub use rows::{
    counts_line, lost_trial_row, progress_row, trial_row, unless_progress_lost, CsvFile, LostRow,
    LostRows,
};

/// Writes one line of a command's output.
pub fn say(out: &mut dyn Write, line: impl std::fmt::Display) -> Result<()> {
    writeln!(out, "{line}").map_err(Error::io("stdout"))
}

/// A batch larger than the training split is a job error, found before anything starts.
pub fn check_batch(job: &Job, data: &Dataset, trials: &[u32]) -> Result<()> {
    for &i in trials {
        let h = job.hyper(i as usize)?;
        if h.batch_size as usize > data.train.len() {
            let key = if job.file.parameters.contains_key("batch_size") {
                "parameters.batch_size"
            } else {
                "train.batch_size"
            };
            return Err(job
                .invalid(
                    key,
                    format!(
                        "{} is larger than the {} training samples of {}",
                        h.batch_size,
                        data.train.len(),
                        data.name
                    ),
                )
                .into());
        }
    }
    Ok(())
}

pub fn print_paths(paths: &report::ReportPaths, out: &mut dyn Write) -> Result<()> {
    for p in [&paths.time_per_training, &paths.samples_per_s]
        .into_iter()
        .flatten()
        .chain([&paths.summary])
    {
        say(out, format!("wrote {}", p.display()))?;
    }
    if paths.time_per_training.is_none() {
        say(out, "no charts: no round completed a trial")?;
    }
    Ok(())
}

/// The model column of a job's rows: the built-in kind, or `external`.
pub fn model_name(job: &Job) -> String {
    job.file
        .model
        .as_ref()
        .map_or_else(|| "external".to_string(), |m| m.kind.to_string())
}

/// One trial of `job`'s model on `data` outside any round (the `parallel` and `batch-scan`
/// commands): the job's epochs and seed, no fault, no step cap, no warm-up, no pruning.
pub fn lone_trial(
    job: &Job,
    data: &Dataset,
    model: crate::job::ModelSpec,
    hyper: crate::job::Hyper,
    cancel: Cancel,
) -> crate::train::TrialConfig {
    crate::train::TrialConfig {
        model,
        hyper,
        epochs: job.file.train.epochs,
        seed: job.file.seed,
        input: data.shape,
        classes: data.classes,
        fault: None,
        engine: job.engine_options(),
        max_steps: None,
        warm_up: false,
        cancel,
        prune: None,
    }
}
