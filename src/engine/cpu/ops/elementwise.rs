//! The CPU twins of `kernels/elementwise.cu`: bias, ReLU, adds and dropout.

use crate::engine::cpu::simd::multiversion;

use crate::rng;

multiversion! {
    /// `y[r, c] += bias[c]`.
    pub fn bias_add / bias_add_baseline(y: &mut [f32], bias: &[f32], rows: usize, cols: usize) {
        let bias = &bias[..cols];
        for r in 0..rows {
            for (v, &b) in y[r * cols..(r + 1) * cols].iter_mut().zip(bias) {
                *v += b;
            }
        }
    }
}

multiversion! {
    /// `db[c] = Σ_r dy[r, c]` (overwrites `db`).
    pub fn bias_grad / bias_grad_baseline(dy: &[f32], db: &mut [f32], rows: usize, cols: usize) {
        let db = &mut db[..cols];
        db.fill(0.0);
        for r in 0..rows {
            for (d, &g) in db.iter_mut().zip(&dy[r * cols..(r + 1) * cols]) {
                *d += g;
            }
        }
    }
}

/// [`bias_add`] over `trials` trials: trial `i`'s `rows × cols` block of `y` at `i·rows·cols`,
/// its bias at `i·bias_stride`. Each trial is one call of [`bias_add`], so it is bit-identical
/// to that call.
pub fn bias_add_fused(
    y: &mut [f32],
    bias: &[f32],
    rows: usize,
    cols: usize,
    trials: usize,
    bias_stride: usize,
) {
    let per = rows * cols;
    for i in 0..trials {
        let b = &bias[i * bias_stride..i * bias_stride + cols];
        bias_add(&mut y[i * per..(i + 1) * per], b, rows, cols);
    }
}

/// [`bias_grad`] over `trials` trials: trial `i`'s `rows × cols` block of `dy` at `i·rows·cols`,
/// its gradient at `i·db_stride` (the elements between the gradients are left as they are).
/// Each trial is one call of [`bias_grad`], so it is bit-identical to that call.
pub fn bias_grad_fused(
    dy: &[f32],
    db: &mut [f32],
    rows: usize,
    cols: usize,
    trials: usize,
    db_stride: usize,
) {
    let per = rows * cols;
    for i in 0..trials {
        let d = &mut db[i * db_stride..i * db_stride + cols];
        bias_grad(&dy[i * per..(i + 1) * per], d, rows, cols);
    }
}

multiversion! {
    /// `y = max(x, 0)` over `y.len()` elements.
    pub fn relu_fwd / relu_fwd_baseline(x: &[f32], y: &mut [f32]) {
        let x = &x[..y.len()];
        for (y, &x) in y.iter_mut().zip(x) {
            *y = x.max(0.0);
        }
    }
}

multiversion! {
    /// `dx = dy · [y > 0]`.
    pub fn relu_bwd / relu_bwd_baseline(y: &[f32], dy: &[f32], dx: &mut [f32]) {
        let (y, dy) = (&y[..dx.len()], &dy[..dx.len()]);
        for ((d, &y), &g) in dx.iter_mut().zip(y).zip(dy) {
            *d = if y > 0.0 { g } else { 0.0 };
        }
    }
}

/// [`bias_add_fused`], then with `relu` `y = max(y, 0)` over the trials' blocks: the epilogue of
/// a dense layer (`kernels/elementwise.cu`'s `bias_act_fused` is its twin). Bit-identical to
/// [`bias_add_fused`] followed by [`relu_fwd`].
pub fn bias_act_fused(
    y: &mut [f32],
    bias: &[f32],
    rows: usize,
    cols: usize,
    trials: usize,
    bias_stride: usize,
    relu: bool,
) {
    bias_add_fused(y, bias, rows, cols, trials, bias_stride);
    if relu {
        let all = &mut y[..rows * cols * trials];
        for v in all.iter_mut() {
            *v = v.max(0.0);
        }
    }
}

/// `dx = dx · [y > 0]` over the trials' `rows × cols` blocks (one right after another), then
/// [`bias_grad_fused`] of the result into `db`: the epilogue of a dense layer's input gradient
/// through a ReLU (`kernels/elementwise.cu`'s `relu_bias_grad_fused` is its twin).
/// Bit-identical to [`relu_bwd`] followed by [`bias_grad_fused`].
pub fn relu_bias_grad_fused(
    y: &[f32],
    dx: &mut [f32],
    db: &mut [f32],
    rows: usize,
    cols: usize,
    trials: usize,
    db_stride: usize,
) {
    let len = rows * cols * trials;
    for (d, &y) in dx[..len].iter_mut().zip(&y[..len]) {
        if y <= 0.0 || y.is_nan() {
            *d = 0.0;
        }
    }
    bias_grad_fused(dx, db, rows, cols, trials, db_stride);
}

multiversion! {
    /// `y = a + b`.
    pub fn add / add_baseline(a: &[f32], b: &[f32], y: &mut [f32]) {
        let (a, b) = (&a[..y.len()], &b[..y.len()]);
        for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
            *y = a + b;
        }
    }
}

multiversion! {
    /// `y += x`.
    pub fn add_assign / add_assign_baseline(y: &mut [f32], x: &[f32]) {
        let x = &x[..y.len()];
        for (y, &x) in y.iter_mut().zip(x) {
            *y += x;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::ops::testing::*;
    use crate::rng::HostRng;

    #[test]
    fn bias_add_and_grad_by_hand() {
        let mut y = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        bias_add(&mut y, &[10.0, 20.0, 30.0], 2, 3);
        assert_eq!(y, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
        let mut db = vec![f32::NAN; 3];
        bias_grad(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &mut db, 2, 3);
        assert_eq!(db, [5.0, 7.0, 9.0]);
    }

    /// Odd shapes and strides, trial counts 1, 2, 5 and 13: each trial bit for bit one call of
    /// the single op, and the elements between the gradients untouched.
    #[test]
    fn fused_bias_ops_are_bit_identical_to_one_call_per_trial() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut rng = HostRng::new(77);
        for (k, trials) in [1, 2, 5, 13].into_iter().enumerate() {
            let (rows, cols) = (1 + rng.below(9), 1 + rng.below(11));
            let stride = cols + [0, 1, 3, 7][k];
            let per = rows * cols;
            let span = (trials - 1) * stride + cols;
            let y0 = random(&mut rng, trials * per, -1.0, 1.0);
            let bias = random(&mut rng, span, -1.0, 1.0);
            let mut y = y0.clone();
            bias_add_fused(&mut y, &bias, rows, cols, trials, stride);
            let mut db = vec![f32::NAN; span];
            bias_grad_fused(&y0, &mut db, rows, cols, trials, stride);
            for i in 0..trials {
                let at = i * per..(i + 1) * per;
                let b = i * stride..i * stride + cols;
                let mut yi = y0[at.clone()].to_vec();
                bias_add(&mut yi, &bias[b.clone()], rows, cols);
                assert_eq!(
                    bits(&y[at.clone()]),
                    bits(&yi),
                    "y of trial {i} of {trials}"
                );
                let mut dbi = vec![0.0; cols];
                bias_grad(&y0[at], &mut dbi, rows, cols);
                assert_eq!(bits(&db[b.clone()]), bits(&dbi), "db of trial {i}");
                if i + 1 < trials {
                    let gap = &db[b.end..(i + 1) * stride];
                    assert!(gap.iter().all(|v| v.is_nan()), "gap after trial {i}");
                }
            }
        }
    }

    #[test]
    fn add_and_add_assign() {
        let mut y = [f32::NAN; 3];
        add(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0], &mut y);
        assert_eq!(y, [11.0, 22.0, 33.0]);
        add_assign(&mut y, &[1.0, 1.0, -33.0]);
        assert_eq!(y, [12.0, 23.0, 0.0]);
    }

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
}
