//! cuBLAS for a trial: a handle bound to its stream and workspace, and row-major GEMM on column-major cuBLAS.

use std::sync::Arc;

use cudarc::cublas::sys as blas;
use cudarc::driver::sys;

use super::capture_hold;
use super::entered::Entered;
use super::status::{check_blas, to_i32};
use super::stream::Stream;
use crate::engine::{GemmBatch, GemmShape};
use crate::error::EngineError;

/// A column-major `sgemm` call: `C = alpha·op(first)·op(second) + beta·C`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ColGemm {
    pub trans_first: bool,
    pub trans_second: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub ld_first: i32,
    pub ld_second: i32,
    pub ldc: i32,
}

/// Row-major leading dimensions of a GEMM's operands: the distance between the starts of two
/// rows of `A`, `B` and `C` as stored (so at least their rows' lengths).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lds {
    pub a: usize,
    pub b: usize,
    pub c: usize,
}

impl Lds {
    /// Dense operands: each row right after the one before.
    pub(crate) fn dense(g: &GemmShape) -> Lds {
        Lds {
            a: if g.trans_a { g.m } else { g.k },
            b: if g.trans_b { g.k } else { g.n },
            c: g.n,
        }
    }
}

/// The column-major call that computes the row-major `C = op(A)·op(B)` of `g` on dense operands.
pub(crate) fn col_major(g: &GemmShape) -> Result<ColGemm, EngineError> {
    col_major_ld(g, Lds::dense(g))
}

/// The column-major call that computes the row-major `C = op(A)·op(B)` of `g`, its operands'
/// rows `ld` apart.
///
/// A row-major `r×c` matrix is, read column-major, its `c×r` transpose. So cuBLAS computes
/// `Cᵀ = op(B)ᵀ·op(A)ᵀ`: the first operand is B, the second is A, each with its own transpose
/// flag, and `m`/`n` swap. Leading dimensions are the row-major row strides.
pub(crate) fn col_major_ld(g: &GemmShape, ld: Lds) -> Result<ColGemm, EngineError> {
    let dim = |what, v: usize| to_i32("gemm", what, v);
    let dense = Lds::dense(g);
    if ld.a < dense.a || ld.b < dense.b || ld.c < dense.c {
        return Err(EngineError::Shape {
            op: "gemm",
            message: format!("rows {ld:?} apart are shorter than the matrices' rows {dense:?}"),
        });
    }
    Ok(ColGemm {
        trans_first: g.trans_b,
        trans_second: g.trans_a,
        m: dim("n", g.n)?,
        n: dim("m", g.m)?,
        k: dim("k", g.k)?,
        ld_first: dim("ldb", ld.b.max(1))?,
        ld_second: dim("lda", ld.a.max(1))?,
        ldc: dim("ldc", ld.c.max(1))?,
    })
}

fn op(trans: bool) -> blas::cublasOperation_t {
    if trans {
        blas::cublasOperation_t::CUBLAS_OP_T
    } else {
        blas::cublasOperation_t::CUBLAS_OP_N
    }
}

/// Binds a new handle to `stream` and sets its math mode (its context is current).
fn configure(handle: blas::cublasHandle_t, stream: &Stream, tf32: bool) -> Result<(), EngineError> {
    // SAFETY: both handles are live; cuBLAS's stream type is the driver's CUstream.
    let r = unsafe { blas::cublasSetStream_v2(handle, stream.raw() as blas::cudaStream_t) };
    check_blas(r, "cublasSetStream_v2")?;
    let mode = if tf32 {
        blas::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
    } else {
        blas::cublasMath_t::CUBLAS_DEFAULT_MATH
    };
    // SAFETY: the handle is live.
    check_blas(
        unsafe { blas::cublasSetMathMode(handle, mode) },
        "cublasSetMathMode",
    )
}

/// A cuBLAS handle bound to one stream.
pub(crate) struct Blas {
    handle: blas::cublasHandle_t,
    stream: Arc<Stream>,
}

// SAFETY: a cuBLAS handle may be used from any thread, one at a time; `Blas` is owned by one
// backend, which one thread uses at a time, and every call enters the stream's context.
unsafe impl Send for Blas {}

impl Blas {
    /// A handle on `stream`'s context, issuing to `stream`, with TF32 tensor cores when `tf32`
    /// (else cuBLAS's default FP32 math).
    pub(crate) fn new(stream: Arc<Stream>, tf32: bool) -> Result<Blas, EngineError> {
        // Creating a handle may synchronise the device, which would break another thread's
        // capture: it waits until none is under way, as cuDNN's handles do.
        let handle = capture_hold::without_captures(|| -> Result<_, EngineError> {
            let _in = stream.ctx().enter()?;
            let mut handle = std::ptr::null_mut();
            // SAFETY: writes one handle; the stream's context is current, so cuBLAS binds to it.
            check_blas(
                unsafe { blas::cublasCreate_v2(&mut handle) },
                "cublasCreate_v2",
            )?;
            if let Err(e) = configure(handle, &stream, tf32) {
                // Destroyed here, inside the context, rather than by Drop (which enters it).
                // SAFETY: the handle was just created and is destroyed once.
                let _ = unsafe { blas::cublasDestroy_v2(handle) };
                return Err(e);
            }
            Ok(handle)
        })?;
        Ok(Blas { handle, stream })
    }

    /// Gives cuBLAS `bytes` of workspace at `ptr` (so that it allocates nothing, not even while a
    /// graph is captured). The memory must outlive every GEMM issued with this handle.
    pub(crate) fn set_workspace(
        &self,
        _in: &Entered,
        ptr: sys::CUdeviceptr,
        bytes: usize,
    ) -> Result<(), EngineError> {
        // SAFETY: `ptr..ptr+bytes` is device memory of the handle's device, 256-byte aligned.
        let r = unsafe { blas::cublasSetWorkspace_v2(self.handle, ptr as *mut _, bytes) };
        check_blas(r, "cublasSetWorkspace_v2")
    }

    /// Row-major `C = alpha·op(A)·op(B) + beta·C` on device pointers holding at least
    /// `g.a_len()`, `g.b_len()` and `g.c_len()` floats.
    pub(crate) fn gemm(
        &self,
        _in: &Entered,
        g: &GemmShape,
        a: sys::CUdeviceptr,
        b: sys::CUdeviceptr,
        c: sys::CUdeviceptr,
    ) -> Result<(), EngineError> {
        let cm = col_major(g)?;
        // SAFETY: the stream's context is current (`_in`); the caller guarantees the pointers
        // hold the operands' extents, which `cm` describes; alpha and beta are host values
        // (cuBLAS's default pointer mode) read before the call returns.
        let r = unsafe {
            blas::cublasSgemm_v2(
                self.handle,
                op(cm.trans_first),
                op(cm.trans_second),
                cm.m,
                cm.n,
                cm.k,
                &g.alpha,
                b as *const f32,
                cm.ld_first,
                a as *const f32,
                cm.ld_second,
                &g.beta,
                c as *mut f32,
                cm.ldc,
            )
        };
        check_blas(r, "cublasSgemm_v2")
    }
}

impl Blas {
    /// Row-major `C_i = alpha·op(A_i)·op(B_i) + beta·C_i` for `i < batch.count`, where
    /// `X_i = X + i·stride_x` (a stride of 0 shares the operand); one
    /// `cublasSgemmStridedBatched` call.
    pub(crate) fn gemm_batched(
        &self,
        _in: &Entered,
        g: &GemmShape,
        batch: GemmBatch,
        a: sys::CUdeviceptr,
        b: sys::CUdeviceptr,
        c: sys::CUdeviceptr,
    ) -> Result<(), EngineError> {
        self.gemm_strided(_in, g, Lds::dense(g), batch, a, b, c)
    }

    /// [`Blas::gemm_batched`] with operands whose rows lie `ld` apart (a matrix inside a wider
    /// one).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_strided(
        &self,
        _in: &Entered,
        g: &GemmShape,
        ld: Lds,
        batch: GemmBatch,
        a: sys::CUdeviceptr,
        b: sys::CUdeviceptr,
        c: sys::CUdeviceptr,
    ) -> Result<(), EngineError> {
        let cm = col_major_ld(g, ld)?;
        let count = to_i32("gemm", "batch", batch.count)?;
        let stride = |what, v: usize| {
            i64::try_from(v).map_err(|_| EngineError::Shape {
                op: "gemm",
                message: format!("{what} = {v} does not fit a 64-bit stride"),
            })
        };
        let (sa, sb, sc) = (
            stride("stride of A", batch.stride_a)?,
            stride("stride of B", batch.stride_b)?,
            stride("stride of C", batch.stride_c)?,
        );
        // SAFETY: as in `gemm`, for each of the `count` GEMMs: the caller guarantees every
        // operand `X + i·stride` holds its extent.
        let r = unsafe {
            blas::cublasSgemmStridedBatched(
                self.handle,
                op(cm.trans_first),
                op(cm.trans_second),
                cm.m,
                cm.n,
                cm.k,
                &g.alpha,
                b as *const f32,
                cm.ld_first,
                sb,
                a as *const f32,
                cm.ld_second,
                sa,
                &g.beta,
                c as *mut f32,
                cm.ldc,
                sc,
                count,
            )
        };
        check_blas(r, "cublasSgemmStridedBatched")
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // cublasDestroy synchronises the device, which would invalidate a graph that another
        // trial's thread is capturing: wait until none is.
        capture_hold::without_captures(|| {
            if let Ok(_in) = self.stream.ctx().enter() {
                // SAFETY: the handle is live and destroyed once. Errors cannot be reported from
                // Drop.
                let _ = unsafe { blas::cublasDestroy_v2(self.handle) };
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::ops::{self, testing::random};
    use crate::rng::HostRng;

    /// A plain column-major sgemm, as cuBLAS defines it.
    fn sgemm_col(
        cm: &ColGemm,
        alpha: f32,
        first: &[f32],
        second: &[f32],
        beta: f32,
        c: &mut [f32],
    ) {
        let (m, n, k) = (cm.m as usize, cm.n as usize, cm.k as usize);
        let (l1, l2, lc) = (cm.ld_first as usize, cm.ld_second as usize, cm.ldc as usize);
        let at = |i: usize, p: usize| {
            if cm.trans_first {
                first[p + i * l1]
            } else {
                first[i + p * l1]
            }
        };
        let bt = |p: usize, j: usize| {
            if cm.trans_second {
                second[j + p * l2]
            } else {
                second[p + j * l2]
            }
        };
        for j in 0..n {
            for i in 0..m {
                let s: f32 = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
                c[i + j * lc] = alpha * s + beta * c[i + j * lc];
            }
        }
    }

    #[test]
    fn row_major_gemm_maps_onto_column_major_cublas() {
        let mut rng = HostRng::new(3);
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
            let g = GemmShape {
                trans_a,
                trans_b,
                m: 5,
                n: 3,
                k: 4,
                alpha: 0.5,
                beta: 2.0,
            };
            let mut fill = |n: usize| random(&mut rng, n, -1.0, 1.0);
            let (a, b, c0) = (fill(g.a_len()), fill(g.b_len()), fill(g.c_len()));
            let mut want = c0.clone();
            ops::gemm(&g, &a, &b, &mut want);
            let cm = col_major(&g).unwrap();
            let mut got = c0.clone();
            sgemm_col(&cm, g.alpha, &b, &a, g.beta, &mut got);
            for (w, o) in want.iter().zip(&got) {
                assert!(
                    (w - o).abs() < 1e-5,
                    "trans {trans_a}/{trans_b}: {want:?} vs {got:?}"
                );
            }
        }
    }

    #[test]
    fn matrices_inside_wider_ones_map_onto_column_major_cublas() {
        let mut rng = HostRng::new(5);
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
            let g = GemmShape {
                trans_a,
                trans_b,
                m: 4,
                n: 3,
                k: 5,
                alpha: 1.0,
                beta: 0.0,
            };
            let dense = Lds::dense(&g);
            let ld = Lds {
                a: dense.a + 2,
                b: dense.b + 3,
                c: dense.c + 1,
            };
            let rows = |t: bool, r: usize, c: usize| if t { c } else { r };
            let a_rows = rows(trans_a, g.m, g.k);
            let b_rows = rows(trans_b, g.k, g.n);
            let mut fill = |n: usize| random(&mut rng, n, -1.0, 1.0);
            let (a, b) = (fill(a_rows * ld.a), fill(b_rows * ld.b));
            // The same operands packed densely.
            let pack = |m: &[f32], rows: usize, len: usize, ld: usize| -> Vec<f32> {
                (0..rows)
                    .flat_map(|r| m[r * ld..r * ld + len].to_vec())
                    .collect()
            };
            let a_dense = pack(&a, a_rows, dense.a, ld.a);
            let b_dense = pack(&b, b_rows, dense.b, ld.b);
            let mut want = vec![0.0; g.c_len()];
            ops::gemm(&g, &a_dense, &b_dense, &mut want);
            let cm = col_major_ld(&g, ld).unwrap();
            let mut got = vec![7.0; g.m * ld.c];
            sgemm_col(&cm, g.alpha, &b, &a, g.beta, &mut got);
            for i in 0..g.m {
                for j in 0..g.n {
                    let (w, o) = (want[i * g.n + j], got[i * ld.c + j]);
                    assert!((w - o).abs() < 1e-5, "trans {trans_a}/{trans_b} [{i}][{j}]");
                }
                assert_eq!(got[i * ld.c + g.n], 7.0, "past the row: untouched");
            }
        }
    }

    #[test]
    fn rows_shorter_than_the_matrix_are_refused() {
        let g = GemmShape::nn(4, 3, 5);
        let short = Lds {
            a: 4,
            ..Lds::dense(&g)
        };
        assert!(col_major_ld(&g, short).is_err());
        assert!(col_major_ld(&g, Lds::dense(&g)).is_ok());
    }

    #[test]
    fn leading_dimensions_are_never_zero_and_sizes_fit_int() {
        let cm = col_major(&GemmShape::nn(0, 0, 0)).unwrap();
        assert_eq!((cm.ld_first, cm.ld_second, cm.ldc), (1, 1, 1));
        assert!(col_major(&GemmShape::nn(1 << 31, 1, 1)).is_err());
    }
}
