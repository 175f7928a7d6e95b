//! The CPU twins of `kernels/pool.cu`: max pooling forward and backward.

use crate::engine::cpu::simd::multiversion;

use crate::engine::shapes::PoolShape;

/// Plane indices of the window of output pixel `(oy, ox)` that fall inside the plane,
/// row-major within the window (padding positions are skipped: they never win).
fn window(s: &PoolShape, oy: usize, ox: usize) -> impl Iterator<Item = usize> {
    let (h, w, win) = (s.h, s.w, s.window());
    (0..win.k).flat_map(move |ky| {
        let iy = win.input(oy, ky).filter(|&iy| iy < h);
        (0..win.k).filter_map(move |kx| {
            let ix = win.input(ox, kx).filter(|&ix| ix < w)?;
            Some(iy? * w + ix)
        })
    })
}

/// Max over each window.
pub fn maxpool_fwd(s: &PoolShape, x: &[f32], y: &mut [f32]) {
    if s.pad == 0 {
        maxpool_fwd_unpadded(s, x, y)
    } else {
        maxpool_fwd_windowed(s, x, y)
    }
}

multiversion! {
    /// [`maxpool_fwd`] when `pad == 0`: every window lies inside the plane and is indexed directly,
    /// in the same row-major order.
    fn maxpool_fwd_unpadded / maxpool_fwd_unpadded_baseline(s: &PoolShape, x: &[f32], y: &mut [f32]) {
        let (plane, ho, wo) = (s.h * s.w, s.h_out(), s.w_out());
        let (k, st, w) = (s.k, s.stride.max(1), s.w);
        for p in 0..s.n * s.c {
            let xp = &x[p * plane..(p + 1) * plane];
            let yp = &mut y[p * ho * wo..(p + 1) * ho * wo];
            if k == 2 && st == 2 {
                // The common 2×2/2 pool, one pair of input rows at a time.
                for (oy, yr) in yp.chunks_exact_mut(wo).enumerate() {
                    let r0 = &xp[2 * oy * w..2 * oy * w + 2 * wo];
                    let r1 = &xp[(2 * oy + 1) * w..(2 * oy + 1) * w + 2 * wo];
                    for ((out, a), b) in yr
                        .iter_mut()
                        .zip(r0.chunks_exact(2))
                        .zip(r1.chunks_exact(2))
                    {
                        let mut max = a[0];
                        for v in [a[1], b[0], b[1]] {
                            if v > max {
                                max = v;
                            }
                        }
                        *out = max;
                    }
                }
                continue;
            }
            for oy in 0..ho {
                for (ox, out) in yp[oy * wo..(oy + 1) * wo].iter_mut().enumerate() {
                    let base = oy * st * w + ox * st;
                    let mut max = xp[base];
                    for ky in 0..k {
                        for &v in &xp[base + ky * w..base + ky * w + k] {
                            if v > max {
                                max = v;
                            }
                        }
                    }
                    *out = max;
                }
            }
        }
    }
}

/// [`maxpool_fwd`] for any padding, through [`window`].
fn maxpool_fwd_windowed(s: &PoolShape, x: &[f32], y: &mut [f32]) {
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
    dx[..s.x_len()].fill(0.0);
    if s.pad == 0 {
        maxpool_bwd_unpadded(s, x, y, dy, dx)
    } else {
        maxpool_bwd_windowed(s, x, y, dy, dx)
    }
}

multiversion! {
    /// [`maxpool_bwd`] into a zeroed `dx` when `pad == 0`, indexing each window directly in the same
    /// row-major order.
    fn maxpool_bwd_unpadded / maxpool_bwd_unpadded_baseline(s: &PoolShape, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32]) {
        let (plane, ho, wo) = (s.h * s.w, s.h_out(), s.w_out());
        let (k, st, w) = (s.k, s.stride.max(1), s.w);
        for p in 0..s.n * s.c {
            let xp = &x[p * plane..(p + 1) * plane];
            let dxp = &mut dx[p * plane..(p + 1) * plane];
            if k == 2 && st == 2 {
                // The common 2×2/2 pool: windows do not overlap, so each gradient lands alone on
                // the first element equal to the maximum, and the others of its window stay 0.
                // Without branches: which element holds the maximum is as good as random.
                for oy in 0..ho {
                    let (r0, r1) = (2 * oy * w, (2 * oy + 1) * w);
                    for ox in 0..wo {
                        let o = p * ho * wo + oy * wo + ox;
                        let (i0, i1) = (r0 + 2 * ox, r1 + 2 * ox);
                        let (m, d) = (y[o], dy[o]);
                        let e0 = xp[i0] == m;
                        let e1 = !e0 & (xp[i0 + 1] == m);
                        let e2 = !(e0 | e1) & (xp[i1] == m);
                        let e3 = !(e0 | e1 | e2) & (xp[i1 + 1] == m);
                        // `0.0 + d` is what adding into the zeroed dx gives (a -0.0 becomes +0.0).
                        let put = |hit: bool| if hit { 0.0 + d } else { 0.0 };
                        dxp[i0] = put(e0);
                        dxp[i0 + 1] = put(e1);
                        dxp[i1] = put(e2);
                        dxp[i1 + 1] = put(e3);
                    }
                }
                continue;
            }
            for oy in 0..ho {
                for ox in 0..wo {
                    let o = p * ho * wo + oy * wo + ox;
                    let base = oy * st * w + ox * st;
                    let hit = (0..k).find_map(|ky| {
                        let row = base + ky * w;
                        xp[row..row + k]
                            .iter()
                            .position(|&v| v == y[o])
                            .map(|kx| row + kx)
                    });
                    if let Some(i) = hit {
                        dxp[i] += dy[o];
                    }
                }
            }
        }
    }
}

/// [`maxpool_bwd`] into a zeroed `dx` for any padding, through [`window`].
fn maxpool_bwd_windowed(s: &PoolShape, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32]) {
    let (plane, ho, wo) = (s.h * s.w, s.h_out(), s.w_out());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::ops::testing::*;
    use crate::rng::HostRng;

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

    /// Max pooling's input gradient against finite differences, on distinct inputs 0.1 apart
    /// (> 2·EPS, so no perturbation changes a window's argmax); returns the gradient.
    fn gradient_check(s: &PoolShape, seed: u64, name: &str) -> Vec<f32> {
        let mut rng = HostRng::new(seed);
        let x: Vec<f32> = rng
            .permutation(s.x_len())
            .iter()
            .map(|&i| i as f32 * 0.1 - 5.0)
            .collect();
        let r = random(&mut rng, s.y_len(), -1.0, 1.0);
        let pool = |x: &[f32]| {
            let mut y = vec![f32::NAN; s.y_len()];
            maxpool_fwd(s, x, &mut y);
            y
        };
        let y = pool(&x);
        let mut dx = vec![f32::NAN; s.x_len()];
        maxpool_bwd(s, &x, &y, &r, &mut dx);
        check_grad(name, &x, &dx, |x| dot(&r, &pool(x)));
        dx
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
        let dx = gradient_check(&s, 41, "maxpool dx");
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
        gradient_check(&s, 42, "overlapping maxpool dx");
    }

    #[test]
    fn unpadded_paths_match_the_windowed_ones_bit_for_bit() {
        // Coarse values give ties; a few NaNs test the comparison order.
        let mut rng = HostRng::new(43);
        for k in 1..=4 {
            for stride in 1..=4 {
                for (h, w) in [(4, 4), (7, 6), (9, 11)] {
                    let s = PoolShape {
                        n: 2,
                        c: 2,
                        h,
                        w,
                        k,
                        stride,
                        pad: 0,
                    };
                    if !s.fits() {
                        continue;
                    }
                    let mut x: Vec<f32> = random(&mut rng, s.x_len(), -3.0, 3.0)
                        .iter()
                        .map(|v| v.round())
                        .collect();
                    for i in (0..x.len()).step_by(13) {
                        x[i] = f32::NAN;
                    }
                    let dy = random(&mut rng, s.y_len(), -1.0, 1.0);
                    let (mut y1, mut y2) = (vec![0.0; s.y_len()], vec![1.0; s.y_len()]);
                    maxpool_fwd_unpadded(&s, &x, &mut y1);
                    maxpool_fwd_windowed(&s, &x, &mut y2);
                    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&y1), bits(&y2), "{s:?}");
                    let (mut d1, mut d2) = (vec![0.0; s.x_len()], vec![0.0; s.x_len()]);
                    maxpool_bwd_unpadded(&s, &x, &y1, &dy, &mut d1);
                    maxpool_bwd_windowed(&s, &x, &y1, &dy, &mut d2);
                    assert_eq!(bits(&d1), bits(&d2), "{s:?}");
                }
            }
        }
    }
}
