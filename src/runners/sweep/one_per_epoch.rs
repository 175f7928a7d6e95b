//! One progress row per (trial, epoch) of the trials kept, found in at most two passes over rows read one at a time: the last one written of each, where it was written.
//!
//! The first pass sees every row ([`OnePerEpoch::see`]): while no (trial, epoch) comes twice,
//! every row it calls [`Met::First`] is kept and no second pass is needed. Otherwise the
//! second keeps a row when [`OnePerEpoch::keeps`] says so. What is held is one bit per (trial, epoch) (a 64-bit key
//! for an epoch past [`NEAR_EPOCHS`]), and the number of the last row of each key met twice:
//! never the rows.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use crate::error::ReportError;
use crate::hash::Seeded;
use crate::report::{Cells, ProgressRow, RowReader};

/// Epochs below this are held as bits (at most 512 bytes a trial); the rare ones past it as keys.
pub const NEAR_EPOCHS: u32 = 4096;

/// An id looked up, and what was found for it: its trial's index and source.
type Memo = (Vec<u8>, Option<(u32, usize)>);

/// What the first pass makes of one row (its trial and epoch met).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Met {
    /// A row of a trial not kept, or from a source its rows do not come from.
    NotKept,
    /// The first row of its (trial, epoch).
    First,
    /// A (trial, epoch) seen before: only the last of its rows is kept.
    Again,
}

/// The rows to keep of a stream of progress rows (see the module's text).
#[derive(Debug, Default)]
pub struct OnePerEpoch<'a> {
    /// The trials whose rows are kept, by id: their index (in the key) and the source (a
    /// folder's index) their rows must come from.
    trials: HashMap<&'a [u8], (u32, usize), Seeded>,
    /// The epochs seen of each trial, by its index: one bit per epoch below [`NEAR_EPOCHS`].
    near: Vec<Vec<u64>>,
    /// The keys seen of epochs from [`NEAR_EPOCHS`] on.
    far: HashSet<u64, Seeded>,
    /// How many (trial, epoch) keys were seen.
    distinct: u64,
    /// The number of the last row of each key met more than once.
    last: HashMap<u64, u64, Seeded>,
    /// The rows seen by the first pass.
    rows: u64,
    /// The id looked up last, and what was found for it.
    memo: RefCell<Memo>,
}

impl<'a> OnePerEpoch<'a> {
    /// Keeps the rows of these trials, each from its source only.
    pub fn new(kept: impl IntoIterator<Item = (&'a str, usize)>) -> Self {
        let mut trials = HashMap::default();
        for (id, source) in kept {
            let index = trials.len() as u32;
            trials.entry(id.as_bytes()).or_insert((index, source));
        }
        OnePerEpoch {
            near: vec![Vec::new(); trials.len()],
            trials,
            ..Default::default()
        }
    }

    fn key(&self, source: usize, (id, epoch): (&[u8], u32)) -> Option<u64> {
        // A trial's rows mostly follow one another: the last id looked up is compared first.
        let mut memo = self.memo.borrow_mut();
        let found = if same_bytes(&memo.0, id) {
            memo.1
        } else {
            let found = self.trials.get(id).copied();
            memo.0.clear();
            memo.0.extend_from_slice(id);
            memo.1 = found;
            found
        };
        let (index, from) = found?;
        (from == source).then_some((u64::from(index) << 32) | u64::from(epoch))
    }

    /// The first pass: the `at`-th row (counted from 0 over all sources, in order), by its
    /// trial id and epoch.
    pub fn see(&mut self, at: u64, source: usize, row: (&[u8], u32)) -> Met {
        self.rows += 1;
        let Some(key) = self.key(source, row) else {
            return Met::NotKept;
        };
        if self.first_time(key) {
            self.distinct += 1;
            Met::First
        } else {
            self.last.insert(key, at);
            Met::Again
        }
    }

    /// Marks `key` seen: whether it was not yet.
    fn first_time(&mut self, key: u64) -> bool {
        let (index, epoch) = ((key >> 32) as usize, key as u32);
        if epoch >= NEAR_EPOCHS {
            return self.far.insert(key);
        }
        let bits = &mut self.near[index];
        let (word, bit) = ((epoch / 64) as usize, 1u64 << (epoch % 64));
        if bits.len() <= word {
            bits.resize(word + 1, 0);
        }
        let new = bits[word] & bit == 0;
        bits[word] |= bit;
        new
    }

    /// How many rows of the first pass are not kept: of other trials, or an epoch written again.
    pub fn dropped(&self) -> u64 {
        self.rows - self.distinct
    }

    /// The second pass, over the same rows in the same order: whether the `at`-th is kept.
    pub fn keeps(&self, at: u64, source: usize, row: (&[u8], u32)) -> bool {
        match self.key(source, row) {
            None => false,
            Some(key) => self.last.get(&key).is_none_or(|&last| last == at),
        }
    }
}

/// Where the rows of one `progress.csv` hold their trial id and epoch.
#[derive(Clone, Copy, Debug)]
pub struct KeyColumns {
    id: usize,
    epoch: usize,
}

impl KeyColumns {
    /// The key columns of the file `reader` reads (every file that reads has both).
    pub fn of(reader: &RowReader<ProgressRow>) -> Result<Self, ReportError> {
        let at = |name: &str| {
            reader.column(name).ok_or_else(|| {
                ReportError::Invalid(format!("{}: no column `{name}`", reader.path().display()))
            })
        };
        Ok(KeyColumns {
            id: at("trial_id")?,
            epoch: at("epoch")?,
        })
    }

    /// A row's trial id (its bytes) and epoch.
    pub fn key<'c>(
        &self,
        cells: &'c Cells<'_, ProgressRow>,
    ) -> Result<(&'c [u8], u32), ReportError> {
        let epoch = match digits_u32(cells.cell(self.epoch)) {
            Some(e) => e,
            // Said as any cell that does not parse is.
            None => cells.value(self.epoch)?,
        };
        Ok((cells.cell(self.id), epoch))
    }
}

/// Whether two short byte strings (trial ids) are equal: compared eight bytes at a time in
/// line, where a call to `memcmp` for each row of millions costs more than the comparing.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut x, mut y) = (a.chunks_exact(8), b.chunks_exact(8));
    let words_equal = x.by_ref().zip(y.by_ref()).all(|(p, q)| {
        u64::from_ne_bytes(p.try_into().unwrap_or_default())
            == u64::from_ne_bytes(q.try_into().unwrap_or_default())
    });
    words_equal && x.remainder().iter().eq(y.remainder())
}

/// The number 1 to 10 decimal digits write, when it fits in a `u32`.
fn digits_u32(cell: &[u8]) -> Option<u32> {
    if cell.is_empty() || cell.len() > 10 {
        return None;
    }
    let mut v = 0u64;
    for &b in cell {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u64::from(b - b'0');
    }
    u32::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, epoch: u32, acc: f64) -> ProgressRow {
        ProgressRow {
            trial_id: id.into(),
            epoch,
            test_acc: acc,
            ..Default::default()
        }
    }

    /// Both passes over `rows` (each with its source).
    fn kept(keep: &[(&str, usize)], rows: &[(usize, ProgressRow)]) -> (Vec<ProgressRow>, u64) {
        let mut one = OnePerEpoch::new(keep.iter().copied());
        for (at, (s, r)) in rows.iter().enumerate() {
            one.see(at as u64, *s, (r.trial_id.as_bytes(), r.epoch));
        }
        let out = rows
            .iter()
            .enumerate()
            .filter(|(at, (s, r))| one.keeps(*at as u64, *s, (r.trial_id.as_bytes(), r.epoch)))
            .map(|(_, (_, r))| r.clone())
            .collect();
        (out, one.dropped())
    }

    #[test]
    fn ids_are_compared_whole() {
        let ids: [&[u8]; 7] = [
            b"",
            b"a",
            b"a0000000000000000",
            b"a0000000000000001",
            b"b0000000000000000",
            b"a000000000000000",
            b"a00000000000000000",
        ];
        for x in ids {
            for y in ids {
                assert_eq!(same_bytes(x, y), x == y, "{x:?} {y:?}");
            }
        }
    }

    #[test]
    fn the_last_row_of_each_epoch_is_kept_where_it_was_written() {
        let rows = [
            (0, row("a", 1, 0.1)),
            (0, row("b", 1, 0.2)),
            (0, row("a", 2, 0.3)),
            (0, row("a", 1, 0.4)),
            (0, row("x", 1, 0.5)),
        ];
        let (got, dropped) = kept(&[("a", 0), ("b", 0)], &rows);
        let accs: Vec<f64> = got.iter().map(|r| r.test_acc).collect();
        assert_eq!(accs, [0.2, 0.3, 0.4]);
        assert_eq!(dropped, 2);
        // Epochs far past the usual ones are told apart as well.
        let far = [
            (0, row("a", NEAR_EPOCHS, 0.1)),
            (0, row("a", u32::MAX, 0.2)),
            (0, row("a", NEAR_EPOCHS, 0.3)),
            (0, row("a", NEAR_EPOCHS - 1, 0.4)),
        ];
        let (got, dropped) = kept(&[("a", 0)], &far);
        let accs: Vec<f64> = got.iter().map(|r| r.test_acc).collect();
        assert_eq!(accs, [0.2, 0.3, 0.4]);
        assert_eq!(dropped, 1);
    }

    #[test]
    fn a_trial_keeps_the_rows_of_its_own_source_only() {
        let rows = [
            (0, row("a", 1, 0.1)),
            (1, row("a", 1, 0.9)),
            (1, row("a", 2, 0.8)),
            (0, row("b", 1, 0.2)),
        ];
        let (got, dropped) = kept(&[("a", 1), ("b", 0)], &rows);
        let accs: Vec<f64> = got.iter().map(|r| r.test_acc).collect();
        assert_eq!(accs, [0.9, 0.8, 0.2]);
        assert_eq!(dropped, 1);
        let (none, dropped) = kept(&[], &rows);
        assert!(none.is_empty());
        assert_eq!(dropped, 4);
    }
}
