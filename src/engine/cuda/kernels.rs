//! The CUDA kernel sources and their NVRTC compilation (placeholder: no kernels in this tree).

use crate::error::EngineError;

/// One `.cu` file of `kernels/` and the functions it defines.
pub struct KernelModule {
    pub name: &'static str,
    pub source: &'static str,
    pub functions: &'static [&'static str],
}

/// The kernel modules (none in this placeholder).
pub const MODULES: &[KernelModule] = &[];

/// A module compiled to PTX.
pub struct CompiledModule {
    pub name: &'static str,
    pub ptx: String,
    pub functions: &'static [&'static str],
}

/// Compiles every module for `arch` (placeholder: always fails).
pub fn compile_all(_arch: Option<(u32, u32)>) -> Result<&'static [CompiledModule], EngineError> {
    Err(EngineError::Device(
        "the CUDA kernels are not built in this tree".into(),
    ))
}

/// One compiled module by name (placeholder: always fails).
pub fn module(name: &str) -> Result<&'static CompiledModule, EngineError> {
    Err(EngineError::Device(format!(
        "kernel module {name} is not built in this tree"
    )))
}
