//! Writing results files: rows appended one whole fsynced line at a time, a header widened in place by a row-by-row copy, and whole files replaced atomically.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::extra::{self, Dropped};
use super::line::*;
use super::read::{existing_extra, Cells, LinePlan, RowReader};
use super::{ProgressRow, RunRow, TrialRow};
use crate::error::ReportError;

/// One results file open for appending: each row is one line, written whole, flushed and
/// fsynced before the call returns; a row that cannot be written whole is taken back out.
pub(super) struct Sink {
    path: PathBuf,
    pub(super) file: File,
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
        let mut reader = RowReader::<T>::open(&self.path)?.interrupted_by(&self.interrupt);
        let plan = reader.plan(&wider);
        write_lines_from::<T>(&self.path, &wider, &self.interrupt, |out| {
            copy_rows(&mut reader, &plan, out, |_| Ok(true)).map(|_| ())
        })?;
        let mut file = open_regular(&self.path, OpenOptions::new().read(true).append(true), true)?;
        self.len = file.seek(SeekFrom::End(0)).map_err(read_err(&self.path))?;
        let old = std::mem::replace(&mut self.file, file);
        // The old file's blocks are freed when its last descriptor closes, which takes tens of
        // milliseconds for a large file: that is done beside the trials, not before their rows.
        drop(reader);
        let closing = move || drop(old);
        let _ = std::thread::Builder::new()
            .name("gpumux-close".into())
            .spawn(closing);
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

pub(super) fn non_empty(path: &Path) -> Result<bool, ReportError> {
    match fs::metadata(path) {
        Ok(meta) => Ok(meta.len() > 0),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(read_err(path)(e)),
    }
}

/// Appending to a file written with other columns would corrupt it: refuse instead. Returns
/// whether its rows carry the [`CHECK`] cell (files written before it had none), and its
/// extra columns (a header with them has [`CHECK`]; see [`extra`]).
pub(super) fn check_header<T: ResultsRow>(
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

pub(super) fn join(r: &::csv::ByteRecord) -> String {
    r.iter()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join(",")
}

/// A row cut short by an interruption (a kill in the middle of a write) is the last line,
/// without its newline: it is dropped, so the next row starts on a line of its own. Returns
/// the file's new length.
pub(super) fn end_with_newline(path: &Path, file: &mut File) -> Result<u64, ReportError> {
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
    pub(super) trials: Sink,
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

/// [`write_rows`] with these extra columns.
pub(super) fn write_rows_as<T: ResultsRow>(
    path: &Path,
    rows: &[T],
    extra: &[String],
) -> Result<(), ReportError> {
    let lines = rows.iter().map(|row| encode(path, row, extra, true));
    write_lines::<T>(path, lines, extra, &Interrupt::Never, &mut |_| true)
}

/// Replaces the results file at `path` with lines of rows encoded under the header of `T` and
/// `extra` (`encode`, or [`super::read::Cells::line_into`] for rows copied from another
/// file), those that `keep` keeps (rows equal field for field are encoded alike): see
/// [`write_lines_from`].
pub fn write_lines<T: ResultsRow>(
    path: &Path,
    lines: impl IntoIterator<Item = Result<Vec<u8>, ReportError>>,
    extra: &[String],
    interrupt: &Interrupt,
    keep: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<(), ReportError> {
    write_lines_from::<T>(path, extra, interrupt, |out| {
        for line in lines {
            let line = line?;
            if keep(&line) {
                out.write(&line)?;
            }
        }
        Ok(())
    })
}

/// Replaces the results file at `path` with the header of `T` and `extra`, then the lines
/// `produce` writes, so that memory does not grow with the file: the file is the old one or
/// the whole new one (see [`crate::outdir::replace_file`]). The first error `produce` returns
/// (a damaged line of a file read), or a stop by `interrupt`, leaves the old file as it was
/// and is returned.
pub fn write_lines_from<T: ResultsRow>(
    path: &Path,
    extra: &[String],
    interrupt: &Interrupt,
    produce: impl FnOnce(&mut LineOut) -> Result<(), ReportError>,
) -> Result<(), ReportError> {
    let header = header_of::<T>(extra)?;
    let head = line_of(path, &header)?;
    let mut failed = None;
    let written = crate::outdir::replace_file(path, |w| {
        w.write_all(&head)?;
        let mut out = LineOut {
            w,
            path,
            interrupt,
            lines: 0,
            io: None,
        };
        if let Err(e) = produce(&mut out) {
            if let Some(io) = out.io.take() {
                return Err(io);
            }
            failed = Some(e);
            return Err(io::Error::other("a row cannot be written"));
        }
        Ok(())
    });
    match failed {
        Some(e) => Err(e),
        None => written,
    }
}

/// Where [`write_lines_from`]'s lines go: the new file, with a look at the interrupt every
/// [`CHECK_EVERY`] lines.
pub struct LineOut<'w> {
    w: &'w mut dyn Write,
    path: &'w Path,
    interrupt: &'w Interrupt,
    lines: u64,
    /// The error the new file gave, handed to the replacement (which names that file).
    io: Option<io::Error>,
}

impl LineOut<'_> {
    /// Writes one whole line (its newline included).
    pub fn write(&mut self, line: &[u8]) -> Result<(), ReportError> {
        self.write_parts(line, &[])
    }

    /// Writes one whole line given in two parts (`tail` ends with its newline).
    fn write_parts(&mut self, head: &[u8], tail: &[u8]) -> Result<(), ReportError> {
        self.write_lines(head, tail, 1)
    }

    /// Writes `rows` whole lines given in two parts (`head` then `tail`, which together end
    /// with a newline); the signals are looked at every [`CHECK_EVERY`] lines.
    fn write_lines(&mut self, head: &[u8], tail: &[u8], rows: u64) -> Result<(), ReportError> {
        if (self.lines % CHECK_EVERY) + rows >= CHECK_EVERY {
            self.interrupt.check(self.path)?;
        }
        self.lines += rows;
        let written = self.w.write_all(head).and_then(|()| self.w.write_all(tail));
        written.map_err(|e| {
            let said = write_err(self.path)(io::Error::new(e.kind(), e.to_string()));
            self.io = Some(e);
            said
        })
    }
}

/// Copies the rows of `reader` into `out`, those that `keep` keeps (every row is checked),
/// each as its line under `plan` ([`Cells::line_into`]). Rows written unchanged that follow
/// one another in the bytes read are copied from them in one write, without being copied line
/// by line. Returns how many rows were written.
pub fn copy_rows<T: ResultsRow>(
    reader: &mut RowReader<T>,
    plan: &LinePlan,
    out: &mut LineOut,
    mut keep: impl FnMut(&mut Cells<'_, T>) -> Result<bool, ReportError>,
) -> Result<u64, ReportError> {
    let mut line = Vec::with_capacity(512);
    let mut n = 0;
    // Whole lines (line ends included) of the bytes read, not yet written, and how many.
    let mut run = Run::default();
    while let Some(mut cells) = reader.next_cells()? {
        let kept = keep(&mut cells)?;
        let unchanged = kept && cells.as_written(plan).is_some();
        if !kept {
            // A row left out is refused all the same when it is damaged.
            cells.verify()?;
        } else if !unchanged {
            line.clear();
            cells.line_into(plan, &mut line)?;
            run.write(reader.bytes_read(), out)?;
            out.write(&line)?;
            n += 1;
        }
        let (raw, last) = reader.place();
        let bytes = reader.bytes_read();
        if unchanged {
            n += 1;
            if run.lines.end != raw.start {
                run.write(bytes, out)?;
                run.lines = raw.start..raw.start;
            }
            run.rows += 1;
            if bytes.get(raw.end) == Some(&b'\n') {
                run.lines.end = raw.end + 1;
            } else {
                // Its line end is not among the bytes read (the last row of a chunk).
                run.lines.end = raw.end;
                run.write_then(bytes, b"\n", out)?;
            }
        }
        if last {
            run.write(bytes, out)?;
        }
    }
    run.write(reader.bytes_read(), out)?;
    Ok(n)
}

/// Rows of the bytes read, one after another, to be written in one go.
#[derive(Default)]
struct Run {
    lines: std::ops::Range<usize>,
    rows: u64,
}

impl Run {
    /// Writes the rows (if any) and starts again with none.
    fn write(&mut self, bytes: &[u8], out: &mut LineOut) -> Result<(), ReportError> {
        self.write_then(bytes, &[], out)
    }

    /// Writes the rows and `tail` (the last one's line end), and starts again with none.
    fn write_then(
        &mut self,
        bytes: &[u8],
        tail: &[u8],
        out: &mut LineOut,
    ) -> Result<(), ReportError> {
        if self.rows > 0 {
            out.write_lines(&bytes[self.lines.clone()], tail, self.rows)?;
        }
        self.rows = 0;
        self.lines = 0..0;
        Ok(())
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
