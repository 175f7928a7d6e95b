//! How the trials of a round share a device (the split modes) and which engine runs them (the backend choice).

use serde::{Deserialize, Serialize};

/// How the trials of a round share the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    /// One process, one context; a stream (a thread on the CPU) per trial; no caps.
    Shared,
    /// One OS process per trial, each with its own context.
    Process,
    /// One process; each slice has a stream and a capped memory pool.
    Logical,
    /// One process; each slice has a green context with its own SM partition (GPU only).
    Green,
    /// `process` under a running MPS daemon (GPU only).
    Mps,
    /// One process; compatible trials train together as one batched model, a fused group per
    /// slice at a time, each slice with a capped memory pool.
    Fused,
}

impl SplitMode {
    pub const ALL: [SplitMode; 6] = [
        SplitMode::Shared,
        SplitMode::Process,
        SplitMode::Logical,
        SplitMode::Green,
        SplitMode::Mps,
        SplitMode::Fused,
    ];
    pub fn name(&self) -> &'static str {
        match self {
            SplitMode::Shared => "shared",
            SplitMode::Process => "process",
            SplitMode::Logical => "logical",
            SplitMode::Green => "green",
            SplitMode::Mps => "mps",
            SplitMode::Fused => "fused",
        }
    }
    /// Whether each slice gets a memory cap (the seed's "split").
    pub fn capped(&self) -> bool {
        matches!(
            self,
            SplitMode::Logical | SplitMode::Green | SplitMode::Mps | SplitMode::Fused
        )
    }
    /// Whether the mode exists only on a GPU.
    pub fn gpu_only(&self) -> bool {
        matches!(self, SplitMode::Green | SplitMode::Mps)
    }
    /// Whether each trial runs in its own OS process.
    pub fn one_process_per_trial(&self) -> bool {
        matches!(self, SplitMode::Process | SplitMode::Mps)
    }
}

impl std::fmt::Display for SplitMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SplitMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        SplitMode::ALL
            .iter()
            .find(|m| m.name() == s)
            .copied()
            .ok_or_else(|| {
                format!(
                    "unknown split mode `{s}` (expected shared, process, logical, green, mps or fused)"
                )
            })
    }
}

/// Which engine runs the trials.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// The GPU when one works, else the CPU (and it says so).
    #[default]
    Auto,
    Cpu,
    Cuda,
}
