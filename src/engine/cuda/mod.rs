//! The CUDA backend: kernels compiled at run time with NVRTC, cuBLAS GEMMs, one stream per trial.
pub mod kernels;
