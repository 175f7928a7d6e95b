//! Rows of a results file found in large blocks, each row bounded and split into cells, and the checks of several rows computed side by side (the threads that do it: `finder.rs`).
//!
//! A results file is read a block at a time (never whole). A row is one line, or several
//! when a quoted cell holds a line break (older files). Most rows hold no quote: their cells
//! are split at the commas where they lie, and their checks (FNV-1a, one byte after another)
//! are computed [`LANES`] rows at a time, so that each row's chain of multiplications runs
//! beside the others'. A row with a quote or a carriage return is parsed as CSV on its own.

use std::fs::File;
use std::io::{self, Read};
use std::ops::Range;
use std::path::{Path, PathBuf};

use memchr::{memchr, memchr2, memchr_iter, memrchr};

use super::line::{check_value, damaged, read_err, Splitter, MAX_LINE};
use crate::error::ReportError;
use crate::hash::{fnv1a_more, FNV_PRIME, FNV_START};

/// How many bytes one read asks for.
const BLOCK: usize = 1 << 20;

/// How many rows' checks are computed side by side (and rows found in one go).
pub(super) const LANES: usize = 8;

/// One row found in the block: where its bytes lie (without its line end) and on which line
/// it starts.
#[derive(Clone, Debug)]
pub(super) struct Found {
    pub(super) range: Range<usize>,
    pub(super) line: u64,
    /// Whether the row holds a quote or a carriage return (other than a `\r\n` line end): its
    /// cells are parsed as CSV, not split at the commas.
    pub(super) quoted: bool,
}

/// The rows of a file, found a block at a time; what was read is held until the rows found
/// in it are done with.
pub(super) struct Blocks {
    path: PathBuf,
    file: File,
    buf: Vec<u8>,
    /// The bytes read and not yet taken are `buf[at..filled]`.
    at: usize,
    filled: usize,
    eof: bool,
    /// The lines taken so far.
    lines: u64,
    /// `buf[at..clean]` holds no quote and no carriage return: rows that end there are plain.
    clean: usize,
}

impl Blocks {
    /// Reads `file` (at its start) as the results file at `path`.
    pub(super) fn new(path: &Path, file: File) -> Self {
        Blocks {
            path: path.to_path_buf(),
            file,
            buf: Vec::new(),
            at: 0,
            filled: 0,
            eof: false,
            lines: 0,
            clean: 0,
        }
    }

    /// The bytes the rows found last lie in.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Up to `max` next rows into `out` (cleared first); `out` stays empty at the end of the
    /// rows. The bytes of the rows found last may move: their ranges hold until the next call.
    /// A last line without its newline is a row cut short by a kill: it is dropped (and said).
    pub(super) fn next_rows(
        &mut self,
        out: &mut Vec<Found>,
        max: usize,
    ) -> Result<(), ReportError> {
        out.clear();
        while out.len() < max {
            if let Some(found) = self.find()? {
                out.push(found);
                continue;
            }
            if !out.is_empty() {
                break;
            }
            if self.eof {
                return self.tail();
            }
            self.read_more()?;
        }
        Ok(())
    }

    /// The next rows when they are plain (no quote, no carriage return), taken whole up to
    /// `max` bytes: where their bytes lie (the last one's line end left out) and the line the
    /// first starts on. `None` when the next row is not plain, or longer than `max`: then
    /// [`Blocks::next_rows`] takes the rows one at a time. The bytes may move on the next call.
    pub(super) fn next_plain(
        &mut self,
        max: usize,
    ) -> Result<Option<(Range<usize>, u64)>, ReportError> {
        if !self.eof && self.filled - self.at < max {
            self.read_more()?;
        }
        if self.clean < self.filled {
            self.clean = next_quote_or_cr(&self.buf[..self.filled], self.clean.max(self.at));
        }
        let end = self.clean.min(self.at + max);
        let Some(k) = memrchr(b'\n', &self.buf[self.at..end]) else {
            return Ok(None);
        };
        let rows = self.at..self.at + k;
        let first = self.lines + 1;
        self.lines += memchr_iter(b'\n', &self.buf[rows.clone()]).count() as u64 + 1;
        self.at = rows.end + 1;
        Ok(Some((rows, first)))
    }

    /// The length of the file on disk, when it can be told.
    pub(super) fn file_len(&self) -> Option<u64> {
        self.file.metadata().ok().map(|m| m.len())
    }

    /// Moves the bytes not yet taken to the front and reads more after them.
    fn read_more(&mut self) -> Result<(), ReportError> {
        if self.at > 0 {
            self.buf.copy_within(self.at..self.filled, 0);
            self.filled -= self.at;
            self.clean = self.clean.saturating_sub(self.at);
            self.at = 0;
        }
        let want = self.filled + BLOCK;
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
        loop {
            match self.file.read(&mut self.buf[self.filled..want]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(());
                }
                Ok(n) => {
                    self.filled += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(read_err(&self.path)(e)),
            }
        }
    }

    fn over_long(&self, line: u64) -> ReportError {
        damaged(
            &self.path,
            line,
            format!("the line is over {} KiB", MAX_LINE >> 10),
        )
    }

    /// The next whole row in the bytes read, if they hold one; a line over [`MAX_LINE`] is
    /// refused as soon as its first [`MAX_LINE`] bytes are read.
    fn find(&mut self) -> Result<Option<Found>, ReportError> {
        let start = self.at;
        let (mut q, mut lines, mut open, mut quoted) = (start, 0u64, false, false);
        loop {
            let rest = &self.buf[q..self.filled];
            let Some(i) = memchr(b'\n', rest) else {
                if rest.len() > MAX_LINE || q - start > MAX_LINE {
                    return Err(self.over_long(self.lines + lines + 1));
                }
                // The row is not whole yet: it is sought again from its start once more is
                // read, and what is known plain must not reach past that start (the search
                // above began after the row's first line, where its opening quote is).
                self.clean = self.clean.min(start);
                return Ok(None);
            };
            if i > MAX_LINE || q + i - start > MAX_LINE {
                return Err(self.over_long(self.lines + lines + 1));
            }
            let line = &rest[..i];
            let body = line.strip_suffix(b"\r").unwrap_or(line);
            if q + i > self.clean {
                self.clean = next_quote_or_cr(&self.buf[..self.filled], self.clean.max(q));
            }
            if q + i > self.clean && memchr2(b'"', b'\r', body).is_some() {
                quoted = true;
                open ^= memchr_iter(b'"', line).count() % 2 == 1;
            }
            lines += 1;
            q += i + 1;
            if open {
                continue;
            }
            let mut end = q - 1;
            if self.buf[start..end].ends_with(b"\r") {
                end -= 1;
            }
            let found = Found {
                range: start..end,
                line: self.lines + 1,
                quoted,
            };
            self.lines += lines;
            self.at = q;
            return Ok(Some(found));
        }
    }

    /// At the end of the file, what is left after the last whole row: a row cut short is
    /// dropped; a quoted cell left open or a carriage return without a newline is damage.
    fn tail(&mut self) -> Result<(), ReportError> {
        let rest = &self.buf[self.at..self.filled];
        if rest.is_empty() {
            return Ok(());
        }
        let line = self.lines + 1;
        if memchr(b'\n', rest).is_some() {
            return Err(damaged(&self.path, line, "a quoted cell is never closed"));
        }
        if memchr(b'\r', rest).is_some() {
            return Err(damaged(
                &self.path,
                line,
                "a carriage return without a newline: the file is not written with one row per line",
            ));
        }
        tracing::warn!(
            "{}: dropping line {line}, a row cut short ({} bytes without a newline)",
            self.path.display(),
            rest.len()
        );
        self.at = self.filled;
        Ok(())
    }
}

/// Where the next quote or carriage return of `read` lies from `from` on (its end when none): one
/// search over what was read, so that the rows before it are known to be plain without a
/// search each.
fn next_quote_or_cr(read: &[u8], from: usize) -> usize {
    memchr2(b'"', b'\r', &read[from..]).map_or(read.len(), |k| from + k)
}

/// What every row of one file is read against: its header, where its check is, its extra
/// columns (each one's index and name).
pub(super) struct Layout {
    pub(super) path: PathBuf,
    pub(super) header: ::csv::ByteRecord,
    pub(super) check: Option<usize>,
    pub(super) extra_columns: Vec<(usize, String)>,
}

/// One row of a chunk, its cells split and its check compared.
pub(super) struct Slot {
    pub(super) line: u64,
    /// The row's bytes in the chunk (without its line end).
    pub(super) raw: Range<usize>,
    /// Its cells, in [`Chunk::cells`].
    pub(super) cells: Range<usize>,
    /// Whether the cells lie in the scratch (a quoted row) rather than in the chunk's bytes.
    pub(super) quoted: bool,
    /// The check it carries, once compared with its cells; `None` when it has none.
    pub(super) check: Option<u64>,
}

/// Rows of a file, in its order, each split and checked.
#[derive(Default)]
pub(super) struct Chunk {
    /// The rows' bytes.
    pub(super) bytes: Vec<u8>,
    pub(super) slots: Vec<Slot>,
    /// The rows' cells: ranges in `bytes`, or in `scratch` for a quoted row.
    pub(super) cells: Vec<Range<usize>>,
    /// The cells of quoted rows, as parsed.
    pub(super) scratch: Vec<u8>,
    /// The damage found in the row after `slots`, or a read that failed: the last chunk.
    pub(super) damage: Option<ReportError>,
    /// Where each row lies in `bytes`, as found (before it is split); empty for plain rows
    /// taken whole ([`Blocks::next_plain`]), which are one per line.
    pub(super) found: Vec<Found>,
    /// The line the first row starts on.
    pub(super) first_line: u64,
}

impl Chunk {
    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.slots.clear();
        self.cells.clear();
        self.scratch.clear();
        self.damage = None;
        self.found.clear();
        self.first_line = 0;
    }
}

/// The rows of plain `bytes` (one per line, the first on line `first_line`), as found.
pub(super) fn lines_of(bytes: &[u8], first_line: u64, found: &mut Vec<Found>) {
    found.clear();
    let mut start = 0;
    let ends = memchr_iter(b'\n', bytes).chain(std::iter::once(bytes.len()));
    for (k, end) in ends.enumerate() {
        found.push(Found {
            range: start..end,
            line: first_line + k as u64,
            quoted: false,
        });
        start = end + 1;
    }
}

/// Whether `bytes` are ASCII without a NUL or a carriage return (checked over a chunk at once;
/// a chunk that is not is split row by row, to name the row).
pub(super) fn is_clean_text(bytes: &[u8]) -> bool {
    bytes.is_ascii() && memchr2(0, b'\r', bytes).is_none()
}

/// Splits the rows `found` (their bytes in `chunk.bytes`) one at a time, quoted ones as CSV.
pub(super) fn split_each(
    layout: &Layout,
    found: &[Found],
    splitter: &mut Splitter,
    chunk: &mut Chunk,
) {
    for f in found {
        if f.range.is_empty() {
            // A blank line holds no row (as CSV readers take it).
            continue;
        }
        let cells = (&mut chunk.cells, &mut chunk.scratch);
        match split_row(layout, &chunk.bytes, f, splitter, cells) {
            Ok(slot) => chunk.slots.push(slot),
            Err(e) => {
                chunk.damage = Some(e);
                break;
            }
        }
    }
}

/// Splits rows of plain ASCII text (none quoted, no carriage return, no NUL), one per line
/// from line `first_line` on: the commas and line ends of the whole chunk are found 64 bytes
/// at a time, and each row's cells taken from them. A blank line holds no row.
pub(super) fn split_plain_chunk(layout: &Layout, first_line: u64, chunk: &mut Chunk) {
    let width = layout.header.len();
    let Chunk {
        bytes,
        slots,
        cells,
        damage,
        ..
    } = chunk;
    let mut seps = Separators::new(bytes);
    let (mut start, mut line) = (0, first_line);
    loop {
        let first = cells.len();
        let mut from = start;
        let (end, more) = loop {
            match seps.next() {
                Some((at, false)) => {
                    cells.push(from..at);
                    from = at + 1;
                }
                Some((at, true)) => break (at, true),
                None => break (bytes.len(), false),
            }
        };
        cells.push(from..end);
        if end == start {
            // A blank line.
            cells.truncate(first);
        } else {
            let n = cells.len() - first;
            let check = match layout.check {
                _ if n != width => Err(damaged(
                    &layout.path,
                    line,
                    format!("{n} cells where the header has {width}"),
                )),
                Some(i) if !cells[first + i].is_empty() => hex16(&bytes[cells[first + i].clone()])
                    .map(Some)
                    .ok_or_else(|| mismatch(&layout.path, line)),
                _ => Ok(None),
            };
            match check {
                Ok(check) => slots.push(Slot {
                    line,
                    raw: start..end,
                    cells: first..cells.len(),
                    quoted: false,
                    check,
                }),
                Err(e) => {
                    *damage = Some(e);
                    return;
                }
            }
        }
        if !more {
            return;
        }
        (start, line) = (end + 1, line + 1);
    }
}

/// The commas and line ends of some bytes, in order, each as (where, whether a line end):
/// found by comparing 64 bytes at a time into two bit masks.
struct Separators<'a> {
    bytes: &'a [u8],
    /// Where the block the masks describe starts (the next block: where the one after starts).
    next: usize,
    base: usize,
    commas: u64,
    ends: u64,
}

impl<'a> Separators<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Separators {
            bytes,
            next: 0,
            base: 0,
            commas: 0,
            ends: 0,
        }
    }
}

impl Iterator for Separators<'_> {
    type Item = (usize, bool);

    fn next(&mut self) -> Option<(usize, bool)> {
        loop {
            let any = self.commas | self.ends;
            if any != 0 {
                let k = any.trailing_zeros();
                let bit = 1u64 << k;
                self.commas &= !bit;
                let end = self.ends & bit != 0;
                self.ends &= !bit;
                return Some((self.base + k as usize, end));
            }
            if self.next >= self.bytes.len() {
                return None;
            }
            self.base = self.next;
            let block = &self.bytes[self.base..self.bytes.len().min(self.base + 64)];
            self.next = self.base + block.len();
            (self.commas, self.ends) = match <&[u8; 64]>::try_from(block) {
                Ok(whole) => masks_of(whole),
                Err(_) => masks_of_bytes(block),
            };
        }
    }
}

/// Bit k of the first mask is set when byte k is a comma, of the second when it is a line end.
#[cfg(target_arch = "x86_64")]
#[inline]
fn masks_of(block: &[u8; 64]) -> (u64, u64) {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
    };
    let (mut commas, mut ends) = (0u64, 0u64);
    // SAFETY: SSE2 is part of every x86_64 target, and each unaligned load reads 16 bytes
    // that lie inside `block`.
    unsafe {
        let (comma, end) = (_mm_set1_epi8(b',' as i8), _mm_set1_epi8(b'\n' as i8));
        for k in 0..4 {
            let v = _mm_loadu_si128(block.as_ptr().add(16 * k).cast::<__m128i>());
            let c = _mm_movemask_epi8(_mm_cmpeq_epi8(v, comma)) as u16;
            let e = _mm_movemask_epi8(_mm_cmpeq_epi8(v, end)) as u16;
            commas |= u64::from(c) << (16 * k);
            ends |= u64::from(e) << (16 * k);
        }
    }
    (commas, ends)
}

/// Bit k of the first mask is set when byte k is a comma, of the second when it is a line end.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn masks_of(block: &[u8; 64]) -> (u64, u64) {
    masks_of_bytes(block)
}

/// [`masks_of`] one byte at a time, for any number of bytes up to 64.
fn masks_of_bytes(block: &[u8]) -> (u64, u64) {
    block.iter().enumerate().fold((0, 0), |(c, e), (k, &b)| {
        (
            c | u64::from(b == b',') << k,
            e | u64::from(b == b'\n') << k,
        )
    })
}

/// Splits the row `found` into its cells (appended to `cells`, those of a quoted row parsed
/// into `scratch`) and checks what can be checked of one row alone; a plain row's check is
/// compared afterwards, with the chunk's others ([`compare_checks`]).
fn split_row(
    layout: &Layout,
    bytes: &[u8],
    found: &Found,
    splitter: &mut Splitter,
    (cells, scratch): (&mut Vec<Range<usize>>, &mut Vec<u8>),
) -> Result<Slot, ReportError> {
    let (path, line) = (layout.path.as_path(), found.line);
    let raw = &bytes[found.range.clone()];
    let first = cells.len();
    if found.quoted {
        splitter
            .split(raw, scratch, cells)
            .map_err(|why| damaged(path, line, why))?;
    } else {
        split_plain(raw, found.range.start, cells);
    }
    let n = cells.len() - first;
    if n != layout.header.len() {
        return Err(damaged(
            path,
            line,
            format!("{n} cells where the header has {}", layout.header.len()),
        ));
    }
    if memchr::memchr(0, raw).is_some() {
        return Err(damaged(path, line, "a NUL byte"));
    }
    if !raw.is_ascii() && std::str::from_utf8(raw).is_err() {
        return Err(damaged(path, line, "text that is not UTF-8"));
    }
    let mut slot = Slot {
        line,
        raw: found.range.clone(),
        cells: first..cells.len(),
        quoted: found.quoted,
        check: None,
    };
    let Some(i) = layout.check else {
        return Ok(slot);
    };
    let own = if found.quoted { &scratch[..] } else { bytes };
    let given = &own[cells[first + i].clone()];
    if given.is_empty() {
        return Ok(slot);
    }
    let mismatch = || mismatch(path, line);
    let value = hex16(given).ok_or_else(mismatch)?;
    if found.quoted {
        let each = cells[first..first + i].iter().map(|r| &scratch[r.clone()]);
        if check_value(each) != value {
            return Err(mismatch());
        }
    }
    slot.check = Some(value);
    Ok(slot)
}

/// The damage of a row whose cells do not match its check.
fn mismatch(path: &Path, line: u64) -> ReportError {
    damaged(
        path,
        line,
        "its cells do not match its check: the row was changed after it was written",
    )
}

/// Compares the checks of the chunk's plain rows with their cells, [`LANES`] at a time: the
/// first row whose check does not match becomes the chunk's damage, and the rows from it on
/// are dropped. `units` is scratch: the chunk's bytes with each comma made the unit separator.
pub(super) fn compare_checks(
    layout: &Layout,
    (bytes, units): (&[u8], &mut Vec<u8>),
    cells: &[Range<usize>],
    batch: &mut Vec<Slot>,
    damage: &mut Option<ReportError>,
) {
    let Some(i) = layout.check else {
        return;
    };
    units.clear();
    units.extend(bytes.iter().map(|&b| if b == b',' { UNIT } else { b }));
    let mut plain: Vec<(usize, &[u8])> = Vec::with_capacity(LANES);
    let group = |plain: &mut Vec<(usize, &[u8])>, batch: &mut Vec<Slot>| {
        let rows: [&[u8]; LANES] = std::array::from_fn(|l| plain.get(l).map_or(&[][..], |p| p.1));
        let sums = fnv_side_by_side(&rows);
        let bad = plain
            .iter()
            .zip(sums)
            .find(|((k, _), sum)| batch[*k].check != Some(*sum));
        let bad = bad.map(|((k, _), _)| *k);
        plain.clear();
        bad
    };
    for k in 0..batch.len() {
        let slot = &batch[k];
        if slot.quoted || slot.check.is_none() {
            continue;
        }
        // The cells before the check, with the separators between them.
        let end = if i == 0 {
            slot.raw.start
        } else {
            cells[slot.cells.start + i - 1].end
        };
        plain.push((k, &units[slot.raw.start..end]));
        if plain.len() == LANES {
            if let Some(bad) = group(&mut plain, batch) {
                // The first row that does not match ends the batch: the rows after it are not
                // handed over.
                *damage = Some(mismatch(&layout.path, batch[bad].line));
                batch.truncate(bad);
                return;
            }
        }
    }
    if let Some(bad) = group(&mut plain, batch) {
        *damage = Some(mismatch(&layout.path, batch[bad].line));
        batch.truncate(bad);
    }
}

/// The byte a comma between cells is taken as in a check: the unit separator.
const UNIT: u8 = 0x1f;

/// Where each cell of a row without quotes lies: `cells` gets one range per cell.
pub(super) fn split_plain(line: &[u8], base: usize, cells: &mut Vec<Range<usize>>) {
    let mut from = 0;
    for comma in memchr_iter(b',', line) {
        cells.push(base + from..base + comma);
        from = comma + 1;
    }
    cells.push(base + from..base + line.len());
}

/// The FNV-1a of each of [`LANES`] rows (their commas already made [`UNIT`]s), side by side:
/// each row's chain of multiplications runs beside the others'. An empty row's is FNV's start.
pub(super) fn fnv_side_by_side(rows: &[&[u8]; LANES]) -> [u64; LANES] {
    let mut h = [FNV_START; LANES];
    let common = rows.iter().map(|r| r.len()).min().unwrap_or(0);
    let lanes: [&[u8]; LANES] = std::array::from_fn(|l| &rows[l][..common]);
    for i in 0..common {
        for (h, lane) in h.iter_mut().zip(&lanes) {
            *h = (*h ^ u64::from(lane[i])).wrapping_mul(FNV_PRIME);
        }
    }
    for (h, row) in h.iter_mut().zip(rows) {
        *h = fnv1a_more(*h, &row[common..]);
    }
    h
}

/// The number 16 hex digits (either case) write; `None` for anything else.
pub(super) fn hex16(cell: &[u8]) -> Option<u64> {
    let digits: &[u8; 16] = cell.try_into().ok()?;
    let mut v = 0u64;
    let mut bad = 0u8;
    for &b in digits {
        let d = HEX[usize::from(b)];
        bad |= d;
        v = (v << 4) | u64::from(d & 0xf);
    }
    (bad & 0x80 == 0).then_some(v)
}

/// Each byte's value as a hex digit (either case), or 0x80 for a byte that is none.
const HEX: [u8; 256] = {
    let mut t = [0x80u8; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = match b as u8 {
            c @ b'0'..=b'9' => c - b'0',
            c @ b'a'..=b'f' => c - b'a' + 10,
            c @ b'A'..=b'F' => c - b'A' + 10,
            _ => 0x80,
        };
        b += 1;
    }
    t
};

/// `value` as the 16 lowercase hex digits of a check cell.
pub(super) fn push_hex16(out: &mut Vec<u8>, value: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for k in (0..16).rev() {
        out.push(DIGITS[((value >> (4 * k)) & 0xf) as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::line::check_value;

    #[test]
    fn checks_side_by_side_are_the_checks_of_the_cells() {
        let rows: Vec<Vec<u8>> = (0..11)
            .map(|i| {
                format!("{i},t{},x{},,{}", i * 37, "y".repeat(i % 5), i as f64 / 3.0).into_bytes()
            })
            .collect();
        let units: Vec<Vec<u8>> = rows
            .iter()
            .map(|r| {
                r.iter()
                    .map(|&b| if b == b',' { UNIT } else { b })
                    .collect()
            })
            .collect();
        for take in [0, 1, 3, 8] {
            let some: [&[u8]; LANES] =
                std::array::from_fn(|l| if l < take { &units[l + 2][..] } else { &[][..] });
            let got = fnv_side_by_side(&some);
            for l in 0..LANES {
                let want = if l < take {
                    check_value(rows[l + 2].split(|&b| b == b','))
                } else {
                    FNV_START
                };
                assert_eq!(got[l], want, "row {l} of {take}");
            }
        }
    }

    #[test]
    fn hex_cells_read_and_write_back() {
        assert_eq!(hex16(b"892d7bccc88bdaa4"), Some(0x892d_7bcc_c88b_daa4));
        assert_eq!(hex16(b"892D7BCCC88BDAA4"), Some(0x892d_7bcc_c88b_daa4));
        assert_eq!(hex16(b"892d7bccc88bdaa"), None);
        assert_eq!(hex16(b"892d7bccc88bdaaz"), None);
        assert_eq!(hex16(b"+92d7bccc88bdaa4"), None);
        let mut out = Vec::new();
        push_hex16(&mut out, 0x0123_4567_89ab_cdef);
        assert_eq!(out, b"0123456789abcdef");
    }

    #[test]
    fn quoted_rows_split_as_csv_and_two_rows_are_refused() {
        let mut splitter = Splitter::new();
        let (mut scratch, mut cells) = (b"xy".to_vec(), Vec::new());
        let row = b"a,\"b,\"\"c\"\"\",,\"line\nbreak\"";
        splitter.split(row, &mut scratch, &mut cells).unwrap();
        let got: Vec<&[u8]> = cells.iter().map(|r| &scratch[r.clone()]).collect();
        assert_eq!(got, [&b"a"[..], b"b,\"c\"", b"", b"line\nbreak"]);
        let big = format!("\"{}\",z", "q".repeat(300));
        cells.clear();
        splitter
            .split(big.as_bytes(), &mut scratch, &mut cells)
            .unwrap();
        assert_eq!(cells.len(), 2);
        assert!(splitter
            .split(b"a,b\rc,d", &mut scratch, &mut cells)
            .is_err());
    }

    /// The rows of the file at `path` (each as its first line and bytes) as the finder takes
    /// them: plain rows whole, up to `max` bytes at a time, when `plain`; else one at a time.
    fn rows_taken(path: &Path, plain: bool, max: usize) -> Result<Vec<(u64, Vec<u8>)>, String> {
        let mut blocks = Blocks::new(path, File::open(path).unwrap());
        let (mut rows, mut found) = (Vec::new(), Vec::new());
        loop {
            if plain {
                if let Some((range, first)) = blocks.next_plain(max).map_err(|e| e.to_string())? {
                    let bytes = &blocks.bytes()[range];
                    for (k, line) in bytes.split(|&b| b == b'\n').enumerate() {
                        rows.push((first + k as u64, line.to_vec()));
                    }
                    continue;
                }
            }
            blocks.next_rows(&mut found, 3).map_err(|e| e.to_string())?;
            if found.is_empty() {
                return Ok(rows);
            }
            rows.extend(
                found
                    .iter()
                    .map(|f| (f.line, blocks.bytes()[f.range.clone()].to_vec())),
            );
        }
    }

    #[test]
    fn quoted_rows_over_several_lines_read_whole_across_blocks() {
        // Rows of three lines each (a quoted cell holds two line breaks, the last line long),
        // more than a block's worth, so that more is read while a row's last line is half read.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.csv");
        let row = format!("a,\"x\ny\n{}\",b", "g".repeat(300));
        let n = 3 * BLOCK / row.len();
        let mut text = String::new();
        for k in 0..n {
            text.push_str(&row);
            text.push_str(&format!("{k}\n"));
        }
        std::fs::write(&path, text).unwrap();
        for plain in [true, false] {
            let rows = rows_taken(&path, plain, 256 << 10).unwrap();
            assert_eq!(rows.len(), n);
            for (k, (line, bytes)) in rows.iter().enumerate() {
                assert_eq!(*line, 3 * k as u64 + 1);
                assert_eq!(bytes, format!("{row}{k}").as_bytes());
            }
        }
    }

    proptest::proptest! {
        /// Plain rows taken whole are the rows found one at a time: the same bytes on the same
        /// lines, around quoted cells over several lines, carriage returns, blank lines, rows
        /// longer than a chunk and a cut last line; damage is the same damage.
        #[test]
        fn plain_rows_taken_whole_are_the_rows_found_one_at_a_time(
            lines in proptest::collection::vec((0u8..10, "[a-z0-9,.]{0,40}"), 0..60),
            cut in proptest::option::of(0usize..2000),
            max in 1usize..200,
        ) {
            let mut text = Vec::new();
            for (how, cell) in &lines {
                match how {
                    0 => {}
                    1 => text.extend_from_slice(format!("\"{cell}\nmore\",x").as_bytes()),
                    2 => text.extend_from_slice(format!("{cell}\r").as_bytes()),
                    3 => text.extend_from_slice(cell.repeat(8).as_bytes()),
                    _ => text.extend_from_slice(cell.as_bytes()),
                }
                text.push(b'\n');
            }
            if let Some(cut) = cut {
                text.truncate(cut.min(text.len()));
            }
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("rows.csv");
            std::fs::write(&path, &text).unwrap();
            let whole = rows_taken(&path, true, max);
            let each = rows_taken(&path, false, max);
            proptest::prop_assert_eq!(whole, each);
        }
    }

    /// The rows of `text` (lines split at `\n`, the last without one) as the blocks find them.
    fn found_in(text: &[u8]) -> Vec<Found> {
        let mut at = 0;
        text.split(|&b| b == b'\n')
            .enumerate()
            .map(|(i, row)| {
                let f = Found {
                    range: at..at + row.len(),
                    line: i as u64 + 2,
                    quoted: false,
                };
                at += row.len() + 1;
                f
            })
            .collect()
    }

    /// One row a split left: its line, cells and check.
    type Split<'a> = (u64, Vec<&'a [u8]>, Option<u64>);

    /// What a split left: each row, and the damage said.
    fn outcome(chunk: &Chunk) -> (Vec<Split<'_>>, Option<String>) {
        let rows = chunk
            .slots
            .iter()
            .map(|s| {
                let cells = chunk.cells[s.cells.clone()]
                    .iter()
                    .map(|r| &chunk.bytes[r.clone()])
                    .collect();
                (s.line, cells, s.check)
            })
            .collect();
        (rows, chunk.damage.as_ref().map(ToString::to_string))
    }

    /// A row of `cells` with its check, as a results file holds it.
    fn checked_row(cells: &[String]) -> String {
        let mut out = cells.join(",").into_bytes();
        out.push(b',');
        push_hex16(&mut out, check_value(cells.iter().map(|c| c.as_bytes())));
        String::from_utf8(out).unwrap()
    }

    proptest::proptest! {
        /// The one-pass split of a chunk of plain rows finds the cells, checks and damage that
        /// the row-by-row split finds, blank lines, short rows and bad checks included.
        #[test]
        fn a_plain_chunk_splits_as_its_rows_one_by_one(
            rows in proptest::collection::vec(
                (proptest::collection::vec("[a-z0-9.]{0,9}", 3), 0u8..8),
                1..40,
            )
        ) {
            let lines: Vec<String> = rows
                .iter()
                .map(|(cells, how)| match how {
                    0 => String::new(),
                    1 => cells.join(","),
                    2 => format!("{},{}", checked_row(cells), cells[0]),
                    3 => format!("{},zz{}", cells.join(","), "0".repeat(14)),
                    4 => format!("{},", cells.join(",")),
                    _ => checked_row(cells),
                })
                .collect();
            let text = lines.join("\n").into_bytes();
            let layout = Layout {
                path: PathBuf::from("p.csv"),
                header: ::csv::ByteRecord::from(vec!["a", "b", "c", "check"]),
                check: Some(3),
                extra_columns: Vec::new(),
            };
            let found = found_in(&text);
            let (mut one, mut each) = (Chunk::default(), Chunk::default());
            one.bytes = text.clone();
            each.bytes = text;
            split_plain_chunk(&layout, found[0].line, &mut one);
            split_each(&layout, &found, &mut Splitter::new(), &mut each);
            proptest::prop_assert_eq!(outcome(&one), outcome(&each));
        }
    }

    #[test]
    fn separators_are_found_across_blocks_and_in_a_short_tail() {
        let mut text = vec![b'x'; 200];
        for at in [0, 5, 63, 64, 65, 127, 128, 190, 199] {
            text[at] = if at % 2 == 0 { b',' } else { b'\n' };
        }
        let got: Vec<(usize, bool)> = Separators::new(&text).collect();
        let want: Vec<(usize, bool)> = [0, 5, 63, 64, 65, 127, 128, 190, 199]
            .iter()
            .map(|&at| (at, at % 2 == 1))
            .collect();
        assert_eq!(got, want);
        assert_eq!(Separators::new(&[]).count(), 0);
    }

    #[test]
    fn split_plain_finds_every_cell() {
        let mut cells = Vec::new();
        split_plain(b"a,,bc,", 10, &mut cells);
        assert_eq!(cells, vec![10..11, 12..12, 13..15, 16..16]);
    }
}
