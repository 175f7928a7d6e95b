//! Which file each CUDA library's functions really come from, asked of the loader through one of them.
//!
//! gpumux preloads each library by absolute path ([`libs::preload`]), but the CUDA bindings open
//! their own by bare name (`libcuda.so` first), and the loader may answer that with another file:
//! a toolkit's stub `libcuda.so` on `LD_LIBRARY_PATH`, or another CUDA's NVRTC. So once a
//! library is in use, the file of one of its functions is looked up (`dladdr`), recorded
//! ([`libs::record_bound`], listed by `gpumux devices`), and a stub driver is refused by name.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::gpu::libs::{self, CudaLib};

/// The address of `symbol` in the library the bindings opened for `lib` (opening it if they had
/// not yet), or why it cannot be had.
fn symbol_address(lib: CudaLib) -> Result<*const c_void, String> {
    let (name, symbol): (&str, &[u8]) = match lib {
        CudaLib::Driver => ("libcuda", b"cuInit\0"),
        CudaLib::Nvrtc => ("libnvrtc", b"nvrtcVersion\0"),
        CudaLib::Cublas => ("libcublas", b"cublasCreate_v2\0"),
        CudaLib::Cudnn => ("libcudnn", b"cudnnGetVersion\0"),
    };
    // The bindings panic when they find no library at all; catch_unwind makes that an error.
    let found = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: each `culib` opens its library once (running its initialisers, which have no
        // preconditions) and keeps it for the process's life; `get` only looks a name up, and
        // the address is used as a number, never called or read through.
        unsafe {
            let got = match lib {
                CudaLib::Driver => cudarc::driver::sys::culib().get::<*const c_void>(symbol),
                CudaLib::Nvrtc => cudarc::nvrtc::sys::culib().get::<*const c_void>(symbol),
                CudaLib::Cublas => cudarc::cublas::sys::culib().get::<*const c_void>(symbol),
                CudaLib::Cudnn => cudarc::cudnn::sys::culib().get::<*const c_void>(symbol),
            };
            got.map(|s| *s).map_err(|e| e.to_string())
        }
    }))
    .map_err(|_| format!("the CUDA bindings could not open any {name}"))?;
    found.map_err(|e| format!("{name} has no {}: {e}", symbol_text(symbol)))
}

fn symbol_text(symbol: &[u8]) -> String {
    String::from_utf8_lossy(symbol.strip_suffix(b"\0").unwrap_or(symbol)).into_owned()
}

/// The file `lib`'s functions are called from. A stub driver is an error that names the file
/// and the one that was meant. Callers record the library ([`libs::record_bound`]) once it
/// proved usable, so that `gpumux devices` lists only libraries in use.
pub(crate) fn check(lib: CudaLib, preloaded: &std::path::Path) -> Result<libs::Bound, String> {
    let addr = symbol_address(lib)?;
    let file = libs::file_at(addr as usize).ok_or_else(|| {
        format!(
            "the loader cannot say which file the {} library was bound from",
            lib.name()
        )
    })?;
    if lib == CudaLib::Driver && libs::is_stub(&file) {
        return Err(stub_message(&file, preloaded));
    }
    Ok(libs::Bound {
        lib,
        file,
        preloaded: preloaded.to_path_buf(),
    })
}

/// Why a stub driver library cannot be used, and what to change.
pub(crate) fn stub_message(file: &std::path::Path, preloaded: &std::path::Path) -> String {
    let folder = file
        .parent()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    format!(
        "the CUDA driver library bound is a toolkit's link-time stub, {} (not the driver's {}); \
         remove {folder} from LD_LIBRARY_PATH",
        file.display(),
        preloaded.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_stub_driver_is_named_with_its_folder() {
        let m = stub_message(
            Path::new("/usr/local/cuda/lib64/stubs/libcuda.so"),
            Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        );
        assert!(
            m.contains("/usr/local/cuda/lib64/stubs/libcuda.so")
                && m.contains("remove /usr/local/cuda/lib64/stubs from LD_LIBRARY_PATH")
                && m.contains("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            "{m}"
        );
    }

    #[test]
    fn a_missing_library_is_an_error_not_a_panic() {
        // Whether or not this machine has the driver, asking twice gives one kind of answer.
        let first = symbol_address(CudaLib::Driver).map(|_| ());
        let second = symbol_address(CudaLib::Driver).map(|_| ());
        assert_eq!(first.is_ok(), second.is_ok(), "{first:?} {second:?}");
    }
}
