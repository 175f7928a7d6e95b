//! The CPU reference ops: plain functions over slices, the twin of every CUDA kernel.
//!
//! Layouts are row-major; images are NCHW. Every function panics only on a broken caller contract
//! (slice too short), which the [`super::CpuBackend`] rules out by checking regions first.

use super::im2col::{col2im, im2col};
use crate::engine::shapes::{BnParams, Conv2dShape, GemmShape, PlaneShape, PoolShape};
use crate::rng;

/// Row-major `C = alpha·op(A)·op(B) + beta·C` (with `beta == 0`, `C` is overwritten, NaNs included).
pub fn gemm(g: &GemmShape, a: &[f32], b: &[f32], c: &mut [f32]) {
    let (m, n, k) = (g.m, g.n, g.k);
    let (a, b, c) = (&a[..g.a_len()], &b[..g.b_len()], &mut c[..g.c_len()]);
    // Element (i, j) of op(X) sits at i·rs + j·cs; a transposed operand is stored the other way round.
    let (rsa, csa) = if g.trans_a { (1, m) } else { (k, 1) };
    let (rsb, csb) = if g.trans_b { (1, k) } else { (n, 1) };
    // SAFETY: the slices above hold exactly m·k, k·n and m·n elements, and with these strides every
    // index i·rs + j·cs (i, j within the operand's bounds) is below that length; C's strides
    // (n, 1) address distinct elements. matrixmultiply does not read C when beta == 0 and
    // computes C = beta·C when m, n or k is 0.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            g.alpha,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            g.beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// `y[r, c] += bias[c]`.
pub fn bias_add(y: &mut [f32], bias: &[f32], rows: usize, cols: usize) {
    let bias = &bias[..cols];
    for r in 0..rows {
        for (v, &b) in y[r * cols..(r + 1) * cols].iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// `db[c] = Σ_r dy[r, c]` (overwrites `db`).
pub fn bias_grad(dy: &[f32], db: &mut [f32], rows: usize, cols: usize) {
    let db = &mut db[..cols];
    db.fill(0.0);
    for r in 0..rows {
        for (d, &g) in db.iter_mut().zip(&dy[r * cols..(r + 1) * cols]) {
            *d += g;
        }
    }
}

/// `y = max(x, 0)` over `y.len()` elements.
pub fn relu_fwd(x: &[f32], y: &mut [f32]) {
    let x = &x[..y.len()];
    for (y, &x) in y.iter_mut().zip(x) {
        *y = x.max(0.0);
    }
}

/// `dx = dy · [y > 0]`.
pub fn relu_bwd(y: &[f32], dy: &[f32], dx: &mut [f32]) {
    let (y, dy) = (&y[..dx.len()], &dy[..dx.len()]);
    for ((d, &y), &g) in dx.iter_mut().zip(y).zip(dy) {
        *d = if y > 0.0 { g } else { 0.0 };
    }
}

/// Convolution with zero padding and stride: `y[n, co] = b[co] + Σ w[co, ci, :, :] ⋆ x[n, ci]`
/// (no bias term when `b` is `None`). `ws` is scratch for one sample's im2col (`s.ws_len()`
/// elements; a pointwise convolution reads its input directly).
pub fn conv2d_fwd(
    s: &Conv2dShape,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    y: &mut [f32],
    ws: &mut [f32],
) {
    let (x_n, hw) = (s.c_in * s.h * s.w, s.h_out() * s.w_out());
    let y_n = s.c_out * hw;
    let ws = &mut ws[..s.ws_len()];
    // y_n[c_out × hw] = w[c_out × c_in·k·k] · col[c_in·k·k × hw] + y_n, with y_n preset to the bias.
    let g = GemmShape {
        beta: if b.is_some() { 1.0 } else { 0.0 },
        ..GemmShape::nn(s.c_out, hw, s.c_in * s.k * s.k)
    };
    for i in 0..s.n {
        let yi = &mut y[i * y_n..(i + 1) * y_n];
        if let Some(b) = b {
            for (co, &bias) in b[..s.c_out].iter().enumerate() {
                yi[co * hw..(co + 1) * hw].fill(bias);
            }
        }
        let xi = &x[i * x_n..(i + 1) * x_n];
        if s.is_pointwise() {
            gemm(&g, w, xi, yi);
        } else {
            im2col(s, xi, ws);
            gemm(&g, w, ws, yi);
        }
    }
}

/// Gradients of [`conv2d_fwd`]: overwrites `dw`, and `db` and `dx` when given.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_bwd(
    s: &Conv2dShape,
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    mut dx: Option<&mut [f32]>,
    dw: &mut [f32],
    db: Option<&mut [f32]>,
    ws: &mut [f32],
) {
    let (x_n, hw, ckk) = (
        s.c_in * s.h * s.w,
        s.h_out() * s.w_out(),
        s.c_in * s.k * s.k,
    );
    let y_n = s.c_out * hw;
    let ws = &mut ws[..s.ws_len()];
    if let Some(db) = db {
        conv_bias_grad(s, dy, db);
    }
    dw[..s.w_len()].fill(0.0);
    // dw[c_out × ckk] += dy_n[c_out × hw] · col_nᵀ
    let dw_g = GemmShape {
        trans_b: true,
        beta: 1.0,
        ..GemmShape::nn(s.c_out, ckk, hw)
    };
    // col[ckk × hw] = wᵀ · dy_n[c_out × hw]
    let col_g = GemmShape {
        trans_a: true,
        ..GemmShape::nn(ckk, hw, s.c_out)
    };
    for i in 0..s.n {
        let dyi = &dy[i * y_n..(i + 1) * y_n];
        let xi = &x[i * x_n..(i + 1) * x_n];
        if s.is_pointwise() {
            gemm(&dw_g, dyi, xi, dw);
            if let Some(dx) = dx.as_deref_mut() {
                gemm(&col_g, w, dyi, &mut dx[i * x_n..(i + 1) * x_n]);
            }
        } else {
            im2col(s, xi, ws);
            gemm(&dw_g, dyi, ws, dw);
            if let Some(dx) = dx.as_deref_mut() {
                gemm(&col_g, w, dyi, ws);
                col2im(s, ws, &mut dx[i * x_n..(i + 1) * x_n]);
            }
        }
    }
}

/// `db[co] = Σ over samples and output pixels of dy[n, co]` (overwrites `db`).
fn conv_bias_grad(s: &Conv2dShape, dy: &[f32], db: &mut [f32]) {
    let hw = s.h_out() * s.w_out();
    let db = &mut db[..s.c_out];
    db.fill(0.0);
    for i in 0..s.n {
        for (co, d) in db.iter_mut().enumerate() {
            let start = (i * s.c_out + co) * hw;
            *d += dy[start..start + hw].iter().sum::<f32>();
        }
    }
}

/// Plane indices of the window of output pixel `(oy, ox)` that fall inside the plane,
/// row-major within the window (padding positions are skipped: they never win).
fn window(s: &PoolShape, oy: usize, ox: usize) -> impl Iterator<Item = usize> {
    let (h, w, k, st, pad) = (s.h, s.w, s.k, s.stride.max(1), s.pad);
    (0..k).flat_map(move |ky| {
        let iy = (oy * st + ky).checked_sub(pad).filter(|&iy| iy < h);
        (0..k).filter_map(move |kx| {
            let ix = (ox * st + kx).checked_sub(pad).filter(|&ix| ix < w)?;
            Some(iy? * w + ix)
        })
    })
}

/// Max over each window.
pub fn maxpool_fwd(s: &PoolShape, x: &[f32], y: &mut [f32]) {
    let (plane, ho, wo) = (s.h * s.w, s.h_out(), s.w_out());
    for p in 0..s.n * s.c {
        let xp = &x[p * plane..(p + 1) * plane];
        let yp = &mut y[p * ho * wo..(p + 1) * ho * wo];
        for oy in 0..ho {
            for ox in 0..wo {
                let max = window(s, oy, ox)
                    .map(|i| xp[i])
                    .reduce(|m, v| if v > m { v } else { m });
                // Windows hold a real position when the shape fits; the fallback is only for the type.
                yp[oy * wo + ox] = max.unwrap_or(f32::NEG_INFINITY);
            }
        }
    }
}

/// Routes each window's gradient to the first position (row-major in the window) holding its
/// max, adding where windows overlap (windows taken in row-major order); overwrites `dx` (zeros
/// elsewhere, including dropped trailing rows/columns). The max is the window's `y`; a window
/// holding no element equal to it (a NaN max) routes nothing.
pub fn maxpool_bwd(s: &PoolShape, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32]) {
    let (plane, ho, wo) = (s.h * s.w, s.h_out(), s.w_out());
    dx[..s.x_len()].fill(0.0);
    for p in 0..s.n * s.c {
        let xp = &x[p * plane..(p + 1) * plane];
        let dxp = &mut dx[p * plane..(p + 1) * plane];
        for oy in 0..ho {
            for ox in 0..wo {
                let o = p * ho * wo + oy * wo + ox;
                if let Some(i) = window(s, oy, ox).find(|&i| xp[i] == y[o]) {
                    dxp[i] += dy[o];
                }
            }
        }
    }
}

/// Batch normalisation over each channel of `s` (statistics over `n·hw` values, accumulated in
/// `f64`). Training: normalises with the batch mean and biased variance, writes `saved =
/// [mean; c] ++ [1/√(var+eps); c]`, and updates `running = [mean; c] ++ [var; c]` as PyTorch does
/// (`r = (1−momentum)·r + momentum·batch`, the variance unbiased by `m/(m−1)`). Inference:
/// normalises with `running` and touches neither. `y = gamma·x̂ + beta`.
#[allow(clippy::too_many_arguments)]
pub fn batchnorm_fwd(
    s: &PlaneShape,
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    running: &mut [f32],
    saved: &mut [f32],
    y: &mut [f32],
    p: BnParams,
) {
    let (c, hw, m) = (s.c, s.hw, s.per_channel());
    for ch in 0..c {
        let planes = (0..s.n).map(|i| (i * c + ch) * hw);
        let (mean, invstd) = if p.train {
            let mut sum = 0f64;
            for o in planes.clone() {
                sum += x[o..o + hw].iter().map(|&v| v as f64).sum::<f64>();
            }
            let mean = sum / m as f64;
            let mut sq = 0f64;
            for o in planes.clone() {
                sq += x[o..o + hw]
                    .iter()
                    .map(|&v| (v as f64 - mean).powi(2))
                    .sum::<f64>();
            }
            let var = sq / m as f64;
            let unbiased = if m > 1 {
                var * m as f64 / (m - 1) as f64
            } else {
                var
            };
            let mom = p.momentum as f64;
            running[ch] = ((1.0 - mom) * running[ch] as f64 + mom * mean) as f32;
            running[c + ch] = ((1.0 - mom) * running[c + ch] as f64 + mom * unbiased) as f32;
            let invstd = 1.0 / (var + p.eps as f64).sqrt();
            saved[ch] = mean as f32;
            saved[c + ch] = invstd as f32;
            (mean as f32, invstd as f32)
        } else {
            (running[ch], 1.0 / (running[c + ch] + p.eps).sqrt())
        };
        let (g, b) = (gamma[ch], beta[ch]);
        for o in planes {
            for (yv, &xv) in y[o..o + hw].iter_mut().zip(&x[o..o + hw]) {
                *yv = g * ((xv - mean) * invstd) + b;
            }
        }
    }
}

/// Gradients of training-mode [`batchnorm_fwd`] from its `saved` statistics: overwrites `dx`,
/// `dgamma = Σ dy·x̂` and `dbeta = Σ dy`, with
/// `dx = gamma·invstd/m · (m·dy − dbeta − x̂·dgamma)` (sums accumulated in `f64`).
#[allow(clippy::too_many_arguments)]
pub fn batchnorm_bwd(
    s: &PlaneShape,
    x: &[f32],
    gamma: &[f32],
    saved: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    let (c, hw, m) = (s.c, s.hw, s.per_channel());
    for ch in 0..c {
        let (mean, invstd) = (saved[ch], saved[c + ch]);
        let planes = (0..s.n).map(|i| (i * c + ch) * hw);
        let (mut sdy, mut sdyx) = (0f64, 0f64);
        for o in planes.clone() {
            for (&g, &xv) in dy[o..o + hw].iter().zip(&x[o..o + hw]) {
                sdy += g as f64;
                sdyx += g as f64 * ((xv - mean) * invstd) as f64;
            }
        }
        dbeta[ch] = sdy as f32;
        dgamma[ch] = sdyx as f32;
        let k = gamma[ch] * invstd / m as f32;
        let (sdy, sdyx) = (sdy as f32, sdyx as f32);
        for o in planes {
            for ((d, &g), &xv) in dx[o..o + hw]
                .iter_mut()
                .zip(&dy[o..o + hw])
                .zip(&x[o..o + hw])
            {
                let xhat = (xv - mean) * invstd;
                *d = k * (m as f32 * g - sdy - xhat * sdyx);
            }
        }
    }
}

/// Global average pooling: `y[n, c] = mean of plane (n, c)` (summed in `f64`).
pub fn avgpool_fwd(s: &PlaneShape, x: &[f32], y: &mut [f32]) {
    for (p, yv) in y[..s.n * s.c].iter_mut().enumerate() {
        let sum: f64 = x[p * s.hw..(p + 1) * s.hw].iter().map(|&v| v as f64).sum();
        *yv = (sum / s.hw as f64) as f32;
    }
}

/// The gradient of [`avgpool_fwd`]: `dx[n, c, :] = dy[n, c] / hw`.
pub fn avgpool_bwd(s: &PlaneShape, dy: &[f32], dx: &mut [f32]) {
    let scale = 1.0 / s.hw as f32;
    for (p, &g) in dy[..s.n * s.c].iter().enumerate() {
        dx[p * s.hw..(p + 1) * s.hw].fill(g * scale);
    }
}

/// `y = a + b`.
pub fn add(a: &[f32], b: &[f32], y: &mut [f32]) {
    let (a, b) = (&a[..y.len()], &b[..y.len()]);
    for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
        *y = a + b;
    }
}

/// `y += x`.
pub fn add_assign(y: &mut [f32], x: &[f32]) {
    let x = &x[..y.len()];
    for (y, &x) in y.iter_mut().zip(x) {
        *y += x;
    }
}

/// Whether dropout keeps element `i` of the mask for this `(seed, counter)`.
#[inline]
pub fn dropout_keep(p: f32, seed: u64, counter: u64, i: u64) -> bool {
    rng::uniform(seed, counter, i) >= p
}

/// `v/(1-p)` where element `i` of the mask is kept, else 0; `v` itself when `p == 0`.
#[inline]
fn dropout_one(v: f32, p: f32, seed: u64, counter: u64, i: u64) -> f32 {
    if p == 0.0 {
        v
    } else if dropout_keep(p, seed, counter, i) {
        v / (1.0 - p)
    } else {
        0.0
    }
}

/// Inverted dropout: `y = x/(1-p)` where kept, else 0. With `p == 0`, `y = x`. Element `i`
/// applies element `first + i` of the mask.
pub fn dropout_fwd(x: &[f32], y: &mut [f32], p: f32, seed: u64, counter: u64, first: u64) {
    let x = &x[..y.len()];
    for (i, (y, &x)) in y.iter_mut().zip(x).enumerate() {
        *y = dropout_one(x, p, seed, counter, first + i as u64);
    }
}

/// `dx = dy/(1-p)` where kept, else 0 (the same mask as [`dropout_fwd`]).
pub fn dropout_bwd(dy: &[f32], dx: &mut [f32], p: f32, seed: u64, counter: u64, first: u64) {
    let dy = &dy[..dx.len()];
    for (i, (d, &g)) in dx.iter_mut().zip(dy).enumerate() {
        *d = dropout_one(g, p, seed, counter, first + i as u64);
    }
}

/// One row of softmax cross-entropy: its max logit, `Σ exp(logit − max)`, loss, and whether the
/// first argmax equals the label.
struct XentRow {
    max: f32,
    sum: f32,
    loss: f32,
    correct: bool,
}

fn xent_row(row: &[f32], label: f32) -> XentRow {
    let t = label as usize;
    assert!(
        label >= 0.0 && t < row.len(),
        "label {label} is not a class of 0..{}",
        row.len()
    );
    let (arg, max) =
        row.iter().copied().enumerate().fold(
            (0, row[0]),
            |best, (j, v)| if v > best.1 { (j, v) } else { best },
        );
    let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
    // logsumexp − logit[t] = ln(sum) + max − logit[t]
    let loss = sum.ln() - (row[t] - max);
    XentRow {
        max,
        sum,
        loss,
        correct: arg == t,
    }
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
    let mut stats = XentStats::default();
    for r in 0..rows {
        let row = &logits[r * classes..(r + 1) * classes];
        let x = xent_row(row, labels[r]);
        let t = labels[r] as usize;
        let drow = &mut dlogits[r * classes..(r + 1) * classes];
        for (j, (d, &v)) in drow.iter_mut().zip(row).enumerate() {
            let onehot = if j == t { 1.0 } else { 0.0 };
            *d = ((v - x.max).exp() / x.sum - onehot) / rows as f32;
        }
        stats.add(&x);
    }
    stats.finish()
}

/// The loss sum and correct count of [`softmax_xent`] without the gradient.
pub fn eval_xent(logits: &[f32], labels: &[f32], rows: usize, classes: usize) -> (f32, f32) {
    let mut stats = XentStats::default();
    for r in 0..rows {
        stats.add(&xent_row(
            &logits[r * classes..(r + 1) * classes],
            labels[r],
        ));
    }
    stats.finish()
}

/// The running loss sum (in f64) and correct count of a batch.
#[derive(Default)]
struct XentStats {
    loss: f64,
    correct: usize,
}

impl XentStats {
    fn add(&mut self, row: &XentRow) {
        self.loss += row.loss as f64;
        self.correct += usize::from(row.correct);
    }
    fn finish(&self) -> (f32, f32) {
        (self.loss as f32, self.correct as f32)
    }
}

/// PyTorch SGD: `g' = g + wd·w; v = μ·v + g'; w -= lr·v` (with μ = 0, `v` is still written:
/// `v = g'`, whatever it held, NaN included).
pub fn sgd_step(
    w: &mut [f32],
    g: &[f32],
    v: &mut [f32],
    lr: f32,
    momentum: f32,
    weight_decay: f32,
) {
    let (g, v) = (&g[..w.len()], &mut v[..w.len()]);
    for ((w, &g), v) in w.iter_mut().zip(g).zip(v) {
        let g = g + weight_decay * *w;
        *v = if momentum == 0.0 {
            g
        } else {
            momentum * *v + g
        };
        *w -= lr * *v;
    }
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
    assert!(t >= 1, "Adam's step number is 1-based");
    let t = i32::try_from(t).unwrap_or(i32::MAX);
    let (bc1, bc2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
    let n = w.len();
    let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
    for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m).zip(v) {
        let g = g + weight_decay * *w;
        *m = beta1 * *m + (1.0 - beta1) * g;
        *v = beta2 * *v + (1.0 - beta2) * g * g;
        *w -= lr * (*m / bc1) / ((*v / bc2).sqrt() + eps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::HostRng;
    use proptest::prelude::*;

    fn random(rng: &mut HostRng, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..len).map(|_| rng.uniform_f32(lo, hi)).collect()
    }

    /// `Σ r_i·y_i` in f64: the scalar objective of every gradient check (so `dL/dy = r`).
    fn dot(r: &[f32], y: &[f32]) -> f64 {
        assert_eq!(r.len(), y.len());
        r.iter().zip(y).map(|(&a, &b)| a as f64 * b as f64).sum()
    }

    /// Gradient-check tolerance: `|numeric − analytic| ≤ GRAD_ATOL + GRAD_RTOL·max(|numeric|, |analytic|)`.
    /// The ops run in f32, so the objective carries rounding noise of roughly 1e-7 relative per
    /// term; divided by the step 2·EPS = 2e-2 that is 1e-5 to 1e-4 on gradients of order one.
    /// The ops checked are linear or piecewise linear in the perturbed input away from their kinks
    /// (no truncation error) except softmax, whose O(EPS²) truncation error is below 1e-4 here.
    /// Worst absolute errors observed: 1e-4 (conv), 1.2e-5 (dense, softmax), 6e-6 (dropout),
    /// 0 (relu, maxpool): GRAD_ATOL leaves a margin of 10×, while a wrong gradient is off by O(0.1).
    const GRAD_RTOL: f64 = 1e-2;
    const GRAD_ATOL: f64 = 1e-3;
    const EPS: f32 = 1e-2;

    /// Compares `analytic` with central differences of `f` at `x`: each element is moved by ±`EPS`
    /// in f32, and the difference is divided by the step actually taken (measured in f64).
    fn check_grad(what: &str, x: &[f32], analytic: &[f32], mut f: impl FnMut(&[f32]) -> f64) {
        assert_eq!(x.len(), analytic.len(), "{what}");
        let mut xp = x.to_vec();
        for (i, (&x0, &ana)) in x.iter().zip(analytic).enumerate() {
            let (hi, lo) = (x0 + EPS, x0 - EPS);
            xp[i] = hi;
            let up = f(&xp);
            xp[i] = lo;
            let down = f(&xp);
            xp[i] = x0;
            let num = (up - down) / (hi as f64 - lo as f64);
            let ana = ana as f64;
            assert!(
                (num - ana).abs() <= GRAD_ATOL + GRAD_RTOL * num.abs().max(ana.abs()),
                "{what}[{i}]: numeric {num} vs analytic {ana}"
            );
        }
    }

    // ---- gemm ----

    /// `alpha·op(A)·op(B) + beta·C` in f64, with the sum of |terms| bounding its rounding error.
    fn naive_gemm(g: &GemmShape, a: &[f32], b: &[f32], c: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let at = |i: usize, p: usize| if g.trans_a { a[p * g.m + i] } else { a[i * g.k + p] } as f64;
        let bt = |p: usize, j: usize| if g.trans_b { b[j * g.k + p] } else { b[p * g.n + j] } as f64;
        let (mut out, mut mag) = (Vec::new(), Vec::new());
        for i in 0..g.m {
            for j in 0..g.n {
                let cij = if g.beta == 0.0 {
                    0.0
                } else {
                    g.beta as f64 * c[i * g.n + j] as f64
                };
                let (mut s, mut m) = (0.0, 0.0);
                for p in 0..g.k {
                    s += at(i, p) * bt(p, j);
                    m += (at(i, p) * bt(p, j)).abs();
                }
                out.push(g.alpha as f64 * s + cij);
                mag.push((g.alpha as f64 * m).abs() + cij.abs());
            }
        }
        (out, mag)
    }

    /// Runs `gemm` on random data and compares with the naive product to 1e-5 of the term magnitudes.
    fn check_gemm(g: &GemmShape, seed: u64) {
        let mut rng = HostRng::new(seed);
        let a = random(&mut rng, g.a_len(), -1.0, 1.0);
        let b = random(&mut rng, g.b_len(), -1.0, 1.0);
        let c0 = random(&mut rng, g.c_len(), -1.0, 1.0);
        let (want, mag) = naive_gemm(g, &a, &b, &c0);
        let mut c = c0.clone();
        gemm(g, &a, &b, &mut c);
        for (i, ((&got, &want), &mag)) in c.iter().zip(&want).zip(&mag).enumerate() {
            assert!(
                (got as f64 - want).abs() <= 1e-5 * (1.0 + mag),
                "{g:?} c[{i}]: {got} vs {want}"
            );
        }
    }

    fn shape(
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        beta: f32,
    ) -> GemmShape {
        GemmShape {
            trans_a,
            trans_b,
            m,
            n,
            k,
            alpha,
            beta,
        }
    }

    #[test]
    fn gemm_matches_naive_for_all_transposes() {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            for (m, n, k) in [
                (7, 5, 9),
                (1, 13, 3),
                (11, 1, 17),
                (33, 19, 65),
                (64, 37, 128),
            ] {
                for (alpha, beta) in [(1.0, 0.0), (0.7, -1.3), (-2.5, 1.0)] {
                    check_gemm(
                        &shape(ta, tb, m, n, k, alpha, beta),
                        (m * 131 + n * 7 + k) as u64,
                    );
                }
            }
        }
    }

    #[test]
    fn gemm_beta_zero_overwrites_nan() {
        for (ta, tb) in [(false, false), (true, true)] {
            let g = shape(ta, tb, 9, 7, 5, 1.5, 0.0);
            let mut rng = HostRng::new(3);
            let (a, b) = (
                random(&mut rng, g.a_len(), -1.0, 1.0),
                random(&mut rng, g.b_len(), -1.0, 1.0),
            );
            let (want, _) = naive_gemm(&g, &a, &b, &vec![0.0; g.c_len()]);
            let mut c = vec![f32::NAN; g.c_len()];
            gemm(&g, &a, &b, &mut c);
            for (&got, &want) in c.iter().zip(&want) {
                assert!(
                    (got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn gemm_with_empty_inner_dimension_scales_c() {
        let mut c = vec![1.0, -2.0, 3.0, 4.0, 5.0, 6.0];
        gemm(&shape(false, true, 2, 3, 0, 1.0, 2.0), &[], &[], &mut c);
        assert_eq!(c, [2.0, -4.0, 6.0, 8.0, 10.0, 12.0]);
        let mut c = vec![f32::NAN; 6];
        gemm(&shape(true, false, 3, 2, 0, 1.0, 0.0), &[], &[], &mut c);
        assert_eq!(c, [0.0; 6]);
    }

    #[test]
    fn gemm_with_no_rows_or_columns_leaves_c_alone() {
        let mut c = vec![7.0; 4];
        gemm(&GemmShape::nn(0, 4, 3), &[], &[1.0; 12], &mut c);
        gemm(&GemmShape::nn(4, 0, 3), &[1.0; 12], &[], &mut c);
        assert_eq!(c, [7.0; 4]);
    }

    proptest! {
        #[test]
        fn gemm_matches_naive_on_random_shapes(
            ta: bool, tb: bool, m in 0usize..12, n in 0usize..12, k in 0usize..12,
            alpha in -2.0f32..2.0, beta in prop_oneof![Just(0.0f32), Just(1.0f32), -2.0f32..2.0],
            seed: u64,
        ) {
            check_gemm(&shape(ta, tb, m, n, k, alpha, beta), seed);
        }
    }

    // ---- dense layer: y = x·W + b ----

    #[test]
    fn dense_layer_gradients_match_finite_differences() {
        let (rows, fan_in, fan_out) = (5, 7, 4);
        let mut rng = HostRng::new(21);
        let x = random(&mut rng, rows * fan_in, -1.0, 1.0);
        let w = random(&mut rng, fan_in * fan_out, -1.0, 1.0);
        let b = random(&mut rng, fan_out, -1.0, 1.0);
        let r = random(&mut rng, rows * fan_out, -1.0, 1.0);
        let fwd = GemmShape::nn(rows, fan_out, fan_in);
        let loss = |x: &[f32], w: &[f32], b: &[f32]| {
            let mut y = vec![f32::NAN; rows * fan_out];
            gemm(&fwd, x, w, &mut y);
            bias_add(&mut y, b, rows, fan_out);
            dot(&r, &y)
        };
        // dL/dy = r; dx = r·Wᵀ, dW = xᵀ·r, db = Σ_rows r.
        let mut dx = vec![f32::NAN; x.len()];
        gemm(
            &shape(false, true, rows, fan_in, fan_out, 1.0, 0.0),
            &r,
            &w,
            &mut dx,
        );
        let mut dw = vec![f32::NAN; w.len()];
        gemm(
            &shape(true, false, fan_in, fan_out, rows, 1.0, 0.0),
            &x,
            &r,
            &mut dw,
        );
        let mut db = vec![f32::NAN; b.len()];
        bias_grad(&r, &mut db, rows, fan_out);
        check_grad("dense dx", &x, &dx, |x| loss(x, &w, &b));
        check_grad("dense dw", &w, &dw, |w| loss(&x, w, &b));
        check_grad("dense db", &b, &db, |b| loss(&x, &w, b));
    }

    #[test]
    fn bias_add_and_grad_by_hand() {
        let mut y = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        bias_add(&mut y, &[10.0, 20.0, 30.0], 2, 3);
        assert_eq!(y, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
        let mut db = vec![f32::NAN; 3];
        bias_grad(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &mut db, 2, 3);
        assert_eq!(db, [5.0, 7.0, 9.0]);
    }

    // ---- conv2d ----

    /// The configurations the models use, as `(k, pad, stride)`: the CNN's k 3 and 5, "valid" and
    /// "same"; ResNet's pointwise 1×1, strided 1×1/2 and 3×3/2, and its 7×7/2 stem.
    fn conv_cases() -> Vec<(usize, usize, usize)> {
        vec![
            (3, 0, 1),
            (3, 1, 1),
            (5, 0, 1),
            (5, 2, 1),
            (1, 0, 1),
            (1, 0, 2),
            (3, 1, 2),
            (7, 3, 2),
        ]
    }

    /// Direct convolution in f64, with the sum of |terms| per output.
    fn naive_conv(s: &Conv2dShape, x: &[f32], w: &[f32], b: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let (ho, wo, k) = (s.h_out(), s.w_out(), s.k);
        let (mut out, mut mag) = (Vec::new(), Vec::new());
        for n in 0..s.n {
            for co in 0..s.c_out {
                for oy in 0..ho {
                    for ox in 0..wo {
                        let (mut acc, mut m) = (b[co] as f64, (b[co] as f64).abs());
                        for ci in 0..s.c_in {
                            for ky in 0..k {
                                for kx in 0..k {
                                    let iy = (oy * s.stride + ky) as isize - s.pad as isize;
                                    let ix = (ox * s.stride + kx) as isize - s.pad as isize;
                                    if iy < 0 || ix < 0 || iy >= s.h as isize || ix >= s.w as isize
                                    {
                                        continue;
                                    }
                                    let xv = x[((n * s.c_in + ci) * s.h + iy as usize) * s.w
                                        + ix as usize];
                                    let wv = w[((co * s.c_in + ci) * k + ky) * k + kx];
                                    acc += xv as f64 * wv as f64;
                                    m += (xv as f64 * wv as f64).abs();
                                }
                            }
                        }
                        out.push(acc);
                        mag.push(m);
                    }
                }
            }
        }
        (out, mag)
    }

    fn conv_y(s: &Conv2dShape, x: &[f32], w: &[f32], b: &[f32]) -> Vec<f32> {
        let mut y = vec![f32::NAN; s.y_len()];
        let mut ws = vec![f32::NAN; s.ws_len()];
        conv2d_fwd(s, x, w, Some(b), &mut y, &mut ws);
        y
    }

    #[test]
    fn conv2d_fwd_matches_direct_convolution() {
        let mut rng = HostRng::new(31);
        for (k, pad, stride) in conv_cases() {
            for c_in in 1..=3 {
                for c_out in 1..=4 {
                    for n in 1..=2 {
                        let s = Conv2dShape {
                            n,
                            c_in,
                            h: 7,
                            w: 6,
                            c_out,
                            k,
                            pad,
                            stride,
                        };
                        let x = random(&mut rng, s.x_len(), -1.0, 1.0);
                        let w = random(&mut rng, s.w_len(), -1.0, 1.0);
                        let b = random(&mut rng, c_out, -1.0, 1.0);
                        let (want, mag) = naive_conv(&s, &x, &w, &b);
                        let got = conv_y(&s, &x, &w, &b);
                        for (i, ((&g, &w), &m)) in got.iter().zip(&want).zip(&mag).enumerate() {
                            assert!(
                                (g as f64 - w).abs() <= 1e-5 * (1.0 + m),
                                "{s:?} y[{i}]: {g} vs {w}"
                            );
                        }
                        // Without a bias, the same less the bias (NaNs in y must be overwritten).
                        let mut y = vec![f32::NAN; s.y_len()];
                        let mut ws = vec![f32::NAN; s.ws_len()];
                        conv2d_fwd(&s, &x, &w, None, &mut y, &mut ws);
                        let hw = s.h_out() * s.w_out();
                        for (i, (&g, &want)) in y.iter().zip(&got).enumerate() {
                            let bias = b[(i / hw) % c_out];
                            assert!(
                                (g - (want - bias)).abs() <= 1e-5 * (1.0 + want.abs()),
                                "{s:?} no bias y[{i}]: {g} vs {}",
                                want - bias
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn conv2d_gradients_match_finite_differences() {
        let mut rng = HostRng::new(32);
        for (k, pad, stride) in conv_cases() {
            let s = Conv2dShape {
                n: 2,
                c_in: 2,
                h: 6,
                w: 7,
                c_out: 3,
                k,
                pad,
                stride,
            };
            let x = random(&mut rng, s.x_len(), -1.0, 1.0);
            let w = random(&mut rng, s.w_len(), -1.0, 1.0);
            let b = random(&mut rng, s.c_out, -1.0, 1.0);
            let r = random(&mut rng, s.y_len(), -1.0, 1.0);
            // Stale NaNs in every output: the backward pass must overwrite them all.
            let mut dx = vec![f32::NAN; s.x_len()];
            let mut dw = vec![f32::NAN; s.w_len()];
            let mut db = vec![f32::NAN; s.c_out];
            let mut ws = vec![f32::NAN; s.ws_len()];
            conv2d_bwd(
                &s,
                &x,
                &w,
                &r,
                Some(&mut dx),
                &mut dw,
                Some(&mut db),
                &mut ws,
            );
            let what = format!("conv k={k} pad={pad} stride={stride}");
            check_grad(&format!("{what} dx"), &x, &dx, |x| {
                dot(&r, &conv_y(&s, x, &w, &b))
            });
            check_grad(&format!("{what} dw"), &w, &dw, |w| {
                dot(&r, &conv_y(&s, &x, w, &b))
            });
            check_grad(&format!("{what} db"), &b, &db, |b| {
                dot(&r, &conv_y(&s, &x, &w, b))
            });

            // Without dx, dw and db come out the same.
            let (mut dw2, mut db2) = (vec![f32::NAN; s.w_len()], vec![f32::NAN; s.c_out]);
            conv2d_bwd(&s, &x, &w, &r, None, &mut dw2, Some(&mut db2), &mut ws);
            assert_eq!((&dw2, &db2), (&dw, &db), "{what}");
            // Without a bias gradient, dw and dx come out the same.
            let (mut dw3, mut dx3) = (vec![f32::NAN; s.w_len()], vec![f32::NAN; s.x_len()]);
            conv2d_bwd(&s, &x, &w, &r, Some(&mut dx3), &mut dw3, None, &mut ws);
            assert_eq!((dw3, dx3), (dw, dx), "{what}");
        }
    }

    // ---- maxpool ----

    #[test]
    fn maxpool_by_hand_with_ties_and_dropped_edges() {
        // 5×5 plane, k = 2: one 2×2 output; row 4 and column 4 are dropped.
        #[rustfmt::skip]
        let x = [
            3.0, 3.0,   1.0, 2.0,   9.0,
            1.0, 3.0,   2.0, 0.5,   9.0,
            -1.0, -2.0, 4.0, 4.0,   9.0,
            -1.0, -1.0, 0.0, 4.0,   9.0,
            9.0, 9.0,   9.0, 9.0,   9.0,
        ];
        let s = PoolShape {
            n: 1,
            c: 1,
            h: 5,
            w: 5,
            k: 2,
            stride: 2,
            pad: 0,
        };
        let mut y = [f32::NAN; 4];
        maxpool_fwd(&s, &x, &mut y);
        assert_eq!(y, [3.0, 2.0, -1.0, 4.0]);
        let mut dx = [f32::NAN; 25];
        maxpool_bwd(&s, &x, &y, &[10.0, 20.0, 30.0, 40.0], &mut dx);
        let mut want = [0.0; 25];
        want[0] = 10.0; // first of the three 3s
        want[3] = 20.0;
        want[10] = 30.0; // first of the two −1s
        want[12] = 40.0; // first of the three 4s
        assert_eq!(dx, want);
    }

    #[test]
    fn maxpool_gradient_matches_finite_differences() {
        // Distinct values 0.1 apart (> 2·EPS), so no perturbation changes a window's argmax.
        let s = PoolShape {
            n: 2,
            c: 3,
            h: 7,
            w: 6,
            k: 2,
            stride: 2,
            pad: 0,
        };
        let mut rng = HostRng::new(41);
        let x: Vec<f32> = rng
            .permutation(s.x_len())
            .iter()
            .map(|&i| i as f32 * 0.1 - 5.0)
            .collect();
        let r = random(&mut rng, s.y_len(), -1.0, 1.0);
        let pool = |x: &[f32]| {
            let mut y = vec![f32::NAN; s.y_len()];
            maxpool_fwd(&s, x, &mut y);
            y
        };
        let y = pool(&x);
        let mut dx = vec![f32::NAN; s.x_len()];
        maxpool_bwd(&s, &x, &y, &r, &mut dx);
        check_grad("maxpool dx", &x, &dx, |x| dot(&r, &pool(x)));
        // Exactly one nonzero per window; the dropped row 6 gets nothing.
        assert_eq!(dx.iter().filter(|&&d| d != 0.0).count(), s.y_len());
    }

    #[test]
    fn overlapping_padded_maxpool_by_hand() {
        // ResNet's stem pool: k 3, stride 2, pad 1 over a 4×4 plane gives 2×2.
        #[rustfmt::skip]
        let x = [
            1.0, 2.0, 0.0, 5.0,
            3.0, 7.0, 7.0, 0.0,
            0.0, 1.0, 2.0, 0.0,
            -4.0, 0.0, 0.0, 6.0,
        ];
        let s = PoolShape {
            n: 1,
            c: 1,
            h: 4,
            w: 4,
            k: 3,
            stride: 2,
            pad: 1,
        };
        assert_eq!((s.h_out(), s.w_out()), (2, 2));
        let mut y = [f32::NAN; 4];
        maxpool_fwd(&s, &x, &mut y);
        // Windows: rows/cols −1..=1, −1..=1 | −1..=1, 1..=3 | 1..=3, −1..=1 | 1..=3, 1..=3.
        assert_eq!(y, [7.0, 7.0, 7.0, 7.0]);
        let mut dx = [f32::NAN; 16];
        maxpool_bwd(&s, &x, &y, &[1.0, 10.0, 100.0, 1000.0], &mut dx);
        let mut want = [0.0; 16];
        // The 7 at (1,1) is the first max of windows 0, 1 (its first 7), 2 and 3.
        want[5] = 1111.0;
        assert_eq!(dx, want);
    }

    #[test]
    fn overlapping_maxpool_gradient_matches_finite_differences() {
        let s = PoolShape {
            n: 2,
            c: 2,
            h: 7,
            w: 8,
            k: 3,
            stride: 2,
            pad: 1,
        };
        let mut rng = HostRng::new(42);
        let x: Vec<f32> = rng
            .permutation(s.x_len())
            .iter()
            .map(|&i| i as f32 * 0.1 - 5.0)
            .collect();
        let r = random(&mut rng, s.y_len(), -1.0, 1.0);
        let pool = |x: &[f32]| {
            let mut y = vec![f32::NAN; s.y_len()];
            maxpool_fwd(&s, x, &mut y);
            y
        };
        let y = pool(&x);
        let mut dx = vec![f32::NAN; s.x_len()];
        maxpool_bwd(&s, &x, &y, &r, &mut dx);
        check_grad("overlapping maxpool dx", &x, &dx, |x| dot(&r, &pool(x)));
    }

    // ---- batch norm ----

    fn bn_y(s: &PlaneShape, x: &[f32], gamma: &[f32], beta: &[f32], p: BnParams) -> Vec<f32> {
        let mut running = vec![0.0; 2 * s.c];
        running[s.c..].fill(1.0);
        let mut saved = vec![f32::NAN; 2 * s.c];
        let mut y = vec![f32::NAN; s.len()];
        batchnorm_fwd(s, x, gamma, beta, &mut running, &mut saved, &mut y, p);
        y
    }

    #[test]
    fn batchnorm_normalises_and_updates_running_statistics() {
        let s = PlaneShape { n: 3, c: 2, hw: 4 };
        let mut rng = HostRng::new(71);
        let x = random(&mut rng, s.len(), -2.0, 3.0);
        let (gamma, beta) = ([1.0, 1.0], [0.0, 0.0]);
        let mut running = vec![0.5, -0.5, 2.0, 3.0];
        let mut saved = vec![f32::NAN; 4];
        let mut y = vec![f32::NAN; s.len()];
        let p = BnParams::default();
        batchnorm_fwd(&s, &x, &gamma, &beta, &mut running, &mut saved, &mut y, p);
        for ch in 0..2 {
            let vals: Vec<f64> = (0..3)
                .flat_map(|i| x[(i * 2 + ch) * 4..(i * 2 + ch + 1) * 4].iter())
                .map(|&v| v as f64)
                .collect();
            let mean = vals.iter().sum::<f64>() / 12.0;
            let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 12.0;
            assert!((saved[ch] as f64 - mean).abs() < 1e-6);
            assert!((saved[2 + ch] as f64 - 1.0 / (var + 1e-5).sqrt()).abs() < 1e-5);
            let r0 = [0.5, -0.5][ch];
            let v0 = [2.0, 3.0][ch];
            assert!((running[ch] as f64 - (0.9 * r0 + 0.1 * mean)).abs() < 1e-6);
            let unbiased = var * 12.0 / 11.0;
            assert!((running[2 + ch] as f64 - (0.9 * v0 + 0.1 * unbiased)).abs() < 1e-5);
            // Each channel of y has mean 0 and variance var/(var+eps) ≈ 1.
            let ys: Vec<f64> = (0..3)
                .flat_map(|i| y[(i * 2 + ch) * 4..(i * 2 + ch + 1) * 4].iter())
                .map(|&v| v as f64)
                .collect();
            let ym = ys.iter().sum::<f64>() / 12.0;
            let yv = ys.iter().map(|v| (v - ym).powi(2)).sum::<f64>() / 12.0;
            assert!(ym.abs() < 1e-6 && (yv - 1.0).abs() < 1e-4, "{ym} {yv}");
        }
        // Inference uses the running statistics and leaves them alone.
        let before = running.clone();
        let inf = BnParams { train: false, ..p };
        let mut y2 = vec![f32::NAN; s.len()];
        let mut saved2 = vec![7.0; 4];
        batchnorm_fwd(
            &s,
            &x,
            &[2.0, 1.0],
            &[0.5, 0.0],
            &mut running,
            &mut saved2,
            &mut y2,
            inf,
        );
        assert_eq!(running, before);
        assert_eq!(saved2, [7.0; 4]);
        let want = 2.0 * (x[0] - running[0]) / (running[2] + 1e-5).sqrt() + 0.5;
        assert!((y2[0] - want).abs() < 1e-6, "{} vs {want}", y2[0]);
    }

    #[test]
    fn batchnorm_gradients_match_finite_differences() {
        let s = PlaneShape { n: 3, c: 3, hw: 5 };
        let mut rng = HostRng::new(72);
        let x = random(&mut rng, s.len(), -2.0, 2.0);
        let gamma = random(&mut rng, s.c, 0.5, 1.5);
        let beta = random(&mut rng, s.c, -0.5, 0.5);
        let r = random(&mut rng, s.len(), -1.0, 1.0);
        let p = BnParams::default();
        let mut running = vec![0.0; 2 * s.c];
        let mut saved = vec![f32::NAN; 2 * s.c];
        let mut y = vec![f32::NAN; s.len()];
        batchnorm_fwd(&s, &x, &gamma, &beta, &mut running, &mut saved, &mut y, p);
        let mut dx = vec![f32::NAN; s.len()];
        let (mut dg, mut db) = (vec![f32::NAN; s.c], vec![f32::NAN; s.c]);
        batchnorm_bwd(&s, &x, &gamma, &saved, &r, &mut dx, &mut dg, &mut db);
        check_grad("batchnorm dx", &x, &dx, |x| {
            dot(&r, &bn_y(&s, x, &gamma, &beta, p))
        });
        check_grad("batchnorm dgamma", &gamma, &dg, |g| {
            dot(&r, &bn_y(&s, &x, g, &beta, p))
        });
        check_grad("batchnorm dbeta", &beta, &db, |b| {
            dot(&r, &bn_y(&s, &x, &gamma, b, p))
        });
    }

    // ---- global average pooling and adds ----

    #[test]
    fn avgpool_values_and_gradient() {
        let s = PlaneShape { n: 2, c: 3, hw: 4 };
        let mut rng = HostRng::new(81);
        let x = random(&mut rng, s.len(), -1.0, 1.0);
        let fwd = |x: &[f32]| {
            let mut y = vec![f32::NAN; s.n * s.c];
            avgpool_fwd(&s, x, &mut y);
            y
        };
        let y = fwd(&x);
        assert!((y[4] - x[16..20].iter().sum::<f32>() / 4.0).abs() < 1e-6);
        let r = random(&mut rng, s.n * s.c, -1.0, 1.0);
        let mut dx = vec![f32::NAN; s.len()];
        avgpool_bwd(&s, &r, &mut dx);
        check_grad("avgpool dx", &x, &dx, |x| dot(&r, &fwd(x)));
    }

    #[test]
    fn add_and_add_assign() {
        let mut y = [f32::NAN; 3];
        add(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0], &mut y);
        assert_eq!(y, [11.0, 22.0, 33.0]);
        add_assign(&mut y, &[1.0, 1.0, -33.0]);
        assert_eq!(y, [12.0, 23.0, 0.0]);
    }

    // ---- relu ----

    #[test]
    fn relu_values_and_gradient() {
        let mut y = [f32::NAN; 4];
        relu_fwd(&[-1.0, 0.0, 2.0, -0.5], &mut y);
        assert_eq!(y, [0.0, 0.0, 2.0, 0.0]);

        // Inputs at least 0.1 from the kink at 0 (> EPS).
        let mut rng = HostRng::new(51);
        let x: Vec<f32> = (0..50)
            .map(|_| {
                let v = rng.uniform_f32(0.1, 2.0);
                if rng.below(2) == 0 {
                    v
                } else {
                    -v
                }
            })
            .collect();
        let r = random(&mut rng, x.len(), -1.0, 1.0);
        let fwd = |x: &[f32]| {
            let mut y = vec![f32::NAN; x.len()];
            relu_fwd(x, &mut y);
            y
        };
        let mut dx = vec![f32::NAN; x.len()];
        relu_bwd(&fwd(&x), &r, &mut dx);
        check_grad("relu dx", &x, &dx, |x| dot(&r, &fwd(x)));
    }

    // ---- dropout ----

    #[test]
    fn dropout_keeps_about_half_and_scales() {
        let n = 100_000;
        let x = vec![1.0; n];
        let mut y = vec![f32::NAN; n];
        dropout_fwd(&x, &mut y, 0.5, 9, 4, 0);
        let kept = y.iter().filter(|&&v| v != 0.0).count();
        assert!(
            (kept as f64 / n as f64 - 0.5).abs() < 0.01,
            "kept {kept} of {n}"
        );
        assert!(y.iter().all(|&v| v == 0.0 || v == 2.0));
    }

    #[test]
    fn dropout_bwd_uses_the_forward_mask() {
        let (p, seed, counter) = (0.3, 17, 5);
        let mut rng = HostRng::new(61);
        let x = random(&mut rng, 1000, 0.5, 1.5); // never 0, so y == 0 exactly where dropped
        let mut y = vec![f32::NAN; x.len()];
        dropout_fwd(&x, &mut y, p, seed, counter, 0);
        let mut dx = vec![f32::NAN; x.len()];
        dropout_bwd(&vec![1.0; x.len()], &mut dx, p, seed, counter, 0);
        for (i, (&y, &d)) in y.iter().zip(&dx).enumerate() {
            let kept = dropout_keep(p, seed, counter, i as u64);
            assert_eq!(y != 0.0, kept, "y[{i}]");
            assert_eq!(d, if kept { 1.0 / (1.0 - p) } else { 0.0 }, "dx[{i}]");
        }
        // Another counter draws another mask.
        let mut y2 = vec![f32::NAN; x.len()];
        dropout_fwd(&x, &mut y2, p, seed, counter + 1, 0);
        assert_ne!(y, y2);
    }

    #[test]
    fn dropout_from_an_offset_is_that_part_of_the_whole_mask() {
        let (p, seed, counter) = (0.4, 3, 8);
        let mut rng = HostRng::new(62);
        let x = random(&mut rng, 900, 0.5, 1.5);
        let mut whole = vec![f32::NAN; x.len()];
        dropout_fwd(&x, &mut whole, p, seed, counter, 0);
        // Three shards of unequal length, each told where it starts, make the whole mask.
        let mut parts = vec![f32::NAN; x.len()];
        for (a, b) in [(0usize, 500usize), (500, 620), (620, 900)] {
            dropout_fwd(&x[a..b], &mut parts[a..b], p, seed, counter, a as u64);
        }
        assert_eq!(whole, parts);
        // From the start, a shard would repeat the first rows' mask instead.
        let mut again = vec![f32::NAN; 400];
        dropout_fwd(&x[500..], &mut again, p, seed, counter, 0);
        assert_ne!(again, whole[500..]);
    }

    #[test]
    fn dropout_with_p_zero_is_identity() {
        let x = [1.5, -2.0, 0.0, 3.25];
        let (mut y, mut dx) = ([f32::NAN; 4], [f32::NAN; 4]);
        dropout_fwd(&x, &mut y, 0.0, 1, 2, 0);
        dropout_bwd(&x, &mut dx, 0.0, 1, 2, 0);
        assert_eq!((y, dx), (x, x));
    }

    #[test]
    fn dropout_gradient_matches_finite_differences() {
        let (p, seed, counter) = (0.4, 3, 8);
        let mut rng = HostRng::new(62);
        let x = random(&mut rng, 200, -1.0, 1.0);
        let r = random(&mut rng, x.len(), -1.0, 1.0);
        let fwd = |x: &[f32]| {
            let mut y = vec![f32::NAN; x.len()];
            dropout_fwd(x, &mut y, p, seed, counter, 0);
            y
        };
        let mut dx = vec![f32::NAN; x.len()];
        dropout_bwd(&r, &mut dx, p, seed, counter, 0);
        check_grad("dropout dx", &x, &dx, |x| dot(&r, &fwd(x)));
    }

    // ---- softmax cross-entropy ----

    #[test]
    fn softmax_xent_by_hand() {
        #[rustfmt::skip]
        let logits = [
            1.0, 2.0, 3.0,        // label 2: loss = ln(1 + e⁻¹ + e⁻²), correct
            5.0, 5.0, 1.0,        // label 1: loss = ln(2 + e⁻⁴), the first max (class 0) is wrong
            1000.0, 0.0, -1000.0, // label 0: loss = 0 without overflow, correct
        ];
        let labels = [2.0, 1.0, 0.0];
        let mut d = [f32::NAN; 9];
        let (loss, correct) = softmax_xent(&logits, &labels, &mut d, 3, 3);
        let want = (1.0 + (-1.0f64).exp() + (-2.0f64).exp()).ln() + (2.0 + (-4.0f64).exp()).ln();
        assert!((loss as f64 - want).abs() < 1e-6, "loss {loss} vs {want}");
        assert_eq!(correct, 2.0);
        let z = 1.0 + (-1.0f64).exp() + (-2.0f64).exp();
        let z2 = 2.0 + (-4.0f64).exp();
        #[rustfmt::skip]
        let want_d = [
            (-2.0f64).exp() / z, (-1.0f64).exp() / z, 1.0 / z - 1.0,
            1.0 / z2, 1.0 / z2 - 1.0, (-4.0f64).exp() / z2,
            0.0, 0.0, 0.0,
        ];
        for (i, (&got, &want)) in d.iter().zip(&want_d).enumerate() {
            assert!(
                (got as f64 - want / 3.0).abs() < 1e-7,
                "dlogits[{i}]: {got} vs {}",
                want / 3.0
            );
        }
        assert_eq!(eval_xent(&logits, &labels, 3, 3), (loss, correct));
    }

    #[test]
    fn softmax_xent_gradient_matches_finite_differences() {
        let (rows, classes) = (4, 6);
        let mut rng = HostRng::new(71);
        let logits = random(&mut rng, rows * classes, -3.0, 3.0);
        let labels: Vec<f32> = (0..rows).map(|_| rng.below(classes) as f32).collect();
        let mut d = vec![f32::NAN; logits.len()];
        let (loss, correct) = softmax_xent(&logits, &labels, &mut d, rows, classes);
        assert_eq!(eval_xent(&logits, &labels, rows, classes), (loss, correct));
        // dlogits is the gradient of the mean loss.
        check_grad("softmax_xent dlogits", &logits, &d, |l| {
            eval_xent(l, &labels, rows, classes).0 as f64 / rows as f64
        });
    }

    // ---- optimisers ----

    /// Hand values are exact decimals, but the f32 constants are not (1 − 0.999 in f32 is off by
    /// 1.3e-5 relative), so optimiser results are compared to 1e-4 relative.
    fn assert_close(what: &str, got: f32, want: f64) {
        let err = (got as f64 - want).abs();
        assert!(err <= 1e-4 * want.abs(), "{what}: {got} vs {want}");
    }

    #[test]
    fn sgd_two_steps_by_hand() {
        // lr 0.1, μ 0.9, wd 0.01, w₀ = 1, g = 0.5 twice:
        // step 1: g' = 0.51, v = 0.51, w = 0.949
        // step 2: g' = 0.50949, v = 0.459 + 0.50949 = 0.96849, w = 0.949 − 0.096849 = 0.852151
        let (mut w, mut v) = ([1.0f32], [0.0f32]);
        sgd_step(&mut w, &[0.5], &mut v, 0.1, 0.9, 0.01);
        assert_close("w1", w[0], 0.949);
        assert_close("v1", v[0], 0.51);
        sgd_step(&mut w, &[0.5], &mut v, 0.1, 0.9, 0.01);
        assert_close("w2", w[0], 0.852151);
        assert_close("v2", v[0], 0.96849);

        // Without momentum, v receives g' even over a stale NaN.
        let (mut w, mut v) = ([2.0f32], [f32::NAN]);
        sgd_step(&mut w, &[0.5], &mut v, 0.1, 0.0, 0.0);
        assert_close("w", w[0], 1.95);
        assert_close("v", v[0], 0.5);
    }

    #[test]
    fn adam_two_steps_by_hand() {
        // lr 0.1, β1 0.9, β2 0.999, eps 1e-8, one element; returns (w, m, v) after the step.
        let step = |w: &mut f32, m: &mut f32, v: &mut f32, g: f32, wd: f32, t: u32| {
            let (mut ws, mut ms, mut vs) = ([*w], [*m], [*v]);
            adam_step(
                &mut ws,
                &[g],
                &mut ms,
                &mut vs,
                0.1,
                0.9,
                0.999,
                1e-8,
                wd,
                t,
            );
            (*w, *m, *v) = (ws[0], ms[0], vs[0]);
        };
        // wd 0, w₀ = 1, g = 0.5 then −0.25.
        //   step 1: m = 0.05, v = 0.00025, m̂ = 0.5, v̂ = 0.25, w = 1 − 0.1·0.5/0.5 = 0.9
        //   step 2: m = 0.045 − 0.025 = 0.02, v = 0.00024975 + 0.0000625 = 0.00031225,
        //           m̂ = 0.02/0.19, v̂ = 0.00031225/0.001999, w = 0.9 − 0.1·m̂/sqrt(v̂)
        let (mut w, mut m, mut v) = (1.0, 0.0, 0.0);
        step(&mut w, &mut m, &mut v, 0.5, 0.0, 1);
        assert_close("w1", w, 0.9);
        assert_close("m1", m, 0.05);
        assert_close("v1", v, 0.00025);
        step(&mut w, &mut m, &mut v, -0.25, 0.0, 2);
        assert_close(
            "w2",
            w,
            0.9 - 0.1 * (0.02 / 0.19) / (0.00031225f64 / 0.001999).sqrt(),
        );
        assert_close("m2", m, 0.02);
        assert_close("v2", v, 0.00031225);

        // wd 0.5, w₀ = 2, g = 0.1, so g' = 1.1: m = 0.11, v = 0.00121, w = 2 − 0.1 = 1.9.
        let (mut w, mut m, mut v) = (2.0, 0.0, 0.0);
        step(&mut w, &mut m, &mut v, 0.1, 0.5, 1);
        assert_close("w", w, 1.9);
        assert_close("m", m, 0.11);
        assert_close("v", v, 0.00121);
    }
}
