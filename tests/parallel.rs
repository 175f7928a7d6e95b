//! `gpumux parallel`, `gpumux batch-scan` and unequal slice plans through the real binary (the data-parallel equality on a GPU is in tests/gpu/training.rs).

mod support;
use support::*;

/// Two epochs of a small MLP on 1200 digits, in logical slices on the CPU.
fn base() -> JobYaml {
    JobYaml::new()
        .model(mlp(&[64]))
        .data("{source: mnist-10k, train_limit: 1200, test_limit: 300}")
        .train("{epochs: 2, batch_size: 100, lr: 0.002}")
        .backend("cpu")
        .split("logical")
}

/// `slice 0 [60] 123 sps · slice 1 [40] 82 sps · total [100] 205 sps`: the shards and the figures.
fn speed_line(out: &str) -> Vec<(String, usize, f64)> {
    let line = out
        .lines()
        .find_map(|l| l.split_once(" samples: ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no speed line in {out}"));
    line.split(" · ")
        .map(|part| {
            let (name, rest) = part.split_once(" [").expect("name [rows]");
            let (rows, rest) = rest.split_once("] ").expect("rows]");
            let sps = rest.strip_suffix(" sps").expect("sps");
            (
                name.to_string(),
                rows.parse().expect("rows"),
                sps.parse().expect("sps"),
            )
        })
        .collect()
}

#[test]
fn a_ratio_split_trains_and_reports_each_slice() {
    let dir = sandbox();
    let job = dir.job(
        "p.yaml",
        base()
            .set("ratios", "[3, 2]")
            .set("parallel", "{ratios: [3, 2]}"),
    );
    let o = dir.gpumux(&["parallel", s(&job), "--out", "o"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let parts = speed_line(&out);
    let names: Vec<&str> = parts.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["slice 0", "slice 1", "total"], "{out}");
    assert_eq!((parts[0].1, parts[1].1, parts[2].1), (60, 40, 100));
    assert!(
        parts[2].2 > 0.0 && (parts[0].2 + parts[1].2 - parts[2].2).abs() <= 1.0,
        "{out}"
    );
    assert!(out.contains("replicas identical: yes"), "{out}");
    // The plan shows the unequal caps: 3:2 of 90 % of the host's memory.
    let caps: Vec<f64> = out
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 4 && (w[0] == "0" || w[0] == "1")).then(|| w[1].parse().ok())?
        })
        .collect();
    assert_eq!(caps.len(), 2, "{out}");
    assert!((caps[0] / caps[1] - 1.5).abs() < 1e-3, "{caps:?}");
    let progress = progress_csv(&dir.join("o"));
    assert_eq!(
        progress.len(),
        2 * 3,
        "two epochs, two slices and a total each"
    );
    assert_eq!(progress[2]["slice"], "total");
    assert_eq!(progress[0]["shard_rows"], "60");
    for col in [
        "round",
        "trial_id",
        "split",
        "n",
        "epoch",
        "train_loss",
        "test_acc",
        "wall_s",
        "samples_per_s",
    ] {
        assert!(progress[0].contains_key(col), "progress.csv lacks {col}");
    }
    let summary = read_csv(&dir.join("o/parallel.csv"));
    assert_eq!(summary.len(), 1);
    assert_eq!(summary[0]["shards"], "60;40");
    assert_eq!(summary[0]["ratios"], "3:2");
    assert_eq!(summary[0]["replica_spread"], "0.0");
    let acc: f64 = summary[0]["test_acc"].parse().expect("test_acc");
    assert!(
        acc > 0.6,
        "test accuracy {acc} after 2 epochs on 1200 digits"
    );
}

#[test]
fn auto_ratios_say_what_they_measured_and_chose() {
    let dir = sandbox();
    let job = dir.job("p.yaml", base());
    let o = dir.gpumux(&[
        "parallel",
        s(&job),
        "--slices",
        "2",
        "--ratios",
        "auto",
        "--epochs",
        "1",
        "--out",
        "o",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("ratios auto: slice 0 alone [50] ") && out.contains(" · slice 1 alone [50] "),
        "{out}"
    );
    assert!(out.contains("ratios auto: chose "), "{out}");
    let rows = read_csv(&dir.join("o/ratios.csv"));
    assert_eq!(rows.len(), 2);
    let shards: usize = rows
        .iter()
        .map(|r| r["shard_rows"].parse::<usize>().expect("rows"))
        .sum();
    assert_eq!(shards, 100, "the shards make up the global batch");
    let ratio: f64 = rows
        .iter()
        .map(|r| r["ratio"].parse::<f64>().expect("ratio"))
        .sum();
    assert!((ratio - 1.0).abs() < 1e-9);
}

#[test]
fn one_slice_and_four_slices_reach_the_same_accuracy() {
    // Without dropout, mirrored training is single-slice training on the same global batch.
    let dir = sandbox();
    let job = dir.job("p.yaml", base());
    let mut acc = Vec::new();
    for k in ["1", "4"] {
        let out = format!("o{k}");
        let o = dir.gpumux(&["parallel", s(&job), "--slices", k, "--out", &out]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let row = &read_csv(&dir.join(out).join("parallel.csv"))[0];
        acc.push(row["test_acc"].parse::<f64>().expect("test_acc"));
    }
    // The weights agree to floating-point order (about 1e-7 relative), which could at most tip
    // a test sample whose two top logits tie that closely: allow one of the 300.
    assert!((acc[0] - acc[1]).abs() <= 1.0 / 300.0 + 1e-9, "{acc:?}");
    assert!(acc[0] > 0.6, "{acc:?}");
}

#[test]
fn explicit_slices_on_the_cpu_say_that_sms_do_not_apply() {
    let dir = sandbox();
    let job = dir.job(
        "p.yaml",
        base()
            .slice("{sm: 80, mem_mib: 300}")
            .slice("{sm: 48, mem_mib: 200}"),
    );
    let o = dir.gpumux(&["parallel", s(&job), "--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("the CPU backend has no SMs"), "{out}");
    assert!(out.contains("300.0") && out.contains("200.0"), "{out}");
    assert!(
        out.contains("shards 50;50") && out.contains("dry run"),
        "{out}"
    );
    assert!(!dir.join("out").exists(), "a dry run writes nothing");
    // `splits` is fib's list: a GPU-only mode there does not stop a CPU parallel run.
    let fib_job = dir.job("with-green.yaml", base().splits("[logical, green]"));
    let o = dir.gpumux(&["parallel", s(&fib_job), "--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Green slices need a GPU: a clear error, not a crash.
    let o = dir.gpumux(&["parallel", s(&job), "--split", "green"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("split green needs a GPU"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_shard_too_small_for_a_slice_cap_names_the_slice() {
    let dir = sandbox();
    let job = dir.job(
        "p.yaml",
        base().slice("{mem_mib: 300}").slice("{mem_mib: 0.5}"),
    );
    let o = dir.gpumux(&["parallel", s(&job), "--out", "o"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("slice 1") && err.contains("slice cap 0.5 MiB") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn batch_scan_stops_at_the_cap_with_exit_0() {
    let dir = sandbox();
    let job = dir.job("s.yaml", base());
    let o = dir.gpumux(&[
        "batch-scan",
        s(&job),
        "--mib-per-slice",
        "1.5",
        "--seconds",
        "0.02",
        "--out",
        "s",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let verdict = out
        .lines()
        .find(|l| l.contains(" does not fit: needs "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        verdict.contains("slice cap 1.5 MiB; largest batch that fits: "),
        "{verdict}"
    );
    let rows = read_csv(&dir.join("s/batch_scan.csv"));
    let last = rows.last().expect("rows");
    assert_eq!(last["fits"], "false");
    assert!(last["arena_mib"].parse::<f64>().expect("mib") > 1.5);
    assert!(rows[..rows.len() - 1].iter().all(|r| r["fits"] == "true"
        && r["arena_mib"].parse::<f64>().expect("mib") <= 1.5
        && r["samples_per_s"].parse::<f64>().expect("sps") > 0.0));
    // The largest batch that fits is also timed.
    let largest = verdict.rsplit(": ").next().expect("number").trim();
    assert!(
        rows.iter().any(|r| r["batch"] == largest),
        "{largest} not timed"
    );
    // A first batch that already does not fit is the same clean stop.
    let o = dir.gpumux(&[
        "batch-scan",
        s(&job),
        "--mib-per-slice",
        "0.01",
        "--out",
        "s2",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("batch 1 does not fit") && stdout(&o).contains("no batch fits"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn devices_lists_unequal_slices() {
    let o = gpumux(
        &root(),
        &["devices", "--ratios", "5,3", "--mib-per-slice", "1000"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("2 unequal slices (ratios 5:3)"), "{out}");
    assert!(out.contains("1250.0") && out.contains("750.0"), "{out}");
}
