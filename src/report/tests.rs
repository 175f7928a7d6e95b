//! Tests of the results files: what is written is read back, cut and damaged files, fsync and failed writes.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

use super::line::*;
use super::read::*;
use super::write::*;
use super::*;
use crate::error::ReportError;

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

pub(crate) fn trial_row(id: &str, split: &str, acc: Option<f64>, loss: Option<f64>) -> TrialRow {
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
    // Cells dropped, moved, kept where they are, and kept with empty ones after them.
    let plans = [
        vec![],
        vec!["a"],
        vec!["b", "c", "a"],
        vec!["a", "b"],
        vec!["a", "b", "c"],
        vec!["a", "b", "c", "d"],
    ];
    for columns in plans {
        let columns: Vec<String> = columns.into_iter().map(String::from).collect();
        let mut reader = RowReader::<ProgressRow>::open(&path).unwrap();
        let plan = reader.plan(&columns);
        let mut got: Vec<(ProgressRow, Vec<u8>)> = Vec::new();
        while let Some(mut cells) = reader.next_cells().unwrap() {
            let mut line = Vec::new();
            cells.line_into(&plan, &mut line).unwrap();
            got.push((cells.row().unwrap(), line));
        }
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
fn each_trial_column_is_told_its_kind_by_serde() {
    let kinds = cell_kinds::<TrialRow>().unwrap();
    assert_eq!(kinds.len(), columns_of::<TrialRow>().unwrap().len());
    let kind = |name: &str| kinds.iter().find(|(n, _)| n == name.as_bytes()).unwrap().1;
    let number = |float, wide, optional| CellKind::Number {
        float,
        wide,
        optional,
    };
    assert_eq!(kind("trial_id"), CellKind::Text);
    assert_eq!(kind("params"), CellKind::Text);
    assert_eq!(kind("round"), number(false, false, false));
    assert_eq!(kind("seed"), number(false, true, false));
    assert_eq!(kind("params_lr"), number(true, false, false));
    assert_eq!(kind("test_acc"), number(true, false, true));
    assert_eq!(kind("launches_per_step"), number(false, true, true));
    // Every column has a kind told: no trial row needs a whole parse to be checked.
    assert!(kinds.iter().all(|(_, k)| *k != CellKind::Other));
    // What a column takes, and what it does not.
    assert!(kind("round").holds(b"4294967295") && !kind("round").holds(b"4294967296"));
    assert!(kind("seed").holds(b"4294967296") && !kind("seed").holds(b"-1"));
    assert!(kind("test_acc").holds(b"") && !kind("params_lr").holds(b""));
    assert!(kind("params_lr").holds(b"1e-3") && !kind("params_lr").holds(b"1,5"));
    let u64_max = b"18446744073709551615";
    assert!(kind("seed").holds(u64_max) && !kind("seed").holds(b"18446744073709551616"));
    for (cell, holds) in [("-0.5", true), ("1.", true), (".5", true), ("+2", true)] {
        assert_eq!(kind("params_lr").holds(cell.as_bytes()), holds, "{cell}");
    }
    for cell in [".", "-", "1.2.3", "--1", "1-"] {
        assert!(!kind("params_lr").holds(cell.as_bytes()), "{cell}");
    }
}

#[test]
fn briefs_refuse_any_cell_whole_rows_refuse_even_under_a_check_that_matches() {
    let (dir, bytes) = written(&three_rows());
    let path = dir.path().join(TRIALS_CSV);
    let text = String::from_utf8(bytes).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    let at = |name: &str| header.iter().position(|c| *c == name).unwrap();
    for (column, value) in [
        ("round", "x"),
        ("epochs", "-1"),
        ("seed", "1.5"),
        ("n", "4294967296"),
        ("metric", "abc"),
        ("wall_s", ""),
        ("launches_per_step", "2.5"),
    ] {
        // Line 2 (no quoted cell) with one cell changed and its check made to match.
        let mut cells: Vec<String> = text
            .lines()
            .nth(1)
            .unwrap()
            .split(',')
            .map(str::to_owned)
            .collect();
        cells[at(column)] = value.into();
        let body = &cells[..cells.len() - 1];
        let check = check_of(body.iter().map(|c| c.as_bytes()));
        let line = format!("{},{check}\n", body.join(","));
        let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
        lines[1] = &line;
        fs::write(&path, lines.concat()).unwrap();
        let whole = read_rows::<TrialRow>(&path).unwrap_err().to_string();
        let brief = read_trial_briefs(&path).unwrap_err().to_string();
        assert_eq!(brief, whole, "{column} = {value:?}");
    }
}

#[test]
fn briefs_refuse_an_unknown_state_or_an_empty_id_as_whole_rows_do() {
    for (id, state) in [("t9", "DONE"), (" ", "COMPLETE")] {
        let mut rows = three_rows();
        rows[1].trial_id = id.into();
        rows[1].state = state.into();
        let (dir, _) = written(&rows);
        let path = dir.path().join(TRIALS_CSV);
        let whole = read_rows::<TrialRow>(&path).unwrap_err().to_string();
        let brief = read_trial_briefs(&path).unwrap_err().to_string();
        assert_eq!(brief, whole);
        assert!(brief.contains("line 3"), "{brief}");
    }
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
    let (dir, bytes) = written(&three_rows());
    let mut big = bytes[..=bytes.iter().position(|&b| b == b'\n').unwrap()].to_vec();
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

        /// A merge's brief of a row is what the whole row holds, for rows with a check (read
        /// from their cells) and rows without one (parsed whole); the lines are the rows' lines.
        #[test]
        fn briefs_hold_what_the_whole_rows_hold(
            rows in prop::collection::vec(any_row(), 1..6),
            unchecked in any::<prop::sample::Index>(),
        ) {
            let (dir, bytes) = written(&rows);
            let path = dir.path().join(TRIALS_CSV);
            // One row's check emptied: a row added by hand, parsed whole.
            let text = String::from_utf8(bytes).unwrap();
            let mut lines: Vec<String> = text.split_inclusive('\n').map(str::to_owned).collect();
            let k = 1 + unchecked.index(lines.len() - 1);
            if !lines[k].contains('"') {
                let cut = lines[k].trim_end().rfind(',').unwrap();
                lines[k] = format!("{},\n", &lines[k][..cut]);
            }
            fs::write(&path, lines.concat()).unwrap();
            let whole = read_rows_and_lines::<TrialRow>(&path).unwrap();
            let briefs = read_trial_briefs(&path).unwrap();
            prop_assert_eq!(briefs.len(), whole.len());
            for (b, (r, line)) in briefs.iter().zip(&whole) {
                let want = TrialBrief {
                    trial_id: r.trial_id.clone(),
                    state: r.state.clone(),
                    metric: r.metric,
                    test_acc: r.test_acc,
                    final_loss: r.final_loss,
                    params: r.params.clone(),
                    line: line.clone(),
                };
                prop_assert_eq!(b, &want);
            }
        }

        /// A cell a kind holds is one serde parses as that kind, and no other.
        #[test]
        fn a_kind_holds_what_its_type_parses(
            cell in "[-+0-9.eEx]{0,22}",
            float in any::<bool>(),
            wide in any::<bool>(),
            optional in any::<bool>(),
        ) {
            let kind = CellKind::Number { float, wide: wide && !float, optional };
            let parses = match (float, wide) {
                _ if cell.is_empty() => optional,
                (true, _) => cell.parse::<f64>().is_ok(),
                (false, true) => cell.parse::<u64>().is_ok(),
                (false, false) => cell.parse::<u32>().is_ok(),
            };
            prop_assert_eq!(kind.holds(cell.as_bytes()), parses);
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

/// `n` progress rows of one trial, as written.
fn many_progress_rows(path: &Path, n: u32) -> Vec<u8> {
    let rows: Vec<ProgressRow> = (1..=n).map(progress_row).collect();
    write_rows(path, &rows).unwrap();
    fs::read(path).unwrap()
}

/// Files this long are split and checked by helper threads.
const HELPED: usize = 4 << 20;

#[test]
fn damage_far_into_a_file_names_its_line_and_no_row_after_it_is_handed_over() {
    damage_far_into(9_000, 1);
    // A file split and checked by helper threads, the damage in a chunk of its own.
    damage_far_into(60_000, 7);
}

/// [`damage_far_into_a_file_names_its_line_and_no_row_after_it_is_handed_over`] in a file of
/// `n` rows, with the damage placed `scale` times further in.
fn damage_far_into(n: u32, scale: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(PROGRESS_CSV);
    let bytes = many_progress_rows(&path, n);
    assert_eq!(bytes.len() >= HELPED, scale > 1, "{} bytes", bytes.len());
    // The check of row 7,000 (line 7,001) no longer matches: one digit of it changed.
    let starts: Vec<usize> = std::iter::once(0)
        .chain(
            bytes
                .iter()
                .enumerate()
                .filter(|(_, &b)| b == b'\n')
                .map(|(i, _)| i + 1),
        )
        .collect();
    let mut bad = bytes.clone();
    let end = starts[7_001 * scale] - 2;
    bad[end] = if bad[end] == b'0' { b'1' } else { b'0' };
    fs::write(&path, &bad).unwrap();
    let mut reader = RowReader::<ProgressRow>::open(&path).unwrap();
    let mut handed = 0;
    let err = loop {
        match reader.next_cells() {
            Ok(Some(_)) => handed += 1,
            Ok(None) => panic!("the damaged row was not found"),
            Err(e) => break e,
        }
    };
    assert_eq!(handed, 7_001 * scale - 2);
    assert!(
        matches!(err, ReportError::Damaged { line, .. } if line == 7_001 * scale as u64),
        "{err}"
    );
    assert!(reader.next_cells().unwrap().is_none());
    // A NUL byte in a later row, a row with a cell too many, and a quoted row keep their lines.
    let mut nul = bytes.clone();
    nul[starts[8_500 * scale] + 2] = 0;
    fs::write(&path, &nul).unwrap();
    let err = read_progress(dir.path()).unwrap_err();
    assert!(
        matches!(err, ReportError::Damaged { line, .. } if line == 8_500 * scale as u64 + 1),
        "{err}"
    );
    let mut more = bytes[..starts[4_000 * scale]].to_vec();
    more.extend_from_slice(b"1,2,3\n");
    more.extend_from_slice(&bytes[starts[4_000 * scale]..]);
    fs::write(&path, &more).unwrap();
    let err = read_progress(dir.path()).unwrap_err();
    assert!(
        matches!(err, ReportError::Damaged { line, .. } if line == 4_000 * scale as u64 + 1),
        "{err}"
    );
}

#[test]
fn a_reader_left_early_stops_its_finder() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(PROGRESS_CSV);
    // Long enough for helper threads, which stop too.
    assert!(many_progress_rows(&path, 60_000).len() >= HELPED);
    for take in [0, 1, 3_000] {
        let started = std::time::Instant::now();
        let reader = RowReader::<ProgressRow>::open(&path).unwrap();
        assert_eq!(reader.take(take).count(), take);
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
    }
    // Every row is handed over once, in order, across many chunks.
    let epochs: Vec<u32> = read_progress(dir.path())
        .unwrap()
        .iter()
        .map(|r| r.epoch)
        .collect();
    assert_eq!(epochs, (1..=60_000).collect::<Vec<_>>());
}
