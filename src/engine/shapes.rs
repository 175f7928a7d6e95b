//! Shapes of the engine's ops, shared by the CPU twins and the CUDA launchers.

use crate::engine::Region;

/// Row-major GEMM: `C[m×n] = alpha·op(A)[m×k]·op(B)[k×n] + beta·C`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmShape {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub beta: f32,
}

impl GemmShape {
    /// Plain `C = A·B` with no transposes.
    pub fn nn(m: usize, n: usize, k: usize) -> Self {
        GemmShape {
            trans_a: false,
            trans_b: false,
            m,
            n,
            k,
            alpha: 1.0,
            beta: 0.0,
        }
    }
    pub fn a_len(&self) -> usize {
        self.m * self.k
    }
    pub fn b_len(&self) -> usize {
        self.k * self.n
    }
    pub fn c_len(&self) -> usize {
        self.m * self.n
    }
}

/// A batch of `count` GEMMs of one [`GemmShape`] whose operands lie element strides apart:
/// `C_i = alpha·op(A_i)·op(B_i) + beta·C_i` with `X_i = X + i·stride_x`, for `i < count`.
///
/// A stride of 0 shares one operand across the batch (a convolution's weights over its samples,
/// an input batch that every trial of a fused group reads). The outputs must not overlap: with
/// more than one GEMM, `stride_c` is at least `C`'s length (the backend contract checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmBatch {
    pub count: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
}

impl GemmBatch {
    /// A batch of the one GEMM `g`.
    pub fn one(g: &GemmShape) -> GemmBatch {
        GemmBatch {
            count: 1,
            stride_a: g.a_len(),
            stride_b: g.b_len(),
            stride_c: g.c_len(),
        }
    }
    /// Elements from the first operand's start to the last one's end: `(count − 1)·stride + len`
    /// (0 for an empty batch), or `None` when that overflows.
    pub fn span(&self, stride: usize, len: usize) -> Option<usize> {
        match self.count {
            0 => Some(0),
            n => (n - 1).checked_mul(stride)?.checked_add(len),
        }
    }
    /// The span of the `A` operands of `g`.
    pub fn a_span(&self, g: &GemmShape) -> Option<usize> {
        self.span(self.stride_a, g.a_len())
    }
    /// The span of the `B` operands of `g`.
    pub fn b_span(&self, g: &GemmShape) -> Option<usize> {
        self.span(self.stride_b, g.b_len())
    }
    /// The span of the `C` operands of `g`.
    pub fn c_span(&self, g: &GemmShape) -> Option<usize> {
        self.span(self.stride_c, g.c_len())
    }
}

/// A convolution over a fused group of `trials` trials: trial `i`'s input, output and their
/// gradients lie `i` whole copies in (one after another), its weights and bias (and their
/// gradients) `i·w_stride` elements in, and its workspace `i·ws_stride` elements in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedConv {
    pub trials: usize,
    pub w_stride: usize,
    pub ws_stride: usize,
}

impl FusedConv {
    /// Trial `i`'s copy of `len` elements in `r`, copies `stride` elements apart.
    pub fn at(
        r: crate::engine::Region,
        i: usize,
        stride: usize,
        len: usize,
    ) -> crate::engine::Region {
        crate::engine::Region::new(r.offset + i * stride, len)
    }
}

/// A square window slid over a zero-padded plane: `k×k`, moved `stride` positions at a time, with
/// `pad` positions each side. Convolutions and pooling share its arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
}

impl Window {
    /// Windows along an input of `len` positions: `(len + 2·pad − k)/stride + 1` (trailing
    /// positions that fill no window are dropped). Assumes [`Window::fits`].
    pub fn out(&self, len: usize) -> usize {
        (len + 2 * self.pad - self.k) / self.stride.max(1) + 1
    }
    /// Whether the window has a size and a stride and fits an `h × w` input once padded.
    pub fn fits(&self, h: usize, w: usize) -> bool {
        self.k >= 1 && self.stride >= 1 && h + 2 * self.pad >= self.k && w + 2 * self.pad >= self.k
    }
    /// The input position under offset `at` (`0..k`) of window `o`, or `None` in the leading
    /// padding (a position past the input's end is the caller's to drop).
    pub fn input(&self, o: usize, at: usize) -> Option<usize> {
        (o * self.stride.max(1) + at).checked_sub(self.pad)
    }
}

/// A 2-D convolution over NCHW input with square `k×k` kernels, `pad` zeros each side and the
/// same `stride` both ways. Callers check `h + 2·pad ≥ k` (and the same for `w`) first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dShape {
    pub n: usize,
    pub c_in: usize,
    pub h: usize,
    pub w: usize,
    pub c_out: usize,
    pub k: usize,
    pub pad: usize,
    pub stride: usize,
}

impl Conv2dShape {
    /// The kernel's window.
    pub fn window(&self) -> Window {
        Window {
            k: self.k,
            stride: self.stride,
            pad: self.pad,
        }
    }
    pub fn h_out(&self) -> usize {
        self.window().out(self.h)
    }
    pub fn w_out(&self) -> usize {
        self.window().out(self.w)
    }
    /// Whether the input is large enough for one window each way (the other methods assume it).
    pub fn fits(&self) -> bool {
        self.window().fits(self.h, self.w)
    }
    /// A 1×1, stride-1, unpadded convolution: a plain GEMM per sample, with no lowering.
    pub fn is_pointwise(&self) -> bool {
        self.k == 1 && self.stride == 1 && self.pad == 0
    }
    pub fn x_len(&self) -> usize {
        self.n * self.c_in * self.h * self.w
    }
    pub fn y_len(&self) -> usize {
        self.n * self.c_out * self.h_out() * self.w_out()
    }
    pub fn w_len(&self) -> usize {
        self.c_out * self.c_in * self.k * self.k
    }
    /// Elements of the im2col workspace for one sample: `(c_in·k·k) × (h_out·w_out)`, or none for
    /// a pointwise convolution, whose input already is its column matrix.
    pub fn ws_len(&self) -> usize {
        if self.is_pointwise() {
            0
        } else {
            self.c_in * self.k * self.k * self.h_out() * self.w_out()
        }
    }
    /// The same convolution over a different number of samples.
    pub fn with_n(&self, n: usize) -> Self {
        Conv2dShape { n, ..*self }
    }
}

/// Max pooling: window `k×k`, `stride`, and `pad` positions each side that never win (−∞);
/// trailing rows/columns that do not fill a window are dropped. The Keras CNN pools with
/// `stride == k, pad == 0`; ResNet's stem with `k = 3, stride = 2, pad = 1`.
/// Callers check `h + 2·pad ≥ k`, `w + 2·pad ≥ k` and `pad < k` first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolShape {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
}

impl PoolShape {
    /// Non-overlapping `k×k` windows with stride `k`.
    pub fn square(n: usize, c: usize, h: usize, w: usize, k: usize) -> Self {
        PoolShape {
            n,
            c,
            h,
            w,
            k,
            stride: k,
            pad: 0,
        }
    }
    /// The pooling window.
    pub fn window(&self) -> Window {
        Window {
            k: self.k,
            stride: self.stride,
            pad: self.pad,
        }
    }
    pub fn h_out(&self) -> usize {
        self.window().out(self.h)
    }
    pub fn w_out(&self) -> usize {
        self.window().out(self.w)
    }
    /// Whether every window holds at least one real position (the other methods assume it).
    pub fn fits(&self) -> bool {
        self.pad < self.k && self.window().fits(self.h, self.w)
    }
    pub fn x_len(&self) -> usize {
        self.n * self.c * self.h * self.w
    }
    pub fn y_len(&self) -> usize {
        self.n * self.c * self.h_out() * self.w_out()
    }
    pub fn with_n(&self, n: usize) -> Self {
        PoolShape { n, ..*self }
    }
}

/// Per-channel ops over NCHW data seen as `n × c` planes of `hw` elements: batch norm and
/// global average pooling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaneShape {
    pub n: usize,
    pub c: usize,
    pub hw: usize,
}

impl PlaneShape {
    pub fn len(&self) -> usize {
        self.n * self.c * self.hw
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Values each channel's statistics are taken over: `n·hw`.
    pub fn per_channel(&self) -> usize {
        self.n * self.hw
    }
    pub fn with_n(&self, n: usize) -> Self {
        PlaneShape { n, ..*self }
    }
}

/// A batch norm over a fused group of `trials` trials: trial `i`'s input and output (and their
/// gradients) lie `i` whole copies in, its `γ` and `β` (and their gradients) `i·param_stride`
/// elements in, its running statistics `i·running_stride` and its saved ones `i·saved_stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedNorm {
    pub trials: usize,
    pub param_stride: usize,
    pub running_stride: usize,
    pub saved_stride: usize,
}

impl FusedNorm {
    /// Trial `i`'s copy of the plane region `r` (an input, an output or a gradient of them).
    pub fn plane(&self, r: Region, s: &PlaneShape, i: usize) -> Region {
        Region::new(r.offset + i * s.len(), s.len())
    }
    /// Trial `i`'s `γ` or `β` (or its gradient) in `r`.
    pub fn param(&self, r: Region, s: &PlaneShape, i: usize) -> Region {
        Region::new(r.offset + i * self.param_stride, s.c)
    }
    /// Trial `i`'s running statistics in `r`.
    pub fn running(&self, r: Region, s: &PlaneShape, i: usize) -> Region {
        Region::new(r.offset + i * self.running_stride, 2 * s.c)
    }
    /// Trial `i`'s saved statistics in `r`.
    pub fn saved(&self, r: Region, s: &PlaneShape, i: usize) -> Region {
        Region::new(r.offset + i * self.saved_stride, 2 * s.c)
    }
    /// Trial `i`'s copies of a forward pass's `[x, gamma, beta, running, saved, y]`.
    pub fn fwd_trial(&self, s: &PlaneShape, r: [Region; 6], i: usize) -> [Region; 6] {
        let [x, gamma, beta, running, saved, y] = r;
        [
            self.plane(x, s, i),
            self.param(gamma, s, i),
            self.param(beta, s, i),
            self.running(running, s, i),
            self.saved(saved, s, i),
            self.plane(y, s, i),
        ]
    }
    /// Trial `i`'s copies of a backward pass's `[x, gamma, saved, dy, dx, dgamma, dbeta]`.
    pub fn bwd_trial(&self, s: &PlaneShape, r: [Region; 7], i: usize) -> [Region; 7] {
        let [x, gamma, saved, dy, dx, dgamma, dbeta] = r;
        [
            self.plane(x, s, i),
            self.param(gamma, s, i),
            self.saved(saved, s, i),
            self.plane(dy, s, i),
            self.plane(dx, s, i),
            self.param(dgamma, s, i),
            self.param(dbeta, s, i),
        ]
    }
    /// One trial alone.
    pub fn one() -> FusedNorm {
        FusedNorm {
            trials: 1,
            param_stride: 0,
            running_stride: 0,
            saved_stride: 0,
        }
    }
}

/// Batch normalisation's settings (PyTorch's defaults: momentum 0.1, eps 1e-5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BnParams {
    /// Normalise with the batch's statistics and update the running ones; else use the running ones.
    pub train: bool,
    pub momentum: f32,
    pub eps: f32,
}

impl Default for BnParams {
    fn default() -> Self {
        BnParams {
            train: true,
            momentum: 0.1,
            eps: 1e-5,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn convolutions_and_pooling_share_the_window_arithmetic() {
        let w = Window {
            k: 3,
            stride: 2,
            pad: 1,
        };
        assert_eq!((w.out(224), w.out(7), w.out(1)), (112, 4, 1));
        assert!(w.fits(1, 1) && !Window { pad: 0, ..w }.fits(2, 5));
        assert_eq!(
            (w.input(0, 0), w.input(0, 1), w.input(3, 2)),
            (None, Some(0), Some(7))
        );
        let conv = Conv2dShape {
            n: 1,
            c_in: 3,
            h: 224,
            w: 7,
            c_out: 8,
            k: 3,
            pad: 1,
            stride: 2,
        };
        let pool = PoolShape {
            n: 1,
            c: 3,
            h: 224,
            w: 7,
            k: 3,
            stride: 2,
            pad: 1,
        };
        assert_eq!(conv.window(), pool.window());
        assert_eq!((conv.h_out(), conv.w_out()), (pool.h_out(), pool.w_out()));
        // Pooling also needs a real position in every window; a convolution does not.
        let (conv, pool) = (Conv2dShape { pad: 3, ..conv }, PoolShape { pad: 3, ..pool });
        assert!(conv.fits() && !pool.fits());
    }
}
