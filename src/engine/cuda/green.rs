//! Green contexts: the device's SMs split into disjoint partitions, one context each.

use std::sync::Arc;

use cudarc::driver::sys;

use super::context::Ctx;
use super::device::{empty_resource, sm_resource, Device, GreenCaps};
use super::kernels::CompiledModule;
use super::status::check;
use crate::error::EngineError;

/// One SM partition and the green context that runs on it (destroyed with its last user).
pub struct GreenPartition {
    pub index: u32,
    /// The SMs the driver gave the partition.
    pub sm_count: u32,
    pub(crate) ctx: Arc<Ctx>,
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

/// Splits the device's SMs into `count` partitions of `sms_each` SMs (rounded to the device's
/// granularity) and creates a green context on each, with every kernel module loaded.
pub(crate) fn create(
    device: &Arc<Device>,
    compiled: &[CompiledModule],
    count: u32,
    sms_each: u32,
) -> Result<Vec<Arc<GreenPartition>>, EngineError> {
    let caps = green_caps(device)?;
    let size = caps.partition(sms_each);
    check_fit(count, size, device.info.sm_count)?;
    build(device, compiled, caps, &vec![size; count as usize])
}

/// Creates one green context per entry of `sizes`, on disjoint SMs of (at least) that many SMs
/// each, each rounded up to the device's granularity: partitions of unequal size.
pub(crate) fn create_sized(
    device: &Arc<Device>,
    compiled: &[CompiledModule],
    sizes: &[u32],
) -> Result<Vec<Arc<GreenPartition>>, EngineError> {
    let caps = green_caps(device)?;
    let sizes: Vec<u32> = sizes.iter().map(|&s| caps.partition(s)).collect();
    check_fit_sized(&sizes, device.info.sm_count)?;
    build(device, compiled, caps, &sizes)
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

fn green_caps(device: &Device) -> Result<GreenCaps, EngineError> {
    device.info.green.ok_or_else(|| {
        EngineError::Device("green contexts are not supported by this device or driver".into())
    })
}

/// How many groups of `unit` SMs make a partition of `size` SMs.
pub(crate) fn units_of(size: u32, unit: u32) -> u32 {
    size.div_ceil(unit.max(1)).max(1)
}

/// The partitions of `sizes` SMs (already rounded to the granularity). The device's SMs are
/// split once into groups of the smallest partition, and each partition takes as many
/// consecutive groups as it needs, in one descriptor: the driver splits only the device's own
/// SM resource (its outputs cannot be split again), and several groups of one split may make
/// one descriptor.
fn build(
    device: &Arc<Device>,
    compiled: &[CompiledModule],
    caps: GreenCaps,
    sizes: &[u32],
) -> Result<Vec<Arc<GreenPartition>>, EngineError> {
    let unit = caps.unit();
    let units: Vec<u32> = sizes.iter().map(|&s| units_of(s, unit)).collect();
    let need: u32 = units.iter().sum();
    let mut groups = split_units(device.dev, unit, need, device.info.sm_count)?;
    let mut parts = Vec::with_capacity(sizes.len());
    let mut next = 0usize;
    for (index, &k) in (0u32..).zip(&units) {
        let mine = &mut groups[next..next + k as usize];
        next += k as usize;
        // SAFETY: the split returned SM resources, so `sm` is the live union member.
        let sm_count = mine
            .iter()
            .map(|g| unsafe { g.__bindgen_anon_1.sm.smCount })
            .sum();
        let green = create_green(device.dev, mine)?;
        let ctx = Ctx::green(Arc::clone(device), green, compiled)?;
        parts.push(Arc::new(GreenPartition {
            index,
            sm_count,
            ctx,
        }));
    }
    Ok(parts)
}

/// `need` disjoint groups of `unit` SMs, from one split of the device's SM resource.
fn split_units(
    dev: sys::CUdevice,
    unit: u32,
    need: u32,
    total: u32,
) -> Result<Vec<sys::CUdevResource>, EngineError> {
    let input = sm_resource(dev)?;
    let mut groups = vec![empty_resource(); need as usize];
    let mut remaining = empty_resource();
    let mut made = need;
    // SAFETY: `groups` has room for `made` resources; `input` is the device's SM resource;
    // `remaining` receives the SMs left over.
    let r = unsafe {
        sys::cuDevSmResourceSplitByCount(
            groups.as_mut_ptr(),
            &mut made,
            &input,
            &mut remaining,
            0,
            unit,
        )
    };
    check(r, "cuDevSmResourceSplitByCount")?;
    if made < need {
        return Err(EngineError::Device(format!(
            "green contexts: the partitions need {need} groups of {unit} SMs, and the driver makes only {made} of this device's {total} SMs (groups stay within one processing cluster)"
        )));
    }
    groups.truncate(need as usize);
    Ok(groups)
}

/// A green context on one or more SM groups of one split.
fn create_green(
    dev: sys::CUdevice,
    groups: &mut [sys::CUdevResource],
) -> Result<sys::CUgreenCtx, EngineError> {
    let count = u32::try_from(groups.len())
        .map_err(|_| EngineError::Device("green contexts: too many SM groups".into()))?;
    let mut desc = std::ptr::null_mut();
    // SAFETY: `groups` holds `count` SM resources from one split of the device's SM resource
    // (same alignment); writes one descriptor handle.
    check(
        unsafe { sys::cuDevResourceGenerateDesc(&mut desc, groups.as_mut_ptr(), count) },
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
        groups: Some(16),
    };

    #[test]
    fn partitions_are_rounded_to_the_device_granularity() {
        assert_eq!(H100.partition(1), 8);
        assert_eq!(H100.partition(8), 8);
        assert_eq!(H100.partition(9), 16);
        assert_eq!(H100.partition(0), 8);
        let loose = GreenCaps {
            min_sms: 0,
            sm_alignment: 0,
            groups: None,
        };
        assert_eq!(loose.partition(3), 3);
        assert_eq!(loose.partition(0), 1);
        assert_eq!(H100.unit(), 8);
        assert_eq!(loose.unit(), 1);
        let ampere = GreenCaps {
            min_sms: 4,
            sm_alignment: 2,
            groups: None,
        };
        assert_eq!(ampere.unit(), 4);
        // A partition is whole groups of the unit: 80 + 48 SMs are 10 + 6 groups of 8.
        assert_eq!(units_of(80, H100.unit()), 10);
        assert_eq!(units_of(48, H100.unit()), 6);
        assert_eq!(units_of(ampere.partition(6), ampere.unit()), 2);
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
