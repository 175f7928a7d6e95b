//! Sweeps on the CPU: resume after SIGKILL at several points, shards merged, SIGTERM, dry runs, and the Slurm script with a fake srun.

mod support;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use support::*;

/// Forty trials of a small MLP on synthetic data, two at a time in logical slices on the CPU.
fn sw40() -> JobYaml {
    JobYaml::new()
        .name("sw40")
        .model(mlp(&[64]))
        .data(synthetic(2048, 256))
        .train(epochs(6, 32))
        .run_cap(40)
        .param(
            "lr",
            "{min: 0.0003, max: 0.01, distribution: log_uniform_values}",
        )
        .param("optimizer", values(&["adam", "sgd"]))
        .concurrency(2)
        .split("logical")
        .backend("cpu")
}

/// Waits until the CSV file `csv` has at least `n` rows; false when the process ends first or
/// after a minute.
fn wait_rows(child: &mut Child, csv: &Path, n: usize) -> bool {
    wait_for(child, Duration::from_secs(60), || rows_in(csv) >= n)
}

#[test]
fn a_sweep_killed_with_sigkill_and_resumed_completes_each_trial_exactly_once() {
    let dir = sandbox();
    let job = dir.job("sw40.yaml", sw40());
    let job = s(&job);
    for kill_after in [1, 13, 31] {
        let out = dir.join(format!("out-{kill_after}"));
        let out_s = s(&out);
        let mut child = dir.spawn(&["sweep", job, "--out", out_s]);
        let reached = wait_rows(&mut child, &out.join("trials.csv"), kill_after);
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        assert!(reached, "the sweep ended before {kill_after} rows");
        let before = states(&out).len();
        assert!(
            before >= kill_after && before < 40,
            "killed mid-way: {before} rows"
        );
        let o = dir.gpumux(&["sweep", job, "--out", out_s, "--resume"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let rows = states(&out);
        let complete: Vec<&String> = rows
            .iter()
            .filter(|(_, s)| s == "COMPLETE")
            .map(|(id, _)| id)
            .collect();
        let unique: HashSet<&String> = complete.iter().copied().collect();
        assert_eq!(complete.len(), 40, "kill after {kill_after}: {rows:?}");
        assert_eq!(unique.len(), 40, "no trial completed twice");
        assert_eq!(rows.len(), 40, "no other rows: a killed run writes none");
        assert!(
            stdout(&o).contains(&format!("{before} already COMPLETE")),
            "{}",
            stdout(&o)
        );
    }
}

#[test]
fn four_shards_merged_give_the_same_trials_as_one_run() {
    let dir = sandbox();
    let job = dir.job("sw40.yaml", sw40().train(epochs(1, 32)));
    let job = s(&job);
    let whole = dir.join("whole");
    let o = dir.gpumux(&["sweep", job, "--out", s(&whole)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut shard_dirs = Vec::new();
    let mut sizes = Vec::new();
    for i in 1..=4 {
        let out = dir.join(format!("shard{i}"));
        let o = dir.gpumux(&["sweep", job, "--shard", &format!("{i}/4"), "--out", s(&out)]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        sizes.push(states(&out).len());
        shard_dirs.push(s(&out).to_string());
    }
    assert_eq!(
        sizes.iter().sum::<usize>(),
        40,
        "the shards split the trials: {sizes:?}"
    );
    assert!(sizes.iter().all(|&s| s > 0), "{sizes:?}");
    let merged = dir.join("merged");
    let mut args = vec!["merge"];
    args.extend(shard_dirs.iter().map(String::as_str));
    args.extend(["--out", s(&merged)]);
    let o = dir.gpumux(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let acc = |out: &Path| -> BTreeMap<String, String> {
        trials_csv(out)
            .into_iter()
            .map(|r| (r["trial_id"].clone(), r["test_acc"].clone()))
            .collect()
    };
    assert_eq!(acc(&merged), acc(&whole), "same trials, same results");
    assert!(
        stdout(&o).contains("merged 40 trials: 40 COMPLETE"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn sigterm_stops_the_sweep_with_exit_code_3_and_keeps_every_completed_trial() {
    let dir = sandbox();
    let job = dir.job("sw40.yaml", sw40());
    for grace in ["30", "0"] {
        let out = dir.join(format!("out-{grace}"));
        let mut child = dir.spawn(&["sweep", s(&job), "--out", s(&out), "--grace", grace]);
        assert!(
            wait_rows(&mut child, &out.join("trials.csv"), 5),
            "it ran some trials"
        );
        let o = terminate(child);
        assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
        let rows = states(&out);
        let complete = rows.iter().filter(|(_, s)| s == "COMPLETE").count();
        let said = stdout(&o);
        assert!(
            said.contains(&format!("{complete} COMPLETE")),
            "grace {grace}: {said}"
        );
        assert!((5..40).contains(&complete), "{complete}");
        if grace == "30" {
            assert!(
                rows.iter().all(|(_, s)| s == "COMPLETE"),
                "running trials finished: {rows:?}"
            );
        }
        let o = dir.gpumux(&["sweep", s(&job), "--out", s(&out), "--resume"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let done: HashSet<String> = states(&out)
            .into_iter()
            .filter(|(_, s)| s == "COMPLETE")
            .map(|(id, _)| id)
            .collect();
        assert_eq!(done.len(), 40);
    }
}

#[test]
fn a_second_run_without_resume_refuses_to_mix_results() {
    let dir = sandbox();
    let job = dir.job("small.yaml", sw40().run_cap(2).train(epochs(1, 32)));
    let out = dir.join("out");
    let args = ["sweep", s(&job), "--out", s(&out)];
    assert_eq!(dir.gpumux(&args).status.code(), Some(0));
    let o = dir.gpumux(&args);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));
    assert!(out.join("best.yaml").exists());
    // The command and device are recorded next to the results, as every command does.
    let recorded = std::fs::read_to_string(out.join("command.txt")).unwrap();
    assert!(
        recorded.contains("sweep")
            && recorded.contains("small.yaml")
            && recorded.contains("device: cpu"),
        "{recorded}"
    );
}

#[test]
fn dry_run_prints_the_plan_and_writes_nothing() {
    let dir = sandbox();
    let job = dir.job("sw40.yaml", sw40());
    let out = dir.join("out");
    let o = dir.gpumux(&[
        "sweep",
        s(&job),
        "--dry-run",
        "--shard",
        "1/2",
        "--out",
        s(&out),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(
        s.contains("2 slices at a time") && s.contains("cap per slice"),
        "{s}"
    );
    let listed = s
        .lines()
        .filter(|l| l.starts_with("  ") && l.contains("\"lr\""))
        .count();
    assert!(
        listed > 5 && listed < 40,
        "about half of the 40 trials: {listed}"
    );
    assert!(!out.exists(), "nothing written");
}

#[test]
fn a_failed_trial_makes_exit_code_1() {
    let dir = sandbox();
    let text = sw40()
        .run_cap(3)
        .train(epochs(1, 32))
        .fault("{trial: 1, kind: nan}");
    let job = dir.job("f.yaml", text);
    let o = dir.gpumux(&["sweep", s(&job), "--out", s(&dir.join("o"))]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stdout(&o).contains("2 COMPLETE, 1 FAIL"), "{}", stdout(&o));
}

#[test]
fn the_slurm_script_runs_every_shard_and_merges_them() {
    let root = root();
    let script = root.join("jobs/slurm/sweep.sbatch");
    let o = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .expect("bash");
    assert!(o.status.success(), "bash -n: {}", stderr(&o));
    let dir = sandbox();
    let job = dir.job("sw40.yaml", sw40().train(epochs(1, 32)));
    // Outside Slurm: the array's variables set by hand, one task after another.
    let results = dir.join("results");
    for task in 0..4 {
        let o = Command::new("bash")
            .arg(&script)
            .arg(&job)
            .current_dir(dir.path())
            .env("GPUMUX", bin())
            .env("GPUMUX_OUT", format!("{}/", results.display()))
            .env("SLURM_ARRAY_JOB_ID", "777")
            .env("SLURM_ARRAY_TASK_ID", (task + 10).to_string())
            .env("SLURM_ARRAY_TASK_MIN", "10")
            .env("SLURM_ARRAY_TASK_COUNT", "4")
            .env("SLURM_CPUS_PER_TASK", "2")
            .output()
            .expect("bash runs the script");
        let said = stdout(&o);
        assert!(o.status.success(), "task {task}: {said}\n{}", stderr(&o));
        assert!(
            said.contains(&format!("shard {}/4 of", task + 1)),
            "task {task}: {said}"
        );
        let merged = results.join("merged");
        assert_eq!(
            merged.exists(),
            task == 3,
            "merged only after the last shard (task {task}): {said}"
        );
    }
    // merged/ is a link to the merge, replaced in one rename when a later merge is made.
    assert!(std::fs::symlink_metadata(results.join("merged"))
        .unwrap()
        .file_type()
        .is_symlink());
    let rows = read_csv(&results.join("merged/trials.csv"));
    assert_eq!(rows.len(), 40);
    assert!(rows.iter().all(|r| r["state"] == "COMPLETE"));
}

#[test]
fn external_command_trials_report_their_json_metrics() {
    let root = root();
    let dir = sandbox();
    let out = dir.join("ext");
    let o = gpumux(
        &root,
        &["sweep", "jobs/sweep-external.yaml", "--out", s(&out)],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = read_csv(&out.join("trials.csv"));
    assert_eq!(rows.len(), 8);
    for r in &rows {
        assert_eq!(r["state"], "COMPLETE", "{r:?}");
        assert_eq!(r["model"], "external");
        let acc: f64 = r["metric"]
            .parse()
            .expect("the metric column holds test_acc");
        assert!((0.0..=1.0).contains(&acc));
        assert!(r["params"].contains("\"lr\""), "{}", r["params"]);
    }
    assert!(
        !read_csv(&out.join("progress.csv")).is_empty(),
        "epoch lines become progress rows"
    );
    // A command that fails is a FAIL row with its stderr, and exit code 1.
    let bad = dir.job(
        "bad.yaml",
        JobYaml::new()
            .command(r#"python3 -c 'import sys; sys.exit("no luck for {lr}")'"#)
            .run_cap(2)
            .param("lr", values(&["0.1", "0.2"]))
            .concurrency(2),
    );
    let o = dir.gpumux(&["sweep", s(&bad), "--out", s(&dir.join("bad"))]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let rows = read_csv(&dir.join("bad/trials.csv"));
    assert!(
        rows.iter()
            .all(|r| r["state"] == "FAIL" && r["error"].contains("no luck")),
        "{rows:?}"
    );
}

#[test]
fn aborting_a_process_mode_sweep_stops_the_workers_and_records_them_interrupted() {
    let dir = sandbox();
    let job = dir.job("p.yaml", sw40().split("process").train(epochs(40, 32)));
    let out = dir.join("out");
    let mut child = dir.spawn(&["sweep", s(&job), "--out", s(&out), "--grace", "0"]);
    // Wait until the workers have begun training (their epochs reach progress.csv).
    assert!(
        wait_rows(&mut child, &out.join("progress.csv"), 2),
        "no progress, or it ended early"
    );
    let o = terminate(child);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let rows = states(&out);
    let interrupted = rows.iter().filter(|(_, s)| s == "INTERRUPTED").count();
    assert!(
        interrupted >= 1,
        "the running workers were stopped: {rows:?}"
    );
    assert!(
        rows.iter()
            .all(|(_, s)| s == "INTERRUPTED" || s == "COMPLETE"),
        "{rows:?}"
    );
}

#[test]
fn workers_die_with_a_supervisor_killed_outright() {
    let dir = sandbox();
    let job = dir.job("p.yaml", sw40().split("process").train(epochs(5000, 32)));
    let out = dir.join("out");
    let mut child = dir.spawn(&["sweep", s(&job), "--out", s(&out)]);
    assert!(
        wait_rows(&mut child, &out.join("progress.csv"), 2),
        "no progress, or it ended early"
    );
    let pgrep = Command::new("pgrep")
        .args(["-P", &child.id().to_string()])
        .output()
        .expect("pgrep");
    let workers: Vec<String> = String::from_utf8_lossy(&pgrep.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert!(!workers.is_empty(), "the sweep has worker processes");
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let alive = |pid: &String| pid.parse().is_ok_and(alive);
    let start = Instant::now();
    while workers.iter().any(alive) {
        // A trial here takes minutes; only dying with the supervisor ends it within seconds.
        if start.elapsed() > Duration::from_secs(3) {
            for pid in workers
                .iter()
                .filter_map(|p| p.parse::<i32>().ok())
                .filter(|&p| p > 1)
            {
                // SAFETY: kill(2) on the orphans this test made, so none outlives it.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            panic!("orphaned workers: {workers:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_dry_run_with_resume_leaves_the_results_untouched() {
    let dir = sandbox();
    let job = dir.job("small.yaml", sw40().run_cap(3).train(epochs(1, 32)));
    let out = dir.join("out");
    let (job, out_s) = (s(&job), s(&out));
    assert_eq!(
        dir.gpumux(&["sweep", job, "--out", out_s]).status.code(),
        Some(0)
    );
    // A row cut short, as a kill in the middle of a write leaves it.
    let csv = out.join("trials.csv");
    let cut = format!(
        "{}{}",
        std::fs::read_to_string(&csv).unwrap(),
        "deadbeef,0,logical"
    );
    std::fs::write(&csv, &cut).unwrap();
    let o = dir.gpumux(&["sweep", job, "--out", out_s, "--resume", "--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("3 already COMPLETE, 0 to run"),
        "the cut row is dropped, never counted: {}",
        stdout(&o)
    );
    assert!(stderr(&o).contains("trials.csv"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(&csv).unwrap(),
        cut,
        "a dry run writes nothing"
    );
    let o = dir.gpumux(&["sweep", job, "--out", out_s, "--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("3 already COMPLETE, 0 to run"),
        "{}",
        stdout(&o)
    );
}

/// Runs the Slurm script outside Slurm for task `task` of `count` (first id 0) with `env` set.
fn slurm_task(
    dir: &Sandbox,
    job: &Path,
    results: &Path,
    task: &str,
    count: &str,
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut c = Command::new("bash");
    c.arg(root().join("jobs/slurm/sweep.sbatch"))
        .arg(job)
        .current_dir(dir.path())
        .env("GPUMUX", bin())
        .env("GPUMUX_OUT", results)
        .env("SLURM_ARRAY_JOB_ID", "777")
        .env("SLURM_ARRAY_TASK_ID", task)
        .env("SLURM_ARRAY_TASK_MIN", "0")
        .env("SLURM_ARRAY_TASK_COUNT", count);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("bash runs the script")
}

#[test]
fn the_slurm_scripts_own_inputs_are_checked_before_anything_is_made() {
    let dir = sandbox();
    let job = dir.job("sw40.yaml", sw40().train(epochs(1, 32)).run_cap(4));
    let results = dir.join("results");
    for (task, count, env, file, says) in [
        (
            "0",
            "2",
            vec![("GPUMUX_SIGNAL_LEAD", "x")],
            None,
            "GPUMUX_SIGNAL_LEAD must be a whole number",
        ),
        (
            "0",
            "2",
            vec![("GPUMUX_GRACE_MARGIN", "1e3")],
            None,
            "GPUMUX_GRACE_MARGIN must be",
        ),
        (
            "0",
            "2",
            vec![("GPUMUX_GRACE", "-5")],
            None,
            "GPUMUX_GRACE must be",
        ),
        ("08", "2", vec![], None, "SLURM_ARRAY_TASK_ID must be"),
        (
            "0",
            "99999999999999999999",
            vec![],
            None,
            "SLURM_ARRAY_TASK_COUNT must be",
        ),
        (
            "0",
            "2",
            vec![],
            Some("1 08\n"),
            "does not hold a task count and a first id",
        ),
        (
            "0",
            "2",
            vec![],
            Some("2 0 9\n"),
            "does not hold a task count and a first id",
        ),
    ] {
        let _ = std::fs::remove_dir_all(&results);
        if let Some(text) = file {
            std::fs::create_dir_all(&results).unwrap();
            std::fs::write(results.join(".array"), text).unwrap();
        }
        let o = slurm_task(&dir, &job, &results, task, count, &env);
        let err = stderr(&o);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{task} {count} {env:?} {file:?}: {err}"
        );
        assert!(err.contains(says), "{says}: {err}");
        assert!(
            !err.contains("unbound variable") && !err.contains("value too great"),
            "{err}"
        );
        let made: Vec<_> = std::fs::read_dir(&results)
            .map(|d| d.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        assert!(
            made.iter().all(|n| n == ".array"),
            "nothing made for {says}: {made:?}"
        );
    }
    // GPUMUX_ARGS is split at spaces and never glob-expanded: a `*` reaches gpumux as it is.
    std::fs::write(dir.join("--resume"), "").unwrap();
    let _ = std::fs::remove_dir_all(&results);
    let o = slurm_task(
        &dir,
        &job,
        &results,
        "0",
        "1",
        &[("GPUMUX_ARGS", "--concurrency *")],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--concurrency wants a number from 1, or auto, not `*`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_slurm_merge_never_writes_through_a_link_nor_deletes_a_folder_of_its_own() {
    let dir = sandbox();
    let job = dir.job("sw40.yaml", sw40().train(epochs(1, 32)).run_cap(4));
    let results = dir.join("results");
    std::fs::create_dir_all(results.join("merged")).unwrap();
    std::fs::write(results.join("merged/notes.txt"), "mine\n").unwrap();
    let o = slurm_task(&dir, &job, &results, "0", "1", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The folder was moved aside whole and kept; merged/ is now the merge.
    let aside: Vec<_> = std::fs::read_dir(&results)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("merged-earlier-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "{}", stdout(&o));
    assert_eq!(
        std::fs::read_to_string(aside[0].join("notes.txt")).unwrap(),
        "mine\n"
    );
    assert!(results.join("merged/trials.csv").exists());
    // A lock that links elsewhere is refused, and its target left as it was.
    let outside = dir.join("precious.txt");
    std::fs::write(&outside, "keep\n").unwrap();
    let other = dir.join("results2");
    std::fs::create_dir_all(&other).unwrap();
    std::os::unix::fs::symlink(&outside, other.join(".merge.lock")).unwrap();
    let o = slurm_task(&dir, &job, &other, "0", "1", &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(".merge.lock is a link"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep\n");
}
