//! The CPU reference ops: plain functions over slices, the twin of every CUDA kernel.
//!
//! Layouts are row-major; images are NCHW. Every function panics only on a broken caller contract
//! (slice too short), which the [`super::CpuBackend`] rules out by checking regions first.

use crate::engine::rng;
use crate::engine::shapes::{Conv2dShape, GemmShape, PoolShape};

/// Row-major `C = alpha·op(A)·op(B) + beta·C` (with `beta == 0`, `C` is overwritten, NaNs included).
pub fn gemm(g: &GemmShape, a: &[f32], b: &[f32], c: &mut [f32]) {
    let _ = (g, a, b, c);
    todo!()
}

/// `y[r, c] += bias[c]`.
pub fn bias_add(y: &mut [f32], bias: &[f32], rows: usize, cols: usize) {
    let _ = (y, bias, rows, cols);
    todo!()
}

/// `db[c] = Σ_r dy[r, c]` (overwrites `db`).
pub fn bias_grad(dy: &[f32], db: &mut [f32], rows: usize, cols: usize) {
    let _ = (dy, db, rows, cols);
    todo!()
}

pub fn relu_fwd(x: &[f32], y: &mut [f32]) {
    let _ = (x, y);
    todo!()
}

/// `dx = dy · [y > 0]`.
pub fn relu_bwd(y: &[f32], dy: &[f32], dx: &mut [f32]) {
    let _ = (y, dy, dx);
    todo!()
}

/// Stride-1 convolution with zero padding: `y[n, co] = b[co] + Σ w[co, ci, :, :] ⋆ x[n, ci]`.
/// `ws` is scratch for one sample's im2col (`s.ws_len()` elements).
pub fn conv2d_fwd(s: &Conv2dShape, x: &[f32], w: &[f32], b: &[f32], y: &mut [f32], ws: &mut [f32]) {
    let _ = (s, x, w, b, y, ws);
    todo!()
}

/// Gradients of [`conv2d_fwd`]: overwrites `dw`, `db`, and `dx` when given.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_bwd(
    s: &Conv2dShape,
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    dx: Option<&mut [f32]>,
    dw: &mut [f32],
    db: &mut [f32],
    ws: &mut [f32],
) {
    let _ = (s, x, w, dy, dx, dw, db, ws);
    todo!()
}

/// Max over each `k×k` window (stride `k`).
pub fn maxpool_fwd(s: &PoolShape, x: &[f32], y: &mut [f32]) {
    let _ = (s, x, y);
    todo!()
}

/// Routes each window's gradient to the first position (row-major in the window) holding its max;
/// overwrites `dx` (zeros elsewhere, including dropped trailing rows/columns).
pub fn maxpool_bwd(s: &PoolShape, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32]) {
    let _ = (s, x, y, dy, dx);
    todo!()
}

/// Whether dropout keeps element `i` for this `(seed, counter)`.
#[inline]
pub fn dropout_keep(p: f32, seed: u64, counter: u64, i: usize) -> bool {
    rng::uniform(seed, counter, i as u64) >= p
}

/// Inverted dropout: `y = x/(1-p)` where kept, else 0. With `p == 0`, `y = x`.
pub fn dropout_fwd(x: &[f32], y: &mut [f32], p: f32, seed: u64, counter: u64) {
    let _ = (x, y, p, seed, counter);
    todo!()
}

/// `dx = dy/(1-p)` where kept, else 0 (the same mask as [`dropout_fwd`]).
pub fn dropout_bwd(dy: &[f32], dx: &mut [f32], p: f32, seed: u64, counter: u64) {
    let _ = (dy, dx, p, seed, counter);
    todo!()
}

/// Softmax cross-entropy with integer labels stored as `f32`. Writes `dlogits = (softmax − onehot)/rows`
/// and returns `(Σ_r loss_r, #rows whose argmax equals the label)`; the argmax takes the first maximum.
pub fn softmax_xent(
    logits: &[f32],
    labels: &[f32],
    dlogits: &mut [f32],
    rows: usize,
    classes: usize,
) -> (f32, f32) {
    let _ = (logits, labels, dlogits, rows, classes);
    todo!()
}

/// The loss sum and correct count of [`softmax_xent`] without the gradient.
pub fn eval_xent(logits: &[f32], labels: &[f32], rows: usize, classes: usize) -> (f32, f32) {
    let _ = (logits, labels, rows, classes);
    todo!()
}

/// PyTorch SGD: `g' = g + wd·w; v = μ·v + g'; w -= lr·v` (with μ = 0, `v` is still written).
pub fn sgd_step(
    w: &mut [f32],
    g: &[f32],
    v: &mut [f32],
    lr: f32,
    momentum: f32,
    weight_decay: f32,
) {
    let _ = (w, g, v, lr, momentum, weight_decay);
    todo!()
}

/// PyTorch Adam (not AdamW): `g' = g + wd·w; m = β1·m + (1-β1)g'; v = β2·v + (1-β2)g'²;
/// w -= lr·(m/(1-β1^t)) / (sqrt(v/(1-β2^t)) + eps)`, with `t` 1-based.
#[allow(clippy::too_many_arguments)]
pub fn adam_step(
    w: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    t: u32,
) {
    let _ = (w, g, m, v, lr, beta1, beta2, eps, weight_decay, t);
    todo!()
}
