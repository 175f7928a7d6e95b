//! The CUDA backend: one engine per process (device, primary context, kernels) and one backend per trial (stream, capped pool, cuBLAS, cuDNN, arena).
//!
//! Everything goes through the raw driver and cuBLAS bindings of cudarc, loaded at run time, so
//! the crate builds and its tests run where there is no GPU: [`available`] then says why not.
//!
//! Per trial: a stream in its slice's context (a green context on its own SMs, or the primary
//! context), a memory pool of its own capped at the slice's memory (`maxSize`), cuBLAS and cuDNN
//! handles on the stream, and one allocation from the pool holding the cuBLAS workspace, the arena
//! of the static memory plan, and the epoch's order. Convolutions run on cuDNN (or, without it, as
//! im2col kernels and GEMMs over the whole batch), with the workspace that
//! [`Backend::conv_workspace_len`](crate::engine::Backend) reports inside the plan.

mod backend;
mod blas;
mod bound;
mod capture_hold;
mod context;
mod conv;
mod conv_group;
mod conv_launch;
mod conv_shapes;
mod cudnn;
mod cudnn_desc;
mod cudnn_probe;
mod data;
mod device;
mod engine;
mod entered;
mod graph;
mod green;
pub mod kernels;
mod launch;
mod mem_pool;
mod norm_launch;
mod ops;
pub mod signature;
mod staging;
mod status;
mod step_launch;
mod stream;

pub use backend::CudaBackend;
pub use capture_hold::{holds_taken, CaptureHold};
pub use data::DeviceData;
pub use device::{
    available, choose_module_loading, describe_all, module_loading, CudaDeviceInfo, GreenCaps,
    MODULE_LOADING,
};
pub use engine::CudaEngine;
pub use green::GreenPartition;
