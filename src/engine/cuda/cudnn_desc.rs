//! cuDNN's tensor, filter and convolution descriptors of a convolution shape, each destroyed when dropped.

use cudarc::cudnn::sys as dnn;

use super::status::{check_dnn, to_i32};
use crate::engine::Conv2dShape;
use crate::error::EngineError;

/// An owned tensor descriptor.
pub(super) struct TensorDesc(pub(super) dnn::cudnnTensorDescriptor_t);

/// An owned filter descriptor.
pub(super) struct FilterDesc(pub(super) dnn::cudnnFilterDescriptor_t);

/// An owned convolution descriptor.
pub(super) struct ConvDesc(pub(super) dnn::cudnnConvolutionDescriptor_t);

impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreateTensorDescriptor and destroyed once; host only.
        let _ = unsafe { dnn::cudnnDestroyTensorDescriptor(self.0) };
    }
}

impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: as above.
        let _ = unsafe { dnn::cudnnDestroyFilterDescriptor(self.0) };
    }
}

impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: as above.
        let _ = unsafe { dnn::cudnnDestroyConvolutionDescriptor(self.0) };
    }
}

pub(super) fn dim(what: &str, v: usize) -> Result<i32, EngineError> {
    to_i32("conv2d", what, v)
}

/// An NCHW float tensor descriptor.
pub(super) fn tensor(n: usize, c: usize, h: usize, w: usize) -> Result<TensorDesc, EngineError> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: writes one descriptor, owned from here on.
    check_dnn(
        unsafe { dnn::cudnnCreateTensorDescriptor(&mut raw) },
        "cudnnCreateTensorDescriptor",
    )?;
    let desc = TensorDesc(raw);
    // SAFETY: the descriptor is live.
    let r = unsafe {
        dnn::cudnnSetTensor4dDescriptor(
            desc.0,
            dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
            dim("n", n)?,
            dim("c", c)?,
            dim("h", h)?,
            dim("w", w)?,
        )
    };
    check_dnn(r, "cudnnSetTensor4dDescriptor")?;
    Ok(desc)
}

/// The weights `[c_out, c_in, k, k]` as a float filter descriptor.
pub(super) fn filter(s: &Conv2dShape) -> Result<FilterDesc, EngineError> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: writes one descriptor, owned from here on.
    check_dnn(
        unsafe { dnn::cudnnCreateFilterDescriptor(&mut raw) },
        "cudnnCreateFilterDescriptor",
    )?;
    let desc = FilterDesc(raw);
    // SAFETY: the descriptor is live.
    let r = unsafe {
        dnn::cudnnSetFilter4dDescriptor(
            desc.0,
            dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
            dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            dim("c_out", s.c_out)?,
            dim("c_in", s.c_in)?,
            dim("k", s.k)?,
            dim("k", s.k)?,
        )
    };
    check_dnn(r, "cudnnSetFilter4dDescriptor")?;
    Ok(desc)
}

/// A cross-correlation (what the CPU twin and PyTorch compute) with `s`'s padding and stride in
/// float, with `math`.
pub(super) fn convolution(
    s: &Conv2dShape,
    math: dnn::cudnnMathType_t,
) -> Result<ConvDesc, EngineError> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: writes one descriptor, owned from here on.
    check_dnn(
        unsafe { dnn::cudnnCreateConvolutionDescriptor(&mut raw) },
        "cudnnCreateConvolutionDescriptor",
    )?;
    let desc = ConvDesc(raw);
    let (pad, stride) = (dim("pad", s.pad)?, dim("stride", s.stride)?);
    // SAFETY: the descriptor is live.
    let r = unsafe {
        dnn::cudnnSetConvolution2dDescriptor(
            desc.0,
            pad,
            pad,
            stride,
            stride,
            1,
            1,
            dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
        )
    };
    check_dnn(r, "cudnnSetConvolution2dDescriptor")?;
    // SAFETY: the descriptor is live.
    let r = unsafe { dnn::cudnnSetConvolutionMathType(desc.0, math) };
    check_dnn(r, "cudnnSetConvolutionMathType")?;
    Ok(desc)
}
