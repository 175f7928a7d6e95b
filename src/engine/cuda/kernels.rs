//! The CUDA kernel sources (`kernels/*.cu`) and their compilation with NVRTC to CUBIN (PTX as the fallback), once per process.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use std::ffi::CString;

use cudarc::nvrtc::result as nvrtc;
use cudarc::nvrtc::sys as nvrtc_sys;

use crate::error::EngineError;
use crate::gpu::libs::{self, CudaLib};

/// One `.cu` file; the kernels it defines are read from its source ([`KernelModule::functions`]).
pub struct KernelModule {
    pub name: &'static str,
    pub source: &'static str,
}

/// The device helpers every module shares (`kernels/common.cuh`).
pub const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// The line by which a module includes [`COMMON`].
const INCLUDE_COMMON: &str = "#include \"common.cuh\"";

impl KernelModule {
    /// The kernels the module defines: every `extern "C" __global__` function of its source,
    /// by name, in order ([`parse`]; a new kernel is found by its name, listed nowhere else).
    /// A source [`parse`] refuses defines none here (its test fails, `signature.rs`).
    pub fn functions(&self) -> Vec<&'static str> {
        parse(self.source)
            .map(|kernels| kernels.into_iter().map(|(name, _)| name).collect())
            .unwrap_or_default()
    }

    /// The text NVRTC compiles: the source with its `#include "common.cuh"` line replaced by
    /// [`COMMON`] (NVRTC is given no header files), and `#line` marks so that the compiler's
    /// messages name the file and line written.
    pub fn text(&self) -> String {
        expand(self.name, self.source)
    }
}

/// `source` (of `kernels/<name>.cu`) with its include of `common.cuh` put in place.
fn expand(name: &str, source: &str) -> String {
    let mut out = String::with_capacity(source.len() + COMMON.len() + 64);
    for (i, line) in source.lines().enumerate() {
        if line.trim() == INCLUDE_COMMON {
            out.push_str("#line 1 \"common.cuh\"\n");
            out.push_str(COMMON);
            out.push_str(&format!("\n#line {} \"{name}.cu\"\n", i + 2));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Every kernel module, as the table of `kernels/README.md` lists them.
pub const MODULES: &[KernelModule] = &[
    KernelModule {
        name: "elementwise",
        source: include_str!("../../../kernels/elementwise.cu"),
    },
    KernelModule {
        name: "conv",
        source: include_str!("../../../kernels/conv.cu"),
    },
    KernelModule {
        name: "norm",
        source: include_str!("../../../kernels/norm.cu"),
    },
    KernelModule {
        name: "pool",
        source: include_str!("../../../kernels/pool.cu"),
    },
    KernelModule {
        name: "loss",
        source: include_str!("../../../kernels/loss.cu"),
    },
    KernelModule {
        name: "optim",
        source: include_str!("../../../kernels/optim.cu"),
    },
    KernelModule {
        name: "data",
        source: include_str!("../../../kernels/data.cu"),
    },
    KernelModule {
        name: "probe",
        source: include_str!("../../../kernels/probe.cu"),
    },
];

/// What NVRTC produces for a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Output {
    /// PTX for `compute_XY`, compiled to machine code by the driver when loaded. A driver older
    /// than the NVRTC that wrote it refuses it (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`).
    Ptx,
    /// Machine code (an ELF image) for exactly `sm_XY`, loaded as it is, by any driver that
    /// knows the architecture.
    Cubin,
}

/// An architecture and what to produce for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Compute capability `(major, minor)`.
    pub arch: (u32, u32),
    pub output: Output,
}

impl Target {
    /// The `--gpu-architecture` value: `compute_XY` for PTX, `sm_XY` for CUBIN.
    pub fn arch_flag(&self) -> String {
        let (major, minor) = self.arch;
        match self.output {
            Output::Ptx => format!("compute_{major}{minor}"),
            Output::Cubin => format!("sm_{major}{minor}"),
        }
    }

    fn extension(&self) -> &'static str {
        match self.output {
            Output::Ptx => "ptx",
            Output::Cubin => "cubin",
        }
    }
}

/// A kernel parameter as a launch passes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A device pointer (any `T*`).
    Ptr,
    /// `unsigned int` or `int`.
    U32,
    F32,
    /// `u64` or `unsigned long long`.
    U64,
}

impl ParamKind {
    pub fn name(self) -> &'static str {
        match self {
            ParamKind::Ptr => "ptr",
            ParamKind::U32 => "u32",
            ParamKind::F32 => "f32",
            ParamKind::U64 => "u64",
        }
    }
}

/// The kind of one parameter declaration (`const float* x`, `unsigned int n`, `u64 seed`).
fn kind_of(decl: &str) -> Result<ParamKind, String> {
    if decl.contains('*') {
        return Ok(ParamKind::Ptr);
    }
    let words: Vec<&str> = decl.split_whitespace().collect();
    let Some((_, ty)) = words.split_last() else {
        return Err("an empty parameter".into());
    };
    let ty: Vec<&str> = ty.iter().copied().filter(|w| *w != "const").collect();
    match ty.as_slice() {
        ["unsigned", "int"] | ["unsigned"] | ["int"] | ["u32"] => Ok(ParamKind::U32),
        ["float"] => Ok(ParamKind::F32),
        ["u64"] | ["unsigned", "long", "long"] => Ok(ParamKind::U64),
        _ => Err(format!("`{}` has a type launches do not pass", decl.trim())),
    }
}

/// Every `extern "C" __global__` kernel of `source` with its parameters, in order.
pub fn parse(source: &str) -> Result<Vec<(&str, Vec<ParamKind>)>, String> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("__global__") {
        rest = &rest[at + "__global__".len()..];
        let head = rest.trim_start();
        let head = head
            .strip_prefix("void")
            .ok_or_else(|| "a __global__ function that does not return void".to_string())?;
        let mut head = head.trim_start();
        if let Some(after) = head.strip_prefix("__launch_bounds__") {
            let close = after
                .find(')')
                .ok_or("an unclosed __launch_bounds__".to_string())?;
            head = after[close + 1..].trim_start();
        }
        let open = head
            .find('(')
            .ok_or("a kernel without parameters".to_string())?;
        let name = head[..open].trim();
        let close = head[open..]
            .find(')')
            .ok_or_else(|| format!("kernel {name}: unclosed parameter list"))?;
        let list = &head[open + 1..open + close];
        let kinds = if list.trim().is_empty() || list.trim() == "void" {
            Vec::new()
        } else {
            list.split(',')
                .map(|d| kind_of(d).map_err(|e| format!("kernel {name}: {e}")))
                .collect::<Result<Vec<_>, _>>()?
        };
        out.push((name, kinds));
        rest = &head[open + close..];
    }
    Ok(out)
}

/// A compiled module's image.
pub enum Image {
    Ptx(String),
    Cubin(Vec<u8>),
}

/// A module compiled for one architecture.
pub struct CompiledModule {
    pub name: &'static str,
    pub image: Image,
    pub functions: Vec<&'static str>,
    source: &'static KernelModule,
    arch: (u32, u32),
    /// PTX for the same architecture, compiled only if the CUBIN does not load.
    fallback: OnceLock<Result<String, String>>,
}

impl CompiledModule {
    /// The module as PTX for its architecture (compiled on first use, from the disk cache when
    /// it is there): what the loader tries when a CUBIN is refused.
    pub fn ptx_fallback(&self) -> Result<&str, EngineError> {
        let target = Target {
            arch: self.arch,
            output: Output::Ptx,
        };
        let ptx = self.fallback.get_or_init(|| {
            let nvrtc = libs::preload(CudaLib::Nvrtc).map_err(|e| e.to_string())?;
            let bytes = cached(
                cache_dir().as_deref(),
                self.source,
                target,
                &compiler_id(&nvrtc),
                || compile_source(self.name, &self.source.text(), target),
            )
            .map_err(|f| f.to_error().to_string())?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        });
        ptx.as_deref().map_err(|e| EngineError::Device(e.clone()))
    }
}

/// Why a compilation failed, kept so that every later call gets the same answer.
#[derive(Clone, Debug)]
enum CompileFailure {
    /// NVRTC is not installed (or did not load).
    Unavailable(String),
    /// NVRTC ran and rejected a module, or failed.
    Compile(String),
}

impl CompileFailure {
    fn to_error(&self) -> EngineError {
        match self {
            CompileFailure::Unavailable(reason) => EngineError::Unavailable {
                backend: "cuda".into(),
                reason: reason.clone(),
            },
            CompileFailure::Compile(message) => EngineError::Device(message.clone()),
        }
    }
}

type Compiled = Result<Vec<CompiledModule>, CompileFailure>;

/// Compiles every module with NVRTC once per process and architecture (failures are cached too).
///
/// `arch` is the device's compute capability `(major, minor)`: each module is compiled to CUBIN
/// for exactly `sm_XY`, which loads on any driver that knows the device (PTX from an NVRTC newer
/// than the driver does not); a module whose CUBIN NVRTC cannot produce is compiled to PTX for
/// `compute_XY` instead, and one whose CUBIN the driver refuses gets its PTX when loaded
/// ([`CompiledModule::ptx_fallback`]). Without `arch` the modules are PTX for `compute_80`, which
/// a driver JIT-compiles for any newer device. NVRTC is preloaded first, so a missing library is
/// [`EngineError::Unavailable`], never a panic.
pub fn compile_all(arch: Option<(u32, u32)>) -> Result<&'static [CompiledModule], EngineError> {
    match cell_for(arch).get_or_init(|| compile_modules(arch)) {
        Ok(modules) => Ok(modules.as_slice()),
        Err(failure) => Err(failure.to_error()),
    }
}

/// Compiles every module for `target` exactly (no fallback, not kept in memory; the disk cache
/// is used): for checks that every kernel builds for a given architecture and output.
pub fn compile_for(target: Target) -> Result<Vec<CompiledModule>, EngineError> {
    let nvrtc = libs::preload(CudaLib::Nvrtc)
        .map_err(|e| CompileFailure::Unavailable(e.to_string()).to_error())?;
    let (dir, compiler) = (cache_dir(), compiler_id(&nvrtc));
    MODULES
        .iter()
        .map(|m| {
            let bytes = cached(dir.as_deref(), m, target, &compiler, || {
                compile_source(m.name, &m.text(), target)
            })
            .map_err(|f| f.to_error())?;
            Ok(compiled(m, target, bytes))
        })
        .collect()
}

/// The compilation cell of `arch`, created on first use (a handful per process at most, kept for
/// its life). Callers for one architecture wait on one compilation; others are not held up.
fn cell_for(arch: Option<(u32, u32)>) -> &'static OnceLock<Compiled> {
    type Cells = Vec<(Option<(u32, u32)>, &'static OnceLock<Compiled>)>;
    static CELLS: Mutex<Cells> = Mutex::new(Vec::new());
    let mut cells = CELLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, cell)) = cells.iter().find(|(a, _)| *a == arch) {
        return cell;
    }
    let cell: &'static OnceLock<Compiled> = Box::leak(Box::default());
    cells.push((arch, cell));
    cell
}

/// The module `name` from the default-architecture compilation ([`compile_all`] with `None`).
pub fn module(name: &str) -> Result<&'static CompiledModule, EngineError> {
    compile_all(None)?
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| EngineError::Device(format!("no kernel module named {name}")))
}

/// A compiled module from its image bytes.
fn compiled(m: &'static KernelModule, target: Target, bytes: Vec<u8>) -> CompiledModule {
    let image = match target.output {
        Output::Ptx => Image::Ptx(String::from_utf8_lossy(&bytes).into_owned()),
        Output::Cubin => Image::Cubin(bytes),
    };
    CompiledModule {
        name: m.name,
        image,
        functions: m.functions(),
        source: m,
        arch: target.arch,
        fallback: OnceLock::new(),
    }
}

fn compile_modules(arch: Option<(u32, u32)>) -> Compiled {
    let nvrtc =
        libs::preload(CudaLib::Nvrtc).map_err(|e| CompileFailure::Unavailable(e.to_string()))?;
    let (output, arch) = match arch {
        Some(a) => (Output::Cubin, a),
        None => (Output::Ptx, (8, 0)),
    };
    let dir = cache_dir();
    let compiler = compiler_id(&nvrtc);
    MODULES
        .iter()
        .map(|m| {
            let target = Target { arch, output };
            let compile = |t: Target| {
                cached(dir.as_deref(), m, t, &compiler, || {
                    compile_source(m.name, &m.text(), t)
                })
            };
            match compile(target) {
                Ok(bytes) => Ok(compiled(m, target, bytes)),
                Err(CompileFailure::Compile(cubin)) if output == Output::Cubin => {
                    let ptx = Target {
                        output: Output::Ptx,
                        ..target
                    };
                    match compile(ptx) {
                        Ok(bytes) => Ok(compiled(m, ptx, bytes)),
                        Err(CompileFailure::Compile(e)) => {
                            Err(CompileFailure::Compile(format!("{cubin}\nand as PTX: {e}")))
                        }
                        Err(other) => Err(other),
                    }
                }
                Err(other) => Err(other),
            }
        })
        .collect()
}

/// Where compiled kernels are kept between processes (every `process`-mode worker would
/// otherwise compile every kernel again): `$GPUMUX_CACHE_DIR`, else `$XDG_CACHE_HOME/gpumux`,
/// else `~/.cache/gpumux`, else the temporary folder. `GPUMUX_CACHE_DIR=off` turns the cache off.
fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    match var("GPUMUX_CACHE_DIR") {
        Some(d) if d.as_os_str() == "off" => None,
        Some(d) => Some(d),
        None => Some(
            var("XDG_CACHE_HOME")
                .map(|d| d.join("gpumux"))
                .or_else(|| var("HOME").map(|h| h.join(".cache").join("gpumux")))
                .unwrap_or_else(|| std::env::temp_dir().join("gpumux-cache")),
        ),
    }
}

/// Names the NVRTC in use: its version, path, size and modification time (a new NVRTC, a new
/// cache entry).
fn compiler_id(nvrtc: &Path) -> String {
    let meta = std::fs::metadata(nvrtc).ok();
    let size = meta.as_ref().map_or(0, |m| m.len());
    let mtime = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let (major, minor) = nvrtc_version().unwrap_or((0, 0));
    format!("nvrtc {major}.{minor}:{}:{size}:{mtime}", nvrtc.display())
}

/// NVRTC's version `(major, minor)`; NVRTC must be loaded already.
fn nvrtc_version() -> Option<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints. cudarc panics on a missing symbol; catch_unwind makes that `None`.
    let r = catch_unwind(AssertUnwindSafe(|| unsafe {
        nvrtc_sys::nvrtcVersion(&mut major, &mut minor)
    }))
    .ok()?;
    (r == nvrtc_sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// Whether `image` (a cached file) is a `target` image holding every kernel of `m`: PTX that
/// declares each as `.entry`, or an ELF image that names each in its string table.
fn holds_kernels(image: &[u8], m: &KernelModule, target: Target) -> bool {
    match target.output {
        Output::Ptx => {
            let text = String::from_utf8_lossy(image);
            m.functions()
                .iter()
                .all(|f| text.contains(&format!(".entry {f}(")))
        }
        Output::Cubin => {
            image.starts_with(b"\x7fELF")
                && m.functions().iter().all(|f| {
                    let name = format!("\0{f}\0");
                    image.windows(name.len()).any(|w| w == name.as_bytes())
                })
        }
    }
}

/// The image of module `m` for `target` from the cache in `dir`, or `compile`d and stored there.
/// A cached file that lacks any of the module's kernels is ignored; the cache never makes a
/// compilation fail (a folder that cannot be written only costs the next process a compile).
fn cached(
    dir: Option<&Path>,
    m: &KernelModule,
    target: Target,
    compiler: &str,
    compile: impl FnOnce() -> Result<Vec<u8>, CompileFailure>,
) -> Result<Vec<u8>, CompileFailure> {
    let Some(dir) = dir else { return compile() };
    let arch = target.arch_flag();
    let key =
        crate::hash::fnv1a(format!("{}\0{arch}\0fmad=false\0{compiler}", m.text()).as_bytes());
    let path = dir.join(format!(
        "{}-{arch}-{key:016x}.{}",
        m.name,
        target.extension()
    ));
    if let Ok(image) = std::fs::read(&path) {
        if holds_kernels(&image, m, target) {
            return Ok(image);
        }
    }
    let image = compile()?;
    // Written under a name unique to this process and call, then renamed: a reader never sees
    // half a file, and two threads storing the same entry do not write into one file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    let stored = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, &image))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if stored.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(image)
}

/// Compiles one source for `target` with NVRTC (which must be loaded already): PTX text, or a
/// CUBIN image.
fn compile_source(name: &str, source: &str, target: Target) -> Result<Vec<u8>, CompileFailure> {
    let arch = target.arch_flag();
    let compiled =
        catch_unwind(AssertUnwindSafe(|| run_nvrtc(name, source, target))).map_err(|_| {
            CompileFailure::Compile(format!("NVRTC panicked compiling kernels/{name}.cu"))
        })?;
    compiled.map_err(|e| {
        CompileFailure::Compile(match e {
            NvrtcFailure::Rejected(log) => format!(
                "NVRTC could not compile kernels/{name}.cu for {arch}:\n{}",
                log.trim_end()
            ),
            NvrtcFailure::Call(call, err) => {
                format!("NVRTC failed on kernels/{name}.cu for {arch}: {call}: {err:?}")
            }
        })
    })
}

/// How an NVRTC run failed.
enum NvrtcFailure {
    /// The compiler rejected the source: its log.
    Rejected(String),
    /// A call failed.
    Call(&'static str, nvrtc_sys::nvrtcResult),
}

/// One NVRTC program: created, compiled with `--fmad=false` for `target`, its output read, and
/// destroyed whatever happened.
fn run_nvrtc(name: &str, source: &str, target: Target) -> Result<Vec<u8>, NvrtcFailure> {
    let (Ok(src), Ok(file)) = (CString::new(source), CString::new(format!("{name}.cu"))) else {
        return Err(NvrtcFailure::Rejected(
            "the source or its name holds a NUL byte".into(),
        ));
    };
    let prog = nvrtc::create_program(&src, Some(&file))
        .map_err(|e| NvrtcFailure::Call("nvrtcCreateProgram", e.0))?;
    // No contraction into fused multiply-adds: each product and sum rounds on its own, as in the
    // CPU twins.
    let options = [
        "--fmad=false".to_string(),
        format!("--gpu-architecture={}", target.arch_flag()),
    ];
    // SAFETY: `prog` was just created and is destroyed once, below; `src` and `file` outlive it.
    let out = unsafe {
        match nvrtc::compile_program(prog, &options) {
            Ok(()) => read_output(prog, target.output),
            Err(_) => Err(NvrtcFailure::Rejected(
                nvrtc::get_program_log(prog)
                    .map(|log| c_text(&log))
                    .unwrap_or_else(|e| format!("(no log: {e:?})")),
            )),
        }
    };
    // SAFETY: as above; the program is not used after this.
    let destroyed = unsafe { nvrtc::destroy_program(prog) };
    let out = out?;
    destroyed.map_err(|e| NvrtcFailure::Call("nvrtcDestroyProgram", e.0))?;
    Ok(out)
}

/// Text from NVRTC's NUL-terminated characters.
fn c_text(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The compiled program's PTX (without its NUL) or CUBIN.
///
/// # Safety
/// `prog` must be a live program that compiled successfully.
unsafe fn read_output(
    prog: nvrtc_sys::nvrtcProgram,
    output: Output,
) -> Result<Vec<u8>, NvrtcFailure> {
    match output {
        Output::Ptx => {
            let ptx = nvrtc::get_ptx(prog).map_err(|e| NvrtcFailure::Call("nvrtcGetPTX", e.0))?;
            Ok(c_text(&ptx).into_bytes())
        }
        Output::Cubin => {
            let mut size = 0usize;
            let r = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
            if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(NvrtcFailure::Call("nvrtcGetCUBINSize", r));
            }
            let mut image = vec![0u8; size];
            let r = nvrtc_sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast());
            if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(NvrtcFailure::Call("nvrtcGetCUBIN", r));
            }
            Ok(image)
        }
    }
}

/// Kernel names declared `.entry` in `ptx`, for checks.
#[cfg(test)]
fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim().split_once(".entry "))
        .map(|(_, rest)| {
            let rest = rest.trim_start();
            rest.split(|c: char| c == '(' || c.is_whitespace())
                .next()
                .unwrap_or("")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_modules_kernels_are_read_from_its_source() {
        let m = KernelModule {
            name: "t",
            source: "extern \"C\" __global__ void a(float* x) {}\n__device__ void helper() {}\nextern \"C\" __global__ void __launch_bounds__(256) b_2(u32 n) {}\n",
        };
        assert_eq!(m.functions(), ["a", "b_2"]);
        let loss = MODULES.iter().find(|m| m.name == "loss").unwrap();
        assert_eq!(
            loss.functions(),
            [
                "softmax_xent",
                "softmax_xent_fused",
                "eval_xent",
                "softmax_xent_bias",
                "eval_xent_fused"
            ]
        );
    }

    /// `(file stem, kernel)` for every row of the table in kernels/README.md.
    fn readme_kernels() -> Vec<(String, String)> {
        let readme = include_str!("../../../kernels/README.md");
        let mut file = String::new();
        let mut out = Vec::new();
        for line in readme.lines().filter(|l| l.starts_with('|')) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let (Some(f), Some(k)) = (cells.get(1), cells.get(2)) else {
                continue;
            };
            if let Some(stem) = f.strip_suffix(".cu") {
                file = stem.to_string();
            }
            let Some(sig) = k.strip_prefix('`') else {
                continue;
            };
            let name = sig.split('(').next().unwrap_or_default().to_string();
            out.push((file.clone(), name));
        }
        out
    }

    #[test]
    fn every_kernel_of_the_readme_is_in_its_module() {
        let listed = readme_kernels();
        assert_eq!(listed.len(), 49, "{listed:?}");
        for (file, name) in &listed {
            let m = MODULES.iter().find(|m| m.name == file).unwrap();
            assert!(m.functions().contains(&name.as_str()), "{file}: {name}");
        }
        let total: usize = MODULES.iter().map(|m| m.functions().len()).sum();
        assert_eq!(
            total,
            listed.len(),
            "MODULES lists kernels the README does not"
        );
    }

    #[test]
    fn every_source_includes_only_the_common_helpers_and_names_its_cpu_twin() {
        for m in MODULES {
            let includes: Vec<&str> = m
                .source
                .lines()
                .filter(|l| l.contains("#include"))
                .collect();
            assert!(
                includes.iter().all(|l| l.trim() == INCLUDE_COMMON),
                "{}",
                m.name
            );
            assert!(!m.text().contains("#include"), "{}", m.name);
            assert!(
                !COMMON.contains("__global__"),
                "kernels are read from the .cu files"
            );
            let head: String = m.source.lines().take(3).collect();
            assert!(
                head.contains("twin"),
                "{}.cu opens without naming its CPU twin",
                m.name
            );
        }
    }

    #[test]
    fn the_common_helpers_are_put_in_place_with_line_marks() {
        let text = expand("x", "// x\n#include \"common.cuh\"\nint k;\n");
        assert!(text.starts_with("// x\n#line 1 \"common.cuh\"\n"), "{text}");
        assert!(text.contains(COMMON));
        assert!(text.ends_with("\n#line 3 \"x.cu\"\nint k;\n"), "{text}");
        // Every module but the probe uses them.
        let users = MODULES.iter().filter(|m| m.source.contains(INCLUDE_COMMON));
        assert_eq!(users.count(), MODULES.len() - 1);
    }

    #[test]
    fn entries_are_read_from_ptx() {
        let ptx = ".visible .entry fill(\n\t.param .u64 a\n)\n.entry  other (\n.func helper(";
        assert_eq!(entries(ptx), ["fill", "other"]);
    }

    /// Whether NVRTC can be used here; `None` (with a message) when the test should be skipped.
    fn nvrtc_or_skip(test: &str) -> Option<()> {
        match libs::preload(CudaLib::Nvrtc) {
            Ok(_) => Some(()),
            Err(e) if std::env::var("GPUMUX_REQUIRE_NVRTC").as_deref() == Ok("1") => {
                panic!("GPUMUX_REQUIRE_NVRTC=1 but NVRTC is missing: {e}")
            }
            Err(e) => {
                eprintln!("skipping {test}: {e} (set GPUMUX_REQUIRE_NVRTC=1 to make this fail)");
                None
            }
        }
    }

    /// The targets CI compiles every kernel for: PTX and CUBIN for Ampere and Hopper.
    const CI_TARGETS: [Target; 4] = [
        Target {
            arch: (8, 0),
            output: Output::Ptx,
        },
        Target {
            arch: (9, 0),
            output: Output::Ptx,
        },
        Target {
            arch: (8, 0),
            output: Output::Cubin,
        },
        Target {
            arch: (9, 0),
            output: Output::Cubin,
        },
    ];

    #[test]
    fn every_kernel_compiles_with_nvrtc() {
        if nvrtc_or_skip("every_kernel_compiles_with_nvrtc").is_none() {
            return;
        }
        for target in CI_TARGETS {
            let flag = target.arch_flag();
            let modules = compile_for(target).unwrap_or_else(|e| panic!("{flag}: {e}"));
            assert_eq!(modules.len(), MODULES.len());
            for m in &modules {
                match (&m.image, target.output) {
                    (Image::Ptx(ptx), Output::Ptx) => {
                        assert!(
                            ptx.contains(&format!(".target sm_{}", &flag[8..])),
                            "{flag}"
                        );
                        let found = entries(ptx);
                        for f in &m.functions {
                            assert!(found.contains(f), "{}: no .entry {f} in {found:?}", m.name);
                        }
                        assert_eq!(found.len(), m.functions.len(), "{}: {found:?}", m.name);
                    }
                    (Image::Cubin(elf), Output::Cubin) => {
                        assert!(elf.starts_with(b"\x7fELF"), "{}: not an ELF image", m.name);
                        let src = MODULES.iter().find(|s| s.name == m.name).unwrap();
                        assert!(holds_kernels(elf, src, target), "{}: {flag}", m.name);
                    }
                    _ => panic!("{}: {flag} gave the other kind of image", m.name),
                }
            }
        }
        // The device compilation is CUBIN; the default one PTX for compute_80.
        let device = compile_all(Some((9, 0))).unwrap();
        assert!(device.iter().all(|m| matches!(m.image, Image::Cubin(_))));
        assert!(std::ptr::eq(
            compile_all(None).unwrap(),
            compile_all(None).unwrap()
        ));
        assert!(matches!(module("loss").unwrap().image, Image::Ptx(_)));
        assert_eq!(
            module("loss").unwrap().functions,
            [
                "softmax_xent",
                "softmax_xent_fused",
                "eval_xent",
                "softmax_xent_bias",
                "eval_xent_fused"
            ]
        );
        assert!(module("nope").is_err());
        // The PTX a refused CUBIN falls back to.
        let ptx = device[0].ptx_fallback().unwrap();
        assert!(ptx.contains(".target sm_90"), "{ptx}");
    }

    #[test]
    fn compile_errors_carry_nvrtc_log() {
        if nvrtc_or_skip("compile_errors_carry_nvrtc_log").is_none() {
            return;
        }
        let ptx80 = Target {
            arch: (8, 0),
            output: Output::Ptx,
        };
        let bad = "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }";
        for target in [ptx80, CI_TARGETS[3]] {
            let Err(CompileFailure::Compile(msg)) = compile_source("bad", bad, target) else {
                panic!("a bad source compiled");
            };
            assert!(
                msg.contains("kernels/bad.cu") && msg.contains("undefined_name"),
                "{msg}"
            );
            assert!(msg.contains(&target.arch_flag()), "{msg}");
        }
        // With fused multiply-adds off, a*b + c stays a separate multiply and add.
        let src = "extern \"C\" __global__ void k(float* x) { x[0] = x[1] * x[2] + x[3]; }";
        let ptx = String::from_utf8(compile_source("mad", src, ptx80).unwrap()).unwrap();
        assert!(
            !ptx.contains("fma.rn.f32") && ptx.contains("mul.rn.f32"),
            "{ptx}"
        );
        assert!(!ptx.ends_with('\0'));
    }

    #[test]
    fn the_ptx_cache_compiles_once_and_ignores_damaged_files() {
        let tmp = tempfile::tempdir().unwrap();
        let m = &MODULES[0];
        let ptx: Vec<u8> = m
            .functions()
            .iter()
            .map(|f| format!(".visible .entry {f}(\n"))
            .collect::<String>()
            .into_bytes();
        let compiles = std::cell::Cell::new(0);
        let t90 = Target {
            arch: (9, 0),
            output: Output::Ptx,
        };
        let run_as = |dir: Option<&Path>, compiler: &str, target: Target, image: &[u8]| {
            cached(dir, m, target, compiler, || {
                compiles.set(compiles.get() + 1);
                Ok(image.to_vec())
            })
            .unwrap()
        };
        let run = |dir: Option<&Path>, compiler: &str| run_as(dir, compiler, t90, &ptx);
        assert_eq!(run(Some(tmp.path()), "nvrtc-a"), ptx);
        assert_eq!(run(Some(tmp.path()), "nvrtc-a"), ptx);
        assert_eq!(compiles.get(), 1, "the second process reads the cache");
        run(Some(tmp.path()), "nvrtc-b");
        assert_eq!(compiles.get(), 2, "another NVRTC is another entry");
        for f in std::fs::read_dir(tmp.path()).unwrap() {
            std::fs::write(f.unwrap().path(), "garbage").unwrap();
        }
        run(Some(tmp.path()), "nvrtc-a");
        assert_eq!(compiles.get(), 3, "a damaged entry is compiled again");
        run(None, "nvrtc-a");
        assert_eq!(compiles.get(), 4, "no cache folder, no cache");
        // A CUBIN for the same architecture is another entry, checked as an ELF image.
        let mut elf = b"\x7fELF".to_vec();
        for f in m.functions() {
            elf.extend_from_slice(format!("\0{f}\0").as_bytes());
        }
        let sm90 = Target {
            output: Output::Cubin,
            ..t90
        };
        assert_eq!(run_as(Some(tmp.path()), "nvrtc-a", sm90, &elf), elf);
        assert_eq!(run_as(Some(tmp.path()), "nvrtc-a", sm90, &elf), elf);
        assert_eq!(compiles.get(), 5, "the CUBIN is cached apart from the PTX");
        let mut names: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "{names:?}");
        // Sorted, `elementwise-compute_90-…` comes before `elementwise-sm_90-…`.
        assert!(
            names[2].ends_with(".cubin") && names[2].contains("-sm_90-"),
            "{names:?}"
        );
        assert!(
            names[..2].iter().all(|n| n.ends_with(".ptx")),
            "no temporary files left: {names:?}"
        );
    }
}
