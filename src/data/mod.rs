//! Datasets: where they come from (job `data:` section), how they are read, and the held-out split.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::error::DataError;

/// Where a dataset comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// The 10,000 real MNIST digits shipped in `data/mnist-10k` (and embedded in the binary).
    Mnist10k,
    /// Fashion-MNIST in IDX files, by default under `/usr/share/datasets/fashion-mnist`.
    FashionMnist,
    /// Any MNIST-style IDX folder given by `path`.
    Idx,
    /// Learnable synthetic images of any shape, generated from the seed.
    Synthetic,
}

/// The `data:` section of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    pub source: Source,
    /// A folder (or, for `idx`, a folder of IDX files). Relative paths are taken from `--data-dir`,
    /// else from the current directory.
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
    /// Synthetic only: number of classes (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<usize>,
    /// Synthetic only: training samples (default 8000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_samples: Option<usize>,
    /// Synthetic only: test samples (default 2000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_samples: Option<usize>,
}

/// Samples of one split: images as `f32` in `[0, 1]`, `n × (c·h·w)`, and their labels.
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
        }
    }

    /// Checks the values that need no file system. On error returns `(key, message)`, the key
    /// relative to the `data:` section.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let _ = self;
        todo!()
    }

    /// Reads (or generates) the dataset. `base` resolves relative paths; `seed` fixes the held-out split.
    pub fn load(&self, base: Option<&Path>, seed: u64) -> Result<Dataset, DataError> {
        let _ = (base, seed);
        todo!()
    }
}
