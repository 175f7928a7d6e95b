//! The job: composes the specs the lower layers own (engine options, model, data, faults) with the run's own sections, read and checked near the top.

use std::path::PathBuf;

use crate::data::DataSpec;
pub use crate::engine::{ConvEngine, EngineOptions};
use crate::error::JobError;
pub use crate::models::{Hyper, ModelKind, ModelSpec, Optimizer, Padding, Stem};
use crate::space::Space;
pub use crate::train::fault::{FaultKind, FaultSpec};

mod check;
mod defaults;
mod hyper;
pub mod limits;
mod load;
mod schema;
mod split;
pub mod text;

pub use check::check_name;
pub use hyper::PARAMETERS;
pub use load::locate;
pub use schema::{
    AutoWord, BatchRatios, BayesSpec, CapPolicy, Concurrency, EarlyTerminate, Goal, JobFile,
    MemorySpec, MetricSpec, ParallelSpec, SliceDef, TrainSpec, BUILTIN_METRICS,
    WANDB_DEFAULT_COMMAND, WANDB_MACROS,
};
pub use split::{BackendChoice, SplitMode};

/// The Fibonacci N list of the experiment.
pub const DEFAULT_N: [u32; 8] = [1, 2, 3, 5, 8, 13, 21, 34];
/// The most trials one round may launch together.
pub const MAX_N: u32 = 1024;
/// The most replicas of one data-parallel training.
pub const MAX_REPLICAS: u32 = 64;
/// Device numbers a slice may name are below this.
pub const MAX_DEVICES: u32 = 64;
/// The most SMs a slice may ask for (devices have a few hundred).
pub const MAX_SM: u32 = 1 << 16;
/// The largest batch size a trial may train with.
pub const MAX_BATCH_SIZE: u32 = 10_000_000;
/// The largest memory cap a slice may be given, in MiB (1 EiB).
pub const MAX_MIB: f64 = (1u64 << 40) as f64;
/// The largest weight in `ratios` and `parallel.ratios`.
pub const MAX_RATIO: f64 = 1e6;
/// The longest job name, in characters (it names the output folder).
pub const MAX_NAME_LEN: usize = 100;

/// A checked job, with where it came from (for error lines).
#[derive(Clone, Debug)]
pub struct Job {
    pub name: String,
    pub file: JobFile,
    pub space: Space,
    pub path: PathBuf,
    text: String,
}

impl Job {
    /// An error about `key` (a dotted path), with the line where it appears.
    pub fn invalid(&self, key: &str, message: impl Into<String>) -> JobError {
        JobError::Invalid {
            path: self.path.clone(),
            key: key.into(),
            line: locate(&self.text, key),
            message: message.into(),
        }
    }

    /// How many values each trial holds (its built-in hyperparameters and `epochs`, and every
    /// other parameter of the space).
    pub fn values_per_trial(&self) -> usize {
        PARAMETERS.len()
            + 1
            + self
                .space
                .dists
                .keys()
                .filter(|k| !PARAMETERS.contains(&k.as_str()))
                .count()
    }

    /// The devices the job's slices sit on, in increasing order: `[0]` unless `slices` names others.
    pub fn devices(&self) -> Vec<u32> {
        let mut list: Vec<u32> = match &self.file.slices {
            Some(defs) => defs.iter().map(|d| d.device.unwrap_or(0)).collect(),
            None => vec![0],
        };
        list.sort_unstable();
        list.dedup();
        list
    }

    /// The number of slices an unequal slice plan (`slices` or `ratios`) has, when the job gives one.
    pub fn slice_plan_len(&self) -> Option<usize> {
        let f = &self.file;
        f.slices
            .as_ref()
            .map(Vec::len)
            .or(f.ratios.as_ref().map(Vec::len))
    }

    /// The replicas of a data-parallel job: `parallel.slices`, else the number of
    /// `parallel.ratios`, else the slice plan's length; without `parallel`, the slice plan's
    /// length or 1.
    pub fn replicas(&self) -> Result<u32, JobError> {
        let Some(p) = &self.file.parallel else {
            return Ok(self.slice_plan_len().unwrap_or(1) as u32);
        };
        let from_ratios = match &p.ratios {
            Some(BatchRatios::Weights(w)) => Some(w.len()),
            _ => None,
        };
        p.slices
            .map(|k| k as usize)
            .or(from_ratios)
            .or(self.slice_plan_len())
            .map(|k| k as u32)
            .ok_or_else(|| {
                self.invalid(
                    "parallel.slices",
                    "is missing: give the number of slices, ratios, or a slice plan",
                )
            })
    }

    /// The engine options a process running this job opens its engine with
    /// ([`EngineOptions::for_model`]): an external command or a model without convolutions does
    /// not load cuDNN.
    pub fn engine_options(&self) -> EngineOptions {
        let convolutions = self
            .file
            .model
            .as_ref()
            .is_some_and(|m| m.kind.has_convolutions());
        self.file.engine.for_model(convolutions)
    }

    /// The built-in model; an error for a job that runs an external command.
    pub fn model(&self) -> Result<&ModelSpec, JobError> {
        self.file.model.as_ref().ok_or_else(|| {
            self.invalid(
                "command",
                "makes this an external-command job: run it with `gpumux sweep`",
            )
        })
    }

    /// The dataset of the built-in model.
    pub fn data(&self) -> Result<&DataSpec, JobError> {
        self.file
            .data
            .as_ref()
            .ok_or_else(|| self.invalid("data", "is missing: a built-in model needs data"))
    }
}

/// The job text and parser the tests of this module's files share.
#[cfg(test)]
mod test_jobs {
    use super::Job;
    use crate::error::JobError;
    use std::path::Path;

    /// The smallest job that loads: an MLP on synthetic data.
    pub const OK: &str = "model: {kind: mlp}\ndata: {source: synthetic}\n";

    /// `text` parsed as the job file `t.yaml`.
    pub fn parse(text: &str) -> Result<Job, JobError> {
        Job::parse(text, Path::new("t.yaml"))
    }
}
