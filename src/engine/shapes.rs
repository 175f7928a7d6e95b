//! Shapes of the engine's ops, shared by the CPU twins and the CUDA launchers.

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
    pub fn h_out(&self) -> usize {
        (self.h + 2 * self.pad - self.k) / self.stride.max(1) + 1
    }
    pub fn w_out(&self) -> usize {
        (self.w + 2 * self.pad - self.k) / self.stride.max(1) + 1
    }
    /// Whether the input is large enough for one window each way (the other methods assume it).
    pub fn fits(&self) -> bool {
        self.k >= 1
            && self.stride >= 1
            && self.h + 2 * self.pad >= self.k
            && self.w + 2 * self.pad >= self.k
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
    pub fn h_out(&self) -> usize {
        (self.h + 2 * self.pad - self.k) / self.stride.max(1) + 1
    }
    pub fn w_out(&self) -> usize {
        (self.w + 2 * self.pad - self.k) / self.stride.max(1) + 1
    }
    /// Whether every window holds at least one real position (the other methods assume it).
    pub fn fits(&self) -> bool {
        self.k >= 1
            && self.stride >= 1
            && self.pad < self.k
            && self.h + 2 * self.pad >= self.k
            && self.w + 2 * self.pad >= self.k
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
