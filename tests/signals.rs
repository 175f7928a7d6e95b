//! Signals, exit codes and a closed stdout, on the real binary: every long-running command keeps what it measured and exits 3 on SIGTERM, a second signal stops at once, and each command maps its errors to the table of docs/reference/exit-codes.md.

mod support;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use support::*;

/// A small MLP on 2048 synthetic samples, on the CPU; each test adds what its command needs.
fn mlp_job(name: &str) -> JobYaml {
    JobYaml::new()
        .name(name)
        .model(mlp(&[64]))
        .data(synthetic(2048, 256))
        .backend("cpu")
}

/// 30,000 synthetic 3×64×64 samples, which take seconds to make.
fn big_data_job() -> JobYaml {
    JobYaml::new()
        .name("big")
        .model(mlp(&[16]))
        .data("{source: synthetic, shape: [3, 64, 64], train_samples: 30000, test_samples: 100}")
        .train(epochs(50, 64))
}

#[test]
fn batch_scan_keeps_each_row_it_measured_and_exits_3_on_sigterm() {
    let dir = sandbox();
    let job = job_file_scan(&dir);
    let out = dir.join("out");
    let mut run = dir
        .run(&["batch-scan", s(&job), "--out", s(&out), "--seconds", "2"])
        .watch();
    let csv = out.join("batch_scan.csv");
    assert!(
        run.wait_for(&|_| rows_in(&csv) >= 2),
        "no rows measured: {}",
        run.err()
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
    let dir = sandbox();
    let job = dir.job(
        "j.yaml",
        mlp_job("j")
            .train(epochs(400, 32))
            .n("[1, 2]")
            .splits("[logical]")
            .split("logical")
            .set("parallel", "{slices: 2}"),
    );
    let job = s(&job);
    // fib: the progress rows of the running trials are kept.
    let out = dir.join("fib");
    let mut run = dir.run(&["fib", job, "--out", s(&out)]).watch();
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
    let mut run = dir.run(&["train", job]).watch();
    assert!(run.wait_for(&|r| r.said("epoch   1")), "no epoch ran");
    run.signal(libc::SIGINT);
    let (code, said, err) = run.finish();
    assert_eq!(code, Some(3), "train: {err}");
    assert!(said.contains("epoch   1"), "{said}");
    assert!(err.contains("stopped by a signal"), "{err}");
    // parallel: the progress rows of the epochs done are kept.
    let out = dir.join("par");
    let mut run = dir.run(&["parallel", job, "--out", s(&out)]).watch();
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
    let dir = sandbox();
    let job = dir.job("big.yaml", big_data_job().backend("cpu"));
    let mut run = dir.run(&["train", s(&job)]).watch();
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
    let dir = sandbox();
    let job = dir.job(
        "big.yaml",
        big_data_job().n("[1]").splits("[shared]").backend("cpu"),
    );
    let out = dir.join("out");
    let mut run = dir.run(&["fib", s(&job), "--out", s(&out)]).watch();
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
    let dir = sandbox();
    let job = dir.job(
        "long.yaml",
        mlp_job("long")
            .train(epochs(5000, 32))
            .run_cap(4)
            .param("lr", values(&["0.001", "0.002", "0.003", "0.004"]))
            .concurrency(2)
            .split("logical"),
    );
    let out = dir.join("out");
    let mut run = dir
        .run(&["sweep", s(&job), "--out", s(&out), "--grace", "600"])
        .watch();
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
    two_running_trials_interrupted(&out, &said);
}

/// The sweep stopped with its two running trials INTERRUPTED, in trials.csv and in its summary,
/// and the other two never started.
fn two_running_trials_interrupted(out: &Path, said: &str) {
    let trials = trials_csv(out);
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
    let dir = sandbox();
    // One of three trials fails: the real result is exit code 1.
    let job = dir.job(
        "f.yaml",
        mlp_job("f")
            .train(epochs(2, 32))
            .run_cap(3)
            .param("lr", values(&["0.001", "0.002", "0.003"]))
            .concurrency(1)
            .split("logical")
            .fault("{trial: 1, kind: nan}"),
    );
    let out = dir.join("out");
    let mut child = dir.spawn(&["sweep", s(&job), "--out", s(&out)]);
    // `| head -1`: read one line, then close the pipe.
    let mut first = String::new();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    reader.read_line(&mut first).unwrap();
    drop(reader);
    assert!(first.starts_with("sweep f:"), "{first}");
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panick"), "{err}");
    assert!(!err.to_lowercase().contains("broken pipe"), "{err}");
    let trials = trials_csv(&out);
    assert_eq!(trials.len(), 3, "every trial ran: {trials:?}");
    assert!(out.join("best.yaml").exists(), "the sweep finished");

    // `2>&1 | head -1`: the log's lines go to the closed pipe too.
    let both = dir.join("both");
    let (read, write) = pipe();
    let mut child = dir
        .run(&["sweep", s(&job), "--out", s(&both)])
        .spawn_with(Stdio::from(write.try_clone().unwrap()), Stdio::from(write));
    let mut reader = BufReader::new(std::fs::File::from(read));
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    drop(reader);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "first line: {first}");
    assert_eq!(trials_csv(&both).len(), 3);

    // batch-scan under `| head -1` writes its whole CSV and exits 0.
    let scan = job_file_scan(&dir);
    let out = dir.join("scan");
    let mut child = dir.spawn(&[
        "batch-scan",
        s(&scan),
        "--out",
        s(&out),
        "--seconds",
        "0.05",
        "--max-batch",
        "64",
    ]);
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    drop(reader);
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
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

/// A batch scan in logical slices capped at 64 MiB.
fn job_file_scan(dir: &Sandbox) -> PathBuf {
    dir.job(
        "scan.yaml",
        mlp_job("scan")
            .split("logical")
            .memory("{mib_per_slice: 64}"),
    )
}

#[test]
fn every_command_maps_its_errors_to_the_exit_code_table() {
    let dir = sandbox();
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
    let job = dir.job(
        "any.yaml",
        mlp_job("any")
            .split("logical")
            .run_cap(1)
            .param("lr", values(&["0.1"])),
    );
    let job = s(&job);
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
    if !gpu_usable() {
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
    let dir = sandbox();
    let job = dir.job(
        "j.yaml",
        mlp_job("j")
            .train(epochs(400, 32))
            .n("[1]")
            .splits("[logical]")
            .split("logical")
            .memory("{mib_per_slice: 64}")
            .run_cap(2)
            .param("lr", values(&["0.001", "0.002"]))
            .concurrency(2)
            .set("parallel", "{slices: 2}"),
    );
    let job = s(&job);
    for cmd in ["train", "fib", "sweep", "parallel", "batch-scan"] {
        let out = dir.join(format!("out-{cmd}"));
        let mut args = vec![cmd, job];
        if cmd != "train" {
            args.extend(["--out", s(&out)]);
        }
        if cmd == "sweep" {
            args.extend(["--grace", "0"]);
        }
        let mut run = dir.run(&args).watch();
        // Mid-run: after its first measurement.
        let started = |r: &Watched| {
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

/// A sweep of two long trials at a time, each on its own thread, with `--grace 1`.
fn long_sweep(dir: &Sandbox) -> PathBuf {
    dir.job(
        "hup.yaml",
        mlp_job("hup")
            .train(epochs(5000, 32))
            .run_cap(4)
            .param("lr", values(&["0.001", "0.002", "0.003", "0.004"]))
            .concurrency(2)
            .split("logical"),
    )
}

#[test]
fn sighup_stops_a_sweep_like_sigterm() {
    // A closed terminal or ssh session: the running trials get the grace, then are recorded
    // INTERRUPTED, and gpumux exits 3.
    let dir = sandbox();
    let job = long_sweep(&dir);
    let out = dir.join("out");
    let mut run = dir
        .run(&["sweep", s(&job), "--out", s(&out), "--grace", "1"])
        .watch();
    assert!(
        run.wait_for(&|_| rows_in(&out.join("progress.csv")) >= 2),
        "no epoch ran"
    );
    run.signal(libc::SIGHUP);
    let (code, said, err) = run.finish();
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("SIGHUP: launching no more trials; running ones get 1 s"),
        "{err}"
    );
    two_running_trials_interrupted(&out, &said);
}

#[test]
fn under_nohup_sighup_is_left_ignored() {
    let dir = sandbox();
    let job = long_sweep(&dir);
    let out = dir.join("out");
    let child = std::process::Command::new("nohup")
        .arg(bin())
        .args(["sweep", s(&job), "--out", s(&out), "--grace", "0"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nohup gpumux starts");
    let mut run = Watched::new(child);
    let progress = out.join("progress.csv");
    assert!(run.wait_for(&|_| rows_in(&progress) >= 2), "no epoch ran");
    run.signal(libc::SIGHUP);
    // The sweep goes on: more epochs are written after the SIGHUP.
    let before = rows_in(&progress);
    assert!(
        run.wait_for(&|_| rows_in(&progress) >= before + 2),
        "it stopped: {}",
        run.err()
    );
    assert!(!run.said("SIGHUP"), "{}", run.err());
    run.signal(libc::SIGTERM);
    let (code, _, err) = run.finish();
    assert_eq!(code, Some(3), "{err}");
}

#[test]
fn a_signal_during_the_last_trials_gives_exit_0_when_they_all_complete() {
    // A job array's task signalled while its shard's last trial runs: the trial finishes within
    // the grace, and with every trial COMPLETE nothing is left to resume.
    let dir = sandbox();
    let job = dir.job(
        "last.yaml",
        mlp_job("last")
            .train(epochs(400, 32))
            .run_cap(1)
            .param("lr", values(&["0.001"]))
            .concurrency(1),
    );
    let out = dir.join("out");
    let mut run = dir
        .run(&["sweep", s(&job), "--out", s(&out), "--grace", "120"])
        .watch();
    assert!(
        run.wait_for(&|_| rows_in(&out.join("progress.csv")) >= 2),
        "no epoch ran"
    );
    run.signal(libc::SIGTERM);
    let (code, said, err) = run.finish();
    assert_eq!(code, Some(0), "{said}\n{err}");
    assert!(
        said.contains("a signal came while the last trials ran, but every trial is COMPLETE"),
        "{said}"
    );
    assert!(said.contains("1 COMPLETE, 0 FAIL, 0 INTERRUPTED"), "{said}");
}

/// A sweep output folder holding one COMPLETE trial with `rows` progress rows, written by the
/// project's own writer: long enough to read or copy that a signal lands in the middle.
fn big_results(out: &Path, rows: u32) {
    use gpumux::report::{write_rows, ProgressRow, TrialRow, PROGRESS_CSV, TRIALS_CSV};
    std::fs::create_dir_all(out).unwrap();
    let trial = TrialRow {
        trial_id: "earlier".into(),
        state: "COMPLETE".into(),
        epochs: rows,
        metric: Some(0.5),
        params: "{}".into(),
        ..Default::default()
    };
    write_rows(&out.join(TRIALS_CSV), &[trial]).unwrap();
    let progress: Vec<ProgressRow> = (1..=rows)
        .map(|epoch| ProgressRow {
            trial_id: "earlier".into(),
            epoch,
            train_loss: 1.0 / epoch as f64,
            test_acc: 0.5,
            wall_s: epoch as f64 * 0.01,
            ..Default::default()
        })
        .collect();
    write_rows(&out.join(PROGRESS_CSV), &progress).unwrap();
}

/// Whether a results file is being replaced in `dir` (its temporary file is there).
fn replacing(dir: &Path) -> bool {
    replacing_file(dir, "")
}

/// Whether a temporary file of a replacement of `name` (any file when empty) is in `dir`:
/// a rewrite under way (or one a kill left).
fn replacing_file(dir: &Path, name: &str) -> bool {
    let prefix = format!(".gpumux-tmp.{name}");
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
    })
}

#[test]
fn a_signal_stops_a_long_rewrite_or_merge_at_once_and_leaves_the_files_whole() {
    let dir = sandbox();
    let out = dir.join("out");
    big_results(&out, 1_000_000);
    let progress = out.join("progress.csv");
    let before = std::fs::read(&progress).unwrap();
    // A trial whose first epoch line brings a key the header lacks: progress.csv is rewritten
    // with a wider header, a million rows copied, while the trial sleeps.
    let script = dir.join("wide.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho '{\"epoch\": 1, \"test_acc\": 0.5, \"grad_norm\": 2.5}'\nsleep 60\n",
    )
    .unwrap();
    let job = dir.job(
        "wide.yaml",
        JobYaml::new()
            .name("wide")
            .command(&format!("sh {} {{lr}}", s(&script)))
            .run_cap(1)
            .param("lr", values(&["0.001"])),
    );
    let mut run = dir
        .run(&[
            "sweep",
            s(&job),
            "--out",
            s(&out),
            "--resume",
            "--grace",
            "0",
        ])
        .watch();
    // The rewrite of progress.csv itself (command.txt is replaced, briefly, at the start).
    assert!(
        run.wait_for(&|_| replacing_file(&out, "progress.csv.")),
        "the rewrite never started: {}",
        run.err()
    );
    let signalled = std::time::Instant::now();
    run.signal(libc::SIGTERM);
    let (code, said, err) = run.finish();
    let took = signalled.elapsed();
    assert_eq!(code, Some(3), "{said}\n{err}");
    // With no grace, the copy stops within a few thousand rows, long before its end (a million
    // rows), and the trial is stopped.
    assert!(
        took.as_secs_f64() < 3.0,
        "exit came {took:?} after the signal"
    );
    assert!(
        std::fs::read(&progress).unwrap() == before,
        "progress.csv changed"
    );
    assert!(!replacing(&out), "a temporary file was left");
    let trials = trials_csv(&out);
    let mine: Vec<_> = trials
        .iter()
        .filter(|t| t["trial_id"] != "earlier")
        .collect();
    assert_eq!(mine.len(), 1, "{trials:?}\n{said}\n{err}");
    assert_eq!(mine[0]["state"], "INTERRUPTED", "{trials:?}");

    // A merge of the same folder: a signal mid-copy stops it with exit 3, and what the output
    // folder held is left as it was.
    let merged = dir.join("merged");
    std::fs::create_dir_all(&merged).unwrap();
    std::fs::write(merged.join("notes.txt"), "mine").unwrap();
    let mut run = dir.run(&["merge", s(&out), "--out", s(&merged)]).watch();
    assert!(
        run.wait_for(&|_| replacing_file(&merged, "progress.csv.")),
        "the merge never wrote"
    );
    let signalled = std::time::Instant::now();
    run.signal(libc::SIGTERM);
    let (code, _, err) = run.finish();
    assert_eq!(code, Some(3), "{err}");
    assert!(signalled.elapsed().as_secs_f64() < 3.0, "{err}");
    let names: Vec<String> = std::fs::read_dir(&merged)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".gpumux"))
        .collect();
    assert_eq!(names, ["notes.txt"], "{err}");
    assert!(!replacing(&merged));
}
