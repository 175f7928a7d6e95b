//! The extra columns of `progress.csv`: the other numeric keys of an external command's epoch lines, one column each, named by the key, bounded in number.
//!
//! A key becomes a column when its name is safe (see [`refusal`]) and the file has fewer than
//! [`MAX_EXTRA`] extra columns; otherwise its values are dropped, with one warning per key and
//! file. The columns follow the row's own, before `check`, in the order they first appeared.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use super::line::CHECK;

/// The most extra columns one results file holds; later keys are dropped.
pub const MAX_EXTRA: usize = 32;
/// The longest name of an extra column, in bytes.
pub const MAX_NAME: usize = 64;
/// How many dropped keys one file warns about; past it, keys are dropped without a word.
const MAX_WARNED: usize = 1024;

/// Why `name` cannot name an extra column next to the row's own columns `fixed`, if it cannot.
/// A name is 1 to [`MAX_NAME`] ASCII letters, digits and `_ . - /`, starting with a letter or
/// `_`, and is no column of the row nor [`CHECK`], in any case: so it needs no quoting in a
/// CSV header, and reads the same in a spreadsheet, pandas or a plot.
pub fn refusal<'a>(name: &str, fixed: impl IntoIterator<Item = &'a [u8]>) -> Option<String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Some(format!("a column name is 1 to {MAX_NAME} characters"));
    }
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/'));
    if !first_ok || !rest_ok {
        return Some(
            "a column name starts with a letter or `_` and holds only letters, digits and `_ . - /`"
                .into(),
        );
    }
    let taken = fixed
        .into_iter()
        .chain([CHECK.as_bytes()])
        .any(|c| c.eq_ignore_ascii_case(name.as_bytes()));
    taken.then(|| "it is the name of one of the file's own columns".into())
}

/// The keys of one file that were dropped, each warned about once. Each is held as a hash: a
/// key may be as long as a line (a MiB), and a thousand of them are remembered.
#[derive(Debug, Default)]
pub(crate) struct Dropped {
    names: HashSet<u64>,
}

impl Dropped {
    /// Whether `name` was dropped before.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.names.contains(&crate::hash::fnv1a(name.as_bytes()))
    }

    /// Drops `name`, warning the first time.
    pub(crate) fn drop_key(&mut self, path: &Path, name: &str, why: &str) {
        if self.names.len() >= MAX_WARNED || !self.names.insert(crate::hash::fnv1a(name.as_bytes()))
        {
            return;
        }
        let shown: String = name.chars().take(MAX_NAME + 16).collect();
        tracing::warn!(
            "{}: the epoch lines' key {shown:?} is not kept as a column: {why}",
            path.display()
        );
    }
}

/// The extra columns after `columns` (kept first, in their order) once `values` are added:
/// each new key that may name a column joins at the end while there are fewer than
/// [`MAX_EXTRA`]; the others are dropped (said once each through `dropped`).
pub(crate) fn widened<'a>(
    path: &Path,
    columns: &[String],
    values: impl IntoIterator<Item = &'a BTreeMap<String, f64>>,
    fixed: &::csv::ByteRecord,
    dropped: &mut Dropped,
) -> Vec<String> {
    let mut out = columns.to_vec();
    for map in values {
        for name in map.keys() {
            if out.contains(name) || dropped.has(name) {
                continue;
            }
            if let Some(why) = refusal(name, fixed.iter()) {
                dropped.drop_key(path, name, &why);
            } else if out.len() >= MAX_EXTRA {
                let why = format!("the file has {MAX_EXTRA} extra columns already");
                dropped.drop_key(path, name, &why);
            } else {
                out.push(name.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ReportError;
    use crate::report::{
        merge_files, read_progress, write_rows, Interrupt, ProgressRow, ReportWriter, PROGRESS_CSV,
    };
    use std::fs;

    /// The header of `progress.csv` without extra columns, as it always was.
    const PLAIN: &str =
        "round,trial_id,split,n,epoch,train_loss,train_acc,test_loss,test_acc,wall_s,check";

    fn row(id: &str, epoch: u32, extra: &[(&str, f64)]) -> ProgressRow {
        ProgressRow {
            round: 0,
            trial_id: id.into(),
            split: "shared".into(),
            n: 2,
            epoch,
            train_loss: 0.5 / f64::from(epoch),
            train_acc: 0.25,
            test_loss: f64::NAN,
            test_acc: 0.1 * f64::from(epoch),
            wall_s: 1.5,
            extra: extra.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    fn header(dir: &Path) -> String {
        let text = fs::read_to_string(dir.join(PROGRESS_CSV)).unwrap();
        text.lines().next().unwrap().to_string()
    }

    /// Rows compare equal with NaN cells: by their debug text.
    fn same(a: &[ProgressRow], b: &[ProgressRow]) {
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }

    fn files_in(dir: &Path) -> usize {
        fs::read_dir(dir).unwrap().count()
    }

    #[test]
    fn rows_without_extras_write_the_plain_header() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ReportWriter::create(dir.path()).unwrap();
        w.progress(&row("t0", 1, &[])).unwrap();
        drop(w);
        assert_eq!(header(dir.path()), PLAIN);
        write_rows(&dir.path().join(PROGRESS_CSV), &[row("t0", 1, &[])]).unwrap();
        assert_eq!(header(dir.path()), PLAIN);
    }

    #[test]
    fn a_new_key_widens_the_file_and_earlier_rows_stay_whole() {
        let dir = tempfile::tempdir().unwrap();
        let rows = vec![
            row("t0", 1, &[]),
            row("t0", 2, &[("lr", 0.01)]),
            row("t1", 1, &[("lr", 0.02), ("grad_norm", f64::INFINITY)]),
            row("t1", 2, &[("grad_norm", 1.7)]),
        ];
        let mut w = ReportWriter::create(dir.path()).unwrap();
        w.progress(&rows[0]).unwrap();
        w.progress_unsynced(&rows[1]).unwrap();
        w.progress_unsynced(&rows[2]).unwrap();
        w.sync_progress().unwrap();
        w.progress(&rows[3]).unwrap();
        drop(w);
        // Both keys of one line join in name order, after `wall_s`, before `check`.
        let plain = PLAIN.trim_end_matches(",check");
        assert_eq!(header(dir.path()), format!("{plain},lr,grad_norm,check"));
        // The one reader checks every row's check: the rewritten rows carry new ones.
        same(&read_progress(dir.path()).unwrap(), &rows);
        let text = fs::read_to_string(dir.path().join(PROGRESS_CSV)).unwrap();
        let first = text.lines().nth(1).unwrap();
        assert!(first.contains(",1.5,,,"), "empty cells: {first}");
        assert_eq!(files_in(dir.path()), 3, "no temporary file left");
    }

    #[test]
    fn a_resumed_file_keeps_its_columns_and_grows_on() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ReportWriter::create(dir.path()).unwrap();
        let first = [row("t0", 1, &[("lr", 0.1)]), row("t0", 2, &[("b", 2.0)])];
        first.iter().for_each(|r| w.progress(r).unwrap());
        drop(w);
        let mut w = ReportWriter::append(dir.path()).unwrap();
        let more = [
            row("t1", 1, &[("b", 3.0), ("lr", 0.2)]),
            row("t1", 2, &[("a", 1.0)]),
        ];
        more.iter().for_each(|r| w.progress(r).unwrap());
        drop(w);
        let plain = PLAIN.trim_end_matches(",check");
        assert_eq!(header(dir.path()), format!("{plain},lr,b,a,check"));
        let all: Vec<ProgressRow> = first.iter().chain(&more).cloned().collect();
        same(&read_progress(dir.path()).unwrap(), &all);
        // Replacing the file whole keeps the columns where they were.
        write_rows(&dir.path().join(PROGRESS_CSV), &all[1..]).unwrap();
        assert_eq!(header(dir.path()), format!("{plain},lr,b,a,check"));
        same(&read_progress(dir.path()).unwrap(), &all[1..]);
    }

    #[test]
    fn keys_past_the_cap_or_with_unsafe_names_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<String> = (0..MAX_EXTRA + 8).map(|i| format!("k{i:02}")).collect();
        let mut many: Vec<(&str, f64)> = names.iter().map(|n| (n.as_str(), 1.0)).collect();
        many.extend([("wall_s", 9.0), ("Check", 9.0), ("a,b", 9.0), ("x y", 9.0)]);
        let mut w = ReportWriter::create(dir.path()).unwrap();
        w.progress(&row("t0", 1, &many)).unwrap();
        w.progress(&row("t0", 2, &[("zz", 1.0), ("k00", 2.0)]))
            .unwrap();
        drop(w);
        let h = header(dir.path());
        let cols: Vec<&str> = h.split(',').collect();
        assert_eq!(cols.len(), PLAIN.split(',').count() + MAX_EXTRA, "{h}");
        assert_eq!(cols[10..10 + MAX_EXTRA], names[..MAX_EXTRA]);
        let back = read_progress(dir.path()).unwrap();
        assert_eq!(back[0].extra.len(), MAX_EXTRA);
        assert_eq!(
            back[0].wall_s, 1.5,
            "a key named like a column changes nothing"
        );
        let second: Vec<(&str, f64)> = back[1].extra.iter().map(|(k, v)| (&**k, *v)).collect();
        assert_eq!(second, [("k00", 2.0)]);
    }

    #[test]
    fn a_damaged_file_is_refused_not_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ReportWriter::create(dir.path()).unwrap();
        w.progress(&row("t0", 1, &[])).unwrap();
        w.progress(&row("t0", 2, &[])).unwrap();
        let path = dir.path().join(PROGRESS_CSV);
        let text = fs::read_to_string(&path).unwrap();
        let bad = text.replacen(",0.25,", ",0.75,", 1);
        fs::write(&path, &bad).unwrap();
        let err = w.progress(&row("t0", 3, &[("lr", 0.1)])).unwrap_err();
        assert!(matches!(err, ReportError::Damaged { line: 2, .. }), "{err}");
        assert_eq!(fs::read_to_string(&path).unwrap(), bad);
        assert_eq!(files_in(dir.path()), 3, "no temporary file left");
    }

    #[test]
    fn the_reader_takes_extra_columns_and_refuses_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PROGRESS_CSV);
        let plain = PLAIN.trim_end_matches(",check");
        let cells = "0,t0,shared,2,1,0.5,0.25,NaN,0.1,1.5";
        fs::write(&path, format!("{plain},lr,gn\n{cells},0.5,\n")).unwrap();
        let back = read_progress(dir.path()).unwrap();
        assert_eq!(
            back[0].extra.iter().collect::<Vec<_>>(),
            [(&"lr".to_string(), &0.5)]
        );
        for (head, cell, word) in [
            ("lr", "x", "`lr` is no number"),
            ("a b", "1", "`a b`"),
            ("wall_s", "1", "`wall_s` twice"),
        ] {
            fs::write(&path, format!("{plain},{head}\n{cells},{cell}\n")).unwrap();
            let err = read_progress(dir.path()).unwrap_err().to_string();
            assert!(err.contains(word), "{err}");
        }
        // Appending to a file whose extra columns are not safe names is refused.
        fs::write(&path, format!("{plain},a b,check\n")).unwrap();
        let err = ReportWriter::append(dir.path()).err().unwrap().to_string();
        assert!(err.contains("cannot append"), "{err}");
    }

    #[test]
    fn merging_folders_gives_the_union_of_their_columns() {
        let root = tempfile::tempdir().unwrap();
        let shard = |name: &str, rows: &[ProgressRow]| {
            let dir = root.path().join(name);
            let mut w = ReportWriter::create(&dir).unwrap();
            rows.iter().for_each(|r| w.progress(r).unwrap());
            dir
        };
        let a = [row("t0", 1, &[("lr", 0.1)])];
        let b = [row("t1", 1, &[("gn", 2.0)]), row("t1", 2, &[])];
        let dirs = [shard("a", &a), shard("b", &b)];
        let out = root.path().join("out");
        merge_files(&dirs, &out, &Interrupt::Never).unwrap();
        let plain = PLAIN.trim_end_matches(",check");
        assert_eq!(header(&out), format!("{plain},lr,gn,check"));
        let all: Vec<ProgressRow> = a.iter().chain(&b).cloned().collect();
        same(&read_progress(&out).unwrap(), &all);
    }

    fn fixed() -> ::csv::ByteRecord {
        ::csv::ByteRecord::from(vec!["epoch", "train_loss", "wall_s"])
    }

    #[test]
    fn safe_names_are_columns_and_others_are_refused() {
        for ok in ["lr", "grad_norm", "train/loss", "top-5.acc", "_x", "Lr2"] {
            assert_eq!(refusal(ok, fixed().iter()), None, "{ok}");
        }
        let long = "a".repeat(MAX_NAME + 1);
        for bad in [
            "", "1lr", "a,b", "a\"b", "a b", "a\nb", "ü", "wall_s", "Epoch", "check", "CHECK",
            &long,
        ] {
            assert!(refusal(bad, fixed().iter()).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn columns_join_in_order_of_first_appearance_up_to_the_cap() {
        let path = Path::new("progress.csv");
        let map = |keys: &[&str]| -> BTreeMap<String, f64> {
            keys.iter().map(|k| (k.to_string(), 1.0)).collect()
        };
        let mut dropped = Dropped::default();
        let rows = [map(&["lr"]), map(&["a", "lr", "wall_s"]), map(&["b"])];
        let got = widened(path, &["z".into()], &rows, &fixed(), &mut dropped);
        assert_eq!(got, ["z", "lr", "a", "b"]);
        assert!(dropped.has("wall_s"));
        let many: Vec<String> = (0..MAX_EXTRA + 5).map(|i| format!("k{i:02}")).collect();
        let big = map(&many.iter().map(String::as_str).collect::<Vec<_>>());
        let got = widened(path, &got, [&big], &fixed(), &mut dropped);
        assert_eq!(got.len(), MAX_EXTRA);
        assert_eq!(&got[4..], &many[..MAX_EXTRA - 4]);
        assert!(dropped.has(&many[MAX_EXTRA - 4]));
    }
}
