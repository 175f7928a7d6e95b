//! Convolutions over the whole batch: cuDNN, or im2col and layout kernels around cuBLAS GEMMs, in a workspace of the plan.

use cudarc::driver::sys;

use super::backend::CudaBackend;
use super::blas::Lds;
use super::conv_group::{self, Lowering};
use super::conv_shapes::{col_len, workspace_len, BwdPtrs, FwdPtrs};
use super::entered::Entered;
use super::launch::{Arg, MAX_BLOCKS};
use super::status::to_u32;
use crate::engine::{Conv2dShape, FusedConv, GemmBatch, GemmShape};
use crate::error::EngineError;

/// Threads of a `channel_sum` block (kernels/conv.cu's CHANNEL_SUM_THREADS).
const CHANNEL_SUM_THREADS: u32 = 128;

/// The convolution's sizes as the kernels take them.
struct Dims {
    n: u32,
    c_in: u32,
    h: u32,
    w: u32,
    k: u32,
    pad: u32,
    stride: u32,
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
        if !s.fits() {
            return Err(EngineError::Shape {
                op,
                message: format!(
                    "a {}×{} kernel with stride {} and padding {} does not fit a {}×{} input",
                    s.k, s.k, s.stride, s.pad, s.h, s.w
                ),
            });
        }
        let u = |what, v| to_u32(op, what, v);
        // Every element count a kernel walks must fit its 32-bit sizes too (the im2col
        // workspace is checked by `lowered`, on the GEMM path only).
        u("input elements", s.x_len())?;
        u("output elements", s.y_len())?;
        Ok(Dims {
            n: u("n", s.n)?,
            c_in: u("c_in", s.c_in)?,
            h: u("h", s.h)?,
            w: u("w", s.w)?,
            k: u("k", s.k)?,
            pad: u("pad", s.pad)?,
            stride: u("stride", s.stride)?,
            h_out: u("h_out", s.h_out())?,
            w_out: u("w_out", s.w_out())?,
            c_out: u("c_out", s.c_out)?,
            nhw: s.n * s.h_out() * s.w_out(),
            kk: s.c_in * s.k * s.k,
        })
    }

    /// Checks that the GEMM lowering's workspace fits the kernels' 32-bit sizes (cuDNN has none).
    fn lowered(self, op: &'static str, s: &Conv2dShape) -> Result<Dims, EngineError> {
        to_u32(op, "im2col elements", workspace_len(s))?;
        Ok(self)
    }

    /// The size arguments shared by `im2col` and `col2im`.
    fn lowering(&self) -> [Arg; 9] {
        [
            Arg::U32(self.n),
            Arg::U32(self.c_in),
            Arg::U32(self.h),
            Arg::U32(self.w),
            Arg::U32(self.k),
            Arg::U32(self.pad),
            Arg::U32(self.stride),
            Arg::U32(self.h_out),
            Arg::U32(self.w_out),
        ]
    }

    fn hw_out(&self) -> u32 {
        self.h_out * self.w_out
    }
}

/// `p` moved `elems` elements on.
fn on(p: sys::CUdeviceptr, elems: usize) -> sys::CUdeviceptr {
    p + (elems as u64) * 4
}

impl FwdPtrs {
    /// Trial `i`'s operands of a fused convolution whose trial 0 is `self`.
    pub(crate) fn trial(&self, i: usize, s: &Conv2dShape, f: FusedConv) -> FwdPtrs {
        FwdPtrs {
            x: on(self.x, i * s.x_len()),
            w: on(self.w, i * f.w_stride),
            b: self.b.map(|b| on(b, i * f.w_stride)),
            y: on(self.y, i * s.y_len()),
            ws: on(self.ws, i * f.ws_stride),
            ws_bytes: self.ws_bytes,
        }
    }
}

impl BwdPtrs {
    /// Trial `i`'s operands of a fused convolution whose trial 0 is `self`.
    pub(crate) fn trial(&self, i: usize, s: &Conv2dShape, f: FusedConv) -> BwdPtrs {
        BwdPtrs {
            x: on(self.x, i * s.x_len()),
            w: on(self.w, i * f.w_stride),
            dy: on(self.dy, i * s.y_len()),
            dx: self.dx.map(|dx| on(dx, i * s.x_len())),
            dw: on(self.dw, i * f.w_stride),
            db: self.db.map(|db| on(db, i * f.w_stride)),
            ws: on(self.ws, i * f.ws_stride),
            ws_bytes: self.ws_bytes,
        }
    }
}

/// The two parts of the workspace.
fn split_ws(s: &Conv2dShape, ws: sys::CUdeviceptr) -> (sys::CUdeviceptr, sys::CUdeviceptr) {
    (ws, ws + (col_len(s) as u64) * 4)
}

/// A null pointer argument: "no bias" to `cnhw_to_nchw_bias`.
const NO_BIAS: sys::CUdeviceptr = 0;

impl CudaBackend {
    /// Elements of workspace a convolution of shape `s` needs: cuDNN's for its chosen algorithms
    /// (chosen here, at planning time), else the GEMM lowering's. Should cuDNN fail to plan the
    /// shape, that shape is lowered to GEMMs from then on (said once), and sized so.
    pub(crate) fn conv_workspace(&self, s: &Conv2dShape) -> usize {
        let Some(dnn) = self.dnn_for(s) else {
            return workspace_len(s);
        };
        // Measuring a shape's algorithms synchronises the device: with every capture of the
        // process held off, taken before the context is entered.
        let _hold = dnn.needs_measuring(s).then(super::capture_hold::hold);
        let bytes = self.ctx.enter().and_then(|e| dnn.workspace_bytes(&e, s));
        match bytes {
            Ok(b) => b.div_ceil(4),
            Err(e) => {
                super::engine::say_once(&format!(
                    "note: cuDNN cannot plan the convolution {s:?} ({e}); it runs as im2col and GEMMs"
                ));
                self.lowered
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(*s);
                workspace_len(s)
            }
        }
    }

    /// cuDNN for the convolution `s`, unless there is none or it could not plan `s`.
    pub(crate) fn dnn_for(&self, s: &Conv2dShape) -> Option<&super::cudnn::Dnn> {
        let lowered = self
            .lowered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.dnn.as_ref().filter(|_| !lowered.contains(s))
    }

    fn im2col(&self, e: &Entered, d: &Dims, x: u64, col: u64) -> Result<(), EngineError> {
        let mut args = vec![Arg::Ptr(x), Arg::Ptr(col)];
        args.extend(d.lowering());
        self.elementwise(e, "im2col", d.kk * d.nhw, &args)
    }

    /// `y[b][c][j] += bias[c]` over NCHW output.
    fn channel_bias(&self, e: &Entered, d: &Dims, y: u64, b: u64) -> Result<(), EngineError> {
        let args = [
            Arg::Ptr(y),
            Arg::Ptr(b),
            Arg::U32(d.n),
            Arg::U32(d.c_out),
            Arg::U32(d.hw_out()),
        ];
        self.elementwise(e, "channel_bias", d.nhw * d.c_out as usize, &args)
    }

    /// `y = conv(x, w) (+ b)`: cuDNN's forward convolution, or the GEMM lowering.
    pub(crate) fn conv_fwd(
        &self,
        e: &Entered,
        s: &Conv2dShape,
        p: &FwdPtrs,
    ) -> Result<(), EngineError> {
        let d = Dims::new("conv2d_fwd", s)?;
        if let Some(dnn) = self.dnn_for(s) {
            dnn.forward(e, s, p.x, p.w, p.y, p.ws, p.ws_bytes)?;
            return match p.b {
                Some(b) => self.channel_bias(e, &d, p.y, b),
                None => Ok(()),
            };
        }
        let d = d.lowered("conv2d_fwd", s)?;
        if s.is_pointwise() {
            // Per sample, Y_b[c_out × hw] = W[c_out × c_in] · X_b[c_in × hw], straight into NCHW.
            let hw = s.h * s.w;
            let batch = GemmBatch {
                count: s.n,
                stride_a: 0,
                stride_b: s.c_in * hw,
                stride_c: s.c_out * hw,
            };
            let g = GemmShape::nn(s.c_out, hw, s.c_in);
            self.blas.gemm_batched(e, &g, batch, p.w, p.x, p.y)?;
            return match p.b {
                Some(b) => self.channel_bias(e, &d, p.y, b),
                None => Ok(()),
            };
        }
        // im2col, Y' = W·col into the workspace, then back to NCHW with the bias.
        let (col, yt) = split_ws(s, p.ws);
        self.im2col(e, &d, p.x, col)?;
        self.blas
            .gemm(e, &GemmShape::nn(s.c_out, d.nhw, d.kk), p.w, col, yt)?;
        let args = [
            Arg::Ptr(yt),
            Arg::Ptr(p.b.unwrap_or(NO_BIAS)),
            Arg::Ptr(p.y),
            Arg::U32(d.n),
            Arg::U32(d.c_out),
            Arg::U32(d.hw_out()),
        ];
        self.elementwise(e, "cnhw_to_nchw_bias", s.y_len(), &args)
    }

    /// `db[c] = Σ_b Σ_j dy[b][c][j]` over NCHW `dy`, in the CPU twin's order (each sample's plane,
    /// then the samples): one block per channel, a thread per sample.
    fn bias_grad(
        &self,
        e: &Entered,
        d: &Dims,
        dy: sys::CUdeviceptr,
        db: sys::CUdeviceptr,
    ) -> Result<(), EngineError> {
        let args = [
            Arg::Ptr(dy),
            Arg::Ptr(db),
            Arg::U32(d.n),
            Arg::U32(d.c_out),
            Arg::U32(d.hw_out()),
        ];
        let blocks = d.c_out.clamp(1, MAX_BLOCKS);
        self.kernel(e, "channel_sum", (blocks, CHANNEL_SUM_THREADS), &args)
    }

    /// Gradients: `db` (when wanted) by per-channel sums; `dw` and `dx` (when wanted) by cuDNN's
    /// backward-filter and backward-data, or by the GEMM lowering: `dY'` channel-major,
    /// `dW = dY'·colᵀ`, and `dcol = Wᵀ·dY'` (into the im2col buffer, free once `dW` is issued)
    /// folded back by col2im; a pointwise convolution's `dx` is a batch of GEMMs straight into
    /// NCHW, its `col` the input made channel-major.
    pub(crate) fn conv_bwd(
        &self,
        e: &Entered,
        s: &Conv2dShape,
        p: &BwdPtrs,
    ) -> Result<(), EngineError> {
        let d = Dims::new("conv2d_bwd", s)?;
        if let Some(dnn) = self.dnn_for(s) {
            if let Some(db) = p.db {
                self.bias_grad(e, &d, p.dy, db)?;
            }
            dnn.backward_filter(e, s, p.x, p.dy, p.dw, p.ws, p.ws_bytes)?;
            if let Some(dx) = p.dx {
                dnn.backward_data(e, s, p.w, p.dy, dx, p.ws, p.ws_bytes)?;
            }
            return Ok(());
        }
        let d = d.lowered("conv2d_bwd", s)?;
        let (col, dyt) = split_ws(s, p.ws);
        let to_cnhw = [
            Arg::Ptr(p.dy),
            Arg::Ptr(dyt),
            Arg::U32(d.n),
            Arg::U32(d.c_out),
            Arg::U32(d.hw_out()),
        ];
        self.elementwise(e, "nchw_to_cnhw", s.y_len(), &to_cnhw)?;
        if let Some(db) = p.db {
            self.bias_grad(e, &d, p.dy, db)?;
        }
        if s.is_pointwise() {
            let x_cnhw = [
                Arg::Ptr(p.x),
                Arg::Ptr(col),
                Arg::U32(d.n),
                Arg::U32(d.c_in),
                Arg::U32(d.h * d.w),
            ];
            self.elementwise(e, "nchw_to_cnhw", s.x_len(), &x_cnhw)?;
        } else {
            self.im2col(e, &d, p.x, col)?;
        }
        let gw = GemmShape {
            trans_b: true,
            ..GemmShape::nn(s.c_out, d.kk, d.nhw)
        };
        self.blas.gemm(e, &gw, dyt, col, p.dw)?;
        let Some(dx) = p.dx else { return Ok(()) };
        if s.is_pointwise() {
            // Per sample, dX_b[c_in × hw] = Wᵀ · dY_b[c_out × hw], from dy as it is (NCHW).
            let hw = s.h * s.w;
            let batch = GemmBatch {
                count: s.n,
                stride_a: 0,
                stride_b: s.c_out * hw,
                stride_c: s.c_in * hw,
            };
            let g = GemmShape {
                trans_a: true,
                ..GemmShape::nn(s.c_in, hw, s.c_out)
            };
            return self.blas.gemm_batched(e, &g, batch, p.w, p.dy, dx);
        }
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

impl CudaBackend {
    /// Whether a fused group of `f` runs convolution `s` as one lowering over all its trials
    /// ([`conv_group`]): where it fits, unless `engine.conv: cudnn` asked for cuDNN and cuDNN
    /// planned the shape.
    pub(crate) fn groups_conv(&self, s: &Conv2dShape, f: FusedConv) -> bool {
        conv_group::fits(s, f) && (self.group_convs || self.dnn_for(s).is_none())
    }

    /// [`CudaBackend::conv_fwd`] over a fused group whose trial 0's operands are `p` (each trial's
    /// workspace `f.ws_stride` elements apart): one lowering over the group
    /// ([`conv_group::forward`]), or trial by trial.
    pub(crate) fn conv_fwd_fused(
        &self,
        e: &Entered,
        s: &Conv2dShape,
        p: &FwdPtrs,
        f: FusedConv,
    ) -> Result<(), EngineError> {
        if self.groups_conv(s, f) {
            return conv_group::forward(&mut Launcher { be: self, e }, s, p, f);
        }
        for i in 0..f.trials {
            self.conv_fwd(e, s, &p.trial(i, s, f))?;
        }
        Ok(())
    }

    /// [`CudaBackend::conv_bwd`] over a fused group laid out as in
    /// [`CudaBackend::conv_fwd_fused`]: one lowering over the group ([`conv_group::backward`]),
    /// or trial by trial.
    pub(crate) fn conv_bwd_fused(
        &self,
        e: &Entered,
        s: &Conv2dShape,
        p: &BwdPtrs,
        f: FusedConv,
    ) -> Result<(), EngineError> {
        if self.groups_conv(s, f) {
            return conv_group::backward(&mut Launcher { be: self, e }, s, p, f);
        }
        for i in 0..f.trials {
            self.conv_bwd(e, s, &p.trial(i, s, f))?;
        }
        Ok(())
    }
}

/// The group lowering's launches on a backend's stream.
struct Launcher<'a, 'e> {
    be: &'a CudaBackend,
    e: &'a Entered<'e>,
}

/// The op name the group lowering's errors carry.
const GROUP_OP: &str = "conv2d_fused";

impl Lowering for Launcher<'_, '_> {
    fn im2col(&mut self, s: &Conv2dShape, x: u64, col: u64) -> Result<(), EngineError> {
        let d = Dims::new(GROUP_OP, s)?;
        self.be.im2col(self.e, &d, x, col)
    }

    fn col2im(&mut self, s: &Conv2dShape, col: u64, dx: u64) -> Result<(), EngineError> {
        let d = Dims::new(GROUP_OP, s)?;
        let mut args = vec![Arg::Ptr(col), Arg::Ptr(dx)];
        args.extend(d.lowering());
        self.be.elementwise(self.e, "col2im", s.x_len(), &args)
    }

    fn to_cnhw(
        &mut self,
        n: usize,
        c: usize,
        hw: usize,
        src: u64,
        dst: u64,
    ) -> Result<(), EngineError> {
        let u = |what, v| to_u32(GROUP_OP, what, v);
        let args = [
            Arg::Ptr(src),
            Arg::Ptr(dst),
            Arg::U32(u("n", n)?),
            Arg::U32(u("c", c)?),
            Arg::U32(u("hw", hw)?),
        ];
        self.be
            .elementwise(self.e, "nchw_to_cnhw", n * c * hw, &args)
    }

    fn to_nchw(
        &mut self,
        trials: usize,
        n: usize,
        c: usize,
        hw: usize,
        src: u64,
        bias: Option<u64>,
        bias_stride: usize,
        dst: u64,
    ) -> Result<(), EngineError> {
        let u = |what, v| to_u32(GROUP_OP, what, v);
        let args = [
            Arg::Ptr(src),
            Arg::Ptr(bias.unwrap_or(NO_BIAS)),
            Arg::Ptr(dst),
            Arg::U32(u("trials", trials)?),
            Arg::U64(bias_stride as u64),
            Arg::U32(u("n", n)?),
            Arg::U32(u("c", c)?),
            Arg::U32(u("hw", hw)?),
        ];
        let len = trials * n * c * hw;
        self.be
            .elementwise(self.e, "cnhw_to_nchw_bias_fused", len, &args)
    }

    fn channel_sums(
        &mut self,
        trials: usize,
        n: usize,
        c: usize,
        hw: usize,
        dy: u64,
        db: u64,
        db_stride: usize,
    ) -> Result<(), EngineError> {
        let u = |what, v| to_u32(GROUP_OP, what, v);
        let args = [
            Arg::Ptr(dy),
            Arg::Ptr(db),
            Arg::U32(u("trials", trials)?),
            Arg::U64(db_stride as u64),
            Arg::U32(u("n", n)?),
            Arg::U32(u("c", c)?),
            Arg::U32(u("hw", hw)?),
        ];
        let blocks = (c * trials).clamp(1, MAX_BLOCKS as usize) as u32;
        self.be.kernel(
            self.e,
            "channel_sum_fused",
            (blocks, CHANNEL_SUM_THREADS),
            &args,
        )
    }

    fn gemm(
        &mut self,
        g: &GemmShape,
        ld: Lds,
        batch: GemmBatch,
        a: u64,
        b: u64,
        c: u64,
    ) -> Result<(), EngineError> {
        self.be.blas.gemm_strided(self.e, g, ld, batch, a, b, c)
    }

    fn split_sum(
        &mut self,
        trials: usize,
        splits: usize,
        len: usize,
        part: u64,
        dst: u64,
        dst_stride: usize,
    ) -> Result<(), EngineError> {
        let u = |what, v| to_u32(GROUP_OP, what, v);
        let args = [
            Arg::Ptr(part),
            Arg::Ptr(dst),
            Arg::U32(u("trials", trials)?),
            Arg::U32(u("splits", splits)?),
            Arg::U32(u("len", len)?),
            Arg::U64(dst_stride as u64),
        ];
        self.be
            .elementwise(self.e, "split_k_sum", trials * len, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cuda::conv_shapes::cnhw_len;

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
