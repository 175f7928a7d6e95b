//! The seeded, class-stratified held-out split, and turning byte images into `f32` samples.

use super::Samples;
use crate::rng::{derive, HostRng};

/// Label of the random stream the split draws from (see [`derive`]).
const SPLIT_STREAM: u64 = u64::from_le_bytes(*b"split\0\0\0");

/// Splits the indices `0..labels.len()` into `(train, test)`.
///
/// The test side gets `round(n × test_fraction)` samples, shared among the classes in proportion
/// to their counts (largest remainders get the leftover ones), so both sides keep the class
/// proportions. Which samples go where, and the order of each side, come from one seeded
/// permutation: the same `(labels, test_fraction, seed)` always gives the same split.
pub fn stratified(labels: &[u8], test_fraction: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut counts = [0usize; 256];
    for &l in labels {
        counts[l as usize] += 1;
    }
    let target = ((labels.len() as f64 * test_fraction).round() as usize).min(labels.len());
    let mut quota = [0usize; 256];
    let mut remainders = Vec::new();
    for (class, (q, &c)) in quota.iter_mut().zip(&counts).enumerate() {
        let exact = c as f64 * test_fraction;
        *q = (exact.floor() as usize).min(c);
        if *q < c {
            remainders.push((exact - exact.floor(), class));
        }
    }
    // Largest remainder first; ties go to the smaller class index.
    remainders.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let short = target.saturating_sub(quota.iter().sum());
    for &(_, class) in remainders.iter().take(short) {
        quota[class] += 1;
    }
    let order = HostRng::new(derive(seed, SPLIT_STREAM)).permutation(labels.len());
    let test_len: usize = quota.iter().sum();
    let mut train = Vec::with_capacity(labels.len() - test_len);
    let mut test = Vec::with_capacity(test_len);
    for i in order {
        let i = i as usize;
        let q = &mut quota[labels[i] as usize];
        if *q > 0 {
            *q -= 1;
            test.push(i);
        } else {
            train.push(i);
        }
    }
    (train, test)
}

/// The `f32` value of each byte: `b / 255`.
fn byte_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    for (i, v) in t.iter_mut().enumerate() {
        *v = i as f32 / 255.0;
    }
    t
}

/// The samples at `order` (indices into `labels`), images scaled to `[0, 1]`.
pub fn gather(pixels: &[u8], labels: &[u8], sample_len: usize, order: &[usize]) -> Samples {
    let table = byte_table();
    let mut images = Vec::with_capacity(order.len() * sample_len);
    for &i in order {
        let img = &pixels[i * sample_len..(i + 1) * sample_len];
        images.extend(img.iter().map(|&b| table[b as usize]));
    }
    Samples {
        images,
        labels: order.iter().map(|&i| labels[i] as u32).collect(),
    }
}

/// All samples in file order, images scaled to `[0, 1]`.
pub fn all(pixels: &[u8], labels: &[u8]) -> Samples {
    let table = byte_table();
    Samples {
        images: pixels.iter().map(|&b| table[b as usize]).collect(),
        labels: labels.iter().map(|&l| l as u32).collect(),
    }
}

/// Keeps at most `limit` samples (the first ones).
pub fn truncate(samples: &mut Samples, limit: Option<usize>, sample_len: usize) {
    if let Some(n) = limit {
        if n < samples.len() {
            samples.labels.truncate(n);
            samples.images.truncate(n * sample_len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> Vec<u8> {
        // 0: 50, 1: 30, 2: 20 samples, in blocks.
        let mut l = vec![0u8; 50];
        l.extend(vec![1u8; 30]);
        l.extend(vec![2u8; 20]);
        l
    }

    #[test]
    fn split_is_a_stratified_partition() {
        let l = labels();
        let (train, test) = stratified(&l, 0.2, 1);
        assert_eq!((train.len(), test.len()), (80, 20));
        let mut all: Vec<usize> = train.iter().chain(&test).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..100).collect::<Vec<_>>());
        let per_class = |idx: &[usize], c: u8| idx.iter().filter(|&&i| l[i] == c).count();
        assert_eq!(
            [
                per_class(&test, 0),
                per_class(&test, 1),
                per_class(&test, 2)
            ],
            [10, 6, 4]
        );
    }

    #[test]
    fn split_depends_on_the_seed_only() {
        let l = labels();
        assert_eq!(stratified(&l, 0.3, 9), stratified(&l, 0.3, 9));
        // 0.5 of 50, 30, 20 — and of odd counts the total still rounds as a whole.
        assert_eq!(stratified(&l, 0.5, 9).1.len(), 50);
        assert_eq!(stratified(&[0, 0, 0, 1, 1, 1, 2], 0.5, 9).1.len(), 4);
        assert_ne!(stratified(&l, 0.3, 9).1, stratified(&l, 0.3, 10).1);
    }

    #[test]
    fn gather_scales_bytes_and_follows_the_order() {
        let pixels = [0u8, 255, 51, 102];
        let s = gather(&pixels, &[7, 8], 2, &[1, 0]);
        assert_eq!(s.labels, vec![8, 7]);
        assert_eq!(s.images, vec![0.2, 0.4, 0.0, 1.0]);
        assert_eq!(all(&pixels, &[7, 8]).images, vec![0.0, 1.0, 0.2, 0.4]);
    }

    #[test]
    fn truncate_keeps_the_first_samples() {
        let mut s = all(&[1, 2, 3, 4, 5, 6], &[0, 1, 2]);
        truncate(&mut s, Some(5), 2);
        assert_eq!(s.len(), 3);
        truncate(&mut s, Some(2), 2);
        assert_eq!((s.labels.clone(), s.images.len()), (vec![0, 1], 4));
    }
}
