//! Convolutions over the whole batch: im2col and layout kernels around cuBLAS GEMMs, in a workspace of the plan.

use cudarc::driver::sys;

use super::backend::CudaBackend;
use super::check::to_u32;
use super::context::Entered;
use super::launch::{grid_for, Arg, BLOCK};
use crate::engine::{Conv2dShape, GemmShape};
use crate::error::EngineError;

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

/// The convolution's sizes as the kernels take them.
struct Dims {
    n: u32,
    c_in: u32,
    h: u32,
    w: u32,
    k: u32,
    pad: u32,
    h_out: u32,
    w_out: u32,
    c_out: u32,
    /// Output pixels per channel over the batch: `n·h_out·w_out`.
    nhw: usize,
    /// Rows of the im2col matrix: `c_in·k·k`.
    kk: usize,
}

impl Dims {
    fn new(op: &'static str, s: &Conv2dShape) -> Result<Dims, EngineError> {
        let u = |what, v| to_u32(op, what, v);
        // Every element count a kernel walks must fit its 32-bit sizes too.
        u("im2col elements", workspace_len(s))?;
        u("input elements", s.x_len())?;
        Ok(Dims {
            n: u("n", s.n)?,
            c_in: u("c_in", s.c_in)?,
            h: u("h", s.h)?,
            w: u("w", s.w)?,
            k: u("k", s.k)?,
            pad: u("pad", s.pad)?,
            h_out: u("h_out", s.h_out())?,
            w_out: u("w_out", s.w_out())?,
            c_out: u("c_out", s.c_out)?,
            nhw: s.n * s.h_out() * s.w_out(),
            kk: s.c_in * s.k * s.k,
        })
    }

    /// The size arguments shared by `im2col` and `col2im`.
    fn lowering(&self) -> [Arg; 8] {
        [
            Arg::U32(self.n),
            Arg::U32(self.c_in),
            Arg::U32(self.h),
            Arg::U32(self.w),
            Arg::U32(self.k),
            Arg::U32(self.pad),
            Arg::U32(self.h_out),
            Arg::U32(self.w_out),
        ]
    }

    fn hw_out(&self) -> u32 {
        self.h_out * self.w_out
    }
}

/// Device addresses of a forward convolution's operands.
pub(crate) struct FwdPtrs {
    pub x: sys::CUdeviceptr,
    pub w: sys::CUdeviceptr,
    pub b: sys::CUdeviceptr,
    pub y: sys::CUdeviceptr,
    pub ws: sys::CUdeviceptr,
}

/// Device addresses of a backward convolution's operands (`dx` only when wanted).
pub(crate) struct BwdPtrs {
    pub x: sys::CUdeviceptr,
    pub w: sys::CUdeviceptr,
    pub dy: sys::CUdeviceptr,
    pub dx: Option<sys::CUdeviceptr>,
    pub dw: sys::CUdeviceptr,
    pub db: sys::CUdeviceptr,
    pub ws: sys::CUdeviceptr,
}

/// The two parts of the workspace.
fn split_ws(s: &Conv2dShape, ws: sys::CUdeviceptr) -> (sys::CUdeviceptr, sys::CUdeviceptr) {
    (ws, ws + (col_len(s) as u64) * 4)
}

impl CudaBackend {
    fn im2col(&self, e: &Entered, d: &Dims, x: u64, col: u64) -> Result<(), EngineError> {
        let mut args = vec![Arg::Ptr(x), Arg::Ptr(col)];
        args.extend(d.lowering());
        self.elementwise(e, "im2col", d.kk * d.nhw, &args)
    }

    /// `y = conv(x, w) + b`: im2col, `Y' = W·col` into the workspace, then back to NCHW with the bias.
    pub(crate) fn conv_fwd(
        &self,
        e: &Entered,
        s: &Conv2dShape,
        p: &FwdPtrs,
    ) -> Result<(), EngineError> {
        let d = Dims::new("conv2d_fwd", s)?;
        let (col, yt) = split_ws(s, p.ws);
        self.im2col(e, &d, p.x, col)?;
        self.blas
            .gemm(e, &GemmShape::nn(s.c_out, d.nhw, d.kk), p.w, col, yt)?;
        let args = [
            Arg::Ptr(yt),
            Arg::Ptr(p.b),
            Arg::Ptr(p.y),
            Arg::U32(d.n),
            Arg::U32(d.c_out),
            Arg::U32(d.hw_out()),
        ];
        self.elementwise(e, "cnhw_to_nchw_bias", s.y_len(), &args)
    }

    /// Gradients: `dY'` channel-major, `db = row sums of dY'`, `dW = dY'·colᵀ`, and when `dx` is
    /// wanted `dcol = Wᵀ·dY'` (into the im2col buffer, free once `dW` is issued) folded back
    /// by col2im.
    pub(crate) fn conv_bwd(
        &self,
        e: &Entered,
        s: &Conv2dShape,
        p: &BwdPtrs,
    ) -> Result<(), EngineError> {
        let d = Dims::new("conv2d_bwd", s)?;
        let (col, dyt) = split_ws(s, p.ws);
        let to_cnhw = [
            Arg::Ptr(p.dy),
            Arg::Ptr(dyt),
            Arg::U32(d.n),
            Arg::U32(d.c_out),
            Arg::U32(d.hw_out()),
        ];
        self.elementwise(e, "nchw_to_cnhw", s.y_len(), &to_cnhw)?;
        let nhw = to_u32("conv2d_bwd", "n·h_out·w_out", d.nhw)?;
        let sums = [
            Arg::Ptr(dyt),
            Arg::Ptr(p.db),
            Arg::U32(d.c_out),
            Arg::U32(nhw),
        ];
        self.kernel(e, "row_sum", (grid_for(s.c_out), BLOCK), &sums)?;
        self.im2col(e, &d, p.x, col)?;
        let gw = GemmShape {
            trans_b: true,
            ..GemmShape::nn(s.c_out, d.kk, d.nhw)
        };
        self.blas.gemm(e, &gw, dyt, col, p.dw)?;
        let Some(dx) = p.dx else { return Ok(()) };
        let gx = GemmShape {
            trans_a: true,
            ..GemmShape::nn(d.kk, d.nhw, s.c_out)
        };
        self.blas.gemm(e, &gx, p.w, dyt, col)?;
        let mut args = vec![Arg::Ptr(col), Arg::Ptr(dx)];
        args.extend(d.lowering());
        self.elementwise(e, "col2im", s.x_len(), &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batched_workspace_holds_im2col_and_the_channel_major_output() {
        // MNIST's first CNN layer: 1→32 channels, 3×3 valid, batch 64: 26×26 outputs.
        let s = Conv2dShape {
            n: 64,
            c_in: 1,
            h: 28,
            w: 28,
            c_out: 32,
            k: 3,
            pad: 0,
            stride: 1,
        };
        assert_eq!(col_len(&s), 9 * 64 * 26 * 26);
        assert_eq!(cnhw_len(&s), 32 * 64 * 26 * 26);
        assert_eq!(workspace_len(&s), 9 * 64 * 676 + 32 * 64 * 676);
        assert_eq!(cnhw_len(&s), s.y_len());
        // Same padding keeps the size; the workspace is the CPU's per-sample one times the batch,
        // plus the output.
        let same = Conv2dShape { k: 5, pad: 2, ..s };
        assert_eq!(col_len(&same), 25 * 64 * 28 * 28);
        assert_eq!(col_len(&same), same.ws_len() * same.n);
        assert_eq!(workspace_len(&same), col_len(&same) + same.y_len());
    }

    #[test]
    fn the_workspace_parts_do_not_overlap() {
        let s = Conv2dShape {
            n: 2,
            c_in: 3,
            h: 5,
            w: 5,
            c_out: 4,
            k: 3,
            pad: 1,
            stride: 1,
        };
        let (col, yt) = split_ws(&s, 0x1000);
        assert_eq!(col, 0x1000);
        assert_eq!(yt, 0x1000 + 4 * col_len(&s) as u64);
    }
}
