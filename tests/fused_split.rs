//! `split: fused` end to end: fib and sweep group compatible trials, every trial gets its rows, and what cannot be fused is refused.

mod support;
use std::collections::BTreeMap;
use support::*;

/// A tiny MLP on synthetic data, one epoch or two, on the CPU.
fn tiny() -> JobYaml {
    JobYaml::new()
        .model(mlp(&[16]))
        .data(synthetic(256, 64))
        .train(epochs(2, 32))
        .seed(3)
        .backend("cpu")
}

#[test]
fn fib_runs_fused_rounds_and_records_them() {
    let dir = sandbox();
    let job = dir.job(
        "fused-fib.yaml",
        tiny()
            .name("fused-fib")
            .param("lr", values(&["0.001", "0.003", "0.01"]))
            .method("grid")
            .n("[1, 3]")
            .splits("[fused]"),
    );
    let out = dir.join("out");
    let o = dir.run_into("fib", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let runs = runs_csv(&out);
    assert_eq!(runs.len(), 2, "{runs:?}");
    for r in &runs {
        assert_eq!(r["split"], "fused", "{r:?}");
        assert_eq!(r["failed"], "0", "{r:?}");
        assert!(
            !r["mem_cap_mib"].is_empty(),
            "fused slices are capped: {r:?}"
        );
    }
    let trials = trials_csv(&out);
    assert_eq!(trials.len(), 4, "1 + 3 trials");
    assert!(
        trials.iter().all(|r| r["state"] == "COMPLETE"),
        "{trials:?}"
    );
    assert!(std::fs::read_to_string(out.join("time_per_training.svg"))
        .unwrap()
        .contains("fused"));
}

#[test]
fn a_fused_sweep_groups_its_trials_and_records_each_ones_epochs() {
    let dir = sandbox();
    let job = dir.job(
        "fused-sweep.yaml",
        tiny()
            .name("fused-sweep")
            .param("lr", values(&["0.001", "0.01"]))
            .param("batch_size", values(&["16", "32"]))
            .method("grid")
            .concurrency(4)
            .split("fused"),
    );
    let dry = dir.gpumux(&["sweep", s(&job), "--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    // Four at a time on the host's cores: each batch size's two trials make groups.
    assert!(
        stdout(&dry).contains("fused: 4 trials in "),
        "{}",
        stdout(&dry)
    );
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let trials = trials_csv(&out);
    assert_eq!(trials.len(), 4, "{trials:?}");
    assert!(
        trials.iter().all(|r| r["state"] == "COMPLETE"),
        "{trials:?}"
    );
    let mut epochs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in progress_csv(&out) {
        epochs
            .entry(r["trial_id"].clone())
            .or_default()
            .push(r["epoch"].clone());
    }
    assert_eq!(epochs.len(), 4, "{epochs:?}");
    assert!(epochs.values().all(|e| e == &["1", "2"]), "{epochs:?}");
    // The same job under --split fused from the command line.
    let flag = dir.job(
        "logical.yaml",
        tiny()
            .name("flag")
            .param("lr", values(&["0.001", "0.01"]))
            .method("grid")
            .concurrency(2),
    );
    let o = dir.run_into("sweep", &flag, &dir.join("flag"), &["--split", "fused"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("split fused"), "{}", stdout(&o));
}

#[test]
fn an_external_command_cannot_be_fused() {
    let dir = sandbox();
    let job = dir.job(
        "cmd.yaml",
        JobYaml::new()
            .command("echo {lr}")
            .param("lr", values(&["0.1", "0.2"]))
            .concurrency(2)
            .split("fused"),
    );
    for more in [&[][..], &["--dry-run"][..]] {
        let mut args = vec!["sweep", s(&job), "--out", "x"];
        args.extend(more);
        let o = dir.gpumux(&args);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("split fused trains built-in models only"),
            "{}",
            stderr(&o)
        );
    }
    // --split fused on a job that says logical is refused alike.
    let job = dir.job(
        "cmd2.yaml",
        JobYaml::new()
            .command("echo {lr}")
            .param("lr", values(&["0.1"]))
            .concurrency(1),
    );
    let o = dir.gpumux(&["sweep", s(&job), "--split", "fused", "--out", "y"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn parallel_trains_one_model_and_refuses_fused() {
    let dir = sandbox();
    let job = dir.job("one.yaml", tiny().name("one").split("fused"));
    let o = dir.gpumux(&["parallel", s(&job), "--out", s(&dir.join("p"))]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("split fused"), "{}", stderr(&o));
}

#[test]
fn fused_runs_beside_other_split_modes_and_its_trials_end_as_they_do_alone() {
    let dir = sandbox();
    let job = dir.job(
        "mixed.yaml",
        tiny()
            .name("mixed")
            .param("lr", values(&["0.001", "0.003", "0.01"]))
            .method("grid")
            .n("[3]")
            .splits("[shared, logical, fused]"),
    );
    let out = dir.join("out");
    let o = dir.run_into("fib", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let splits: Vec<String> = runs_csv(&out).iter().map(|r| r["split"].clone()).collect();
    assert_eq!(splits, ["shared", "logical", "fused"]);
    let trials = trials_csv(&out);
    assert_eq!(trials.len(), 9);
    let acc = |split: &str, id: &str| {
        trials
            .iter()
            .find(|r| r["split"] == split && r["trial_id"] == id)
            .map(|r| r["test_acc"].clone())
    };
    for r in trials.iter().filter(|r| r["split"] == "fused") {
        assert_eq!(r["state"], "COMPLETE", "{r:?}");
        assert_eq!(acc("fused", &r["trial_id"]), acc("shared", &r["trial_id"]));
    }
}

#[test]
fn sigterm_interrupts_every_running_fused_trial_and_exits_3() {
    let dir = sandbox();
    let job = dir.job(
        "fused-long.yaml",
        tiny()
            .name("fused-long")
            .train(epochs(5000, 32))
            .run_cap(4)
            .param("lr", values(&["0.001", "0.002", "0.003", "0.004"]))
            .concurrency(4)
            .split("fused"),
    );
    let out = dir.join("out");
    let mut run = dir
        .run(&["sweep", s(&job), "--out", s(&out), "--grace", "1"])
        .watch();
    // The 4 trials may train as more than one group: wait until each has an epoch behind it.
    assert!(
        run.wait_for(&|_| trials_with_progress(&out.join("progress.csv")) >= 4),
        "not every trial ran an epoch"
    );
    run.signal(libc::SIGTERM);
    let (code, said, err) = run.finish();
    assert_eq!(code, Some(3), "{err}");
    let trials = trials_csv(&out);
    assert_eq!(trials.len(), 4, "every trial was running: {trials:?}");
    assert!(
        trials.iter().all(|t| t["state"] == "INTERRUPTED"),
        "{trials:?}"
    );
    assert!(said.contains("0 COMPLETE, 0 FAIL, 4 INTERRUPTED"), "{said}");
}

#[test]
fn a_diverging_fused_trial_fails_alone_and_the_sweep_exits_1() {
    let dir = sandbox();
    let job = dir.job(
        "fused-nan.yaml",
        tiny()
            .name("fused-nan")
            .run_cap(4)
            .param("lr", values(&["0.001", "1e30", "0.003", "0.01"]))
            .method("grid")
            .concurrency(4)
            .split("fused"),
    );
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let trials = trials_csv(&out);
    assert_eq!(trials.len(), 4, "{trials:?}");
    let failed: Vec<_> = trials.iter().filter(|t| t["state"] == "FAIL").collect();
    assert_eq!(failed.len(), 1, "{trials:?}");
    assert!(failed[0]["error"].contains("loss is"), "{:?}", failed[0]);
    assert_eq!(
        trials.iter().filter(|t| t["state"] == "COMPLETE").count(),
        3,
        "{trials:?}"
    );
}
