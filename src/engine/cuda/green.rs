//! Green contexts: the device's SMs split into disjoint partitions, one context each.

use std::sync::Arc;

use cudarc::driver::sys;

use super::check::check;
use super::context::Ctx;
use super::device::{empty_resource, sm_resource, Device, GreenCaps};
use super::kernels::CompiledModule;
use crate::error::EngineError;

/// One SM partition and the green context that runs on it (destroyed with its last user).
pub struct GreenPartition {
    pub index: u32,
    /// The SMs the driver gave the partition.
    pub sm_count: u32,
    pub(crate) ctx: Arc<Ctx>,
}

/// SMs per partition for a request of `sms_each`: at least the device's minimum, rounded up to
/// its alignment.
pub(crate) fn partition_size(sms_each: u32, caps: GreenCaps) -> u32 {
    let align = caps.sm_alignment.max(1);
    sms_each.max(caps.min_sms).max(1).div_ceil(align) * align
}

/// Checks that `count` partitions of `size` SMs fit on `total` SMs.
pub(crate) fn check_fit(count: u32, size: u32, total: u32) -> Result<(), EngineError> {
    if count == 0 {
        return Err(EngineError::Device(
            "green contexts: at least one partition is needed".into(),
        ));
    }
    if u64::from(count) * u64::from(size) > u64::from(total) {
        return Err(EngineError::Device(format!(
            "green contexts: {count} partitions of {size} SMs do not fit on {total} SMs"
        )));
    }
    Ok(())
}

/// Splits the device's SMs into `count` groups of `sms_each` SMs (rounded to the device's
/// granularity) and creates a green context on each, with every kernel module loaded.
pub(crate) fn create(
    device: &Arc<Device>,
    compiled: &[CompiledModule],
    count: u32,
    sms_each: u32,
) -> Result<Vec<Arc<GreenPartition>>, EngineError> {
    let caps = device.info.green.ok_or_else(|| {
        EngineError::Device("green contexts are not supported by this device or driver".into())
    })?;
    let size = partition_size(sms_each, caps);
    check_fit(count, size, device.info.sm_count)?;
    let groups = split(device.dev, count, size)?;
    let mut parts = Vec::with_capacity(groups.len());
    for (index, mut group) in (0u32..).zip(groups) {
        // SAFETY: the split returned SM resources, so `sm` is the live union member.
        let sm_count = unsafe { group.__bindgen_anon_1.sm.smCount };
        let green = create_green(device.dev, &mut group)?;
        let ctx = Ctx::green(Arc::clone(device), green, compiled)?;
        parts.push(Arc::new(GreenPartition {
            index,
            sm_count,
            ctx,
        }));
    }
    Ok(parts)
}

/// `count` disjoint SM groups of at least `size` SMs each.
fn split(
    dev: sys::CUdevice,
    count: u32,
    size: u32,
) -> Result<Vec<sys::CUdevResource>, EngineError> {
    let input = sm_resource(dev)?;
    let mut groups = vec![empty_resource(); count as usize];
    let mut remaining = empty_resource();
    let mut made = count;
    // SAFETY: `groups` has room for `made` resources; `input` is the device's SM resource;
    // `remaining` receives the SMs left over.
    let r = unsafe {
        sys::cuDevSmResourceSplitByCount(
            groups.as_mut_ptr(),
            &mut made,
            &input,
            &mut remaining,
            0,
            size,
        )
    };
    check(r, "cuDevSmResourceSplitByCount")?;
    if made < count {
        return Err(EngineError::Device(format!(
            "green contexts: the driver could make only {made} of {count} partitions of {size} SMs"
        )));
    }
    groups.truncate(count as usize);
    Ok(groups)
}

/// A green context on one SM group.
fn create_green(
    dev: sys::CUdevice,
    group: &mut sys::CUdevResource,
) -> Result<sys::CUgreenCtx, EngineError> {
    let mut desc = std::ptr::null_mut();
    // SAFETY: `group` is one SM resource from the split; writes one descriptor handle.
    check(
        unsafe { sys::cuDevResourceGenerateDesc(&mut desc, group, 1) },
        "cuDevResourceGenerateDesc",
    )?;
    let mut green = std::ptr::null_mut();
    let flags = sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32;
    // SAFETY: `desc` was just generated for this device; writes one green-context handle, which
    // `Ctx::green` takes over.
    check(
        unsafe { sys::cuGreenCtxCreate(&mut green, desc, dev, flags) },
        "cuGreenCtxCreate",
    )?;
    Ok(green)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: GreenCaps = GreenCaps {
        min_sms: 8,
        sm_alignment: 8,
    };

    #[test]
    fn partitions_are_rounded_to_the_device_granularity() {
        assert_eq!(partition_size(1, H100), 8);
        assert_eq!(partition_size(8, H100), 8);
        assert_eq!(partition_size(9, H100), 16);
        assert_eq!(partition_size(0, H100), 8);
        let loose = GreenCaps {
            min_sms: 0,
            sm_alignment: 0,
        };
        assert_eq!(partition_size(3, loose), 3);
        assert_eq!(partition_size(0, loose), 1);
    }

    #[test]
    fn partitions_must_fit_on_the_device() {
        assert!(check_fit(16, 8, 132).is_ok());
        assert!(check_fit(17, 8, 132).is_err());
        assert!(check_fit(0, 8, 132).is_err());
    }
}
