//! Reading results files: the one reader of `runs.csv`, `trials.csv` and `progress.csv`, row by row, that drops a cut last line and refuses damage.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::extra;
use super::line::*;
use super::{ProgressRow, RunRow, TrialRow};
use crate::error::ReportError;

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

/// Where the whole lines of a file end, found in one pass that also bounds every line.
pub(super) struct Lines {
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

pub(super) fn scan_lines(path: &Path, file: &File) -> Result<Lines, ReportError> {
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
pub(super) type ExtraColumns = Vec<(usize, String)>;

/// Checks a header against the row type, and returns the index of its [`CHECK`] column and its
/// extra columns (a row type with them takes any name [`extra::refusal`] lets through, up to
/// [`extra::MAX_EXTRA`]).
/// Refused: a NUL byte, text that is not UTF-8, a name twice, a name the row does not know,
/// [`CHECK`] anywhere but last, and a column the row needs missing. A header with [`CHECK`]
/// (written since rows carry it) must name every column of the row; one without it (an
/// older file) only those the row cannot do without.
pub(super) fn check_columns<T: ResultsRow>(
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

pub(super) fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// The cells of one encoded line.
pub(super) fn one_record(line: &[u8]) -> Result<::csv::ByteRecord, ReportError> {
    let mut r = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(line);
    let mut rec = ::csv::ByteRecord::new();
    r.read_byte_record(&mut rec)
        .map_err(|e| ReportError::Invalid(format!("a row of defaults: {e}")))?;
    Ok(rec)
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
}

impl<T: ResultsRow> RowReader<T> {
    /// The rows, each with its line as [`write_lines`] writes it under the extra columns
    /// `extra`: a row whose check was verified is copied from the cells it was read from
    /// (its values are not formatted again), in the columns' new order, with a new check;
    /// any other row (no check, a line break in a cell, an older file) is encoded from its
    /// values. Either way the line is the one [`write_rows`] would write.
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
        }
    }
}

impl<T: ResultsRow> WithLines<T> {
    /// The line of the row just read, copied from its cells; `None` when it must be encoded.
    fn copied_line(&self) -> Option<Vec<u8>> {
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
        let mut line = Vec::with_capacity(256);
        for k in from {
            line.extend_from_slice(cell(k));
            line.push(b',');
        }
        line.extend_from_slice(check_of(from.iter().map(cell)).as_bytes());
        line.push(b'\n');
        Some(line)
    }
}

impl<T: ResultsRow> Iterator for WithLines<T> {
    type Item = Result<(T, Vec<u8>), ReportError>;

    fn next(&mut self) -> Option<Self::Item> {
        let row = match self.reader.next()? {
            Ok(row) => row,
            Err(e) => return Some(Err(e)),
        };
        let line = match self.copied_line() {
            Some(line) => Ok(line),
            None => encode(&self.reader.path, &row, &self.extra, true),
        };
        Some(line.map(|line| (row, line)))
    }
}

pub(super) fn parse_error(path: &Path, e: ::csv::Error) -> ReportError {
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
pub(super) fn cell_error(header: &::csv::ByteRecord, e: &::csv::Error) -> String {
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
