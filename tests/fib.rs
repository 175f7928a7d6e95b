//! The experiment end to end on the CPU backend: CSVs row by row, plots, split-mode parity, caps and isolation.

mod support;
use std::time::Duration;
use support::*;

/// Three trials of a small MLP on digits, in rounds of N = 1, 2 and 3 in every CPU split mode.
fn small() -> JobYaml {
    JobYaml::new()
        .name("small")
        .model(mlp(&[32]))
        .data("{source: mnist-10k, train_limit: 1024, test_limit: 500}")
        .train(epochs(2, 64))
        .seed(5)
        .param(
            "lr",
            "{min: 0.0005, max: 0.005, distribution: log_uniform_values}",
        )
        .n("[1, 2, 3]")
        .splits("[shared, logical, process]")
        .backend("auto")
}

/// A fib of one epoch on 256 synthetic samples, over a grid of one parameter's `values` when
/// given, in rounds of `n` logical slices capped at `mib`.
fn capped(model: String, grid: Option<(&str, &[&str])>, n: &str, mib: &str) -> JobYaml {
    let mut job = JobYaml::new()
        .model(model)
        .data(synthetic(256, 64))
        .train("{epochs: 1}");
    if let Some((name, vals)) = grid {
        job = job.param(name, values(vals)).method("grid");
    }
    job.n(n)
        .splits("[logical]")
        .memory(&format!("{{mib_per_slice: {mib}}}"))
        .backend("cpu")
}

#[test]
fn fib_writes_every_file_and_a_trial_does_not_depend_on_its_split_mode() {
    let dir = sandbox();
    let job = dir.job("small.yaml", small());
    let out = dir.join("out");
    let o = dir.run_into("fib", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // With no GPU it runs on the CPU and says so; on a GPU machine `auto` picks the GPU.
    let on_gpu = stderr(&o).contains("backend: cuda");
    assert!(
        on_gpu || stderr(&o).contains("running on the CPU backend"),
        "it says which backend it runs on: {}",
        stderr(&o)
    );
    for f in [
        "runs.csv",
        "trials.csv",
        "progress.csv",
        "time_per_training.svg",
        "samples_per_s.svg",
        "command.txt",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let runs = runs_csv(&out);
    assert_eq!(runs.len(), 9, "3 N × 3 split modes");
    for r in &runs {
        assert_eq!(r["failed"], "0", "{r:?}");
        assert_eq!(r["backend"], if on_gpu { "cuda" } else { "cpu" });
        let n: f64 = r["n"].parse().unwrap();
        let makespan: f64 = r["makespan_s"].parse().unwrap();
        let tpt: f64 = r["time_per_training_s"].parse().unwrap();
        assert!((makespan / n - tpt).abs() < 1e-9);
        assert_eq!(
            r["mem_cap_mib"].is_empty(),
            r["split"] != "logical",
            "only logical is capped: {r:?}"
        );
    }
    // One untimed warm-up round per in-process mode, whose trials write no rows.
    let log = stderr(&o);
    for (mode, warmed) in [("shared", true), ("logical", true), ("process", false)] {
        assert_eq!(
            log.contains(&format!("warm-up: {mode}, N=1, 2 steps")),
            warmed,
            "{mode}: {log}"
        );
    }
    let trials = trials_csv(&out);
    assert_eq!(trials.len(), 18);
    assert_eq!(progress_csv(&out).len(), 36, "one row per trial and epoch");
    // The same trial id has the same hyperparameters and seed in every round, and the same result.
    for id in ["t000", "t001", "t002"] {
        let accs: Vec<f64> = trials
            .iter()
            .filter(|t| t["trial_id"] == id)
            .map(|t| t["test_acc"].parse().unwrap())
            .collect();
        let lrs: Vec<&String> = trials
            .iter()
            .filter(|t| t["trial_id"] == id)
            .map(|t| &t["params_lr"])
            .collect();
        assert!(accs.len() >= 3);
        assert!(lrs.iter().all(|l| *l == lrs[0]));
        let spread = accs.iter().cloned().fold(f64::MIN, f64::max)
            - accs.iter().cloned().fold(f64::MAX, f64::min);
        assert!(
            // The CPU is deterministic to the bit; on a GPU, cuBLAS may order sums differently
            // on a different number of SMs, so allow a few test samples of 500.
            spread <= if on_gpu { 0.01 } else { 1e-6 },
            "{id}: test accuracy differs across split modes by {spread}"
        );
        assert!(accs[0] > 0.7, "{id} learned: {}", accs[0]);
    }
    let summary = stdout(&o);
    assert!(summary.contains("time/training"), "{summary}");
    assert!(summary.contains("best trial"), "{summary}");
    let svg = std::fs::read_to_string(out.join("time_per_training.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("logical") && svg.contains("process"));
}

#[test]
fn a_trial_over_its_cap_fails_alone_and_at_once() {
    let dir = sandbox();
    let job = dir.job(
        "cap.yaml",
        capped(mlp(&[]), Some(("batch_size", &["8", "4096"])), "[2]", "1.5"),
    );
    let out = dir.join("out");
    let o = dir.run_into("fib", &job, &out, &[]);
    // batch 4096 is larger than 256 training samples: a job error before anything runs.
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let job2 = dir.job(
        "cap2.yaml",
        capped(
            mlp(&[512]),
            Some(("optimizer", &["sgd", "adam"])),
            "[2]",
            "5.5",
        ),
    );
    let o = dir.run_into("fib", &job2, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let trials = trials_csv(&out);
    let sgd = trials
        .iter()
        .find(|t| t["params_optimizer"] == "sgd")
        .unwrap();
    let adam = trials
        .iter()
        .find(|t| t["params_optimizer"] == "adam")
        .unwrap();
    assert_eq!(sgd["state"], "COMPLETE", "{sgd:?}");
    assert_eq!(adam["state"], "FAIL");
    assert!(
        adam["error"].starts_with("batch 64 needs ")
            && adam["error"].contains("MiB, slice cap 5.5 MiB; no batch size fits (batch 1 needs "),
        "{}",
        adam["error"]
    );
    assert_eq!(adam["epochs"], "0", "it never started");
}

#[test]
fn a_fib_whose_every_trial_fails_says_so_and_exits_1() {
    let dir = sandbox();
    let job = dir.job("none.yaml", capped(mlp(&[512]), None, "[1, 2]", "0.5"));
    let out = dir.join("out");
    let o = dir.run_into("fib", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("every trial failed (3 of 3)") && !stderr(&o).contains("to plot"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).contains("no charts: no round completed a trial"));
    assert_eq!(trials_csv(&out).len(), 3);
    assert!(out.join("summary.txt").exists() && !out.join("time_per_training.svg").exists());
}

/// Three trials of a small MLP in one round, the second of which meets fault `kind` at step 2.
fn fault_job(kind: &str, split: &str) -> JobYaml {
    JobYaml::new()
        .model(mlp(&[16]))
        .data(synthetic(512, 128))
        .train(epochs(1, 32))
        .n("[3]")
        .splits(&format!("[{split}]"))
        .fault(&format!("{{trial: 1, kind: {kind}, step: 2}}"))
}

/// Runs [`fault_job`]: only trial t001 fails. Its rows.
fn run_fault(kind: &str, split: &str) -> Vec<Row> {
    let dir = sandbox();
    let job = dir.job(&format!("{kind}-{split}.yaml"), fault_job(kind, split));
    let out = dir.join("out");
    let o = dir.run_into("fib", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let trials = trials_csv(&out);
    assert_eq!(trials.len(), 3);
    for t in &trials {
        let want = if t["trial_id"] == "t001" {
            "FAIL"
        } else {
            "COMPLETE"
        };
        assert_eq!(t["state"], want, "{t:?}");
    }
    let runs = runs_csv(&out);
    assert_eq!(runs[0]["ok"], "2");
    assert_eq!(runs[0]["failed"], "1");
    trials
        .into_iter()
        .filter(|t| t["trial_id"] == "t001")
        .collect()
}

#[test]
fn a_panicking_trial_fails_alone() {
    for split in ["shared", "logical", "process"] {
        let t = run_fault("panic", split);
        assert!(
            t[0]["error"].contains("panic"),
            "{split}: {}",
            t[0]["error"]
        );
    }
}

#[test]
fn a_nan_loss_fails_the_trial() {
    let t = run_fault("nan", "shared");
    assert!(t[0]["error"].contains("loss is NaN"), "{}", t[0]["error"]);
}

#[test]
fn a_killed_worker_process_fails_only_its_trial() {
    let t = run_fault("kill", "process");
    assert!(t[0]["error"].contains("SIGKILL"), "{}", t[0]["error"]);
    let t = run_fault("abort", "process");
    assert!(t[0]["error"].contains("SIGABRT"), "{}", t[0]["error"]);
}

#[test]
fn report_redraws_and_merges() {
    let dir = sandbox();
    let mut outs = Vec::new();
    for (i, split) in ["shared", "logical"].iter().enumerate() {
        let job = dir.job(
            &format!("j{i}.yaml"),
            JobYaml::new()
                .model(mlp(&[8]))
                .data(synthetic(256, 64))
                .train("{epochs: 1}")
                .n("[1, 2]")
                .splits(&format!("[{split}]")),
        );
        let out = dir.join(format!("out{i}"));
        let o = dir.run_into("fib", &job, &out, &[]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        outs.push(out);
    }
    std::fs::remove_file(outs[0].join("time_per_training.svg")).unwrap();
    let o = dir.gpumux(&["report", s(&outs[0])]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(outs[0].join("time_per_training.svg").exists());
    let merged = dir.join("merged");
    let o = dir.gpumux(&["report", s(&outs[0]), s(&outs[1]), "--out", s(&merged)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(runs_csv(&merged).len(), 4);
    let o = dir.gpumux(&["report", s(&outs[0]), s(&outs[1])]);
    assert_eq!(o.status.code(), Some(2), "merging needs --out");
    let o = dir.gpumux(&["report", s(&dir.join("nothing"))]);
    assert_ne!(o.status.code(), Some(0));
}

#[test]
fn devices_without_a_gpu_shows_the_cpu_and_a_slice_plan() {
    let o = gpumux(
        &root(),
        &[
            "devices",
            "--n",
            "4",
            "--split",
            "logical",
            "--mib-per-slice",
            "256",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.contains("host: cpu"), "{s}");
    assert!(s.contains("backend:"), "{s}");
    assert_eq!(
        s.lines()
            .filter(|l| l.trim_end().ends_with(" -") && l.contains("256.0"))
            .count(),
        4,
        "{s}"
    );
    let o = gpumux(&root(), &["devices", "--n", "2", "--mib-per-slice", "1e12"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn sigterm_stops_fib_with_exit_code_3_and_keeps_the_rounds_done() {
    let dir = sandbox();
    let job = dir.job(
        "long.yaml",
        JobYaml::new()
            .model(mlp(&[64]))
            .data(synthetic(2048, 256))
            .train(epochs(4, 32))
            .n("[1, 2, 3, 5, 8, 13]")
            .splits("[shared]")
            .backend("cpu"),
    );
    let out = dir.join("out");
    let mut child = dir.spawn(&["fib", s(&job), "--out", s(&out)]);
    let runs = out.join("runs.csv");
    assert!(
        wait_for(&mut child, Duration::from_secs(60), || rows_in(&runs) >= 2),
        "two rounds never finished"
    );
    let o = terminate(child);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("interrupted"));
    let rounds = read_csv(&runs).len();
    assert!(
        (2..6).contains(&rounds),
        "the rounds done are kept, the cut one is not: {rounds}"
    );
}

/// With `--verbose`, each `process`-mode worker says how long it took to be ready and the memory
/// it holds; without it, nothing of that.
#[test]
fn verbose_process_workers_say_their_start_up_time_and_memory() {
    let dir = sandbox();
    let job = dir.job("small.yaml", small());
    for verbose in [true, false] {
        let out = dir.join(format!("out-{verbose}"));
        let mut args = vec![
            "fib",
            s(&job),
            "--n",
            "2",
            "--splits",
            "process",
            "--epochs",
            "1",
            "--backend",
            "cpu",
            "--out",
            s(&out),
        ];
        if verbose {
            args.insert(0, "--verbose");
        }
        let o = dir.gpumux(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let err = stderr(&o);
        let ready: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("worker ready:"))
            .collect();
        if !verbose {
            assert!(ready.is_empty(), "{err}");
            continue;
        }
        assert_eq!(ready.len(), 2, "{err}");
        for (i, l) in ready.iter().enumerate() {
            assert!(l.contains("s after its start"), "{l}");
            assert!(l.contains("host memory peak ") && l.contains(" MiB"), "{l}");
            assert!(
                ready.iter().any(|l| l.contains(&format!("trial t00{i},"))),
                "{err}"
            );
        }
    }
}
