//! Opening an input file (a data file or a job file): only a regular file is opened, a FIFO or a device never blocks the run, and what is wrong is said plainly.

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// The UTF-8 encoding of U+FEFF, the byte-order mark some editors put at the start of a file.
pub const UTF8_BOM: [u8; 3] = [0xef, 0xbb, 0xbf];

/// Why an input file could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// Nothing is at the path.
    Missing,
    /// The path is a directory.
    Directory,
    /// The path is something other than a regular file or a directory (`what` says which).
    NotRegular(&'static str),
    /// The file exists but cannot be opened or inspected.
    Io(std::io::Error),
}

impl OpenError {
    /// What is wrong, in words that follow the path (`<path> is a directory, ...`).
    pub fn describe(&self, expected: &str) -> String {
        match self {
            OpenError::Missing => "does not exist".into(),
            OpenError::Directory => format!("is a directory, not {expected}"),
            OpenError::NotRegular(what) => {
                format!("is {what}, not a regular file: give {expected} as a plain file")
            }
            OpenError::Io(e) => format!("cannot be read: {e}"),
        }
    }
}

/// The kind of a file that is neither a regular file nor a directory, in words.
fn kind_of(file_type: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if file_type.is_socket() {
            return "a socket";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
    }
    let _ = file_type;
    "a special file"
}

/// Whether something (a file, a folder, anything) is at `path`, following symbolic links.
pub fn exists(path: &Path) -> bool {
    std::fs::metadata(path).is_ok()
}

/// Opens `path` for reading if it is a regular file, and returns it with its length in bytes.
///
/// The file type is checked before opening, and the file is opened non-blocking and checked
/// again through the open handle, so a FIFO put in place of a file meanwhile is refused too,
/// never waited on.
pub fn open_regular(path: &Path) -> Result<(File, u64), OpenError> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => OpenError::Missing,
        _ => OpenError::Io(e),
    })?;
    if meta.is_dir() {
        return Err(OpenError::Directory);
    }
    if !meta.is_file() {
        return Err(OpenError::NotRegular(kind_of(meta.file_type())));
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO for reading waits for a writer unless non-blocking; on a regular file
        // the flag changes nothing.
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => OpenError::Missing,
        _ => OpenError::Io(e),
    })?;
    let meta = file.metadata().map_err(OpenError::Io)?;
    if meta.is_dir() {
        return Err(OpenError::Directory);
    }
    if !meta.is_file() {
        return Err(OpenError::NotRegular(kind_of(meta.file_type())));
    }
    Ok((file, meta.len()))
}

/// Reads at most `limit` bytes of `reader`; `Ok(None)` when it holds more.
pub fn read_at_most(reader: impl Read, limit: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut out = Vec::new();
    reader
        .take(limit.saturating_add(1) as u64)
        .read_to_end(&mut out)?;
    Ok((out.len() <= limit).then_some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_files_open_and_others_say_what_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"abc").unwrap();
        let (_, len) = open_regular(&file).unwrap();
        assert_eq!(len, 3);
        assert!(matches!(
            open_regular(&dir.path().join("none")),
            Err(OpenError::Missing)
        ));
        let e = open_regular(dir.path()).unwrap_err();
        assert!(matches!(e, OpenError::Directory));
        assert!(e.describe("an IDX file").contains("is a directory"));
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_regular(&fifo).unwrap_err();
        assert!(
            matches!(e, OpenError::NotRegular(w) if w.contains("FIFO")),
            "{e:?}"
        );
    }

    #[test]
    fn reading_stops_past_the_limit() {
        assert_eq!(
            read_at_most(&b"abcd"[..], 4).unwrap(),
            Some(b"abcd".to_vec())
        );
        assert_eq!(read_at_most(&b"abcde"[..], 4).unwrap(), None);
    }
}
