//! Finding the CUDA libraries (driver, NVRTC, cuBLAS, cuDNN) at run time and preloading them by absolute path.
//!
//! The CUDA bindings open their libraries by soname and panic when none loads. Preloading the file
//! found here with `RTLD_GLOBAL` first makes that later `dlopen` by soname return the loaded
//! library, and turns a missing library into a [`LibError`] instead of a panic.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

/// A CUDA library the GPU backend loads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaLib {
    Driver,
    Nvrtc,
    Cublas,
    /// cuDNN 9: its front library and the sub-libraries it opens by soname.
    Cudnn,
}

impl CudaLib {
    /// The library's short name, as `gpumux devices` lists it.
    pub fn name(self) -> &'static str {
        match self {
            CudaLib::Driver => "driver",
            CudaLib::Nvrtc => "nvrtc",
            CudaLib::Cublas => "cublas",
            CudaLib::Cudnn => "cudnn",
        }
    }
}

/// A library that is not installed where we looked (or did not load).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{lib} not found; searched {searched}")]
pub struct LibError {
    pub lib: String,
    pub searched: String,
}

/// The environment that decides where libraries are searched, as plain values.
#[derive(Clone, Debug, Default)]
pub struct Env {
    pub cuda_home: Option<PathBuf>,
    pub cuda_path: Option<PathBuf>,
    pub ld_library_path: Option<OsString>,
    pub virtual_env: Option<PathBuf>,
    /// `sys.path` of the `python3` on `PATH` (empty without one).
    pub python_sys_path: Vec<PathBuf>,
    /// The file-system root the fixed system folders are under (`/`).
    pub root: PathBuf,
}

impl Env {
    /// This process's environment, with the `sys.path` of the `python3` on `PATH`.
    pub fn from_process() -> Env {
        Env {
            python_sys_path: python_sys_path().to_vec(),
            ..Env::from_process_alone()
        }
    }

    /// This process's environment, without asking a Python for its `sys.path`.
    fn from_process_alone() -> Env {
        let path = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Env {
            cuda_home: path("CUDA_HOME"),
            cuda_path: path("CUDA_PATH"),
            ld_library_path: std::env::var_os("LD_LIBRARY_PATH"),
            virtual_env: path("VIRTUAL_ENV"),
            python_sys_path: Vec::new(),
            root: PathBuf::from("/"),
        }
    }
}

/// The folders searched for NVRTC, cuBLAS and cuDNN, in order (the driver's search adds the system folders).
pub fn search_dirs() -> Vec<PathBuf> {
    search_dirs_from(&Env::from_process())
}

/// [`search_dirs`] for the environment `env`: the existing folders, each once, in search order.
pub fn search_dirs_from(env: &Env) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(home) = &env.cuda_home {
        dirs.push(home.join("lib64"));
        dirs.push(home.join("lib"));
    }
    if let Some(path) = &env.cuda_path {
        dirs.push(path.join("lib64"));
    }
    if let Some(ld) = &env.ld_library_path {
        dirs.extend(std::env::split_paths(ld).filter(|d| !d.as_os_str().is_empty()));
    }
    let local = env.root.join("usr/local");
    dirs.push(local.join("cuda/lib64"));
    let versioned = cuda_installs(&local);
    dirs.extend(
        versioned
            .iter()
            .filter(|d| d.file_name().is_some_and(|n| n != "cuda"))
            .map(|d| d.join("lib64")),
    );
    dirs.extend(versioned.iter().map(|d| d.join("targets/x86_64-linux/lib")));
    for site in site_packages(env) {
        dirs.extend(
            subdirs(&site.join("nvidia"))
                .into_iter()
                .map(|d| d.join("lib")),
        );
    }
    unique_existing(dirs)
}

/// The folders searched for `lib` under `env`: [`search_dirs_from`], plus the system library
/// folders for the driver.
pub fn dirs_for(lib: CudaLib, env: &Env) -> Vec<PathBuf> {
    let mut dirs = search_dirs_from(env);
    if lib == CudaLib::Driver {
        let system = [
            "usr/lib/x86_64-linux-gnu",
            "usr/lib64",
            "lib/x86_64-linux-gnu",
            "usr/local/nvidia/lib64",
        ];
        dirs.extend(system.iter().map(|d| env.root.join(d)));
    }
    unique_existing(dirs)
}

/// Loads `lib` (and what it needs first) once per process and returns the path of the file loaded
/// (the bare soname when only the system loader found it).
///
/// Idempotent; loads by absolute path with `RTLD_NOW | RTLD_GLOBAL` and keeps the handle for the
/// process's life, so that a later `dlopen` by soname finds the already-loaded library.
pub fn preload(lib: CudaLib) -> Result<PathBuf, LibError> {
    static LOADED: Mutex<Vec<(CudaLib, PathBuf, Vec<Library>)>> = Mutex::new(Vec::new());
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path, _)) = loaded.iter().find(|(l, _, _)| *l == lib) {
        return Ok(path.clone());
    }
    let env = if lib == CudaLib::Driver {
        // The driver is installed with the system's, never by pip: no need to start a Python
        // to ask it for its site-packages (which can take a second behind a version manager).
        Env {
            python_sys_path: Vec::new(),
            ..Env::from_process_alone()
        }
    } else {
        Env::from_process()
    };
    let dirs = dirs_for(lib, &env);
    let (path, handles) = match locate(lib, &dirs) {
        Ok(files) => load_files(&dirs, &files)?,
        Err(miss) => load_by_soname(lib).ok_or(miss)?,
    };
    loaded.push((lib, path.clone(), handles));
    Ok(path)
}

/// Loads the first file named `soname` in the search folders, if there is one and it loads
/// (`RTLD_GLOBAL`, kept for the process's life); returns its path. For libraries another one
/// opens by soname at run time, such as the cuBLASLt of cuDNN's CUDA version.
pub fn preload_optional(soname: &str) -> Option<PathBuf> {
    static LOADED: Mutex<Vec<(String, PathBuf, Library)>> = Mutex::new(Vec::new());
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path, _)) = loaded.iter().find(|(n, _, _)| n == soname) {
        return Some(path.clone());
    }
    let file = search_dirs()
        .into_iter()
        .map(|d| d.join(soname))
        .find(|f| f.is_file())?;
    // SAFETY: as in `load_files`.
    let handle = unsafe { Library::open(Some(file.as_path()), RTLD_NOW | RTLD_GLOBAL) }.ok()?;
    loaded.push((soname.to_string(), file.clone(), handle));
    Some(file)
}

/// The file the dynamic loader mapped the code at `addr` from (`dladdr`), as an absolute path
/// with its links resolved; `None` when no loaded file holds the address. The address is only
/// looked up, never read through.
pub fn file_at(addr: usize) -> Option<PathBuf> {
    if addr == 0 {
        return None;
    }
    // SAFETY: an all-zero Dl_info is valid (null pointers and zero); dladdr only fills it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads no memory at `addr`; it looks the address up in the loader's tables
    // and writes `info`, whose strings belong to the loader and live while the file is loaded.
    let found = unsafe { libc::dladdr(addr as *const std::ffi::c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a non-null dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes()));
    Some(std::fs::canonicalize(&path).unwrap_or(path))
}

/// Whether `path` is a CUDA toolkit's link-time stub: such files lie in a `stubs` folder, and
/// a stub `libcuda` fails every call with `CUDA_ERROR_STUB_LIBRARY`.
pub fn is_stub(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "stubs")
}

/// A CUDA library in use: the file its functions are called from (as the loader reports it
/// through one of them), and the file gpumux found and preloaded for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    pub lib: CudaLib,
    pub file: PathBuf,
    pub preloaded: PathBuf,
}

impl Bound {
    /// Whether the functions come from another file than the one preloaded (the same file
    /// reached through a link is the same).
    pub fn differs(&self) -> bool {
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        canon(&self.file) != canon(&self.preloaded)
    }

    /// `library cublas: /path` and, when it is not the file preloaded, which one that was.
    pub fn line(&self) -> String {
        let mut line = format!("library {}: {}", self.lib.name(), self.file.display());
        if self.differs() {
            line.push_str(&format!(
                " (the bindings opened it by name; gpumux had found {})",
                self.preloaded.display()
            ));
        }
        line
    }
}

/// The CUDA libraries bound in this process, in the order they were first recorded.
static BOUND: Mutex<Vec<Bound>> = Mutex::new(Vec::new());

/// Records a library in use (the latest record of a library wins).
pub fn record_bound(b: Bound) {
    let mut all = BOUND.lock().unwrap_or_else(|e| e.into_inner());
    match all.iter_mut().find(|x| x.lib == b.lib) {
        Some(entry) => *entry = b,
        None => all.push(b),
    }
}

/// The libraries bound so far ([`record_bound`]).
pub fn bound() -> Vec<Bound> {
    BOUND.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The sonames of `lib` to load, in load order; each is one file, and the last is `lib` itself.
/// An inner list holds alternative names of one file, the preferred first: CUDA 13, else CUDA 12,
/// whose NVRTC and cuBLAS entry points that gpumux calls are the same (a PyTorch environment may
/// carry either).
fn sonames(lib: CudaLib) -> &'static [&'static [&'static str]] {
    match lib {
        CudaLib::Driver => &[&["libcuda.so.1", "libcuda.so"]],
        CudaLib::Nvrtc => &[&["libnvrtc.so.13", "libnvrtc.so.12"]],
        CudaLib::Cublas => &[
            &["libcublasLt.so.13", "libcublasLt.so.12"],
            &["libcublas.so.13", "libcublas.so.12"],
        ],
        CudaLib::Cudnn => &[&["libcudnn.so.9"]],
    }
}

/// cuDNN 9's sub-libraries, which its front library opens by bare soname when first used: each
/// one found next to it is loaded first, dependencies before dependants (the graph library
/// before the legacy and engine ones), so that those opens find them loaded.
const CUDNN_PARTS: &[&str] = &[
    "libcudnn_graph.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_cnn.so.9",
    "libcudnn_adv.so.9",
    "libcudnn_engines_precompiled.so.9",
    "libcudnn_engines_runtime_compiled.so.9",
    "libcudnn_heuristic.so.9",
];

/// cuDNN's sub-libraries present in `dir`, dependencies first.
fn cudnn_parts_in(dir: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    CUDNN_PARTS
        .iter()
        .map(|p| dir.join(p))
        .filter(|f| f.is_file())
}

/// Loads cuDNN's sub-libraries found in `dir` by absolute path and keeps them loaded for the
/// process's life: the front library in `dir` then finds them loaded when it opens them by name,
/// whatever the search path holds. One that does not load is left to the front library's own
/// open (a failure there is the cuDNN probe's to report).
pub fn preload_cudnn_parts(dir: &Path) {
    static PARTS: Mutex<Vec<Library>> = Mutex::new(Vec::new());
    let mut held = PARTS.lock().unwrap_or_else(|e| e.into_inner());
    for file in cudnn_parts_in(dir) {
        // SAFETY: as in `load_files`.
        if let Ok(h) = unsafe { Library::open(Some(file.as_path()), RTLD_NOW | RTLD_GLOBAL) } {
            held.push(h);
        }
    }
}

/// The files to load for `lib` from `dirs`, in load order, or the error naming the first miss.
pub fn locate(lib: CudaLib, dirs: &[PathBuf]) -> Result<Vec<PathBuf>, LibError> {
    let mut files = Vec::new();
    // A toolkit's `stubs` folder holds link-time stand-ins (a stub libcuda fails cuInit).
    let real: Vec<&PathBuf> = dirs
        .iter()
        .filter(|d| !d.components().any(|c| c.as_os_str() == "stubs"))
        .collect();
    for names in sonames(lib) {
        // The preferred name in any folder before the next name in any (CUDA 13 before 12,
        // libcuda.so.1 before a bare libcuda.so).
        let found = names
            .iter()
            .find_map(|n| real.iter().map(|d| d.join(n)).find(|f| f.is_file()));
        let Some(file) = found else {
            return Err(LibError {
                lib: names.join(" or "),
                searched: searched_list(dirs),
            });
        };
        if lib == CudaLib::Nvrtc {
            files.extend(nvrtc_builtins(&file));
        }
        if lib == CudaLib::Cudnn {
            if let Some(dir) = file.parent() {
                files.extend(cudnn_parts_in(dir));
            }
        }
        files.push(file);
    }
    Ok(files)
}

/// NVRTC's builtins library next to `nvrtc` (`libnvrtc-builtins.so.<major>.*`, the newest), if present.
fn nvrtc_builtins(nvrtc: &Path) -> Option<PathBuf> {
    let dir = nvrtc.parent()?;
    let major = file_name(nvrtc).rsplit('.').next()?.to_string();
    let prefix = format!("libnvrtc-builtins.so.{major}.");
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect();
    found.sort_by_key(|p| version_key(&file_name(p)));
    found.pop()
}

/// dlopens `files` in order; returns the last one's path and every handle.
fn load_files(dirs: &[PathBuf], files: &[PathBuf]) -> Result<(PathBuf, Vec<Library>), LibError> {
    let mut handles = Vec::new();
    for file in files {
        // SAFETY: loading a CUDA library runs its initialisers, which have no preconditions on
        // the caller; the handle is kept for the process's life, so nothing is unloaded.
        let handle = unsafe { Library::open(Some(file.as_path()), RTLD_NOW | RTLD_GLOBAL) };
        match handle {
            Ok(h) => handles.push(h),
            Err(e) => {
                return Err(LibError {
                    lib: format!("a loadable {}", file_name(file)),
                    searched: format!(
                        "{}; {} did not load: {e}",
                        searched_list(dirs),
                        file.display()
                    ),
                })
            }
        }
    }
    let path = files.last().cloned().unwrap_or_default();
    Ok((path, handles))
}

/// Asks the system loader for `lib`'s sonames (its cache and default folders), the last resort.
fn load_by_soname(lib: CudaLib) -> Option<(PathBuf, Vec<Library>)> {
    let mut handles = Vec::new();
    let mut last = PathBuf::new();
    for names in sonames(lib) {
        let (name, handle) = names.iter().find_map(|n| {
            // SAFETY: as in `load_files`.
            let h = unsafe { Library::open(Some(*n), RTLD_NOW | RTLD_GLOBAL) };
            h.ok().map(|h| (*n, h))
        })?;
        handles.push(handle);
        last = PathBuf::from(name);
    }
    Some((last, handles))
}

/// The folders of a miss, on one line, ending with the system loader.
fn searched_list(dirs: &[PathBuf]) -> String {
    let mut parts: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    parts.push("the system loader's default paths".into());
    parts.join(", ")
}

/// `/usr/local/cuda*` folders: plain `cuda` first, then versioned ones, newest first.
fn cuda_installs(local: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = subdirs(local)
        .into_iter()
        .filter(|d| {
            d.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n == "cuda" || n.starts_with("cuda-"))
        })
        .collect();
    found.sort_by_key(|d| {
        let name = file_name(d);
        (name != "cuda", std::cmp::Reverse(version_key(&name)))
    });
    found
}

/// The last component of `path`, lossily as text.
fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The numbers in `name` (e.g. `cuda-12.10` → `[12, 10]`), compared numerically.
fn version_key(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect()
}

/// Site-packages folders that may hold pip-installed CUDA (`nvidia/*/lib`).
fn site_packages(env: &Env) -> Vec<PathBuf> {
    let mut sites = Vec::new();
    if let Some(venv) = &env.virtual_env {
        sites.extend(python_dirs(&venv.join("lib"), &["site-packages"]));
    }
    sites.extend(env.python_sys_path.iter().cloned());
    sites.extend(python_dirs(
        &env.root.join("usr/local/lib"),
        &["site-packages", "dist-packages"],
    ));
    sites.push(env.root.join("usr/lib/python3/dist-packages"));
    sites
}

/// `base/python3*/<leaf>` for each leaf, newest Python first.
fn python_dirs(base: &Path, leaves: &[&str]) -> Vec<PathBuf> {
    let mut pythons: Vec<PathBuf> = subdirs(base)
        .into_iter()
        .filter(|d| {
            d.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3"))
        })
        .collect();
    pythons.sort_by_key(|d| std::cmp::Reverse(version_key(&file_name(d))));
    pythons
        .iter()
        .flat_map(|p| leaves.iter().map(move |leaf| p.join(leaf)))
        .collect()
}

/// The sub-folders of `dir`, sorted by name (none when it cannot be read).
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// The folders of `dirs` that exist, first occurrence kept.
fn unique_existing(dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        if d.is_dir() && !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

/// `sys.path` of the `python3` on `PATH`, asked once per process (empty without one).
fn python_sys_path() -> &'static [PathBuf] {
    static PATHS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    PATHS.get_or_init(|| {
        let out = std::process::Command::new("python3")
            .args(["-c", "import sys; print(\"\\n\".join(sys.path))"])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(PathBuf::from)
                .collect(),
            _ => Vec::new(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// Creates `rel` (a folder) under `root` and returns its path.
    fn mkdir(root: &Path, rel: &str) -> PathBuf {
        let d = root.join(rel);
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// Creates an empty file `rel` under `root` (and its folders) and returns its path.
    fn touch(root: &Path, rel: &str) -> PathBuf {
        let f = root.join(rel);
        fs::create_dir_all(f.parent().unwrap()).unwrap();
        fs::write(&f, b"").unwrap();
        f
    }

    fn env_at(root: &Path) -> Env {
        Env {
            root: root.join("sys"),
            ..Env::default()
        }
    }

    #[test]
    fn search_order_follows_the_documented_list() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        let home = mkdir(r, "home");
        let expected = vec![
            mkdir(r, "home/lib64"),
            mkdir(r, "home/lib"),
            mkdir(r, "cudapath/lib64"),
            mkdir(r, "ld1"),
            mkdir(r, "ld2"),
            mkdir(r, "sys/usr/local/cuda/lib64"),
            mkdir(r, "sys/usr/local/cuda-12.10/lib64"),
            mkdir(r, "sys/usr/local/cuda-12.4/lib64"),
            mkdir(r, "sys/usr/local/cuda/targets/x86_64-linux/lib"),
            mkdir(r, "sys/usr/local/cuda-12.10/targets/x86_64-linux/lib"),
            mkdir(r, "sys/usr/local/cuda-12.4/targets/x86_64-linux/lib"),
            mkdir(r, "venv/lib/python3.12/site-packages/nvidia/cu13/lib"),
            mkdir(r, "py/site-packages/nvidia/cublas/lib"),
            mkdir(
                r,
                "sys/usr/local/lib/python3.11/dist-packages/nvidia/cu13/lib",
            ),
            mkdir(r, "sys/usr/lib/python3/dist-packages/nvidia/cuda_nvrtc/lib"),
        ];
        mkdir(r, "sys/usr/local/cuda-9.2"); // no lib64: not listed
        let env = Env {
            cuda_home: Some(home),
            cuda_path: Some(r.join("cudapath")),
            ld_library_path: Some(
                std::env::join_paths([r.join("ld1"), r.join("missing"), r.join("ld2")]).unwrap(),
            ),
            virtual_env: Some(r.join("venv")),
            python_sys_path: vec![r.join("py/site-packages"), r.join("ld1")],
            root: r.join("sys"),
        };
        assert_eq!(search_dirs_from(&env), expected);
        assert_eq!(dirs_for(CudaLib::Nvrtc, &env), expected);
        let driver_dir = mkdir(r, "sys/usr/lib/x86_64-linux-gnu");
        assert_eq!(dirs_for(CudaLib::Driver, &env).last(), Some(&driver_dir));
        assert!(!dirs_for(CudaLib::Cublas, &env).contains(&driver_dir));
    }

    #[test]
    fn cuda_home_comes_before_ld_library_path() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        touch(r, "ld/libnvrtc.so.13");
        let home_lib = touch(r, "home/lib64/libnvrtc.so.13");
        let mut env = Env {
            ld_library_path: Some(r.join("ld").into_os_string()),
            ..env_at(r)
        };
        let files = locate(CudaLib::Nvrtc, &search_dirs_from(&env)).unwrap();
        assert_eq!(files, vec![r.join("ld/libnvrtc.so.13")]);
        env.cuda_home = Some(r.join("home"));
        let files = locate(CudaLib::Nvrtc, &search_dirs_from(&env)).unwrap();
        assert_eq!(files, vec![home_lib]);
    }

    #[test]
    fn pip_installed_libraries_are_found_in_site_packages() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        let site = r.join("site");
        touch(&site, "nvidia/cu13/lib/libnvrtc-builtins.alt.so.13.0");
        let builtins = touch(&site, "nvidia/cu13/lib/libnvrtc-builtins.so.13.0");
        let nvrtc = touch(&site, "nvidia/cu13/lib/libnvrtc.so.13");
        let lt = touch(&site, "nvidia/cublas/lib/libcublasLt.so.13");
        let cublas = touch(&site, "nvidia/cublas/lib/libcublas.so.13");
        let env = Env {
            python_sys_path: vec![site.clone()],
            ..env_at(r)
        };
        let dirs = search_dirs_from(&env);
        assert_eq!(
            locate(CudaLib::Nvrtc, &dirs).unwrap(),
            vec![builtins, nvrtc]
        );
        assert_eq!(locate(CudaLib::Cublas, &dirs).unwrap(), vec![lt, cublas]);
        // The same tree under a virtual environment or the system's Python.
        let venv = r.join("venv");
        fs::create_dir_all(venv.join("lib/python3.12")).unwrap();
        fs::rename(&site, venv.join("lib/python3.12/site-packages")).unwrap();
        let env = Env {
            virtual_env: Some(venv),
            ..env_at(r)
        };
        assert!(locate(CudaLib::Cublas, &search_dirs_from(&env)).is_ok());
        let system = mkdir(r, "sys/usr/local/lib/python3.10");
        fs::rename(
            r.join("venv/lib/python3.12/site-packages"),
            system.join("dist-packages"),
        )
        .unwrap();
        assert!(locate(CudaLib::Nvrtc, &search_dirs_from(&env_at(r))).is_ok());
    }

    #[test]
    fn a_missing_library_names_every_folder_searched() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        touch(r, "a/libcublasLt.so.13");
        let env = Env {
            cuda_home: Some(r.join("a")),
            ld_library_path: Some(r.join("b").into_os_string()),
            ..env_at(r)
        };
        mkdir(r, "a/lib64");
        mkdir(r, "b");
        let dirs = search_dirs_from(&env);
        let err = locate(CudaLib::Cublas, &dirs).unwrap_err();
        assert_eq!(err.lib, "libcublasLt.so.13 or libcublasLt.so.12");
        let msg = err.to_string();
        for d in &dirs {
            assert!(msg.contains(&d.display().to_string()), "{msg}");
        }
        assert!(!msg.contains('\n'), "{msg}");
        let err = locate(CudaLib::Driver, &[]).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("libcuda.so.1 or libcuda.so not found"));
    }

    #[test]
    fn cudnn_is_found_in_site_packages_with_its_sub_libraries_first() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        let site = r.join("site");
        let lib = "nvidia/cudnn/lib";
        let front = touch(&site, &format!("{lib}/libcudnn.so.9"));
        let graph = touch(&site, &format!("{lib}/libcudnn_graph.so.9"));
        let cnn = touch(&site, &format!("{lib}/libcudnn_cnn.so.9"));
        let ops = touch(&site, &format!("{lib}/libcudnn_ops.so.9"));
        touch(&site, &format!("{lib}/libcudnn.so.9.10.2"));
        let env = Env {
            python_sys_path: vec![site.clone()],
            ..env_at(r)
        };
        let dirs = search_dirs_from(&env);
        assert_eq!(
            locate(CudaLib::Cudnn, &dirs).unwrap(),
            vec![graph, ops, cnn, front],
            "sub-libraries present, in dependency order, then the front library"
        );
        // Missing: the error names the library and every folder searched.
        let err = locate(CudaLib::Cudnn, &search_dirs_from(&env_at(r))).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("libcudnn.so.9 not found; searched"),
            "{err}"
        );
        let err = locate(CudaLib::Cudnn, &dirs[..0]).unwrap_err();
        assert!(err.to_string().contains("the system loader"), "{err}");
    }

    #[test]
    fn the_loader_names_the_file_a_function_comes_from() {
        // A C library function lives in the C library, by absolute path.
        let libc_file =
            file_at(libc::strlen as *const () as usize).expect("strlen is in a loaded file");
        assert!(libc_file.is_absolute(), "{}", libc_file.display());
        let name = libc_file
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(name.starts_with("libc"), "{name}");
        // A function of this test binary lives in the binary itself.
        let own = file_at(file_at as *const () as usize).expect("in the test binary");
        let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(own, exe);
        assert_eq!(file_at(0), None);
    }

    #[test]
    fn stubs_are_told_by_their_folder() {
        assert!(is_stub(Path::new("/usr/local/cuda/lib64/stubs/libcuda.so")));
        assert!(is_stub(Path::new(
            "/opt/cuda/targets/x86_64-linux/lib/stubs/libcuda.so.1"
        )));
        assert!(!is_stub(Path::new(
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
        )));
        assert!(!is_stub(Path::new("/srv/stubsfolder/libcuda.so.1")));
    }

    #[test]
    fn a_bound_library_says_when_it_is_not_the_file_found() {
        let t = tempfile::tempdir().unwrap();
        let real = touch(t.path(), "lib/libcublas.so.13.0.1");
        let link = t.path().join("lib/libcublas.so.13");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let other = touch(t.path(), "cuda12/libcublas.so.12");
        let same = Bound {
            lib: CudaLib::Cublas,
            file: real.clone(),
            preloaded: link,
        };
        assert!(!same.differs(), "a link to the same file is the same file");
        assert_eq!(same.line(), format!("library cublas: {}", real.display()));
        let moved = Bound {
            file: other.clone(),
            ..same
        };
        assert!(moved.differs());
        assert!(
            moved.line().contains("gpumux had found"),
            "{}",
            moved.line()
        );
        record_bound(moved.clone());
        record_bound(Bound {
            file: real.clone(),
            ..moved
        });
        let all = bound();
        let cublas: Vec<_> = all.iter().filter(|b| b.lib == CudaLib::Cublas).collect();
        assert_eq!(cublas.len(), 1, "one record per library, the latest");
        assert_eq!(cublas[0].file, real);
    }

    #[test]
    fn newest_cuda_install_first() {
        let t = tempfile::tempdir().unwrap();
        let local = t.path();
        for v in ["cuda-11.8", "cuda-13.0", "cuda", "cuda-12.9", "other"] {
            mkdir(local, v);
        }
        let names: Vec<_> = cuda_installs(local)
            .iter()
            .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["cuda", "cuda-13.0", "cuda-12.9", "cuda-11.8"]);
    }

    #[test]
    fn preload_reports_instead_of_panicking() {
        // Whether or not this machine has the library, the answer is a value, and asking twice
        // gives the same one.
        let first = preload(CudaLib::Cublas).map_err(|e| e.to_string());
        let second = preload(CudaLib::Cublas).map_err(|e| e.to_string());
        assert_eq!(first.is_ok(), second.is_ok());
        if let (Ok(a), Ok(b)) = (first, second) {
            assert_eq!(a, b);
        }
    }

    #[test]
    fn cuda_12_libraries_are_a_fallback_with_their_own_builtins() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        touch(r, "site/nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.8");
        let nvrtc = touch(r, "site/nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
        let dirs = vec![r.join("site/nvidia/cuda_nvrtc/lib")];
        let files = locate(CudaLib::Nvrtc, &dirs).unwrap();
        assert_eq!(
            files,
            vec![
                r.join("site/nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.8"),
                nvrtc
            ]
        );
        let thirteen = touch(r, "site/nvidia/cuda_nvrtc/lib/libnvrtc.so.13");
        assert_eq!(
            locate(CudaLib::Nvrtc, &dirs).unwrap().last(),
            Some(&thirteen),
            "13 is preferred"
        );
    }

    #[test]
    fn a_driver_in_a_later_folder_beats_a_bare_name_and_stubs_are_never_used() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        touch(r, "cuda/lib64/stubs/libcuda.so");
        touch(r, "cuda/lib64/stubs/libcuda.so.1");
        let bare = touch(r, "dev/libcuda.so");
        let real = touch(r, "driver/libcuda.so.1");
        let dirs = vec![r.join("cuda/lib64/stubs"), r.join("dev"), r.join("driver")];
        assert_eq!(locate(CudaLib::Driver, &dirs).unwrap(), vec![real]);
        assert_eq!(
            locate(CudaLib::Driver, &dirs[..2]).unwrap(),
            vec![bare],
            "a bare libcuda.so when no libcuda.so.1 is found"
        );
        assert!(locate(CudaLib::Driver, &dirs[..1]).is_err());
    }
}
