//! The plain-text summary of a run: the rounds table, the fastest N per split, the best trial and the parity check.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::{split_rank, Ranked, RunRow, TrialRow};

/// What a series of rounds has in common: what was trained, where, and under which split mode.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct GroupKey<'a> {
    model: &'a str,
    dataset: &'a str,
    device: &'a str,
    split: (usize, &'a str),
}

impl<'a> GroupKey<'a> {
    fn of(row: &'a RunRow) -> Self {
        GroupKey {
            model: &row.model,
            dataset: &row.dataset,
            device: &row.device,
            split: split_rank(&row.split),
        }
    }
}

/// The rows in report order: model/dataset, device, split, N (stable within equal keys).
fn sorted(runs: &[RunRow]) -> Vec<&RunRow> {
    let mut rows: Vec<&RunRow> = runs.iter().collect();
    rows.sort_by(|a, b| GroupKey::of(a).cmp(&GroupKey::of(b)).then(a.n.cmp(&b.n)));
    rows
}

/// A round whose time per training can be compared: some trial completed and the time is sane.
fn usable(row: &RunRow) -> bool {
    row.ok > 0 && row.time_per_training_s.is_finite() && row.time_per_training_s > 0.0
}

/// The time per training at the smallest usable N of each group: the speedup's reference.
fn baselines<'a>(rows: &[&'a RunRow]) -> BTreeMap<GroupKey<'a>, f64> {
    let mut base = BTreeMap::new();
    for row in rows.iter().filter(|r| usable(r)) {
        base.entry(GroupKey::of(row))
            .or_insert(row.time_per_training_s);
    }
    base
}

fn opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

fn varies<T: PartialEq>(runs: &[RunRow], field: impl Fn(&RunRow) -> T) -> bool {
    runs.split_first()
        .is_some_and(|(first, rest)| rest.iter().any(|r| field(r) != field(first)))
}

/// Renders one cell from its round and the round's speedup.
type Cell = Box<dyn Fn(&RunRow, Option<f64>) -> String>;

/// One column of a text table.
struct Column {
    title: &'static str,
    right: bool,
    cell: Cell,
}

fn column(
    title: &'static str,
    right: bool,
    cell: impl Fn(&RunRow, Option<f64>) -> String + 'static,
) -> Column {
    Column {
        title,
        right,
        cell: Box::new(cell),
    }
}

fn columns(runs: &[RunRow]) -> Vec<Column> {
    let mut cols = vec![column("model", false, |r, _| {
        format!("{}/{}", r.model, r.dataset)
    })];
    if varies(runs, |r| r.device.clone()) {
        cols.push(column("device", false, |r, _| r.device.clone()));
    }
    cols.extend([
        column("split", false, |r, _| r.split.clone()),
        column("N", true, |r, _| r.n.to_string()),
        column("makespan_s", true, |r, _| format!("{:.2}", r.makespan_s)),
        column("time/training_s", true, |r, _| {
            format!("{:.3}", r.time_per_training_s)
        }),
        column("speedup", true, |_, s| opt(s, 2)),
        column("samples/s", true, |r, _| format!("{:.1}", r.samples_per_s)),
        column("ok/failed", true, |r, _| format!("{}/{}", r.ok, r.failed)),
        column("mem cap MiB", true, |r, _| {
            // Caps under 10 MiB (tests, small models) keep a decimal so that they do not read 0.
            let decimals = if r.mem_cap_mib.is_some_and(|c| c < 10.0) {
                1
            } else {
                0
            };
            opt(r.mem_cap_mib, decimals)
        }),
    ]);
    if runs.iter().any(|r| r.gpu_util_mean.is_some()) {
        cols.push(column("gpu util %", true, |r, _| opt(r.gpu_util_mean, 1)));
    }
    if runs.iter().any(|r| r.gpu_mem_peak_mib.is_some()) {
        cols.push(column("gpu mem MiB", true, |r, _| {
            opt(r.gpu_mem_peak_mib, 0)
        }));
    }
    if runs.iter().any(|r| r.power_w_mean.is_some()) {
        cols.push(column("power W", true, |r, _| opt(r.power_w_mean, 0)));
    }
    if runs.iter().any(|r| r.sm_clock_mhz_mean.is_some()) {
        cols.push(column("SM MHz", true, |r, _| opt(r.sm_clock_mhz_mean, 0)));
    }
    cols
}

/// Lays out cells in aligned columns separated by two spaces.
fn render(titles: Vec<String>, right: &[bool], body: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = titles.iter().map(|t| t.chars().count()).collect();
    for row in &body {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .zip(widths.iter().zip(right))
            .map(|(c, (w, r))| {
                if *r {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        parts.join("  ").trim_end().to_string() + "\n"
    };
    std::iter::once(&titles)
        .chain(&body)
        .map(|r| line(r))
        .collect()
}

/// The rounds as an aligned text table, grouped by model/dataset, then split mode, then N.
/// `speedup` is the time per training at the split's smallest N divided by the row's.
pub fn summary_table(runs: &[RunRow]) -> String {
    if runs.is_empty() {
        return "no rounds\n".into();
    }
    let rows = sorted(runs);
    let base = baselines(&rows);
    let cols = columns(runs);
    let body = rows
        .iter()
        .map(|row| {
            let speedup = base
                .get(&GroupKey::of(row))
                .filter(|_| usable(row))
                .map(|b| b / row.time_per_training_s);
            cols.iter().map(|c| (c.cell)(row, speedup)).collect()
        })
        .collect();
    let titles = cols.iter().map(|c| c.title.to_string()).collect();
    let right: Vec<bool> = cols.iter().map(|c| c.right).collect();
    render(titles, &right, body)
}

fn loss_key(trial: &TrialRow) -> f64 {
    trial
        .final_loss
        .filter(|l| !l.is_nan())
        .unwrap_or(f64::INFINITY)
}

/// A trial that can be ranked and compared: COMPLETE with finite results (NaN or infinite
/// values count as failed), and a test accuracy.
fn has_result(trial: &TrialRow) -> bool {
    trial.ranks() && trial.test_acc.is_some()
}

/// Orders trials best first: higher test accuracy, then lower final loss, then trial id.
fn best_first(a: &TrialRow, b: &TrialRow) -> Ordering {
    let acc = |t: &TrialRow| t.test_acc.unwrap_or(f64::NEG_INFINITY);
    acc(b)
        .total_cmp(&acc(a))
        .then(loss_key(a).total_cmp(&loss_key(b)))
        .then_with(|| a.trial_id.cmp(&b.trial_id))
}

/// The complete trial with the highest test accuracy (ties: lower final loss, then lower trial id).
pub fn best_trial(trials: &[TrialRow]) -> Option<&TrialRow> {
    trials
        .iter()
        .filter(|t| has_result(t))
        .min_by(|a, b| best_first(a, b))
}

/// The best trial in two lines: its result and where it ran, then its hyperparameters.
pub fn format_best(trial: &TrialRow) -> String {
    format!(
        "best trial {}: test_acc {}, final_loss {} (split {}, N {}, round {}, slice {})\n  \
         lr {}, batch_size {}, optimizer {}, momentum {}, weight_decay {}, dropout {}, seed {}, epochs {}",
        trial.trial_id,
        opt(trial.test_acc, 4),
        opt(trial.final_loss, 4),
        trial.split,
        trial.n,
        trial.round,
        trial.slice,
        trial.params_lr,
        trial.params_batch_size,
        trial.params_optimizer,
        trial.params_momentum,
        trial.params_weight_decay,
        trial.params_dropout,
        trial.seed,
        trial.epochs,
    )
}

/// One trial that completed under more than one split mode.
#[derive(Clone, Debug, PartialEq)]
pub struct ParityLine {
    pub trial_id: String,
    /// The split modes it completed under, in report order.
    pub splits: Vec<String>,
    /// The largest |test_acc difference| between two of its results under different split modes.
    pub max_abs_diff: f64,
}

fn max_cross_diff(results: &[(&str, f64)]) -> f64 {
    let mut max = 0.0f64;
    for (i, (split_a, a)) in results.iter().enumerate() {
        for (split_b, b) in &results[i + 1..] {
            if split_a != split_b {
                max = max.max((a - b).abs());
            }
        }
    }
    max
}

/// For each trial that completed under several split modes, how far its test accuracies differ:
/// a trial's result should not depend on how the GPU was split.
pub fn parity(trials: &[TrialRow]) -> Vec<ParityLine> {
    let mut by_id: BTreeMap<&str, Vec<(&str, f64)>> = BTreeMap::new();
    for t in trials.iter().filter(|t| has_result(t)) {
        let acc = t.test_acc.unwrap_or(f64::NAN);
        by_id.entry(&t.trial_id).or_default().push((&t.split, acc));
    }
    by_id
        .into_iter()
        .filter_map(|(id, results)| {
            let mut splits: Vec<&str> = results.iter().map(|(s, _)| *s).collect();
            splits.sort_by_key(|s| split_rank(s));
            splits.dedup();
            (splits.len() > 1).then(|| ParityLine {
                trial_id: id.to_string(),
                splits: splits.into_iter().map(String::from).collect(),
                max_abs_diff: max_cross_diff(&results),
            })
        })
        .collect()
}

fn format_diff(d: f64) -> String {
    if d == 0.0 {
        "0".into()
    } else if d >= 1e-3 {
        format!("{d:.4}")
    } else {
        format!("{d:.2e}")
    }
}

/// The parity check in one line, naming the trial with the largest difference if any.
pub fn format_parity(lines: &[ParityLine]) -> String {
    let Some(worst) = lines
        .iter()
        .max_by(|a, b| a.max_abs_diff.total_cmp(&b.max_abs_diff))
    else {
        return "same trial across split modes: no trial completed under more than one split mode"
            .into();
    };
    let mut text = format!(
        "same trial across split modes: {} trials compared, max |Δ test_acc| = {}",
        lines.len(),
        format_diff(worst.max_abs_diff)
    );
    if worst.max_abs_diff != 0.0 {
        text += &format!(" (trial {}: {})", worst.trial_id, worst.splits.join(", "));
    }
    text
}

/// The N with the lowest time per training for one split mode.
#[derive(Clone, Debug, PartialEq)]
pub struct BestN {
    pub model: String,
    pub dataset: String,
    pub device: String,
    pub split: String,
    pub n: u32,
    pub time_per_training_s: f64,
}

/// For each split mode (and model/dataset/device), the N with the lowest time per training;
/// rounds without a completed trial do not count, and ties go to the smaller N.
pub fn best_n(runs: &[RunRow]) -> Vec<BestN> {
    let mut best: BTreeMap<GroupKey, &RunRow> = BTreeMap::new();
    for row in sorted(runs).into_iter().filter(|r| usable(r)) {
        let entry = best.entry(GroupKey::of(row)).or_insert(row);
        if row.time_per_training_s < entry.time_per_training_s {
            *entry = row;
        }
    }
    best.into_values()
        .map(|r| BestN {
            model: r.model.clone(),
            dataset: r.dataset.clone(),
            device: r.device.clone(),
            split: r.split.clone(),
            n: r.n,
            time_per_training_s: r.time_per_training_s,
        })
        .collect()
}

/// The fastest N per split mode, one line each.
pub fn format_best_n(best: &[BestN]) -> String {
    let mixed = best.split_first().is_some_and(|(f, rest)| {
        rest.iter()
            .any(|b| (&b.model, &b.dataset) != (&f.model, &f.dataset))
    });
    let mut text = String::from("lowest time per training:\n");
    if best.is_empty() {
        text += "  none: no round completed a trial\n";
    }
    for b in best {
        let what = if mixed {
            format!("{}/{} ", b.model, b.dataset)
        } else {
            String::new()
        };
        text += &format!(
            "  {what}{}: N = {} ({:.3} s per training)\n",
            b.split, b.n, b.time_per_training_s
        );
    }
    text
}

/// Everything above in one text: the table, the fastest N per split, the best trial, the parity line.
pub fn summary_text(runs: &[RunRow], trials: &[TrialRow]) -> String {
    let mut text = summary_table(runs);
    text += "\n";
    text += &format_best_n(&best_n(runs));
    text += "\n";
    if let Some(best) = best_trial(trials) {
        text += &format_best(best);
        text += "\n\n";
    }
    text += &format_parity(&parity(trials));
    text += "\n";
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{run_row, trial_row};

    fn runs() -> Vec<RunRow> {
        vec![
            run_row("process", 2, 4.0),
            run_row("shared", 2, 5.0),
            run_row("shared", 1, 8.0),
            run_row("process", 1, 10.0),
            run_row("process", 3, 2.5),
        ]
    }

    #[test]
    fn table_is_grouped_and_has_speedups() {
        let table = summary_table(&runs());
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("model") && lines[0].contains("time/training_s"));
        let split_n: Vec<(&str, &str)> = lines[1..]
            .iter()
            .map(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                (cells[1], cells[2])
            })
            .collect();
        assert_eq!(
            split_n,
            vec![
                ("shared", "1"),
                ("shared", "2"),
                ("process", "1"),
                ("process", "2"),
                ("process", "3")
            ]
        );
        // shared N=2: 8.0 / 5.0; process N=3: 10.0 / 2.5; makespan 3 × 2.5.
        assert!(
            lines[2].contains("5.000") && lines[2].contains("1.60"),
            "{}",
            lines[2]
        );
        assert!(
            lines[5].contains("7.50") && lines[5].contains("4.00"),
            "{}",
            lines[5]
        );
        assert!(!lines[0].contains("gpu util"));
    }

    #[test]
    fn table_aligns_columns_and_shows_gpu_columns_when_present() {
        let mut rows = runs();
        rows[0].gpu_util_mean = Some(88.25);
        rows[0].mem_cap_mib = Some(4096.0);
        let table = summary_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains("gpu util %") && !lines[0].contains("power W"));
        assert!(!lines[0].contains("SM MHz"));
        assert!(table.contains("88.2") || table.contains("88.3"));
        assert!(table.contains("4096"));
        let end = |l: &str| {
            l.find("time/training_s")
                .map(|i| i + "time/training_s".len())
        };
        let col_end = end(lines[0]).unwrap();
        for line in &lines[1..] {
            assert!(line.as_bytes()[col_end - 1].is_ascii_digit(), "{line}");
        }
    }

    #[test]
    fn sm_clock_column_follows_power_when_present() {
        let mut rows = runs();
        rows[1].power_w_mean = Some(350.0);
        rows[1].sm_clock_mhz_mean = Some(1_754.6);
        let table = summary_table(&rows);
        let header = table.lines().next().unwrap();
        let (power, clock) = (header.find("power W"), header.find("SM MHz"));
        assert!(power.is_some() && clock > power, "{header}");
        assert!(header.trim_end().ends_with("SM MHz"), "{header}");
        let row = table.lines().find(|l| l.contains("350")).unwrap();
        assert!(row.trim_end().ends_with("1755"), "{row}");
    }

    #[test]
    fn failed_rounds_get_no_speedup() {
        let mut rows = runs();
        rows[2].ok = 0;
        let table = summary_table(&rows);
        // Without shared N=1, shared N=2 is its own reference.
        let shared2 = table
            .lines()
            .find(|l| l.contains("shared") && l.contains("5.000"));
        assert!(shared2.unwrap().contains("1.00"), "{table}");
        let shared1 = table
            .lines()
            .find(|l| l.contains("shared") && l.contains("8.000"));
        assert!(shared1.unwrap().contains(" - "), "{table}");
    }

    #[test]
    fn best_trial_prefers_accuracy_then_loss_then_id() {
        let trials = vec![
            trial_row("t5", "shared", Some(0.9), Some(0.3)),
            trial_row("t4", "shared", None, None),
            trial_row("t3", "shared", Some(0.9), Some(0.2)),
            trial_row("t2", "shared", Some(0.9), Some(0.2)),
            trial_row("t1", "shared", Some(0.8), Some(0.1)),
        ];
        assert_eq!(best_trial(&trials).unwrap().trial_id, "t2");
        let mut failed_high = trial_row("t0", "shared", Some(0.99), Some(0.0));
        failed_high.state = "FAIL".into();
        let mut with_failure = trials.clone();
        with_failure.push(failed_high);
        assert_eq!(best_trial(&with_failure).unwrap().trial_id, "t2");
        assert!(best_trial(&trials[1..2]).is_none());
        let text = format_best(best_trial(&trials).unwrap());
        assert!(text.contains("t2") && text.contains("lr 0.01") && text.contains("batch_size 64"));
    }

    #[test]
    fn parity_finds_a_difference_across_splits() {
        let trials = vec![
            trial_row("a", "shared", Some(0.9), None),
            trial_row("a", "green", Some(0.875), None),
            trial_row("b", "shared", Some(0.5), None),
            trial_row("b", "mps", Some(0.5), None),
            trial_row("c", "shared", Some(0.5), None),
            trial_row("c", "shared", Some(0.1), None),
            trial_row("d", "mps", None, None),
            trial_row("d", "shared", Some(0.2), None),
        ];
        let lines = parity(&trials);
        let ids: Vec<&str> = lines.iter().map(|l| l.trial_id.as_str()).collect();
        assert_eq!(ids, vec!["a", "b"]);
        assert!((lines[0].max_abs_diff - 0.025).abs() < 1e-12);
        assert_eq!(lines[0].splits, vec!["shared", "green"]);
        assert_eq!(lines[1].max_abs_diff, 0.0);
        let text = format_parity(&lines);
        assert!(
            text.contains("2 trials compared") && text.contains("0.0250"),
            "{text}"
        );
        assert!(format_parity(&lines[1..]).ends_with("max |Δ test_acc| = 0"));
    }

    #[test]
    fn best_n_per_split() {
        let best = best_n(&runs());
        let got: Vec<(&str, u32)> = best.iter().map(|b| (b.split.as_str(), b.n)).collect();
        assert_eq!(got, vec![("shared", 2), ("process", 3)]);
        let text = summary_text(&runs(), &[trial_row("t1", "shared", Some(0.5), None)]);
        assert!(
            text.contains("process: N = 3 (2.500 s per training)"),
            "{text}"
        );
        assert!(text.contains("best trial t1") && text.contains("same trial across split modes"));
    }
}
