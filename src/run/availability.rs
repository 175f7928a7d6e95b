//! Whether a split mode can run with a run's backend: the one check every command makes.

use std::path::PathBuf;

use crate::job::SplitMode;

use super::Resolved;

/// Why a split mode cannot run here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// `green` and `mps` exist on a GPU only, and the backend is the CPU.
    NeedsGpu,
    /// `green`: a CUDA device (or its driver) makes no green contexts; the words say which.
    NoGreen(String),
    /// `mps`: no MPS control daemon is running.
    NoMpsDaemon,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::NeedsGpu => f.write_str("it needs a GPU"),
            Unavailable::NoGreen(why) => f.write_str(why),
            Unavailable::NoMpsDaemon => f.write_str(
                "no MPS control daemon is running (gpumux never starts one; see nvidia-cuda-mps-control)",
            ),
        }
    }
}

/// Why `mode` cannot run with this backend, if it cannot.
pub fn unavailable(mode: SplitMode, r: &Resolved) -> Option<Unavailable> {
    match (mode, &r.engine) {
        (SplitMode::Green | SplitMode::Mps, None) => Some(Unavailable::NeedsGpu),
        (SplitMode::Green, Some(_)) => r.without_green().map(Unavailable::NoGreen),
        (SplitMode::Mps, Some(_)) if !mps_daemon_running() => Some(Unavailable::NoMpsDaemon),
        _ => None,
    }
}

/// Whether an MPS control daemon is listening: its control pipe exists in
/// `$CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`).
pub fn mps_daemon_running() -> bool {
    let dir = std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/nvidia-mps"));
    dir.join("control").exists()
}
