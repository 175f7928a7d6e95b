//! A trial's capped memory pool and its one allocation: cuBLAS workspace, arena and epoch order.

use std::sync::Arc;

use cudarc::driver::sys;

use super::status::check;
use super::stream::Stream;
use crate::error::EngineError;
use crate::units::MIB;

/// Bytes of cuBLAS workspace in a trial's allocation below Hopper (cuBLAS's own default there).
pub(crate) const BLAS_WORKSPACE_BYTES: usize = 4 << 20;
/// Bytes of cuBLAS workspace on Hopper and newer (sm_90+), where cuBLAS's default is 32 MiB and
/// some GEMM kernels need that much: with less, cuBLAS quietly picks slower ones.
pub(crate) const BLAS_WORKSPACE_BYTES_SM90: usize = 32 << 20;

/// The cuBLAS workspace for a device of compute capability `cc`.
pub(crate) fn blas_workspace_bytes(cc: (u32, u32)) -> usize {
    if cc.0 >= 9 {
        BLAS_WORKSPACE_BYTES_SM90
    } else {
        BLAS_WORKSPACE_BYTES
    }
}
/// Alignment of each part of the allocation (cuBLAS wants 256-byte workspaces; the memory plan
/// aligns regions to 256 bytes from the arena's start).
const PART_ALIGN: usize = 256;

/// Where the parts of a trial's single allocation lie, in bytes from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The cuBLAS workspace starts at 0.
    pub blas_bytes: usize,
    pub arena_offset: usize,
    pub arena_bytes: usize,
    /// The training split's order (`u32` per sample).
    pub order_offset: usize,
    pub order_bytes: usize,
    /// The reductions' scratch ([`REDUCE_SCRATCH_BYTES`]: batch norm's partial sums over many
    /// blocks a channel, its means, and the tickets the last block of a channel takes).
    pub scratch_offset: usize,
    pub total: usize,
}

/// Pairs of `double`s the reduction scratch holds for partial sums (the forward pass of batch
/// norm takes one `double` a partial, the backward pass a pair).
pub(crate) const REDUCE_PARTIALS: usize = 4096;
/// Channels the reduction scratch holds a mean (`double`) and a ticket (`u32`) for.
pub(crate) const REDUCE_CHANNELS: usize = 4096;
/// Bytes of the reduction scratch (112 KiB): the partial pairs, then the means, then the
/// tickets.
pub(crate) const REDUCE_SCRATCH_BYTES: usize =
    REDUCE_PARTIALS * 16 + REDUCE_CHANNELS * 8 + REDUCE_CHANNELS * 4;

/// The layout for `blas_bytes` of cuBLAS workspace (a multiple of 256), an arena of `elems`
/// `f32`, an order of `order_len` `u32` and the reductions' scratch.
pub(crate) fn layout(
    blas_bytes: usize,
    elems: usize,
    order_len: usize,
) -> Result<Layout, EngineError> {
    let too_big = || EngineError::Device(format!("an arena of {elems} elements is too large"));
    let arena_bytes = elems.checked_mul(4).ok_or_else(too_big)?;
    let order_bytes = order_len.checked_mul(4).ok_or_else(too_big)?;
    let arena_offset = blas_bytes
        .checked_next_multiple_of(PART_ALIGN)
        .ok_or_else(too_big)?;
    let order_offset = arena_offset
        .checked_add(arena_bytes)
        .and_then(|e| e.checked_next_multiple_of(PART_ALIGN))
        .ok_or_else(too_big)?;
    let scratch_offset = order_offset
        .checked_add(order_bytes)
        .and_then(|e| e.checked_next_multiple_of(PART_ALIGN))
        .ok_or_else(too_big)?;
    let total = scratch_offset
        .checked_add(REDUCE_SCRATCH_BYTES)
        .and_then(|e| e.checked_next_multiple_of(PART_ALIGN))
        .ok_or_else(too_big)?;
    Ok(Layout {
        blas_bytes,
        arena_offset,
        arena_bytes,
        order_offset,
        order_bytes,
        scratch_offset,
        total,
    })
}

/// `CapExceeded` when `need` bytes do not fit under `cap` (checked before asking the driver).
pub(crate) fn check_cap(need: u64, cap: Option<u64>) -> Result<(), EngineError> {
    match cap {
        Some(cap) if need > cap => Err(cap_exceeded(need, cap)),
        _ => Ok(()),
    }
}

fn cap_exceeded(need: u64, cap: u64) -> EngineError {
    EngineError::CapExceeded {
        need_mib: need as f64 / MIB,
        cap_mib: cap as f64 / MIB,
    }
}

/// The pool's `maxSize` for a cap: the cap rounded up to whole pages of `granule` bytes (the
/// device's memory granularity), so that any request that passed [`check_cap`] is not refused
/// for page rounding. `0` (the driver's default, no limit of ours) when uncapped.
pub(crate) fn pool_max_size(cap: Option<u64>, granule: u64) -> usize {
    let granule = granule.max(1);
    cap.map(|c| c.div_ceil(granule).saturating_mul(granule))
        .map(|c| usize::try_from(c).unwrap_or(usize::MAX))
        .unwrap_or(0)
}

/// What an out-of-memory answer to a request of `bytes` (within the slice's cap: that was
/// checked first) means, with `free` bytes free on the device and `reserved` bytes held by the
/// trial's pool at that moment. When the device has less free than asked, it is full: other
/// trials or processes hold its memory, whatever this slice's cap. Otherwise the pool itself
/// refused (its reservations count against its `maxSize`), which is said as it is: it is not
/// the cap, since the request was within it.
pub(crate) fn out_of_memory(
    bytes: u64,
    cap: Option<u64>,
    free: Option<u64>,
    reserved: Option<u64>,
) -> EngineError {
    let mib = |b: u64| b as f64 / MIB;
    match free {
        Some(f) if bytes > f => EngineError::DeviceFull {
            need_mib: mib(bytes),
            free_mib: Some(mib(f)),
        },
        _ => {
            let mut why = format!(
                "cuMemAllocFromPoolAsync: out of memory for {:.1} MiB",
                mib(bytes)
            );
            if let Some(c) = cap {
                why.push_str(&format!(" under a slice cap of {:.1} MiB", mib(c)));
            }
            let said =
                |v: Option<u64>| v.map_or("unknown".to_string(), |b| format!("{:.1} MiB", mib(b)));
            why.push_str(&format!(
                " ({} free on the device, {} reserved by the trial's pool)",
                said(free),
                said(reserved)
            ));
            EngineError::Device(why)
        }
    }
}

/// Free device memory in the current context, when the driver says.
fn free_bytes() -> Option<u64> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: writes two sizes; a context is current (the caller entered it).
    let r = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(free as u64)
}

/// A memory pool of its own for one trial, capped or not.
pub(crate) struct Pool {
    raw: sys::CUmemoryPool,
    cap: Option<u64>,
    stream: Arc<Stream>,
}

// SAFETY: a pool handle is valid on every thread; calls on it go through `Ctx::enter`.
unsafe impl Send for Pool {}
// SAFETY: as above; `Pool` has no interior mutability.
unsafe impl Sync for Pool {}

impl Pool {
    /// A pool of device memory on `dev`, at most `cap` bytes (rounded up to whole `granule`s,
    /// the device's memory granularity).
    pub(crate) fn new(
        stream: Arc<Stream>,
        dev: sys::CUdevice,
        cap: Option<u64>,
        granule: u64,
    ) -> Result<Pool, EngineError> {
        let props = sys::CUmemPoolProps {
            allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            // A device location's id is the device ordinal, which is what cuDeviceGet returns
            // as the CUdevice handle. The release threshold stays at its default (0): the pool
            // holds one allocation for the trial's life, so nothing is kept cached.
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: dev,
            },
            win32SecurityAttributes: std::ptr::null_mut(),
            maxSize: pool_max_size(cap, granule),
            usage: 0,
            reserved: [0; 54],
        };
        let mut raw = std::ptr::null_mut();
        {
            let _in = stream.ctx().enter()?;
            // SAFETY: `props` is fully initialised and outlives the call; writes one handle.
            check(
                unsafe { sys::cuMemPoolCreate(&mut raw, &props) },
                "cuMemPoolCreate",
            )?;
        }
        Ok(Pool { raw, cap, stream })
    }

    pub(crate) fn cap(&self) -> Option<u64> {
        self.cap
    }

    /// Allocates `bytes` from the pool, ordered on the pool's stream. `CapExceeded` when they do
    /// not fit under the cap (checked first); when the driver then has no memory for them, the
    /// pool gives back what it holds unused and asks once more, and `DeviceFull` says the device
    /// has not that much free, whatever the cap ([`out_of_memory`]).
    pub(crate) fn alloc(self: &Arc<Self>, bytes: usize) -> Result<Allocation, EngineError> {
        check_cap(bytes as u64, self.cap)?;
        let mut ptr = 0;
        let mut r = self.try_alloc(&mut ptr, bytes)?;
        if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            // Frees still pending on the stream, and memory the pool keeps reserved, count
            // against its maxSize: let them finish and hand the unused memory back.
            self.stream.wait()?;
            self.trim()?;
            r = self.try_alloc(&mut ptr, bytes)?;
        }
        if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            let (free, reserved) = {
                let _in = self.stream.ctx().enter()?;
                (free_bytes(), self.reserved())
            };
            return Err(out_of_memory(bytes as u64, self.cap, free, reserved));
        }
        check(r, "cuMemAllocFromPoolAsync")?;
        Ok(Allocation {
            ptr,
            bytes,
            pool: Arc::clone(self),
        })
    }
}

impl Pool {
    /// One allocation attempt; the driver's answer.
    fn try_alloc(
        &self,
        ptr: &mut sys::CUdeviceptr,
        bytes: usize,
    ) -> Result<sys::CUresult, EngineError> {
        let _in = self.stream.ctx().enter()?;
        // SAFETY: pool and stream are live and belong to the current context; writes one pointer.
        Ok(unsafe { sys::cuMemAllocFromPoolAsync(ptr, bytes, self.raw, self.stream.raw()) })
    }

    /// Gives the memory the pool holds unused back to the device.
    fn trim(&self) -> Result<(), EngineError> {
        let _in = self.stream.ctx().enter()?;
        // SAFETY: the pool is live; keeping 0 bytes releases every unused reservation.
        check(
            unsafe { sys::cuMemPoolTrimTo(self.raw, 0) },
            "cuMemPoolTrimTo",
        )
    }

    /// The bytes the pool holds reserved from the device, when the driver says; call it inside
    /// the context.
    fn reserved(&self) -> Option<u64> {
        let mut v: u64 = 0;
        // SAFETY: the attribute is a cuuint64_t, written into `v`.
        let r = unsafe {
            sys::cuMemPoolGetAttribute(
                self.raw,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut v as *mut u64).cast(),
            )
        };
        (r == sys::CUresult::CUDA_SUCCESS).then_some(v)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Destroying a pool releases its memory, which may synchronise the device: not while
        // another thread captures a graph.
        super::capture_hold::without_captures(|| {
            if let Ok(_in) = self.stream.ctx().enter() {
                // SAFETY: every allocation holds an Arc of its pool, so none is outstanding.
                // Errors cannot be reported from Drop.
                let _ = unsafe { sys::cuMemPoolDestroy(self.raw) };
            }
        });
    }
}

/// One allocation from a pool, freed (on the pool's stream) when dropped.
pub(crate) struct Allocation {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    pool: Arc<Pool>,
}

impl Allocation {
    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        let stream = &self.pool.stream;
        if let Ok(_in) = stream.ctx().enter() {
            // SAFETY: the pointer came from cuMemAllocFromPoolAsync and is freed once, ordered
            // after all work issued on the stream that uses it.
            let _ = unsafe { sys::cuMemFreeAsync(self.ptr, stream.raw()) };
        }
        // Let the free complete before the pool (and its stream) can go. Errors cannot be
        // reported from Drop.
        let _ = stream.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_checked_before_allocating() {
        let e = check_cap(4 << 20, Some(1 << 20)).unwrap_err();
        assert_eq!(e.to_string(), "needs 4.0 MiB, slice cap 1.0 MiB");
        assert!(check_cap(1 << 20, Some(1 << 20)).is_ok());
        assert!(check_cap(u64::MAX, None).is_ok());
    }

    #[test]
    fn pools_are_capped_in_whole_pages_of_the_device() {
        let two = 2 << 20;
        assert_eq!(pool_max_size(None, two), 0);
        assert_eq!(pool_max_size(Some(2 << 20), two), 2 << 20);
        assert_eq!(pool_max_size(Some((2 << 20) + 1), two), 4 << 20);
        assert_eq!(pool_max_size(Some(1), two), 2 << 20);
        // Another device's granularity is its own.
        assert_eq!(pool_max_size(Some(33 << 20), 32 << 20), 64 << 20);
        assert_eq!(pool_max_size(Some(5), 0), 5);
    }

    #[test]
    fn out_of_memory_is_the_device_only_when_it_had_not_the_room() {
        let mib = 1u64 << 20;
        // Under the cap, but others hold the device's memory: the device is full.
        let e = out_of_memory(50 * mib, Some(64 * mib), Some(10 * mib), Some(0));
        assert!(matches!(e, EngineError::DeviceFull { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "the device is full: needs 50.0 MiB, 10.0 MiB free (other trials or processes hold the rest)"
        );
        // The device had room: the pool refused, and that is said as it is, not as the cap (the
        // request was within it) nor as a full device.
        let e = out_of_memory(50 * mib, Some(64 * mib), Some(1000 * mib), Some(32 * mib));
        assert!(matches!(e, EngineError::Device(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "cuMemAllocFromPoolAsync: out of memory for 50.0 MiB under a slice cap of 64.0 MiB \
             (1000.0 MiB free on the device, 32.0 MiB reserved by the trial's pool)"
        );
        // Uncapped, the driver silent about free memory: named, not guessed.
        let e = out_of_memory(50 * mib, None, None, None);
        assert!(
            e.to_string()
                .ends_with("(unknown free on the device, unknown reserved by the trial's pool)"),
            "{e}"
        );
    }

    #[test]
    fn the_allocation_holds_workspace_arena_and_order_aligned() {
        let l = layout(BLAS_WORKSPACE_BYTES, 1000, 10).unwrap();
        assert_eq!(l.arena_offset, BLAS_WORKSPACE_BYTES);
        assert_eq!(l.arena_bytes, 4000);
        assert_eq!(l.order_offset % PART_ALIGN, 0);
        assert!(l.order_offset >= l.arena_offset + l.arena_bytes);
        assert_eq!(l.order_bytes, 40);
        assert_eq!(l.scratch_offset % PART_ALIGN, 0);
        assert!(l.scratch_offset >= l.order_offset + l.order_bytes);
        assert!(l.total >= l.scratch_offset + REDUCE_SCRATCH_BYTES);
        assert_eq!(l.total % PART_ALIGN, 0);
        assert!(layout(BLAS_WORKSPACE_BYTES, usize::MAX / 2, 0).is_err());
    }

    #[test]
    fn hopper_gets_a_32_mib_cublas_workspace_inside_the_allocation() {
        assert_eq!(blas_workspace_bytes((8, 0)), 4 << 20);
        assert_eq!(blas_workspace_bytes((8, 9)), 4 << 20);
        assert_eq!(blas_workspace_bytes((9, 0)), 32 << 20);
        assert_eq!(blas_workspace_bytes((10, 0)), 32 << 20);
        let (a, h) = (
            layout(blas_workspace_bytes((8, 0)), 1000, 10).unwrap(),
            layout(blas_workspace_bytes((9, 0)), 1000, 10).unwrap(),
        );
        assert_eq!(h.blas_bytes, 32 << 20);
        assert_eq!(h.arena_offset, 32 << 20);
        // The same arena and order, 28 MiB more in the one allocation the cap is checked against.
        assert_eq!(h.total - a.total, 28 << 20);
        assert_eq!(h.arena_bytes, a.arena_bytes);
    }
}
