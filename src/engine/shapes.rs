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

/// A stride-1 2-D convolution over NCHW input with square `k×k` kernels and `pad` zeros each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dShape {
    pub n: usize,
    pub c_in: usize,
    pub h: usize,
    pub w: usize,
    pub c_out: usize,
    pub k: usize,
    pub pad: usize,
}

impl Conv2dShape {
    pub fn h_out(&self) -> usize {
        self.h + 2 * self.pad + 1 - self.k
    }
    pub fn w_out(&self) -> usize {
        self.w + 2 * self.pad + 1 - self.k
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
    /// Elements of the im2col workspace for one sample: `(c_in·k·k) × (h_out·w_out)`.
    pub fn ws_len(&self) -> usize {
        self.c_in * self.k * self.k * self.h_out() * self.w_out()
    }
    /// The same convolution over a different number of samples.
    pub fn with_n(&self, n: usize) -> Self {
        Conv2dShape { n, ..*self }
    }
}

/// Non-overlapping max pooling: window `k×k`, stride `k`; trailing rows/columns that do not fill a window are dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolShape {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
}

impl PoolShape {
    pub fn h_out(&self) -> usize {
        self.h / self.k
    }
    pub fn w_out(&self) -> usize {
        self.w / self.k
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
