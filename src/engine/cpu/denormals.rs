//! Flush-to-zero for the CPU engine: a scoped guard that makes the calling thread's float unit treat subnormal (denormal) numbers as zero, on input and on output.
//!
//! Subnormal floats (magnitudes below `f32::MIN_POSITIVE`, about 1.2e-38) are handled by a slow
//! microcode path on most CPUs: an op that reads or writes one can take 10 to 100 times longer.
//! Training makes them: Adam's second moments and small gradients decay towards zero, and once a
//! weight matrix holds many of them, every GEMM that reads it slows down.
//!
//! [`FlushGuard::new`] sets, for the calling thread only:
//! - on x86_64, the MXCSR bits FTZ (bit 15: a subnormal result is written as a zero of the same
//!   sign) and DAZ (bit 6: a subnormal input is read as a zero of the same sign), for every SSE and
//!   AVX instruction, single and double precision;
//! - on aarch64, the FPCR bit FZ (bit 24), which does both for the scalar and Advanced SIMD units;
//! - on other architectures, nothing.
//!
//! Dropping the guard restores the thread's previous modes, so a guard can be taken by code that
//! may already run under one. Other threads are untouched, except that a thread created while a
//! guard is held starts with its creator's modes (POSIX threads inherit them). Every thread that runs CPU engine work holds one for the whole
//! trial, taken through [`crate::engine::Backend::thread_guard`] (the training loops know nothing
//! of it): [`crate::train::run_trial`] (trial threads, process-mode workers, `gpumux train`) and
//! mirrored training's leader and replica threads. The results stay deterministic: a run is
//! bit-identical to another run with the same seed, in any split mode, as before. They differ from
//! a run without the guard only where a value fell below about 1.2e-38 and was read as zero, a
//! change far below f32's rounding of any normal value it is added to.

use std::marker::PhantomData;

/// Holds the calling thread's flush-to-zero mode on until dropped, then restores the previous
/// mode. Not `Send`: the mode belongs to the thread that took the guard.
#[must_use = "the mode is restored when the guard is dropped"]
pub struct FlushGuard {
    previous: Option<u32>,
    _thread: PhantomData<*const ()>,
}

impl FlushGuard {
    /// Turns flush-to-zero (and denormals-are-zero) on for this thread. Does nothing when it is
    /// on already or the architecture has no such mode.
    pub fn new() -> Self {
        let previous = imp::read().filter(|&m| m & imp::FLUSH != imp::FLUSH);
        if let Some(m) = previous {
            imp::write(m | imp::FLUSH);
        }
        FlushGuard {
            previous,
            _thread: PhantomData,
        }
    }

    /// Like [`FlushGuard::new`] when `on`, otherwise a guard that changes nothing.
    pub fn when(on: bool) -> Self {
        if on {
            Self::new()
        } else {
            FlushGuard {
                previous: None,
                _thread: PhantomData,
            }
        }
    }
}

impl Default for FlushGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        if let Some(m) = self.previous {
            imp::write(m);
        }
    }
}

/// Whether flush-to-zero is on for the calling thread (`false` where there is no such mode).
pub fn flushing() -> bool {
    imp::read().is_some_and(|m| m & imp::FLUSH == imp::FLUSH)
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::asm;

    /// MXCSR's FTZ (bit 15) and DAZ (bit 6).
    pub const FLUSH: u32 = (1 << 15) | (1 << 6);

    pub fn read() -> Option<u32> {
        let mut m: u32 = 0;
        // SAFETY: `stmxcsr` stores the 32-bit MXCSR to the given, valid and writable address.
        unsafe { asm!("stmxcsr [{}]", in(reg) &mut m, options(nostack, preserves_flags)) };
        Some(m)
    }

    pub fn write(m: u32) {
        // SAFETY: `m` is a value read from MXCSR with only the FTZ/DAZ bits changed, so no
        // reserved bit is set; changing the rounding modes' flush bits is what the caller wants.
        unsafe { asm!("ldmxcsr [{}]", in(reg) &m, options(nostack, preserves_flags, readonly)) };
    }
}

#[cfg(target_arch = "aarch64")]
mod imp {
    use std::arch::asm;

    /// FPCR's FZ (bit 24).
    pub const FLUSH: u32 = 1 << 24;

    pub fn read() -> Option<u32> {
        let m: u64;
        // SAFETY: reading FPCR has no side effect.
        unsafe { asm!("mrs {}, fpcr", out(reg) m, options(nomem, nostack, preserves_flags)) };
        Some(m as u32)
    }

    pub fn write(m: u32) {
        // SAFETY: `m` is a value read from FPCR with only the FZ bit changed.
        unsafe { asm!("msr fpcr, {}", in(reg) m as u64, options(nomem, nostack, preserves_flags)) };
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod imp {
    pub const FLUSH: u32 = 0;

    pub fn read() -> Option<u32> {
        None
    }

    pub fn write(_: u32) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hint::black_box;

    /// 2^-100 · 2^-30 = 2^-130: a subnormal f32 (the smallest normal is 2^-126).
    fn product() -> f32 {
        black_box(2f32.powi(-100)) * black_box(2f32.powi(-30))
    }

    const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

    #[test]
    fn a_subnormal_product_flushes_to_zero_only_under_the_guard() {
        std::thread::spawn(|| {
            assert!(!flushing(), "a new thread starts without flush-to-zero");
            let before = product();
            assert!(before.is_subnormal(), "{before:e}");
            assert_eq!(before, 2f32.powi(-130));
            {
                let _g = FlushGuard::new();
                assert_eq!(flushing(), SUPPORTED);
                let flushed = product();
                if SUPPORTED {
                    assert_eq!(flushed.to_bits(), 0, "{flushed:e}");
                    // Denormals-are-zero: a subnormal input reads as zero.
                    let tiny = black_box(f32::from_bits(1));
                    assert_eq!(tiny * black_box(2f32.powi(100)), 0.0);
                }
                // Normal numbers are untouched.
                assert_eq!(
                    black_box(1.5f32) * black_box(2f32.powi(-120)),
                    1.5 * 2f32.powi(-120)
                );
            }
            assert!(!flushing(), "the guard restores the mode");
            assert!(product().is_subnormal());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn guards_nest_and_the_outer_one_restores() {
        std::thread::spawn(|| {
            let outer = FlushGuard::new();
            {
                let _inner = FlushGuard::new();
                assert_eq!(flushing(), SUPPORTED);
            }
            assert_eq!(
                flushing(),
                SUPPORTED,
                "the inner guard found it on and left it on"
            );
            drop(outer);
            assert!(!flushing());
            let _off = FlushGuard::when(false);
            assert!(!flushing());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_mode_belongs_to_the_thread() {
        // A running thread is untouched by another thread's guard (a thread created while a
        // guard is held starts with its creator's mode, as POSIX threads inherit it).
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            go_rx.recv().unwrap();
            !flushing() && product().is_subnormal()
        });
        let _g = FlushGuard::new();
        go_tx.send(()).unwrap();
        assert!(other.join().unwrap());
    }
}
