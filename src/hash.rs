//! Stable hashing: 64-bit FNV-1a, the same on every machine and Rust version (unlike `std`'s hasher); a 128-bit digest of a value's fields or bytes, to tell rows apart without holding them; and a fast seeded hasher for tables keyed by rows' ids.

use std::fmt::{self, Debug, Write};
use std::hash::{BuildHasher, DefaultHasher, Hasher, RandomState};
use std::sync::OnceLock;

/// FNV-1a's starting value.
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a's 64-bit multiplier.
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_more(FNV_START, bytes)
}

/// FNV-1a of what `h` hashed so far followed by `bytes`.
pub fn fnv1a_more(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(FNV_PRIME))
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

/// A 128-bit digest of bytes as they are (a row's encoded line, where equal rows encode
/// alike), 16 bytes a step in two lanes of folded multiplications, seeded once per process
/// (so that no file can be made to collide on purpose): about ten times as fast as [`digest`],
/// for the millions of lines a merge compares. Stable within one process only.
pub fn digest_bytes(bytes: &[u8]) -> u128 {
    let seed = process_seed();
    let (mut a, mut b) = (seed ^ MIX[0], seed.rotate_left(32) ^ MIX[1]);
    let mut words = bytes.chunks_exact(16);
    for pair in &mut words {
        let (x, y) = pair.split_at(8);
        a = fold_mul(a ^ le_word(x), MIX[2]);
        b = fold_mul(b ^ le_word(y), MIX[3]);
    }
    let rest = words.remainder();
    let (x, y) = rest.split_at(rest.len().min(8));
    a = fold_mul(a ^ le_word(x), MIX[2]);
    b = fold_mul(b ^ le_word(y) ^ bytes.len() as u64, MIX[3]);
    let (hi, lo) = (
        fold_mul(a ^ b.rotate_left(23), MIX[1]),
        fold_mul(b ^ a, MIX[0]),
    );
    (u128::from(hi) << 64) | u128::from(lo)
}

/// A set of [`digest_bytes`] digests for millions of lines: one flat table probed linearly
/// (the digests are seeded, so no file crowds one part of it), at most three quarters full.
/// [`DigestSet::insert_batch`] loads the slots of a batch before inserting any, so that their
/// cache misses overlap instead of coming one after another.
#[derive(Debug)]
pub struct DigestSet {
    slots: Vec<u128>,
    len: usize,
}

/// An empty slot (a digest of zero is kept as one).
const EMPTY: u128 = 0;

impl DigestSet {
    /// A set with room for about `n` digests before it grows.
    pub fn with_capacity(n: usize) -> Self {
        let slots = (n.saturating_mul(4) / 3).max(16).next_power_of_two();
        DigestSet {
            slots: vec![EMPTY; slots],
            len: 0,
        }
    }

    /// How many digests the set holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the set holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn home(&self, d: u128) -> usize {
        (d as usize) & (self.slots.len() - 1)
    }

    /// Adds `d`: whether it was not in the set.
    pub fn insert(&mut self, d: u128) -> bool {
        let d = if d == EMPTY { 1 } else { d };
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(d);
        loop {
            match self.slots[i] {
                EMPTY => {
                    self.slots[i] = d;
                    self.len += 1;
                    return true;
                }
                s if s == d => return false,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// [`DigestSet::insert`] of each digest in order; `fresh` gets, for each, whether it
    /// was new.
    pub fn insert_batch(&mut self, batch: &[u128], fresh: &mut Vec<bool>) {
        self.touch(batch);
        fresh.clear();
        fresh.extend(batch.iter().map(|&d| self.insert(d)));
    }

    /// One load of the home slot of each digest, all issued before any is needed, so that
    /// their cache misses overlap.
    fn touch(&self, batch: &[u128]) {
        let touched = batch
            .iter()
            .fold(0u128, |acc, &d| acc ^ self.slots[self.home(d)]);
        std::hint::black_box(touched);
    }

    /// Whether the set holds `d`.
    pub fn contains(&self, d: u128) -> bool {
        let d = if d == EMPTY { 1 } else { d };
        let mask = self.slots.len() - 1;
        let mut i = self.home(d);
        loop {
            match self.slots[i] {
                EMPTY => return false,
                s if s == d => return true,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// [`DigestSet::contains`] of each digest; `held` gets, for each, whether the set holds it.
    pub fn contains_batch(&self, batch: &[u128], held: &mut Vec<bool>) {
        self.touch(batch);
        held.clear();
        held.extend(batch.iter().map(|&d| self.contains(d)));
    }

    fn grow(&mut self) {
        let bigger = vec![EMPTY; self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, bigger);
        self.len = 0;
        for d in old.into_iter().filter(|&d| d != EMPTY) {
            self.insert(d);
        }
    }
}

/// Odd 64-bit constants (digits of pi) for [`fold_mul`].
const MIX: [u64; 4] = [
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7345,
    0xa409_3822_299f_31d1,
    0x082e_fa98_ec4e_6c89,
];

/// The product of `x` and `k` as 128 bits, its halves xored: every bit of `x` reaches many.
fn fold_mul(x: u64, k: u64) -> u64 {
    let p = u128::from(x) * u128::from(k);
    (p as u64) ^ ((p >> 64) as u64)
}

/// Up to 8 bytes as a little-endian word (zeros after them).
fn le_word(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(w)
}

/// A random seed drawn once per process.
fn process_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| RandomState::new().hash_one(0x5eed_u64))
}

/// A hasher for tables of rows' ids and keys, seeded once per process: folded
/// multiplications, 8 bytes a step, several times as fast as `std`'s on short keys.
#[derive(Clone, Copy, Debug)]
pub struct Seeded(u64);

impl Default for Seeded {
    fn default() -> Self {
        Seeded(process_seed())
    }
}

impl BuildHasher for Seeded {
    type Hasher = QuickHasher;

    fn build_hasher(&self) -> QuickHasher {
        QuickHasher(self.0)
    }
}

/// The hasher [`Seeded`] builds.
#[derive(Clone, Copy, Debug)]
pub struct QuickHasher(u64);

impl Hasher for QuickHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.0 = fold_mul(self.0 ^ le_word(word), MIX[2]);
        }
        self.0 = fold_mul(
            self.0 ^ le_word(words.remainder()) ^ bytes.len() as u64,
            MIX[3],
        );
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = fold_mul(self.0 ^ v, MIX[2]);
    }

    fn write_u128(&mut self, v: u128) {
        self.write_u64(v as u64);
        self.write_u64((v >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        fold_mul(self.0, MIX[0])
    }
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
    fn byte_digests_tell_every_byte_and_length_apart() {
        let base: Vec<u8> = (0..40).collect();
        let d = digest_bytes(&base);
        assert_eq!(d, digest_bytes(&base.clone()));
        for i in 0..base.len() {
            let mut other = base.clone();
            other[i] ^= 1;
            assert_ne!(digest_bytes(&other), d, "byte {i}");
            assert_ne!(digest_bytes(&base[..i]), d, "length {i}");
        }
        // Trailing zeros are no padding.
        assert_ne!(digest_bytes(b"a"), digest_bytes(b"a\0"));
        let mut seen = std::collections::HashSet::new();
        for n in 0..100_000u64 {
            assert!(seen.insert(digest_bytes(&n.to_le_bytes())));
        }
    }

    #[test]
    fn a_digest_set_holds_each_digest_once_across_growth_and_batches() {
        let mut set = DigestSet::with_capacity(4);
        let mut fresh = Vec::new();
        let batch: Vec<u128> = (0..50u128).map(|n| n * 0x1_0000_0000_0000_0001).collect();
        set.insert_batch(&batch, &mut fresh);
        assert!(fresh.iter().all(|&f| f));
        let again: Vec<u128> = vec![3 * 0x1_0000_0000_0000_0001, 7, 7, 0];
        set.insert_batch(&again, &mut fresh);
        // Zero was in the first batch; 7 is new once.
        assert_eq!(fresh, [false, true, false, false]);
        assert_eq!(set.len(), 51);
        for n in 0..100_000u128 {
            set.insert(n << 64);
        }
        assert!(!set.insert(99_999 << 64) && set.insert(100_000 << 64));
    }

    #[test]
    fn seeded_tables_hold_what_they_are_given() {
        let mut table: std::collections::HashMap<String, u64, Seeded> = Default::default();
        for n in 0..10_000u64 {
            table.insert(format!("{n:016x}"), n);
        }
        assert!((0..10_000u64).all(|n| table[&format!("{n:016x}")] == n));
    }

    #[test]
    fn known_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
