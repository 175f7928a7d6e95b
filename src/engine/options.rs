//! The engine's own options: the `engine:` section of a job, read by both backends.

use serde::{Deserialize, Serialize};

/// The `engine:` section: how the backend runs a trial. Results do not depend on it beyond
/// floating-point rounding: the order of sums, and for cuDNN convolutions the algorithm cuDNN
/// picks (Winograd and FFT ones round differently from a direct sum, by a few ulp in FP32);
/// `tf32` goes further, rounding GEMM and convolution inputs to 10 mantissa bits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineOptions {
    /// Capture the training step once as a CUDA graph and replay it (GPU; default true).
    pub graphs: bool,
    /// Let cuBLAS use TF32 tensor cores for FP32 GEMMs (GPU; default false).
    pub tf32: bool,
    /// Look at the loss and check it is finite every this many steps, without waiting for the
    /// device (default 50; and at each epoch's end).
    pub check_every: usize,
    /// How the GPU runs convolutions (default `auto`).
    pub conv: ConvEngine,
    /// cuDNN algorithms from its heuristics, deterministic backward ones preferred, so that a
    /// trial repeats bit for bit (default false: the fastest algorithms, measured once per
    /// convolution shape in the process, deterministic or not).
    pub deterministic: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            graphs: true,
            tf32: false,
            check_every: 50,
            conv: ConvEngine::Auto,
            deterministic: false,
        }
    }
}

impl EngineOptions {
    /// These options for a process whose trials train a model with convolutions or not: with
    /// `conv: auto`, a model without any does not load cuDNN (it would cost every process,
    /// `process`-mode workers included, start-up time and memory for nothing).
    pub fn for_model(&self, convolutions: bool) -> EngineOptions {
        let mut opts = self.clone();
        if !convolutions && opts.conv == ConvEngine::Auto {
            opts.conv = ConvEngine::Gemm;
        }
        opts
    }
}

/// `engine.conv`: the GPU's convolutions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConvEngine {
    /// cuDNN when it is installed, else `gemm` (and it says so).
    #[default]
    Auto,
    /// cuDNN (FP32, or TF32 with `tf32: true`); a GPU run fails when it is missing.
    Cudnn,
    /// The backend's own im2col kernels and cuBLAS GEMMs.
    Gemm,
}
