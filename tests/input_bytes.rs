//! Arbitrary bytes given as a job file or a data file never panic and never allocate beyond a
//! bound: each gives a value or an error of the bad-input kind (exit code 2).
//!
//! The allocator of this test binary counts the bytes live at any time, so the peak of each
//! call is measured. The file holds one test, so nothing else allocates meanwhile.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use gpumux::data::{cifar, idx, Samples};
use gpumux::error::{exit, Error};
use gpumux::job::{text, Job};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static CALLS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only counters are kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let now = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most any one call may hold at once, beyond what was live before it.
const BOUND: usize = 64 << 20;

/// Runs `f` and returns its value with the most bytes it held at once.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let value = f();
    (value, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}

/// Parses bytes as a job file would be read; the error, if any, must be bad input.
fn job_bytes(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    CALLS.fetch_add(1, Ordering::Relaxed);
    let (result, peak) = peak_of(|| match text::decode(bytes) {
        Ok(t) => Job::parse(&t, Path::new("fuzz.yaml")).map(|_| ()),
        Err(m) => Err(gpumux::error::JobError::Syntax {
            path: "fuzz.yaml".into(),
            message: m,
        }),
    });
    prop_assert!(peak < BOUND, "a job of bytes held {peak} bytes");
    if let Err(e) = result {
        prop_assert_eq!(Error::from(e).exit_code(), exit::BAD_INPUT);
    }
    Ok(())
}

/// Decodes bytes as an IDX file of 1 and of 3 dimensions, and as a CIFAR-10 batch.
fn data_bytes(bytes: &[u8]) -> Result<(), TestCaseError> {
    for ndims in [1, 3] {
        let (result, peak) = peak_of(|| idx::parse(Path::new("fuzz"), bytes, ndims));
        prop_assert!(peak < BOUND, "an IDX file of bytes held {peak} bytes");
        if let Err(e) = result {
            prop_assert_eq!(Error::from(e).exit_code(), exit::BAD_INPUT);
        }
    }
    let mut out = Samples::default();
    let (result, peak) = peak_of(|| cifar::append(Path::new("fuzz"), bytes, &mut out, Some(4)));
    prop_assert!(peak < BOUND, "a CIFAR-10 batch of bytes held {peak} bytes");
    if let Err(e) = result {
        prop_assert_eq!(Error::from(e).exit_code(), exit::BAD_INPUT);
    }
    Ok(())
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let _ = enc.write_all(data);
    enc.finish().unwrap_or_default()
}

/// Pieces of YAML that stress a parser: nesting, anchors and aliases, tags, keys given twice.
fn yaml_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("[".to_string()),
        Just("{".to_string()),
        Just("]".to_string()),
        Just("}".to_string()),
        Just("&a ".to_string()),
        Just("*a".to_string()),
        Just("*a, *a, *a, *a".to_string()),
        Just("<<: *a\n".to_string()),
        Just("!!binary ".to_string()),
        Just("\u{feff}".to_string()),
        Just("\n- ".to_string()),
        Just("\nlr: 1\nlr: 2\n".to_string()),
        Just("'".to_string()),
        Just("\"\\".to_string()),
        Just(": ".to_string()),
        "[ :{}\\[\\],\\-a-z0-9.\\n&*!|>#'\"]{0,12}",
    ]
}

#[test]
fn arbitrary_input_never_panics_and_stays_bounded() {
    // A runner counts the cases it ran: each property gets its own.
    let runner = || {
        TestRunner::new(Config {
            cases: 256,
            failure_persistence: None,
            ..Config::default()
        })
    };
    let base = include_str!("../jobs/example.yaml");

    runner()
        .run(&proptest::collection::vec(any::<u8>(), 0..2000), |b| {
            job_bytes(b)
        })
        .expect("arbitrary bytes as a job file");

    runner()
        .run(
            &(
                0usize..base.len(),
                proptest::collection::vec(yaml_piece(), 1..30),
            ),
            |(cut, pieces)| {
                let at = (0..=cut)
                    .rev()
                    .find(|&i| base.is_char_boundary(i))
                    .unwrap_or(0);
                let text = format!("{}{}{}", &base[..at], pieces.concat(), &base[at..]);
                job_bytes(text.into_bytes())
            },
        )
        .expect("a job with YAML pieces inserted");

    runner()
        .run(
            &(proptest::collection::vec(yaml_piece(), 1..400), 1usize..20),
            |(pieces, repeat)| job_bytes(pieces.concat().repeat(repeat).into_bytes()),
        )
        .expect("YAML pieces alone");

    runner()
        .run(&proptest::collection::vec(any::<u8>(), 0..4000), |b| {
            data_bytes(&b)?;
            data_bytes(&[[0x1f, 0x8b].as_slice(), &b].concat())?;
            data_bytes(&gzip(&b))
        })
        .expect("arbitrary bytes as a data file");

    runner()
        .run(
            &(
                proptest::collection::vec(any::<u32>(), 0..4),
                proptest::collection::vec(any::<u8>(), 0..64),
                any::<bool>(),
            ),
            |(dims, body, gz)| {
                // A well-formed header declaring any shape, then a short body.
                let mut bytes = support::idx(&dims, &body);
                if gz {
                    bytes = gzip(&bytes);
                }
                data_bytes(&bytes)
            },
        )
        .expect("IDX headers declaring any shape");
    assert!(
        CALLS.load(Ordering::Relaxed) >= 3 * 256,
        "every property ran"
    );
}
