//! Kernel launches: the compiled modules loaded into one context, kernel arguments, and grid sizes.

use std::collections::HashMap;
use std::ffi::{c_void, CString};

use cudarc::driver::sys;

use super::entered::Entered;
use super::kernels::{CompiledModule, Image};
use super::signature::{self, ParamKind};
use super::status::check;
use crate::error::EngineError;

/// Threads per block of the element-wise kernels (and of the one-block reductions).
pub(crate) const BLOCK: u32 = 256;
/// Most blocks in a grid; the kernels are grid-stride loops, so fewer blocks stay correct.
pub(crate) const MAX_BLOCKS: u32 = 65_535;

/// Blocks of [`BLOCK`] threads for `n` elements: `ceil(n/BLOCK)`, at least 1, at most [`MAX_BLOCKS`].
pub(crate) fn grid_for(n: usize) -> u32 {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS as usize);
    blocks as u32
}

/// The functions of every compiled module, loaded into one context.
pub(crate) struct Kernels {
    modules: Vec<sys::CUmodule>,
    functions: HashMap<&'static str, sys::CUfunction>,
}

impl Kernels {
    /// No modules.
    pub(crate) fn empty() -> Kernels {
        Kernels {
            modules: Vec::new(),
            functions: HashMap::new(),
        }
    }

    /// Loads every module into the context current on this thread (`entered` proves one is).
    pub(crate) fn load(
        entered: &Entered,
        compiled: &[CompiledModule],
    ) -> Result<Kernels, EngineError> {
        let mut k = Kernels::empty();
        for m in compiled {
            if let Err(e) = k.load_one(m) {
                k.unload(entered);
                return Err(e);
            }
        }
        Ok(k)
    }

    fn load_one(&mut self, m: &CompiledModule) -> Result<(), EngineError> {
        let module = match &m.image {
            Image::Ptx(ptx) => load_ptx(m.name, ptx)?,
            // SAFETY: the image is a CUBIN from NVRTC (or the cache, checked to be an ELF image).
            Image::Cubin(elf) => match unsafe { load_image(elf.as_ptr(), m.name, "CUBIN") } {
                Ok(module) => module,
                Err(refused) => {
                    // A driver that does not take the machine code may still JIT the PTX.
                    let ptx = m.ptx_fallback().map_err(|e| {
                        EngineError::Device(format!("{refused}; no PTX to fall back to: {e}"))
                    })?;
                    load_ptx(m.name, ptx).map_err(|e| {
                        EngineError::Device(format!("{refused}; its PTX fallback: {e}"))
                    })?
                }
            },
        };
        self.modules.push(module);
        for &f in &m.functions {
            let name = CString::new(f)
                .map_err(|_| EngineError::Device(format!("kernel name {f:?} holds a NUL byte")))?;
            let mut func = std::ptr::null_mut();
            // SAFETY: `module` was just loaded; `name` is NUL-terminated.
            let r = unsafe { sys::cuModuleGetFunction(&mut func, module, name.as_ptr()) };
            check(r, &format!("cuModuleGetFunction({}.{f})", m.name))?;
            if self.functions.insert(f, func).is_some() {
                return Err(EngineError::Device(format!(
                    "kernel {f} is defined by two modules"
                )));
            }
        }
        Ok(())
    }

    /// The function named `name`.
    pub(crate) fn get(&self, name: &str) -> Result<sys::CUfunction, EngineError> {
        self.functions
            .get(name)
            .copied()
            .ok_or_else(|| EngineError::Device(format!("kernel {name} is not loaded")))
    }

    /// Unloads every module from the context current on this thread (the one they were loaded
    /// into); errors are ignored, as this runs on teardown paths.
    pub(crate) fn unload(&mut self, _in: &Entered) {
        self.functions.clear();
        for m in self.modules.drain(..) {
            // SAFETY: each module was loaded into the current context and is unloaded once.
            let _ = unsafe { sys::cuModuleUnload(m) };
        }
    }
}

/// Loads a PTX module into the current context.
fn load_ptx(name: &str, ptx: &str) -> Result<sys::CUmodule, EngineError> {
    let text = CString::new(ptx)
        .map_err(|_| EngineError::Device(format!("the PTX of module {name} holds a NUL byte")))?;
    // SAFETY: `text` is a NUL-terminated PTX image that outlives the call.
    unsafe { load_image(text.as_ptr().cast(), name, "PTX") }
}

/// `cuModuleLoadData` of the image at `image`, in the current context.
///
/// # Safety
/// `image` must point to a complete CUBIN, or to NUL-terminated PTX, that outlives the call (the
/// driver copies it).
unsafe fn load_image(
    image: *const u8,
    name: &str,
    kind: &str,
) -> Result<sys::CUmodule, EngineError> {
    let mut module = std::ptr::null_mut();
    let r = sys::cuModuleLoadData(&mut module, image.cast());
    check(r, &format!("cuModuleLoadData({name}, {kind})"))?;
    Ok(module)
}

/// One kernel argument, passed by value.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    Ptr(sys::CUdeviceptr),
    U32(u32),
    F32(f32),
    U64(u64),
}

impl Arg {
    /// The parameter type the argument fills.
    pub(crate) fn kind(&self) -> ParamKind {
        match self {
            Arg::Ptr(_) => ParamKind::Ptr,
            Arg::U32(_) => ParamKind::U32,
            Arg::F32(_) => ParamKind::F32,
            Arg::U64(_) => ParamKind::U64,
        }
    }

    /// Where the argument's value lives, as `cuLaunchKernel` wants it.
    fn as_param(&mut self) -> *mut c_void {
        match self {
            Arg::Ptr(p) => (p as *mut sys::CUdeviceptr).cast(),
            Arg::U32(v) => (v as *mut u32).cast(),
            Arg::F32(v) => (v as *mut f32).cast(),
            Arg::U64(v) => (v as *mut u64).cast(),
        }
    }
}

/// Launches `func` (named `name` in errors) as `grid` blocks of `block` threads on `stream`,
/// after checking the arguments against the kernel's declared parameters.
pub(crate) fn launch(
    entered: &Entered,
    name: &str,
    func: sys::CUfunction,
    (grid, block): (u32, u32),
    stream: sys::CUstream,
    args: &[Arg],
) -> Result<(), EngineError> {
    launch_2d(entered, name, func, (grid, 1), block, stream, args)
}

/// [`launch`] on a grid of `grid.0 × grid.1` blocks.
pub(crate) fn launch_2d(
    _in: &Entered,
    name: &str,
    func: sys::CUfunction,
    (grid_x, grid_y): (u32, u32),
    block: u32,
    stream: sys::CUstream,
    args: &[Arg],
) -> Result<(), EngineError> {
    let kinds: Vec<ParamKind> = args.iter().map(Arg::kind).collect();
    signature::check(name, &kinds).map_err(EngineError::Device)?;
    let mut values = args.to_vec();
    let mut params: Vec<*mut c_void> = values.iter_mut().map(Arg::as_param).collect();
    // SAFETY: `func` was loaded into the context current on this thread (`_in`), `stream`
    // belongs to it, and `params` holds one pointer per kernel parameter (checked above against
    // the kernel's source), each to a value of the parameter's type; the driver copies the
    // values before returning, so `values` may then go.
    let r = unsafe {
        sys::cuLaunchKernel(
            func,
            grid_x,
            grid_y,
            1,
            block,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    check(r, &format!("cuLaunchKernel({name})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_cover_the_elements_within_limits() {
        assert_eq!(grid_for(0), 1);
        assert_eq!(grid_for(1), 1);
        assert_eq!(grid_for(256), 1);
        assert_eq!(grid_for(257), 2);
        assert_eq!(grid_for(1 << 40), MAX_BLOCKS);
    }

    #[test]
    fn arguments_point_at_their_values() {
        let mut a = [
            Arg::U32(7),
            Arg::F32(0.5),
            Arg::U64(1 << 40),
            Arg::Ptr(0xdead_beef),
        ];
        // SAFETY (test): each pointer is read as the type it was built from.
        unsafe {
            assert_eq!(*(a[0].as_param() as *const u32), 7);
            assert_eq!(*(a[1].as_param() as *const f32), 0.5);
            assert_eq!(*(a[2].as_param() as *const u64), 1 << 40);
            assert_eq!(*(a[3].as_param() as *const u64), 0xdead_beef);
        }
    }
}
