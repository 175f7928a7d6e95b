//! One progress row per (trial, epoch) of the trials kept, found in two passes over rows read one at a time: the last one written of each, where it was written.
//!
//! The first pass sees every row ([`OnePerEpoch::see`]); the second keeps a row when
//! [`OnePerEpoch::keeps`] says so. What is held is one 64-bit key per (trial, epoch), and the
//! number of the last row of each key met twice: never the rows.

use std::collections::{HashMap, HashSet};

use crate::report::ProgressRow;

/// The rows to keep of a stream of progress rows (see the module's text).
#[derive(Debug, Default)]
pub struct OnePerEpoch<'a> {
    /// The trials whose rows are kept, by id: their index (in the key) and the source (a
    /// folder's index) their rows must come from.
    trials: HashMap<&'a str, (u32, usize)>,
    seen: HashSet<u64>,
    /// The number of the last row of each key met more than once.
    last: HashMap<u64, u64>,
    /// The rows seen by the first pass.
    rows: u64,
}

impl<'a> OnePerEpoch<'a> {
    /// Keeps the rows of these trials, each from its source only.
    pub fn new(kept: impl IntoIterator<Item = (&'a str, usize)>) -> Self {
        let mut trials = HashMap::new();
        for (id, source) in kept {
            let index = trials.len() as u32;
            trials.entry(id).or_insert((index, source));
        }
        OnePerEpoch {
            trials,
            ..Default::default()
        }
    }

    fn key(&self, source: usize, row: &ProgressRow) -> Option<u64> {
        let &(index, from) = self.trials.get(row.trial_id.as_str())?;
        (from == source).then_some((u64::from(index) << 32) | u64::from(row.epoch))
    }

    /// The first pass: the `at`-th row (counted from 0 over all sources, in order).
    pub fn see(&mut self, at: u64, source: usize, row: &ProgressRow) {
        self.rows += 1;
        if let Some(key) = self.key(source, row) {
            if !self.seen.insert(key) {
                self.last.insert(key, at);
            }
        }
    }

    /// How many rows of the first pass are not kept: of other trials, or an epoch written again.
    pub fn dropped(&self) -> u64 {
        self.rows - self.seen.len() as u64
    }

    /// The second pass, over the same rows in the same order: whether the `at`-th is kept.
    pub fn keeps(&self, at: u64, source: usize, row: &ProgressRow) -> bool {
        match self.key(source, row) {
            None => false,
            Some(key) => self.last.get(&key).is_none_or(|&last| last == at),
        }
    }
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
            one.see(at as u64, *s, r);
        }
        let out = rows
            .iter()
            .enumerate()
            .filter(|(at, (s, r))| one.keeps(*at as u64, *s, r))
            .map(|(_, (_, r))| r.clone())
            .collect();
        (out, one.dropped())
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
