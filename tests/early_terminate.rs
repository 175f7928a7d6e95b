//! Early termination (`early_terminate: hyperband`) in real sweeps: built-in trials pruned at rungs, an external command ended when pruned, and a sweep killed with SIGKILL then resumed.

mod support;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;
use support::*;

/// Sixteen trials of a small MLP on synthetic data, two at a time on the CPU, 4 epochs, rungs
/// at epochs 1 and 2 (eta 2).
fn hb16(split: &str, concurrency: u32) -> JobYaml {
    JobYaml::new()
        .name("hb16")
        .model(mlp(&[32]))
        .data(synthetic(1024, 256))
        .train(epochs(4, 32))
        .run_cap(16)
        .param(
            "lr",
            "{min: 0.00001, max: 0.05, distribution: log_uniform_values}",
        )
        .concurrency(concurrency)
        .split(split)
        .backend("cpu")
        .set("early_terminate", "{type: hyperband, min_iter: 1, eta: 2}")
}

/// Each trial's epochs in `progress.csv`.
fn progress_epochs(out: &std::path::Path) -> BTreeMap<String, Vec<u32>> {
    let mut by: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for r in progress_csv(out) {
        by.entry(r["trial_id"].clone())
            .or_default()
            .push(r["epoch"].parse().unwrap());
    }
    by
}

#[test]
fn a_hyperband_sweep_prunes_some_trials_at_rungs_and_completes_the_rest() {
    for (split, n) in [("logical", 2), ("fused", 4), ("process", 2)] {
        let dir = sandbox();
        let job = dir.job("hb16.yaml", hb16(split, n));
        let out = dir.join("out");
        let o = dir.run_into("sweep", &job, &out, &["--dry-run"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(
            stdout(&o).contains("early_terminate hyperband: rungs at epochs 1, 2 (eta 2)"),
            "{}",
            stdout(&o)
        );
        let o = dir.run_into("sweep", &job, &out, &[]);
        assert_eq!(o.status.code(), Some(0), "{split}: {}", stderr(&o));
        let rows = trials_csv(&out);
        assert_eq!(rows.len(), 16, "{rows:?}");
        let pruned: Vec<&Row> = rows.iter().filter(|r| r["state"] == "PRUNED").collect();
        let complete = rows.iter().filter(|r| r["state"] == "COMPLETE").count();
        assert!(!pruned.is_empty() && complete > 0, "{split}: {rows:?}");
        assert_eq!(pruned.len() + complete, 16, "{split}: {rows:?}");
        let epochs = progress_epochs(&out);
        for r in &pruned {
            // Stopped at a rung, with what it reached there; its progress ends there.
            assert!(["1", "2"].contains(&r["epochs"].as_str()), "{r:?}");
            assert!(r["metric"].parse::<f64>().is_ok(), "{r:?}");
            let e: u32 = r["epochs"].parse().unwrap();
            assert_eq!(epochs[&r["trial_id"]], (1..=e).collect::<Vec<_>>(), "{r:?}");
        }
        let text = stdout(&o);
        assert!(text.contains(&format!("{} PRUNED", pruned.len())), "{text}");
        assert!(text.contains("early termination: "), "{text}");
        // The best trial is a COMPLETE one.
        let best: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(out.join("best.yaml")).unwrap()).unwrap();
        let id = best["trial_id"].as_str().unwrap();
        assert!(
            rows.iter()
                .any(|r| r["trial_id"] == id && r["state"] == "COMPLETE"),
            "{best:?}"
        );
    }
}

#[test]
fn a_pruned_external_command_is_ended_and_recorded_pruned() {
    let dir = sandbox();
    let fake = root().join("examples").join("fake_train.py");
    dir.script(
        "train.sh",
        &format!(
            "echo $$ > \"$2/pid\"\nexec python3 {} --lr \"$1\" --epochs 6 --sleep 0.3\n",
            fake.display()
        ),
    );
    let lrs = ["0.003", "0.3", "0.00001", "1.0", "0.001", "0.0000001"];
    let job = dir.job(
        "ext.yaml",
        JobYaml::new()
            .name("ext")
            .command("./train.sh {lr} {out_dir}")
            .method("grid")
            .param("lr", values(&lrs))
            .concurrency(2)
            .set(
                "early_terminate",
                "{type: hyperband, min_iter: 1, eta: 2, max_iter: 6}",
            ),
    );
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = trials_csv(&out);
    assert_eq!(rows.len(), 6, "{rows:?}");
    let pruned: Vec<&Row> = rows.iter().filter(|r| r["state"] == "PRUNED").collect();
    assert!(!pruned.is_empty(), "{rows:?}");
    let epochs = progress_epochs(&out);
    for r in &pruned {
        assert!(["1", "2", "4"].contains(&r["epochs"].as_str()), "{r:?}");
        let e: u32 = r["epochs"].parse().unwrap();
        assert_eq!(epochs[&r["trial_id"]], (1..=e).collect::<Vec<_>>(), "{r:?}");
        let folder = out.join("trials").join(&r["trial_id"]);
        let pid: u32 = std::fs::read_to_string(folder.join("pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(gone_within(pid, Duration::from_secs(5)), "{r:?}: pid {pid}");
    }
    for r in rows.iter().filter(|r| r["state"] == "COMPLETE") {
        assert_eq!(r["epochs"], "6", "{r:?}");
    }
}

#[test]
fn a_hyperband_sweep_killed_with_sigkill_resumes_without_running_a_done_trial_again() {
    let dir = sandbox();
    let job = dir.job(
        "hb30.yaml",
        hb16("logical", 2)
            .name("hb30")
            .run_cap(30)
            .train(epochs(4, 32)),
    );
    let job = s(&job);
    let out = dir.join("out");
    let mut child = dir.spawn(&["sweep", job, "--out", s(&out)]);
    let csv = out.join("trials.csv");
    let reached = wait_for(&mut child, Duration::from_secs(120), || rows_in(&csv) >= 8);
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    assert!(reached, "the sweep ended before 8 rows");
    let before = states(&out);
    assert!(before.len() < 30, "killed mid-way: {before:?}");
    let done: HashSet<String> = before
        .iter()
        .filter(|(_, s)| s == "COMPLETE" || s == "PRUNED")
        .map(|(id, _)| id.clone())
        .collect();
    let o = dir.gpumux(&["sweep", job, "--out", s(&out), "--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("{} already COMPLETE or PRUNED", done.len())),
        "{}",
        stdout(&o)
    );
    let after = states(&out);
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (id, state) in &after {
        assert!(state == "COMPLETE" || state == "PRUNED", "{after:?}");
        *seen.entry(id).or_default() += 1;
    }
    assert_eq!(seen.len(), 30, "{after:?}");
    // A trial done before the kill is not run again.
    for id in &done {
        assert_eq!(seen[id.as_str()], 1, "{id} ran again: {after:?}");
    }
    assert!(after.iter().any(|(_, s)| s == "PRUNED"), "{after:?}");
}

#[test]
fn early_terminate_is_checked_with_its_line() {
    let dir = sandbox();
    for (spec, key, says) in [
        (
            "{type: median, eta: 3}",
            "early_terminate.type",
            "must be hyperband",
        ),
        (
            "{type: hyperband, eta: 1}",
            "early_terminate.eta",
            "at least 2",
        ),
        (
            "{type: hyperband, min_iter: 0}",
            "early_terminate.min_iter",
            "at least 1",
        ),
        (
            "{type: hyperband, min_iter: 3, max_iter: 2}",
            "early_terminate.max_iter",
            "must be at least min_iter",
        ),
    ] {
        let job = dir.job("bad.yaml", hb16("logical", 2).set("early_terminate", spec));
        let o = dir.run_into("sweep", &job, &dir.join("out"), &["--dry-run"]);
        assert_eq!(o.status.code(), Some(2), "{spec}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(key) && e.contains(says), "{spec}: {e}");
    }
}
