//! Reading (and, for tests and tools, writing) IDX files of unsigned bytes, raw or gzip-compressed.
//!
//! The IDX format: a 4-byte magic `00 00 08 d` (type 0x08 = unsigned byte, `d` dimensions), then
//! `d` big-endian `u32` sizes, then the elements in row-major order. Every check here returns a
//! [`DataError`] naming the file; no input, however malformed, makes these functions panic.

use std::io::{Read, Write};
use std::path::Path;

use super::input_file::{open_regular, OpenError, UTF8_BOM};
use crate::error::DataError;

/// The first two bytes of every gzip stream.
pub const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The IDX element type this reader supports: unsigned byte.
const TYPE_U8: u8 = 0x08;

/// A decoded IDX array of unsigned bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdxArray {
    /// The sizes declared in the header, outermost first.
    pub dims: Vec<usize>,
    bytes: Vec<u8>,
}

impl IdxArray {
    /// The elements, row-major, exactly `dims.iter().product()` of them.
    pub fn data(&self) -> &[u8] {
        &self.bytes
    }
}

/// Images and their labels read from a matching pair of IDX files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labelled {
    pub rows: usize,
    pub cols: usize,
    images: IdxArray,
    labels: IdxArray,
}

impl Labelled {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.data().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Pixels of all images, `len × rows × cols`.
    pub fn pixels(&self) -> &[u8] {
        self.images.data()
    }
    /// One label per image.
    pub fn labels(&self) -> &[u8] {
        self.labels.data()
    }
}

/// The most data bytes an IDX file may declare (2 GiB): a header declaring more is refused
/// before anything more is read.
pub const MAX_IDX_BYTES: u64 = 1 << 31;

/// What a [`DataError`] says when an input file cannot be opened: missing (with `hint`), a
/// directory, a FIFO or another file that is not a regular file, or an I/O error.
pub fn open_error(path: &Path, e: OpenError, hint: &str, expected: &str) -> DataError {
    match e {
        OpenError::Missing => DataError::Missing {
            path: path.to_path_buf(),
            hint: hint.to_string(),
        },
        OpenError::Io(source) => DataError::Io {
            path: path.to_path_buf(),
            source,
        },
        other => DataError::Format {
            path: path.to_path_buf(),
            message: other.describe(expected),
        },
    }
}

/// Reads an IDX file that must have `ndims` dimensions, raw or gzip (told by its first bytes,
/// whatever its name). The header is read and checked first, and no more is read than it
/// declares: a raw file's length must match it before its data is read, and a gzip stream is
/// decompressed incrementally and refused as soon as it holds more. A missing file is
/// [`DataError::Missing`] with `hint` appended to the message.
pub fn read(path: &Path, ndims: usize, hint: &str) -> Result<IdxArray, DataError> {
    let (file, len) = open_regular(path).map_err(|e| open_error(path, e, hint, "an IDX file"))?;
    decode(path, std::io::BufReader::new(file), Some(len), ndims)
}

/// Decodes an IDX file, raw or gzip, held in memory (see [`read`]).
pub fn parse(path: &Path, bytes: &[u8], ndims: usize) -> Result<IdxArray, DataError> {
    decode(path, bytes, Some(bytes.len() as u64), ndims)
}

/// Decodes an IDX file from `reader`, whose length in bytes is `len` when known.
fn decode(
    path: &Path,
    mut reader: impl Read,
    len: Option<u64>,
    ndims: usize,
) -> Result<IdxArray, DataError> {
    let format = |message: String| DataError::Format {
        path: path.to_path_buf(),
        message,
    };
    let io = |source: std::io::Error| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut prefix = [0u8; 3];
    let got = read_full(&mut reader, &mut prefix).map_err(io)?;
    let prefix = &prefix[..got];
    if prefix == UTF8_BOM {
        return Err(format(
            "starts with a UTF-8 byte-order mark (EF BB BF): it is a text file, not an IDX file"
                .into(),
        ));
    }
    let whole = prefix.chain(reader);
    if prefix.starts_with(&GZIP_MAGIC) {
        let gunzip = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::InvalidInput
            | std::io::ErrorKind::InvalidData
            | std::io::ErrorKind::UnexpectedEof => format(format!(
                "starts like a gzip file but does not decompress: {e}"
            )),
            _ => io(e),
        };
        let stream = flate2::read::MultiGzDecoder::new(whole);
        decode_stream(path, stream, None, ndims, &gunzip)
    } else {
        decode_stream(path, whole, len, ndims, &io)
    }
}

/// Reads into `buf` until it is full or the reader ends; returns the bytes read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Decodes the (decompressed) IDX stream `r`; `len` is its length when known (a raw file).
fn decode_stream(
    path: &Path,
    mut r: impl Read,
    len: Option<u64>,
    ndims: usize,
    io: &dyn Fn(std::io::Error) -> DataError,
) -> Result<IdxArray, DataError> {
    let format = |message: String| DataError::Format {
        path: path.to_path_buf(),
        message,
    };
    let expected_magic = 0x0000_0800u32 | (ndims as u32 & 0xff);
    let mut magic = [0u8; 4];
    let got = read_full(&mut r, &mut magic).map_err(io)?;
    if got < 4 {
        return Err(format(format!(
            "too short for an IDX header: {got} bytes, expected at least 4 starting with the magic 0x{expected_magic:08x}"
        )));
    }
    let found_magic = u32::from_be_bytes(magic);
    if magic[0] != 0 || magic[1] != 0 {
        return Err(format(format!(
            "not an IDX file: magic number 0x{found_magic:08x}, expected 0x{expected_magic:08x}"
        )));
    }
    if magic[2] != TYPE_U8 {
        return Err(format(format!(
            "IDX element type 0x{:02x} is not supported, expected 0x08 (unsigned byte); magic 0x{found_magic:08x}, expected 0x{expected_magic:08x}",
            magic[2]
        )));
    }
    let found_dims = magic[3] as usize;
    if found_dims != ndims {
        return Err(format(format!(
            "has {found_dims} dimensions (magic 0x{found_magic:08x}), expected {ndims} (magic 0x{expected_magic:08x}): {}",
            match ndims {
                1 => "a labels file has one dimension, the count",
                3 => "an images file has three dimensions: count, rows, columns",
                _ => "wrong kind of IDX file",
            }
        )));
    }
    let header = 4 + 4 * ndims;
    let mut sizes = vec![0u8; 4 * ndims];
    let got = read_full(&mut r, &mut sizes).map_err(io)?;
    if got < sizes.len() {
        return Err(format(format!(
            "truncated header: {} bytes, expected {header} for {ndims} dimensions",
            4 + got
        )));
    }
    let dims: Vec<usize> = sizes
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let shape = dims
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("×");
    let expected = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .filter(|&n| n <= MAX_IDX_BYTES)
        .ok_or_else(|| {
            format(format!(
                "the header declares {shape} bytes of data, more than an IDX file may hold \
                 ({MAX_IDX_BYTES} bytes, 2 GiB)"
            ))
        })?;
    let mismatch = |found: u64, more: bool| {
        let what = if found < expected {
            "truncated"
        } else {
            "trailing bytes after the data"
        };
        let found = if more {
            format!("more than {found}")
        } else {
            found.to_string()
        };
        format(format!(
            "{what}: the header declares {shape} = {expected} bytes of data, found {found}"
        ))
    };
    // A raw file's length is known: it must match before any data is read.
    if let Some(len) = len {
        let found = len.saturating_sub(header as u64);
        if found != expected {
            return Err(mismatch(found, false));
        }
    }
    let mut bytes = Vec::new();
    // Known lengths are reserved at once; a gzip stream grows as it proves to hold the data.
    let reserve = if len.is_some() {
        expected
    } else {
        expected.min(1 << 20)
    };
    bytes
        .try_reserve_exact(reserve as usize)
        .map_err(|_| format(format!("{expected} bytes of data do not fit in memory")))?;
    r.take(expected + 1).read_to_end(&mut bytes).map_err(io)?;
    let found = bytes.len() as u64;
    if found != expected {
        return Err(mismatch(found.min(expected), found > expected));
    }
    Ok(IdxArray { dims, bytes })
}

/// Checks a decoded images file (3 dimensions) against its labels file (1 dimension): the
/// counts agree, and every label is below `classes`.
fn pair(
    images_path: &Path,
    images: IdxArray,
    labels_path: &Path,
    labels: IdxArray,
    classes: usize,
) -> Result<Labelled, DataError> {
    let (count, rows, cols) = (images.dims[0], images.dims[1], images.dims[2]);
    if count > 0 && (rows == 0 || cols == 0) {
        return Err(DataError::Format {
            path: images_path.to_path_buf(),
            message: format!("images of {rows}×{cols} pixels are empty"),
        });
    }
    if labels.dims[0] != count {
        return Err(DataError::Format {
            path: labels_path.to_path_buf(),
            message: format!(
                "{} labels, expected one per image: {} has {count} images",
                labels.dims[0],
                images_path.display()
            ),
        });
    }
    if let Some((i, &l)) = labels
        .data()
        .iter()
        .enumerate()
        .find(|(_, &l)| l as usize >= classes)
    {
        return Err(DataError::Format {
            path: labels_path.to_path_buf(),
            message: format!(
                "sample {i} has label {l}, not below the number of classes ({classes})"
            ),
        });
    }
    Ok(Labelled {
        rows,
        cols,
        images,
        labels,
    })
}

/// Decodes the bytes of an images file (3 dimensions) and a labels file (1 dimension), raw or
/// gzip, checking that the counts agree and that every label is below `classes`.
pub fn decode_pair(
    images_path: &Path,
    image_bytes: &[u8],
    labels_path: &Path,
    label_bytes: &[u8],
    classes: usize,
) -> Result<Labelled, DataError> {
    let images = parse(images_path, image_bytes, 3)?;
    let labels = parse(labels_path, label_bytes, 1)?;
    pair(images_path, images, labels_path, labels, classes)
}

/// Reads a pair of IDX files (see [`read`] and [`decode_pair`]); `hint` is appended when a
/// file is missing. The labels are read first: they are small, and checked before the images.
pub fn read_pair(
    images_path: &Path,
    labels_path: &Path,
    classes: usize,
    hint: &str,
) -> Result<Labelled, DataError> {
    let labels = read(labels_path, 1, hint)?;
    let images = read(images_path, 3, hint)?;
    pair(images_path, images, labels_path, labels, classes)
}

/// Encodes an IDX file of unsigned bytes. The caller keeps `data.len()` equal to the product of
/// `dims`; nothing is checked, so tests can also build malformed files.
pub fn encode(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 4 * dims.len() + data.len());
    out.extend_from_slice(&[0, 0, TYPE_U8, dims.len() as u8]);
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

/// Compresses `data` as one gzip member with no file name and an mtime of 0.
pub fn gzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut enc = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    enc.write_all(data)?;
    enc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::testing::format_message;
    use proptest::prelude::*;
    use std::path::PathBuf;

    fn p(name: &str) -> PathBuf {
        PathBuf::from(name)
    }

    fn images(n: u32, rows: u32, cols: u32) -> Vec<u8> {
        let data: Vec<u8> = (0..n * rows * cols).map(|i| (i * 7 % 256) as u8).collect();
        encode(&[n, rows, cols], &data)
    }

    fn labels(values: &[u8]) -> Vec<u8> {
        encode(&[values.len() as u32], values)
    }

    #[test]
    fn round_trip_raw_and_gzip_files() {
        let dir = tempfile::tempdir().unwrap();
        let pixels: Vec<u8> = (0..3 * 4 * 5).map(|i| (i * 13 % 256) as u8).collect();
        let img = encode(&[3, 4, 5], &pixels);
        let lab = labels(&[2, 0, 1]);
        for gz in [false, true] {
            // The names carry no `.gz`: compression is detected from the content.
            let ip = dir.path().join(format!("images-{gz}"));
            let lp = dir.path().join(format!("labels-{gz}"));
            let (ib, lb) = if gz {
                (gzip(&img).unwrap(), gzip(&lab).unwrap())
            } else {
                (img.clone(), lab.clone())
            };
            assert_eq!(ib.starts_with(&GZIP_MAGIC), gz);
            std::fs::write(&ip, ib).unwrap();
            std::fs::write(&lp, lb).unwrap();
            let set = read_pair(&ip, &lp, 3, "").unwrap();
            assert_eq!((set.len(), set.rows, set.cols), (3, 4, 5));
            assert_eq!(set.pixels(), pixels.as_slice());
            assert_eq!(set.labels(), &[2, 0, 1]);
        }
    }

    #[test]
    fn missing_file_is_missing_with_hint() {
        let dir = tempfile::tempdir().unwrap();
        let ip = dir.path().join("nope");
        let e = read_pair(&ip, &ip, 10, ": try harder").unwrap_err();
        assert!(matches!(&e, DataError::Missing { path, .. } if path == &ip));
        assert!(e.to_string().ends_with("not found: try harder"), "{e}");
    }

    #[test]
    fn truncated_and_trailing_data_are_errors() {
        let mut img = images(2, 3, 3);
        img.pop();
        let m = format_message(parse(&p("x.idx"), &img.clone(), 3).unwrap_err());
        assert!(m.contains("x.idx") && m.contains("truncated"), "{m}");
        assert!(m.contains("2×3×3 = 18") && m.contains("found 17"), "{m}");
        img.extend_from_slice(&[0, 0]);
        let m = format_message(parse(&p("x.idx"), &img, 3).unwrap_err());
        assert!(m.contains("trailing") && m.contains("found 19"), "{m}");
        // A truncated header.
        let m = format_message(parse(&p("x.idx"), &[0, 0, 8, 3, 0, 0, 0, 1], 3).unwrap_err());
        assert!(m.contains("truncated header"), "{m}");
    }

    #[test]
    fn truncated_gzip_is_an_error() {
        let gz = gzip(&images(4, 5, 5)).unwrap();
        let cut = gz[..gz.len() / 2].to_vec();
        let m = format_message(parse(&p("cut.gz"), &cut, 3).unwrap_err());
        assert!(m.contains("cut.gz") && m.contains("gzip"), "{m}");
    }

    #[test]
    fn bad_magic_is_an_error() {
        let mut img = images(1, 2, 2);
        img[0] = 0x12;
        let m = format_message(parse(&p("m"), &img.clone(), 3).unwrap_err());
        assert!(
            m.contains("not an IDX file") && m.contains("0x00000803"),
            "{m}"
        );
        img[0] = 0;
        img[2] = 0x0d; // float
        let m = format_message(parse(&p("m"), &img, 3).unwrap_err());
        assert!(m.contains("0x0d is not supported"), "{m}");
        let m = format_message(parse(&p("m"), &[0, 0], 1).unwrap_err());
        assert!(m.contains("too short"), "{m}");
    }

    #[test]
    fn wrong_dimension_count_is_an_error() {
        let m = format_message(parse(&p("l"), &images(2, 2, 2), 1).unwrap_err());
        assert!(
            m.contains("has 3 dimensions") && m.contains("expected 1"),
            "{m}"
        );
        let m = format_message(parse(&p("i"), &labels(&[1, 2]), 3).unwrap_err());
        assert!(
            m.contains("has 1 dimensions") && m.contains("expected 3"),
            "{m}"
        );
    }

    #[test]
    fn label_count_mismatch_and_range_are_errors() {
        let m = format_message(
            decode_pair(&p("img"), &images(3, 2, 2), &p("lab"), &labels(&[0, 1]), 10).unwrap_err(),
        );
        assert!(
            m.starts_with("lab:") && m.contains("2 labels") && m.contains("3 images"),
            "{m}"
        );
        let m = format_message(
            decode_pair(
                &p("img"),
                &images(3, 2, 2),
                &p("lab"),
                &labels(&[0, 1, 10]),
                10,
            )
            .unwrap_err(),
        );
        assert!(m.contains("sample 2 has label 10"), "{m}");
        assert!(decode_pair(
            &p("img"),
            &images(3, 2, 2),
            &p("lab"),
            &labels(&[0, 1, 9]),
            10
        )
        .is_ok());
    }

    #[test]
    fn oversized_shape_is_an_error_not_an_overflow() {
        let mut bytes = vec![0, 0, 8, 3];
        for _ in 0..3 {
            bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        }
        let m = format_message(parse(&p("big"), &bytes, 3).unwrap_err());
        assert!(m.contains("more than an IDX file may hold"), "{m}");
    }

    #[test]
    fn a_gzip_bomb_stops_at_the_declared_size() {
        // A header declaring 10 bytes of labels, then 64 MiB of zeros: refused once the stream
        // holds one byte more than declared, never decompressed in full.
        let mut body = encode(&[10], &[0; 10]);
        body.resize(64 << 20, 0);
        let gz = gzip(&body).unwrap();
        let m = format_message(parse(&p("bomb.gz"), &gz, 1).unwrap_err());
        assert!(m.contains("trailing") && m.contains("more than 10"), "{m}");
        // A header declaring more than an IDX file may hold is refused from the header alone.
        let mut huge = vec![0, 0, 8, 3];
        for d in [65535u32, 65535, 65535] {
            huge.extend_from_slice(&d.to_be_bytes());
        }
        let m = format_message(parse(&p("huge"), &gzip(&huge).unwrap(), 3).unwrap_err());
        assert!(m.contains("more than an IDX file may hold"), "{m}");
    }

    #[test]
    fn a_header_declaring_more_than_the_file_holds_reads_nothing_more() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claims");
        // 60000 images of 28×28 declared, 3 bytes of data present.
        let mut bytes = encode(&[60_000, 28, 28], &[]);
        bytes.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&path, &bytes).unwrap();
        let m = format_message(read(&path, 3, "").unwrap_err());
        assert!(m.contains("truncated") && m.contains("found 3"), "{m}");
    }

    #[test]
    fn a_directory_or_a_bom_says_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let m = format_message(read(dir.path(), 1, "").unwrap_err());
        assert!(m.contains("is a directory"), "{m}");
        let m = format_message(parse(&p("t"), b"\xef\xbb\xbf0 1 2\n", 1).unwrap_err());
        assert!(m.contains("byte-order mark"), "{m}");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), gz in any::<bool>()) {
            let bytes = if gz { [GZIP_MAGIC.to_vec(), bytes].concat() } else { bytes };
            let _ = decode_pair(&p("i"), &bytes, &p("l"), &bytes, 10);
        }

        #[test]
        fn truncated_valid_files_are_errors(n in 1u32..5, rows in 1u32..6, cols in 1u32..6, cut_frac in 0.0f64..1.0, gz in any::<bool>()) {
            let full = images(n, rows, cols);
            let full = if gz { gzip(&full).unwrap() } else { full };
            let cut = ((full.len() as f64) * cut_frac) as usize;
            let lab = labels(&vec![0; n as usize]);
            prop_assert!(decode_pair(&p("i"), &full[..cut], &p("l"), &lab, 10).is_err());
            prop_assert!(decode_pair(&p("i"), &full, &p("l"), &lab, 10).is_ok());
        }

        #[test]
        fn valid_header_with_random_body_never_panics(dims in proptest::collection::vec(0u32..8, 0..5), ndims in 0usize..5, body in proptest::collection::vec(any::<u8>(), 0..100)) {
            let mut bytes = vec![0, 0, 8, dims.len() as u8];
            for d in &dims {
                bytes.extend_from_slice(&d.to_be_bytes());
            }
            bytes.extend_from_slice(&body);
            let expected = dims.iter().map(|&d| d as usize).product::<usize>();
            let r = parse(&p("x"), &bytes, ndims);
            prop_assert_eq!(r.is_ok(), ndims == dims.len() && body.len() == expected);
        }
    }
}
