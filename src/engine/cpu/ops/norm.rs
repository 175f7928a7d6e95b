//! The CPU twins of `kernels/norm.cu`: batch normalisation and global average pooling.

use crate::engine::shapes::{BnParams, PlaneShape};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::ops::testing::*;
    use crate::rng::HostRng;

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
}
