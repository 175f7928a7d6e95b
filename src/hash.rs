//! Stable hashing: 64-bit FNV-1a, the same on every machine and Rust version (unlike `std`'s hasher); and a 128-bit digest of a value's fields, to tell rows apart without holding them.

use std::fmt::{self, Debug, Write};
use std::hash::{DefaultHasher, Hasher};

/// FNV-1a's starting value.
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a over `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_more(FNV_START, bytes)
}

/// FNV-1a of what `h` hashed so far followed by `bytes`.
pub fn fnv1a_more(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Two hashes of one text, fed piece by piece: FNV-1a and SipHash with fixed keys.
struct Twin {
    fnv: u64,
    sip: DefaultHasher,
}

impl Write for Twin {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.fnv = fnv1a_more(self.fnv, s.as_bytes());
        self.sip.write(s.as_bytes());
        Ok(())
    }
}

/// A 128-bit digest of `value`'s fields as `Debug` writes them (so NaN equals NaN), made
/// without writing them out: two rows with the same digest are taken as equal field for field
/// (two different rows share one with a chance of about n²/2¹²⁹ among n rows). Stable within
/// one process, not across Rust versions.
pub fn digest(value: &impl Debug) -> u128 {
    let mut twin = Twin {
        fnv: FNV_START,
        sip: DefaultHasher::new(),
    };
    // Writing into a hasher never fails.
    let _ = write!(twin, "{value:?}");
    (u128::from(twin.sip.finish()) << 64) | u128::from(twin.fnv)
}

/// [`digest`] of bytes as they are (a row's encoded line, where equal rows encode alike).
pub fn digest_bytes(bytes: &[u8]) -> u128 {
    let mut sip = DefaultHasher::new();
    sip.write(bytes);
    (u128::from(sip.finish()) << 64) | u128::from(fnv1a(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_tell_fields_apart_and_take_nan_as_nan() {
        let a = digest(&("t0", 1u32, f64::NAN));
        assert_eq!(a, digest(&("t0", 1u32, f64::NAN)));
        assert_ne!(a, digest(&("t0", 2u32, f64::NAN)));
        assert_ne!(a, digest(&("t", 1u32, f64::NAN)));
        assert_eq!(digest(&"a") as u64, fnv1a(b"\"a\""));
    }

    #[test]
    fn known_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
