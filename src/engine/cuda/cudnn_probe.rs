//! The check that the cuDNN found works on this device: one small convolution through its first-ranked FP32 algorithm, compared with the CPU twin.

use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys;

use super::cudnn::{fwd_algo, pick, ranked, Ranking};
use super::cudnn_desc::{convolution, filter, tensor};
use super::entered::Entered;
use super::status::{check, check_dnn};
use crate::engine::Conv2dShape;
use crate::error::EngineError;

/// Proves cuDNN works in the current context, the way the trials use it: a handle, the three
/// algorithm queries (which load the convolution sub-libraries, where a mismatched install
/// fails) and one small forward convolution whose result is checked. A cuDNN that fails here is
/// not used (`engine.conv: auto` then lowers convolutions to GEMMs).
pub(crate) fn probe(_in: &Entered) -> Result<(), EngineError> {
    let mut handle = std::ptr::null_mut();
    // SAFETY: writes one handle, destroyed below; cuDNN was loaded by `load`.
    check_dnn(unsafe { dnn::cudnnCreate(&mut handle) }, "cudnnCreate")?;
    let result = probe_with(handle);
    // SAFETY: the handle was created above and is destroyed once.
    let destroyed = check_dnn(unsafe { dnn::cudnnDestroy(handle) }, "cudnnDestroy");
    result.and(destroyed)
}

/// Device memory for the probe, freed on drop.
pub(super) struct ProbeBuf(sys::CUdeviceptr);

impl ProbeBuf {
    fn new(bytes: usize) -> Result<ProbeBuf, EngineError> {
        let mut ptr = 0;
        // SAFETY: writes one device pointer; a context is current (the probe's caller).
        check(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(4)) },
            "cuMemAlloc",
        )?;
        Ok(ProbeBuf(ptr))
    }
}

impl Drop for ProbeBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc_v2 and freed once.
        let _ = unsafe { sys::cuMemFree_v2(self.0) };
    }
}

/// The probe's convolution: two 3×8×8 samples through four 3×3 filters with padding 1.
pub(super) const PROBE: Conv2dShape = Conv2dShape {
    n: 2,
    c_in: 3,
    h: 8,
    w: 8,
    c_out: 4,
    k: 3,
    pad: 1,
    stride: 1,
};

/// How far the probe's output may be from the CPU twin's: cuDNN's FFT and Winograd algorithms
/// round differently from a direct sum (about 1e-6 relative in FP32), while a broken
/// convolution is off by far more than this.
pub(super) const PROBE_TOLERANCE: f32 = 1e-4;

/// Whether `got` matches `want` within [`PROBE_TOLERANCE`], relative to the largest `want`;
/// the first element that does not, otherwise.
pub(super) fn probe_mismatch(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    if got.len() != want.len() {
        return Some((got.len().min(want.len()), f32::NAN, f32::NAN));
    }
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| {
            let close = (*g - *w).abs() <= PROBE_TOLERANCE * scale;
            !close // NaN is never close
        })
        .map(|(i, (g, w))| (i, *g, *w))
}

/// Random inputs and filters through cuDNN's first-ranked FP32 forward algorithm, compared with
/// the CPU twin ([`cpu::ops::conv2d_fwd`](crate::engine::cpu::ops::conv2d_fwd)) within a
/// tolerance, so that exact-rounding differences of FFT or Winograd algorithms pass and wrong
/// results do not.
pub(super) fn probe_with(handle: dnn::cudnnHandle_t) -> Result<(), EngineError> {
    let s = PROBE;
    let x = tensor(s.n, s.c_in, s.h, s.w)?;
    let y = tensor(s.n, s.c_out, s.h_out(), s.w_out())?;
    let w = filter(&s)?;
    let conv = convolution(&s, dnn::cudnnMathType_t::CUDNN_FMA_MATH)?;
    let ranked = ranked(handle, &x, &y, &w, &conv, Ranking::Heuristic)?;
    let offer = pick(&ranked.fwd, 64 << 20, false, false).ok_or_else(|| {
        EngineError::Device("cuDNN offers no FP32 forward algorithm for a 3×3 convolution".into())
    })?;
    let algo = fwd_algo(offer.algo).ok_or_else(|| {
        EngineError::Device(format!("cuDNN offers unknown algorithm {}", offer.algo))
    })?;
    let mut ws_bytes = 0usize;
    // SAFETY: the handle and descriptors are live; writes one size.
    check_dnn(
        unsafe {
            dnn::cudnnGetConvolutionForwardWorkspaceSize(
                handle,
                x.0,
                w.0,
                conv.0,
                y.0,
                algo,
                &mut ws_bytes,
            )
        },
        "cudnnGetConvolutionForwardWorkspaceSize",
    )?;
    let mut rng = crate::rng::HostRng::new(0x70_726f_6265);
    let input: Vec<f32> = (0..s.n * s.c_in * s.h * s.w)
        .map(|_| rng.uniform_f32(-1.0, 1.0))
        .collect();
    let weights: Vec<f32> = (0..s.c_out * s.c_in * s.k * s.k)
        .map(|_| rng.uniform_f32(-1.0, 1.0))
        .collect();
    let out_len = s.n * s.c_out * s.h_out() * s.w_out();
    let bytes = |v: usize| v * std::mem::size_of::<f32>();
    let (xb, wb, yb) = (
        ProbeBuf::new(bytes(input.len()))?,
        ProbeBuf::new(bytes(weights.len()))?,
        ProbeBuf::new(bytes(out_len))?,
    );
    let ws = ProbeBuf::new(ws_bytes)?;
    // SAFETY: the buffers hold the bytes copied; the copies are synchronous.
    unsafe {
        check(
            sys::cuMemcpyHtoD_v2(xb.0, input.as_ptr().cast(), bytes(input.len())),
            "cuMemcpyHtoD",
        )?;
        check(
            sys::cuMemcpyHtoD_v2(wb.0, weights.as_ptr().cast(), bytes(weights.len())),
            "cuMemcpyHtoD",
        )?;
    }
    let (one, zero) = (1f32, 0f32);
    // SAFETY: the handle issues to the legacy stream of the current context; x, w, y and the
    // workspace hold the shape's extents and `ws_bytes`; alpha and beta are read in the call.
    check_dnn(
        unsafe {
            dnn::cudnnConvolutionForward(
                handle,
                (&one as *const f32).cast(),
                x.0,
                xb.0 as *const _,
                w.0,
                wb.0 as *const _,
                conv.0,
                algo,
                ws.0 as *mut _,
                ws_bytes,
                (&zero as *const f32).cast(),
                y.0,
                yb.0 as *mut _,
            )
        },
        "cudnnConvolutionForward",
    )?;
    let mut out = vec![0f32; out_len];
    // SAFETY: a synchronous copy of the floats just written (it waits for the convolution).
    check(
        unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), yb.0, bytes(out_len)) },
        "cuMemcpyDtoH",
    )?;
    let mut want = vec![0f32; out_len];
    let mut scratch = vec![0f32; s.ws_len()];
    crate::engine::cpu::ops::conv2d_fwd(&s, &input, &weights, None, &mut want, &mut scratch);
    if let Some((i, g, w)) = probe_mismatch(&out, &want) {
        return Err(EngineError::Device(format!(
            "cuDNN's test convolution ({algo:?}) computed {g} at element {i}, the CPU {w}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_accepts_rounding_and_refuses_wrong_results() {
        let want = [1.0f32, -2.0, 30.0, 0.0];
        assert_eq!(probe_mismatch(&want, &want), None);
        // What an FFT or Winograd algorithm may round differently: well within the tolerance.
        let rounded = [1.000_01, -2.000_02, 30.000_5, 1e-5];
        assert_eq!(probe_mismatch(&rounded, &want), None);
        // A wrong result, or a NaN, is named with its element.
        let wrong = [1.0, -2.0, 30.1, 0.0];
        assert_eq!(probe_mismatch(&wrong, &want).map(|m| m.0), Some(2));
        let nan = [1.0, f32::NAN, 30.0, 0.0];
        assert_eq!(probe_mismatch(&nan, &want).map(|m| m.0), Some(1));
        assert!(probe_mismatch(&want[..3], &want).is_some());
        // The probe's shape is a real convolution with padding on several channels.
        let p = PROBE;
        assert_eq!((p.h_out(), p.w_out()), (8, 8));
        assert!(p.c_in > 1 && p.c_out > 1 && p.n > 1 && p.pad > 0);
    }
}
