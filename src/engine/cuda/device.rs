//! Opening a CUDA device: loading the driver, retaining the primary context, and describing the device.

use std::ffi::CStr;

use cudarc::driver::sys;

use super::status::check;
use crate::error::EngineError;
use crate::gpu::libs::{self, CudaLib};

/// Oldest driver accepted: memory pools with a `maxSize` cap appeared in CUDA 12.2.
pub(crate) const MIN_DRIVER: i32 = 12020;
/// Oldest driver with everything the green partitions use: green contexts came with CUDA 12.4,
/// but `cuGreenCtxStreamCreate` (a trial's stream on a partition) only with 12.5, and cudarc
/// panics on a missing symbol.
pub(crate) const GREEN_DRIVER: i32 = 12050;

/// Checks, without panicking, that a CUDA GPU is usable: preloads the driver library, runs
/// `cuInit`, and counts at least one device. `Err` says why not.
pub fn available() -> Result<(), String> {
    init_driver()?;
    let count = device_count().map_err(|e| e.to_string())?;
    if count == 0 {
        return Err("the CUDA driver reports no device".into());
    }
    Ok(())
}

/// What a CUDA device is.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaDeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML prints it.
    pub uuid: String,
    pub total_mem_bytes: u64,
    pub sm_count: u32,
    pub compute_capability: (u32, u32),
    /// How SMs can be split into green contexts; `None` when they are unsupported.
    pub green: Option<GreenCaps>,
    /// The granularity of device memory from a pool, in bytes, as the driver reports it
    /// (2 MiB on the GPUs known so far): a pool's `maxSize` is a multiple of it.
    pub mem_granularity: u64,
}

/// The granularity of green-context SM partitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GreenCaps {
    /// The fewest SMs a partition may have.
    pub min_sms: u32,
    /// Partition sizes are multiples of this.
    pub sm_alignment: u32,
    /// How many groups of the smallest partition ([`GreenCaps::unit`]) the driver makes of the
    /// device's SMs, asked of it once: groups do not cross GPU processing clusters, so there can
    /// be fewer than `sm_count / unit`. `None` when the driver was not asked.
    pub groups: Option<u32>,
}

impl GreenCaps {
    /// The smallest partition: at least the minimum, a multiple of the alignment. Partitions are
    /// made of whole groups of this many SMs.
    pub fn unit(&self) -> u32 {
        self.partition(1)
    }

    /// SMs per partition for a request of `sms_each`: at least the device's minimum, rounded up
    /// to its alignment.
    pub fn partition(&self, sms_each: u32) -> u32 {
        let align = self.sm_alignment.max(1);
        sms_each.max(self.min_sms).max(1).div_ceil(align) * align
    }
}

/// The module-loading mode gpumux asks the driver for: kernels are loaded into a context when
/// first used, so that each context (every green partition, every `process`-mode worker) holds
/// only the cuBLAS and cuDNN kernels its trials run. Every trial runs its first step and first
/// evaluation with the process's graph captures held off, so no kernel loads during a capture.
pub const MODULE_LOADING: &str = "LAZY";

/// Sets `CUDA_MODULE_LOADING` to [`MODULE_LOADING`] unless the environment already chooses.
/// The driver reads it once, in `cuInit`; call this at the start of `main`, before any thread
/// is started (changing the environment is not safe while other threads may read it).
pub fn choose_module_loading() {
    if std::env::var_os("CUDA_MODULE_LOADING").is_none_or(|v| v.is_empty()) {
        std::env::set_var("CUDA_MODULE_LOADING", MODULE_LOADING);
    }
}

/// The module-loading mode the driver runs with, once it is initialised: `lazy` or `eager`.
pub fn module_loading() -> Option<&'static str> {
    let mut mode = sys::CUmoduleLoadingMode::CU_MODULE_LAZY_LOADING;
    // SAFETY: writes one enum; the driver is initialised by `init_driver` first.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
        sys::cuModuleGetLoadingMode(&mut mode)
    }));
    match r {
        Ok(sys::CUresult::CUDA_SUCCESS) => Some(match mode {
            sys::CUmoduleLoadingMode::CU_MODULE_EAGER_LOADING => "eager",
            sys::CUmoduleLoadingMode::CU_MODULE_LAZY_LOADING => "lazy",
        }),
        _ => None,
    }
}

/// Loads the driver library and initialises it; returns the driver's CUDA version (e.g. 13000).
/// The file the bindings really bound is checked first: a toolkit's stub is refused by name.
pub(crate) fn init_driver() -> Result<i32, String> {
    let path = libs::preload(CudaLib::Driver).map_err(|e| e.to_string())?;
    // The bindings open libcuda by bare name on their first call, which the loader may answer
    // with another file than the one preloaded above.
    let driver = super::bound::check(CudaLib::Driver, &path)?;
    let bound = driver.file.clone();
    // SAFETY: cuInit has no preconditions; flags must be 0. The library is open (just above).
    let init = std::panic::catch_unwind(|| unsafe { sys::cuInit(0) }).map_err(|_| {
        format!(
            "the CUDA driver library {} could not be loaded through cudarc",
            bound.display()
        )
    })?;
    if init == sys::CUresult::CUDA_ERROR_STUB_LIBRARY {
        return Err(super::bound::stub_message(&bound, &path));
    }
    if init == sys::CUresult::CUDA_SUCCESS {
        libs::record_bound(driver);
    }
    check(init, "cuInit").map_err(|e| e.to_string())?;
    let mut version = 0;
    // SAFETY: writes one int; the driver is initialised.
    check(
        unsafe { sys::cuDriverGetVersion(&mut version) },
        "cuDriverGetVersion",
    )
    .map_err(|e| e.to_string())?;
    if version < MIN_DRIVER {
        return Err(format!(
            "the CUDA driver supports CUDA {}; gpumux needs {} or newer",
            version_string(version),
            version_string(MIN_DRIVER)
        ));
    }
    Ok(version)
}

/// `12040` → `12.4`.
pub(crate) fn version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn device_count() -> Result<usize, EngineError> {
    let mut n = 0;
    // SAFETY: writes one int; only called after cuInit succeeded.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n.max(0) as usize)
}

/// The device's 16 UUID bytes as NVML prints them: `GPU-` and 8-4-4-4-12 lowercase hex digits.
pub(crate) fn uuid_string(bytes: &[u8; 16]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let group = |r: std::ops::Range<usize>| hex[r].concat();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        group(0..4),
        group(4..6),
        group(6..8),
        group(8..10),
        group(10..16)
    )
}

/// Granularity by compute capability, from the driver documentation of
/// `cuDevSmResourceSplitByCount`; used when the driver does not report it (before CUDA 13.0).
pub(crate) fn default_green_caps(cc: (u32, u32)) -> GreenCaps {
    match cc.0 {
        0..=7 => GreenCaps {
            min_sms: 2,
            sm_alignment: 2,
            groups: None,
        },
        8 => GreenCaps {
            min_sms: 4,
            sm_alignment: 2,
            groups: None,
        },
        _ => GreenCaps {
            min_sms: 8,
            sm_alignment: 8,
            groups: None,
        },
    }
}

/// An opened device: its handle, its retained primary context, and its description.
pub(crate) struct Device {
    pub(crate) dev: sys::CUdevice,
    pub(crate) primary: sys::CUcontext,
    pub(crate) info: CudaDeviceInfo,
    pub(crate) driver_version: i32,
}

// SAFETY: a CUdevice is an ordinal and the primary context handle is valid on every thread of the
// process; the driver serialises its own use of the primary context.
unsafe impl Send for Device {}
// SAFETY: as above; `Device` has no interior mutability.
unsafe impl Sync for Device {}

/// Describes every visible CUDA device, numbered as a job's `slices[i].device` numbers them,
/// without creating a context on any.
pub fn describe_all() -> Result<Vec<CudaDeviceInfo>, EngineError> {
    let driver_version = init_driver().map_err(|reason| EngineError::Unavailable {
        backend: "cuda".into(),
        reason,
    })?;
    (0..device_count()?)
        .map(|ordinal| {
            let ord = i32::try_from(ordinal)
                .map_err(|_| EngineError::Device(format!("device number {ordinal}")))?;
            let mut dev = 0;
            // SAFETY: writes one device handle; the ordinal is below the device count.
            check(unsafe { sys::cuDeviceGet(&mut dev, ord) }, "cuDeviceGet")?;
            describe(ordinal, dev, driver_version)
        })
        .collect()
}

impl Device {
    /// Initialises the driver, describes device `ordinal` and retains its primary context.
    pub(crate) fn open(ordinal: usize) -> Result<Device, EngineError> {
        let unavailable = |reason: String| EngineError::Unavailable {
            backend: "cuda".into(),
            reason,
        };
        let driver_version = init_driver().map_err(unavailable)?;
        let count = device_count()?;
        if ordinal >= count {
            return Err(unavailable(format!(
                "no CUDA device {ordinal}: the driver reports {count}"
            )));
        }
        let ord = i32::try_from(ordinal).map_err(|_| unavailable("bad ordinal".into()))?;
        let mut dev = 0;
        // SAFETY: writes one device handle; the ordinal is below the device count.
        check(unsafe { sys::cuDeviceGet(&mut dev, ord) }, "cuDeviceGet")?;
        let info = describe(ordinal, dev, driver_version)?;
        let mut primary = std::ptr::null_mut();
        // SAFETY: writes one context handle; released in Drop.
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut primary, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        Ok(Device {
            dev,
            primary,
            info,
            driver_version,
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `open`; every context user holds an Arc<Device>, so none
        // is left. Errors cannot be reported from Drop.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<u32, EngineError> {
    let mut v = 0;
    // SAFETY: writes one int for a valid device.
    check(
        unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) },
        "cuDeviceGetAttribute",
    )?;
    Ok(v.max(0) as u32)
}

fn describe(
    ordinal: usize,
    dev: sys::CUdevice,
    driver: i32,
) -> Result<CudaDeviceInfo, EngineError> {
    use sys::CUdevice_attribute::*;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into the buffer.
    check(
        unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev) },
        "cuDeviceGetName",
    )?;
    // SAFETY: the buffer is NUL-terminated (zeroed, and the driver terminates what it writes).
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let mut uuid = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: writes 16 bytes into `uuid`.
    check(
        unsafe { sys::cuDeviceGetUuid_v2(&mut uuid, dev) },
        "cuDeviceGetUuid_v2",
    )?;
    let mut total = 0usize;
    // SAFETY: writes one size.
    check(
        unsafe { sys::cuDeviceTotalMem_v2(&mut total, dev) },
        "cuDeviceTotalMem_v2",
    )?;
    let cc = (
        attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    Ok(CudaDeviceInfo {
        ordinal,
        name,
        uuid: uuid_string(&uuid.bytes.map(|b| b as u8)),
        total_mem_bytes: total as u64,
        sm_count: attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        compute_capability: cc,
        green: green_caps(dev, driver, cc),
        mem_granularity: mem_granularity(dev),
    })
}

/// The granularity the driver maps pinned device memory in on `dev` (its minimum), or 2 MiB,
/// the value on every GPU known so far, when it does not say: a device that cannot answer this
/// is still usable.
fn mem_granularity(dev: sys::CUdevice) -> u64 {
    const USUAL: u64 = 2 << 20;
    // SAFETY: every field of CUmemAllocationProp is an integer, a pointer or an enum whose zero
    // value is a variant; the ones that matter are set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev,
    };
    let mut g = 0usize;
    let option = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: `prop` is initialised; writes one size.
    let r = unsafe { sys::cuMemGetAllocationGranularity(&mut g, &prop, option) };
    if r == sys::CUresult::CUDA_SUCCESS && g > 0 {
        g as u64
    } else {
        USUAL
    }
}

/// The SM resource's partition granularity, or `None` when the driver has no green contexts or
/// cannot describe the device's SMs.
fn green_caps(dev: sys::CUdevice, driver: i32, cc: (u32, u32)) -> Option<GreenCaps> {
    if driver < GREEN_DRIVER {
        return None;
    }
    let sm = sm_resource(dev).ok()?;
    // SAFETY: `sm_resource` returned a resource of type SM, so the `sm` member is the live one.
    let s = unsafe { sm.__bindgen_anon_1.sm };
    let fallback = default_green_caps(cc);
    let mut caps = GreenCaps {
        min_sms: if s.minSmPartitionSize > 0 {
            s.minSmPartitionSize
        } else {
            fallback.min_sms
        },
        sm_alignment: if s.smCoscheduledAlignment > 0 {
            s.smCoscheduledAlignment
        } else {
            fallback.sm_alignment
        },
        groups: None,
    };
    caps.groups = unit_groups(&sm, caps.unit());
    Some(caps)
}

/// How many groups of `unit` SMs the driver would split `sm` into (a simulated split: no
/// result array); `None` if it declines.
fn unit_groups(sm: &sys::CUdevResource, unit: u32) -> Option<u32> {
    let mut groups = 0u32;
    // SAFETY: a null result asks the driver only for the number of groups, written to `groups`;
    // `sm` is the device's SM resource; a null `remaining` is allowed.
    let r = unsafe {
        sys::cuDevSmResourceSplitByCount(
            std::ptr::null_mut(),
            &mut groups,
            sm,
            std::ptr::null_mut(),
            0,
            unit,
        )
    };
    (r == sys::CUresult::CUDA_SUCCESS && groups > 0).then_some(groups)
}

/// An all-zero resource, to be filled by the driver.
pub(crate) fn empty_resource() -> sys::CUdevResource {
    // SAFETY: every field of CUdevResource (CUDA 13.0 layout) is an integer, a byte array, a
    // union of those, or an enum whose zero value (CU_DEV_RESOURCE_TYPE_INVALID) is a variant.
    unsafe { std::mem::zeroed() }
}

/// The device's whole SM resource.
pub(crate) fn sm_resource(dev: sys::CUdevice) -> Result<sys::CUdevResource, EngineError> {
    let mut res = empty_resource();
    // SAFETY: the driver fills one CUdevResource for a valid device.
    let r = unsafe {
        sys::cuDeviceGetDevResource(
            dev,
            &mut res,
            sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
        )
    };
    check(r, "cuDeviceGetDevResource")?;
    if res.type_ != sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM {
        return Err(EngineError::Device(
            "cuDeviceGetDevResource: the driver did not return an SM resource".into(),
        ));
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn available_explains_why_not_and_never_panics() {
        // On a machine without a driver this is an error with a reason; with one, Ok.
        match available() {
            Ok(()) => {}
            Err(reason) => assert!(!reason.is_empty()),
        }
    }

    #[test]
    fn uuids_print_as_nvml_does() {
        let bytes: [u8; 16] = [
            0x5c, 0x1b, 0x2a, 0x5e, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x00, 0x10,
            0xff, 0x7a,
        ];
        assert_eq!(
            uuid_string(&bytes),
            "GPU-5c1b2a5e-0123-4567-89ab-cdef0010ff7a"
        );
    }

    #[test]
    fn driver_versions_print_as_cuda_versions() {
        assert_eq!(version_string(12040), "12.4");
        assert_eq!(version_string(13000), "13.0");
        assert_eq!(version_string(MIN_DRIVER), "12.2");
    }

    #[test]
    fn green_granularity_defaults_follow_the_architecture() {
        assert_eq!(default_green_caps((9, 0)).min_sms, 8);
        assert_eq!(default_green_caps((9, 0)).sm_alignment, 8);
        assert_eq!(default_green_caps((8, 6)).min_sms, 4);
        assert_eq!(default_green_caps((7, 0)).sm_alignment, 2);
    }
}
