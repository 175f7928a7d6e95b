//! cuDNN convolutions for a trial: a handle on its stream, algorithms chosen once per shape, and their workspace inside the static memory plan.
//!
//! cuDNN 9 is loaded at run time (found like the other CUDA libraries, [`load`]). For each
//! convolution shape the backend ranks the forward, backward-data and backward-filter algorithms
//! once, and takes the first of each whose workspace fits the limit. By default they are ranked
//! by measuring them (`cudnnFind*Algorithm`, once per shape, precision and device in the process,
//! with every capture of the process held off since it synchronises), fastest first, whether
//! deterministic or not; with `engine: {deterministic: true}` by cuDNN's heuristics
//! (`cudnnGet*Algorithm_v7`), and backward ones must be deterministic when any that fits is. The
//! choice depends on the shape and the limit only, so the plan ([`Dnn::workspace_bytes`], at
//! planning time) and the run (with the planned workspace) agree. cuDNN never allocates: its workspace is
//! the plan's region, so the calls are also safe to capture in a CUDA graph. FP32 math
//! (`CUDNN_FMA_MATH`) unless the engine's `tf32` option allows TF32 tensor cores.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys;

use super::capture_hold;
use super::cudnn_desc::{convolution, filter, tensor, ConvDesc, FilterDesc, TensorDesc};
use super::entered::Entered;
use super::status::check_dnn;
use super::stream::Stream;
use crate::engine::Conv2dShape;
use crate::error::EngineError;
use crate::gpu::libs::{self, CudaLib};

/// The most workspace one convolution may ask for, in bytes. Algorithms needing more (some FFT
/// ones) are passed over, so that a trial's plan stays within small slice caps.
pub(crate) const WORKSPACE_LIMIT: usize = 256 << 20;

/// Loads cuDNN once per process, then the cuBLASLt and NVRTC of its CUDA version, which it opens
/// by soname for some engines. Returns its version (e.g. `91002`) and the file its functions come
/// from, or why it cannot be used.
///
/// The bindings open cuDNN themselves, by bare name (`libcudnn.so` first). Where the system
/// loader finds one that way, that is the cuDNN called, and it opens its sub-libraries from its
/// own install: nothing is preloaded, since another install's sub-libraries loaded beside it
/// mix two versions (`CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH` at the first call, seen on a
/// machine with cuDNN 9.14 in the system folders and 9.19 in PyTorch's site-packages). Only
/// where the loader finds none is the library found here (site-packages included) loaded with
/// its sub-libraries by absolute path; the bindings' `libcudnn.so.9` then finds it loaded. Either
/// way the sub-libraries loaded are those beside the file the bindings call.
pub(crate) fn load() -> Result<(usize, libs::Bound), String> {
    static LOADED: OnceLock<Result<(usize, libs::Bound), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            // SAFETY: opens (and closes) each of the bindings' names until one loads; loading a
            // cuDNN runs its initialisers, which have no preconditions.
            let on_loader_path = unsafe { dnn::is_culib_present() };
            let preloaded = if on_loader_path {
                None
            } else {
                Some(libs::preload(CudaLib::Cudnn).map_err(|e| e.to_string())?)
            };
            // Which file the bindings call (they open it now if they had not).
            let asked = preloaded
                .clone()
                .unwrap_or_else(|| std::path::PathBuf::from("libcudnn.so"));
            let mut bound = super::bound::check(CudaLib::Cudnn, &asked)?;
            if preloaded.is_none() {
                // The loader's choice is the one meant: nothing else was found or loaded. Its
                // sub-libraries are loaded from its own folder before its first call opens them
                // by name, where a search path (LD_LIBRARY_PATH) could answer with another
                // install's.
                bound.preloaded = bound.file.clone();
                if let Some(dir) = bound.file.parent() {
                    libs::preload_cudnn_parts(dir);
                }
            }
            let path = bound.file.clone();
            // cudarc opens cuDNN by soname on first use and panics if it cannot.
            // SAFETY: cudnnGetVersion and cudnnGetCudartVersion have no preconditions.
            let versions = std::panic::catch_unwind(|| unsafe {
                (dnn::cudnnGetVersion(), dnn::cudnnGetCudartVersion())
            })
            .map_err(|_| format!("cuDNN at {} could not be loaded", path.display()))?;
            let (version, cudart) = versions;
            if !(90000..100000).contains(&version) {
                return Err(format!(
                    "{} is cuDNN {version}; gpumux needs cuDNN 9",
                    path.display()
                ));
            }
            let major = cudart / 1000;
            libs::preload_optional(&format!("libcublasLt.so.{major}"));
            libs::preload_optional(&format!("libnvrtc.so.{major}"));
            Ok((version, bound))
        })
        .clone()
}

/// An algorithm's name without cuDNN's common prefix, marked when it may use TF32.
fn algo_name(debug: &str, tf32: bool) -> String {
    let short = debug
        .trim_start_matches("CUDNN_CONVOLUTION_")
        .trim_start_matches("FWD_ALGO_")
        .trim_start_matches("BWD_DATA_ALGO_")
        .trim_start_matches("BWD_FILTER_ALGO_");
    if tf32 {
        format!("{short} (TF32)")
    } else {
        short.to_string()
    }
}

/// One line naming the algorithms a convolution shape runs with, for `--verbose`.
fn choice_line(s: &Conv2dShape, [fwd, data, filter]: [String; 3], bytes: usize) -> String {
    format!(
        "cuDNN: conv {}×{}×{}×{} → {} channels, {}×{} kernel, stride {}, pad {}: forward {fwd}, \
         backward-data {data}, backward-filter {filter}; workspace {:.1} MiB",
        s.n,
        s.c_in,
        s.h,
        s.w,
        s.c_out,
        s.k,
        s.k,
        s.stride,
        s.pad,
        bytes as f64 / (1u64 << 20) as f64
    )
}

/// Logs `line` at debug level (`--verbose`) the first time this process makes that choice
/// (every trial of a process plans the same shapes).
fn say_choice(line: &str) {
    static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(PoisonError::into_inner);
    if !said.iter().any(|l| l == line) {
        tracing::debug!("{line}");
        said.push(line.to_string());
    }
}

/// One entry of cuDNN's ranked algorithm lists, read with plain integers: the layout of
/// `cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t`, whose enum fields could hold values a
/// newer cuDNN added.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct RawPerf {
    algo: u32,
    status: u32,
    time: f32,
    memory: usize,
    determinism: u32,
    math_type: u32,
    reserved: [i32; 3],
}

/// An algorithm cuDNN offers for one direction: its number, workspace and properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Offer {
    pub algo: u32,
    pub bytes: usize,
    pub deterministic: bool,
    /// Uses TF32 tensor cores (`CUDNN_TENSOR_OP_MATH*` or `CUDNN_DEFAULT_MATH` on float data).
    pub tensor_ops: bool,
}

/// The usable offers of a ranked list: those that succeeded, with a known algorithm number.
fn offers(raw: &[RawPerf], count: i32, algo_count: u32) -> Vec<Offer> {
    let n = usize::try_from(count).unwrap_or(0).min(raw.len());
    raw[..n]
        .iter()
        .filter(|p| p.status == 0 && p.algo < algo_count)
        .map(|p| Offer {
            algo: p.algo,
            bytes: p.memory,
            deterministic: p.determinism == dnn::cudnnDeterminism_t::CUDNN_DETERMINISTIC as u32,
            tensor_ops: p.math_type != dnn::cudnnMathType_t::CUDNN_FMA_MATH as u32,
        })
        .collect()
}

/// The first offer (in cuDNN's ranking) within `limit` bytes that is allowed: no tensor ops
/// unless `tf32`; deterministic when `deterministic` and any allowed one within the limit is.
pub(crate) fn pick(
    offers: &[Offer],
    limit: usize,
    tf32: bool,
    deterministic: bool,
) -> Option<Offer> {
    let fits = |o: &&Offer| o.bytes <= limit && (tf32 || !o.tensor_ops);
    let first_det = offers.iter().filter(fits).find(|o| o.deterministic);
    let first = offers.iter().find(fits);
    if deterministic {
        first_det.or(first).copied()
    } else {
        first.copied()
    }
}

/// The three algorithms of one convolution shape, each with the descriptor it runs with.
pub(crate) struct Choice {
    fwd: (dnn::cudnnConvolutionFwdAlgo_t, ConvDesc),
    data: (dnn::cudnnConvolutionBwdDataAlgo_t, ConvDesc),
    filter: (dnn::cudnnConvolutionBwdFilterAlgo_t, ConvDesc),
    /// The largest workspace of the three.
    pub bytes: usize,
}

// SAFETY: a choice holds convolution descriptors, host objects that are only read once made;
// cuDNN allows reading them from any thread.
unsafe impl Send for Choice {}
// SAFETY: as above; `Choice` has no interior mutability.
unsafe impl Sync for Choice {}

/// One shape's descriptors and cuDNN's ranked offers, and the choices made from them.
struct ShapePlan {
    shape: Conv2dShape,
    x: TensorDesc,
    y: TensorDesc,
    w: FilterDesc,
    fwd: Vec<Offer>,
    data: Vec<Offer>,
    filter: Vec<Offer>,
    /// Choices by workspace limit (in practice one or two per shape).
    choices: Vec<(usize, Arc<Choice>)>,
}

// SAFETY: the descriptors are host objects owned by the plan; cuDNN allows using them from any
// thread, and the plans are only reached through the backend's mutex.
unsafe impl Send for ShapePlan {}

/// A cuDNN handle bound to one trial's stream, and the convolution plans made with it.
pub(crate) struct Dnn {
    handle: dnn::cudnnHandle_t,
    stream: Arc<Stream>,
    tf32: bool,
    /// Heuristic ranking with deterministic backward algorithms preferred, instead of measured.
    deterministic: bool,
    plans: Mutex<Vec<ShapePlan>>,
}

// SAFETY: a cuDNN handle may be used from any thread, one at a time; `Dnn` is owned by one
// backend, which one thread uses at a time, and every call enters the stream's context.
unsafe impl Send for Dnn {}

const RANKED: usize = 16;

/// cuDNN's ranked offers for each direction of one convolution.
#[derive(Clone)]
pub(super) struct Ranked {
    pub(super) fwd: Vec<Offer>,
    data: Vec<Offer>,
    filter: Vec<Offer>,
}

/// How the algorithms of a convolution are ranked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ranking {
    /// cuDNN's heuristics (`cudnnGet*Algorithm_v7`).
    Heuristic,
    /// Measured on the device (`cudnnFind*Algorithm`), fastest first.
    Measured,
}

/// Measured rankings, made once per shape, precision and device in the process: measuring runs
/// every algorithm and synchronises the device.
static MEASURED: Mutex<Vec<(MeasuredKey, Ranked)>> = Mutex::new(Vec::new());

/// A convolution shape, whether TF32 is allowed, and the device (its UUID).
type MeasuredKey = (Conv2dShape, bool, String);

/// The measured ranking kept under `key`, if there is one.
fn measured_ranking(key: &MeasuredKey) -> Option<Ranked> {
    let m = MEASURED.lock().unwrap_or_else(PoisonError::into_inner);
    m.iter().find(|(k, _)| k == key).map(|(_, r)| r.clone())
}

/// Asks cuDNN for the ranked forward, backward-data and backward-filter algorithms of the
/// convolution `conv` from `x` through `w` to `y`: its heuristics (`cudnnGet*Algorithm_v7`), or
/// its measurements (`cudnnFind*Algorithm`: it runs each algorithm on scratch memory it allocates,
/// synchronising the device, and ranks them fastest first; the caller then holds every capture
/// of the process off). Both fill the same perf structs.
pub(super) fn ranked(
    handle: dnn::cudnnHandle_t,
    x: &TensorDesc,
    y: &TensorDesc,
    w: &FilterDesc,
    conv: &ConvDesc,
    how: Ranking,
) -> Result<Ranked, EngineError> {
    let (fwd_fn, fwd_name, data_fn, data_name, filter_fn, filter_name): (
        RankFwd,
        &str,
        RankData,
        &str,
        RankFilter,
        &str,
    ) = match how {
        Ranking::Heuristic => (
            dnn::cudnnGetConvolutionForwardAlgorithm_v7,
            "cudnnGetConvolutionForwardAlgorithm_v7",
            dnn::cudnnGetConvolutionBackwardDataAlgorithm_v7,
            "cudnnGetConvolutionBackwardDataAlgorithm_v7",
            dnn::cudnnGetConvolutionBackwardFilterAlgorithm_v7,
            "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
        ),
        Ranking::Measured => (
            dnn::cudnnFindConvolutionForwardAlgorithm,
            "cudnnFindConvolutionForwardAlgorithm",
            dnn::cudnnFindConvolutionBackwardDataAlgorithm,
            "cudnnFindConvolutionBackwardDataAlgorithm",
            dnn::cudnnFindConvolutionBackwardFilterAlgorithm,
            "cudnnFindConvolutionBackwardFilterAlgorithm",
        ),
    };
    let n = RANKED as i32;
    let mut count = 0;
    let mut raw = [RawPerf::default(); RANKED];
    // SAFETY: the handle and descriptors are live; `raw` holds RANKED entries laid out as the
    // perf struct (see RawPerf), of which cuDNN writes `count`.
    let r = unsafe {
        fwd_fn(
            handle,
            x.0,
            w.0,
            conv.0,
            y.0,
            n,
            &mut count,
            raw.as_mut_ptr().cast(),
        )
    };
    check_dnn(r, fwd_name)?;
    let fwd = offers(&raw, count, 8);
    let mut raw = [RawPerf::default(); RANKED];
    // SAFETY: as above.
    let r = unsafe {
        data_fn(
            handle,
            w.0,
            y.0,
            conv.0,
            x.0,
            n,
            &mut count,
            raw.as_mut_ptr().cast(),
        )
    };
    check_dnn(r, data_name)?;
    let data = offers(&raw, count, 6);
    let mut raw = [RawPerf::default(); RANKED];
    // SAFETY: as above.
    let r = unsafe {
        filter_fn(
            handle,
            x.0,
            y.0,
            conv.0,
            w.0,
            n,
            &mut count,
            raw.as_mut_ptr().cast(),
        )
    };
    check_dnn(r, filter_name)?;
    let filter = offers(&raw, count, 7);
    Ok(Ranked { fwd, data, filter })
}

/// The signatures shared by cuDNN's heuristic and measured rankings of each direction.
type RankFwd = unsafe fn(
    dnn::cudnnHandle_t,
    dnn::cudnnTensorDescriptor_t,
    dnn::cudnnFilterDescriptor_t,
    dnn::cudnnConvolutionDescriptor_t,
    dnn::cudnnTensorDescriptor_t,
    i32,
    *mut i32,
    *mut dnn::cudnnConvolutionFwdAlgoPerf_t,
) -> dnn::cudnnStatus_t;

type RankData = unsafe fn(
    dnn::cudnnHandle_t,
    dnn::cudnnFilterDescriptor_t,
    dnn::cudnnTensorDescriptor_t,
    dnn::cudnnConvolutionDescriptor_t,
    dnn::cudnnTensorDescriptor_t,
    i32,
    *mut i32,
    *mut dnn::cudnnConvolutionBwdDataAlgoPerf_t,
) -> dnn::cudnnStatus_t;

type RankFilter = unsafe fn(
    dnn::cudnnHandle_t,
    dnn::cudnnTensorDescriptor_t,
    dnn::cudnnTensorDescriptor_t,
    dnn::cudnnConvolutionDescriptor_t,
    dnn::cudnnFilterDescriptor_t,
    i32,
    *mut i32,
    *mut dnn::cudnnConvolutionBwdFilterAlgoPerf_t,
) -> dnn::cudnnStatus_t;

pub(super) fn fwd_algo(a: u32) -> Option<dnn::cudnnConvolutionFwdAlgo_t> {
    use dnn::cudnnConvolutionFwdAlgo_t as A;
    Some(match a {
        0 => A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        1 => A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        2 => A::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        3 => A::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        4 => A::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        5 => A::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        6 => A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        7 => A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
        _ => return None,
    })
}

fn data_algo(a: u32) -> Option<dnn::cudnnConvolutionBwdDataAlgo_t> {
    use dnn::cudnnConvolutionBwdDataAlgo_t as A;
    Some(match a {
        0 => A::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
        1 => A::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
        2 => A::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
        3 => A::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
        4 => A::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
        5 => A::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
        _ => return None,
    })
}

fn filter_algo(a: u32) -> Option<dnn::cudnnConvolutionBwdFilterAlgo_t> {
    use dnn::cudnnConvolutionBwdFilterAlgo_t as A;
    Some(match a {
        0 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
        1 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
        2 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
        3 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
        4 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD,
        5 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
        6 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
        _ => return None,
    })
}

impl Dnn {
    /// A handle on `stream`'s context issuing to `stream`. Creating (and later destroying) a
    /// handle may synchronise the device, so it waits for other threads' captures to end.
    pub(crate) fn new(
        stream: Arc<Stream>,
        tf32: bool,
        deterministic: bool,
    ) -> Result<Dnn, EngineError> {
        let handle = capture_hold::without_captures(|| -> Result<_, EngineError> {
            let _in = stream.ctx().enter()?;
            let mut handle = std::ptr::null_mut();
            // SAFETY: writes one handle; the stream's context is current, so cuDNN binds to it.
            check_dnn(unsafe { dnn::cudnnCreate(&mut handle) }, "cudnnCreate")?;
            // SAFETY: both handles are live; cuDNN's stream type is the driver's CUstream.
            let r = unsafe { dnn::cudnnSetStream(handle, stream.raw() as dnn::cudaStream_t) };
            if let Err(e) = check_dnn(r, "cudnnSetStream") {
                // SAFETY: the handle was just created and is destroyed once.
                let _ = unsafe { dnn::cudnnDestroy(handle) };
                return Err(e);
            }
            Ok(handle)
        })?;
        Ok(Dnn {
            handle,
            stream,
            tf32,
            deterministic,
            plans: Mutex::new(Vec::new()),
        })
    }

    /// The math every descriptor is queried with: TF32 allowed, or FP32 FMA only.
    fn math(&self) -> dnn::cudnnMathType_t {
        if self.tf32 {
            dnn::cudnnMathType_t::CUDNN_DEFAULT_MATH
        } else {
            dnn::cudnnMathType_t::CUDNN_FMA_MATH
        }
    }

    /// The descriptors of `s` and cuDNN's ranked offers for each direction.
    fn shape_plan(&self, _in: &Entered, s: &Conv2dShape) -> Result<ShapePlan, EngineError> {
        let x = tensor(s.n, s.c_in, s.h, s.w)?;
        let y = tensor(s.n, s.c_out, s.h_out(), s.w_out())?;
        let w = filter(s)?;
        let conv = convolution(s, self.math())?;
        let (mut n, mut c, mut h, mut wd) = (0, 0, 0, 0);
        // SAFETY: the descriptors are live; writes four ints.
        let r = unsafe {
            dnn::cudnnGetConvolution2dForwardOutputDim(
                conv.0, x.0, w.0, &mut n, &mut c, &mut h, &mut wd,
            )
        };
        check_dnn(r, "cudnnGetConvolution2dForwardOutputDim")?;
        let want = [s.n, s.c_out, s.h_out(), s.w_out()];
        if [n, c, h, wd].map(|v| v as usize) != want {
            return Err(EngineError::Device(format!(
                "cuDNN sizes the output of {s:?} as {n}×{c}×{h}×{wd}, not {want:?}"
            )));
        }
        let Ranked { fwd, data, filter } = self.ranking(s, &x, &y, &w, &conv)?;
        Ok(ShapePlan {
            shape: *s,
            x,
            y,
            w,
            fwd,
            data,
            filter,
            choices: Vec::new(),
        })
    }

    /// The ranked offers of `s`: measured unless `deterministic`, once per shape, precision and
    /// device in the process. Measuring needs every capture of the process held off by this
    /// thread ([`Dnn::needs_measuring`]); a shape first met without that hold is ranked by the
    /// heuristics.
    fn ranking(
        &self,
        s: &Conv2dShape,
        x: &TensorDesc,
        y: &TensorDesc,
        w: &FilterDesc,
        conv: &ConvDesc,
    ) -> Result<Ranked, EngineError> {
        if self.deterministic {
            return ranked(self.handle, x, y, w, conv, Ranking::Heuristic);
        }
        let key = self.measured_key(s);
        if let Some(r) = measured_ranking(&key) {
            return Ok(r);
        }
        if !capture_hold::holding() {
            return ranked(self.handle, x, y, w, conv, Ranking::Heuristic);
        }
        let r = ranked(self.handle, x, y, w, conv, Ranking::Measured)?;
        MEASURED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((key, r.clone()));
        Ok(r)
    }

    /// Whether planning `s` would measure its algorithms (not planned yet on this handle, and
    /// measured ones wanted): the caller then holds every capture of the process off first,
    /// with no context entered.
    pub(crate) fn needs_measuring(&self, s: &Conv2dShape) -> bool {
        if self.deterministic || measured_ranking(&self.measured_key(s)).is_some() {
            return false;
        }
        let plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        !plans.iter().any(|p| p.shape == *s)
    }

    /// What a measured ranking of `s` on this handle's device is kept under.
    fn measured_key(&self, s: &Conv2dShape) -> MeasuredKey {
        (*s, self.tf32, self.stream.ctx().device().info.uuid.clone())
    }

    /// The descriptor an offer runs with: FMA math, or the TF32-allowing default.
    fn conv_for(&self, s: &Conv2dShape, o: &Offer) -> Result<ConvDesc, EngineError> {
        let math = if self.tf32 && o.tensor_ops {
            dnn::cudnnMathType_t::CUDNN_DEFAULT_MATH
        } else {
            dnn::cudnnMathType_t::CUDNN_FMA_MATH
        };
        convolution(s, math)
    }

    /// The algorithms for `p` within `limit` bytes of workspace, with their exact workspace.
    fn choose(&self, p: &ShapePlan, limit: usize) -> Result<Choice, EngineError> {
        let s = &p.shape;
        let none = |dir: &str| {
            EngineError::Device(format!(
                "cuDNN offers no {dir} algorithm for {s:?} within {limit} bytes of workspace"
            ))
        };
        let det = self.deterministic;
        let f = pick(&p.fwd, limit, self.tf32, false).ok_or_else(|| none("forward"))?;
        let d = pick(&p.data, limit, self.tf32, det).ok_or_else(|| none("backward-data"))?;
        let g = pick(&p.filter, limit, self.tf32, det).ok_or_else(|| none("backward-filter"))?;
        let fa = fwd_algo(f.algo).ok_or_else(|| none("forward"))?;
        let da = data_algo(d.algo).ok_or_else(|| none("backward-data"))?;
        let ga = filter_algo(g.algo).ok_or_else(|| none("backward-filter"))?;
        let (fc, dc, gc) = (
            self.conv_for(s, &f)?,
            self.conv_for(s, &d)?,
            self.conv_for(s, &g)?,
        );
        let (mut fb, mut db, mut gb) = (0usize, 0usize, 0usize);
        // SAFETY: handle and descriptors are live; each call writes one size.
        unsafe {
            check_dnn(
                dnn::cudnnGetConvolutionForwardWorkspaceSize(
                    self.handle,
                    p.x.0,
                    p.w.0,
                    fc.0,
                    p.y.0,
                    fa,
                    &mut fb,
                ),
                "cudnnGetConvolutionForwardWorkspaceSize",
            )?;
            check_dnn(
                dnn::cudnnGetConvolutionBackwardDataWorkspaceSize(
                    self.handle,
                    p.w.0,
                    p.y.0,
                    dc.0,
                    p.x.0,
                    da,
                    &mut db,
                ),
                "cudnnGetConvolutionBackwardDataWorkspaceSize",
            )?;
            check_dnn(
                dnn::cudnnGetConvolutionBackwardFilterWorkspaceSize(
                    self.handle,
                    p.x.0,
                    p.y.0,
                    gc.0,
                    p.w.0,
                    ga,
                    &mut gb,
                ),
                "cudnnGetConvolutionBackwardFilterWorkspaceSize",
            )?;
        }
        let bytes = [fb, db, gb, f.bytes, d.bytes, g.bytes]
            .into_iter()
            .max()
            .unwrap_or(0);
        say_choice(&choice_line(
            s,
            [
                algo_name(&format!("{fa:?}"), f.tensor_ops && self.tf32),
                algo_name(&format!("{da:?}"), d.tensor_ops && self.tf32),
                algo_name(&format!("{ga:?}"), g.tensor_ops && self.tf32),
            ],
            bytes,
        ));
        Ok(Choice {
            fwd: (fa, fc),
            data: (da, dc),
            filter: (ga, gc),
            bytes,
        })
    }

    /// The choice for `s` within `limit` bytes (capped at [`WORKSPACE_LIMIT`]), made once per
    /// shape and limit.
    pub(crate) fn choice(
        &self,
        entered: &Entered,
        s: &Conv2dShape,
        limit: usize,
    ) -> Result<Arc<Choice>, EngineError> {
        let limit = limit.min(WORKSPACE_LIMIT);
        let mut plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        let i = match plans.iter().position(|p| p.shape == *s) {
            Some(i) => i,
            None => {
                plans.push(self.shape_plan(entered, s)?);
                plans.len() - 1
            }
        };
        let plan = &mut plans[i];
        if let Some((_, c)) = plan.choices.iter().find(|(l, _)| *l == limit) {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(self.choose(plan, limit)?);
        plan.choices.push((limit, Arc::clone(&c)));
        Ok(c)
    }

    /// Workspace bytes the convolution `s` needs with no limit but [`WORKSPACE_LIMIT`]: what the
    /// memory plan reserves.
    pub(crate) fn workspace_bytes(
        &self,
        entered: &Entered,
        s: &Conv2dShape,
    ) -> Result<usize, EngineError> {
        Ok(self.choice(entered, s, WORKSPACE_LIMIT)?.bytes)
    }

    /// The descriptors of a planned shape (planned by [`Dnn::choice`] first).
    fn descriptors<R>(
        &self,
        s: &Conv2dShape,
        f: impl FnOnce(&TensorDesc, &TensorDesc, &FilterDesc) -> R,
    ) -> Result<R, EngineError> {
        let plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        let p = plans
            .iter()
            .find(|p| p.shape == *s)
            .ok_or_else(|| EngineError::Device(format!("no cuDNN plan for {s:?}")))?;
        Ok(f(&p.x, &p.y, &p.w))
    }

    /// `y = conv(x, w)` (overwrites `y`) with `ws_bytes` of workspace at `ws`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        e: &Entered,
        s: &Conv2dShape,
        x: sys::CUdeviceptr,
        w: sys::CUdeviceptr,
        y: sys::CUdeviceptr,
        ws: sys::CUdeviceptr,
        ws_bytes: usize,
    ) -> Result<(), EngineError> {
        let c = self.fitting(e, s, ws_bytes)?;
        let (one, zero) = (1f32, 0f32);
        let r = self.descriptors(s, |xd, yd, wd| {
            // SAFETY: the context is current (`e`); the caller guarantees x, w and y hold the
            // shape's extents and ws holds `ws_bytes` ≥ the choice's workspace; alpha and beta
            // are host floats read before the call returns.
            unsafe {
                dnn::cudnnConvolutionForward(
                    self.handle,
                    (&one as *const f32).cast(),
                    xd.0,
                    x as *const _,
                    wd.0,
                    w as *const _,
                    c.fwd.1 .0,
                    c.fwd.0,
                    ws as *mut _,
                    ws_bytes,
                    (&zero as *const f32).cast(),
                    yd.0,
                    y as *mut _,
                )
            }
        })?;
        check_dnn(r, "cudnnConvolutionForward")
    }

    /// `dx = conv_transpose(dy, w)` (overwrites `dx`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward_data(
        &self,
        e: &Entered,
        s: &Conv2dShape,
        w: sys::CUdeviceptr,
        dy: sys::CUdeviceptr,
        dx: sys::CUdeviceptr,
        ws: sys::CUdeviceptr,
        ws_bytes: usize,
    ) -> Result<(), EngineError> {
        let c = self.fitting(e, s, ws_bytes)?;
        let (one, zero) = (1f32, 0f32);
        let r = self.descriptors(s, |xd, yd, wd| {
            // SAFETY: as in `forward`.
            unsafe {
                dnn::cudnnConvolutionBackwardData(
                    self.handle,
                    (&one as *const f32).cast(),
                    wd.0,
                    w as *const _,
                    yd.0,
                    dy as *const _,
                    c.data.1 .0,
                    c.data.0,
                    ws as *mut _,
                    ws_bytes,
                    (&zero as *const f32).cast(),
                    xd.0,
                    dx as *mut _,
                )
            }
        })?;
        check_dnn(r, "cudnnConvolutionBackwardData")
    }

    /// `dw = Σ x ⋆ dy` over the batch (overwrites `dw`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward_filter(
        &self,
        e: &Entered,
        s: &Conv2dShape,
        x: sys::CUdeviceptr,
        dy: sys::CUdeviceptr,
        dw: sys::CUdeviceptr,
        ws: sys::CUdeviceptr,
        ws_bytes: usize,
    ) -> Result<(), EngineError> {
        let c = self.fitting(e, s, ws_bytes)?;
        let (one, zero) = (1f32, 0f32);
        let r = self.descriptors(s, |xd, yd, wd| {
            // SAFETY: as in `forward`.
            unsafe {
                dnn::cudnnConvolutionBackwardFilter(
                    self.handle,
                    (&one as *const f32).cast(),
                    xd.0,
                    x as *const _,
                    yd.0,
                    dy as *const _,
                    c.filter.1 .0,
                    c.filter.0,
                    ws as *mut _,
                    ws_bytes,
                    (&zero as *const f32).cast(),
                    wd.0,
                    dw as *mut _,
                )
            }
        })?;
        check_dnn(r, "cudnnConvolutionBackwardFilter")
    }

    /// The choice for `s` within the `ws_bytes` given, checked to fit them.
    fn fitting(
        &self,
        e: &Entered,
        s: &Conv2dShape,
        ws_bytes: usize,
    ) -> Result<Arc<Choice>, EngineError> {
        let c = self.choice(e, s, ws_bytes)?;
        if c.bytes > ws_bytes {
            return Err(EngineError::Shape {
                op: "conv2d",
                message: format!(
                    "the workspace holds {ws_bytes} bytes, cuDNN needs {}",
                    c.bytes
                ),
            });
        }
        Ok(c)
    }
}

impl Drop for Dnn {
    fn drop(&mut self) {
        // Descriptors first (host objects), then the handle, whose destruction may synchronise
        // the device: not while another thread captures a graph.
        self.plans
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        capture_hold::without_captures(|| {
            if let Ok(_in) = self.stream.ctx().enter() {
                // SAFETY: the handle is live and destroyed once. Errors cannot be reported from
                // Drop.
                let _ = unsafe { dnn::cudnnDestroy(self.handle) };
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_convolution_says_which_algorithms_it_runs() {
        let f = algo_name(
            &format!(
                "{:?}",
                dnn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED
            ),
            false,
        );
        assert_eq!(f, "WINOGRAD_NONFUSED");
        let d = algo_name(
            &format!(
                "{:?}",
                dnn::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1
            ),
            true,
        );
        assert_eq!(d, "1 (TF32)");
        let line = choice_line(
            &super::super::cudnn_probe::PROBE,
            [f, d, "FFT".into()],
            3 << 20,
        );
        assert_eq!(
            line,
            "cuDNN: conv 2×3×8×8 → 4 channels, 3×3 kernel, stride 1, pad 1: forward \
             WINOGRAD_NONFUSED, backward-data 1 (TF32), backward-filter FFT; workspace 3.0 MiB"
        );
    }

    #[test]
    fn raw_perf_has_the_layout_of_cudnns_perf_structs() {
        use std::mem::{align_of, size_of};
        assert_eq!(
            size_of::<RawPerf>(),
            size_of::<dnn::cudnnConvolutionFwdAlgoPerf_t>()
        );
        assert_eq!(
            size_of::<RawPerf>(),
            size_of::<dnn::cudnnConvolutionBwdDataAlgoPerf_t>()
        );
        assert_eq!(
            size_of::<RawPerf>(),
            size_of::<dnn::cudnnConvolutionBwdFilterAlgoPerf_t>()
        );
        assert_eq!(
            align_of::<RawPerf>(),
            align_of::<dnn::cudnnConvolutionFwdAlgoPerf_t>()
        );
        assert_eq!(std::mem::offset_of!(RawPerf, memory), 16);
        assert_eq!(std::mem::offset_of!(RawPerf, math_type), 28);
    }

    fn offer(algo: u32, bytes: usize, deterministic: bool, tensor_ops: bool) -> Offer {
        Offer {
            algo,
            bytes,
            deterministic,
            tensor_ops,
        }
    }

    #[test]
    fn the_first_fitting_allowed_offer_is_picked() {
        let ranked = [
            offer(4, 900, true, false),
            offer(1, 100, false, true),
            offer(0, 50, false, false),
            offer(2, 10, true, false),
        ];
        // Within 1000 bytes: the top one.
        assert_eq!(pick(&ranked, 1000, false, false).unwrap().algo, 4);
        // Within 200: FP32 skips the TF32 offer; TF32 takes it.
        assert_eq!(pick(&ranked, 200, false, false).unwrap().algo, 0);
        assert_eq!(pick(&ranked, 200, true, false).unwrap().algo, 1);
        // Deterministic preferred when one fits, else the first that fits.
        assert_eq!(pick(&ranked, 200, true, true).unwrap().algo, 2);
        assert_eq!(pick(&ranked[..3], 200, true, true).unwrap().algo, 1);
        assert_eq!(pick(&ranked, 5, true, true), None);
    }

    #[test]
    fn failed_and_unknown_offers_are_dropped() {
        let mut raw = [RawPerf::default(); 4];
        raw[0] = RawPerf {
            algo: 1,
            memory: 64,
            determinism: 1,
            math_type: 3,
            ..RawPerf::default()
        };
        raw[1] = RawPerf {
            algo: 2,
            status: 9,
            ..RawPerf::default()
        };
        raw[2] = RawPerf {
            algo: 42,
            ..RawPerf::default()
        };
        raw[3] = RawPerf {
            algo: 0,
            math_type: 1,
            ..RawPerf::default()
        };
        let got = offers(&raw, 4, 8);
        assert_eq!(
            got,
            vec![offer(1, 64, true, false), offer(0, 0, false, true)]
        );
        assert_eq!(offers(&raw, 1, 8).len(), 1, "only `count` entries are read");
        assert!(offers(&raw, -1, 8).is_empty());
    }
}
