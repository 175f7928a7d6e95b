//! Hot CPU loops compiled for the widest vector unit the host has, chosen at run time, with results bit for bit those of the baseline build.
//!
//! The crate is built for the x86-64 baseline (SSE2), so that one binary runs on any x86-64 host.
//! [`multiversion!`] compiles a loop three times: for AVX-512, for AVX2 and for the baseline, and
//! calls the widest one the host supports. Each copy performs the same IEEE operations on each
//! element in the same order (Rust never contracts a multiply and an add into an FMA, nor
//! reorders a floating-point sum), and division and square root are correctly rounded at every
//! width, so the copies agree bit for bit: only the number of lanes differs.
//! `GPUMUX_CPU_SIMD=baseline` (or `avx2`) caps the width, to compare.

use std::sync::OnceLock;

/// The vector width a multiversioned loop runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Baseline,
    Avx2,
    Avx512,
}

/// The widest level this host supports, capped by `GPUMUX_CPU_SIMD`; read once per process.
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let asked = std::env::var("GPUMUX_CPU_SIMD").ok();
        let (level, warning) = capped(asked.as_deref(), host_level());
        if let Some(w) = warning {
            crate::note!("{w}");
        }
        level
    })
}

/// The level `GPUMUX_CPU_SIMD=asked` gives on a host of level `host`, and a warning for a value
/// it does not know (which leaves the host's level).
fn capped(asked: Option<&str>, host: Level) -> (Level, Option<String>) {
    match asked {
        None | Some("") | Some("avx512") => (host, None),
        Some("baseline") => (Level::Baseline, None),
        Some("avx2") => (host.min(Level::Avx2), None),
        Some(other) => (
            host,
            Some(format!(
                "warning: GPUMUX_CPU_SIMD={other} is not baseline, avx2 or avx512; using the host's widest ({host:?})"
            )),
        ),
    }
}

#[cfg(target_arch = "x86_64")]
fn host_level() -> Level {
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        Level::Avx512
    } else if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        Level::Avx2
    } else {
        Level::Baseline
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn host_level() -> Level {
    Level::Baseline
}

/// `multiversion! { pub fn name / name_baseline(args...) -> R { body } }` defines `name`, which
/// runs `body` compiled for the host's widest [`Level`], and `name_baseline`, which runs it as
/// built (for tests that compare the two).
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident / $base:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx2,fma")]
                unsafe fn wide($($arg: $ty),*) $(-> $ret)? {
                    $base($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn mid($($arg: $ty),*) $(-> $ret)? {
                    $base($($arg),*)
                }
                match $crate::engine::cpu::simd::level() {
                    // SAFETY: `level` reports the host's features; these copies need no more.
                    $crate::engine::cpu::simd::Level::Avx512 => return unsafe { wide($($arg),*) },
                    // SAFETY: as above.
                    $crate::engine::cpu::simd::Level::Avx2 => return unsafe { mid($($arg),*) },
                    $crate::engine::cpu::simd::Level::Baseline => {}
                }
            }
            $base($($arg),*)
        }

        /// The baseline build of the loop of the function above.
        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        $vis fn $base($($arg: $ty),*) $(-> $ret)? $body
    };
}
pub(crate) use multiversion;

#[cfg(test)]
mod tests {
    use super::*;

    multiversion! {
        fn scaled_roots / scaled_roots_baseline(x: &mut [f32], s: f32) {
            for v in x.iter_mut() {
                *v = (*v / s).sqrt() + *v * s;
            }
        }
    }

    #[test]
    fn gpumux_cpu_simd_caps_the_width_and_names_a_value_it_does_not_know() {
        use Level::*;
        assert_eq!(capped(None, Avx512), (Avx512, None));
        assert_eq!(capped(Some("avx512"), Avx2), (Avx2, None));
        assert_eq!(capped(Some("avx2"), Avx512), (Avx2, None));
        assert_eq!(capped(Some("avx2"), Baseline), (Baseline, None));
        assert_eq!(capped(Some("baseline"), Avx512), (Baseline, None));
        let (l, w) = capped(Some("avx9"), Avx2);
        assert_eq!(l, Avx2);
        assert!(w.is_some_and(|w| w.contains("GPUMUX_CPU_SIMD=avx9")));
    }

    #[test]
    fn every_width_gives_the_baseline_bits() {
        let mut rng = crate::rng::HostRng::new(5);
        let x: Vec<f32> = (0..1003).map(|_| rng.uniform_f32(0.0, 1e3)).collect();
        let (mut a, mut b) = (x.clone(), x);
        scaled_roots(&mut a, 0.37);
        scaled_roots_baseline(&mut b, 0.37);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b));
        assert!(level() >= Level::Baseline);
    }
}
