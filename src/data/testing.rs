//! Test builders: datasets held in memory, and the message of a reader's format error.

use std::path::Path;

use super::{cifar, Dataset, Samples};
use crate::error::DataError;

impl Dataset {
    /// A dataset held in memory, from its two splits.
    pub(crate) fn in_memory(
        name: &str,
        shape: [usize; 3],
        classes: usize,
        train: Samples,
        test: Samples,
    ) -> Dataset {
        Dataset {
            name: name.into(),
            shape,
            classes,
            train,
            test,
        }
    }

    /// A dataset whose pixels are all zero: `train` and `test` samples, their labels cycling
    /// through the classes.
    pub(crate) fn zeros(
        name: &str,
        shape: [usize; 3],
        classes: usize,
        train: usize,
        test: usize,
    ) -> Dataset {
        let len = shape.iter().product();
        let split = |n| Samples::zeros(n, len, classes);
        Dataset::in_memory(name, shape, classes, split(train), split(test))
    }
}

impl Samples {
    /// Samples from their pixels and labels.
    pub(crate) fn of(images: Vec<f32>, labels: Vec<u32>) -> Samples {
        Samples { images, labels }
    }

    /// `n` samples of `len` zero pixels each, their labels cycling through `classes`.
    pub(crate) fn zeros(n: usize, len: usize, classes: usize) -> Samples {
        let labels = (0..n as u32).map(|i| i % classes as u32).collect();
        Samples::of(vec![0.0; n * len], labels)
    }
}

/// Writes the six CIFAR-10 batches into `dir`: `per_file` records in each training batch, and
/// in the test batch the `test.1` records numbered from `test.0`. Record `k` (counted over all
/// training batches) has label `k % 10` and pixel `pixel(k, c, y, x)`.
pub(crate) fn write_cifar(
    dir: &Path,
    per_file: usize,
    test: (usize, usize),
    pixel: impl Fn(usize, usize, usize, usize) -> u8,
) {
    let record = |k: usize| cifar::encode_record((k % 10) as u8, |c, y, x| pixel(k, c, y, x));
    for (f, name) in cifar::TRAIN_FILES.iter().enumerate() {
        let bytes: Vec<u8> = (0..per_file)
            .flat_map(|i| record(f * per_file + i))
            .collect();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    let bytes: Vec<u8> = (0..test.1).flat_map(|i| record(test.0 + i)).collect();
    std::fs::write(dir.join(cifar::TEST_FILE), bytes).unwrap();
}

/// The message of a format error; any other error fails the test.
pub(crate) fn format_message(e: DataError) -> String {
    match e {
        DataError::Format { .. } => e.to_string(),
        other => panic!("expected a format error, got {other:?}"),
    }
}
