//! The CPU reference ops: plain functions over slices, the twin of every CUDA kernel, one file per
//! kernel family (`ops/<family>.rs` mirrors `kernels/<family>.cu`).
//!
//! Layouts are row-major; images are NCHW. Every function panics only on a broken caller contract
//! (slice too short), which the [`super::CpuBackend`] rules out by checking regions first.

mod conv;
mod elementwise;
mod gemm;
mod loss;
mod norm;
mod optim;
mod pool;

// Every family's public twins, by glob: a new twin needs no entry here.
pub use conv::*;
pub use elementwise::*;
pub use gemm::*;
pub use loss::*;
pub use norm::*;
pub use optim::*;
pub use pool::*;

/// What the twins' tests share: random data and the gradient check.
#[cfg(test)]
pub(crate) mod testing {
    use crate::rng::HostRng;

    pub(crate) fn random(rng: &mut HostRng, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..len).map(|_| rng.uniform_f32(lo, hi)).collect()
    }

    /// `Σ r_i·y_i` in f64: the scalar objective of every gradient check (so `dL/dy = r`).
    pub(crate) fn dot(r: &[f32], y: &[f32]) -> f64 {
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
    pub(crate) fn check_grad(
        what: &str,
        x: &[f32],
        analytic: &[f32],
        mut f: impl FnMut(&[f32]) -> f64,
    ) {
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
}
