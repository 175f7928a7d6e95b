//! The CUDA kernel sources (`kernels/*.cu`) and their compilation to PTX with NVRTC, once per process.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use crate::error::EngineError;
use crate::gpu::libs::{self, CudaLib};

/// One `.cu` file and the kernels it defines.
pub struct KernelModule {
    pub name: &'static str,
    pub source: &'static str,
    pub functions: &'static [&'static str],
}

/// Every kernel module, as the table of `kernels/README.md` lists them.
pub const MODULES: &[KernelModule] = &[
    KernelModule {
        name: "elementwise",
        source: include_str!("../../../kernels/elementwise.cu"),
        functions: &[
            "fill",
            "relu_fwd",
            "relu_bwd",
            "bias_add",
            "bias_grad",
            "dropout_fwd",
            "dropout_bwd",
            "advance",
        ],
    },
    KernelModule {
        name: "conv",
        source: include_str!("../../../kernels/conv.cu"),
        functions: &[
            "im2col",
            "col2im",
            "nchw_to_cnhw",
            "cnhw_to_nchw_bias",
            "row_sum",
        ],
    },
    KernelModule {
        name: "pool",
        source: include_str!("../../../kernels/pool.cu"),
        functions: &["maxpool_fwd", "maxpool_bwd"],
    },
    KernelModule {
        name: "loss",
        source: include_str!("../../../kernels/loss.cu"),
        functions: &["softmax_xent", "eval_xent"],
    },
    KernelModule {
        name: "optim",
        source: include_str!("../../../kernels/optim.cu"),
        functions: &["sgd_step", "adam_step"],
    },
    KernelModule {
        name: "data",
        source: include_str!("../../../kernels/data.cu"),
        functions: &["gather", "gather_train"],
    },
    KernelModule {
        name: "probe",
        source: include_str!("../../../kernels/probe.cu"),
        functions: &["sm_probe"],
    },
];

/// A module compiled to PTX.
pub struct CompiledModule {
    pub name: &'static str,
    pub ptx: String,
    pub functions: &'static [&'static str],
}

/// Why a compilation failed, kept so that every later call gets the same answer.
#[derive(Clone, Debug)]
enum Failure {
    /// NVRTC is not installed (or did not load).
    Unavailable(String),
    /// NVRTC ran and rejected a module, or failed.
    Compile(String),
}

impl Failure {
    fn to_error(&self) -> EngineError {
        match self {
            Failure::Unavailable(reason) => EngineError::Unavailable {
                backend: "cuda".into(),
                reason: reason.clone(),
            },
            Failure::Compile(message) => EngineError::Device(message.clone()),
        }
    }
}

type Compiled = Result<Vec<CompiledModule>, Failure>;

/// Compiles every module with NVRTC once per process and architecture (failures are cached too).
///
/// `arch` is the device's compute capability `(major, minor)`: the PTX targets `compute_XY`. Without
/// it the PTX targets `compute_80`, which the driver JIT-compiles for any newer device. NVRTC is
/// preloaded first, so a missing library is [`EngineError::Unavailable`], never a panic.
pub fn compile_all(arch: Option<(u32, u32)>) -> Result<&'static [CompiledModule], EngineError> {
    match cell_for(arch).get_or_init(|| compile_modules(arch)) {
        Ok(modules) => Ok(modules.as_slice()),
        Err(failure) => Err(failure.to_error()),
    }
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

/// The `--gpu-architecture` value for `arch`.
fn arch_name(arch: Option<(u32, u32)>) -> String {
    let (major, minor) = arch.unwrap_or((8, 0));
    format!("compute_{major}{minor}")
}

fn compile_modules(arch: Option<(u32, u32)>) -> Compiled {
    let nvrtc = libs::preload(CudaLib::Nvrtc).map_err(|e| Failure::Unavailable(e.to_string()))?;
    let arch = arch_name(arch);
    let dir = cache_dir();
    let compiler = compiler_id(&nvrtc);
    MODULES
        .iter()
        .map(|m| {
            let ptx = cached(dir.as_deref(), m, &arch, &compiler, || {
                compile_source(m.name, m.source, &arch)
            })?;
            Ok(CompiledModule {
                name: m.name,
                ptx,
                functions: m.functions,
            })
        })
        .collect()
}

/// Where compiled PTX is kept between processes (every `process`-mode worker would otherwise
/// compile every kernel again): `$GPUMUX_CACHE_DIR`, else `$XDG_CACHE_HOME/gpumux`, else
/// `~/.cache/gpumux`, else the temporary folder. `GPUMUX_CACHE_DIR=off` turns the cache off.
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

/// Names the NVRTC in use: its path, size and modification time (a new NVRTC, a new cache entry).
fn compiler_id(nvrtc: &Path) -> String {
    let meta = std::fs::metadata(nvrtc).ok();
    let size = meta.as_ref().map_or(0, |m| m.len());
    let mtime = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    format!("{}:{size}:{mtime}", nvrtc.display())
}

/// The PTX of module `m` for `arch` from the cache in `dir`, or `compile`d and stored there.
/// A cached file that lacks any of the module's kernels is ignored; the cache never makes a
/// compilation fail (a folder that cannot be written only costs the next process a compile).
fn cached(
    dir: Option<&Path>,
    m: &KernelModule,
    arch: &str,
    compiler: &str,
    compile: impl FnOnce() -> Result<String, Failure>,
) -> Result<String, Failure> {
    let Some(dir) = dir else { return compile() };
    let key =
        crate::hash::fnv1a(format!("{}\0{arch}\0fmad=false\0{compiler}", m.source).as_bytes());
    let path = dir.join(format!("{}-{arch}-{key:016x}.ptx", m.name));
    if let Ok(ptx) = std::fs::read_to_string(&path) {
        if m.functions
            .iter()
            .all(|f| ptx.contains(&format!(".entry {f}(")))
        {
            return Ok(ptx);
        }
    }
    let ptx = compile()?;
    // Written under a unique name, then renamed: a reader never sees half a file.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let stored = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, &ptx))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if stored.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(ptx)
}

/// Compiles one source to PTX for `arch` (`compute_XY`). NVRTC must be loaded already.
fn compile_source(name: &str, source: &str, arch: &str) -> Result<String, Failure> {
    let opts = CompileOptions {
        // No contraction into fused multiply-adds: each product and sum rounds on its own, as in
        // the CPU twins.
        fmad: Some(false),
        options: vec![format!("--gpu-architecture={arch}")],
        name: Some(format!("{name}.cu")),
        ..CompileOptions::default()
    };
    let compiled = catch_unwind(AssertUnwindSafe(|| compile_ptx_with_opts(source, opts)))
        .map_err(|_| Failure::Compile(format!("NVRTC panicked compiling kernels/{name}.cu")))?;
    let ptx = compiled.map_err(|e| Failure::Compile(describe(name, arch, &e)))?;
    let bytes = ptx.as_bytes().unwrap_or_default();
    let text = String::from_utf8_lossy(bytes);
    Ok(text.trim_end_matches('\0').to_string())
}

/// A compile error with NVRTC's log.
fn describe(name: &str, arch: &str, e: &CompileError) -> String {
    match e {
        CompileError::CompileError { nvrtc, log, .. } => format!(
            "NVRTC could not compile kernels/{name}.cu for {arch} ({nvrtc:?}):\n{}",
            log.to_string_lossy().trim_end()
        ),
        other => format!("NVRTC failed on kernels/{name}.cu for {arch}: {other:?}"),
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
    fn every_kernel_of_the_readme_is_in_its_module_and_source() {
        let listed = readme_kernels();
        assert_eq!(listed.len(), 22, "{listed:?}");
        for (file, name) in &listed {
            let m = MODULES.iter().find(|m| m.name == file).unwrap();
            assert!(m.functions.contains(&name.as_str()), "{file}: {name}");
            let decl = format!("extern \"C\" __global__ void {name}(");
            assert!(m.source.contains(&decl), "{file}.cu lacks {decl}");
        }
        let total: usize = MODULES.iter().map(|m| m.functions.len()).sum();
        assert_eq!(
            total,
            listed.len(),
            "MODULES lists kernels the README does not"
        );
    }

    #[test]
    fn every_source_is_header_free_and_names_its_cpu_twin() {
        for m in MODULES {
            assert!(!m.source.contains("#include"), "{}", m.name);
            let head: String = m.source.lines().take(3).collect();
            assert!(
                head.contains("twin"),
                "{}.cu opens without naming its CPU twin",
                m.name
            );
        }
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

    #[test]
    fn every_kernel_compiles_with_nvrtc() {
        if nvrtc_or_skip("every_kernel_compiles_with_nvrtc").is_none() {
            return;
        }
        for arch in [None, Some((9, 0))] {
            let modules = compile_all(arch).unwrap_or_else(|e| panic!("{}: {e}", arch_name(arch)));
            assert_eq!(modules.len(), MODULES.len());
            for m in modules {
                assert!(m
                    .ptx
                    .contains(&format!(".target sm_{}", &arch_name(arch)[8..])));
                let found = entries(&m.ptx);
                for f in m.functions {
                    assert!(found.contains(f), "{}: no .entry {f} in {found:?}", m.name);
                }
                assert_eq!(found.len(), m.functions.len(), "{}: {found:?}", m.name);
            }
        }
        assert!(std::ptr::eq(
            compile_all(None).unwrap(),
            compile_all(None).unwrap()
        ));
        assert_eq!(
            module("loss").unwrap().functions,
            ["softmax_xent", "eval_xent"]
        );
        assert!(module("nope").is_err());
    }

    #[test]
    fn compile_errors_carry_nvrtc_log() {
        if nvrtc_or_skip("compile_errors_carry_nvrtc_log").is_none() {
            return;
        }
        let bad = "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }";
        let Err(Failure::Compile(msg)) = compile_source("bad", bad, "compute_80") else {
            panic!("a bad source compiled");
        };
        assert!(
            msg.contains("kernels/bad.cu") && msg.contains("undefined_name"),
            "{msg}"
        );
        // With fused multiply-adds off, a*b + c stays a separate multiply and add.
        let src = "extern \"C\" __global__ void k(float* x) { x[0] = x[1] * x[2] + x[3]; }";
        let ptx = compile_source("mad", src, "compute_80").unwrap();
        assert!(
            !ptx.contains("fma.rn.f32") && ptx.contains("mul.rn.f32"),
            "{ptx}"
        );
    }

    #[test]
    fn the_ptx_cache_compiles_once_and_ignores_damaged_files() {
        let tmp = tempfile::tempdir().unwrap();
        let m = &MODULES[0];
        let ptx: String = m
            .functions
            .iter()
            .map(|f| format!(".visible .entry {f}(\n"))
            .collect();
        let compiles = std::cell::Cell::new(0);
        let run = |dir: Option<&Path>, compiler: &str| {
            cached(dir, m, "compute_90", compiler, || {
                compiles.set(compiles.get() + 1);
                Ok(ptx.clone())
            })
            .unwrap()
        };
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
        let names: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| n.ends_with(".ptx")),
            "no temporary files left: {names:?}"
        );
    }
}
