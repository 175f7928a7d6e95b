//! Learnable synthetic images of any shape: a smooth random template per class, blended and noised per sample.
//!
//! Each class has a template made of a few Gaussian blobs per channel around mid-grey, values in
//! `[0, 1]`. A sample of class `c` is `(1 − λ)·template[c] + λ·template[o] + noise`, clipped to
//! `[0, 1]`, with `o` another random class, `λ` uniform in `[0, MAX_BLEND)` and Gaussian noise of
//! standard deviation `NOISE`. The class stays the nearest template, so linear models and MLPs
//! learn it well above chance, but the blending and noise keep it from being trivial. Labels
//! cycle through the classes and are then shuffled, so the classes are balanced to within one.

use super::Samples;
use crate::engine::rng::{derive, HostRng};
use crate::error::DataError;

/// Gaussian blobs per channel of a template.
const BLOBS: usize = 6;
/// Largest weight of the other class's template in a sample.
const MAX_BLEND: f32 = 0.45;
/// Standard deviation of the per-pixel noise.
const NOISE: f64 = 0.3;
/// Templates are computed once and kept when they take at most this many `f32`s in all.
const CACHE_LIMIT: usize = 1 << 24;

const TEMPLATE_STREAM: u64 = u64::from_le_bytes(*b"template");
const TRAIN_STREAM: u64 = u64::from_le_bytes(*b"train\0\0\0");
const TEST_STREAM: u64 = u64::from_le_bytes(*b"test\0\0\0\0");

/// One Gaussian blob: centre, inverse squared radii, signed amplitude.
#[derive(Clone, Copy, Debug)]
struct Blob {
    cy: f32,
    cx: f32,
    iy: f32,
    ix: f32,
    amp: f32,
}

/// The class templates, as blob parameters and, when small enough, as pixels.
struct Templates {
    shape: [usize; 3],
    blobs: Vec<Blob>,
    cache: Option<Vec<f32>>,
}

impl Templates {
    fn new(shape: [usize; 3], classes: usize, seed: u64) -> Result<Self, DataError> {
        let mut rng = HostRng::new(derive(seed, TEMPLATE_STREAM));
        let [c, h, w] = shape;
        let count = classes
            .checked_mul(c)
            .and_then(|n| n.checked_mul(BLOBS))
            .ok_or_else(|| too_big("templates", usize::MAX))?;
        let mut blobs = Vec::new();
        blobs
            .try_reserve_exact(count)
            .map_err(|_| too_big("templates", count))?;
        for _ in 0..count {
            let ry = (h as f32 * rng.uniform_f32(0.12, 0.35)).max(0.75);
            let rx = (w as f32 * rng.uniform_f32(0.12, 0.35)).max(0.75);
            let amp = rng.uniform_f32(0.4, 1.0) * if rng.below(2) == 0 { -1.0 } else { 1.0 };
            blobs.push(Blob {
                cy: rng.uniform_f32(0.0, h as f32),
                cx: rng.uniform_f32(0.0, w as f32),
                iy: 1.0 / (ry * ry),
                ix: 1.0 / (rx * rx),
                amp,
            });
        }
        let mut t = Templates {
            shape,
            blobs,
            cache: None,
        };
        let len = c * h * w;
        if classes.saturating_mul(len) <= CACHE_LIMIT {
            let mut cache = vec![0.0; classes * len];
            for (class, out) in cache.chunks_exact_mut(len).enumerate() {
                t.compute(class, out);
            }
            t.cache = Some(cache);
        }
        Ok(t)
    }

    /// Writes the template of `class` into `out` (`c·h·w` values).
    fn compute(&self, class: usize, out: &mut [f32]) {
        let [c, h, w] = self.shape;
        let mut gy = vec![0.0f32; h];
        let mut gx = vec![0.0f32; w];
        for ch in 0..c {
            let plane = &mut out[ch * h * w..(ch + 1) * h * w];
            plane.fill(0.5);
            let first = (class * c + ch) * BLOBS;
            for b in &self.blobs[first..first + BLOBS] {
                for (y, g) in gy.iter_mut().enumerate() {
                    let d = y as f32 + 0.5 - b.cy;
                    *g = b.amp * (-d * d * b.iy).exp();
                }
                for (x, g) in gx.iter_mut().enumerate() {
                    let d = x as f32 + 0.5 - b.cx;
                    *g = (-d * d * b.ix).exp();
                }
                for (row, &vy) in plane.chunks_exact_mut(w).zip(&gy) {
                    for (v, &vx) in row.iter_mut().zip(&gx) {
                        *v += vy * vx;
                    }
                }
            }
            for v in plane.iter_mut() {
                *v = v.clamp(0.0, 1.0);
            }
        }
    }

    /// The template of `class`, from the cache or computed into `scratch`.
    fn get<'a>(&'a self, class: usize, scratch: &'a mut [f32]) -> &'a [f32] {
        match &self.cache {
            Some(cache) => &cache[class * scratch.len()..(class + 1) * scratch.len()],
            None => {
                self.compute(class, scratch);
                scratch
            }
        }
    }
}

/// Generates `(train, test)` with `train_n` and `test_n` samples of `shape` in `classes` classes.
/// The templates depend on `seed` only, and each split has its own stream, so changing one
/// split's size does not change the other split.
pub fn generate(
    shape: [usize; 3],
    classes: usize,
    train_n: usize,
    test_n: usize,
    seed: u64,
) -> Result<(Samples, Samples), DataError> {
    let len = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&l| l > 0)
        .ok_or_else(|| DataError::Invalid(format!("synthetic shape {shape:?} is not usable")))?;
    if classes < 2 {
        return Err(DataError::Invalid(format!(
            "synthetic data needs at least 2 classes, got {classes}"
        )));
    }
    let templates = Templates::new(shape, classes, seed)?;
    let train = split(
        &templates,
        classes,
        len,
        train_n,
        derive(seed, TRAIN_STREAM),
    )?;
    let test = split(&templates, classes, len, test_n, derive(seed, TEST_STREAM))?;
    Ok((train, test))
}

fn split(
    templates: &Templates,
    classes: usize,
    len: usize,
    n: usize,
    seed: u64,
) -> Result<Samples, DataError> {
    let what = format!("{n} samples of {len} values");
    let total = n
        .checked_mul(len)
        .ok_or_else(|| too_big(&what, usize::MAX))?;
    let mut images = Vec::new();
    images
        .try_reserve_exact(total)
        .map_err(|_| too_big(&what, total))?;
    let mut rng = HostRng::new(seed);
    let mut labels: Vec<u32> = (0..n).map(|i| (i % classes) as u32).collect();
    rng.shuffle(&mut labels);
    let (mut own, mut other) = if templates.cache.is_some() {
        (vec![0.0f32; len], vec![0.0f32; len])
    } else {
        (zeros(len)?, zeros(len)?)
    };
    for &label in &labels {
        let c = label as usize;
        let o = (c + 1 + rng.below(classes - 1)) % classes;
        let lambda = rng.uniform_f32(0.0, MAX_BLEND);
        let tc = templates.get(c, &mut own);
        let to = templates.get(o, &mut other);
        images.extend(tc.iter().zip(to).map(|(&a, &b)| {
            let v = (1.0 - lambda) * a + lambda * b + (NOISE * rng.normal()) as f32;
            v.clamp(0.0, 1.0)
        }));
    }
    Ok(Samples { images, labels })
}

/// A zeroed buffer, or an error instead of an abort when memory runs out.
fn zeros(len: usize) -> Result<Vec<f32>, DataError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| too_big("a template buffer", len))?;
    v.resize(len, 0.0);
    Ok(v)
}

fn too_big(what: &str, elements: usize) -> DataError {
    DataError::Invalid(format!(
        "synthetic data: cannot allocate {what} ({:.1} GiB)",
        elements as f64 * 4.0 / (1u64 << 30) as f64
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test accuracy of the nearest class mean (a linear classifier) fitted on `train`.
    fn nearest_mean_accuracy(train: &Samples, test: &Samples, len: usize, classes: usize) -> f64 {
        let mut means = vec![0.0f64; classes * len];
        let mut counts = vec![0usize; classes];
        for (img, &l) in train.images.chunks_exact(len).zip(&train.labels) {
            counts[l as usize] += 1;
            for (m, &v) in means[l as usize * len..].iter_mut().zip(img) {
                *m += v as f64;
            }
        }
        for (c, &n) in counts.iter().enumerate() {
            for m in &mut means[c * len..(c + 1) * len] {
                *m /= n.max(1) as f64;
            }
        }
        let correct = test
            .images
            .chunks_exact(len)
            .zip(&test.labels)
            .filter(|(img, &l)| {
                let dist = |c: usize| -> f64 {
                    let m = &means[c * len..(c + 1) * len];
                    img.iter()
                        .zip(m)
                        .map(|(&v, &m)| (v as f64 - m).powi(2))
                        .sum()
                };
                let best = (0..classes)
                    .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
                    .unwrap();
                best == l as usize
            })
            .count();
        correct as f64 / test.len() as f64
    }

    #[test]
    fn deterministic_shaped_and_in_range() {
        let (a, b) = generate([2, 5, 7], 4, 30, 10, 3).unwrap();
        assert_eq!((a.len(), b.len()), (30, 10));
        assert_eq!((a.images.len(), b.images.len()), (30 * 70, 10 * 70));
        assert!(a
            .images
            .iter()
            .chain(&b.images)
            .all(|v| (0.0..=1.0).contains(v)));
        assert!(a.labels.iter().chain(&b.labels).all(|&l| l < 4));
        let (a2, b2) = generate([2, 5, 7], 4, 30, 10, 3).unwrap();
        assert_eq!((&a, &b), (&a2, &b2));
        let (a3, _) = generate([2, 5, 7], 4, 30, 10, 4).unwrap();
        assert_ne!(a.images, a3.images);
        // The test split does not depend on the training size.
        let (_, b4) = generate([2, 5, 7], 4, 31, 10, 3).unwrap();
        assert_eq!(b, b4);
    }

    #[test]
    fn classes_are_balanced() {
        let (a, _) = generate([1, 4, 4], 10, 1003, 1, 0).unwrap();
        let mut counts = [0usize; 10];
        for &l in &a.labels {
            counts[l as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c == 100 || c == 101), "{counts:?}");
    }

    #[test]
    fn learnable_well_above_chance_but_not_trivially() {
        let (train, test) = generate([1, 28, 28], 10, 2000, 1000, 11).unwrap();
        let acc = nearest_mean_accuracy(&train, &test, 784, 10);
        println!("synthetic 28×28, 10 classes: nearest-mean test accuracy {acc:.3}");
        assert!(acc > 0.6 && acc < 0.999, "accuracy {acc}");
    }

    #[test]
    fn uncached_templates_match_cached_ones() {
        let t = Templates::new([3, 6, 5], 7, 5).unwrap();
        let cache = t.cache.clone().unwrap();
        let uncached = Templates {
            cache: None,
            ..Templates::new([3, 6, 5], 7, 5).unwrap()
        };
        let mut scratch = vec![0.0; 90];
        for c in 0..7 {
            assert_eq!(uncached.get(c, &mut scratch), &cache[c * 90..(c + 1) * 90]);
        }
    }

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        // n × len overflows usize; n × len × 4 bytes overflows isize.
        for n in [usize::MAX / 4, 1 << 34] {
            let e = generate([1, 1 << 14, 1 << 14], 10, n, 1, 0).unwrap_err();
            assert!(e.to_string().contains("cannot allocate"), "{e}");
        }
    }

    #[test]
    fn tiny_shapes_work() {
        let (a, b) = generate([1, 1, 1], 2, 5, 3, 0).unwrap();
        assert_eq!((a.images.len(), b.images.len()), (5, 3));
    }
}
