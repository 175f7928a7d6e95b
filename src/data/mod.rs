//! Datasets: where they come from (job `data:` section), how they are read, and the held-out split.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::error::DataError;

pub mod cifar;
pub mod embedded;
pub mod holdout;
pub mod idx;
pub mod input_file;
pub mod synthetic;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

/// Fraction of a single-file dataset held out for testing unless `test_fraction` says otherwise.
pub const DEFAULT_TEST_FRACTION: f64 = 0.2;
/// Where the Debian package `dataset-fashion-mnist` installs its files.
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";
/// Largest synthetic sample, in elements.
pub const MAX_SAMPLE_ELEMENTS: usize = 1 << 28;
/// Most synthetic classes.
pub const MAX_CLASSES: usize = 100_000;
/// Most `f32` values synthetic data may hold, training and test samples together (16 GiB).
pub const MAX_SYNTHETIC_VALUES: u64 = 1 << 32;
/// Synthetic sample shape unless `shape` says otherwise.
pub const DEFAULT_SHAPE: [usize; 3] = [1, 28, 28];
/// Synthetic classes unless `classes` says otherwise.
pub const DEFAULT_CLASSES: usize = 10;
/// Synthetic training samples unless `train_samples` says otherwise.
pub const DEFAULT_TRAIN_SAMPLES: usize = 8000;
/// Synthetic test samples unless `test_samples` says otherwise.
pub const DEFAULT_TEST_SAMPLES: usize = 2000;

/// File stems of a folder with its own test set: training images and labels, then test ones.
const OFFICIAL: [&str; 4] = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
];
/// File stems of a folder with one set, split by `test_fraction`.
const SINGLE: [&str; 2] = ["images-idx3-ubyte", "labels-idx1-ubyte"];

/// Names the embedded MNIST-10k files in error messages.
const EMBEDDED_IMAGES: &str = "<built-in>/mnist-10k/images-idx3-ubyte.gz";
const EMBEDDED_LABELS: &str = "<built-in>/mnist-10k/labels-idx1-ubyte.gz";

const FASHION_MNIST_HINT: &str = ": install Fashion-MNIST with `apt-get install dataset-fashion-mnist` \
(Debian/Ubuntu, files under /usr/share/datasets/fashion-mnist), or set `path` to a folder holding \
train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte \
(each may end in .gz)";
const MNIST_10K_HINT: &str = ": the folder must hold images-idx3-ubyte and labels-idx1-ubyte \
(each may end in .gz); leave `path` unset to use the copy built into gpumux";
const IDX_HINT: &str =
    ": an idx folder holds either train-images-idx3-ubyte, train-labels-idx1-ubyte, \
t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, or images-idx3-ubyte and labels-idx1-ubyte \
(each may end in .gz)";

/// Where a dataset comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// The 10,000 real MNIST digits shipped in `data/mnist-10k` (and embedded in the binary).
    #[serde(rename = "mnist-10k")]
    Mnist10k,
    /// Fashion-MNIST in IDX files, by default under `/usr/share/datasets/fashion-mnist`.
    FashionMnist,
    /// Any MNIST-style IDX folder given by `path`.
    Idx,
    /// CIFAR-10, binary version: a folder given by `path` with `data_batch_1.bin` … `data_batch_5.bin`
    /// and `test_batch.bin` (or its subfolder `cifar-10-batches-bin`).
    #[serde(rename = "cifar10")]
    Cifar10,
    /// Learnable synthetic images of any shape, generated from the seed.
    Synthetic,
}

/// The `data:` section of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    pub source: Source,
    /// A folder (for `idx`, of IDX files; for `cifar10`, of the CIFAR-10 binary batches). Relative
    /// paths are taken from `--data-dir`, else from the current directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Fraction held out for testing when the source has no separate test files (default 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_fraction: Option<f64>,
    /// Use at most this many training samples (after the split).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_limit: Option<usize>,
    /// Use at most this many test samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_limit: Option<usize>,
    /// Synthetic only: sample shape `[channels, height, width]` (default `[1, 28, 28]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<[usize; 3]>,
    /// Synthetic: number of classes (default 10). Idx: the number of classes, when some have no
    /// sample (by default the labels must run from 0 with none missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<usize>,
    /// Synthetic only: training samples (default 8000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_samples: Option<usize>,
    /// Synthetic only: test samples (default 2000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_samples: Option<usize>,
    /// Standardise pixels with the training split's mean and standard deviation, per channel
    /// (default true), as PyTorch's MNIST example does with `Normalize((0.1307,), (0.3081,))` and
    /// CIFAR-10 recipes do with one mean and one standard deviation per colour plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<bool>,
    /// Zero-pad every image, centred, to `[height, width]` (e.g. 28×28 digits to 32×32), as
    /// torchvision's `Pad` does before `Normalize`: the border is pixel value 0, standardised like
    /// any other pixel with the moments of the unpadded training images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_to: Option<[usize; 2]>,
}

/// Samples of one split: images as `f32` (`byte/255`, zero-padded to `pad_to` if set, then standardised
/// per channel unless `normalize: false`), `n × (c·h·w)`, and their labels.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples {
    pub images: Vec<f32>,
    pub labels: Vec<u32>,
}

impl Samples {
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// A loaded dataset: the training split and the held-out test split.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// A short name for reports, e.g. `mnist-10k`.
    pub name: String,
    /// `[channels, height, width]`.
    pub shape: [usize; 3],
    pub classes: usize,
    pub train: Samples,
    pub test: Samples,
}

impl Dataset {
    /// Elements per sample (`c·h·w`).
    pub fn sample_len(&self) -> usize {
        self.shape.iter().product()
    }

    /// The training split's pixel mean and standard deviation (over every pixel, computed in f64).
    pub fn train_moments(&self) -> (f64, f64) {
        let n = self.train.images.len().max(1) as f64;
        let mean = self.train.images.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = self
            .train
            .images
            .iter()
            .map(|&x| (x as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean, var.sqrt())
    }

    /// The training split's mean and standard deviation of each channel (in f64). With one
    /// channel this is [`train_moments`](Self::train_moments).
    pub fn channel_moments(&self) -> Vec<(f64, f64)> {
        let [channels, h, w] = self.shape;
        let plane = (h * w).max(1);
        let planes = |c: usize| {
            self.train
                .images
                .chunks_exact(plane)
                .skip(c)
                .step_by(channels.max(1))
        };
        (0..channels)
            .map(|c| {
                let n = (self.train.len() * plane).max(1) as f64;
                let mean = planes(c).flatten().map(|&x| x as f64).sum::<f64>() / n;
                let var = planes(c)
                    .flatten()
                    .map(|&x| (x as f64 - mean).powi(2))
                    .sum::<f64>()
                    / n;
                (mean, var.sqrt())
            })
            .collect()
    }

    /// Standardises both splits, channel by channel, with the training split's moments (a
    /// constant channel is left centred).
    pub fn standardize(&mut self) {
        let moments = self.channel_moments();
        self.standardize_with(&moments);
    }

    /// Standardises both splits with one `(mean, standard deviation)` per channel.
    fn standardize_with(&mut self, moments: &[(f64, f64)]) {
        let plane = (self.shape[1] * self.shape[2]).max(1);
        let images = self
            .train
            .images
            .chunks_exact_mut(plane)
            .chain(self.test.images.chunks_exact_mut(plane));
        for (values, &(mean, std)) in images.zip(moments.iter().cycle()) {
            let scale = if std > 1e-12 { 1.0 / std } else { 1.0 };
            for x in values {
                *x = ((*x as f64 - mean) * scale) as f32;
            }
        }
    }

    /// Checks that every label of both splits is a class of the dataset (below `classes`): the
    /// one check every backend relies on, made when the data is loaded.
    pub fn check_labels(&self) -> Result<(), DataError> {
        for (what, set) in [("training", &self.train), ("test", &self.test)] {
            if let Some((i, l)) = set
                .labels
                .iter()
                .enumerate()
                .find(|(_, &l)| l as usize >= self.classes)
            {
                return Err(DataError::Invalid(format!(
                    "{}: {what} sample {i} has label {l}, not below the number of classes ({})",
                    self.name, self.classes
                )));
            }
        }
        Ok(())
    }

    /// Pads every image of both splits with zeros to `height × width`, centred: the top and left
    /// borders get half the extra rows and columns, rounded down, and the bottom and right ones
    /// the rest (as torchvision's `CenterCrop` pads an image smaller than its size).
    pub fn pad(&mut self, [height, width]: [usize; 2]) -> Result<(), DataError> {
        let [channels, h, w] = self.shape;
        if height < h || width < w {
            return Err(DataError::Invalid(format!(
                "`pad_to` [{height}, {width}] is smaller than the {} images, {h}×{w}: padding cannot crop",
                self.name
            )));
        }
        if (height, width) == (h, w) {
            return Ok(());
        }
        let len = [channels, height, width]
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .filter(|&n| n <= MAX_SAMPLE_ELEMENTS)
            .ok_or_else(|| {
                DataError::Invalid(format!(
                    "`pad_to` [{height}, {width}] makes {channels}×{height}×{width} samples, more \
                     than 2^28 ({MAX_SAMPLE_ELEMENTS}) elements each"
                ))
            })?;
        let (top, left) = ((height - h) / 2, (width - w) / 2);
        for samples in [&mut self.train, &mut self.test] {
            let mut padded = Vec::new();
            let total = samples.len().checked_mul(len);
            if total
                .map(|n| padded.try_reserve_exact(n).is_err())
                .unwrap_or(true)
            {
                return Err(DataError::Invalid(format!(
                    "`pad_to` [{height}, {width}]: {} samples of {len} elements do not fit in memory",
                    samples.len()
                )));
            }
            padded.resize(samples.len() * len, 0.0f32);
            let out_planes = padded.chunks_exact_mut((height * width).max(1));
            for (src, dst) in samples.images.chunks_exact((h * w).max(1)).zip(out_planes) {
                for (row, src_row) in src.chunks_exact(w.max(1)).enumerate() {
                    let start = (top + row) * width + left;
                    dst[start..start + w].copy_from_slice(src_row);
                }
            }
            samples.images = padded;
        }
        self.shape = [channels, height, width];
        Ok(())
    }
}

impl DataSpec {
    /// A spec for a source with every option at its default.
    pub fn of(source: Source) -> Self {
        DataSpec {
            source,
            path: None,
            test_fraction: None,
            train_limit: None,
            test_limit: None,
            shape: None,
            classes: None,
            train_samples: None,
            test_samples: None,
            normalize: None,
            pad_to: None,
        }
    }

    /// Checks the values that need no file system. On error returns `(key, message)`, the key
    /// relative to the `data:` section.
    pub fn validate(&self) -> Result<(), (String, String)> {
        fn fail(key: &str, message: impl Into<String>) -> Result<(), (String, String)> {
            Err((key.to_string(), message.into()))
        }
        let source = self.source.name();
        let synthetic = self.source == Source::Synthetic;
        match (self.source, &self.path) {
            (Source::Idx, None) => {
                return fail("path", "is required for source idx (a folder of IDX files)")
            }
            (Source::Cifar10, None) => return fail(
                "path",
                "is required for source cifar10 (the folder of data_batch_1.bin … test_batch.bin)",
            ),
            (Source::Synthetic, Some(_)) => {
                return fail("path", "does not apply to source synthetic")
            }
            _ => {}
        }
        if let Some(f) = self.test_fraction {
            if matches!(
                self.source,
                Source::Synthetic | Source::FashionMnist | Source::Cifar10
            ) {
                return fail(
                    "test_fraction",
                    format!("does not apply to source {source}, which has its own test set"),
                );
            }
            if !(f > 0.0 && f < 1.0) {
                return fail(
                    "test_fraction",
                    format!("must lie strictly between 0 and 1, got {f}"),
                );
            }
        }
        for (key, limit) in [
            ("train_limit", self.train_limit),
            ("test_limit", self.test_limit),
        ] {
            if limit == Some(0) {
                return fail(key, "must be at least 1");
            }
        }
        if let Some(target) = self.pad_to {
            if target.contains(&0) {
                return fail("pad_to", format!("{target:?} has a zero dimension"));
            }
            if !matches!(target[0].checked_mul(target[1]), Some(e) if e <= MAX_SAMPLE_ELEMENTS) {
                return fail(
                    "pad_to",
                    format!("{target:?} has more than 2^28 ({MAX_SAMPLE_ELEMENTS}) pixels"),
                );
            }
        }
        if !synthetic {
            if let Some(c) = self.classes {
                if self.source != Source::Idx {
                    return fail(
                        "classes",
                        format!("only applies to source synthetic (and idx), not {source}"),
                    );
                }
                if !(2..=256).contains(&c) {
                    return fail(
                        "classes",
                        format!(
                            "must be between 2 and 256 for source idx (labels are bytes), got {c}"
                        ),
                    );
                }
            }
            let given = [
                ("shape", self.shape.is_some()),
                ("train_samples", self.train_samples.is_some()),
                ("test_samples", self.test_samples.is_some()),
            ];
            if let Some((key, _)) = given.iter().find(|(_, g)| *g) {
                return fail(
                    key,
                    format!("only applies to source synthetic, not {source}"),
                );
            }
            return Ok(());
        }
        if let Some(shape) = self.shape {
            if shape.contains(&0) {
                return fail("shape", format!("{shape:?} has a zero dimension"));
            }
            let elements = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if !matches!(elements, Some(e) if e <= MAX_SAMPLE_ELEMENTS) {
                return fail(
                    "shape",
                    format!(
                        "{shape:?} has more than 2^28 ({MAX_SAMPLE_ELEMENTS}) elements per sample"
                    ),
                );
            }
        }
        if let Some(c) = self.classes {
            if !(2..=MAX_CLASSES).contains(&c) {
                return fail(
                    "classes",
                    format!("must be between 2 and {MAX_CLASSES}, got {c}"),
                );
            }
        }
        for (key, n) in [
            ("train_samples", self.train_samples),
            ("test_samples", self.test_samples),
        ] {
            if n == Some(0) {
                return fail(key, "must be at least 1");
            }
        }
        let elements: u64 = self
            .shape
            .unwrap_or(DEFAULT_SHAPE)
            .iter()
            .map(|&d| d as u64)
            .product();
        let train = self.train_samples.unwrap_or(DEFAULT_TRAIN_SAMPLES) as u64;
        let test = self.test_samples.unwrap_or(DEFAULT_TEST_SAMPLES) as u64;
        let values = train
            .checked_add(test)
            .and_then(|n| n.checked_mul(elements));
        if values.is_none_or(|v| v > MAX_SYNTHETIC_VALUES) {
            let key = if self.train_samples.is_some() || self.test_samples.is_none() {
                "train_samples"
            } else {
                "test_samples"
            };
            return fail(
                key,
                format!(
                    "{train} training and {test} test samples of {elements} values are more than \
                     synthetic data may hold (2^32 values, 16 GiB)"
                ),
            );
        }
        Ok(())
    }

    /// Reads (or generates) the dataset. `base` resolves relative paths; `seed` fixes the held-out split.
    ///
    /// Single-set sources (`mnist-10k`, `idx` with one pair of files) are split by class with
    /// `test_fraction`, each side in a seeded random order; sources with their own test files keep
    /// them and their file order. Synthetic data is generated from `seed`. `train_limit` and
    /// `test_limit` then keep the first samples of each side. With `normalize`, each channel is
    /// standardised with the mean and standard deviation of that channel over the (limited)
    /// training images, taken before `pad_to` adds its zero border, so padding changes no pixel of
    /// the image itself and its border is what a 0 pixel becomes.
    pub fn load(&self, base: Option<&Path>, seed: u64) -> Result<Dataset, DataError> {
        self.validate()
            .map_err(|(key, message)| DataError::Invalid(format!("`{key}` {message}")))?;
        let folder = self.path.as_deref().map(|p| match base {
            Some(b) if p.is_relative() => b.join(p),
            _ => p.to_path_buf(),
        });
        let test_fraction = self.test_fraction.unwrap_or(DEFAULT_TEST_FRACTION);
        let mut data = match self.source {
            Source::Mnist10k => {
                let set = match &folder {
                    None => idx::decode_pair(
                        Path::new(EMBEDDED_IMAGES),
                        embedded::IMAGES_GZ,
                        Path::new(EMBEDDED_LABELS),
                        embedded::LABELS_GZ,
                        10,
                    )?,
                    Some(dir) => read_single(dir, 10, MNIST_10K_HINT)?.1,
                };
                held_out("mnist-10k", &set, 10, test_fraction, seed)?
            }
            Source::FashionMnist => {
                let dir = folder.unwrap_or_else(|| PathBuf::from(FASHION_MNIST_DIR));
                read_official("fashion-mnist", &dir, Some(10), FASHION_MNIST_HINT)?
            }
            Source::Idx => {
                let dir = folder.ok_or_else(|| {
                    DataError::Invalid("`path` is required for source idx".into())
                })?;
                let name = dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "idx".into());
                if OFFICIAL.iter().any(|stem| locate(&dir, stem).is_some()) {
                    read_official(&name, &dir, self.classes, IDX_HINT)?
                } else if SINGLE.iter().any(|stem| locate(&dir, stem).is_some()) {
                    let (labels, set) = read_single(&dir, self.classes.unwrap_or(256), IDX_HINT)?;
                    let classes = match self.classes {
                        Some(c) => c,
                        None => classes_of(&name, &[(&labels, set.labels())])?,
                    };
                    held_out(&name, &set, classes, test_fraction, seed)?
                } else {
                    not_a_folder(&dir)?;
                    let why = if dir.is_dir() {
                        " (no IDX files in this folder)"
                    } else {
                        " (no such folder)"
                    };
                    return Err(DataError::Missing {
                        path: dir,
                        hint: format!("{why}{IDX_HINT}"),
                    });
                }
            }
            Source::Cifar10 => {
                let dir = folder.ok_or_else(|| {
                    DataError::Invalid("`path` is required for source cifar10".into())
                })?;
                cifar::read(&dir, self.train_limit, self.test_limit)?
            }
            Source::Synthetic => {
                let shape = self.shape.unwrap_or(DEFAULT_SHAPE);
                let classes = self.classes.unwrap_or(DEFAULT_CLASSES);
                let (train, test) = synthetic::generate(
                    shape,
                    classes,
                    self.train_samples.unwrap_or(DEFAULT_TRAIN_SAMPLES),
                    self.test_samples.unwrap_or(DEFAULT_TEST_SAMPLES),
                    seed,
                )?;
                Dataset {
                    name: "synthetic".into(),
                    shape,
                    classes,
                    train,
                    test,
                }
            }
        };
        // Every source's labels, checked once here for every backend.
        data.check_labels()?;
        let len = data.sample_len();
        holdout::truncate(&mut data.train, self.train_limit, len);
        holdout::truncate(&mut data.test, self.test_limit, len);
        let moments = self
            .normalize
            .unwrap_or(true)
            .then(|| data.channel_moments());
        if let Some(target) = self.pad_to {
            data.pad(target)?;
        }
        if let Some(moments) = moments {
            data.standardize_with(&moments);
        }
        Ok(data)
    }
}

impl Source {
    /// The name used in job files, e.g. `mnist-10k`.
    pub fn name(self) -> &'static str {
        match self {
            Source::Mnist10k => "mnist-10k",
            Source::FashionMnist => "fashion-mnist",
            Source::Idx => "idx",
            Source::Cifar10 => "cifar10",
            Source::Synthetic => "synthetic",
        }
    }
}

/// Finds `folder/stem`, else `folder/stem.gz`: whatever is there (a directory or a FIFO of
/// that name is found too, and refused when opened, saying what it is).
fn locate(folder: &Path, stem: &str) -> Option<PathBuf> {
    let raw = folder.join(stem);
    if input_file::exists(&raw) {
        return Some(raw);
    }
    let gz = folder.join(format!("{stem}.gz"));
    input_file::exists(&gz).then_some(gz)
}

/// Like [`locate`], but a missing file is an error that says what to do.
fn require(folder: &Path, stem: &str, hint: &str) -> Result<PathBuf, DataError> {
    not_a_folder(folder)?;
    locate(folder, stem).ok_or_else(|| {
        let why = if folder.is_dir() {
            format!(" (nor {stem}.gz)")
        } else {
            format!(" (no folder {})", folder.display())
        };
        DataError::Missing {
            path: folder.join(stem),
            hint: format!("{why}{hint}"),
        }
    })
}

/// An error when `path` exists but is not a folder (`data.path` names a folder of files).
pub fn not_a_folder(path: &Path) -> Result<(), DataError> {
    if input_file::exists(path) && !path.is_dir() {
        return Err(DataError::Format {
            path: path.to_path_buf(),
            message: "is not a folder: data.path names the folder that holds the data files".into(),
        });
    }
    Ok(())
}

/// Reads `images-idx3-ubyte[.gz]` and `labels-idx1-ubyte[.gz]` from `folder`; returns the
/// labels file's path with the set.
fn read_single(
    folder: &Path,
    classes: usize,
    hint: &str,
) -> Result<(PathBuf, idx::Labelled), DataError> {
    let images = require(folder, SINGLE[0], hint)?;
    let labels = require(folder, SINGLE[1], hint)?;
    let set = idx::read_pair(&images, &labels, classes, hint)?;
    Ok((labels, set))
}

/// Reads the four `train-*` / `t10k-*` files of `folder` and keeps their split. With `classes`
/// unset, it is one more than the largest label.
fn read_official(
    name: &str,
    folder: &Path,
    classes: Option<usize>,
    hint: &str,
) -> Result<Dataset, DataError> {
    let paths = OFFICIAL
        .iter()
        .map(|stem| require(folder, stem, hint))
        .collect::<Result<Vec<_>, _>>()?;
    let limit = classes.unwrap_or(256);
    let train = idx::read_pair(&paths[0], &paths[1], limit, hint)?;
    let test = idx::read_pair(&paths[2], &paths[3], limit, hint)?;
    if (test.rows, test.cols) != (train.rows, train.cols) {
        return Err(DataError::Format {
            path: paths[2].clone(),
            message: format!(
                "images are {}×{}, but the training images ({}) are {}×{}",
                test.rows,
                test.cols,
                paths[0].display(),
                train.rows,
                train.cols
            ),
        });
    }
    let classes = match classes {
        Some(c) => c,
        None => classes_of(
            name,
            &[(&paths[1], train.labels()), (&paths[3], test.labels())],
        )?,
    };
    for (set, what) in [(&train, "training"), (&test, "test")] {
        if set.is_empty() {
            return Err(DataError::Invalid(format!(
                "{name}: the {what} files hold no samples"
            )));
        }
    }
    Ok(Dataset {
        name: name.to_string(),
        shape: [1, train.rows, train.cols],
        classes,
        train: holdout::all(train.pixels(), train.labels()),
        test: holdout::all(test.pixels(), test.labels()),
    })
}

/// The classes of labels files that do not say how many there are: `k` when the labels are
/// `0..k` with none missing, at least two. A label past a missing one (255 among 0 to 9) would
/// make a model of mostly unused classes: it is refused, naming its file and sample, unless the
/// job says how many classes there are (`data.classes`).
fn classes_of(name: &str, sets: &[(&Path, &[u8])]) -> Result<usize, DataError> {
    let mut seen = [false; 256];
    for (_, labels) in sets {
        for &l in *labels {
            seen[l as usize] = true;
        }
    }
    let k = seen.iter().position(|s| !s).unwrap_or(256);
    for (path, labels) in sets {
        if let Some((i, &l)) = labels.iter().enumerate().find(|(_, &l)| l as usize > k) {
            return Err(DataError::Format {
                path: path.to_path_buf(),
                message: format!(
                    "sample {i} has label {l}, but no sample has label {k}: labels must run from \
                     0 with none missing (or set data.classes to the number of classes)"
                ),
            });
        }
    }
    if k < 2 {
        return Err(DataError::Invalid(format!(
            "{name}: every label is 0; a classifier needs at least two classes"
        )));
    }
    Ok(k)
}

/// Splits one set of samples into training and held-out test samples.
fn held_out(
    name: &str,
    set: &idx::Labelled,
    classes: usize,
    test_fraction: f64,
    seed: u64,
) -> Result<Dataset, DataError> {
    let (train, test) = holdout::stratified(set.labels(), test_fraction, seed);
    if train.is_empty() || test.is_empty() {
        return Err(DataError::Invalid(format!(
            "{name}: holding out a fraction {test_fraction} of {} samples leaves the {} set empty",
            set.len(),
            if train.is_empty() { "training" } else { "test" }
        )));
    }
    let len = set.rows * set.cols;
    Ok(Dataset {
        name: name.to_string(),
        shape: [1, set.rows, set.cols],
        classes,
        train: holdout::gather(set.pixels(), set.labels(), len, &train),
        test: holdout::gather(set.pixels(), set.labels(), len, &test),
    })
}
