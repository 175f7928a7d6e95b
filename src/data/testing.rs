//! Test builders: datasets held in memory, and the message of a reader's format error.

use super::{Dataset, Samples};
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

/// The message of a format error; any other error fails the test.
pub(crate) fn format_message(e: DataError) -> String {
    match e {
        DataError::Format { .. } => e.to_string(),
        other => panic!("expected a format error, got {other:?}"),
    }
}
