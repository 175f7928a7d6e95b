//! Reading results files: the one reader of `runs.csv`, `trials.csv` and `progress.csv`, row by row, that drops a cut last line and refuses damage.

use std::fs::OpenOptions;
use std::io::{BufReader, Read};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::extra;
use super::finder::Finder;
use super::line::*;
use super::scan::{push_hex16, Blocks, Chunk, Layout};
use super::{ProgressRow, RunRow, TrialBrief, TrialRow};
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
///   A line is bounded before it is parsed; the other checks come row by row, so a caller
///   that must refuse a damaged file before acting reads it through once first.
/// - A row whose check matches its cells was written by gpumux as it is: [`RowReader::next_cells`]
///   hands its cells over without making a `T` of them (a caller copying lines or keying rows
///   parses only the cells it needs). A row without a check (an older file, or a row added by
///   hand with an empty one) is made into a `T`, so that every check above is made.
/// - A file of zero bytes, or with its header alone, has no rows.
pub struct RowReader<T> {
    layout: Arc<Layout>,
    /// `None` when the file has no header (zero bytes), and once the rows are over.
    finder: Option<Finder>,
    /// The rows handed over last by the finder.
    chunk: Chunk,
    /// The next row of `chunk` to hand over.
    next: usize,
    record: ::csv::ByteRecord,
    /// The row made of the last row's cells, when it was made.
    parsed: Option<T>,
    /// Set once the reader has ended (the rows are over, or an error was returned).
    done: bool,
    rows: u64,
    interrupt: Interrupt,
    row: std::marker::PhantomData<fn() -> T>,
}

impl<T: ResultsRow> RowReader<T> {
    /// Opens the file (a link, FIFO or folder in its place is refused) and checks its header.
    pub fn open(path: &Path) -> Result<Self, ReportError> {
        let file = open_regular(path, OpenOptions::new().read(true), false)?;
        let mut layout = Layout {
            path: path.to_path_buf(),
            header: ::csv::ByteRecord::new(),
            check: None,
            extra_columns: Vec::new(),
        };
        let mut blocks = Blocks::new(path, file);
        let mut first = Vec::new();
        blocks.next_rows(&mut first, 1)?;
        let head = first.first().map(|h| (h.line, h.range.clone()));
        if let Some((line, range)) = &head {
            layout.header = parse_one(path, *line, &blocks.bytes()[range.clone()])?;
            (layout.check, layout.extra_columns) = check_columns::<T>(path, &layout.header)?;
        }
        let layout = Arc::new(layout);
        let finder = match head {
            Some(_) => Some(Finder::start(Arc::clone(&layout), blocks)?),
            None => None,
        };
        Ok(RowReader {
            layout,
            done: finder.is_none(),
            finder,
            chunk: Chunk::default(),
            next: 0,
            record: ::csv::ByteRecord::new(),
            parsed: None,
            rows: 0,
            interrupt: Interrupt::Never,
            row: std::marker::PhantomData,
        })
    }

    /// The same reader, giving up as `interrupt` says.
    pub fn interrupted_by(mut self, interrupt: &Interrupt) -> Self {
        self.interrupt = interrupt.clone();
        self
    }

    /// The file's extra columns (see [`extra`]), in order.
    pub fn extra_columns(&self) -> Vec<String> {
        let columns = &self.layout.extra_columns;
        columns.iter().map(|(_, n)| n.clone()).collect()
    }

    /// The index of the column `name`, if the file has it.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.layout.header.iter().position(|c| c == name.as_bytes())
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.layout.path
    }

    /// The next row's cells, checked as the reader's text says; `None` at the end of the rows.
    pub fn next_cells(&mut self) -> Result<Option<Cells<'_, T>>, ReportError> {
        if self.done {
            return Ok(None);
        }
        let got = self.next_slot();
        if !matches!(got, Ok(true)) {
            self.done = true;
        }
        if !got? {
            return Ok(None);
        }
        let chunk = &self.chunk;
        let slot = &chunk.slots[self.next - 1];
        self.parsed = None;
        let mut cells = Cells {
            layout: &self.layout,
            bytes: if slot.quoted {
                &chunk.scratch
            } else {
                &chunk.bytes
            },
            cells: &chunk.cells[slot.cells.clone()],
            raw: &chunk.bytes[slot.raw.clone()],
            line: slot.line,
            quoted: slot.quoted,
            check: slot.check,
            row: &mut self.parsed,
            record: &mut self.record,
        };
        if cells.check.is_none() {
            // No check vouches for the cells: every one is parsed now.
            let row = cells.parse();
            if row.is_err() {
                self.done = true;
            }
            *cells.row = Some(row?);
        }
        Ok(Some(cells))
    }

    /// Where the row handed over last lies in the bytes read (without its line end), and
    /// whether it is the last row of those bytes: the next row may come with other bytes.
    pub(super) fn place(&self) -> (Range<usize>, bool) {
        let slot = &self.chunk.slots[self.next.saturating_sub(1)];
        (slot.raw.clone(), self.next >= self.chunk.slots.len())
    }

    /// Bytes read, as [`RowReader::place`] names them; valid until the next row is taken.
    pub(super) fn bytes_read(&self) -> &[u8] {
        &self.chunk.bytes
    }

    /// Moves on to the next row, taking the finder's next chunk when one is used up; false at
    /// the end of the rows; the damage found in the row as an error.
    fn next_slot(&mut self) -> Result<bool, ReportError> {
        if self.rows % CHECK_EVERY == CHECK_EVERY - 1 {
            self.interrupt.check(&self.layout.path)?;
        }
        while self.next >= self.chunk.slots.len() {
            // The damage found after a chunk's rows comes once they are handed over.
            if let Some(e) = self.chunk.damage.take() {
                return Err(e);
            }
            let Some(finder) = self.finder.as_mut() else {
                return Ok(false);
            };
            let used = std::mem::take(&mut self.chunk);
            match finder.next(used)? {
                Some(chunk) => {
                    self.chunk = chunk;
                    self.next = 0;
                }
                None => {
                    self.finder = None;
                    return Ok(false);
                }
            }
        }
        self.next += 1;
        self.rows += 1;
        Ok(true)
    }

    /// How the lines of the rows are written under the extra columns `extra` (see
    /// [`Cells::line_into`]).
    pub fn plan(&self, extra: &[String]) -> LinePlan {
        let encode = LinePlan {
            extra: extra.to_vec(),
            how: How::Encode,
        };
        let (header, Some(check)) = (&self.layout.header, self.layout.check) else {
            return encode;
        };
        let Ok(fixed) = columns_of::<T>() else {
            return encode;
        };
        let position = |name: &[u8]| header.iter().position(|c| c == name);
        let from: Option<Vec<Option<usize>>> = fixed
            .iter()
            .map(|name| position(name).map(Some))
            .chain(extra.iter().map(|name| Some(position(name.as_bytes()))))
            .collect();
        let Some(from) = from else {
            return encode;
        };
        // The cells kept where they are, and empty ones after them: only the check changes.
        let kept = from.iter().take_while(|k| k.is_some()).count();
        let prefix = from[..kept].iter().enumerate().all(|(i, k)| *k == Some(i));
        let how = if prefix && kept == check && from[kept..].iter().all(Option::is_none) {
            How::Append(from.len() - kept)
        } else {
            How::Pick(from)
        };
        LinePlan {
            extra: extra.to_vec(),
            how,
        }
    }
}

/// The cells of a header parsed as CSV: refused when the bytes hold more than one row.
fn parse_one(path: &Path, line: u64, bytes: &[u8]) -> Result<::csv::ByteRecord, ReportError> {
    let mut reader = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(bytes);
    let mut record = ::csv::ByteRecord::new();
    let at = |e: ::csv::Error| damaged(path, line, format!("does not parse: {e}"));
    reader.read_byte_record(&mut record).map_err(at)?;
    let mut more = ::csv::ByteRecord::new();
    if reader.read_byte_record(&mut more).map_err(at)? {
        return Err(damaged(
            path,
            line,
            "a carriage return inside a row: the file is not written with one row per line",
        ));
    }
    Ok(record)
}

/// How rows are written as lines under other extra columns ([`RowReader::plan`]).
pub struct LinePlan {
    extra: Vec<String>,
    how: How,
}

enum How {
    /// Every row is encoded from its values (the file has no check column, or lacks a column).
    Encode,
    /// The cells stay where they are, with this many empty ones after them.
    Append(usize),
    /// For each cell written: the index of the cell read it copies, or `None` for an empty one.
    Pick(Vec<Option<usize>>),
}

/// One row's cells, as [`RowReader::next_cells`] hands them over.
pub struct Cells<'r, T> {
    layout: &'r Layout,
    /// What `cells` index: the block, or the scratch of a quoted row.
    bytes: &'r [u8],
    cells: &'r [Range<usize>],
    /// The row's line as it was read (without its line end).
    raw: &'r [u8],
    line: u64,
    quoted: bool,
    /// The row's check, compared with its cells; `None` when it has none.
    check: Option<u64>,
    /// The row made from the cells, once it was.
    row: &'r mut Option<T>,
    record: &'r mut ::csv::ByteRecord,
}

impl<T: ResultsRow> Cells<'_, T> {
    /// The cell at `index` (empty past the last).
    pub fn cell(&self, index: usize) -> &[u8] {
        self.cells
            .get(index)
            .map_or(&[][..], |r| &self.bytes[r.clone()])
    }

    /// The row's line as it was read (without its line end), when `plan` writes it unchanged:
    /// the same columns, and a check that matched its cells (quoted cells included: the line
    /// read again gives the same cells).
    pub fn as_written(&self, plan: &LinePlan) -> Option<&[u8]> {
        let same = matches!(plan.how, How::Append(0)) && self.check.is_some();
        same.then_some(self.raw)
    }

    /// Makes every damage check on the row: none left when its check matched its cells, else
    /// it is parsed whole.
    pub fn verify(&mut self) -> Result<(), ReportError> {
        if self.check.is_none() {
            self.row()?;
        }
        Ok(())
    }

    /// Whether every cell holds what its column takes (`kinds`, column for column).
    fn hold(&self, kinds: &[CellKind]) -> bool {
        kinds.len() == self.cells.len()
            && kinds
                .iter()
                .enumerate()
                .all(|(i, kind)| kind.holds(self.cell(i)))
    }

    /// The line the row starts on.
    pub fn line(&self) -> u64 {
        self.line
    }

    /// The cell at `index` as text.
    pub fn text(&self, index: usize) -> Result<&str, ReportError> {
        std::str::from_utf8(self.cell(index))
            .map_err(|_| damaged(&self.layout.path, self.line, "text that is not UTF-8"))
    }

    /// The cell at `index` parsed as a `N`; damage naming its column when it does not parse.
    pub fn value<N: std::str::FromStr>(&self, index: usize) -> Result<N, ReportError> {
        self.text(index)?.parse().map_err(|_| {
            let name = self.layout.header.get(index).unwrap_or(b"");
            damaged(
                &self.layout.path,
                self.line,
                format!(
                    "the cell `{}` does not parse",
                    String::from_utf8_lossy(name)
                ),
            )
        })
    }

    /// The row the cells make.
    pub fn row(&mut self) -> Result<T, ReportError> {
        match self.row.take() {
            Some(row) => Ok(row),
            None => self.parse(),
        }
    }

    fn parse(&mut self) -> Result<T, ReportError> {
        let (layout, line) = (self.layout, self.line);
        let path = layout.path.as_path();
        let record = &mut *self.record;
        record.clear();
        for r in self.cells {
            record.push_field(&self.bytes[r.clone()]);
        }
        let mut row: T = record
            .deserialize(Some(&layout.header))
            .map_err(|e| damaged(path, line, cell_error(&layout.header, &e)))?;
        if let Some(values) = row.extra_mut() {
            // An empty cell: the trial did not report the key in this epoch.
            for (i, name) in &layout.extra_columns {
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
        Ok(row)
    }

    /// Appends the row's line as a rewrite writes it under `plan`'s extra columns: a
    /// row whose check was compared with its cells is copied from them (its values are not
    /// formatted again), in the columns' new order, with a new check; any other row (no
    /// check, a quoted cell, an older file) is encoded from its values. Either way the line is
    /// the one its values encode to.
    pub fn line_into(&mut self, plan: &LinePlan, out: &mut Vec<u8>) -> Result<(), ReportError> {
        if let Some(raw) = self.as_written(plan) {
            out.extend_from_slice(raw);
            out.push(b'\n');
            return Ok(());
        }
        match (&plan.how, self.check) {
            (How::Append(more), Some(check)) if !self.quoted => {
                let i = self.layout.check.unwrap_or(0);
                let start = self.cells[i].start - self.cells[0].start;
                out.extend_from_slice(&self.raw[..start]);
                out.extend(std::iter::repeat_n(b',', *more));
                let sep = [0x1f; 1];
                let check = (0..*more).fold(check, |h, _| crate::hash::fnv1a_more(h, &sep));
                push_hex16(out, check);
                out.push(b'\n');
            }
            (How::Pick(from), Some(_)) if !self.quoted => {
                let cell = |k: &Option<usize>| k.map_or(&[][..], |k| self.cell(k));
                for k in from {
                    out.extend_from_slice(cell(k));
                    out.push(b',');
                }
                push_hex16(out, check_value(from.iter().map(cell)));
                out.push(b'\n');
            }
            _ => {
                let row = self.row()?;
                out.extend_from_slice(&encode(&self.layout.path, &row, &plan.extra, true)?);
                *self.row = Some(row);
            }
        }
        Ok(())
    }
}

impl<T: ResultsRow> Iterator for RowReader<T> {
    type Item = Result<T, ReportError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_cells() {
            Ok(Some(mut cells)) => Some(cells.row()),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// Reads every row of a results file with [`RowReader`]: any damage refuses the whole file.
pub fn read_rows<T: ResultsRow>(path: &Path) -> Result<Vec<T>, ReportError> {
    RowReader::open(path)?.collect()
}

/// Reads a results file of rows without extra columns, each with its line as `T`'s columns
/// write it: copied as it was read when the file has those columns and the row's check
/// matched, encoded anew otherwise.
pub fn read_rows_and_lines<T: ResultsRow>(path: &Path) -> Result<Vec<(T, Vec<u8>)>, ReportError> {
    let mut reader = RowReader::<T>::open(path)?;
    let plan = reader.plan(&[]);
    let mut rows = Vec::new();
    while let Some(mut cells) = reader.next_cells()? {
        let mut line = Vec::new();
        cells.line_into(&plan, &mut line)?;
        rows.push((cells.row()?, line));
    }
    Ok(rows)
}

/// Reads `trials.csv` at `path` as [`TrialBrief`]s, refusing what [`read_rows`] refuses: a row
/// whose check matched its cells, and whose every cell holds what its column takes
/// (as serde tells it), gives the cells a brief needs without being made a whole [`TrialRow`]; any
/// other row is parsed whole (and refused as [`read_rows`] refuses it).
pub fn read_trial_briefs(path: &Path) -> Result<Vec<TrialBrief>, ReportError> {
    static KINDS: std::sync::OnceLock<Vec<(Vec<u8>, CellKind)>> = std::sync::OnceLock::new();
    let kinds = match KINDS.get() {
        Some(k) => k,
        None => {
            let found = cell_kinds::<TrialRow>()?;
            KINDS.get_or_init(|| found)
        }
    };
    let mut reader = RowReader::<TrialRow>::open(path)?;
    let plan = reader.plan(&[]);
    // Each column's kind, by its name; `None` when a column is not known to take a plain kind
    // (every row is then parsed whole).
    let file_kinds: Option<Vec<CellKind>> = reader
        .layout
        .header
        .iter()
        .map(|name| match name {
            n if n == CHECK.as_bytes() => Some(CellKind::Text),
            n => kinds.iter().find(|(k, _)| k == n).map(|(_, kind)| *kind),
        })
        .collect();
    let names = [
        "trial_id",
        "state",
        "metric",
        "test_acc",
        "final_loss",
        "params",
    ];
    let columns: Option<Vec<usize>> = names.iter().map(|n| reader.column(n)).collect();
    let light = file_kinds.zip(columns);
    let mut briefs = Vec::new();
    while let Some(mut cells) = reader.next_cells()? {
        let mut line = Vec::new();
        cells.line_into(&plan, &mut line)?;
        let brief = match &light {
            Some((kinds, at)) if cells.check.is_some() && cells.hold(kinds) => {
                let number = |i: usize| match cells.cell(at[i]) {
                    b"" => Ok(None),
                    _ => cells.value::<f64>(at[i]).map(Some),
                };
                let brief = TrialBrief {
                    trial_id: cells.text(at[0])?.to_owned(),
                    state: cells.text(at[1])?.to_owned(),
                    metric: number(2)?,
                    test_acc: number(3)?,
                    final_loss: number(4)?,
                    params: cells.text(at[5])?.to_owned(),
                    line,
                };
                if let Some(why) = trial_invalid(&brief.trial_id, &brief.state) {
                    return Err(damaged(path, cells.line(), why));
                }
                brief
            }
            _ => {
                let row = cells.row()?;
                TrialBrief {
                    trial_id: row.trial_id,
                    state: row.state,
                    metric: row.metric,
                    test_acc: row.test_acc,
                    final_loss: row.final_loss,
                    params: row.params,
                    line,
                }
            }
        };
        briefs.push(brief);
    }
    Ok(briefs)
}

/// What a cell of a column takes, as serde parses the row: any text, or a number (a float, a
/// `u32`, a `u64`), which may be empty when the column is optional. `Other` stands for any
/// column this does not tell (its rows are parsed whole).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CellKind {
    Text,
    Number {
        float: bool,
        wide: bool,
        optional: bool,
    },
    Other,
}

impl CellKind {
    /// Whether `cell` is what the column takes: then the whole row's parse cannot fail on it.
    pub(super) fn holds(self, cell: &[u8]) -> bool {
        let CellKind::Number {
            float,
            wide,
            optional,
        } = self
        else {
            return self == CellKind::Text && std::str::from_utf8(cell).is_ok();
        };
        if cell.is_empty() {
            return optional;
        }
        // Most cells are plain decimals, told without parsing: digits (fewer than overflow the
        // type), or for a float a `-` and one `.` among them. Any other is parsed as serde
        // parses it.
        let digits = |b: &[u8]| !b.is_empty() && b.iter().all(u8::is_ascii_digit);
        let plain = match (float, wide) {
            (true, _) => {
                let unsigned = cell.strip_prefix(b"-").unwrap_or(cell);
                match unsigned.iter().position(|&b| b == b'.') {
                    Some(dot) => digits(&unsigned[..dot]) && digits(&unsigned[dot + 1..]),
                    None => digits(unsigned),
                }
            }
            (false, true) => cell.len() < 20 && digits(cell),
            (false, false) => cell.len() < 10 && digits(cell),
        };
        plain
            || std::str::from_utf8(cell).is_ok_and(|text| match (float, wide) {
                (true, _) => text.parse::<f64>().is_ok(),
                (false, true) => text.parse::<u64>().is_ok(),
                (false, false) => text.parse::<u32>().is_ok(),
            })
    }
}

/// Each column of rows `T`, by name, with what its cells take: found by asking serde to parse
/// `T`'s default row with one cell changed at a time (so that it follows `T`'s fields, never a
/// second list of them).
pub(super) fn cell_kinds<T: ResultsRow>() -> Result<Vec<(Vec<u8>, CellKind)>, ReportError> {
    let mut writer = ::csv::Writer::from_writer(Vec::new());
    let invalid = |e: &dyn std::fmt::Display| ReportError::Invalid(format!("row kinds: {e}"));
    writer.serialize(T::default()).map_err(|e| invalid(&e))?;
    let bytes = writer.into_inner().map_err(|e| invalid(&e))?;
    let mut reader = ::csv::Reader::from_reader(bytes.as_slice());
    let header = reader.byte_headers().map_err(|e| invalid(&e))?.clone();
    let mut base = ::csv::ByteRecord::new();
    reader
        .read_byte_record(&mut base)
        .map_err(|e| invalid(&e))?;
    let takes = |i: usize, value: &str| {
        let mut record = ::csv::ByteRecord::new();
        for (k, cell) in base.iter().enumerate() {
            record.push_field(if k == i { value.as_bytes() } else { cell });
        }
        record.deserialize::<T>(Some(&header)).is_ok()
    };
    Ok((0..header.len())
        .map(|i| {
            let float = takes(i, "1.5");
            // A number this tells: a float, or an integer that takes no sign and no less than
            // a `u32` (a signed or narrower one is not told here).
            let number = takes(i, "7") && takes(i, "65536") && (float || !takes(i, "-1"));
            let kind = if takes(i, "x") {
                CellKind::Text
            } else if number {
                CellKind::Number {
                    float,
                    wide: !float && takes(i, "4294967296"),
                    optional: takes(i, ""),
                }
            } else {
                CellKind::Other
            };
            (header[i].to_vec(), kind)
        })
        .collect())
}

/// Reads a results file through to its end, every row checked, keeping none: whether it can be
/// read, with the rows it holds counted.
pub fn check_rows<T: ResultsRow>(path: &Path, interrupt: &Interrupt) -> Result<u64, ReportError> {
    let mut reader = RowReader::<T>::open(path)?.interrupted_by(interrupt);
    let mut n = 0;
    while reader.next_cells()?.is_some() {
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
