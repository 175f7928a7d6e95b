//! `gpumux devices` where no GPU can be used: the quick exit 4 of `--backend cuda`, and a toolkit's stub libcuda refused by name.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{gpu_usable, gpumux, root, run, sandbox, stderr, stdout};

#[test]
fn backend_cuda_without_a_gpu_exits_4_at_once() {
    if gpu_usable() {
        println!("skipped: a GPU is usable here");
        return;
    }
    let t = Instant::now();
    let o = gpumux(&root(), &["devices", "--backend", "cuda"]);
    let took = t.elapsed();
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("backend cuda is not usable here"),
        "{}",
        stderr(&o)
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
    // auto says why it runs on the CPU, and exits 0.
    let o = gpumux(&root(), &["devices"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("running on the CPU backend"));
}

/// Builds a shared library `name` in `dir` from C `source` with the system's C compiler;
/// `None` (the test is skipped) where there is none.
fn shared_library(dir: &Path, name: &str, source: &str) -> Option<()> {
    std::fs::create_dir_all(dir).ok()?;
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).ok()?;
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join(name))
        .arg(&c)
        .output()
        .ok()?;
    out.status.success().then_some(())
}

/// A toolkit's `stubs/libcuda.so` found first on `LD_LIBRARY_PATH` is what the CUDA bindings
/// would bind (they open `libcuda.so` by bare name), whatever driver gpumux found: it is refused
/// with its path and the folder to remove, never run on the CPU as if there were no GPU.
#[test]
fn a_stub_libcuda_is_refused_by_name() {
    if gpu_usable() {
        println!("skipped: a GPU is usable here; the stub would not be reached the same way");
        return;
    }
    let t = sandbox();
    // CUDA_ERROR_STUB_LIBRARY is 34, CUDA_ERROR_NO_DEVICE 100.
    let stub = "int cuInit(unsigned f) { (void)f; return 34; }\n\
                int cuGetErrorName(int e, const char **s) { (void)e; *s = \"STUB\"; return 0; }\n";
    let driver = "int cuInit(unsigned f) { (void)f; return 100; }\n";
    let stubs = t.path().join("cuda/lib64/stubs");
    let drv = t.path().join("driver");
    if shared_library(&stubs, "libcuda.so", stub).is_none()
        || shared_library(&drv, "libcuda.so.1", driver).is_none()
    {
        println!("skipped: no C compiler to build the stand-in libraries");
        return;
    }
    let ld = format!("{}:{}", stubs.display(), drv.display());
    let o = run(&root(), &["devices", "--backend", "cuda"])
        .env("LD_LIBRARY_PATH", &ld)
        .env_remove("CUDA_HOME")
        .env_remove("CUDA_PATH")
        .output();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(4), "{err}");
    let stub_file = std::fs::canonicalize(stubs.join("libcuda.so")).expect("stub");
    assert!(err.contains("stub"), "{err}");
    assert!(err.contains(&stub_file.display().to_string()), "{err}");
    assert!(
        err.contains(&format!(
            "remove {} from LD_LIBRARY_PATH",
            stub_file.parent().expect("folder").display()
        )),
        "{err}"
    );
    // With the stub's folder gone, the stand-in driver is bound and its own answer is given.
    let o = run(&root(), &["devices", "--backend", "cuda"])
        .env("LD_LIBRARY_PATH", &drv)
        .output();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(!err.contains("stub"), "{err}");
}
