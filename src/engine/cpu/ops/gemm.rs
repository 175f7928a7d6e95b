//! The CPU twin of the backend's GEMM (cuBLAS on the GPU, `src/engine/cuda/blas.rs`): row-major `C = alpha·op(A)·op(B) + beta·C`.

use crate::engine::shapes::GemmShape;

#[cfg(target_arch = "x86_64")]
mod avx512;

/// Whether [`gemm`] and [`gemm_gathered`] run the in-place kernel of `gemm/avx512.rs`: on a host
/// with AVX-512, and `GPUMUX_CPU_SIMD` not capping it. Elsewhere they run [`gemm_portable`].
pub fn in_place() -> bool {
    cfg!(target_arch = "x86_64")
        && crate::engine::cpu::simd::level() == crate::engine::cpu::simd::Level::Avx512
}

/// Row-major `C = alpha·op(A)·op(B) + beta·C` (with `beta == 0`, `C` is overwritten, NaNs included).
/// See `in_place` for which kernel runs it.
pub fn gemm(g: &GemmShape, a: &[f32], b: &[f32], c: &mut [f32]) {
    let (a, b, c) = (&a[..g.a_len()], &b[..g.b_len()], &mut c[..g.c_len()]);
    #[cfg(target_arch = "x86_64")]
    if in_place() {
        // SAFETY: `level` saw AVX-512F on this host, and the slices hold exactly the operands.
        unsafe { avx512::gemm(g, a, b, c) };
        return;
    }
    gemm_portable(g, a, b, c);
}

/// `C = alpha·A·Gᵀ + beta·C` for a row-major `A` (`m × k`) and a matrix `G` (`n × k`) gathered
/// from `x`: `G[j, p] = x[rows[j] + cols[p]]`, with `n = rows.len()` and `k = cols.len()`. This
/// is a convolution's weight gradient `dW = dy·colᵀ` with im2col's column matrix read from the
/// image, never written out. With AVX-512, `G` is read where it lies; elsewhere it is gathered
/// into a matrix for [`gemm_portable`].
///
/// # Panics
/// If an operand's length does not match, or an offset falls outside `x`.
#[allow(clippy::too_many_arguments)]
pub fn gemm_gathered(
    m: usize,
    a: &[f32],
    x: &[f32],
    rows: &[usize],
    cols: &[usize],
    alpha: f32,
    beta: f32,
    c: &mut [f32],
) {
    let (n, k) = (rows.len(), cols.len());
    let (a, c) = (&a[..m * k], &mut c[..m * n]);
    let (row_max, col_max) = (rows.iter().max(), cols.iter().max());
    assert!(
        row_max
            .zip(col_max)
            .is_none_or(|(r, c)| r.checked_add(*c).is_some_and(|end| end < x.len())),
        "gathered offsets reach {row_max:?} + {col_max:?}, past {} elements",
        x.len()
    );
    #[cfg(target_arch = "x86_64")]
    if in_place() {
        // SAFETY: `level` saw AVX-512F; the operands' lengths and every offset are checked above.
        unsafe { avx512::gemm_gathered(m, a, x, rows, cols, alpha, beta, c) };
        return;
    }
    let g: Vec<f32> = rows
        .iter()
        .flat_map(|&r| cols.iter().map(move |&c| x[r + c]))
        .collect();
    let shape = GemmShape {
        trans_b: true,
        alpha,
        beta,
        ..GemmShape::nn(m, n, k)
    };
    gemm_portable(&shape, a, &g, c);
}

/// [`gemm`] through `matrixmultiply`, which packs both operands and picks its kernel for the host.
pub fn gemm_portable(g: &GemmShape, a: &[f32], b: &[f32], c: &mut [f32]) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::ops::testing::*;
    use crate::engine::cpu::ops::{bias_add, bias_grad};
    use crate::rng::HostRng;
    use proptest::prelude::*;

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
        // With beta == 0, C must not be read: stale NaNs there would show.
        let c0 = if g.beta == 0.0 {
            vec![f32::NAN; g.c_len()]
        } else {
            random(&mut rng, g.c_len(), -1.0, 1.0)
        };
        let (want, mag) = naive_gemm(g, &a, &b, &c0);
        type Gemm = fn(&GemmShape, &[f32], &[f32], &mut [f32]);
        let gemms: [(&str, Gemm); 2] = [("gemm", gemm), ("gemm_portable", gemm_portable)];
        for (name, f) in gemms {
            let mut c = c0.clone();
            f(g, &a, &b, &mut c);
            for (i, ((&got, &want), &mag)) in c.iter().zip(&want).zip(&mag).enumerate() {
                assert!(
                    (got as f64 - want).abs() <= 1e-5 * (1.0 + mag),
                    "{name} {g:?} c[{i}]: {got} vs {want}"
                );
            }
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
                // Past one block of the inner dimension, and edges in both directions of C.
                (17, 50, 300),
                (9, 97, 513),
                (64, 128, 784),
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Shapes of the models' size: several blocks of the inner dimension, and every kernel
        /// width with its edges.
        #[test]
        fn gemm_matches_naive_on_model_sized_shapes(
            ta: bool, tb: bool, m in 1usize..100, n in 1usize..100, k in 100usize..600,
            beta in prop_oneof![Just(0.0f32), Just(1.0f32)], seed: u64,
        ) {
            check_gemm(&shape(ta, tb, m, n, k, 1.0, beta), seed);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// The gathered product against the f64 product of the gathered matrix written out, and
        /// against `gemm` on it: to the bit where `gemm` takes the same route (`m ≤ n`: on
        /// AVX-512 both read that matrix as the kernel's `A`; elsewhere both are the portable
        /// GEMM).
        #[test]
        fn gathered_gemm_is_gemm_on_the_matrix_it_gathers(
            m in 1usize..70, n in 1usize..90, k in 1usize..300,
            alpha in prop_oneof![Just(1.0f32), -2.0f32..2.0],
            beta in prop_oneof![Just(0.0f32), Just(1.0f32), -2.0f32..2.0],
            seed: u64,
        ) {
            let mut rng = HostRng::new(seed);
            let x = random(&mut rng, 2000, -1.0, 1.0);
            let rows: Vec<usize> = (0..n).map(|_| rng.below(1000)).collect();
            let cols: Vec<usize> = (0..k).map(|_| rng.below(1000)).collect();
            let a = random(&mut rng, m * k, -1.0, 1.0);
            // With beta == 0, C must not be read: stale NaNs there would show.
            let c0 = if beta == 0.0 { vec![f32::NAN; m * n] } else { random(&mut rng, m * n, -1.0, 1.0) };
            let xs = &x;
            let g: Vec<f32> = rows.iter().flat_map(|&r| cols.iter().map(move |&c| xs[r + c])).collect();
            let shape = GemmShape { trans_b: true, alpha, beta, ..GemmShape::nn(m, n, k) };
            let mut want = c0.clone();
            gemm(&shape, &a, &g, &mut want);
            let mut got = c0.clone();
            gemm_gathered(m, &a, &x, &rows, &cols, alpha, beta, &mut got);
            let (exact, mag) = naive_gemm(&shape, &a, &g, &c0);
            for ((&got, &exact), &mag) in got.iter().zip(&exact).zip(&mag) {
                prop_assert!((got as f64 - exact).abs() <= 1e-5 * (1.0 + mag), "{} vs {}", got, exact);
            }
            if m <= n {
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&got), bits(&want));
            }
        }
    }

    #[test]
    #[should_panic(expected = "gathered offsets reach")]
    fn gathered_offsets_past_the_image_are_refused() {
        let mut c = vec![0.0; 2];
        gemm_gathered(
            1,
            &[1.0; 3],
            &[0.0; 10],
            &[0, 5],
            &[0, 2, 5],
            1.0,
            0.0,
            &mut c,
        );
    }

    #[test]
    #[should_panic(expected = "gathered offsets reach")]
    fn gathered_offsets_that_overflow_are_refused() {
        let mut c = vec![0.0; 2];
        gemm_gathered(
            1,
            &[1.0; 2],
            &[0.0; 10],
            &[0, 1],
            &[usize::MAX, 1],
            1.0,
            0.0,
            &mut c,
        );
    }

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
}

/// [`gemm`] over a batch: `C_i = alpha·op(A_i)·op(B_i) + beta·C_i` for `i < batch.count`, where
/// `X_i` starts `i·stride_x` elements into `X` (a stride of 0 shares the operand). Each GEMM is
/// one call of [`gemm`], so its result is bit-identical to that call's. The slices hold the
/// batch's spans ([`GemmBatch::a_span`](crate::engine::GemmBatch::a_span) …), and `C`'s
/// operands do not overlap (the backend contract checks both).
pub fn gemm_batched(
    g: &GemmShape,
    batch: &crate::engine::GemmBatch,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
) {
    for i in 0..batch.count {
        gemm(
            g,
            &a[i * batch.stride_a..],
            &b[i * batch.stride_b..],
            &mut c[i * batch.stride_c..],
        );
    }
}

#[cfg(test)]
mod batched_tests {
    use super::*;
    use crate::engine::cpu::ops::testing::random;
    use crate::engine::GemmBatch;
    use crate::rng::HostRng;
    use proptest::prelude::*;

    /// Runs `gemm_batched` and `batch.count` calls of `gemm` on the same random operands (laid
    /// out with the batch's strides behind an offset of `lead` elements) and asserts the results
    /// are bit-identical, and that C's elements outside the outputs are left alone.
    fn check_batched(g: &GemmShape, batch: &GemmBatch, lead: usize, seed: u64) {
        let mut rng = HostRng::new(seed);
        let a = random(&mut rng, lead + batch.a_span(g).unwrap(), -1.0, 1.0);
        let b = random(&mut rng, lead + batch.b_span(g).unwrap(), -1.0, 1.0);
        let c0 = random(&mut rng, lead + batch.c_span(g).unwrap(), -1.0, 1.0);
        let mut got = c0.clone();
        gemm_batched(g, batch, &a[lead..], &b[lead..], &mut got[lead..]);
        let mut want = c0.clone();
        for i in 0..batch.count {
            let (ao, bo, co) = (
                lead + i * batch.stride_a,
                lead + i * batch.stride_b,
                lead + i * batch.stride_c,
            );
            gemm(
                g,
                &a[ao..ao + g.a_len()],
                &b[bo..bo + g.b_len()],
                &mut want[co..co + g.c_len()],
            );
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{g:?} {batch:?} lead {lead}");
    }

    fn shape(trans_a: bool, trans_b: bool, m: usize, n: usize, k: usize) -> GemmShape {
        GemmShape {
            trans_a,
            trans_b,
            m,
            n,
            k,
            alpha: 0.75,
            beta: -1.25,
        }
    }

    #[test]
    fn batched_gemm_is_bit_identical_to_one_call_per_gemm() {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            for (m, n, k) in [(7, 5, 9), (1, 13, 3), (33, 19, 65), (64, 10, 128)] {
                let g = shape(ta, tb, m, n, k);
                for (alpha, beta) in [(1.0, 0.0), (0.75, -1.25)] {
                    let g = GemmShape { alpha, beta, ..g };
                    // Packed, padded to odd strides, and each operand shared in turn.
                    let packed = GemmBatch {
                        count: 5,
                        stride_a: g.a_len(),
                        stride_b: g.b_len(),
                        stride_c: g.c_len(),
                    };
                    let padded = GemmBatch {
                        stride_a: g.a_len() + 3,
                        stride_b: g.b_len() + 1,
                        stride_c: g.c_len() + 7,
                        ..packed
                    };
                    let shared_a = GemmBatch {
                        stride_a: 0,
                        ..padded
                    };
                    let shared_b = GemmBatch {
                        stride_b: 0,
                        ..packed
                    };
                    for (i, batch) in [packed, padded, shared_a, shared_b].iter().enumerate() {
                        check_batched(&g, batch, i, (m * 131 + n * 7 + k + i) as u64);
                    }
                }
            }
        }
    }

    #[test]
    fn batched_gemm_with_beta_zero_overwrites_nan_in_every_output() {
        let g = GemmShape {
            trans_a: true,
            ..GemmShape::nn(6, 4, 5)
        };
        let batch = GemmBatch {
            count: 3,
            stride_a: g.a_len(),
            stride_b: 0,
            stride_c: g.c_len(),
        };
        let mut rng = HostRng::new(9);
        let a = random(&mut rng, batch.a_span(&g).unwrap(), -1.0, 1.0);
        let b = random(&mut rng, g.b_len(), -1.0, 1.0);
        let mut c = vec![f32::NAN; batch.c_span(&g).unwrap()];
        gemm_batched(&g, &batch, &a, &b, &mut c);
        assert!(c.iter().all(|x| x.is_finite()), "{c:?}");
    }

    #[test]
    fn an_empty_batch_touches_nothing() {
        let g = GemmShape::nn(3, 3, 3);
        let batch = GemmBatch {
            count: 0,
            stride_a: 9,
            stride_b: 9,
            stride_c: 9,
        };
        let mut c = [];
        gemm_batched(&g, &batch, &[], &[], &mut c);
    }

    proptest! {
        #[test]
        fn batched_gemm_matches_single_calls_on_random_shapes(
            ta: bool, tb: bool, m in 0usize..9, n in 0usize..9, k in 0usize..9,
            count in 0usize..6, share in 0usize..3, pad in 0usize..4, seed: u64,
        ) {
            let g = shape(ta, tb, m, n, k);
            let batch = GemmBatch {
                count,
                stride_a: if share == 1 { 0 } else { g.a_len() + pad },
                stride_b: if share == 2 { 0 } else { g.b_len() + pad },
                stride_c: g.c_len() + pad,
            };
            check_batched(&g, &batch, pad, seed);
        }
    }
}
