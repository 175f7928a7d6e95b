//! The CPU twins of `kernels/optim.cu`: the SGD and Adam steps.

use crate::engine::cpu::simd::multiversion;

multiversion! {
    /// PyTorch SGD: `g' = g + wd·w; v = μ·v + g'; w -= lr·v` (with μ = 0, `v` is still written:
    /// `v = g'`, whatever it held, NaN included).
    pub fn sgd_step / sgd_step_baseline(
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
    adam_loop(w, g, m, v, [lr, beta1, beta2, eps, weight_decay, bc1, bc2]);
}

multiversion! {
    /// [`adam_step`]'s loop; `k` is `[lr, β1, β2, eps, wd, 1-β1^t, 1-β2^t]`.
    fn adam_loop / adam_loop_baseline(
        w: &mut [f32],
        g: &[f32],
        m: &mut [f32],
        v: &mut [f32],
        k: [f32; 7],
    ) {
        let [lr, beta1, beta2, eps, weight_decay, bc1, bc2] = k;
        for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m).zip(v) {
            let g = g + weight_decay * *w;
            *m = beta1 * *m + (1.0 - beta1) * g;
            *v = beta2 * *v + (1.0 - beta2) * g * g;
            *w -= lr * (*m / bc1) / ((*v / bc2).sqrt() + eps);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::ops::testing::random;
    use crate::rng::HostRng;

    /// The optimiser loops at the host's vector width give the baseline build's bits.
    #[test]
    fn wide_optimiser_loops_match_the_baseline_bit_for_bit() {
        let mut rng = HostRng::new(17);
        let n = 1037;
        let (w, g) = (
            random(&mut rng, n, -1.0, 1.0),
            random(&mut rng, n, -1e-3, 1e-3),
        );
        let (m, v) = (
            random(&mut rng, n, -1e-3, 1e-3),
            random(&mut rng, n, 0.0, 1e-6),
        );
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let k = [1e-3, 0.9, 0.999, 1e-8, 1e-4, 0.1, 0.001];
        let (mut w1, mut m1, mut v1) = (w.clone(), m.clone(), v.clone());
        let (mut w2, mut m2, mut v2) = (w.clone(), m.clone(), v.clone());
        adam_loop(&mut w1, &g, &mut m1, &mut v1, k);
        adam_loop_baseline(&mut w2, &g, &mut m2, &mut v2, k);
        assert_eq!(
            (bits(&w1), bits(&m1), bits(&v1)),
            (bits(&w2), bits(&m2), bits(&v2))
        );
        let (mut w1, mut m1, mut w2, mut m2) = (w.clone(), m.clone(), w, m);
        sgd_step(&mut w1, &g, &mut m1, 0.1, 0.9, 1e-4);
        sgd_step_baseline(&mut w2, &g, &mut m2, 0.1, 0.9, 1e-4);
        assert_eq!((bits(&w1), bits(&m1)), (bits(&w2), bits(&m2)));
    }

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

/// The hyperparameters in trial `i`'s row of the hyper table, or `None` when it is dead.
fn trial_row(hyper: &[f32], i: usize) -> Option<&[f32]> {
    use crate::engine::fused_hyper::{HYPER_LEN, HYPER_LIVE};
    let row = &hyper[i * HYPER_LEN..(i + 1) * HYPER_LEN];
    (row[HYPER_LIVE] != 0.0).then_some(row)
}

/// [`sgd_step`] over `trials` trials of `w.len() / trials` parameters each (trial `i`'s at
/// `i·P`), each with the lr, momentum and weight decay of its row of `hyper`
/// ([`crate::engine::fused_hyper`]). Each trial is one call of [`sgd_step`], so it is bit-identical to
/// that call; a dead trial (`live == 0`) is left untouched.
pub fn sgd_step_batched(w: &mut [f32], g: &[f32], v: &mut [f32], hyper: &[f32], trials: usize) {
    use crate::engine::fused_hyper::{HYPER_LR, HYPER_MOMENTUM, HYPER_WD};
    if trials == 0 {
        return;
    }
    let p = w.len() / trials;
    for i in 0..trials {
        let Some(h) = trial_row(hyper, i) else {
            continue;
        };
        let at = i * p..(i + 1) * p;
        sgd_step(
            &mut w[at.clone()],
            &g[at.clone()],
            &mut v[at],
            h[HYPER_LR],
            h[HYPER_MOMENTUM],
            h[HYPER_WD],
        );
    }
}

/// [`adam_step`] over `trials` trials of `w.len() / trials` parameters each, as
/// [`sgd_step_batched`] is over [`sgd_step`]: each trial reads lr, β1, β2, eps and weight decay
/// from its row of `hyper` and takes its own step `t` (the group's counter `count` less the
/// row's step0, plus one), and a dead trial is left untouched.
#[allow(clippy::too_many_arguments)]
pub fn adam_step_batched(
    w: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    hyper: &[f32],
    trials: usize,
    count: u32,
) {
    use crate::engine::fused_hyper::{
        row_steps, HYPER_BETA1, HYPER_BETA2, HYPER_EPS, HYPER_LR, HYPER_WD,
    };
    if trials == 0 {
        return;
    }
    let p = w.len() / trials;
    for i in 0..trials {
        let Some(h) = trial_row(hyper, i) else {
            continue;
        };
        let at = i * p..(i + 1) * p;
        adam_step(
            &mut w[at.clone()],
            &g[at.clone()],
            &mut m[at.clone()],
            &mut v[at],
            h[HYPER_LR],
            h[HYPER_BETA1],
            h[HYPER_BETA2],
            h[HYPER_EPS],
            h[HYPER_WD],
            // The trial's own step: the group's counter less where it started, plus one.
            row_steps(h, count).wrapping_add(1),
        );
    }
}

#[cfg(test)]
mod batched_tests {
    use super::*;
    use crate::engine::cpu::ops::testing::random;
    use crate::engine::fused_hyper::*;
    use crate::rng::HostRng;

    const P: usize = 37;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// A hyper table of `n` trials with mixed values (momentum and weight decay 0 for some, betas
    /// differing), trial 3 (when there is one) dead.
    fn table(n: usize) -> Vec<f32> {
        let mut h = vec![0.0; n * HYPER_LEN];
        for (i, row) in h.chunks_mut(HYPER_LEN).enumerate() {
            let f = i as f32;
            row[HYPER_LR] = 0.01 + 0.013 * f;
            row[HYPER_WD] = if i % 3 == 0 { 0.0 } else { 1e-3 * f };
            row[HYPER_MOMENTUM] = if i % 2 == 0 { 0.0 } else { 0.9 - 0.01 * f };
            row[HYPER_BETA1] = 0.9 - 0.02 * f;
            row[HYPER_BETA2] = if i % 2 == 0 { 0.999 } else { 0.99 };
            row[HYPER_EPS] = if i % 4 == 0 { 1e-8 } else { 1e-6 };
            row[HYPER_LIVE] = if i == 3 { 0.0 } else { 1.0 };
            // Trials that started at different steps of the group (a slot taken later).
            row[HYPER_STEP0] = f32::from_bits(7 * (i as u32 % 3));
        }
        h
    }

    #[test]
    fn batched_sgd_is_bit_identical_to_one_step_per_trial() {
        for n in [1, 2, 5, 13] {
            let mut rng = HostRng::new(n as u64);
            let hyper = table(n);
            let g = random(&mut rng, n * P, -1.0, 1.0);
            let w0 = random(&mut rng, n * P, -1.0, 1.0);
            let v0 = random(&mut rng, n * P, -1.0, 1.0);
            let (mut w, mut v) = (w0.clone(), v0.clone());
            for _ in 0..3 {
                sgd_step_batched(&mut w, &g, &mut v, &hyper, n);
            }
            for (i, h) in hyper.chunks(HYPER_LEN).enumerate() {
                let at = i * P..(i + 1) * P;
                let (mut wi, mut vi) = (w0[at.clone()].to_vec(), v0[at.clone()].to_vec());
                if h[HYPER_LIVE] != 0.0 {
                    for _ in 0..3 {
                        let (lr, mu, wd) = (h[HYPER_LR], h[HYPER_MOMENTUM], h[HYPER_WD]);
                        sgd_step(&mut wi, &g[at.clone()], &mut vi, lr, mu, wd);
                    }
                }
                assert_eq!(bits(&w[at.clone()]), bits(&wi), "w of trial {i} of {n}");
                assert_eq!(bits(&v[at]), bits(&vi), "v of trial {i} of {n}");
            }
        }
    }

    /// Each trial at its own step: the group's counter `count` less the step it started at.
    #[test]
    fn batched_adam_is_bit_identical_to_one_step_per_trial() {
        for n in [1, 2, 5, 13] {
            let mut rng = HostRng::new(100 + n as u64);
            let hyper = table(n);
            let g = random(&mut rng, n * P, -1.0, 1.0);
            let w0 = random(&mut rng, n * P, -1.0, 1.0);
            let m0 = random(&mut rng, n * P, -0.1, 0.1);
            let v0 = random(&mut rng, n * P, 0.0, 0.1);
            let (mut w, mut m, mut v) = (w0.clone(), m0.clone(), v0.clone());
            for count in 14..17 {
                adam_step_batched(&mut w, &g, &mut m, &mut v, &hyper, n, count);
            }
            for (i, h) in hyper.chunks(HYPER_LEN).enumerate() {
                let at = i * P..(i + 1) * P;
                let mut wi = w0[at.clone()].to_vec();
                let (mut mi, mut vi) = (m0[at.clone()].to_vec(), v0[at.clone()].to_vec());
                if h[HYPER_LIVE] != 0.0 {
                    let step0 = h[HYPER_STEP0].to_bits();
                    for t in 15 - step0..18 - step0 {
                        let gi = &g[at.clone()];
                        let (lr, b1, b2) = (h[HYPER_LR], h[HYPER_BETA1], h[HYPER_BETA2]);
                        let (eps, wd) = (h[HYPER_EPS], h[HYPER_WD]);
                        adam_step(&mut wi, gi, &mut mi, &mut vi, lr, b1, b2, eps, wd, t);
                    }
                }
                assert_eq!(bits(&w[at.clone()]), bits(&wi), "w of trial {i} of {n}");
                assert_eq!(bits(&m[at.clone()]), bits(&mi), "m of trial {i} of {n}");
                assert_eq!(bits(&v[at]), bits(&vi), "v of trial {i} of {n}");
            }
        }
    }

    #[test]
    fn dead_trials_keep_even_nan_untouched() {
        let n = 5;
        let mut hyper = table(n);
        for row in hyper.chunks_mut(HYPER_LEN) {
            row[HYPER_LIVE] = 0.0;
        }
        let g = vec![f32::NAN; n * P];
        let (mut w, mut m, mut v) = (vec![1.5; n * P], vec![0.25; n * P], vec![f32::NAN; n * P]);
        sgd_step_batched(&mut w, &g, &mut v, &hyper, n);
        adam_step_batched(&mut w, &g, &mut m, &mut v, &hyper, n, 1);
        assert!(w.iter().all(|&x| x == 1.5) && m.iter().all(|&x| x == 0.25));
        assert!(v.iter().all(|x| x.is_nan()));
        // No trials, no parameters: nothing to do.
        sgd_step_batched(&mut [], &[], &mut [], &[], 0);
    }
}
