//! Deterministic random numbers: a seeded host generator, and a counter-based hash that the CUDA kernels reproduce bit for bit.

/// SplitMix64's finaliser: a bijective 64-bit mixer.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform `f32` in `[0, 1)` that depends only on `(seed, counter, index)`.
/// Used for dropout masks so that every backend draws the same mask.
#[inline]
pub fn uniform(seed: u64, counter: u64, index: u64) -> f32 {
    let h = mix64(seed ^ mix64(counter.wrapping_add(0x9e37_79b9_7f4a_7c15) ^ mix64(index)));
    // 24 high bits → exact f32 in [0, 1).
    (h >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
}

/// Derives an independent stream seed from a parent seed and a label.
pub fn derive(seed: u64, label: u64) -> u64 {
    mix64(seed ^ mix64(label ^ 0xd1b5_4a32_d192_ed03))
}

/// A small seeded generator (SplitMix64) for host-side shuffles, splits and initialisation.
#[derive(Clone, Debug)]
pub struct HostRng {
    state: u64,
}

impl HostRng {
    pub fn new(seed: u64) -> Self {
        HostRng { state: seed }
    }
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.state)
    }
    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform_f32(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.next_f64() as f32
    }
    /// Uniform integer in `0..n` (n > 0), without modulo bias worth speaking of for n ≪ 2^64.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
    /// An index drawn by `weights` (summing to 1): the first whose running sum passes one
    /// uniform draw, the last when rounding leaves the sum short.
    pub fn pick(&mut self, weights: &[f64]) -> usize {
        let u = self.next_f64();
        let mut acc = 0.0;
        weights
            .iter()
            .position(|w| {
                acc += w;
                u < acc
            })
            .unwrap_or(weights.len().saturating_sub(1))
    }
    /// Standard normal by Box–Muller.
    pub fn normal(&mut self) -> f64 {
        let u1 = self.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
    /// A random permutation of `0..n`.
    pub fn permutation(&mut self, n: usize) -> Vec<u32> {
        let mut p: Vec<u32> = (0..n as u32).collect();
        self.shuffle(&mut p);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_in_range_and_roughly_balanced() {
        let n = 100_000;
        let mut below_half = 0;
        for i in 0..n {
            let u = uniform(7, 3, i);
            assert!((0.0..1.0).contains(&u));
            if u < 0.5 {
                below_half += 1;
            }
        }
        let frac = below_half as f64 / n as f64;
        assert!((frac - 0.5).abs() < 0.01, "fraction below 0.5 was {frac}");
    }

    #[test]
    fn uniform_depends_on_every_input() {
        let a = uniform(1, 2, 3);
        assert_ne!(a, uniform(2, 2, 3));
        assert_ne!(a, uniform(1, 3, 3));
        assert_ne!(a, uniform(1, 2, 4));
    }

    #[test]
    fn permutation_is_a_permutation_and_seeded() {
        let p = HostRng::new(5).permutation(1000);
        let mut s = p.clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<u32>>());
        assert_eq!(p, HostRng::new(5).permutation(1000));
        assert_ne!(p, HostRng::new(6).permutation(1000));
    }
}
