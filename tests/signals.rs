//! Signals, exit codes and a closed stdout, on the real binary: every long-running command keeps what it measured and exits 3 on SIGTERM, a second signal stops at once, and each command maps its errors to the README's table.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("gpumux")
}

/// A running gpumux whose stdout and stderr are collected as they come.
struct Running {
    child: Child,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
}

fn collect(src: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let keep = Arc::clone(&text);
    std::thread::spawn(move || {
        for line in BufReader::new(src).lines() {
            let Ok(line) = line else { break };
            let mut t = keep.lock().unwrap();
            t.push_str(&line);
            t.push('\n');
        }
    });
    text
}

fn start(dir: &Path, args: &[&str]) -> Running {
    let mut child = Command::new(bin())
        .current_dir(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpumux starts");
    let out = collect(child.stdout.take().unwrap());
    let err = collect(child.stderr.take().unwrap());
    Running { child, out, err }
}

impl Running {
    /// Waits until `ready` holds (checked every few ms); false when the process ended first or
    /// after two minutes.
    fn wait_for(&mut self, ready: &dyn Fn(&Running) -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(120) {
            if ready(self) {
                return true;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return ready(self);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    fn said(&self, text: &str) -> bool {
        self.out.lock().unwrap().contains(text) || self.err.lock().unwrap().contains(text)
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits for the end (two minutes at most, then kills it and fails): the exit code, stdout
    /// and stderr.
    fn finish(mut self) -> (Option<i32>, String, String) {
        let start = Instant::now();
        let status = loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(120) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("gpumux did not end: {}", self.err.lock().unwrap());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The readers end with the pipes.
        std::thread::sleep(Duration::from_millis(50));
        let out = self.out.lock().unwrap().clone();
        let err = self.err.lock().unwrap().clone();
        (status.code(), out, err)
    }
}

/// Data rows of a CSV file (its header and a cut last line excluded).
fn rows_in(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.matches('\n').count().saturating_sub(1))
        .unwrap_or(0)
}

const MLP: &str = "model: {kind: mlp, hidden: [64]}
data: {source: synthetic, train_samples: 2048, test_samples: 256}
backend: cpu
";

#[test]
fn batch_scan_keeps_each_row_it_measured_and_exits_3_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "scan.yaml",
        &format!("name: scan\n{MLP}split: logical\nmemory: {{mib_per_slice: 64}}\n"),
    );
    let out = dir.path().join("out");
    let mut run = start(
        dir.path(),
        &[
            "batch-scan",
            job.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--seconds",
            "2",
        ],
    );
    let csv = out.join("batch_scan.csv");
    assert!(
        run.wait_for(&|_| rows_in(&csv) >= 2),
        "no rows measured: {}",
        run.err.lock().unwrap()
    );
    run.signal(libc::SIGTERM);
    let (code, said, err) = run.finish();
    assert_eq!(code, Some(3), "{err}");
    let rows = read_csv(&csv);
    assert!(rows.len() >= 2, "{rows:?}");
    // Every row printed is in the file, and every row in the file was measured.
    let printed = said
        .lines()
        .filter_map(|l| l.strip_prefix("batch "))
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .count();
    assert_eq!(rows.len(), printed, "{said}");
    assert!(rows
        .iter()
        .all(|r| r["fits"] == "true" && !r["samples_per_s"].is_empty()));
    assert!(err.contains("interrupted"), "{err}");
}

#[test]
fn fib_train_and_parallel_stop_with_exit_3_and_keep_what_they_measured() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "j.yaml",
        &format!(
            "name: j\n{MLP}train: {{epochs: 400, batch_size: 32}}\nn: [1, 2]\nsplits: [logical]\nsplit: logical\nparallel: {{slices: 2}}\n"
        ),
    );
    let job = job.to_str().unwrap();
    // fib: the progress rows of the running trials are kept.
    let out = dir.path().join("fib");
    let mut run = start(dir.path(), &["fib", job, "--out", out.to_str().unwrap()]);
    let progress = out.join("progress.csv");
    assert!(run.wait_for(&|_| rows_in(&progress) >= 1), "no epoch ran");
    run.signal(libc::SIGTERM);
    let (code, _, err) = run.finish();
    assert_eq!(code, Some(3), "fib: {err}");
    assert!(!read_csv(&progress).is_empty());
    let trials = read_csv(&out.join("trials.csv"));
    assert!(
        trials.iter().all(|t| t["state"] == "INTERRUPTED"),
        "{trials:?}"
    );
    // train: the epochs printed stay printed.
    let mut run = start(dir.path(), &["train", job]);
    assert!(run.wait_for(&|r| r.said("epoch   1")), "no epoch ran");
    run.signal(libc::SIGINT);
    let (code, said, err) = run.finish();
    assert_eq!(code, Some(3), "train: {err}");
    assert!(said.contains("epoch   1"), "{said}");
    assert!(err.contains("stopped by a signal"), "{err}");
    // parallel: the progress rows of the epochs done are kept.
    let out = dir.path().join("par");
    let mut run = start(
        dir.path(),
        &["parallel", job, "--out", out.to_str().unwrap()],
    );
    let progress = out.join("progress.csv");
    assert!(run.wait_for(&|_| rows_in(&progress) >= 3), "no epoch ran");
    run.signal(libc::SIGTERM);
    let (code, _, err) = run.finish();
    assert_eq!(code, Some(3), "parallel: {err}");
    assert!(read_csv(&progress).len() >= 3);
}

#[test]
fn a_signal_while_the_data_loads_is_not_lost_and_gives_exit_3() {
    // 30,000 synthetic 3×64×64 samples take seconds to make: the signal comes meanwhile.
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "big.yaml",
        "name: big\nmodel: {kind: mlp, hidden: [16]}\ndata: {source: synthetic, shape: [3, 64, 64], train_samples: 30000, test_samples: 100}\ntrain: {epochs: 50, batch_size: 64}\nbackend: cpu\n",
    );
    let mut run = start(dir.path(), &["train", job.to_str().unwrap()]);
    assert!(run.wait_for(&|r| r.said("backend:")), "it did not start");
    run.signal(libc::SIGTERM);
    let (code, said, err) = run.finish();
    assert_eq!(code, Some(3), "{err}");
    assert!(!said.contains("epoch   1"), "it trained on: {said}");
}

#[test]
fn a_second_signal_ends_a_command_at_once_even_before_it_can_stop() {
    // The data takes seconds to make; nothing checks for a stop meanwhile. The first signal is
    // kept for later, the second ends gpumux before the data is made.
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "big.yaml",
        "name: big\nmodel: {kind: mlp, hidden: [16]}\ndata: {source: synthetic, shape: [3, 64, 64], train_samples: 30000, test_samples: 100}\ntrain: {epochs: 50, batch_size: 64}\nn: [1]\nsplits: [shared]\nbackend: cpu\n",
    );
    let out = dir.path().join("out");
    let mut run = start(
        dir.path(),
        &["fib", job.to_str().unwrap(), "--out", out.to_str().unwrap()],
    );
    assert!(run.wait_for(&|r| r.said("backend:")), "it did not start");
    run.signal(libc::SIGTERM);
    assert!(
        run.wait_for(&|r| r.said("SIGTERM: stopping")),
        "the first signal was not taken"
    );
    run.signal(libc::SIGINT);
    let (code, _, err) = run.finish();
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("SIGINT again: stopping now"), "{err}");
    assert!(
        !err.contains("data: synthetic"),
        "it waited for the data: {err}"
    );
}

#[test]
fn a_second_signal_stops_running_trials_at_once_despite_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "long.yaml",
        &format!(
            "name: long\n{MLP}train: {{epochs: 5000, batch_size: 32}}\nrun_cap: 4\nparameters:\n  lr: {{values: [0.001, 0.002, 0.003, 0.004]}}\nconcurrency: 2\nsplit: logical\n"
        ),
    );
    let out = dir.path().join("out");
    let mut run = start(
        dir.path(),
        &[
            "sweep",
            job.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--grace",
            "600",
        ],
    );
    let progress = out.join("progress.csv");
    assert!(run.wait_for(&|_| rows_in(&progress) >= 2), "no epoch ran");
    run.signal(libc::SIGTERM);
    assert!(
        run.wait_for(&|r| r.said("launching no more trials")),
        "the first signal was not taken"
    );
    run.signal(libc::SIGTERM);
    let (code, said, err) = run.finish();
    assert_eq!(code, Some(3), "{err}");
    let trials = read_csv(&out.join("trials.csv"));
    assert_eq!(trials.len(), 2, "the two running trials: {trials:?}");
    assert!(
        trials.iter().all(|t| t["state"] == "INTERRUPTED"),
        "{trials:?}"
    );
    assert!(
        said.contains("0 COMPLETE, 0 FAIL, 2 INTERRUPTED, 2 not started"),
        "{said}"
    );
}

#[test]
fn a_closed_stdout_stops_the_output_but_not_the_work_or_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    // One of three trials fails: the real result is exit code 1.
    let job = job(
        dir.path(),
        "f.yaml",
        &format!(
            "name: f\n{MLP}train: {{epochs: 2, batch_size: 32}}\nrun_cap: 3\nparameters:\n  lr: {{values: [0.001, 0.002, 0.003]}}\nconcurrency: 1\nsplit: logical\nfaults:\n  - {{trial: 1, kind: nan}}\n"
        ),
    );
    let out = dir.path().join("out");
    let mut child = Command::new(bin())
        .current_dir(dir.path())
        .args([
            "sweep",
            job.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `| head -1`: read one line, then close the pipe.
    let mut first = String::new();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    reader.read_line(&mut first).unwrap();
    drop(reader);
    assert!(first.starts_with("sweep f:"), "{first}");
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panick"), "{err}");
    assert!(!err.to_lowercase().contains("broken pipe"), "{err}");
    let trials = read_csv(&out.join("trials.csv"));
    assert_eq!(trials.len(), 3, "every trial ran: {trials:?}");
    assert!(out.join("best.yaml").exists(), "the sweep finished");

    // `2>&1 | head -1`: the log's lines go to the closed pipe too.
    let both = dir.path().join("both");
    let (read, write) = pipe();
    let mut child = Command::new(bin())
        .current_dir(dir.path())
        .args([
            "sweep",
            job.to_str().unwrap(),
            "--out",
            both.to_str().unwrap(),
        ])
        .stdout(Stdio::from(write.try_clone().unwrap()))
        .stderr(Stdio::from(write))
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(std::fs::File::from(read));
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    drop(reader);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "first line: {first}");
    assert_eq!(read_csv(&both.join("trials.csv")).len(), 3);

    // batch-scan under `| head -1` writes its whole CSV and exits 0.
    let scan = job_file_scan(dir.path());
    let out = dir.path().join("scan");
    let mut child = Command::new(bin())
        .current_dir(dir.path())
        .args([
            "batch-scan",
            scan.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--seconds",
            "0.05",
            "--max-batch",
            "64",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    drop(reader);
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Batch 1, 2, 4, ..., 64.
    assert_eq!(read_csv(&out.join("batch_scan.csv")).len(), 7);
}

/// A pipe: its read end and its write end.
fn pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the two descriptors, which are then owned here alone.
    let r = unsafe { libc::pipe(fds.as_mut_ptr()) };
    assert_eq!(r, 0);
    // SAFETY: as above; each descriptor is fresh and owned once.
    unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    }
}

fn job_file_scan(dir: &Path) -> PathBuf {
    job(
        dir,
        "scan.yaml",
        &format!("name: scan\n{MLP}split: logical\nmemory: {{mib_per_slice: 64}}\n"),
    )
}

/// Whether this machine has a GPU that the CUDA backend can use.
fn has_gpu(dir: &Path) -> bool {
    gpumux(dir, &["devices", "--backend", "cuda"]).status.code() == Some(0)
}

#[test]
fn every_command_maps_its_errors_to_the_exit_code_table() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let code = |args: &[&str]| {
        let o = gpumux(d, args);
        (o.status.code(), stderr(&o))
    };
    let with_job = ["train", "fib", "sweep", "parallel", "batch-scan"];
    // A missing job file is bad input (2), named in the message.
    for cmd in with_job {
        let (c, err) = code(&[cmd, "missing.yaml"]);
        assert_eq!(c, Some(2), "{cmd}: {err}");
        assert!(err.contains("missing.yaml"), "{cmd}: {err}");
    }
    let (c, err) = code(&["merge", "missing-dir", "--out", "m"]);
    assert_eq!(c, Some(2), "merge: {err}");
    // A bad flag is bad input (2), for every command.
    let job = job(
        d,
        "any.yaml",
        &format!(
            "name: any\n{MLP}split: logical\nrun_cap: 1\nparameters:\n  lr: {{values: [0.1]}}\n"
        ),
    );
    let job = job.to_str().unwrap();
    for cmd in with_job {
        let (c, err) = code(&[cmd, job, "--no-such-flag"]);
        assert_eq!(c, Some(2), "{cmd}: {err}");
    }
    for args in [
        &["devices", "--no-such-flag"][..],
        &["merge", "a", "--out", "b", "--no-such-flag"],
        &["report", "a", "--no-such-flag"],
        &["no-such-command"],
        &[],
    ] {
        let (c, err) = code(args);
        assert_eq!(c, Some(2), "{args:?}: {err}");
    }
    for args in [&["--help"][..], &["--version"], &["sweep", "--help"]] {
        assert_eq!(code(args).0, Some(0), "{args:?}");
    }
    // `--backend cuda` without a usable GPU is exit 4.
    if !has_gpu(d) {
        for cmd in with_job {
            let (c, err) = code(&[cmd, job, "--backend", "cuda"]);
            assert_eq!(c, Some(4), "{cmd}: {err}");
        }
        let (c, err) = code(&["devices", "--backend", "cuda"]);
        assert_eq!(c, Some(4), "devices: {err}");
    }
}

#[test]
fn sigterm_mid_run_gives_exit_3_for_every_long_running_command() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "j.yaml",
        &format!(
            "name: j\n{MLP}train: {{epochs: 400, batch_size: 32}}\nn: [1]\nsplits: [logical]\nsplit: logical\nmemory: {{mib_per_slice: 64}}\nrun_cap: 2\nparameters:\n  lr: {{values: [0.001, 0.002]}}\nconcurrency: 2\nparallel: {{slices: 2}}\n"
        ),
    );
    let job = job.to_str().unwrap();
    for cmd in ["train", "fib", "sweep", "parallel", "batch-scan"] {
        let out = dir.path().join(format!("out-{cmd}"));
        let mut args = vec![cmd, job];
        if cmd != "train" {
            args.extend(["--out", out.to_str().unwrap()]);
        }
        if cmd == "sweep" {
            args.extend(["--grace", "0"]);
        }
        let mut run = start(dir.path(), &args);
        // Mid-run: after its first measurement.
        let started = |r: &Running| {
            r.said("epoch   1")
                || r.said("batch       1")
                || rows_in(&out.join("progress.csv")) >= 1
        };
        assert!(run.wait_for(&started), "{cmd} did not start");
        run.signal(libc::SIGTERM);
        let (code, _, err) = run.finish();
        assert_eq!(code, Some(3), "{cmd}: {err}");
    }
}
