//! Early termination (`early_terminate: hyperband`) in real sweeps: built-in trials pruned at rungs, an external command ended when pruned, a metric by its Keras name, a trial's last epoch never a rung, a sweep killed with SIGKILL then resumed, and one resumed without early termination.

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
    let count = |state: &str| before.iter().filter(|(_, s)| s == state).count();
    assert!(
        stdout(&o).contains(&format!(
            "{} already COMPLETE, {} PRUNED",
            count("COMPLETE"),
            count("PRUNED")
        )),
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
        (
            "{type: hyperband, brackets: 0}",
            "early_terminate.brackets",
            "at least 1",
        ),
    ] {
        let job = dir.job("bad.yaml", hb16("logical", 2).set("early_terminate", spec));
        let o = dir.run_into("sweep", &job, &dir.join("out"), &["--dry-run"]);
        assert_eq!(o.status.code(), Some(2), "{spec}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(key) && e.contains(says), "{spec}: {e}");
    }
}

/// A command that prints Keras's names (`val_accuracy`, `loss`) for `epochs` epochs, its
/// accuracy set by its lr (best near 3e-3), one epoch every `sleep` seconds.
fn keras_script(dir: &Sandbox, epochs: u32, sleep: f64) -> std::path::PathBuf {
    let body = r#"#!/usr/bin/env python3
import json, math, sys, time
lr = float(sys.argv[1])
top = max(0.1, 0.97 - 0.08 * (math.log10(lr) - math.log10(3e-3)) ** 2)
for e in range(1, EPOCHS + 1):
    time.sleep(SLEEP)
    print(json.dumps({"epoch": e, "loss": 1.0 / e, "val_accuracy": top * e / EPOCHS}), flush=True)
print(json.dumps({"val_accuracy": top, "loss": 1.0 / EPOCHS}))
"#;
    let body = body
        .replace("EPOCHS", &epochs.to_string())
        .replace("SLEEP", &sleep.to_string());
    dir.script("keras.py", &body)
}

fn keras_job(dir: &Sandbox, epochs: u32, sleep: f64, metric: &str) -> std::path::PathBuf {
    keras_script(dir, epochs, sleep);
    dir.job(
        "keras.yaml",
        JobYaml::new()
            .name("keras")
            .command("python3 ./keras.py {lr}")
            .run_cap(12)
            .param(
                "lr",
                "{min: 0.00001, max: 1.0, distribution: log_uniform_values}",
            )
            .concurrency(2)
            .set("metric", format!("{{name: {metric}, goal: maximize}}"))
            .set(
                "early_terminate",
                "{type: hyperband, min_iter: 1, eta: 2, max_iter: 6}",
            ),
    )
}

#[test]
fn hyperband_prunes_by_a_keras_metric_name_as_by_gpumuxs_own() {
    for metric in ["val_accuracy", "test_acc"] {
        let dir = sandbox();
        let job = keras_job(&dir, 6, 0.05, metric);
        let out = dir.join("out");
        let o = dir.run_into("sweep", &job, &out, &[]);
        assert_eq!(o.status.code(), Some(0), "{metric}: {}", stderr(&o));
        let rows = trials_csv(&out);
        let pruned = rows.iter().filter(|r| r["state"] == "PRUNED").count();
        let complete = rows.iter().filter(|r| r["state"] == "COMPLETE").count();
        assert!(pruned > 0 && complete > 0, "{metric}: {rows:?}");
        assert_eq!(pruned + complete, 12, "{metric}: {rows:?}");
        // Every row carries the metric, and the best is a COMPLETE trial's.
        assert!(
            rows.iter().all(|r| r["metric"].parse::<f64>().is_ok()),
            "{rows:?}"
        );
        assert!(stdout(&o).contains("best trial"), "{}", stdout(&o));
    }
}

#[test]
fn the_last_epoch_a_trial_trains_is_never_a_rung() {
    // A built-in model of 4 epochs under a schedule to 8: the rungs stop below epoch 4.
    let dir = sandbox();
    let job = dir.job(
        "hb.yaml",
        hb16("logical", 2).set(
            "early_terminate",
            "{type: hyperband, min_iter: 1, eta: 2, max_iter: 8}",
        ),
    );
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &["--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("rungs at epochs 1, 2 (eta 2)"),
        "{}",
        stdout(&o)
    );
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for r in trials_csv(&out) {
        let e: u32 = r["epochs"].parse().unwrap();
        match r["state"].as_str() {
            "PRUNED" => assert!(e < 4, "{r:?}"),
            _ => assert_eq!((r["state"].as_str(), e), ("COMPLETE", 4), "{r:?}"),
        }
    }
    // A command that trains 2 epochs where the schedule goes to 6 (rungs 1, 2, 4): its epoch
    // 2 is its last, so it ends COMPLETE there, never PRUNED; the saved epochs count the 2.
    let dir = sandbox();
    let job = keras_job(&dir, 2, 0.3, "val_accuracy");
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = trials_csv(&out);
    for r in &rows {
        match r["state"].as_str() {
            "PRUNED" => assert_eq!(r["epochs"], "1", "{r:?}"),
            "COMPLETE" => assert_eq!(r["epochs"], "2", "{r:?}"),
            other => panic!("{other}: {r:?}"),
        }
    }
    let pruned = rows.iter().filter(|r| r["state"] == "PRUNED").count();
    assert!(pruned > 0, "{rows:?}");
    assert!(
        stdout(&o).contains(&format!(
            "they left {pruned} of the 24 trial-epochs of the trials done untrained"
        )),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_pruned_sweep_resumed_without_early_termination_keeps_its_pruned_trials_apart() {
    let dir = sandbox();
    let job = dir.job("hb.yaml", hb16("logical", 2));
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = trials_csv(&out);
    let count = |state: &str| rows.iter().filter(|r| r["state"] == state).count();
    let (complete, pruned) = (count("COMPLETE"), count("PRUNED"));
    assert!(pruned > 0, "{rows:?}");
    let job = dir.job("hb.yaml", hb16("logical", 2).without("early_terminate"));
    let o = dir.run_into("sweep", &job, &out, &["--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = stdout(&o);
    assert!(
        said.contains(&format!(
            "{complete} already COMPLETE, {pruned} PRUNED, 0 to run"
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "{complete} COMPLETE, 0 FAIL, 0 INTERRUPTED, {pruned} PRUNED"
        )),
        "{said}"
    );
    assert_eq!(trials_csv(&out).len(), 16);
}

#[test]
fn merge_keeps_a_complete_row_over_a_pruned_one_in_either_order() {
    // The same sixteen trials, pruned in one folder and all COMPLETE in the other.
    let dir = sandbox();
    let (pruned_dir, complete_dir) = (dir.join("pruned"), dir.join("complete"));
    let job = dir.job("hb.yaml", hb16("logical", 2));
    let o = dir.run_into("sweep", &job, &pruned_dir, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(states(&pruned_dir).iter().any(|(_, s)| s == "PRUNED"));
    let job = dir.job("hb.yaml", hb16("logical", 2).without("early_terminate"));
    let o = dir.run_into("sweep", &job, &complete_dir, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for (name, first, second) in [
        ("m1", &pruned_dir, &complete_dir),
        ("m2", &complete_dir, &pruned_dir),
    ] {
        let merged = dir.join(name);
        let o = dir.gpumux(&["merge", s(first), s(second), "--out", s(&merged)]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(
            stdout(&o).contains("merged 16 trials: 16 COMPLETE"),
            "{name}: {}",
            stdout(&o)
        );
        // Each kept row's epochs come from its own folder: all four of them.
        let epochs = progress_epochs(&merged);
        assert!(
            epochs.values().all(|e| e == &vec![1, 2, 3, 4]),
            "{name}: {epochs:?}"
        );
    }
}

#[test]
fn hyperband_brackets_judge_their_own_trials_and_the_last_judges_none() {
    let dir = sandbox();
    let spec = "{type: hyperband, min_iter: 1, eta: 2, brackets: 3}";
    let job = dir.job(
        "hb.yaml",
        hb16("logical", 2).run_cap(24).set("early_terminate", spec),
    );
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &["--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = stdout(&o);
    assert!(
        said.contains("3 brackets, each judging its own trials")
            && said.contains("rungs from 1")
            && said.contains("rungs from 2")
            && said.contains("rungs none"),
        "{said}"
    );
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = trials_csv(&out);
    assert_eq!(rows.len(), 24, "{rows:?}");
    // Pruned at the rungs only, and some trials pruned, some not.
    let pruned: Vec<&Row> = rows.iter().filter(|r| r["state"] == "PRUNED").collect();
    assert!(!pruned.is_empty() && pruned.len() < 24, "{rows:?}");
    assert!(pruned
        .iter()
        .all(|r| ["1", "2"].contains(&r["epochs"].as_str())));
}
