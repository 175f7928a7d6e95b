//! The MNIST-10k IDX files compiled into the binary, so `source: mnist-10k` needs no files at run time.

/// `data/mnist-10k/images-idx3-ubyte.gz`: 10,000 images of 28×28 bytes.
pub const IMAGES_GZ: &[u8] = include_bytes!("../../data/mnist-10k/images-idx3-ubyte.gz");

/// `data/mnist-10k/labels-idx1-ubyte.gz`: their 10,000 labels, 0–9.
pub const LABELS_GZ: &[u8] = include_bytes!("../../data/mnist-10k/labels-idx1-ubyte.gz");
