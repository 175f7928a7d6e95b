//! Tiny datasets: IDX files written on the fly, and datasets held in memory.

use std::io::Write;
use std::path::{Path, PathBuf};

use gpumux::data::{Dataset, Samples};

/// An IDX file of unsigned bytes: its header for `dims`, then `data`.
pub fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(data).expect("gzip");
    enc.finish().expect("gzip")
}

/// An IDX folder `dir/set` of `n` 4×4 images whose labels cycle through 0..10.
pub fn idx_folder(dir: &Path, n: usize) -> PathBuf {
    let folder = dir.join("set");
    std::fs::create_dir_all(&folder).expect("folder");
    let pixels: Vec<u8> = (0..n * 16).map(|i| (i % 251) as u8).collect();
    let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
    std::fs::write(
        folder.join("images-idx3-ubyte"),
        idx(&[n as u32, 4, 4], &pixels),
    )
    .expect("images");
    std::fs::write(folder.join("labels-idx1-ubyte"), idx(&[n as u32], &labels)).expect("labels");
    folder
}

/// `n` samples of `len` values each drawn from `value`, their labels cycling through `classes`.
pub fn samples(n: usize, len: usize, classes: usize, mut value: impl FnMut() -> f32) -> Samples {
    Samples {
        images: (0..n * len).map(|_| value()).collect(),
        labels: (0..n as u32).map(|i| i % classes as u32).collect(),
    }
}

/// A dataset held in memory.
pub fn dataset(
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
