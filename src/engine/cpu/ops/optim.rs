//! The CPU twins of `kernels/optim.cu`: the SGD and Adam steps.

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
