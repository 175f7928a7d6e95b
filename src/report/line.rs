//! One results row as one line: the files' names and columns, the `check` cell, the encoding of a row, how a results file is opened (never through a link), and when a long read or copy gives up.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{ProgressRow, RunRow, TrialRow, STATES};
use crate::cancel::Cancel;
use crate::error::ReportError;

/// The file with one row per round.
pub const RUNS_CSV: &str = "runs.csv";
/// The file with one row per trial.
pub const TRIALS_CSV: &str = "trials.csv";
/// The file with one row per trial and epoch.
pub const PROGRESS_CSV: &str = "progress.csv";
/// The last column of every row: a checksum of the row's other cells (16 hex digits of FNV-1a
/// over the cells joined by the unit separator). A row whose cells do not match it is damaged;
/// an empty `check` (a row added by hand) is taken as it is.
pub const CHECK: &str = "check";
/// The longest line a results file may hold; a longer one is damage, not a row.
pub const MAX_LINE: usize = 1 << 20;

/// A row type of a results file: its columns come from serde, and this says what else makes
/// a row that parses unusable.
pub trait ResultsRow: Serialize + DeserializeOwned + Default {
    /// Why this row cannot be a row of its file, if it cannot.
    fn invalid(&self) -> Option<String>;

    /// Whether the file has extra columns after the row's own (see [`super::extra`]).
    const EXTRA: bool = false;

    /// The row's values of the extra columns, by name; None when the file has none.
    fn extra(&self) -> Option<&BTreeMap<String, f64>> {
        None
    }

    /// Where a reader puts the values of the extra columns; None when the file has none.
    fn extra_mut(&mut self) -> Option<&mut BTreeMap<String, f64>> {
        None
    }
}

impl ResultsRow for RunRow {
    fn invalid(&self) -> Option<String> {
        None
    }
}

impl ResultsRow for TrialRow {
    fn invalid(&self) -> Option<String> {
        trial_invalid(&self.trial_id, &self.state)
    }
}

/// Why a row of `trials.csv` with this id and state cannot be one, if it cannot.
pub(super) fn trial_invalid(id: &str, state: &str) -> Option<String> {
    if id.trim().is_empty() {
        return Some("the trial_id is empty".into());
    }
    if !STATES.contains(&state) {
        return Some(format!(
            "the state `{state}` is none of {}",
            STATES.join(", ")
        ));
    }
    None
}

impl ResultsRow for ProgressRow {
    fn invalid(&self) -> Option<String> {
        self.trial_id
            .trim()
            .is_empty()
            .then(|| "the trial_id is empty".into())
    }

    const EXTRA: bool = true;

    fn extra(&self) -> Option<&BTreeMap<String, f64>> {
        Some(&self.extra)
    }

    fn extra_mut(&mut self) -> Option<&mut BTreeMap<String, f64>> {
        Some(&mut self.extra)
    }
}

pub(super) fn write_err(path: &Path) -> impl FnOnce(io::Error) -> ReportError + '_ {
    move |source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn read_err(path: &Path) -> impl FnOnce(io::Error) -> ReportError + '_ {
    move |source| ReportError::Read {
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn csv_err(path: &Path) -> impl FnOnce(::csv::Error) -> ReportError + '_ {
    move |source| ReportError::Csv {
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn damaged(path: &Path, line: u64, message: impl Into<String>) -> ReportError {
    ReportError::Damaged {
        path: path.to_path_buf(),
        line,
        message: message.into(),
    }
}

/// The columns of a row type, in order, without [`CHECK`].
pub(crate) fn columns_of<T: Serialize + Default>() -> Result<::csv::ByteRecord, ReportError> {
    let mut writer = ::csv::Writer::from_writer(Vec::new());
    let invalid = |e: &dyn std::fmt::Display| ReportError::Invalid(format!("row header: {e}"));
    writer.serialize(T::default()).map_err(|e| invalid(&e))?;
    let bytes = writer.into_inner().map_err(|e| invalid(&e))?;
    let mut reader = ::csv::Reader::from_reader(bytes.as_slice());
    Ok(reader.byte_headers().map_err(|e| invalid(&e))?.clone())
}

/// The header a results file of rows `T` is written with: the row's columns, its `extra`
/// columns, then [`CHECK`].
pub(super) fn header_of<T: Serialize + Default>(
    extra: &[String],
) -> Result<::csv::ByteRecord, ReportError> {
    let mut header = columns_of::<T>()?;
    for name in extra {
        header.push_field(name.as_bytes());
    }
    header.push_field(CHECK.as_bytes());
    Ok(header)
}

/// The checksum of a row's cells, as written in its [`CHECK`] cell.
pub(super) fn check_of<'a>(cells: impl Iterator<Item = &'a [u8]>) -> String {
    format!("{:016x}", check_value(cells))
}

/// The number [`check_of`] writes in hex, made without copying the cells.
pub(super) fn check_value<'a>(cells: impl Iterator<Item = &'a [u8]>) -> u64 {
    let mut h = crate::hash::FNV_START;
    for (i, cell) in cells.enumerate() {
        if i > 0 {
            h = crate::hash::fnv1a_more(h, &[0x1f]);
        }
        h = crate::hash::fnv1a_more(h, cell);
    }
    h
}

/// A CSV parser of one row at a time, built once (building one costs more than parsing a
/// row): for the rows with quotes of a file read, and for the rows encoded to be written.
pub(super) struct Splitter {
    reader: csv_core::Reader,
    ends: Vec<usize>,
}

impl Splitter {
    pub(super) fn new() -> Self {
        Splitter {
            reader: csv_core::Reader::new(),
            ends: vec![0; 64],
        }
    }

    /// Parses the one row `raw` (without its line end): its cells are appended to `scratch`,
    /// and their ranges there to `cells`. Refused: bytes that hold more than one row (a
    /// carriage return outside quotes).
    pub(super) fn split(
        &mut self,
        raw: &[u8],
        scratch: &mut Vec<u8>,
        cells: &mut Vec<std::ops::Range<usize>>,
    ) -> Result<(), &'static str> {
        self.reader.reset();
        let base = scratch.len();
        // Unquoting never makes a row longer.
        scratch.resize(base + raw.len() + 1, 0);
        let (mut input, mut nout, mut nend) = (raw, 0, 0);
        loop {
            let (res, nin, o, e) =
                self.reader
                    .read_record(input, &mut scratch[base + nout..], &mut self.ends[nend..]);
            input = &input[nin..];
            nout += o;
            nend += e;
            match res {
                csv_core::ReadRecordResult::OutputEndsFull => {
                    let more = self.ends.len();
                    self.ends.resize(more * 2, 0);
                }
                csv_core::ReadRecordResult::OutputFull => {
                    let more = scratch.len();
                    scratch.resize(more * 2, 0);
                }
                csv_core::ReadRecordResult::InputEmpty if !input.is_empty() => {}
                csv_core::ReadRecordResult::InputEmpty => {
                    // The end of the row: tell the parser there is no more.
                    let (_, _, o, e) = self.reader.read_record(
                        &[],
                        &mut scratch[base + nout..],
                        &mut self.ends[nend..],
                    );
                    nout += o;
                    nend += e;
                    break;
                }
                csv_core::ReadRecordResult::Record | csv_core::ReadRecordResult::End => break,
            }
        }
        if !input.is_empty() {
            return Err(
                "a carriage return inside a row: the file is not written with one row per line",
            );
        }
        scratch.truncate(base + nout);
        let mut start = 0;
        for &end in &self.ends[..nend] {
            cells.push(base + start..base + end.min(nout));
            start = end;
        }
        Ok(())
    }
}

/// The CSV cell splitter of this thread, built once: a row is encoded for every line written,
/// millions of times in a rewrite, and building a CSV reader for each is most of the cost.
pub(super) struct Codec {
    splitter: Splitter,
    out: Vec<u8>,
    cells: Vec<std::ops::Range<usize>>,
}

impl Codec {
    fn new() -> Self {
        Codec {
            splitter: Splitter::new(),
            out: Vec::new(),
            cells: Vec::new(),
        }
    }

    /// The cells of one CSV line (its line end included, or not).
    fn split(&mut self, line: &[u8]) -> Result<::csv::ByteRecord, &'static str> {
        self.out.clear();
        self.cells.clear();
        self.splitter.split(line, &mut self.out, &mut self.cells)?;
        let mut record = ::csv::ByteRecord::new();
        for r in &self.cells {
            record.push_field(&self.out[r.clone()]);
        }
        Ok(record)
    }
}

thread_local! {
    static CODEC: std::cell::RefCell<Codec> = std::cell::RefCell::new(Codec::new());
}

/// A writer of CSV lines into memory (a few hundred bytes each).
pub(super) fn line_writer() -> ::csv::Writer<Vec<u8>> {
    ::csv::WriterBuilder::new()
        .has_headers(false)
        .buffer_capacity(1024)
        .from_writer(Vec::with_capacity(512))
}

/// The cells `value` serializes to.
pub(super) fn cells_of<S: Serialize>(
    path: &Path,
    value: &S,
) -> Result<::csv::ByteRecord, ReportError> {
    let mut writer = line_writer();
    writer.serialize(value).map_err(csv_err(path))?;
    let bytes = writer
        .into_inner()
        .map_err(|e| ReportError::Invalid(format!("{}: {e}", path.display())))?;
    CODEC
        .with_borrow_mut(|c| c.split(&bytes))
        .map_err(|why| ReportError::Invalid(format!("{}: a row encoded: {why}", path.display())))
}

/// The bytes of one CSV line holding `record`'s cells.
pub(super) fn line_of(path: &Path, record: &::csv::ByteRecord) -> Result<Vec<u8>, ReportError> {
    let mut writer = line_writer();
    writer.write_byte_record(record).map_err(csv_err(path))?;
    writer
        .into_inner()
        .map_err(|e| ReportError::Invalid(format!("{}: {e}", path.display())))
}

/// One row as the bytes of one line: a line break inside a cell (a multi-line error message)
/// is written as ` | `, so that every row is one line and a cut row is always the last line;
/// the row's values of the `extra` columns follow its own cells (an empty cell where it has
/// none); with `checked`, the [`CHECK`] cell ends it.
pub(super) fn encode<T: ResultsRow>(
    path: &Path,
    row: &T,
    extra: &[String],
    checked: bool,
) -> Result<Vec<u8>, ReportError> {
    let cells = cells_of(path, row)?;
    let mut record = ::csv::ByteRecord::with_capacity(cells.as_slice().len() + 64, cells.len() + 1);
    for cell in cells.iter() {
        if cell.iter().any(|&b| b == b'\n' || b == b'\r') {
            record.push_field(&one_line(cell));
        } else {
            record.push_field(cell);
        }
    }
    if !extra.is_empty() {
        let values: Vec<Option<f64>> = extra
            .iter()
            .map(|name| row.extra().and_then(|m| m.get(name).copied()))
            .collect();
        let more = cells_of(path, &values)?;
        // A record of one empty cell is written `""`: the same empty cell.
        more.iter().for_each(|c| record.push_field(c));
    }
    if checked {
        let check = check_of(record.iter());
        record.push_field(check.as_bytes());
    }
    line_of(path, &record)
}

/// A cell with its line breaks written as ` | `.
pub(super) fn one_line(cell: &[u8]) -> Vec<u8> {
    if !cell.iter().any(|&b| b == b'\n' || b == b'\r') {
        return cell.to_vec();
    }
    let text = String::from_utf8_lossy(cell).replace("\r\n", "\n");
    text.split(['\n', '\r'])
        .collect::<Vec<_>>()
        .join(" | ")
        .into_bytes()
}

/// Opens a results file with `options`, never through a symbolic link and never waiting on a
/// FIFO (`O_NOFOLLOW | O_NONBLOCK`), and only as a regular file: a link, FIFO, folder or device
/// in a results file's place is refused at once (bad input, exit 2), naming it.
pub(crate) fn open_regular(
    path: &Path,
    options: &mut OpenOptions,
    writing: bool,
) -> Result<File, ReportError> {
    use std::os::unix::fs::OpenOptionsExt;
    let refused = |what: &str| {
        ReportError::Invalid(format!(
            "{}: is {what}, not a regular file: results are written into the output folder only; move it away",
            path.display()
        ))
    };
    let file = options
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refused("a symbolic link"),
            Some(libc::EISDIR) => refused("a folder"),
            Some(libc::ENXIO) => refused("a FIFO"),
            _ if writing => write_err(path)(e),
            _ => read_err(path)(e),
        })?;
    let kind = file.metadata().map_err(read_err(path))?.file_type();
    if !kind.is_file() {
        use std::os::unix::fs::FileTypeExt;
        return Err(refused(if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_dir() {
            "a folder"
        } else {
            "a device or socket"
        }));
    }
    Ok(file)
}

/// Refuses a results file's place that holds anything but a regular file (or nothing), without
/// opening it: see `open_regular`.
pub fn check_regular(path: &Path) -> Result<(), ReportError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(read_err(path)(e)),
        Ok(meta) if meta.file_type().is_file() => Ok(()),
        Ok(_) => open_regular(path, OpenOptions::new().read(true), false).map(|_| ()),
    }
}

/// When a long read or rewrite of a results file gives up: it looks every [`CHECK_EVERY`] rows,
/// and then stops with [`ReportError::Interrupted`], a file being replaced left as it was.
#[derive(Clone, Debug, Default)]
pub enum Interrupt {
    /// It runs to the end.
    #[default]
    Never,
    /// Once `cancel` drains: for work done before any trial starts (reading what a folder holds).
    OnDrain(Cancel),
    /// Once `cancel` aborts (its grace is over): for work on the way of running trials' rows.
    OnAbort(Cancel),
}

/// How many rows a long read or rewrite handles between two looks at its [`Interrupt`].
pub const CHECK_EVERY: u64 = 4096;

impl Interrupt {
    /// Whether the work should stop now.
    pub fn now(&self) -> bool {
        match self {
            Interrupt::Never => false,
            Interrupt::OnDrain(c) => c.draining(),
            Interrupt::OnAbort(c) => c.aborted(),
        }
    }

    /// [`ReportError::Interrupted`] naming `path` when the work should stop now.
    pub fn check(&self, path: &Path) -> Result<(), ReportError> {
        if self.now() {
            return Err(ReportError::Interrupted {
                path: path.to_path_buf(),
            });
        }
        Ok(())
    }
}
