//! gpumux: multiplex one GPU among many concurrent trainings, split into slices, and measure the time per training.
//!
//! Data flow: the command line (the binary's `cli`) → [`run`] (a run's setup) → the
//! [`runners`] (`train`, `fib`, `sweep`, `parallel`, `batch_scan`, sharing [`rounds`]) →
//! [`sched`] → [`train`] → [`models`] → [`engine`], with [`job`] and [`plan`] read near the
//! top and [`report`] writing the results.

pub mod cancel;
pub mod data;
pub mod engine;
pub mod error;
pub mod gpu;
pub mod hash;
pub mod job;
pub mod models;
pub mod outdir;
pub mod plan;
pub mod report;
pub mod rng;
pub mod rounds;
pub mod run;
pub mod runners;
pub mod sched;
pub mod space;
pub mod telemetry;
pub mod train;
pub mod units;

pub use error::{Error, Result};

/// The repository root for tests: `GPUMUX_ROOT` when set (test binaries built here and run in a
/// copy of the tree elsewhere, as the GPU check does), else where the crate was built.
#[cfg(test)]
pub(crate) fn test_root() -> std::path::PathBuf {
    std::env::var_os("GPUMUX_ROOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
