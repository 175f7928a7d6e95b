//! Turning CUDA driver, cuBLAS and cuDNN status codes into `EngineError`s that name the call and the error.

use std::ffi::CStr;

use cudarc::cublas::sys as blas;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys;

use crate::error::{CudaLibrary, EngineError};

/// `Ok` for `CUDA_SUCCESS`, else `EngineError::Cuda` naming the call and the driver's error.
pub(crate) fn check(res: sys::CUresult, call: &str) -> Result<(), EngineError> {
    if res == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(failed(CudaLibrary::Driver, call, error_name(res)))
    }
}

/// The error of a failed call into `library`.
fn failed(library: CudaLibrary, call: &str, status: String) -> EngineError {
    EngineError::Cuda {
        library,
        call: call.to_string(),
        status,
    }
}

/// The driver's name for `res` (e.g. `CUDA_ERROR_OUT_OF_MEMORY`).
pub(crate) fn error_name(res: sys::CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName only writes a pointer to a static string (or leaves it null); it
    // needs no context and is only called after the driver library has been loaded.
    // The bindings panic on a library without the function; the binding's own name serves then.
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
        sys::cuGetErrorName(res, &mut name)
    }));
    if found.is_ok_and(|r| r == sys::CUresult::CUDA_SUCCESS) && !name.is_null() {
        // SAFETY: on success the pointer is a NUL-terminated string owned by the driver for the
        // life of the process.
        let s = unsafe { CStr::from_ptr(name) };
        return s.to_string_lossy().into_owned();
    }
    // The binding's own name for the code.
    format!("{res:?}")
}

/// `Ok` for `CUBLAS_STATUS_SUCCESS`, else `EngineError::Cuda` naming the call and the status.
pub(crate) fn check_blas(status: blas::cublasStatus_t, call: &str) -> Result<(), EngineError> {
    if status == blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(failed(CudaLibrary::Cublas, call, format!("{status:?}")))
    }
}

/// `Ok` for `CUDNN_STATUS_SUCCESS`, else `EngineError::Cuda` naming the call and the status.
pub(crate) fn check_dnn(status: dnn::cudnnStatus_t, call: &str) -> Result<(), EngineError> {
    if status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(failed(CudaLibrary::Cudnn, call, format!("{status:?}")))
    }
}

/// A size as the `u32` the kernels take, or a shape error naming it.
pub(crate) fn to_u32(op: &'static str, what: &str, v: usize) -> Result<u32, EngineError> {
    u32::try_from(v).map_err(|_| EngineError::Shape {
        op,
        message: format!("{what} = {v} does not fit the kernels' 32-bit sizes"),
    })
}

/// A size as the `int` cuBLAS takes, or a shape error naming it.
pub(crate) fn to_i32(op: &'static str, what: &str, v: usize) -> Result<i32, EngineError> {
    i32::try_from(v).map_err(|_| EngineError::Shape {
        op,
        message: format!("{what} = {v} does not fit cuBLAS's 32-bit sizes"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blas_errors_name_the_call_and_the_status() {
        let e = check_blas(
            blas::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED,
            "cublasCreate_v2",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "cublasCreate_v2: CUBLAS_STATUS_ALLOC_FAILED");
        assert!(check_blas(blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS, "x").is_ok());
    }

    #[test]
    fn cudnn_errors_name_the_call_and_the_status() {
        let e = check_dnn(
            dnn::cudnnStatus_t::CUDNN_STATUS_BAD_PARAM,
            "cudnnConvolutionForward",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "cudnnConvolutionForward: CUDNN_STATUS_BAD_PARAM"
        );
        assert!(check_dnn(dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS, "x").is_ok());
    }

    #[test]
    fn sizes_beyond_32_bits_are_shape_errors() {
        assert_eq!(to_u32("op", "n", 7).unwrap(), 7);
        assert!(matches!(
            to_u32("op", "n", 1 << 32),
            Err(EngineError::Shape { op: "op", .. })
        ));
        assert!(to_i32("op", "k", 1 << 31).is_err());
        assert_eq!(to_i32("op", "k", (1 << 31) - 1).unwrap(), i32::MAX);
    }
}
