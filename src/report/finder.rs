//! The rows of a results file found on a thread of their own and split and checked there or by helper threads, handed over in chunks, in order.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver, Sender};

use super::line::{read_err, Splitter};
use super::scan::{
    compare_checks, is_clean_text, lines_of, split_each, split_plain_chunk, Blocks, Chunk, Layout,
};
use crate::error::ReportError;

/// How many rows a chunk holds at most, when its rows are found one at a time.
const CHUNK_ROWS: usize = 2048;

/// How many bytes a chunk of plain rows taken whole holds at most.
const CHUNK_BYTES: usize = 256 << 10;

/// How many chunks the finder may be ahead of the rows handed over (besides those its
/// helpers are splitting).
const AHEAD: usize = 2;

/// A file at least this long has its chunks split and checked by helper threads, as many as
/// there are cores (at most [`MAX_HELPERS`]); a shorter one by the finder alone.
const HELPED_FROM: u64 = 4 << 20;
const MAX_HELPERS: usize = 4;

/// The rows of a file after its header, found on a thread of their own and split and checked
/// there or, for a large file, by helper threads (other cores do that while the caller uses
/// the rows), handed over in chunks, in order. It is never more than [`AHEAD`] chunks ahead
/// of the caller besides those being split; dropped, it stops and its threads are waited for.
pub(super) struct Finder {
    path: PathBuf,
    /// Each chunk in order, as the one-time channel its split and checked rows come on.
    rows: Option<Receiver<Receiver<Chunk>>>,
    /// Chunks used up, sent back to be filled again.
    back: Sender<Chunk>,
    threads: Vec<JoinHandle<()>>,
}

/// What one thread needs to split chunks: the file's layout and its own scratch.
struct Splitting {
    layout: Arc<Layout>,
    splitter: Splitter,
    /// The chunk's bytes with each comma made the unit separator (see [`compare_checks`]).
    units: Vec<u8>,
}

impl Splitting {
    fn new(layout: Arc<Layout>) -> Self {
        Splitting {
            layout,
            splitter: Splitter::new(),
            units: Vec::new(),
        }
    }

    /// Splits the rows `chunk` holds (found by [`fill_chunk`]) into cells and compares their
    /// checks.
    fn split(&mut self, chunk: &mut Chunk) {
        let layout = &*self.layout;
        let mut found = std::mem::take(&mut chunk.found);
        if found.iter().all(|f| !f.quoted) && is_clean_text(&chunk.bytes) {
            // The common case: rows of plain text, split in one pass over the chunk.
            split_plain_chunk(layout, chunk.first_line, chunk);
        } else {
            if found.is_empty() {
                // Plain rows taken whole, not plain text after all: split one by one.
                lines_of(&chunk.bytes, chunk.first_line, &mut found);
            }
            split_each(layout, &found, &mut self.splitter, chunk);
        }
        chunk.found = found;
        let (cells, slots) = (&chunk.cells, &mut chunk.slots);
        compare_checks(
            layout,
            (&chunk.bytes, &mut self.units),
            cells,
            slots,
            &mut chunk.damage,
        );
    }
}

impl Finder {
    /// Starts finding the rows `blocks` holds after the header.
    pub(super) fn start(layout: Arc<Layout>, blocks: Blocks) -> Result<Self, ReportError> {
        let path = layout.path.clone();
        let large = blocks.file_len().is_some_and(|len| len >= HELPED_FROM);
        let helpers = match large {
            true => std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_HELPERS)),
            false => 0,
        };
        let (tx, rows) = bounded(AHEAD + helpers);
        let (back, used) = bounded(AHEAD + 2 * helpers + 2);
        let mut threads = Vec::with_capacity(helpers + 1);
        let (work, todo) = bounded::<(Chunk, Sender<Chunk>)>(helpers.max(1));
        let mut finder = Finder {
            path: path.clone(),
            rows: Some(rows),
            back,
            threads: Vec::new(),
        };
        for _ in 0..helpers {
            let (todo, mut splitting) = (todo.clone(), Splitting::new(Arc::clone(&layout)));
            let helper = std::thread::Builder::new()
                .name("gpumux-split".into())
                .spawn(move || {
                    for (mut chunk, done) in todo {
                        splitting.split(&mut chunk);
                        let _ = done.send(chunk);
                    }
                });
            // A helper that did not start leaves its share to the others (or the finder).
            if let Ok(h) = helper {
                threads.push(h);
            }
        }
        drop(todo);
        let work = (!threads.is_empty()).then_some(work);
        let splitting = Splitting::new(layout);
        let found = std::thread::Builder::new()
            .name("gpumux-rows".into())
            .spawn(move || find_rows(blocks, splitting, work, &tx, &used))
            .map_err(read_err(&path));
        // Dropped on an error, the finder stops and waits for the helpers.
        finder.threads = threads;
        finder.threads.push(found?);
        Ok(finder)
    }

    /// The next chunk, `None` after the last; `used` (the chunk handed over before) goes back
    /// to be filled again.
    pub(super) fn next(&mut self, used: Chunk) -> Result<Option<Chunk>, ReportError> {
        let _ = self.back.try_send(used);
        let Some(rows) = &self.rows else {
            return Ok(None);
        };
        let next = rows.recv().ok();
        if let Some(next) = &next {
            if let Ok(chunk) = next.recv() {
                return Ok(Some(chunk));
            }
        }
        // The finder ended: at the end of the rows, or by a panic (its own or a helper's), which
        // must not pass for the end of the rows.
        self.rows = None;
        let mut stopped = next.is_some();
        for thread in self.threads.drain(..) {
            stopped |= thread.join().is_err();
        }
        if stopped {
            return Err(ReportError::Invalid(format!(
                "{}: the reading of its rows stopped unexpectedly",
                self.path.display()
            )));
        }
        Ok(None)
    }
}

impl Drop for Finder {
    fn drop(&mut self) {
        // Its next chunk finds no one to take it, and it ends; then the helpers run out of work.
        self.rows = None;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// The finder's work: chunks of rows found in `blocks`, split and checked (by the helpers
/// `work` reaches, or here), sent on `tx` in order until the rows are over, a row is damaged,
/// or no one takes them.
fn find_rows(
    mut blocks: Blocks,
    mut splitting: Splitting,
    work: Option<Sender<(Chunk, Sender<Chunk>)>>,
    tx: &Sender<Receiver<Chunk>>,
    used: &Receiver<Chunk>,
) {
    loop {
        let mut chunk = used.try_recv().unwrap_or_default();
        if !fill_chunk(&mut blocks, &mut chunk) {
            return;
        }
        let damaged = chunk.damage.is_some();
        let (done, next) = bounded(1);
        if tx.send(next).is_err() {
            return;
        }
        let mut job = (chunk, done);
        if let Some(work) = work.as_ref().filter(|_| !damaged) {
            match work.send(job) {
                Ok(()) => continue,
                // No helper left (each ended by a panic): split here.
                Err(e) => job = e.into_inner(),
            }
        }
        let (mut chunk, done) = job;
        if !damaged {
            splitting.split(&mut chunk);
        }
        let last = chunk.damage.is_some();
        let _ = done.send(chunk);
        if last {
            return;
        }
    }
}

/// Fills `chunk` (cleared first) with the next rows of `blocks`: their bytes, and where each
/// lies in them. False at the end of the rows; a chunk with its damage set is the last.
fn fill_chunk(blocks: &mut Blocks, chunk: &mut Chunk) -> bool {
    chunk.clear();
    match blocks.next_plain(CHUNK_BYTES) {
        Ok(Some((rows, first_line))) => {
            chunk.bytes.extend_from_slice(&blocks.bytes()[rows]);
            chunk.first_line = first_line;
            return true;
        }
        Ok(None) => {}
        Err(e) => {
            chunk.damage = Some(e);
            return true;
        }
    }
    let mut found = std::mem::take(&mut chunk.found);
    let filled = match blocks.next_rows(&mut found, CHUNK_ROWS) {
        Err(e) => {
            found.clear();
            chunk.damage = Some(e);
            true
        }
        Ok(()) => match (found.first(), found.last()) {
            (Some(first), Some(last)) => {
                let (lo, hi) = (first.range.start, last.range.end);
                chunk.bytes.extend_from_slice(&blocks.bytes()[lo..hi]);
                chunk.first_line = first.line;
                for f in &mut found {
                    f.range = f.range.start - lo..f.range.end - lo;
                }
                true
            }
            _ => false,
        },
    };
    chunk.found = found;
    filled
}
