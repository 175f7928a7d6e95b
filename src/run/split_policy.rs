//! Which split modes a command may use, and whether one can run with this run's backend: the one policy every command follows.
//!
//! Two questions, asked in this order: may the command's work use the mode at all (a fixed
//! rule: bad input, exit 2, found before any device is opened); and can the mode run here (a
//! mode that needs a GPU on the CPU backend is bad input, exit 2; a GPU that makes no green
//! contexts, or no MPS daemon, is no usable GPU, exit 4).

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::job::{BackendChoice, Job, SplitMode};

use super::Resolved;

/// What a command runs under its split mode, which decides the modes it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// Trials of a built-in model, each on its slice (`fib`, `sweep`, `train`): every mode.
    BuiltinTrials,
    /// Trials that are external commands, each its own process (a sweep with `command:`):
    /// every mode but `fused`, which trains several built-in trials as one model.
    Commands,
    /// One training whose replicas are threads of one process, named by its command
    /// (`parallel`, `batch-scan`): `shared`, `logical` and `green`.
    Threads(&'static str),
}

impl Work {
    /// The modes this work may use, in the order reports list them.
    pub fn modes(self) -> &'static [SplitMode] {
        use SplitMode::*;
        match self {
            Work::BuiltinTrials => &[Shared, Process, Logical, Green, Mps, Fused],
            Work::Commands => &[Shared, Process, Logical, Green, Mps],
            Work::Threads(_) => &[Shared, Logical, Green],
        }
    }

    /// The modes of [`Work::modes`] that run on the CPU backend, in words.
    fn on_the_cpu(self) -> String {
        let modes: Vec<&str> = self
            .modes()
            .iter()
            .filter(|m| !m.gpu_only())
            .map(|m| m.name())
            .collect();
        modes.join(", ")
    }
}

/// Refuses (bad input, exit 2) a split mode that `work` cannot use on any machine.
pub fn check_use(split: SplitMode, work: Work) -> Result<()> {
    if work.modes().contains(&split) {
        return Ok(());
    }
    let use_instead = work
        .modes()
        .iter()
        .map(|m| m.name())
        .collect::<Vec<_>>()
        .join(", ");
    let why = match work {
        Work::Threads(command) if split == SplitMode::Fused => format!(
            "{command} trains one model across its slices: split fused, which trains several trials as one model, does not apply"
        ),
        Work::Threads(command) => format!(
            "{command} runs its replicas as threads of one process: split {split} does not apply"
        ),
        _ => "split fused trains built-in models only; a sweep with `command:` runs each trial as its own command".into(),
    };
    Err(Error::Usage(format!("{why} (use {use_instead})")))
}

/// Refuses a split mode that cannot run with this backend: one that needs a GPU on the CPU
/// backend is bad input (exit 2); a GPU without green contexts, or no MPS daemon, is no usable
/// GPU (exit 4).
pub fn check_here(split: SplitMode, work: Work, r: &Resolved) -> Result<()> {
    match unavailable(split, r) {
        None => Ok(()),
        Some(Unavailable::NeedsGpu) => Err(Error::Usage(format!(
            "split {split} needs a GPU; {} (on the CPU use {})",
            r.note,
            work.on_the_cpu()
        ))),
        Some(why) => Err(Error::NoDevice(format!("split {split}: {why}"))),
    }
}

/// Refuses (bad input, exit 2) a list of modes (`fib`'s `splits`) that names one that needs a
/// GPU when the job says `backend: cpu`: the job contradicts itself, whatever the machine.
pub fn check_listed(job: &Job) -> Result<()> {
    if job.file.backend != BackendChoice::Cpu {
        return Ok(());
    }
    match job.file.splits.iter().find(|m| m.gpu_only()) {
        Some(m) => Err(Error::Usage(format!(
            "{}: `splits` lists {m}, which needs a GPU, but the job says backend: cpu \
             (remove {m}, or use backend: auto)",
            job.path.display()
        ))),
        None => Ok(()),
    }
}

/// The modes of a list (`fib`'s `splits`) that can run here, in its order: the others are
/// skipped, each with a note. None left is bad input (exit 2).
pub fn runnable(listed: &[SplitMode], r: &Resolved) -> Result<Vec<SplitMode>> {
    let kept: Vec<SplitMode> = listed
        .iter()
        .copied()
        .filter(|m| match unavailable(*m, r) {
            Some(why) => {
                crate::note!("note: skipping split mode {m}: {why}");
                false
            }
            None => true,
        })
        .collect();
    if kept.is_empty() {
        return Err(Error::Usage(format!(
            "no split mode of the job can run here ({})",
            r.note
        )));
    }
    Ok(kept)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_work_refuses_the_modes_it_cannot_use_naming_those_it_can() {
        for m in Work::BuiltinTrials.modes() {
            check_use(*m, Work::BuiltinTrials).unwrap();
        }
        let e = check_use(SplitMode::Fused, Work::Commands)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("built-in models only")
                && e.contains("use shared, process, logical, green, mps"),
            "{e}"
        );
        let e = check_use(SplitMode::Process, Work::Threads("batch-scan"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("batch-scan runs its replicas")
                && e.contains("use shared, logical, green"),
            "{e}"
        );
        let e = check_use(SplitMode::Fused, Work::Threads("parallel"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("parallel trains one model"), "{e}");
        assert_eq!(Work::Threads("parallel").on_the_cpu(), "shared, logical");
    }
}
