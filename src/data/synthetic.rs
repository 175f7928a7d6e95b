//! Learnable synthetic images of any shape: a smooth random template per class, blended and noised per sample.
//!
//! Each class has a template made of a few Gaussian blobs per channel around mid-grey, values in
//! `[0, 1]`. A sample of class `c` is `(1 − λ)·template[c] + λ·template[o] + noise`, clipped to
//! `[0, 1]`, with `o` another random class, `λ` uniform in `[0, MAX_BLEND)` and Gaussian noise of
//! standard deviation `NOISE`. The class stays the nearest template, so linear models and MLPs
//! learn it well above chance, but the blending and noise keep it from being trivial. Labels
//! cycle through the classes and are then shuffled, so the classes are balanced to within one.
//!
//! Generation is cheap at any size. A blob is the product of a row Gaussian and a column
//! Gaussian, so templates are never stored: each sample computes its two templates row by row
//! from these one-dimensional profiles (kept for all classes when they are small, else computed
//! per tile of at most `TILE × TILE` pixels). The noise comes from a ziggurat. Every sample draws
//! from its own random stream, derived from the split's seed and the sample's index, so samples
//! are generated in parallel and the data is bit-identical whatever the number of threads.

use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::Mutex;

use super::Samples;
use crate::error::DataError;
use crate::rng::{derive, HostRng};

/// Gaussian blobs per channel of a template.
const BLOBS: usize = 6;
/// Largest weight of the other class's template in a sample.
const MAX_BLEND: f32 = 0.45;
/// Standard deviation of the per-pixel noise.
const NOISE: f64 = 0.3;
/// The blob profiles of all classes are computed once and kept when they take at most this many
/// `f32`s in all; otherwise each sample computes those it needs.
const CACHE_LIMIT: usize = 1 << 24;
/// Side of the tiles a sample's planes are generated in, which bounds the scratch memory.
const TILE: usize = 1024;
/// Values a block of samples handed to one thread holds at least (one sample at least).
const BLOCK_VALUES: usize = 1 << 16;

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

impl Blob {
    /// `amp·exp(−(y + ½ − cy)²·iy)`: the row profile, amplitude included.
    fn row(&self, y: usize) -> f32 {
        let d = y as f32 + 0.5 - self.cy;
        self.amp * (-d * d * self.iy).exp()
    }
    /// `exp(−(x + ½ − cx)²·ix)`: the column profile.
    fn column(&self, x: usize) -> f32 {
        let d = x as f32 + 0.5 - self.cx;
        (-d * d * self.ix).exp()
    }
}

/// The class templates, as blob parameters and, when small enough, as blob profiles.
struct Templates {
    shape: [usize; 3],
    blobs: Vec<Blob>,
    /// Per class, channel and blob: the row profile (`h` values), then the column profile (`w`).
    profiles: Option<Vec<f32>>,
}

impl Templates {
    fn new(
        shape: [usize; 3],
        classes: usize,
        seed: u64,
        cache_limit: usize,
    ) -> Result<Self, DataError> {
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
        let profiles = count
            .checked_mul(h + w)
            .filter(|&n| n <= cache_limit)
            .map(|n| {
                let mut p = Vec::with_capacity(n);
                for b in &blobs {
                    p.extend((0..h).map(|y| b.row(y)));
                    p.extend((0..w).map(|x| b.column(x)));
                }
                p
            });
        Ok(Templates {
            shape,
            blobs,
            profiles,
        })
    }

    /// Writes, for each blob of `class` in channel `ch`, its row profile over `ys` then its
    /// column profile over `xs` into `out` (`BLOBS·(ys.len() + xs.len())` values).
    fn tile_profiles(
        &self,
        class: usize,
        ch: usize,
        ys: Range<usize>,
        xs: Range<usize>,
        out: &mut [f32],
    ) {
        let [c, h, w] = self.shape;
        let first = (class * c + ch) * BLOBS;
        let step = ys.len() + xs.len();
        for (i, p) in out.chunks_exact_mut(step).take(BLOBS).enumerate() {
            let (py, px) = p.split_at_mut(ys.len());
            match &self.profiles {
                Some(all) => {
                    let blob = &all[(first + i) * (h + w)..(first + i + 1) * (h + w)];
                    py.copy_from_slice(&blob[ys.clone()]);
                    px.copy_from_slice(&blob[h + xs.start..h + xs.end]);
                }
                None => {
                    let b = &self.blobs[first + i];
                    for (v, y) in py.iter_mut().zip(ys.clone()) {
                        *v = b.row(y);
                    }
                    for (v, x) in px.iter_mut().zip(xs.clone()) {
                        *v = b.column(x);
                    }
                }
            }
        }
    }

    /// The template of `class` (`c·h·w` values).
    #[cfg(test)]
    fn template(&self, class: usize) -> Vec<f32> {
        let [c, h, w] = self.shape;
        let mut out = vec![0.0; c * h * w];
        let mut prof = vec![0.0; BLOBS * (h + w)];
        for ch in 0..c {
            self.tile_profiles(class, ch, 0..h, 0..w, &mut prof);
            for (y, row) in out[ch * h * w..(ch + 1) * h * w]
                .chunks_exact_mut(w)
                .enumerate()
            {
                template_row(&prof, h, y, row);
            }
        }
        out
    }
}

/// One row of a template tile: `0.5 + Σ row[y]·column`, clipped to `[0, 1]`, from the tile's
/// profiles (`prof`, as written by `Templates::tile_profiles`, with `th` rows).
fn template_row(prof: &[f32], th: usize, y: usize, row: &mut [f32]) {
    let n = row.len();
    let mut a = [0.0f32; BLOBS];
    let mut g: [&[f32]; BLOBS] = [&[]; BLOBS];
    for (i, p) in prof.chunks_exact(th + n).take(BLOBS).enumerate() {
        a[i] = p[y];
        g[i] = &p[th..];
    }
    // One pass, adding the blobs in order.
    let [g0, g1, g2, g3, g4, g5] = g;
    let it = row
        .iter_mut()
        .zip(g0)
        .zip(g1)
        .zip(g2)
        .zip(g3)
        .zip(g4)
        .zip(g5);
    for ((((((v, &x0), &x1), &x2), &x3), &x4), &x5) in it {
        let t = 0.5 + a[0] * x0 + a[1] * x1 + a[2] * x2 + a[3] * x3 + a[4] * x4 + a[5] * x5;
        *v = t.clamp(0.0, 1.0);
    }
}

/// Normal numbers by Marsaglia and Tsang's ziggurat with 256 layers, 32 random bits a number in
/// the common case: 8 pick the layer, 1 the sign and 23 the position in the layer.
struct Ziggurat {
    /// The standard deviation of the numbers drawn.
    scale: f64,
    /// Below this 23-bit position, a draw in the layer is inside the curve.
    k: [u32; 256],
    /// Width of a 23-bit position step in each layer, for a standard normal.
    w: [f64; 256],
    /// `w` times `scale`, for the common case.
    ws: [f32; 256],
    /// Density at the layer's outer edge (unnormalised).
    f: [f64; 256],
}

impl Ziggurat {
    /// Where the tail begins.
    const R: f64 = 3.654_152_885_361_009;
    /// Area of each layer (unnormalised density).
    const V: f64 = 4.928_673_233_99e-3;
    const M: f64 = (1u32 << 23) as f64;

    /// Draws normal numbers of standard deviation `scale`.
    fn new(scale: f64) -> Self {
        let f = |x: f64| (-0.5 * x * x).exp();
        let (r, v, m) = (Self::R, Self::V, Self::M);
        let mut z = Ziggurat {
            scale,
            k: [0; 256],
            w: [0.0; 256],
            ws: [0.0; 256],
            f: [0.0; 256],
        };
        let q = v / f(r);
        z.k[0] = (r / q * m) as u32;
        z.w[0] = q / m;
        z.w[255] = r / m;
        z.f[0] = 1.0;
        z.f[255] = f(r);
        let (mut dn, mut tn) = (r, r);
        for i in (1..255).rev() {
            dn = (-2.0 * (v / dn + f(dn)).ln()).sqrt();
            z.k[i + 1] = (dn / tn * m) as u32;
            tn = dn;
            z.f[i] = f(dn);
            z.w[i] = dn / m;
        }
        for (ws, &w) in z.ws.iter_mut().zip(&z.w) {
            *ws = (scale * w) as f32;
        }
        z
    }

    /// Fills `out` with normal numbers.
    fn fill(&self, rng: &mut HostRng, out: &mut [f32]) {
        let mut pairs = out.chunks_exact_mut(2);
        for p in &mut pairs {
            let bits = rng.next_u64();
            p[0] = self.draw(bits as u32, rng);
            p[1] = self.draw((bits >> 32) as u32, rng);
        }
        for v in pairs.into_remainder() {
            *v = self.draw(rng.next_u64() as u32, rng);
        }
    }

    #[inline(always)]
    fn draw(&self, bits: u32, rng: &mut HostRng) -> f32 {
        let i = (bits & 0xff) as usize;
        let u = bits >> 9;
        if u < self.k[i] {
            // Bit 8 becomes the sign bit.
            f32::from_bits((u as f32 * self.ws[i]).to_bits() ^ ((bits & 0x100) << 23))
        } else {
            (self.scale * self.slow(bits, rng)) as f32
        }
    }

    /// A standard normal in the rare case: the base layer's tail, or a layer's wedge outside its
    /// inner rectangle.
    #[cold]
    fn slow(&self, mut bits: u32, rng: &mut HostRng) -> f64 {
        loop {
            let i = (bits & 0xff) as usize;
            let u = bits >> 9;
            let sign = if bits & 0x100 != 0 { -1.0 } else { 1.0 };
            if u < self.k[i] {
                return sign * (u as f64 * self.w[i]);
            }
            if i == 0 {
                loop {
                    let x = -rng.next_f64().max(f64::MIN_POSITIVE).ln() / Self::R;
                    let y = -rng.next_f64().max(f64::MIN_POSITIVE).ln();
                    if y + y >= x * x {
                        return sign * (Self::R + x);
                    }
                }
            }
            let x = u as f64 * self.w[i];
            if self.f[i] + rng.next_f64() * (self.f[i - 1] - self.f[i]) < (-0.5 * x * x).exp() {
                return sign * x;
            }
            bits = rng.next_u64() as u32;
        }
    }
}

/// Per-thread buffers for generating samples tile by tile.
struct Scratch {
    own: Vec<f32>,
    other: Vec<f32>,
    row_own: Vec<f32>,
    row_other: Vec<f32>,
    noise: Vec<f32>,
}

impl Scratch {
    fn new(shape: [usize; 3]) -> Self {
        let (th, tw) = (shape[1].min(TILE), shape[2].min(TILE));
        Scratch {
            own: vec![0.0; BLOBS * (th + tw)],
            other: vec![0.0; BLOBS * (th + tw)],
            row_own: vec![0.0; tw],
            row_other: vec![0.0; tw],
            noise: vec![0.0; tw],
        }
    }
}

/// What one split is generated from.
struct Source<'a> {
    templates: &'a Templates,
    normal: &'a Ziggurat,
    classes: usize,
    seed: u64,
}

impl Source<'_> {
    /// Writes every value of sample `index` of class `class` into `out` (`c·h·w` values), from
    /// the sample's own random stream.
    fn sample(&self, index: usize, class: usize, out: &mut [MaybeUninit<f32>], s: &mut Scratch) {
        let mut rng = HostRng::new(derive(self.seed, index as u64));
        let other = (class + 1 + rng.below(self.classes - 1)) % self.classes;
        let lambda = rng.uniform_f32(0.0, MAX_BLEND);
        let [_, h, w] = self.templates.shape;
        for (ch, plane) in out.chunks_exact_mut(h * w).enumerate() {
            for y0 in (0..h).step_by(TILE) {
                let ys = y0..(y0 + TILE).min(h);
                for x0 in (0..w).step_by(TILE) {
                    let xs = x0..(x0 + TILE).min(w);
                    let (th, tw) = (ys.len(), xs.len());
                    let n = BLOBS * (th + tw);
                    let t = self.templates;
                    t.tile_profiles(class, ch, ys.clone(), xs.clone(), &mut s.own[..n]);
                    t.tile_profiles(other, ch, ys.clone(), xs.clone(), &mut s.other[..n]);
                    for y in ys.clone() {
                        let row_own = &mut s.row_own[..tw];
                        let row_other = &mut s.row_other[..tw];
                        let noise = &mut s.noise[..tw];
                        template_row(&s.own[..n], th, y - y0, row_own);
                        template_row(&s.other[..n], th, y - y0, row_other);
                        self.normal.fill(&mut rng, noise);
                        let dst = &mut plane[y * w + xs.start..y * w + xs.end];
                        for (((d, &a), &b), &e) in
                            dst.iter_mut().zip(&*row_own).zip(&*row_other).zip(&*noise)
                        {
                            d.write(((1.0 - lambda) * a + lambda * b + e).clamp(0.0, 1.0));
                        }
                    }
                }
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
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    generate_with(
        shape,
        classes,
        [train_n, test_n],
        seed,
        CACHE_LIMIT,
        threads,
    )
}

/// [`generate`] with the profile cache's limit and the most threads to use.
fn generate_with(
    shape: [usize; 3],
    classes: usize,
    [train_n, test_n]: [usize; 2],
    seed: u64,
    cache_limit: usize,
    threads: usize,
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
    let templates = Templates::new(shape, classes, seed, cache_limit)?;
    let normal = Ziggurat::new(NOISE);
    let source = |stream| Source {
        templates: &templates,
        normal: &normal,
        classes,
        seed: derive(seed, stream),
    };
    let train = split(&source(TRAIN_STREAM), len, train_n, threads)?;
    let test = split(&source(TEST_STREAM), len, test_n, threads)?;
    Ok((train, test))
}

/// `n` samples of `len` values, in blocks of samples shared out among at most `threads` threads.
fn split(source: &Source, len: usize, n: usize, threads: usize) -> Result<Samples, DataError> {
    let what = format!("{n} samples of {len} values");
    let total = n
        .checked_mul(len)
        .ok_or_else(|| too_big(&what, usize::MAX))?;
    let mut images = Vec::new();
    images
        .try_reserve_exact(total)
        .map_err(|_| too_big(&what, total))?;
    let mut rng = HostRng::new(source.seed);
    let mut labels: Vec<u32> = (0..n).map(|i| (i % source.classes) as u32).collect();
    rng.shuffle(&mut labels);

    let block = (BLOCK_VALUES / len).max(1);
    let blocks = n.div_ceil(block);
    let work = Mutex::new(
        images.spare_capacity_mut()[..total]
            .chunks_mut(block * len)
            .zip(labels.chunks(block))
            .enumerate(),
    );
    let run = || {
        let mut scratch = Scratch::new(source.templates.shape);
        loop {
            let next = work.lock().unwrap_or_else(|e| e.into_inner()).next();
            let Some((b, (out, labels))) = next else {
                break;
            };
            for (i, (out, &label)) in out.chunks_exact_mut(len).zip(labels).enumerate() {
                source.sample(b * block + i, label as usize, out, &mut scratch);
            }
        }
    };
    let threads = threads.clamp(1, blocks.max(1));
    if threads == 1 {
        run();
    } else {
        std::thread::scope(|s| {
            // A thread that cannot be started leaves its blocks to the others: same data.
            for _ in 1..threads {
                let _ = std::thread::Builder::new().spawn_scoped(s, run);
            }
            run();
        });
    }
    // SAFETY: the blocks partition the first `total` values of the spare capacity, the workers
    // stop only once every block has been taken (a panicking worker panics out of `run` or of
    // the scope, before this line), and `sample` writes all `len` values of each sample: its
    // planes, their tiles and the tiles' rows partition the sample.
    unsafe { images.set_len(total) };
    Ok(Samples { images, labels })
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
    fn same_data_whatever_the_threads_and_the_profile_cache() {
        // Tiles smaller than the planes, an odd thread count and several blocks per thread.
        let shape = [2, TILE + 3, 5];
        let (train, test) = generate_with(shape, 3, [40, 7], 8, CACHE_LIMIT, 1).unwrap();
        for (limit, threads) in [(CACHE_LIMIT, 3), (0, 1), (0, 4)] {
            let other = generate_with(shape, 3, [40, 7], 8, limit, threads).unwrap();
            assert!(other == (train.clone(), test.clone()), "{limit} {threads}");
        }
        let t = Templates::new(shape, 3, 8, CACHE_LIMIT).unwrap();
        assert!(t.profiles.is_some());
        assert!(Templates::new(shape, 3, 8, 0).unwrap().profiles.is_none());
        // Many small samples a block, several blocks.
        let a = generate_with([1, 4, 4], 5, [9000, 3], 2, CACHE_LIMIT, 1).unwrap();
        assert_eq!(
            a,
            generate_with([1, 4, 4], 5, [9000, 3], 2, CACHE_LIMIT, 2).unwrap()
        );
    }

    #[test]
    fn the_label_is_the_nearest_template() {
        let (shape, classes, len) = ([3, 16, 16], 12, 768);
        let (train, _) = generate(shape, classes, 600, 1, 21).unwrap();
        let t = Templates::new(shape, classes, 21, CACHE_LIMIT).unwrap();
        let templates: Vec<Vec<f32>> = (0..classes).map(|c| t.template(c)).collect();
        let nearest = |img: &[f32]| {
            let dist = |c: usize| -> f64 {
                img.iter()
                    .zip(&templates[c])
                    .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
                    .sum()
            };
            (0..classes)
                .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
                .unwrap()
        };
        let hits = train
            .images
            .chunks_exact(len)
            .zip(&train.labels)
            .filter(|(img, &l)| nearest(img) == l as usize)
            .count();
        assert!(
            hits >= 588,
            "{hits} of 600 samples are nearest their own template"
        );
        // The noise is there: samples are far from their template.
        let img = &train.images[..len];
        let own = &templates[train.labels[0] as usize];
        let rms = (img
            .iter()
            .zip(own)
            .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
            .sum::<f64>()
            / len as f64)
            .sqrt();
        assert!(rms > 0.15, "rms distance to the template {rms}");
    }

    #[test]
    fn ziggurat_draws_standard_normals() {
        let z = Ziggurat::new(1.0);
        let mut rng = HostRng::new(3);
        let n = 1 << 22;
        let mut xs = vec![0.0f32; n];
        z.fill(&mut rng, &mut xs);
        let mean = xs.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
        let var = xs.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.002, "mean {mean}");
        assert!((var - 1.0).abs() < 0.003, "variance {var}");
        // Two-sided tail probabilities P(|x| > t), including the ziggurat's tail beyond R.
        for (t, p) in [
            (0.5, 0.617_075),
            (1.0, 0.317_311),
            (2.0, 0.045_500),
            (3.0, 0.002_700),
            (Ziggurat::R, 2.58e-4),
        ] {
            let count = xs.iter().filter(|&&x| (x as f64).abs() > t).count() as f64;
            let expected = p * n as f64;
            let sigma = (expected * (1.0 - p)).sqrt();
            assert!(
                (count - expected).abs() < 5.0 * sigma,
                "P(|x| > {t}): {count} draws, {expected:.0} expected"
            );
        }
        let positive = xs.iter().filter(|&&x| x > 0.0).count() as f64 / n as f64;
        assert!((positive - 0.5).abs() < 0.002, "{positive}");
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
