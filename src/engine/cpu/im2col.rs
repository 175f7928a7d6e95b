//! The im2col lowering of a zero-padded, strided convolution, and its adjoint col2im.
//!
//! For one sample, the column matrix has `c_in·k·k` rows, indexed `(ci, ky, kx)`, and
//! `h_out·w_out` columns, indexed `(oy, ox)`:
//! `col[(ci, ky, kx), (oy, ox)] = x[ci, oy·stride+ky-pad, ox·stride+kx-pad]`,
//! zero where that position falls in the padding.

use crate::engine::cpu::simd::multiversion;

use crate::engine::shapes::Conv2dShape;

/// One output row of one column-matrix row: `w_out` entries starting at `col`, of which those in
/// `lo..hi` read the input row from `x` (at `lo`) onwards, every `stride`-th element; `x` is `None`
/// when all `w_out` entries are padding.
struct Segment {
    col: usize,
    x: Option<usize>,
    lo: usize,
    hi: usize,
}

/// Calls `f` on every segment of one sample's column matrix, in memory order.
#[inline(always)]
fn for_each_segment(s: &Conv2dShape, mut f: impl FnMut(Segment)) {
    let (ho, wo, pad, st) = (s.h_out(), s.w_out(), s.pad, s.stride.max(1));
    let mut col = 0;
    for ci in 0..s.c_in {
        let plane = ci * s.h * s.w;
        for ky in 0..s.k {
            for kx in 0..s.k {
                // Output columns whose input column `ox·stride + kx - pad` lies in `0..w`.
                let lo = pad.saturating_sub(kx).div_ceil(st).min(wo);
                let hi = (s.w + pad).saturating_sub(kx).div_ceil(st).min(wo).max(lo);
                for oy in 0..ho {
                    let iy = (oy * st + ky)
                        .checked_sub(pad)
                        .filter(|&iy| iy < s.h && lo < hi);
                    let x = iy.map(|iy| plane + iy * s.w + lo * st + kx - pad);
                    f(Segment { col, x, lo, hi });
                    col += wo;
                }
            }
        }
    }
}

/// `dst.copy_from_slice(src)` for the short runs of im2col (an output row: tens of floats), in
/// blocks of 16 and 8 that compile to vector moves, where `copy_from_slice` calls `memmove` for
/// every run.
#[inline(always)]
fn copy_run(dst: &mut [f32], src: &[f32]) {
    debug_assert_eq!(dst.len(), src.len());
    let (d16, dst) = dst.as_chunks_mut::<16>();
    let (s16, src) = src.as_chunks::<16>();
    for (d, s) in d16.iter_mut().zip(s16) {
        *d = *s;
    }
    let (d8, dst) = dst.as_chunks_mut::<8>();
    let (s8, src) = src.as_chunks::<8>();
    for (d, s) in d8.iter_mut().zip(s8) {
        *d = *s;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s;
    }
}

multiversion! {
    /// Writes the column matrix of one sample `x` (`c_in·h·w`) into `col` (`s.ws_len()`).
    pub fn im2col / im2col_baseline(s: &Conv2dShape, x: &[f32], col: &mut [f32]) {
        let (wo, st) = (s.w_out(), s.stride.max(1));
        if s.pad == 0 && st == 1 {
            // No padding, unit stride: every segment is a whole run of the input row, copied
            // in plain loops with no per-segment bookkeeping.
            let (plane, ho) = (s.h * s.w, s.h_out());
            let mut at = 0;
            for ci in 0..s.c_in {
                for ky in 0..s.k {
                    for kx in 0..s.k {
                        for oy in 0..ho {
                            let from = ci * plane + (oy + ky) * s.w + kx;
                            copy_run(&mut col[at..at + wo], &x[from..from + wo]);
                            at += wo;
                        }
                    }
                }
            }
            return;
        }
        // Inlined, so that the body is compiled for this function's vector width (a closure on
        // its own is compiled for the baseline).
        for_each_segment(s, #[inline(always)] |seg| {
            let dst = &mut col[seg.col..seg.col + wo];
            match seg.x {
                None => dst.fill(0.0),
                Some(x0) => {
                    dst[..seg.lo].fill(0.0);
                    let n = seg.hi - seg.lo;
                    if st == 1 {
                        copy_run(&mut dst[seg.lo..seg.hi], &x[x0..x0 + n]);
                    } else {
                        for (d, &v) in dst[seg.lo..seg.hi]
                            .iter_mut()
                            .zip(x[x0..].iter().step_by(st))
                        {
                            *d = v;
                        }
                    }
                    dst[seg.hi..].fill(0.0);
                }
            }
        });
    }
}

multiversion! {
    /// The adjoint of [`im2col`]: overwrites one sample `dx` (`c_in·h·w`) with the sum, over every
    /// column-matrix entry, of that entry added into the input position it was read from.
    pub fn col2im / col2im_baseline(s: &Conv2dShape, col: &[f32], dx: &mut [f32]) {
        let st = s.stride.max(1);
        dx[..s.c_in * s.h * s.w].fill(0.0);
        for_each_segment(s, #[inline(always)] |seg| {
            if let Some(x0) = seg.x {
                let src = &col[seg.col + seg.lo..seg.col + seg.hi];
                if st == 1 {
                    // Contiguous: a plain slice add, which the compiler vectorises.
                    for (d, &c) in dx[x0..x0 + src.len()].iter_mut().zip(src) {
                        *d += c;
                    }
                } else {
                    for (d, &c) in dx[x0..].iter_mut().step_by(st).zip(src) {
                        *d += c;
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::ops::testing::random;
    use crate::rng::HostRng;

    fn shapes() -> Vec<Conv2dShape> {
        let mut v = Vec::new();
        for (k, pad) in [(3, 0), (3, 1), (5, 0), (5, 2), (5, 1)] {
            for (h, w) in [(5, 6), (7, 5), (9, 9)] {
                v.push(Conv2dShape {
                    n: 1,
                    c_in: 2,
                    h,
                    w,
                    c_out: 1,
                    k,
                    pad,
                    stride: 1,
                });
            }
        }
        // Output rows of 26 and of 31 (no padding, unit stride): the copies in blocks of 16, of
        // 8 and element by element.
        for w in [28, 33] {
            v.push(Conv2dShape {
                n: 1,
                c_in: 2,
                h: 5,
                w,
                c_out: 1,
                k: 3,
                pad: 0,
                stride: 1,
            });
        }
        // Images narrower than the kernel, saved only by the padding.
        v.push(Conv2dShape {
            n: 1,
            c_in: 1,
            h: 1,
            w: 2,
            c_out: 1,
            k: 5,
            pad: 2,
            stride: 1,
        });
        v.push(Conv2dShape {
            n: 1,
            c_in: 3,
            h: 3,
            w: 1,
            c_out: 1,
            k: 3,
            pad: 1,
            stride: 1,
        });
        // Strided, as in ResNet: 1×1/2, 3×3/2 pad 1, 7×7/2 pad 3, and a stride larger than k.
        for (k, pad, stride) in [(1, 0, 2), (3, 1, 2), (7, 3, 2), (3, 0, 3), (2, 1, 3)] {
            for (h, w) in [(7, 8), (9, 9), (4, 5)] {
                v.push(Conv2dShape {
                    n: 1,
                    c_in: 2,
                    h,
                    w,
                    c_out: 1,
                    k,
                    pad,
                    stride,
                });
            }
        }
        v.retain(|s| s.fits());
        v
    }

    /// The defining formula, one entry at a time.
    fn naive_im2col(s: &Conv2dShape, x: &[f32]) -> Vec<f32> {
        let (ho, wo) = (s.h_out(), s.w_out());
        let mut col = Vec::new();
        for ci in 0..s.c_in {
            for ky in 0..s.k {
                for kx in 0..s.k {
                    for oy in 0..ho {
                        for ox in 0..wo {
                            let iy = (oy * s.stride + ky) as isize - s.pad as isize;
                            let ix = (ox * s.stride + kx) as isize - s.pad as isize;
                            let inside =
                                (0..s.h as isize).contains(&iy) && (0..s.w as isize).contains(&ix);
                            col.push(if inside {
                                x[ci * s.h * s.w + iy as usize * s.w + ix as usize]
                            } else {
                                0.0
                            });
                        }
                    }
                }
            }
        }
        col
    }

    #[test]
    fn im2col_matches_the_definition_and_overwrites() {
        let mut rng = HostRng::new(11);
        for s in shapes() {
            let x = random(&mut rng, s.x_len(), -1.0, 1.0);
            let mut col = vec![f32::NAN; s.ws_len()];
            im2col(&s, &x, &mut col);
            assert_eq!(col, naive_im2col(&s, &x), "{s:?}");
        }
    }

    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        // <im2col(x), c> == <x, col2im(c)> for random x and c, computed in f64.
        let mut rng = HostRng::new(12);
        for s in shapes() {
            let x = random(&mut rng, s.x_len(), -1.0, 1.0);
            let c = random(&mut rng, s.ws_len(), -1.0, 1.0);
            let mut col = vec![0.0; s.ws_len()];
            im2col(&s, &x, &mut col);
            let mut back = vec![f32::NAN; s.x_len()];
            col2im(&s, &c, &mut back);
            let lhs: f64 = col.iter().zip(&c).map(|(&a, &b)| a as f64 * b as f64).sum();
            let rhs: f64 = x
                .iter()
                .zip(&back)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum();
            assert!(
                (lhs - rhs).abs() <= 1e-5 * (1.0 + lhs.abs()),
                "{s:?}: {lhs} vs {rhs}"
            );
        }
    }
}
