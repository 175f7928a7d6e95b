//! The CPU twins of `kernels/conv.cu`: convolution forward and backward through im2col, and the bias gradient.

use crate::engine::cpu::simd::multiversion;

use super::super::im2col::{col2im, im2col};
use super::gemm;
use super::gemm::gemm_gathered;
use crate::engine::shapes::{Conv2dShape, GemmShape};

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
    // With AVX-512, dw reads the column matrix straight from the image (zero-padded into `ws`
    // first when the convolution pads and `ws` has the room), so only dx's path writes a column
    // matrix. Elsewhere the gathered product would write it out anyway, so im2col does.
    let (hp, wp) = (s.h + 2 * s.pad, s.w + 2 * s.pad);
    let padded_len = s.c_in * hp * wp;
    let gather = (gemm::in_place() && !s.is_pointwise() && (s.pad == 0 || padded_len <= ws.len()))
        .then(|| gather_offsets(s, hp, wp));
    for i in 0..s.n {
        let dyi = &dy[i * y_n..(i + 1) * y_n];
        let xi = &x[i * x_n..(i + 1) * x_n];
        if s.is_pointwise() {
            gemm(&dw_g, dyi, xi, dw);
            if let Some(dx) = dx.as_deref_mut() {
                gemm(&col_g, w, dyi, &mut dx[i * x_n..(i + 1) * x_n]);
            }
        } else if let Some((rows, cols)) = &gather {
            let image: &[f32] = if s.pad == 0 {
                xi
            } else {
                pad_into(s, xi, &mut ws[..padded_len]);
                &ws[..padded_len]
            };
            gemm_gathered(s.c_out, dyi, image, rows, cols, 1.0, 1.0, dw);
            if let Some(dx) = dx.as_deref_mut() {
                gemm(&col_g, w, dyi, ws);
                col2im(s, ws, &mut dx[i * x_n..(i + 1) * x_n]);
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

/// The offsets that gather one sample's im2col column matrix from its image, zero-padded to
/// `hp × wp` planes: `col[(ci, ky, kx), (oy, ox)] = image[rows[(ci, ky, kx)] + cols[(oy, ox)]]`.
fn gather_offsets(s: &Conv2dShape, hp: usize, wp: usize) -> (Vec<usize>, Vec<usize>) {
    let st = s.stride.max(1);
    let mut rows = Vec::with_capacity(s.c_in * s.k * s.k);
    for ci in 0..s.c_in {
        for ky in 0..s.k {
            for kx in 0..s.k {
                rows.push(ci * hp * wp + ky * wp + kx);
            }
        }
    }
    let mut cols = Vec::with_capacity(s.h_out() * s.w_out());
    for oy in 0..s.h_out() {
        for ox in 0..s.w_out() {
            cols.push(oy * st * wp + ox * st);
        }
    }
    (rows, cols)
}

/// Copies one sample's image `x` into `out` with a border of `s.pad` zeros around each plane.
fn pad_into(s: &Conv2dShape, x: &[f32], out: &mut [f32]) {
    let (p, h, w) = (s.pad, s.h, s.w);
    let wp = w + 2 * p;
    out.fill(0.0);
    for (plane, xp) in out
        .chunks_exact_mut((h + 2 * p) * wp)
        .zip(x.chunks_exact(h * w))
    {
        for (y, row) in xp.chunks_exact(w).enumerate() {
            let at = (y + p) * wp + p;
            plane[at..at + w].copy_from_slice(row);
        }
    }
}

multiversion! {
    /// `db[co] = Σ over samples and output pixels of dy[n, co]` (overwrites `db`).
    fn conv_bias_grad / conv_bias_grad_baseline(s: &Conv2dShape, dy: &[f32], db: &mut [f32]) {
        let hw = s.h_out() * s.w_out();
        let db = &mut db[..s.c_out];
        db.fill(0.0);
        for i in 0..s.n {
            for (co, d) in db.iter_mut().enumerate() {
                let start = (i * s.c_out + co) * hw;
                *d += lane_sum(&dy[start..start + hw]);
            }
        }
    }
}

/// The sum of `v` in 16 interleaved partial sums (in a fixed order, so the same on every run),
/// which the compiler vectorises.
#[inline(always)]
fn lane_sum(v: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0.0f32; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::ops::testing::*;
    use crate::rng::HostRng;

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
            // Its padded image (2·8·9) is larger than its column matrix (2·4·4·4): the weight
            // gradient then goes through im2col rather than gathering.
            (2, 1, 2),
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

    #[test]
    fn lane_sum_matches_the_sum_in_f64() {
        let mut rng = HostRng::new(33);
        for len in 0..70 {
            let v = random(&mut rng, len, -1.0, 1.0);
            let want: f64 = v.iter().map(|&x| x as f64).sum();
            let got = lane_sum(&v) as f64;
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + len as f64),
                "{len}: {got} vs {want}"
            );
        }
    }
}
