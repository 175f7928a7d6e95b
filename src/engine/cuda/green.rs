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

/// Creates one green context per entry of `sizes`, on disjoint SM groups of (at least) that many
/// SMs each, each rounded up to the device's granularity: partitions of unequal size, made by
/// splitting one group off the SMs left over at a time.
pub(crate) fn create_sized(
    device: &Arc<Device>,
    compiled: &[CompiledModule],
    sizes: &[u32],
) -> Result<Vec<Arc<GreenPartition>>, EngineError> {
    let caps = device.info.green.ok_or_else(|| {
        EngineError::Device("green contexts are not supported by this device or driver".into())
    })?;
    let sizes: Vec<u32> = sizes.iter().map(|&s| partition_size(s, caps)).collect();
    check_fit_sized(&sizes, device.info.sm_count)?;
    let groups = split_sized(device.dev, &sizes)?;
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

/// Checks that partitions of `sizes` SMs fit together on `total` SMs.
pub(crate) fn check_fit_sized(sizes: &[u32], total: u32) -> Result<(), EngineError> {
    if sizes.is_empty() {
        return Err(EngineError::Device(
            "green contexts: at least one partition is needed".into(),
        ));
    }
    let need: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    if need > u64::from(total) {
        let list: Vec<String> = sizes.iter().map(u32::to_string).collect();
        return Err(EngineError::Device(format!(
            "green contexts: partitions of {} SMs need {need}, the device has {total}",
            list.join(" + ")
        )));
    }
    Ok(())
}

/// One SM group per entry of `sizes`: each split off what the previous splits left over.
fn split_sized(dev: sys::CUdevice, sizes: &[u32]) -> Result<Vec<sys::CUdevResource>, EngineError> {
    let mut rest = sm_resource(dev)?;
    let mut groups = Vec::with_capacity(sizes.len());
    for (i, &size) in sizes.iter().enumerate() {
        let mut group = [empty_resource()];
        let mut remaining = empty_resource();
        let mut made = 1u32;
        // SAFETY: `group` has room for one resource; `rest` is an SM resource (the device's, or
        // what the previous split left over); `remaining` receives the SMs left over now.
        let r = unsafe {
            sys::cuDevSmResourceSplitByCount(
                group.as_mut_ptr(),
                &mut made,
                &rest,
                &mut remaining,
                0,
                size,
            )
        };
        check(r, "cuDevSmResourceSplitByCount")?;
        if made < 1 {
            return Err(EngineError::Device(format!(
                "green contexts: the driver could not split partition {i} of {size} SMs off the SMs left over"
            )));
        }
        groups.push(group[0]);
        rest = remaining;
    }
    Ok(groups)
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
    fn unequal_partitions_must_fit_together() {
        assert!(check_fit_sized(&[80, 48], 132).is_ok());
        let e = check_fit_sized(&[80, 56], 132).unwrap_err().to_string();
        assert!(e.contains("80 + 56") && e.contains("136"), "{e}");
        assert!(check_fit_sized(&[], 132).is_err());
    }

    #[test]
    fn partitions_must_fit_on_the_device() {
        assert!(check_fit(16, 8, 132).is_ok());
        assert!(check_fit(17, 8, 132).is_err());
        assert!(check_fit(0, 8, 132).is_err());
    }
}
