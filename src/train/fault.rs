//! Faults injected into a trial on purpose (a panic, a NaN, an abort, a kill), to test that one trial's failure stays its own.

use serde::{Deserialize, Serialize};

/// A fault injected into one trial, to test isolation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// The trial index (0-based) that faults, in every round that runs it.
    pub trial: u32,
    pub kind: FaultKind,
    /// The training step at which it strikes (default 0).
    #[serde(default)]
    pub step: u32,
}

/// What an injected fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultKind {
    /// Panics in the trial's thread.
    Panic,
    /// Poisons the weights so the loss becomes NaN.
    Nan,
    /// Aborts the whole process (isolated only in `process` mode).
    Abort,
    /// The process kills itself with SIGKILL (isolated only in `process` mode).
    Kill,
}
