//! Sweeps on the CPU: resume after SIGKILL at several points, shards merged, SIGTERM, dry runs, and the Slurm script with a fake srun.

mod common;
use common::*;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const JOB: &str = "name: sw40
model: {kind: mlp, hidden: [64]}
data: {source: synthetic, train_samples: 2048, test_samples: 256}
train: {epochs: 6, batch_size: 32}
run_cap: 40
parameters:
  lr: {min: 0.0003, max: 0.01, distribution: log_uniform_values}
  optimizer: {values: [adam, sgd]}
concurrency: 2
split: logical
backend: cpu
";

fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("gpumux")
}

fn spawn(dir: &Path, args: &[&str]) -> Child {
    Command::new(bin())
        .current_dir(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpumux starts")
}

/// Data rows in a CSV file (header excluded; a cut last line counts as nothing).
fn rows_in(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.matches('\n').count().saturating_sub(1))
        .unwrap_or(0)
}

/// Waits until the CSV file `csv` has at least `n` rows; false when the process ends first or
/// after a minute.
fn wait_rows(child: &mut Child, csv: &Path, n: usize) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if rows_in(csv) >= n {
            return true;
        }
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(3));
    }
    false
}

/// Sends SIGTERM and waits: an interrupted sweep exits with code 3.
fn terminate(child: Child) -> std::process::Output {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().expect("waits");
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn states(out: &Path) -> Vec<(String, String)> {
    read_csv(&out.join("trials.csv"))
        .into_iter()
        .map(|r| (r["trial_id"].clone(), r["state"].clone()))
        .collect()
}

#[test]
fn a_sweep_killed_with_sigkill_and_resumed_completes_each_trial_exactly_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = job(dir.path(), "sw40.yaml", JOB);
    let job = job.to_str().unwrap();
    for kill_after in [1, 13, 31] {
        let out = dir.path().join(format!("out-{kill_after}"));
        let out_s = out.to_str().unwrap();
        let mut child = spawn(dir.path(), &["sweep", job, "--out", out_s]);
        let reached = wait_rows(&mut child, &out.join("trials.csv"), kill_after);
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        assert!(reached, "the sweep ended before {kill_after} rows");
        let before = states(&out).len();
        assert!(
            before >= kill_after && before < 40,
            "killed mid-way: {before} rows"
        );
        let o = gpumux(dir.path(), &["sweep", job, "--out", out_s, "--resume"]);
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
    let dir = tempfile::tempdir().expect("tempdir");
    let job = job(
        dir.path(),
        "sw40.yaml",
        &JOB.replace("epochs: 6", "epochs: 1"),
    );
    let job = job.to_str().unwrap();
    let whole = dir.path().join("whole");
    let o = gpumux(
        dir.path(),
        &["sweep", job, "--out", whole.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut shard_dirs = Vec::new();
    let mut sizes = Vec::new();
    for i in 1..=4 {
        let out = dir.path().join(format!("shard{i}"));
        let o = gpumux(
            dir.path(),
            &[
                "sweep",
                job,
                "--shard",
                &format!("{i}/4"),
                "--out",
                out.to_str().unwrap(),
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        sizes.push(states(&out).len());
        shard_dirs.push(out.to_str().unwrap().to_string());
    }
    assert_eq!(
        sizes.iter().sum::<usize>(),
        40,
        "the shards split the trials: {sizes:?}"
    );
    assert!(sizes.iter().all(|&s| s > 0), "{sizes:?}");
    let merged = dir.path().join("merged");
    let mut args = vec!["merge"];
    args.extend(shard_dirs.iter().map(String::as_str));
    args.extend(["--out", merged.to_str().unwrap()]);
    let o = gpumux(dir.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let acc = |out: &Path| -> BTreeMap<String, String> {
        read_csv(&out.join("trials.csv"))
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
    let dir = tempfile::tempdir().expect("tempdir");
    let job = job(dir.path(), "sw40.yaml", JOB);
    for grace in ["30", "0"] {
        let out = dir.path().join(format!("out-{grace}"));
        let mut child = spawn(
            dir.path(),
            &[
                "sweep",
                job.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--grace",
                grace,
            ],
        );
        assert!(
            wait_rows(&mut child, &out.join("trials.csv"), 5),
            "it ran some trials"
        );
        let o = terminate(child);
        let rows = states(&out);
        let complete = rows.iter().filter(|(_, s)| s == "COMPLETE").count();
        let said = String::from_utf8_lossy(&o.stdout);
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
        let o = gpumux(
            dir.path(),
            &[
                "sweep",
                job.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--resume",
            ],
        );
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
    let dir = tempfile::tempdir().expect("tempdir");
    let job = job(
        dir.path(),
        "small.yaml",
        &JOB.replace("run_cap: 40", "run_cap: 2")
            .replace("epochs: 6", "epochs: 1"),
    );
    let out = dir.path().join("out");
    let args = [
        "sweep",
        job.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    assert_eq!(gpumux(dir.path(), &args).status.code(), Some(0));
    let o = gpumux(dir.path(), &args);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));
    assert!(out.join("best.yaml").exists());
}

#[test]
fn dry_run_prints_the_plan_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = job(dir.path(), "sw40.yaml", JOB);
    let out = dir.path().join("out");
    let o = gpumux(
        dir.path(),
        &[
            "sweep",
            job.to_str().unwrap(),
            "--dry-run",
            "--shard",
            "1/2",
            "--out",
            out.to_str().unwrap(),
        ],
    );
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
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "{}faults:\n  - {{trial: 1, kind: nan}}\n",
        JOB.replace("run_cap: 40", "run_cap: 3")
            .replace("epochs: 6", "epochs: 1")
    );
    let job = job(dir.path(), "f.yaml", &text);
    let o = gpumux(
        dir.path(),
        &[
            "sweep",
            job.to_str().unwrap(),
            "--out",
            dir.path().join("o").to_str().unwrap(),
        ],
    );
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
    assert!(
        o.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let job = job(
        dir.path(),
        "sw40.yaml",
        &JOB.replace("epochs: 6", "epochs: 1"),
    );
    // A fake srun: drops its own options and runs the command.
    let fake = dir.path().join("bin");
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::write(
        fake.join("srun"),
        "#!/usr/bin/env bash\nwhile [[ $# -gt 0 && $1 == --* ]]; do shift; done\necho \"srun: $*\" >> \"$FAKE_SRUN_LOG\"\nexec \"$@\"\n",
    )
    .unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(fake.join("srun"))
        .status()
        .expect("chmod");
    let results = dir.path().join("results");
    let path = format!(
        "{}:{}",
        fake.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for task in 0..4 {
        let o = Command::new("bash")
            .arg(&script)
            .arg(&job)
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("GPUMUX", bin())
            .env("GPUMUX_OUT", &results)
            .env("FAKE_SRUN_LOG", dir.path().join("srun.log"))
            .env("SLURM_ARRAY_JOB_ID", "777")
            .env("SLURM_ARRAY_TASK_ID", (task + 10).to_string())
            .env("SLURM_ARRAY_TASK_MIN", "10")
            .env("SLURM_ARRAY_TASK_COUNT", "4")
            .env("SLURM_CPUS_PER_TASK", "2")
            .output()
            .expect("bash runs the script");
        assert!(
            o.status.success(),
            "task {task}: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let merged = results.join("merged");
        assert_eq!(
            merged.exists(),
            task == 3,
            "merged only after the last shard (task {task})"
        );
    }
    let log = std::fs::read_to_string(dir.path().join("srun.log")).unwrap();
    assert_eq!(log.lines().count(), 4);
    assert!(log.contains("--shard 4/4 --resume"), "{log}");
    let rows = read_csv(&results.join("merged/trials.csv"));
    assert_eq!(rows.len(), 40);
    assert!(rows.iter().all(|r| r["state"] == "COMPLETE"));
}

#[test]
fn external_command_trials_report_their_json_metrics() {
    let root = root();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("ext");
    let o = gpumux(
        &root,
        &[
            "sweep",
            "jobs/sweep-external.yaml",
            "--out",
            out.to_str().unwrap(),
        ],
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
    let bad = job(
        dir.path(),
        "bad.yaml",
        "command: \"python3 -c 'import sys; sys.exit(\\\"no luck for {lr}\\\")'\"\nrun_cap: 2\nparameters:\n  lr: {values: [0.1, 0.2]}\nconcurrency: 2\n",
    );
    let o = gpumux(
        dir.path(),
        &[
            "sweep",
            bad.to_str().unwrap(),
            "--out",
            dir.path().join("bad").to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let rows = read_csv(&dir.path().join("bad/trials.csv"));
    assert!(
        rows.iter()
            .all(|r| r["state"] == "FAIL" && r["error"].contains("no luck")),
        "{rows:?}"
    );
}

#[test]
fn aborting_a_process_mode_sweep_stops_the_workers_and_records_them_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = JOB
        .replace("split: logical", "split: process")
        .replace("epochs: 6", "epochs: 40");
    let job = job(dir.path(), "p.yaml", &text);
    let out = dir.path().join("out");
    let mut child = spawn(
        dir.path(),
        &[
            "sweep",
            job.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--grace",
            "0",
        ],
    );
    // Wait until the workers have begun training (their epochs reach progress.csv).
    assert!(
        wait_rows(&mut child, &out.join("progress.csv"), 2),
        "no progress, or it ended early"
    );
    terminate(child);
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
    let dir = tempfile::tempdir().expect("tempdir");
    let text = JOB
        .replace("split: logical", "split: process")
        .replace("epochs: 6", "epochs: 5000");
    let job = job(dir.path(), "p.yaml", &text);
    let out = dir.path().join("out");
    let mut child = spawn(
        dir.path(),
        &[
            "sweep",
            job.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
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
    let alive = |pid: &String| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
    };
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
    let dir = tempfile::tempdir().expect("tempdir");
    let text = JOB
        .replace("run_cap: 40", "run_cap: 3")
        .replace("epochs: 6", "epochs: 1");
    let job = job(dir.path(), "small.yaml", &text);
    let out = dir.path().join("out");
    let (job, out_s) = (job.to_str().unwrap(), out.to_str().unwrap());
    assert_eq!(
        gpumux(dir.path(), &["sweep", job, "--out", out_s])
            .status
            .code(),
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
    let o = gpumux(
        dir.path(),
        &["sweep", job, "--out", out_s, "--resume", "--dry-run"],
    );
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
    let o = gpumux(dir.path(), &["sweep", job, "--out", out_s, "--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("3 already COMPLETE, 0 to run"),
        "{}",
        stdout(&o)
    );
}
