//! Reading the CIFAR-10 binary version: five training batches and one test batch of 3073-byte records.
//!
//! Each record is one label byte (`0..=9`) and 3072 pixel bytes: the 32×32 red plane, then the
//! green one, then the blue one, each row-major. That is already the `[channels, height, width]`
//! layout of a [`Samples`] image, so pixels are copied in order (as `byte/255`). Every check returns
//! a [`DataError`] naming the file; no input, however malformed, makes these functions panic.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::input_file::{self, open_regular, UTF8_BOM};
use super::{Dataset, Samples};
use crate::error::DataError;

/// Image side, in pixels.
pub const SIDE: usize = 32;
/// Colour planes per image: red, green, blue.
pub const CHANNELS: usize = 3;
/// Pixel bytes per image.
pub const IMAGE_BYTES: usize = CHANNELS * SIDE * SIDE;
/// Bytes per record: the label, then the image.
pub const RECORD: usize = 1 + IMAGE_BYTES;
/// Number of classes; every label must be below it.
pub const CLASSES: usize = 10;
/// The training batches, read in this order.
pub const TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
/// The test batch.
pub const TEST_FILE: &str = "test_batch.bin";
/// The folder that `cifar-10-binary.tar.gz` extracts to; looked for inside `path` too.
pub const EXTRACTED: &str = "cifar-10-batches-bin";

/// Appended to a missing-file error: what a CIFAR-10 folder holds.
pub const HINT: &str = ": a cifar10 folder holds data_batch_1.bin, data_batch_2.bin, data_batch_3.bin, \
data_batch_4.bin, data_batch_5.bin and test_batch.bin (the CIFAR-10 binary version), directly or in \
its subfolder cifar-10-batches-bin; set `path` to it";

/// The folder that holds the batches: `folder` itself when it holds any of them, else
/// `folder/cifar-10-batches-bin` when that is a folder.
pub fn locate(folder: &Path) -> Result<PathBuf, DataError> {
    let holds_any = |dir: &Path| {
        TRAIN_FILES
            .iter()
            .chain(std::iter::once(&TEST_FILE))
            .any(|name| input_file::exists(&dir.join(name)))
    };
    if holds_any(folder) {
        return Ok(folder.to_path_buf());
    }
    let nested = folder.join(EXTRACTED);
    if nested.is_dir() {
        return Ok(nested);
    }
    super::not_a_folder(folder)?;
    let why = if folder.is_dir() {
        format!(" (no CIFAR-10 batches in this folder, and no subfolder {EXTRACTED})")
    } else {
        " (no such folder)".to_string()
    };
    Err(DataError::Missing {
        path: folder.to_path_buf(),
        hint: format!("{why}{HINT}"),
    })
}

/// Reads the six batches under `folder` (see [`locate`]) into a 3×32×32, 10-class dataset named
/// `cifar10`, the training batches in file order.
///
/// Every file is checked in full, but only the first `train_limit` training and `test_limit` test
/// records are turned into `f32` pixels, so a small limit keeps memory small.
pub fn read(
    folder: &Path,
    train_limit: Option<usize>,
    test_limit: Option<usize>,
) -> Result<Dataset, DataError> {
    let dir = locate(folder)?;
    let train_paths: Vec<PathBuf> = TRAIN_FILES.iter().map(|n| dir.join(n)).collect();
    let test_path = dir.join(TEST_FILE);
    // Every file is looked for before any is read, so a missing one is reported at once.
    for path in train_paths.iter().chain(std::iter::once(&test_path)) {
        if !input_file::exists(path) {
            return Err(DataError::Missing {
                path: path.clone(),
                hint: HINT.to_string(),
            });
        }
    }
    let mut train = Samples::default();
    for path in &train_paths {
        read_batch(path, &mut train, train_limit)?;
    }
    let mut test = Samples::default();
    read_batch(&test_path, &mut test, test_limit)?;
    Ok(Dataset {
        name: "cifar10".into(),
        shape: [CHANNELS, SIDE, SIDE],
        classes: CLASSES,
        train,
        test,
    })
}

/// The largest batch file read (2 GiB, about 700,000 records); a full batch is 30.7 MB.
pub const MAX_BATCH_BYTES: u64 = 1 << 31;

/// Checks one batch held in memory (its size, then every label) and appends its records to
/// `out` until `out` holds `limit` samples.
pub fn append(
    path: &Path,
    bytes: &[u8],
    out: &mut Samples,
    limit: Option<usize>,
) -> Result<(), DataError> {
    append_from(path, bytes, bytes.len() as u64, out, limit)
}

/// Reads one batch file (a regular file: a directory or a FIFO is refused, never waited on)
/// record by record into `out` (see [`append`]); its size is checked before anything is read.
pub fn read_batch(path: &Path, out: &mut Samples, limit: Option<usize>) -> Result<(), DataError> {
    let (file, len) = open_regular(path)
        .map_err(|e| super::idx::open_error(path, e, HINT, "a CIFAR-10 batch file"))?;
    append_from(path, std::io::BufReader::new(file), len, out, limit)
}

/// Checks a batch of `len` bytes read from `reader` (its size first, then each record's label
/// as it is read) and appends its records to `out` until `out` holds `limit` samples; the
/// records past the limit are read and checked, not kept.
fn append_from(
    path: &Path,
    mut reader: impl Read,
    len: u64,
    out: &mut Samples,
    limit: Option<usize>,
) -> Result<(), DataError> {
    let format = |message: String| DataError::Format {
        path: path.to_path_buf(),
        message,
    };
    if len == 0 || !len.is_multiple_of(RECORD as u64) {
        return Err(format(format!(
            "{len} bytes is not a whole number of CIFAR-10 records: each record is {RECORD} bytes \
             (1 label + {IMAGE_BYTES} pixels), and a full batch is 10000 records = {} bytes",
            10_000 * RECORD
        )));
    }
    if len > MAX_BATCH_BYTES {
        return Err(format(format!(
            "{len} bytes is more than a CIFAR-10 batch file may hold ({MAX_BATCH_BYTES} bytes, 2 GiB)"
        )));
    }
    let records = (len / RECORD as u64) as usize;
    let room = limit.unwrap_or(usize::MAX).saturating_sub(out.len());
    let take = room.min(records);
    out.images
        .try_reserve_exact(take * IMAGE_BYTES)
        .and_then(|()| out.labels.try_reserve_exact(take))
        .map_err(|_| format(format!("{take} records do not fit in memory")))?;
    let mut record = vec![0u8; RECORD];
    for i in 0..records {
        reader.read_exact(&mut record).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => format(format!(
                "ends in record {i} of the {records} its size of {len} bytes held when opened"
            )),
            _ => DataError::Io {
                path: path.to_path_buf(),
                source: e,
            },
        })?;
        let label = record[0];
        if label as usize >= CLASSES {
            let bom = if i == 0 && record.starts_with(&UTF8_BOM) {
                " (the file starts with a UTF-8 byte-order mark: it is a text file, not a CIFAR-10 batch)"
            } else {
                ""
            };
            return Err(format(format!(
                "record {i} (byte offset {}) has label {label}, expected 0 to {}{bom}",
                i * RECORD,
                CLASSES - 1
            )));
        }
        if i < take {
            out.labels.push(label as u32);
            out.images
                .extend(record[1..].iter().map(|&b| b as f32 / 255.0));
        }
    }
    Ok(())
}

/// One record: `label`, then the pixel of plane `c`, row `y`, column `x` from `pixel(c, y, x)`.
/// For tests and tools; nothing is checked, so tests can also build malformed records.
pub fn encode_record(label: u8, pixel: impl Fn(usize, usize, usize) -> u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD);
    out.push(label);
    for c in 0..CHANNELS {
        for y in 0..SIDE {
            for x in 0..SIDE {
                out.push(pixel(c, y, x));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::testing::{self, format_message};

    /// Writes six batches into `dir`: `per_file` records in each training batch and `test` in
    /// the test batch. Record `k` (counted over all training batches) has label `k % 10`, its
    /// pixels all equal to `k`, except (green, row 5, column 7), which is 200.
    fn write_batches(dir: &Path, per_file: usize, test: usize) {
        testing::write_cifar(dir, per_file, (100, test), |k, c, y, x| {
            if (c, y, x) == (1, 5, 7) {
                200
            } else {
                k as u8
            }
        });
    }

    #[test]
    fn reads_every_batch_in_order_with_planes_in_place() {
        let dir = tempfile::tempdir().unwrap();
        write_batches(dir.path(), 3, 4);
        let d = read(dir.path(), None, None).unwrap();
        assert_eq!(
            (d.name.as_str(), d.shape, d.classes),
            ("cifar10", [3, 32, 32], 10)
        );
        assert_eq!((d.train.len(), d.test.len()), (15, 4));
        assert_eq!(d.train.images.len(), 15 * 3072);
        assert_eq!(
            d.train.labels,
            (0..15).map(|k| k % 10).collect::<Vec<u32>>()
        );
        assert_eq!(d.test.labels, vec![0, 1, 2, 3]);
        for (k, img) in d.train.images.chunks_exact(3072).enumerate() {
            // Green plane, row 5, column 7: 1·1024 + 5·32 + 7.
            assert_eq!(img[1024 + 5 * 32 + 7], 200.0 / 255.0, "record {k}");
            // Its neighbours in the other planes and the next column keep the record's value.
            for i in [5 * 32 + 7, 2048 + 5 * 32 + 7, 1024 + 5 * 32 + 8] {
                assert_eq!(img[i], k as f32 / 255.0, "record {k}, element {i}");
            }
        }
        assert_eq!(d.test.images[3 * 3072], 103.0 / 255.0);
    }

    #[test]
    fn limits_take_the_first_records_across_files() {
        let dir = tempfile::tempdir().unwrap();
        write_batches(dir.path(), 2, 3);
        let d = read(dir.path(), Some(3), Some(1)).unwrap();
        assert_eq!((d.train.len(), d.test.len()), (3, 1));
        assert_eq!(d.train.images.len(), 3 * 3072);
        // The third sample is the first record of data_batch_2.bin.
        assert_eq!(d.train.labels, vec![0, 1, 2]);
        assert_eq!(d.train.images[2 * 3072], 2.0 / 255.0);
        assert_eq!(d.test.labels, vec![0]);
    }

    #[test]
    fn the_extracted_subfolder_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join(EXTRACTED);
        std::fs::create_dir(&nested).unwrap();
        write_batches(&nested, 1, 1);
        assert_eq!(locate(dir.path()).unwrap(), nested);
        let d = read(dir.path(), None, None).unwrap();
        assert_eq!((d.train.len(), d.test.len()), (5, 1));
    }

    #[test]
    fn a_size_that_is_not_whole_records_names_the_file_and_size() {
        let dir = tempfile::tempdir().unwrap();
        write_batches(dir.path(), 2, 2);
        let bad = dir.path().join("data_batch_3.bin");
        let mut bytes = std::fs::read(&bad).unwrap();
        bytes.pop();
        std::fs::write(&bad, &bytes).unwrap();
        let e = read(dir.path(), None, None).unwrap_err();
        assert!(
            matches!(&e, DataError::Format { path, .. } if path == &bad),
            "{e:?}"
        );
        let m = format_message(e);
        assert!(
            m.contains("data_batch_3.bin") && m.contains("6145 bytes"),
            "{m}"
        );
        assert!(m.contains("3073"), "{m}");
        // An empty file holds no record.
        std::fs::write(&bad, b"").unwrap();
        let m = format_message(read(dir.path(), None, None).unwrap_err());
        assert!(m.contains("0 bytes"), "{m}");
        // The check does not depend on the limit.
        std::fs::write(&bad, [0u8; 10]).unwrap();
        assert!(read(dir.path(), Some(1), Some(1)).is_err());
    }

    #[test]
    fn a_label_of_ten_or_more_names_the_record() {
        let dir = tempfile::tempdir().unwrap();
        write_batches(dir.path(), 3, 3);
        let bad = dir.path().join(TEST_FILE);
        let mut bytes = std::fs::read(&bad).unwrap();
        bytes[2 * RECORD] = 10;
        std::fs::write(&bad, &bytes).unwrap();
        let m = format_message(read(dir.path(), None, None).unwrap_err());
        assert!(m.contains("test_batch.bin"), "{m}");
        assert!(m.contains("record 2") && m.contains("label 10"), "{m}");
        assert!(m.contains(&format!("offset {}", 2 * RECORD)), "{m}");
        // A label of 9 is fine.
        bytes[2 * RECORD] = 9;
        std::fs::write(&bad, &bytes).unwrap();
        assert_eq!(
            read(dir.path(), None, None).unwrap().test.labels,
            vec![0, 1, 9]
        );
    }

    #[test]
    fn missing_files_say_what_is_expected_and_where() {
        let dir = tempfile::tempdir().unwrap();
        let e = read(dir.path(), None, None).unwrap_err();
        assert!(
            matches!(&e, DataError::Missing { path, .. } if path == dir.path()),
            "{e:?}"
        );
        let m = e.to_string();
        assert!(
            m.contains("no CIFAR-10 batches") && m.contains(EXTRACTED),
            "{m}"
        );
        assert!(
            m.contains("data_batch_5.bin") && m.contains("test_batch.bin"),
            "{m}"
        );
        let absent = dir.path().join("absent");
        let m = read(&absent, None, None).unwrap_err().to_string();
        assert!(m.contains("no such folder") && m.contains("absent"), "{m}");
        // One batch missing among the others is named.
        write_batches(dir.path(), 1, 1);
        let gone = dir.path().join("data_batch_4.bin");
        std::fs::remove_file(&gone).unwrap();
        let e = read(dir.path(), None, None).unwrap_err();
        assert!(
            matches!(&e, DataError::Missing { path, .. } if path == &gone),
            "{e:?}"
        );
        assert!(e.to_string().contains("test_batch.bin"), "{e}");
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut out = Samples::default();
        for len in [0, 1, RECORD - 1, RECORD + 1, 2 * RECORD] {
            for fill in [0u8, 9, 10, 255] {
                let r = append(Path::new("x"), &vec![fill; len], &mut out, Some(1));
                assert_eq!(
                    r.is_ok(),
                    len % RECORD == 0 && len > 0 && fill < 10,
                    "{len} {fill}"
                );
            }
        }
        assert_eq!(out.len(), 1, "the limit holds over several batches");
    }
}
