//! Results files (`runs.csv`, `trials.csv`, `progress.csv`): rows appended one fsynced line at a time, whole files replaced atomically, and the one reader that drops a cut last line and refuses damage.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::extra::{self, Dropped};
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

    /// Whether the file has extra columns after the row's own (see [`extra`]).
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
        if self.trial_id.trim().is_empty() {
            return Some("the trial_id is empty".into());
        }
        if !STATES.contains(&self.state.as_str()) {
            return Some(format!(
                "the state `{}` is none of {}",
                self.state,
                STATES.join(", ")
            ));
        }
        None
    }
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

fn write_err(path: &Path) -> impl FnOnce(io::Error) -> ReportError + '_ {
    move |source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    }
}

fn read_err(path: &Path) -> impl FnOnce(io::Error) -> ReportError + '_ {
    move |source| ReportError::Read {
        path: path.to_path_buf(),
        source,
    }
}

fn csv_err(path: &Path) -> impl FnOnce(::csv::Error) -> ReportError + '_ {
    move |source| ReportError::Csv {
        path: path.to_path_buf(),
        source,
    }
}

fn damaged(path: &Path, line: u64, message: impl Into<String>) -> ReportError {
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
fn header_of<T: Serialize + Default>(extra: &[String]) -> Result<::csv::ByteRecord, ReportError> {
    let mut header = columns_of::<T>()?;
    for name in extra {
        header.push_field(name.as_bytes());
    }
    header.push_field(CHECK.as_bytes());
    Ok(header)
}

/// The checksum of a row's cells, as written in its [`CHECK`] cell.
fn check_of<'a>(cells: impl Iterator<Item = &'a [u8]>) -> String {
    format!("{:016x}", check_value(cells))
}

/// The number [`check_of`] writes in hex, made without copying the cells.
fn check_value<'a>(cells: impl Iterator<Item = &'a [u8]>) -> u64 {
    let mut h = crate::hash::FNV_START;
    for (i, cell) in cells.enumerate() {
        if i > 0 {
            h = crate::hash::fnv1a_more(h, &[0x1f]);
        }
        h = crate::hash::fnv1a_more(h, cell);
    }
    h
}

/// Whether a row's `check` cell holds the check of its cells (16 hex digits, either case).
fn check_matches<'a>(given: &[u8], cells: impl Iterator<Item = &'a [u8]>) -> bool {
    given.len() == 16
        && given.iter().all(u8::is_ascii_hexdigit)
        && std::str::from_utf8(given)
            .ok()
            .and_then(|g| u64::from_str_radix(g, 16).ok())
            .is_some_and(|g| g == check_value(cells))
}

/// The CSV cell splitter of this thread, built once: a row is encoded for every line written,
/// millions of times in a rewrite, and building a CSV reader for each is most of the cost.
struct Codec {
    splitter: csv_core::Reader,
    out: Vec<u8>,
    ends: Vec<usize>,
}

impl Codec {
    fn new() -> Self {
        Codec {
            splitter: csv_core::Reader::new(),
            out: Vec::new(),
            ends: vec![0; 64],
        }
    }

    /// The cells of one CSV line.
    fn split(&mut self, line: &[u8]) -> ::csv::ByteRecord {
        self.splitter.reset();
        self.out.clear();
        self.out.resize(line.len().max(1), 0);
        let (mut input, mut nout, mut nend) = (line, 0, 0);
        loop {
            let (res, nin, o, e) =
                self.splitter
                    .read_record(input, &mut self.out[nout..], &mut self.ends[nend..]);
            input = &input[nin..];
            nout += o;
            nend += e;
            match res {
                csv_core::ReadRecordResult::OutputEndsFull => {
                    let more = self.ends.len();
                    self.ends.resize(more * 2, 0);
                }
                csv_core::ReadRecordResult::OutputFull => {
                    let more = self.out.len();
                    self.out.resize(more * 2, 0);
                }
                csv_core::ReadRecordResult::InputEmpty if !input.is_empty() => {}
                csv_core::ReadRecordResult::InputEmpty => {
                    // The end of the line: tell the splitter there is no more.
                    input = &[];
                    let (_, _, o, e) = self.splitter.read_record(
                        input,
                        &mut self.out[nout..],
                        &mut self.ends[nend..],
                    );
                    nout += o;
                    nend += e;
                    break;
                }
                csv_core::ReadRecordResult::Record | csv_core::ReadRecordResult::End => break,
            }
        }
        let mut record = ::csv::ByteRecord::new();
        let mut start = 0;
        for &end in &self.ends[..nend] {
            record.push_field(&self.out[start..end.min(nout)]);
            start = end;
        }
        record
    }
}

thread_local! {
    static CODEC: std::cell::RefCell<Codec> = std::cell::RefCell::new(Codec::new());
}

/// A writer of CSV lines into memory (a few hundred bytes each).
fn line_writer() -> ::csv::Writer<Vec<u8>> {
    ::csv::WriterBuilder::new()
        .has_headers(false)
        .buffer_capacity(1024)
        .from_writer(Vec::with_capacity(512))
}

/// The cells `value` serializes to.
fn cells_of<S: Serialize>(path: &Path, value: &S) -> Result<::csv::ByteRecord, ReportError> {
    let mut writer = line_writer();
    writer.serialize(value).map_err(csv_err(path))?;
    let bytes = writer
        .into_inner()
        .map_err(|e| ReportError::Invalid(format!("{}: {e}", path.display())))?;
    Ok(CODEC.with_borrow_mut(|c| c.split(&bytes)))
}

/// The bytes of one CSV line holding `record`'s cells.
fn line_of(path: &Path, record: &::csv::ByteRecord) -> Result<Vec<u8>, ReportError> {
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
fn encode<T: ResultsRow>(
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
fn one_line(cell: &[u8]) -> Vec<u8> {
    if !cell.iter().any(|&b| b == b'\n' || b == b'\r') {
        return cell.to_vec();
    }
    let text = String::from_utf8_lossy(cell).replace("\r\n", "\n");
    text.split(['\n', '\r'])
        .collect::<Vec<_>>()
        .join(" | ")
        .into_bytes()
}

/// One results file open for appending: each row is one line, written whole, flushed and
/// fsynced before the call returns; a row that cannot be written whole is taken back out.
struct Sink {
    path: PathBuf,
    file: File,
    /// The file's length after its last whole row.
    len: u64,
    /// Whether rows end with the [`CHECK`] cell (files written before it had none).
    checked: bool,
    /// The row's own columns.
    fixed: ::csv::ByteRecord,
    /// The file's extra columns, in order (see [`extra`]); always empty for a row type
    /// without them.
    extra: Vec<String>,
    /// The keys not kept as columns.
    dropped: Dropped,
    /// When a rewrite for a wider header gives up.
    interrupt: Interrupt,
}

impl Sink {
    fn open<T: ResultsRow>(path: PathBuf, append: bool) -> Result<Self, ReportError> {
        let fixed = columns_of::<T>()?;
        let existing = append && non_empty(&path)?;
        let (checked, extra) = if existing {
            check_header::<T>(&path, &fixed)?
        } else {
            (true, Vec::new())
        };
        let mut options = OpenOptions::new();
        if append {
            options.read(true).append(true).create(true);
        } else {
            options.write(true).create(true).truncate(true);
        }
        let mut file = open_regular(&path, &mut options, true)?;
        let len = if existing {
            end_with_newline(&path, &mut file)?
        } else {
            0
        };
        let mut sink = Sink {
            path,
            file,
            len,
            checked,
            fixed,
            extra,
            dropped: Dropped::default(),
            interrupt: Interrupt::Never,
        };
        if !existing {
            let header = header_of::<T>(&[])?;
            let mut writer = ::csv::Writer::from_writer(Vec::new());
            writer
                .write_byte_record(&header)
                .map_err(csv_err(&sink.path))?;
            let bytes = writer
                .into_inner()
                .map_err(|e| ReportError::Invalid(e.to_string()))?;
            sink.append(&bytes)?;
        }
        Ok(sink)
    }

    fn write<T: ResultsRow>(&mut self, row: &T) -> Result<(), ReportError> {
        self.widen(row)?;
        let bytes = encode(&self.path, row, &self.extra, self.checked)?;
        self.append(&bytes)
    }

    /// Appends one whole row without fsyncing it (see [`Sink::sync`]); on an error the file is
    /// cut back to its last whole row.
    fn write_unsynced<T: ResultsRow>(&mut self, row: &T) -> Result<(), ReportError> {
        self.widen(row)?;
        let bytes = encode(&self.path, row, &self.extra, self.checked)?;
        match self.file.write_all(&bytes) {
            Ok(()) => {
                self.len += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.len);
                Err(write_err(&self.path)(e))
            }
        }
    }

    /// When `row` has a value for a key the header lacks (and may name a column: see
    /// [`extra`]), replaces the file whole with the wider header: its rows are read first with
    /// the one reader, so a damaged file is refused, never rewritten; they get an empty cell
    /// in each new column and a new check. Then the file is open for appending again.
    fn widen<T: ResultsRow>(&mut self, row: &T) -> Result<(), ReportError> {
        let Some(values) = row.extra() else {
            return Ok(());
        };
        if values
            .keys()
            .all(|k| self.extra.contains(k) || self.dropped.has(k))
        {
            return Ok(());
        }
        let wider = extra::widened(
            &self.path,
            &self.extra,
            [values],
            &self.fixed,
            &mut self.dropped,
        );
        if wider.len() == self.extra.len() {
            return Ok(());
        }
        // Row by row: the file is never held in memory; a signal stops the copy at its grace.
        let lines = RowReader::<T>::open(&self.path)?
            .interrupted_by(&self.interrupt)
            .with_lines(&wider)
            .map(|r| r.map(|(_, line)| line));
        write_lines::<T>(&self.path, lines, &wider, &self.interrupt, &mut |_| true)?;
        let mut file = open_regular(&self.path, OpenOptions::new().read(true).append(true), true)?;
        self.len = file.seek(SeekFrom::End(0)).map_err(read_err(&self.path))?;
        self.file = file;
        self.checked = true;
        self.extra = wider;
        Ok(())
    }

    /// Fsyncs the rows written so far.
    fn sync(&mut self) -> Result<(), ReportError> {
        self.file.sync_data().map_err(write_err(&self.path))
    }

    /// Appends one whole line and fsyncs it; on an error (a full disk) the file is cut back
    /// to its last whole row, so what was there before stays readable.
    fn append(&mut self, bytes: &[u8]) -> Result<(), ReportError> {
        let done = self
            .file
            .write_all(bytes)
            .and_then(|()| self.file.sync_data());
        match done {
            Ok(()) => {
                self.len += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.len);
                let _ = self.file.sync_data();
                Err(write_err(&self.path)(e))
            }
        }
    }
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
/// opening it: see [`open_regular`].
pub fn check_regular(path: &Path) -> Result<(), ReportError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(read_err(path)(e)),
        Ok(meta) if meta.file_type().is_file() => Ok(()),
        Ok(_) => open_regular(path, OpenOptions::new().read(true), false).map(|_| ()),
    }
}

fn non_empty(path: &Path) -> Result<bool, ReportError> {
    match fs::metadata(path) {
        Ok(meta) => Ok(meta.len() > 0),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(read_err(path)(e)),
    }
}

/// Appending to a file written with other columns would corrupt it: refuse instead. Returns
/// whether its rows carry the [`CHECK`] cell (files written before it had none), and its
/// extra columns (a header with them has [`CHECK`]; see [`extra`]).
fn check_header<T: ResultsRow>(
    path: &Path,
    fixed: &::csv::ByteRecord,
) -> Result<(bool, Vec<String>), ReportError> {
    let file = open_regular(path, OpenOptions::new().read(true), false)?;
    let mut reader = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(BufReader::new(file).take(MAX_LINE as u64));
    let mut found = ::csv::ByteRecord::new();
    reader
        .read_byte_record(&mut found)
        .map_err(|e| damaged(path, 1, format!("the header does not parse: {e}")))?;
    if &found == fixed {
        return Ok((false, Vec::new()));
    }
    let n = fixed.len();
    let own = found.len() > n && found.iter().take(n).eq(fixed.iter());
    if own && found.get(found.len() - 1) == Some(CHECK.as_bytes()) {
        let more: Vec<&[u8]> = found.iter().skip(n).take(found.len() - n - 1).collect();
        let names: Option<Vec<String>> = more
            .iter()
            .map(|c| std::str::from_utf8(c).ok().map(str::to_string))
            .collect();
        if let Some(names) = names {
            let unique = names.iter().collect::<std::collections::HashSet<_>>().len();
            let fine = names.is_empty()
                || (T::EXTRA
                    && names.len() <= extra::MAX_EXTRA
                    && unique == names.len()
                    && names
                        .iter()
                        .all(|c| extra::refusal(c, fixed.iter()).is_none()));
            if fine {
                return Ok((true, names));
            }
        }
    }
    let expected = header_of::<T>(&[])?;
    Err(ReportError::Invalid(format!(
        "{}: cannot append: its columns are `{}`, expected `{}`{}",
        path.display(),
        join(&found),
        join(&expected),
        if T::EXTRA {
            " (and extra columns before the last)"
        } else {
            ""
        },
    )))
}

fn join(r: &::csv::ByteRecord) -> String {
    r.iter()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join(",")
}

/// A row cut short by an interruption (a kill in the middle of a write) is the last line,
/// without its newline: it is dropped, so the next row starts on a line of its own. Returns
/// the file's new length.
fn end_with_newline(path: &Path, file: &mut File) -> Result<u64, ReportError> {
    let len = file.seek(SeekFrom::End(0)).map_err(read_err(path))?;
    let mut tail = Vec::new();
    let from = len.saturating_sub(MAX_LINE as u64);
    file.seek(SeekFrom::Start(from)).map_err(read_err(path))?;
    file.read_to_end(&mut tail).map_err(read_err(path))?;
    if tail.last() == Some(&b'\n') {
        return Ok(len);
    }
    let keep = match tail.iter().rposition(|&b| b == b'\n') {
        Some(i) => from + i as u64 + 1,
        None if from == 0 => 0,
        None => {
            return Err(damaged(
                path,
                0,
                format!("its last line is over {} KiB", MAX_LINE >> 10),
            ))
        }
    };
    tracing::warn!(
        "{}: dropping its last line, a row cut short ({} bytes)",
        path.display(),
        len - keep
    );
    file.set_len(keep).map_err(write_err(path))?;
    file.sync_data().map_err(write_err(path))?;
    Ok(keep)
}

/// Writes the three results files of one output directory, a row at a time.
pub struct ReportWriter {
    dir: PathBuf,
    runs: Sink,
    trials: Sink,
    progress: Sink,
}

impl ReportWriter {
    /// Creates `dir` if needed and opens its results files. With `append`, existing files keep
    /// their rows and header (their columns must match; a cut last line is dropped); without
    /// it, they are rewritten. Each file has its header as soon as this returns.
    pub fn open(dir: &Path, append: bool) -> Result<Self, ReportError> {
        fs::create_dir_all(dir).map_err(write_err(dir))?;
        Ok(ReportWriter {
            dir: dir.to_path_buf(),
            runs: Sink::open::<RunRow>(dir.join(RUNS_CSV), append)?,
            trials: Sink::open::<TrialRow>(dir.join(TRIALS_CSV), append)?,
            progress: Sink::open::<ProgressRow>(dir.join(PROGRESS_CSV), append)?,
        })
    }

    /// Opens `dir` with fresh results files.
    pub fn create(dir: &Path) -> Result<Self, ReportError> {
        Self::open(dir, false)
    }

    /// Opens `dir`, adding rows to the results files already there.
    pub fn append(dir: &Path) -> Result<Self, ReportError> {
        Self::open(dir, true)
    }

    /// Lets a signal stop a rewrite of a results file for a wider header (see [`Interrupt`]):
    /// the row that needed it is not written, and the file is left as it was.
    pub fn interrupted_by(&mut self, interrupt: &Interrupt) {
        for sink in [&mut self.runs, &mut self.trials, &mut self.progress] {
            sink.interrupt = interrupt.clone();
        }
    }

    /// The directory written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes one round's row to `runs.csv`; it is on disk when this returns.
    pub fn run(&mut self, row: &RunRow) -> Result<(), ReportError> {
        self.runs.write(row)
    }

    /// Writes one trial's row to `trials.csv`; it is on disk when this returns.
    pub fn trial(&mut self, row: &TrialRow) -> Result<(), ReportError> {
        self.trials.write(row)
    }

    /// Writes one epoch's row to `progress.csv`; it is on disk when this returns.
    pub fn progress(&mut self, row: &ProgressRow) -> Result<(), ReportError> {
        self.progress.write(row)
    }

    /// Writes one epoch's row to `progress.csv`, whole, without fsyncing it: a burst of rows
    /// is fsynced at once by [`ReportWriter::sync_progress`].
    pub fn progress_unsynced(&mut self, row: &ProgressRow) -> Result<(), ReportError> {
        self.progress.write_unsynced(row)
    }

    /// Fsyncs the rows of `progress.csv` written so far.
    pub fn sync_progress(&mut self) -> Result<(), ReportError> {
        self.progress.sync()
    }
}

/// Replaces the results file at `path` with `rows`, whole: a temporary file, one fsync, a
/// rename (see [`crate::outdir::replace_file`]). The file is the old one or the whole new one.
/// Rows with extra values (`progress.csv`'s) get the union of their keys as columns (see
/// [`extra`]): the columns the file at `path` has already keep their place, new keys follow
/// in the order they first appear.
pub fn write_rows<T: ResultsRow>(path: &Path, rows: &[T]) -> Result<(), ReportError> {
    let mut columns = Vec::new();
    if T::EXTRA
        && rows
            .iter()
            .any(|r| r.extra().is_some_and(|m| !m.is_empty()))
    {
        let fixed = columns_of::<T>()?;
        let held = extra::widened(
            path,
            &[],
            rows.iter().filter_map(ResultsRow::extra),
            &fixed,
            &mut Dropped::default(),
        );
        let before = existing_extra(path, &fixed);
        columns = before
            .into_iter()
            .filter(|c| held.contains(c))
            .collect::<Vec<_>>();
        columns.extend(
            held.into_iter()
                .filter(|c| !columns.contains(c))
                .collect::<Vec<_>>(),
        );
        columns.truncate(extra::MAX_EXTRA);
    }
    write_rows_as(path, rows, &columns)
}

/// The extra columns of the header of the file at `path`, if it has one that reads; none
/// otherwise.
pub(crate) fn existing_extra(path: &Path, fixed: &::csv::ByteRecord) -> Vec<String> {
    let Ok(file) = open_regular(path, OpenOptions::new().read(true), false) else {
        return Vec::new();
    };
    let mut reader = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(BufReader::new(file).take(MAX_LINE as u64));
    let mut header = ::csv::ByteRecord::new();
    if !matches!(reader.read_byte_record(&mut header), Ok(true)) {
        return Vec::new();
    }
    header
        .iter()
        .filter_map(|c| std::str::from_utf8(c).ok())
        .filter(|c| extra::refusal(c, fixed.iter()).is_none())
        .map(str::to_string)
        .collect()
}

/// [`write_rows`] with these extra columns.
fn write_rows_as<T: ResultsRow>(
    path: &Path,
    rows: &[T],
    extra: &[String],
) -> Result<(), ReportError> {
    write_rows_from::<T, &T>(path, rows.iter().map(Ok), extra, &Interrupt::Never)
}

/// Replaces the results file at `path` with the rows `rows` gives, each encoded as it is
/// written, so that memory does not grow with the file: the file is the old one or the whole
/// new one (see [`crate::outdir::replace_file`]). The first error `rows` gives (a damaged line
/// of the file read), a row that cannot be encoded, or a stop by `interrupt` leaves the old
/// file as it was and is returned.
pub fn write_rows_from<T: ResultsRow, R: std::borrow::Borrow<T>>(
    path: &Path,
    rows: impl IntoIterator<Item = Result<R, ReportError>>,
    extra: &[String],
    interrupt: &Interrupt,
) -> Result<(), ReportError> {
    let lines = rows
        .into_iter()
        .map(|row| row.and_then(|row| encode(path, row.borrow(), extra, true)));
    write_lines::<T>(path, lines, extra, interrupt, &mut |_| true)
}

/// Replaces the results file at `path` (as [`write_rows_from`] does) with rows already encoded
/// as lines under the header of `T` and `extra` ([`RowReader::with_lines`]), those that `keep`
/// keeps (rows equal field for field are encoded alike).
pub fn write_lines<T: ResultsRow>(
    path: &Path,
    lines: impl IntoIterator<Item = Result<Vec<u8>, ReportError>>,
    extra: &[String],
    interrupt: &Interrupt,
    keep: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<(), ReportError> {
    let header = header_of::<T>(extra)?;
    let head = line_of(path, &header)?;
    let mut failed = None;
    let written = crate::outdir::replace_file(path, |w| {
        w.write_all(&head)?;
        for (n, line) in lines.into_iter().enumerate() {
            let line = line.and_then(|line| {
                if n as u64 % CHECK_EVERY == CHECK_EVERY - 1 {
                    interrupt.check(path)?;
                }
                Ok(line)
            });
            match line {
                Ok(line) if keep(&line) => w.write_all(&line)?,
                Ok(_) => {}
                Err(e) => {
                    failed = Some(e);
                    return Err(io::Error::other("a row cannot be written"));
                }
            }
        }
        Ok(())
    });
    match failed {
        Some(e) => Err(e),
        None => written,
    }
}

/// Replaces the three results files of `dir` (created if needed) with these rows; each file
/// is either the old one or the whole new one, whenever the process stops.
pub fn write_all(
    dir: &Path,
    runs: &[RunRow],
    trials: &[TrialRow],
    progress: &[ProgressRow],
) -> Result<(), ReportError> {
    fs::create_dir_all(dir).map_err(write_err(dir))?;
    write_rows(&dir.join(RUNS_CSV), runs)?;
    write_rows(&dir.join(PROGRESS_CSV), progress)?;
    write_rows(&dir.join(TRIALS_CSV), trials)
}

/// Where the whole lines of a file end, found in one pass that also bounds every line.
struct Lines {
    /// The offset after the last newline: the whole lines are the bytes before it.
    end: u64,
    /// The file's length; the bytes from `end` on are a line cut short.
    len: u64,
    /// How many whole lines there are.
    count: u64,
    /// Whether the line cut short holds a carriage return, which no row ever does: a file
    /// with other line ends, not a row cut by a kill.
    tail_cr: bool,
}

fn scan_lines(path: &Path, file: &File) -> Result<Lines, ReportError> {
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let (mut pos, mut end, mut count, mut line_len) = (0u64, 0u64, 0u64, 0usize);
    let mut cr = false;
    loop {
        let buf = reader.fill_buf().map_err(read_err(path))?;
        if buf.is_empty() {
            break;
        }
        let n = buf.len();
        let mut start = 0;
        while let Some(i) = buf[start..].iter().position(|&b| b == b'\n') {
            line_len += i;
            if line_len > MAX_LINE {
                return Err(damaged(
                    path,
                    count + 1,
                    format!("the line is over {} KiB", MAX_LINE >> 10),
                ));
            }
            count += 1;
            end = pos + (start + i) as u64 + 1;
            line_len = 0;
            cr = false;
            start += i + 1;
        }
        line_len += n - start;
        cr |= buf[start..].contains(&b'\r');
        if line_len > MAX_LINE {
            return Err(damaged(
                path,
                count + 1,
                format!("the line is over {} KiB", MAX_LINE >> 10),
            ));
        }
        pos += n as u64;
        reader.consume(n);
    }
    Ok(Lines {
        end,
        len: pos,
        count,
        tail_cr: cr,
    })
}

/// The extra columns of a header: each one's index and name.
type ExtraColumns = Vec<(usize, String)>;

/// Checks a header against the row type, and returns the index of its [`CHECK`] column and its
/// extra columns (a row type with them takes any name [`extra::refusal`] lets through, up to
/// [`extra::MAX_EXTRA`]).
/// Refused: a NUL byte, text that is not UTF-8, a name twice, a name the row does not know,
/// [`CHECK`] anywhere but last, and a column the row needs missing. A header with [`CHECK`]
/// (written since rows carry it) must name every column of the row; one without it (an
/// older file) only those the row cannot do without.
fn check_columns<T: ResultsRow>(
    path: &Path,
    header: &::csv::ByteRecord,
) -> Result<(Option<usize>, ExtraColumns), ReportError> {
    let bad = |m: String| damaged(path, 1, format!("the header {m}"));
    if header.iter().any(|c| c.contains(&0)) {
        return Err(bad("holds a NUL byte".into()));
    }
    let names: Vec<&str> = header
        .iter()
        .map(std::str::from_utf8)
        .collect::<Result<_, _>>()
        .map_err(|_| bad("is not UTF-8 text".into()))?;
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = names.iter().find(|n| !seen.insert(**n)) {
        return Err(bad(format!("names `{dup}` twice")));
    }
    let columns = columns_of::<T>()?;
    let known: Vec<&str> = columns
        .iter()
        .filter_map(|c| std::str::from_utf8(c).ok())
        .collect();
    let mut extra_columns = Vec::new();
    for (i, name) in names.iter().enumerate() {
        if *name == CHECK || known.contains(name) {
            continue;
        }
        let why = if T::EXTRA {
            match extra::refusal(name, columns.iter()) {
                None if extra_columns.len() < extra::MAX_EXTRA => {
                    extra_columns.push((i, name.to_string()));
                    continue;
                }
                None => format!("more than {} extra columns", extra::MAX_EXTRA),
                Some(why) => why,
            }
        } else {
            format!("which is no column of {}", file_name(path))
        };
        return Err(bad(format!("names `{name}`, {why}")));
    }
    let check = names.iter().position(|n| *n == CHECK);
    if check.is_some_and(|i| i + 1 != names.len()) {
        return Err(bad(format!("has `{CHECK}` before its last column")));
    }
    let missing: Vec<&str> = known
        .iter()
        .filter(|c| !names.contains(c))
        .copied()
        .collect();
    if check.is_some() && !missing.is_empty() {
        return Err(bad(format!("lacks the columns {}", missing.join(", "))));
    }
    // An older file: a row of defaults under this header deserializes only when every column
    // the row cannot do without is there.
    let defaults = one_record(&encode(path, &T::default(), &[], false)?)?;
    let probe: ::csv::ByteRecord = header
        .iter()
        .map(|name| {
            columns
                .iter()
                .position(|c| c == name)
                .and_then(|i| defaults.get(i))
                .unwrap_or(b"")
        })
        .collect();
    if let Err(e) = probe.deserialize::<T>(Some(header)) {
        return Err(bad(format!(
            "lacks columns its rows need ({}): {e}",
            missing.join(", ")
        )));
    }
    Ok((check, extra_columns))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// The cells of one encoded line.
fn one_record(line: &[u8]) -> Result<::csv::ByteRecord, ReportError> {
    let mut r = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(line);
    let mut rec = ::csv::ByteRecord::new();
    r.read_byte_record(&mut rec)
        .map_err(|e| ReportError::Invalid(format!("a row of defaults: {e}")))?;
    Ok(rec)
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

/// The rows of a results file, read one at a time by the one reader of `runs.csv`, `trials.csv`
/// and `progress.csv` (used by resume, dry runs, merge and report), so that memory does not
/// grow with the file.
///
/// - A last line without its newline is a row cut short by a kill: it is dropped (and said).
/// - Any other damage is refused, naming the file and the line: a wrong number of cells, a NUL
///   byte, text that is not UTF-8, an unknown state, a number that does not parse, a cell that
///   does not match the row's checksum, a quoted cell never closed, a line over [`MAX_LINE`].
///   Every line is bounded before any is parsed; the other checks come row by row, so a caller
///   that must refuse a damaged file before acting reads it through once first.
/// - A file of zero bytes, or with its header alone, has no rows.
pub struct RowReader<T> {
    path: PathBuf,
    /// `None` when the file has no header (zero bytes).
    reader: Option<::csv::Reader<io::Take<BufReader<File>>>>,
    header: ::csv::ByteRecord,
    check: Option<usize>,
    extra_columns: ExtraColumns,
    record: ::csv::ByteRecord,
    /// The line of the last row read, and whether its last cell ran on past its line end.
    last: Option<(u64, bool)>,
    /// Set once the reader has ended (the rows are over, or an error was returned).
    done: bool,
    rows: u64,
    interrupt: Interrupt,
    row: std::marker::PhantomData<fn() -> T>,
}

impl<T: ResultsRow> RowReader<T> {
    /// Opens the file (a link, FIFO or folder in its place is refused), bounds its lines and
    /// checks its header.
    pub fn open(path: &Path) -> Result<Self, ReportError> {
        let file = open_regular(path, OpenOptions::new().read(true), false)?;
        let lines = scan_lines(path, &file)?;
        if lines.tail_cr {
            return Err(damaged(
                path,
                lines.count + 1,
                "a carriage return without a newline: the file is not written with one row per line",
            ));
        }
        if lines.end < lines.len {
            tracing::warn!(
                "{}: dropping line {}, a row cut short ({} bytes without a newline)",
                path.display(),
                lines.count + 1,
                lines.len - lines.end
            );
        }
        let mut out = RowReader {
            path: path.to_path_buf(),
            reader: None,
            header: ::csv::ByteRecord::new(),
            check: None,
            extra_columns: Vec::new(),
            record: ::csv::ByteRecord::new(),
            last: None,
            done: true,
            rows: 0,
            interrupt: Interrupt::Never,
            row: std::marker::PhantomData,
        };
        if lines.count == 0 {
            return Ok(out);
        }
        let mut file = file;
        file.seek(SeekFrom::Start(0)).map_err(read_err(path))?;
        let mut reader = ::csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(BufReader::with_capacity(1 << 16, file).take(lines.end));
        if !reader
            .read_byte_record(&mut out.header)
            .map_err(|e| parse_error(path, e))?
        {
            return Ok(out);
        }
        (out.check, out.extra_columns) = check_columns::<T>(path, &out.header)?;
        out.reader = Some(reader);
        out.done = false;
        Ok(out)
    }

    /// The same reader, giving up as `interrupt` says.
    pub fn interrupted_by(mut self, interrupt: &Interrupt) -> Self {
        self.interrupt = interrupt.clone();
        self
    }

    /// The file's extra columns (see [`extra`]), in order.
    pub fn extra_columns(&self) -> Vec<String> {
        self.extra_columns.iter().map(|(_, n)| n.clone()).collect()
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next row, `None` at the end of the rows.
    fn next_row(&mut self) -> Result<Option<T>, ReportError> {
        let path = self.path.as_path();
        let Some(reader) = self.reader.as_mut() else {
            return Ok(None);
        };
        if self.rows % CHECK_EVERY == CHECK_EVERY - 1 {
            self.interrupt.check(path)?;
        }
        if !reader
            .read_byte_record(&mut self.record)
            .map_err(|e| parse_error(path, e))?
        {
            // A quoted cell left open runs to the end of the file, taking its line break with it.
            if let Some((line, true)) = self.last {
                return Err(damaged(path, line, "a quoted cell is never closed"));
            }
            return Ok(None);
        }
        let (record, header) = (&self.record, &self.header);
        let line = record.position().map_or(0, |p| p.line());
        if record.len() != header.len() {
            return Err(damaged(
                path,
                line,
                format!(
                    "{} cells where the header has {}",
                    record.len(),
                    header.len()
                ),
            ));
        }
        if record.iter().any(|c| c.contains(&0)) {
            return Err(damaged(path, line, "a NUL byte"));
        }
        if let Some(i) = self.check {
            let given = record.get(i).unwrap_or(b"");
            if !given.is_empty() && !check_matches(given, record.iter().take(i)) {
                return Err(damaged(
                    path,
                    line,
                    "its cells do not match its check: the row was changed after it was written",
                ));
            }
        }
        let mut row: T = record
            .deserialize(Some(header))
            .map_err(|e| damaged(path, line, cell_error(header, &e)))?;
        if let Some(values) = row.extra_mut() {
            // An empty cell: the trial did not report the key in this epoch.
            for (i, name) in &self.extra_columns {
                let cell = record.get(*i).unwrap_or(b"");
                if cell.is_empty() {
                    continue;
                }
                let value = std::str::from_utf8(cell)
                    .ok()
                    .and_then(|c| c.parse::<f64>().ok())
                    .ok_or_else(|| {
                        damaged(path, line, format!("the cell `{name}` is no number"))
                    })?;
                values.insert(name.clone(), value);
            }
        }
        if let Some(why) = row.invalid() {
            return Err(damaged(path, line, why));
        }
        let open = record
            .get(record.len() - 1)
            .is_some_and(|c| c.ends_with(b"\n"));
        self.last = Some((line, open));
        self.rows += 1;
        Ok(Some(row))
    }
}

impl<T: ResultsRow> Iterator for RowReader<T> {
    type Item = Result<T, ReportError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let got = self.next_row().transpose();
        if !matches!(got, Some(Ok(_))) {
            self.done = true;
        }
        got
    }
}

/// The rows of a [`RowReader`], each with its line as written under other extra columns
/// ([`RowReader::with_lines`]).
pub struct WithLines<T> {
    reader: RowReader<T>,
    extra: Vec<String>,
    /// For each cell of the line written (the row's own, then `extra`): the index of the cell
    /// read that it copies, or `None` for an empty one. `None` when the file read lacks some
    /// column of the row (an older file): its rows are encoded from their values.
    from: Option<Vec<Option<usize>>>,
    line: Vec<u8>,
}

impl<T: ResultsRow> RowReader<T> {
    /// The rows, each with its line as [`write_lines`] writes it under the extra columns
    /// `extra`: a row whose check was verified is copied from the cells it was read from
    /// (its values are not formatted again), in the columns' new order, with a new check;
    /// any other row (no check, a line break in a cell, an older file) is encoded from its
    /// values. Either way the line is the one [`write_rows_from`] would write.
    pub fn with_lines(self, extra: &[String]) -> WithLines<T> {
        let position = |name: &[u8]| self.header.iter().position(|c| c == name);
        let from = self.check.and_then(|_| {
            let fixed = columns_of::<T>().ok()?;
            let mut from: Vec<Option<usize>> = Vec::with_capacity(fixed.len() + extra.len());
            for name in fixed.iter() {
                from.push(Some(position(name)?));
            }
            from.extend(extra.iter().map(|name| position(name.as_bytes())));
            Some(from)
        });
        WithLines {
            reader: self,
            extra: extra.to_vec(),
            from,
            line: Vec::with_capacity(256),
        }
    }
}

impl<T: ResultsRow> WithLines<T> {
    /// The line of the row just read, copied from its cells; `None` when it must be encoded.
    fn copied(&mut self) -> Option<Vec<u8>> {
        let from = self.from.as_ref()?;
        let record = &self.reader.record;
        let i = self.reader.check?;
        if record.get(i).is_none_or(|c| c.is_empty()) {
            return None;
        }
        let cell = |k: &Option<usize>| k.and_then(|k| record.get(k)).unwrap_or(b"");
        // A cell that would need quoting: encoded from its values instead.
        let plain = |c: &[u8]| !c.iter().any(|&b| matches!(b, b',' | b'"' | b'\n' | b'\r'));
        if !from.iter().all(|k| plain(cell(k))) {
            return None;
        }
        let check = check_value(from.iter().map(cell));
        self.line.clear();
        for k in from {
            self.line.extend_from_slice(cell(k));
            self.line.push(b',');
        }
        self.line
            .extend_from_slice(format!("{check:016x}\n").as_bytes());
        Some(self.line.clone())
    }
}

impl<T: ResultsRow> Iterator for WithLines<T> {
    type Item = Result<(T, Vec<u8>), ReportError>;

    fn next(&mut self) -> Option<Self::Item> {
        let row = match self.reader.next()? {
            Ok(row) => row,
            Err(e) => return Some(Err(e)),
        };
        let line = match self.copied() {
            Some(line) => Ok(line),
            None => encode(&self.reader.path, &row, &self.extra, true),
        };
        Some(line.map(|line| (row, line)))
    }
}

fn parse_error(path: &Path, e: ::csv::Error) -> ReportError {
    let line = e.position().map_or(0, |p| p.line());
    damaged(path, line, format!("does not parse: {e}"))
}

/// Reads every row of a results file with [`RowReader`]: any damage refuses the whole file.
pub fn read_rows<T: ResultsRow>(path: &Path) -> Result<Vec<T>, ReportError> {
    RowReader::open(path)?.collect()
}

/// Reads a results file through to its end, every row checked, keeping none: whether it can be
/// read, with the rows it holds counted.
pub fn check_rows<T: ResultsRow>(path: &Path, interrupt: &Interrupt) -> Result<u64, ReportError> {
    let mut n = 0;
    for row in RowReader::<T>::open(path)?.interrupted_by(interrupt) {
        row?;
        n += 1;
    }
    Ok(n)
}

/// Which cell of a row does not parse, by its column's name, and why.
fn cell_error(header: &::csv::ByteRecord, e: &::csv::Error) -> String {
    match e.kind() {
        ::csv::ErrorKind::Deserialize { err, .. } => {
            let column = err
                .field()
                .and_then(|i| header.get(i as usize))
                .map(|c| format!(" `{}`", String::from_utf8_lossy(c)));
            format!(
                "the cell{} does not parse: {}",
                column.unwrap_or_default(),
                err.kind()
            )
        }
        _ => format!("a cell does not parse: {e}"),
    }
}

/// Reads `runs.csv` in `dir`.
pub fn read_runs(dir: &Path) -> Result<Vec<RunRow>, ReportError> {
    read_rows(&dir.join(RUNS_CSV))
}

/// Reads `trials.csv` in `dir`.
pub fn read_trials(dir: &Path) -> Result<Vec<TrialRow>, ReportError> {
    read_rows(&dir.join(TRIALS_CSV))
}

/// Reads `progress.csv` in `dir`.
pub fn read_progress(dir: &Path) -> Result<Vec<ProgressRow>, ReportError> {
    read_rows(&dir.join(PROGRESS_CSV))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    pub(crate) fn run_row(split: &str, n: u32, tpt: f64) -> RunRow {
        RunRow {
            model: "mlp".into(),
            dataset: "mnist-10k".into(),
            split: split.into(),
            n,
            slices: n,
            sm_per_slice: None,
            slices_per_partition: None,
            mem_cap_mib: None,
            makespan_s: tpt * f64::from(n),
            time_per_training_s: tpt,
            samples_per_s: 1000.0 / tpt,
            gpu_util_mean: None,
            gpu_mem_peak_mib: None,
            power_w_mean: None,
            sm_clock_mhz_mean: None,
            proc_mem_peak_mib: None,
            device: "cpu: 2 cores".into(),
            backend: "cpu".into(),
            epochs: 2,
            ok: n,
            failed: 0,
            slice_plan: String::new(),
        }
    }

    pub(crate) fn trial_row(
        id: &str,
        split: &str,
        acc: Option<f64>,
        loss: Option<f64>,
    ) -> TrialRow {
        TrialRow {
            trial_id: id.into(),
            round: 0,
            split: split.into(),
            n: 1,
            slice: 0,
            model: "mlp".into(),
            params_lr: 0.01,
            params_batch_size: 64,
            params_optimizer: "sgd".into(),
            params_momentum: 0.9,
            params_weight_decay: 1e-4,
            params_dropout: 0.1,
            seed: 7,
            state: if acc.is_some() { "COMPLETE" } else { "FAIL" }.into(),
            test_acc: acc,
            final_loss: loss,
            epochs: 2,
            wall_s: 1.5,
            samples_per_s: Some(123.25),
            peak_mem_mib: None,
            mem_cap_mib: Some(512.0),
            error: String::new(),
            metric: acc,
            params: "{}".into(),
            ..Default::default()
        }
    }

    fn progress_row(epoch: u32) -> ProgressRow {
        ProgressRow {
            round: 1,
            trial_id: "t0".into(),
            split: "green".into(),
            n: 3,
            epoch,
            train_loss: 0.1 + f64::from(epoch),
            train_acc: 0.5,
            test_loss: 0.7,
            test_acc: 0.1 / 3.0,
            wall_s: 2.0,
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn rows_copied_from_their_cells_are_the_lines_their_values_encode_to() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PROGRESS_CSV);
        let with = |epoch: u32, id: &str, keys: &[(&str, f64)]| {
            let mut row = progress_row(epoch);
            row.trial_id = id.into();
            row.train_loss = f64::NAN;
            row.test_acc = 1.0 / (3.0 + f64::from(epoch));
            row.extra = keys.iter().map(|(k, v)| (k.to_string(), *v)).collect();
            row
        };
        let rows = vec![
            with(1, "t0", &[("a", 0.25)]),
            with(2, "t0", &[("a", -1e-300), ("b", 7.0)]),
            with(3, "t,1", &[("b", 2.0)]),
            with(4, "t\"2", &[]),
        ];
        write_rows(&path, &rows).unwrap();
        // A row added by hand, with an empty check: encoded from its values.
        let mut text = fs::read_to_string(&path).unwrap();
        let hand = encode(
            &path,
            &with(5, "t3", &[("a", 1.5)]),
            &["a".into(), "b".into()],
            false,
        )
        .unwrap();
        text.push_str(std::str::from_utf8(&hand).unwrap().trim_end());
        text.push_str(",\n");
        fs::write(&path, text).unwrap();
        let all = read_rows::<ProgressRow>(&path).unwrap();
        assert_eq!(all.len(), 5);
        for columns in [vec![], vec!["a"], vec!["b", "c", "a"], vec!["a", "b"]] {
            let columns: Vec<String> = columns.into_iter().map(String::from).collect();
            let got: Vec<(ProgressRow, Vec<u8>)> = RowReader::<ProgressRow>::open(&path)
                .unwrap()
                .with_lines(&columns)
                .collect::<Result<_, _>>()
                .unwrap();
            for ((row, line), want) in got.iter().zip(&all) {
                assert_eq!(format!("{row:?}"), format!("{want:?}"));
                let encoded = encode(&path, want, &columns, true).unwrap();
                assert_eq!(
                    String::from_utf8_lossy(line),
                    String::from_utf8_lossy(&encoded),
                    "{columns:?}"
                );
            }
            // And the file written from those lines reads back as the same rows.
            let out = dir.path().join("copy.csv");
            let lines = got.into_iter().map(|(_, l)| Ok(l));
            write_lines::<ProgressRow>(&out, lines, &columns, &Interrupt::Never, &mut |_| true)
                .unwrap();
            let back = read_rows::<ProgressRow>(&out).unwrap();
            assert_eq!(back.len(), 5);
            for (b, a) in back.iter().zip(&all) {
                let kept: BTreeMap<String, f64> = a
                    .extra
                    .iter()
                    .filter(|(k, _)| columns.contains(k))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                assert_eq!(format!("{:?}", b.extra), format!("{kept:?}"));
                assert_eq!(b.trial_id, a.trial_id);
            }
        }
    }

    #[test]
    fn rows_round_trip_with_empty_and_full_options() {
        let dir = tempfile::tempdir().unwrap();
        let mut full = run_row("green", 5, 1.0 / 3.0);
        full.sm_per_slice = Some(26.4);
        full.slices_per_partition = Some(1.5);
        full.mem_cap_mib = Some(15_872.0);
        full.gpu_util_mean = Some(97.125);
        full.gpu_mem_peak_mib = Some(40_000.5);
        full.power_w_mean = Some(612.0);
        full.sm_clock_mhz_mean = Some(1_755.5);
        full.slice_plan = "80sm/30000MiB;48sm/20000MiB".into();
        let runs = vec![run_row("shared", 1, 12.5), full];
        let mut failed = trial_row("t1", "mps", None, None);
        failed.error = "needs 9.0 MiB, slice cap 8.0 MiB, \"quoted\"\nsecond line".into();
        let mut trials = vec![
            trial_row("t0", "mps", Some(0.1 + 0.2), Some(1e-300)),
            failed,
        ];
        let progress = vec![progress_row(0), progress_row(1)];
        let mut writer = ReportWriter::create(dir.path()).unwrap();
        runs.iter().for_each(|r| writer.run(r).unwrap());
        trials.iter().for_each(|r| writer.trial(r).unwrap());
        progress.iter().for_each(|r| writer.progress(r).unwrap());
        drop(writer);
        assert_eq!(read_runs(dir.path()).unwrap(), runs);
        // Every row is one line: a line break inside a cell is written as ` | `.
        let text = fs::read_to_string(dir.path().join(TRIALS_CSV)).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        trials[1].error = "needs 9.0 MiB, slice cap 8.0 MiB, \"quoted\" | second line".into();
        assert_eq!(read_trials(dir.path()).unwrap(), trials);
        assert_eq!(read_progress(dir.path()).unwrap(), progress);
        let text = fs::read_to_string(dir.path().join(RUNS_CSV)).unwrap();
        let first = text.lines().nth(1).unwrap();
        assert!(first.contains(",,,"), "None is an empty cell: {first}");
    }

    #[test]
    fn sm_clock_column_follows_power_in_the_header() {
        let header = header_of::<RunRow>(&[]).unwrap();
        let names: Vec<&str> = header
            .iter()
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        let power = names.iter().position(|n| *n == "power_w_mean").unwrap();
        assert_eq!(names[power + 1], "sm_clock_mhz_mean");
        assert_eq!(names[power + 2], "proc_mem_peak_mib");
        assert_eq!(names.len(), 23);
        assert_eq!(names[21], "slice_plan");
        assert_eq!(names[22], CHECK);
    }

    #[test]
    fn runs_written_before_the_sm_clock_column_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let old = "model,dataset,split,n,slices,sm_per_slice,slices_per_partition,mem_cap_mib,\
                   makespan_s,time_per_training_s,samples_per_s,gpu_util_mean,gpu_mem_peak_mib,\
                   power_w_mean,device,backend,epochs,ok,failed\n\
                   mlp,mnist-10k,shared,2,2,,,,25,12.5,80,97.5,1024,300,cpu: 2 cores,cpu,2,2,0\n";
        fs::write(dir.path().join(RUNS_CSV), old).unwrap();
        let mut want = run_row("shared", 2, 12.5);
        want.gpu_util_mean = Some(97.5);
        want.gpu_mem_peak_mib = Some(1024.0);
        want.power_w_mean = Some(300.0);
        assert_eq!(read_runs(dir.path()).unwrap(), vec![want]);
        // Appending new rows to such a file would misalign its columns: refused.
        let err = ReportWriter::append(dir.path()).err().unwrap().to_string();
        assert!(err.contains("cannot append"), "{err}");
    }

    #[test]
    fn a_row_is_on_disk_when_the_call_returns() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = ReportWriter::create(dir.path()).unwrap();
        let row = trial_row("t9", "process", Some(0.5), Some(0.25));
        writer.trial(&row).unwrap();
        assert_eq!(read_trials(dir.path()).unwrap(), vec![row]);
        writer.run(&run_row("process", 2, 3.0)).unwrap();
        assert_eq!(read_runs(dir.path()).unwrap().len(), 1);
        drop(writer);
    }

    #[test]
    fn headers_are_written_before_any_row() {
        let dir = tempfile::tempdir().unwrap();
        let _writer = ReportWriter::create(dir.path().join("new/sub").as_path()).unwrap();
        let text = fs::read_to_string(dir.path().join("new/sub").join(PROGRESS_CSV)).unwrap();
        assert!(text.starts_with("round,trial_id,split,n,epoch,"), "{text}");
        assert!(read_progress(&dir.path().join("new/sub"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn append_keeps_one_header_and_all_rows() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = ReportWriter::create(dir.path()).unwrap();
        writer.run(&run_row("shared", 1, 4.0)).unwrap();
        drop(writer);
        let mut writer = ReportWriter::append(dir.path()).unwrap();
        writer.run(&run_row("shared", 2, 3.0)).unwrap();
        drop(writer);
        let text = fs::read_to_string(dir.path().join(RUNS_CSV)).unwrap();
        assert_eq!(text.matches("model,dataset,split").count(), 1, "{text}");
        let ns: Vec<u32> = read_runs(dir.path()).unwrap().iter().map(|r| r.n).collect();
        assert_eq!(ns, vec![1, 2]);
    }

    #[test]
    fn create_without_append_rewrites() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = ReportWriter::create(dir.path()).unwrap();
        writer.run(&run_row("shared", 1, 4.0)).unwrap();
        drop(writer);
        drop(ReportWriter::create(dir.path()).unwrap());
        assert!(read_runs(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn append_after_a_cut_row_drops_it() {
        let dir = tempfile::tempdir().unwrap();
        drop(ReportWriter::create(dir.path()).unwrap());
        let path = dir.path().join(TRIALS_CSV);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"t0,0,shared").unwrap();
        drop(file);
        let mut writer = ReportWriter::append(dir.path()).unwrap();
        writer
            .trial(&trial_row("t1", "shared", Some(0.5), None))
            .unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(!text.contains("t0,0,shared"), "the cut row is gone: {text}");
        assert_eq!(text.lines().count(), 2, "header and the new row: {text}");
        assert_eq!(
            read_trials(dir.path()).unwrap().len(),
            1,
            "the file reads cleanly"
        );
    }

    #[test]
    fn append_refuses_other_columns() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(RUNS_CSV), "a,b\n1,2\n").unwrap();
        let err = ReportWriter::append(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains(RUNS_CSV) && err.contains("cannot append"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_runs(dir.path()).unwrap_err();
        assert!(matches!(err, ReportError::Read { .. }) && err.is_bad_input());
        assert!(err
            .to_string()
            .contains(&*dir.path().join(RUNS_CSV).to_string_lossy()));
    }

    #[test]
    fn a_malformed_row_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = ReportWriter::create(dir.path()).unwrap();
        writer.progress(&progress_row(0)).unwrap();
        drop(writer);
        let path = dir.path().join(PROGRESS_CSV);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"1,t0,green,3,not-a-number,0.1,0.5,0.7,0.2,2.0,\n")
            .unwrap();
        drop(file);
        let err = read_progress(dir.path()).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, ReportError::Damaged { line: 3, .. }),
            "{text}"
        );
        assert!(err.is_bad_input());
        assert!(
            text.contains(PROGRESS_CSV) && text.contains("line 3") && text.contains("epoch"),
            "{text}"
        );
    }

    /// A trials.csv of `rows` written by the writer, and its bytes.
    fn written(rows: &[TrialRow]) -> (tempfile::TempDir, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = ReportWriter::create(dir.path()).unwrap();
        rows.iter().for_each(|r| writer.trial(r).unwrap());
        drop(writer);
        let bytes = fs::read(dir.path().join(TRIALS_CSV)).unwrap();
        (dir, bytes)
    }

    fn read_bytes(dir: &Path, bytes: &[u8]) -> Result<Vec<TrialRow>, ReportError> {
        let path = dir.join("probe.csv");
        fs::write(&path, bytes).unwrap();
        read_rows::<TrialRow>(&path)
    }

    fn three_rows() -> Vec<TrialRow> {
        let mut fail = trial_row("t1", "shared", None, None);
        fail.error = "exited with code 1, \"quoted\"".into();
        vec![
            trial_row("t0", "shared", Some(0.5), Some(0.25)),
            fail,
            trial_row("t2", "shared", Some(0.75), Some(0.125)),
        ]
    }

    #[test]
    fn a_cut_last_line_is_dropped_and_never_counted() {
        let rows = three_rows();
        let (dir, bytes) = written(&rows);
        let cut = &bytes[..bytes.len() - 1];
        assert_eq!(read_bytes(dir.path(), cut).unwrap(), rows[..2].to_vec());
        // A cut that leaves every cell of the row but its newline still drops it.
        let last_line = bytes[..bytes.len() - 1]
            .iter()
            .rposition(|&b| b == b'\n')
            .unwrap();
        let just_state = &bytes[..last_line + 40];
        assert_eq!(read_bytes(dir.path(), just_state).unwrap().len(), 2);
        assert!(read_bytes(dir.path(), b"").unwrap().is_empty());
        assert!(read_bytes(dir.path(), &bytes[..10]).unwrap().is_empty());
    }

    #[test]
    fn damage_before_the_last_line_is_refused_naming_the_line() {
        let rows = three_rows();
        let (dir, bytes) = written(&rows);
        let text = String::from_utf8(bytes.clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let with_line_3 = |line: &str| {
            let mut l = lines.clone();
            l[2] = line;
            format!("{}\n", l.join("\n"))
        };
        let changed_digit = lines[1].replacen("0.5", "0.9", 1);
        let complete_instead = lines[2].replacen("FAIL", "COMPLETE", 1);
        let unchecked_state = {
            let mut cells: Vec<&str> = lines[2].split(',').collect();
            let n = cells.len();
            cells[n - 1] = "";
            cells.join(",").replacen("FAIL", "DONE", 1)
        };
        let cases: Vec<(String, u64, &str)> = vec![
            (with_line_3("\0\0\0\0"), 3, "cells"),
            (with_line_3(&"\0".repeat(lines[2].len())), 3, ""),
            (with_line_3("garbage"), 3, "cells"),
            (with_line_3(&complete_instead), 3, "check"),
            (with_line_3(&unchecked_state), 3, "DONE"),
            (text.replacen(lines[1], &changed_digit, 1), 2, "check"),
            (text.replacen("trial_id", "trial_idx", 1), 1, "trial_idx"),
            (format!("{}\"{}", &text[..text.len() - 1], "\n"), 4, ""),
        ];
        for (bad, line, word) in cases {
            let err = read_bytes(dir.path(), bad.as_bytes()).unwrap_err();
            let said = err.to_string();
            assert!(
                matches!(&err, ReportError::Damaged { line: l, .. } if *l == line),
                "{said}"
            );
            assert!(said.contains("probe.csv") && said.contains(word), "{said}");
            assert!(err.is_bad_input());
        }
        // An older file without the check column still reads.
        let old: String = text
            .lines()
            .map(|l| format!("{}\n", &l[..l.rfind(',').unwrap()]))
            .collect();
        assert_eq!(read_bytes(dir.path(), old.as_bytes()).unwrap(), rows);
    }

    #[test]
    fn a_file_of_other_line_ends_is_refused_not_dropped_as_a_cut() {
        let (dir, bytes) = written(&three_rows());
        let cr: Vec<u8> = bytes
            .iter()
            .map(|&b| if b == b'\n' { b'\r' } else { b })
            .collect();
        let err = read_bytes(dir.path(), &cr).unwrap_err();
        assert!(matches!(err, ReportError::Damaged { line: 1, .. }), "{err}");
        let crlf = String::from_utf8(bytes).unwrap().replace('\n', "\r\n");
        assert_eq!(
            read_bytes(dir.path(), crlf.as_bytes()).unwrap(),
            three_rows()
        );
    }

    #[test]
    fn an_over_long_line_is_refused_without_reading_it_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut big = b"trial_id,state\n".to_vec();
        big.extend(vec![b'x'; MAX_LINE + 10]);
        big.push(b'\n');
        let err = read_bytes(dir.path(), &big).unwrap_err();
        assert!(matches!(err, ReportError::Damaged { line: 2, .. }), "{err}");
    }

    #[test]
    fn a_write_that_fails_leaves_the_rows_before_it_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = ReportWriter::create(dir.path()).unwrap();
        writer.trial(&three_rows()[0]).unwrap();
        // A sink whose file refuses writes, as a full disk does.
        let path = dir.path().join(TRIALS_CSV);
        let ro = OpenOptions::new().read(true).open(&path).unwrap();
        let len = ro.metadata().unwrap().len();
        writer.trials.file = ro;
        let err = writer.trial(&three_rows()[2]).unwrap_err();
        assert!(
            matches!(err, ReportError::Write { .. }) && !err.is_bad_input(),
            "{err}"
        );
        assert!(err.to_string().contains(TRIALS_CSV));
        assert_eq!(fs::metadata(&path).unwrap().len(), len);
        assert_eq!(read_trials(dir.path()).unwrap(), three_rows()[..1].to_vec());
    }

    #[test]
    fn write_rows_replaces_a_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TRIALS_CSV);
        write_rows(&path, &three_rows()).unwrap();
        assert_eq!(read_rows::<TrialRow>(&path).unwrap().len(), 3);
        write_rows(&path, &three_rows()[..1]).unwrap();
        assert_eq!(read_rows::<TrialRow>(&path).unwrap().len(), 1);
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left");
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn any_row() -> impl Strategy<Value = TrialRow> {
            (
                "[0-9a-f]{16}",
                prop::sample::select(vec!["COMPLETE", "FAIL", "INTERRUPTED"]),
                prop::option::of(0.0f64..1.0),
                prop::option::of(-1e6f64..1e6),
                "[ -~]{0,30}(\n[ -~]{0,10})?",
                0.0f64..1e5,
            )
                .prop_map(|(id, state, acc, loss, error, wall)| TrialRow {
                    state: state.into(),
                    error,
                    wall_s: wall,
                    params: format!("{{\"lr\":{wall}}}"),
                    ..trial_row(&id, "logical", acc, loss)
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            /// Any cut gives the rows written whole before it, never the row it cuts.
            #[test]
            fn any_cut_gives_the_whole_rows_before_it(
                rows in prop::collection::vec(any_row(), 1..8),
                at in any::<prop::sample::Index>(),
            ) {
                let (dir, bytes) = written(&rows);
                let full = read_bytes(dir.path(), &bytes).unwrap();
                prop_assert_eq!(full.len(), rows.len());
                let cut = at.index(bytes.len() + 1);
                let whole = bytes[..cut].iter().filter(|&&b| b == b'\n').count();
                let got = read_bytes(dir.path(), &bytes[..cut]).unwrap();
                prop_assert_eq!(got, full[..whole.saturating_sub(1)].to_vec());
            }

            /// Any damaged bytes are refused or dropped: every row read back is a row written,
            /// in its place.
            #[test]
            fn damaged_bytes_are_refused_or_dropped_never_read(
                rows in prop::collection::vec(any_row(), 1..6),
                at in any::<prop::sample::Index>(),
                with in prop::collection::vec(any::<u8>(), 1..4),
                insert in any::<bool>(),
            ) {
                let (dir, bytes) = written(&rows);
                let full = read_bytes(dir.path(), &bytes).unwrap();
                let i = at.index(bytes.len());
                let mut bad = bytes.clone();
                if insert {
                    bad.splice(i..i, with.iter().copied());
                } else {
                    let end = (i + with.len()).min(bad.len());
                    bad.splice(i..end, with.iter().copied());
                }
                prop_assume!(bad != bytes);
                if let Ok(got) = read_bytes(dir.path(), &bad) {
                    prop_assert!(got.len() <= full.len());
                    prop_assert_eq!(&got[..], &full[..got.len()]);
                }
            }
        }
    }
}
