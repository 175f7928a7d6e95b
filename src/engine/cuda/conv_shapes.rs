//! The sizes and operands of a convolution on the device, shared by the per-trial convolution (`conv.rs`) and a fused group's lowering (`conv_group.rs`).

use cudarc::driver::sys;

use crate::engine::Conv2dShape;

/// Elements of the im2col matrix: `(c_in·k·k) × (n·h_out·w_out)`.
pub(crate) fn col_len(s: &Conv2dShape) -> usize {
    s.c_in * s.k * s.k * s.n * s.h_out() * s.w_out()
}

/// Elements of the output (or its gradient) laid out channel-major: `c_out × (n·h_out·w_out)`.
pub(crate) fn cnhw_len(s: &Conv2dShape) -> usize {
    s.c_out * s.n * s.h_out() * s.w_out()
}

/// Workspace of a batched convolution: the im2col matrix, then the channel-major output.
pub(crate) fn workspace_len(s: &Conv2dShape) -> usize {
    col_len(s) + cnhw_len(s)
}

/// Device addresses of a forward convolution's operands; `ws_bytes` of workspace at `ws`.
pub(crate) struct FwdPtrs {
    pub x: sys::CUdeviceptr,
    pub w: sys::CUdeviceptr,
    pub b: Option<sys::CUdeviceptr>,
    pub y: sys::CUdeviceptr,
    pub ws: sys::CUdeviceptr,
    pub ws_bytes: usize,
}

/// Device addresses of a backward convolution's operands (`dx` and `db` only when wanted).
pub(crate) struct BwdPtrs {
    pub x: sys::CUdeviceptr,
    pub w: sys::CUdeviceptr,
    pub dy: sys::CUdeviceptr,
    pub dx: Option<sys::CUdeviceptr>,
    pub dw: sys::CUdeviceptr,
    pub db: Option<sys::CUdeviceptr>,
    pub ws: sys::CUdeviceptr,
    pub ws_bytes: usize,
}
