//! Results files on the real binary: damaged files refused and left as they were, one writer per output folder, merges killed midway, cut rows, progress after a resume, fib merges, one exit-code table, non-finite metrics and a full disk.

mod support;
use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

use gpumux::report::{self, ProgressRow, TrialRow};

/// A sweep of `run_cap` trials of a small MLP on synthetic data, on the CPU.
fn sweep_job(run_cap: u64, epochs_: u32, samples: u32) -> JobYaml {
    JobYaml::new()
        .name("rf")
        .model(mlp(&[32]))
        .data(synthetic(samples, 128))
        .train(epochs(epochs_, 32))
        .run_cap(run_cap)
        .param(
            "lr",
            "{min: 0.0003, max: 0.01, distribution: log_uniform_values}",
        )
        .concurrency(2)
        .split("logical")
        .backend("cpu")
}

/// A fib of two rounds (N = 1 and 2) of one epoch each.
fn fib_job() -> JobYaml {
    JobYaml::new()
        .name("fibsmall")
        .model(mlp(&[16]))
        .data(synthetic(256, 64))
        .train(epochs(1, 32))
        .n("[1, 2]")
        .splits("[shared]")
        .backend("cpu")
}

/// A minute: how long a test waits for what a child should do.
const MINUTE: Duration = Duration::from_secs(60);

/// The trials.csv of `out`, read with the strict reader (a damaged file fails the test).
fn trials(out: &Path) -> Vec<TrialRow> {
    report::read_trials(out).unwrap_or_else(|e| panic!("{e}"))
}

fn progress(out: &Path) -> Vec<ProgressRow> {
    report::read_progress(out).unwrap_or_else(|e| panic!("{e}"))
}

/// Asserts that every trial is COMPLETE exactly once, and returns their ids.
fn complete_once(out: &Path, n: usize) -> HashSet<String> {
    let rows = trials(out);
    let complete: Vec<&TrialRow> = rows.iter().filter(|r| r.state == "COMPLETE").collect();
    let ids: HashSet<String> = complete.iter().map(|r| r.trial_id.clone()).collect();
    assert_eq!(complete.len(), n, "{rows:?}");
    assert_eq!(ids.len(), n, "no trial COMPLETE twice");
    ids
}

/// Each COMPLETE trial has one progress row per epoch, and no other trial has any.
fn one_progress_row_per_epoch(out: &Path, epochs: u32) {
    let done: HashSet<String> = trials(out)
        .into_iter()
        .filter(|r| r.state == "COMPLETE")
        .map(|r| r.trial_id)
        .collect();
    let mut seen: BTreeMap<(String, u32), usize> = BTreeMap::new();
    for p in progress(out) {
        *seen.entry((p.trial_id.clone(), p.epoch)).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "(trial, epoch) written twice: {twice:?}");
    let trials_seen: HashSet<&String> = seen.keys().map(|(t, _)| t).collect();
    assert_eq!(
        trials_seen,
        done.iter().collect::<HashSet<_>>(),
        "progress rows of COMPLETE trials only"
    );
    for t in &done {
        let n = seen.keys().filter(|(id, _)| id == t).count();
        assert_eq!(n, epochs as usize, "trial {t}: one row per epoch");
    }
}

#[test]
fn a_damaged_trials_csv_is_refused_and_left_byte_for_byte() {
    let dir = sandbox();
    let job = dir.job("j.yaml", sweep_job(3, 1, 256));
    let out = dir.join("out");
    assert_eq!(code(&dir.run_into("sweep", &job, &out, &[])), Some(0));
    let csv = out.join("trials.csv");
    let good = fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = good.lines().collect();
    let nul_row = lines[1].replacen("COMPLETE", "COMP\0ETE", 1);
    let damage: Vec<(&str, String)> = vec![
        ("a NUL line", "\0\0\0\0\0\0\0\0".into()),
        ("a garbage line", "garbage".into()),
        ("a row with a NUL byte", nul_row),
        ("a row of another shape", "a,b,c".into()),
    ];
    let progress_before = fs::read(out.join("progress.csv")).unwrap();
    for (what, line) in damage {
        // The damaged line stands between two whole rows (line 3 of the file), or last.
        for at in [2, lines.len()] {
            let mut l = lines.clone();
            l.insert(at, &line);
            let bad = format!("{}\n", l.join("\n"));
            fs::write(&csv, &bad).unwrap();
            for more in [&[][..], &["--resume"], &["--resume", "--dry-run"]] {
                let o = dir.run_into("sweep", &job, &out, more);
                let said = stderr(&o);
                assert_eq!(code(&o), Some(2), "{what} {more:?}: {said}");
                assert!(
                    said.contains("trials.csv") && said.contains(&format!("line {}", at + 1)),
                    "{what} {more:?}: {said}"
                );
                assert_eq!(
                    fs::read(&csv).unwrap(),
                    bad.as_bytes(),
                    "{what} {more:?}: the file is left as it was"
                );
                assert_eq!(fs::read(out.join("progress.csv")).unwrap(), progress_before);
            }
        }
    }
    // fib replaces earlier results, but never results it cannot read.
    let fib = dir.job("f.yaml", fib_job());
    let o = dir.gpumux(&["fib", s(&fib), "--out", s(&out)]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("trials.csv"), "{}", stderr(&o));
    assert_eq!(
        fs::read_to_string(&csv).unwrap().lines().last(),
        Some("a,b,c")
    );
}

#[test]
fn a_cut_last_row_is_dropped_by_resume_dry_run_merge_and_report() {
    let dir = sandbox();
    let job = dir.job("j.yaml", sweep_job(4, 1, 256));
    let out = dir.join("out");
    assert_eq!(code(&dir.run_into("sweep", &job, &out, &[])), Some(0));
    let csv = out.join("trials.csv");
    let whole = fs::read(&csv).unwrap();
    // A kill in the middle of the last row's write: its state (COMPLETE) is there, not its end.
    let cut = &whole[..whole.len() - 5];
    let last = String::from_utf8_lossy(&cut[cut.iter().rposition(|&b| b == b'\n').unwrap()..])
        .into_owned();
    assert!(last.contains("COMPLETE"), "{last}");
    fs::write(&csv, cut).unwrap();
    let o = dir.run_into("sweep", &job, &out, &["--resume", "--dry-run"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("3 already COMPLETE, 1 to run"),
        "{}",
        stdout(&o)
    );
    assert!(stderr(&o).contains("cut short"), "{}", stderr(&o));
    assert_eq!(fs::read(&csv).unwrap(), cut, "a dry run writes nothing");
    let merged = dir.join("merged");
    let o = dir.gpumux(&["merge", s(&out), "--out", s(&merged)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("merged 3 trials: 3 COMPLETE"),
        "{}",
        stdout(&o)
    );
    assert_eq!(trials(&merged).len(), 3);
    let reported = dir.join("reported");
    let o = dir.gpumux(&["report", s(&out), "--out", s(&reported)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(trials(&reported).len(), 3, "report drops it too");
    let o = dir.run_into("sweep", &job, &out, &["--resume"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    complete_once(&out, 4);
}

#[test]
fn two_sweeps_started_together_in_one_folder_one_refuses_naming_the_lock() {
    let dir = sandbox();
    let job = dir.job("j.yaml", sweep_job(6, 6, 2048));
    for more in [&[][..], &["--resume"]] {
        let out = dir.join(format!("out{}", more.len()));
        let mut args = vec!["sweep", s(&job), "--out", s(&out)];
        args.extend(more);
        let (a, b) = (dir.spawn(&args), dir.spawn(&args));
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let mut codes = vec![code(&a), code(&b)];
        codes.sort();
        assert_eq!(
            codes,
            vec![Some(0), Some(2)],
            "{more:?}\n{}\n{}",
            stderr(&a),
            stderr(&b)
        );
        let loser = if code(&a) == Some(2) { &a } else { &b };
        assert!(
            stderr(loser).contains(".gpumux.lock") && stderr(loser).contains("in use"),
            "{}",
            stderr(loser)
        );
        complete_once(&out, 6);
        assert_eq!(trials(&out).len(), 6, "one row per trial");
        one_progress_row_per_epoch(&out, 6);
    }
}

#[test]
fn a_sweep_killed_outright_leaves_no_stale_lock() {
    let dir = sandbox();
    let job = dir.job("j.yaml", sweep_job(4, 400, 2048));
    let out = dir.join("out");
    let mut child = dir.spawn(&["sweep", s(&job), "--out", s(&out)]);
    assert!(
        wait_for(&mut child, MINUTE, || rows_in(&out.join("progress.csv"))
            >= 1),
        "the sweep trains"
    );
    let o = dir.run_into("sweep", &job, &out, &["--resume"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("pid {}", child.id())),
        "names the process holding it: {}",
        stderr(&o)
    );
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    // The lock file is still there; its lock went with the process.
    assert!(out.join(".gpumux.lock").exists());
    let o = dir.gpumux(&["report", s(&out)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
}

#[test]
fn every_command_that_writes_a_folder_refuses_one_in_use() {
    let dir = sandbox();
    let job = dir.job("j.yaml", sweep_job(2, 1, 256));
    let fib = dir.job("f.yaml", fib_job());
    let src = dir.join("src");
    assert_eq!(code(&dir.run_into("sweep", &job, &src, &[])), Some(0));
    let busy = dir.join("busy");
    let o = dir.run_into("sweep", &job, &busy, &[]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let before: BTreeMap<String, Vec<u8>> = fs::read_dir(&busy)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.display().to_string(), fs::read(&p).unwrap()))
        .collect();
    // This test process holds the folder, as another gpumux would.
    let held = gpumux::outdir::lock(&busy).unwrap();
    let b = s(&busy);
    let commands: Vec<Vec<&str>> = vec![
        vec!["sweep", s(&job), "--out", b, "--resume"],
        vec!["fib", s(&fib), "--out", b],
        vec!["merge", s(&src), "--out", b],
        vec!["report", s(&src), "--out", b],
        vec!["report", b],
        vec![
            "parallel",
            s(&fib),
            "--slices",
            "2",
            "--epochs",
            "1",
            "--out",
            b,
        ],
        vec![
            "batch-scan",
            s(&fib),
            "--max-batch",
            "2",
            "--seconds",
            "0.05",
            "--out",
            b,
        ],
    ];
    for args in &commands {
        let o = dir.gpumux(args);
        assert_eq!(code(&o), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(".gpumux.lock")
                && stderr(&o).contains(&format!("pid {}", std::process::id())),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    let after: BTreeMap<String, Vec<u8>> = fs::read_dir(&busy)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.display().to_string(), fs::read(&p).unwrap()))
        .collect();
    let lock = busy.join(".gpumux.lock").display().to_string();
    let strip = |m: &BTreeMap<String, Vec<u8>>| {
        m.iter()
            .filter(|(k, _)| **k != lock)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        strip(&after),
        strip(&before),
        "nothing in the folder changed"
    );
    drop(held);
    let o = dir.gpumux(&["report", b]);
    assert_eq!(code(&o), Some(0), "free again: {}", stderr(&o));
}

/// A sweep folder of `n` COMPLETE trials with `epochs` progress rows each, made by the library.
fn big_folder(dir: &Path, prefix: &str, n: usize, epochs: u32) {
    let trials: Vec<TrialRow> = (0..n)
        .map(|i| TrialRow {
            trial_id: format!("{prefix}{i:012x}"),
            split: "logical".into(),
            n: 4,
            model: "mlp".into(),
            state: "COMPLETE".into(),
            test_acc: Some(0.5 + (i % 100) as f64 / 1000.0),
            final_loss: Some(0.25),
            metric: Some(0.5 + (i % 100) as f64 / 1000.0),
            params: format!("{{\"lr\":{}}}", 1e-3 * (1.0 + i as f64 / n as f64)),
            ..TrialRow::default()
        })
        .collect();
    let progress: Vec<ProgressRow> = trials
        .iter()
        .flat_map(|t| {
            (1..=epochs).map(|e| ProgressRow {
                trial_id: t.trial_id.clone(),
                split: "logical".into(),
                n: 4,
                epoch: e,
                ..ProgressRow::default()
            })
        })
        .collect();
    report::write_all(dir, &[], &trials, &progress).unwrap();
}

#[test]
fn a_merge_killed_midway_leaves_its_output_old_or_whole() {
    let dir = sandbox();
    let (a, b, out) = (dir.join("a"), dir.join("b"), dir.join("merged"));
    big_folder(&a, "a", 60_000, 3);
    big_folder(&b, "b", 60_000, 3);
    let o = dir.gpumux(&["merge", s(&a), "--out", s(&out)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let old_trials = fs::read(out.join("trials.csv")).unwrap();
    let old_progress = fs::read(out.join("progress.csv")).unwrap();
    let mut child = dir.spawn(&["merge", s(&a), s(&b), "--out", s(&out)]);
    // Kill it at its first write into the output folder: a temporary file, or a changed file.
    let writing = || {
        let tmp = fs::read_dir(&out)
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            })
            .unwrap_or(false);
        let changed = |name: &str, old: &[u8]| {
            fs::metadata(out.join(name)).map_or(true, |m| m.len() != old.len() as u64)
        };
        tmp || changed("trials.csv", &old_trials) || changed("progress.csv", &old_progress)
    };
    let caught = wait_for(&mut child, MINUTE, writing);
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    assert!(caught, "the merge was seen writing");
    let now = trials(&out).len();
    assert!(now == 60_000 || now == 120_000, "old or whole new: {now}");
    let epochs = progress(&out).len();
    assert!(epochs == 180_000 || epochs == 360_000, "{epochs}");
    // Run to its end, the merge gives the whole new output.
    let o = dir.gpumux(&["merge", s(&a), s(&b), "--out", s(&out)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(trials(&out).len(), 120_000);
    let left: Vec<String> = fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(
        left.is_empty(),
        "the killed merge's leftovers are gone: {left:?}"
    );
}

#[test]
fn a_resumed_sweep_has_one_progress_row_per_trial_and_epoch() {
    let dir = sandbox();
    let job = dir.job("j.yaml", sweep_job(6, 8, 4096));
    for sig in [libc::SIGKILL, libc::SIGTERM] {
        let out = dir.join(format!("out{sig}"));
        let mut child = dir.spawn(&["sweep", s(&job), "--out", s(&out), "--grace", "0"]);
        // Killed in the middle of a trial: some of its epochs are written, not its row.
        assert!(
            wait_for(&mut child, MINUTE, || {
                rows_in(&out.join("progress.csv")) >= 3 + 8 * rows_in(&out.join("trials.csv"))
            }),
            "the sweep trains"
        );
        signal(&child, sig);
        let o = child.wait_with_output().unwrap();
        if sig == libc::SIGTERM {
            assert_eq!(code(&o), Some(3), "{}", stderr(&o));
        }
        let o = dir.run_into("sweep", &job, &out, &["--resume"]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        complete_once(&out, 6);
        one_progress_row_per_epoch(&out, 8);
    }
}

#[test]
fn merging_fib_runs_is_refused_and_report_keeps_every_row() {
    let dir = sandbox();
    let fib = dir.job("f.yaml", fib_job());
    let (a, b) = (dir.join("a"), dir.join("b"));
    for out in [&a, &b] {
        let o = dir.gpumux(&["fib", s(&fib), "--out", s(out)]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    }
    let each = trials(&a).len();
    assert_eq!(each, 3, "N = 1 and N = 2: t000 twice, t001 once");
    let merged = dir.join("merged");
    let o = dir.gpumux(&["merge", s(&a), s(&b), "--out", s(&merged)]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("fib run") && stderr(&o).contains("gpumux report"),
        "{}",
        stderr(&o)
    );
    assert!(!merged.join("trials.csv").exists());
    let reported = dir.join("reported");
    let o = dir.gpumux(&["report", s(&a), s(&b), "--out", s(&reported)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(
        trials(&reported).len(),
        2 * each,
        "every run's rows are kept"
    );
    assert_eq!(report::read_runs(&reported).unwrap().len(), 4);
}

#[test]
fn report_and_merge_give_the_same_exit_code_for_the_same_folder() {
    let dir = sandbox();
    let job = dir.job("j.yaml", sweep_job(2, 1, 256));
    let good = dir.join("good");
    assert_eq!(code(&dir.run_into("sweep", &job, &good, &[])), Some(0));
    let text = fs::read(good.join("trials.csv")).unwrap();
    let folder = |name: &str, trials: Option<&[u8]>| {
        let d = dir.join(name);
        fs::create_dir_all(&d).unwrap();
        if let Some(t) = trials {
            fs::write(d.join("trials.csv"), t).unwrap();
        }
        d
    };
    let mut garbage = text.clone();
    let first = garbage.iter().position(|&b| b == b'\n').unwrap() + 1;
    garbage.splice(first..first, b"\0\0\0garbage\n".iter().copied());
    let endless = folder("endless", None);
    std::os::unix::fs::symlink("/dev/zero", endless.join("trials.csv")).unwrap();
    let cases = [
        (dir.join("missing"), 2),
        (endless, 2),
        (folder("empty", None), 2),
        (folder("garbage", Some(&garbage)), 2),
        (folder("cut", Some(&text[..text.len() - 3])), 0),
        (folder("header-only", Some(&text[..first])), 0),
    ];
    for (i, (d, want)) in cases.iter().enumerate() {
        let runs: [Vec<String>; 3] = [
            vec!["report".into(), s(d).into()],
            vec![
                "report".into(),
                s(d).into(),
                "--out".into(),
                format!("{}/r{i}", dir.path().display()),
            ],
            vec![
                "merge".into(),
                s(d).into(),
                "--out".into(),
                format!("{}/m{i}", dir.path().display()),
            ],
        ];
        for args in &runs {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = dir.gpumux(&args);
            assert_eq!(code(&o), Some(*want), "{args:?}: {}", stderr(&o));
            if *want == 2 {
                assert!(
                    stderr(&o).contains(s(d)),
                    "names the folder: {}",
                    stderr(&o)
                );
            }
        }
    }
    assert!(
        !dir.join("missing").exists(),
        "a missing folder is not made"
    );
}

#[test]
fn non_finite_metrics_never_make_the_best_trial() {
    let dir = sandbox();
    let out = dir.join("out");
    let row = |id: &str, acc: f64, loss: f64, metric: f64| TrialRow {
        trial_id: id.into(),
        split: "logical".into(),
        model: "mlp".into(),
        state: "COMPLETE".into(),
        test_acc: Some(acc),
        final_loss: Some(loss),
        metric: Some(metric),
        params: "{}".into(),
        ..TrialRow::default()
    };
    let rows = vec![
        row("t-nan-metric", 0.99, 0.1, f64::NAN),
        row("t-inf-loss", 0.98, f64::INFINITY, 0.98),
        row("t-inf-metric", 0.97, 0.1, f64::INFINITY),
        row("t-finite", 0.5, 0.7, 0.5),
    ];
    report::write_all(&out, &[], &rows, &[]).unwrap();
    let o = dir.gpumux(&["report", s(&out)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("best trial t-finite"), "{}", stdout(&o));
    let merged = dir.join("merged");
    for goal in ["maximize", "minimize"] {
        let o = dir.gpumux(&["merge", s(&out), "--out", s(&merged), "--goal", goal]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        assert!(
            stdout(&o).contains("best trial t-finite"),
            "{goal}: {}",
            stdout(&o)
        );
    }
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        fs::create_dir_all(at).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_stops_the_sweep_with_exit_1_and_keeps_every_row_before() {
    let dir = sandbox();
    let disk = dir.join("disk");
    let Some(_mounted) = Tmpfs::mount(&disk, "64k") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let job = dir.job("j.yaml", sweep_job(40, 1, 256));
    let out = disk.join("out");
    // Fill the disk, then free five pages: the lock file, the three headers, and a few rows.
    let filler = disk.join("filler");
    {
        use std::io::Write;
        let mut f = fs::File::create(&filler).unwrap();
        while f
            .write_all(&[b'x'; 4096])
            .and_then(|()| f.sync_all())
            .is_ok()
        {}
    }
    let len = fs::metadata(&filler).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&filler)
        .unwrap()
        .set_len(len.saturating_sub(5 * 4096))
        .unwrap();
    let o = dir.run_into("sweep", &job, &out, &[]);
    let said = stderr(&o);
    for name in ["trials.csv", "progress.csv"] {
        let bytes = fs::read(out.join(name)).unwrap();
        assert_eq!(
            bytes.last(),
            Some(&b'\n'),
            "{name} ends with a whole row: {said}"
        );
    }
    assert_eq!(code(&o), Some(1), "{said}");
    assert!(
        said.contains("No space left on device") && said.contains("cannot write"),
        "{said}"
    );
    let kept = trials(&out);
    let _ = progress(&out);
    eprintln!("{} rows before the disk was full", kept.len());
    assert!(kept.len() < 40, "it stopped: {} rows", kept.len());
    fs::remove_file(&filler).unwrap();
    let o = dir.run_into("sweep", &job, &out, &["--resume"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    complete_once(&out, 40);
    for r in kept.iter().filter(|r| r.state == "COMPLETE") {
        assert!(
            trials(&out).contains(r),
            "row {} kept as it was",
            r.trial_id
        );
    }
}

/// The `earlier-*` folders a run set aside in `dir`.
fn earlier_folders(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("earlier-")
        })
        .collect()
}

#[test]
fn a_command_never_replaces_another_commands_results_and_sets_its_own_aside() {
    let dir = sandbox();
    let sweep = dir.job("s.yaml", sweep_job(3, 1, 256));
    let fib = dir.job("f.yaml", fib_job());
    let swept = dir.join("swept");
    let o = dir.gpumux(&["sweep", s(&sweep), "--out", s(&swept)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let before: Vec<(String, Vec<u8>)> = ["trials.csv", "progress.csv"]
        .iter()
        .map(|n| (n.to_string(), fs::read(swept.join(n)).unwrap()))
        .collect();
    // fib, parallel and batch-scan refuse a sweep's folder, and leave it byte for byte.
    for args in [
        vec!["fib", s(&fib), "--out", s(&swept)],
        vec!["parallel", s(&sweep), "--out", s(&swept), "--epochs", "1"],
        vec!["batch-scan", s(&sweep), "--out", s(&swept)],
    ] {
        let o = dir.gpumux(&args);
        assert_eq!(code(&o), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("did not write"), "{}", stderr(&o));
        for (name, bytes) in &before {
            assert_eq!(
                &fs::read(swept.join(name)).unwrap(),
                bytes,
                "{name} after {args:?}"
            );
        }
    }
    // A second fib into its own folder moves the first one's results aside, whole.
    let out = dir.join("fib");
    for _ in 0..2 {
        let o = dir.gpumux(&["fib", s(&fib), "--out", s(&out)]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    }
    let earlier = earlier_folders(&out);
    assert_eq!(earlier.len(), 1, "{earlier:?}");
    assert_eq!(
        trials(&earlier[0]).len(),
        3,
        "the first run's rows are kept"
    );
    assert_eq!(trials(&out).len(), 3);
}

#[test]
fn a_merge_into_a_folder_of_other_results_sets_them_aside_and_a_remerge_replaces_its_own() {
    let dir = sandbox();
    let (a, b, c) = (dir.join("a"), dir.join("b"), dir.join("c"));
    for (out, cap) in [(&a, 2), (&b, 3), (&c, 1)] {
        let job = dir.job(
            &format!("{}.yaml", out.file_name().unwrap().to_string_lossy()),
            sweep_job(cap, 1, 256).seed(cap),
        );
        let o = dir.gpumux(&["sweep", s(&job), "--out", s(out)]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    }
    // A merge of a and b into c, which holds a sweep of its own: c's row is set aside, whole.
    let c_rows = fs::read(c.join("trials.csv")).unwrap();
    let o = dir.gpumux(&["merge", s(&a), s(&b), "--out", s(&c)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(trials(&c).len(), 5);
    let aside = earlier_folders(&c);
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(fs::read(aside[0].join("trials.csv")).unwrap(), c_rows);
    // The same merge again replaces its own earlier merge: nothing of it is lost.
    let o = dir.gpumux(&["merge", s(&a), s(&b), "--out", s(&c)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(trials(&c).len(), 5);
    assert_eq!(earlier_folders(&c).len(), 1, "no second folder set aside");
}

/// `gpumux sweep` of `job` into `out` with `more` flags, ended after 20 s at most.
fn sweep_within(dir: &Sandbox, job: &Path, out: &Path, more: &[&str]) -> std::process::Output {
    let mut args = vec!["sweep", s(job), "--out", s(out)];
    args.extend(more);
    dir.run(&args).timeout(Duration::from_secs(20)).output()
}

#[test]
fn a_fifo_a_link_or_a_folder_in_a_results_files_place_is_refused_at_once() {
    let dir = sandbox();
    let job = dir.job("rf.yaml", sweep_job(4, 1, 256));
    let outside = dir.join("outside");
    fs::create_dir(&outside).unwrap();
    type Plant<'a> = &'a dyn Fn(&Path);
    let planted: [(&str, Plant); 4] = [
        ("a FIFO", &|p: &Path| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: mkfifo(3) on a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        }),
        ("a symbolic link", &|p: &Path| {
            fs::write(outside.join("target.csv"), "keep me\n").unwrap();
            std::os::unix::fs::symlink(outside.join("target.csv"), p).unwrap();
        }),
        ("a symbolic link", &|p: &Path| {
            std::os::unix::fs::symlink(outside.join("dangling.csv"), p).unwrap();
        }),
        ("a folder", &|p: &Path| fs::create_dir(p).unwrap()),
    ];
    for name in ["trials.csv", "progress.csv", "runs.csv"] {
        for (what, plant) in &planted {
            let out = dir.join(format!("out-{name}-{}", what.len()));
            let _ = fs::remove_dir_all(&out);
            fs::create_dir(&out).unwrap();
            plant(&out.join(name));
            for more in [&["--dry-run"][..], &[][..], &["--resume"][..]] {
                let o = sweep_within(&dir, &job, &out, more);
                let err = stderr(&o);
                assert_eq!(o.status.code(), Some(2), "{name} {what} {more:?}: {err}");
                assert!(
                    err.contains(name) && err.contains(what),
                    "{name} {what} {more:?}: {err}"
                );
            }
        }
    }
    // Nothing was written through the links.
    assert_eq!(
        fs::read_to_string(outside.join("target.csv")).unwrap(),
        "keep me\n"
    );
    assert!(!outside.join("dangling.csv").exists());
    // A `trials/` link: no trial folder is made through it.
    let out = dir.join("out-trials");
    fs::create_dir(&out).unwrap();
    std::os::unix::fs::symlink(&outside, out.join("trials")).unwrap();
    let ext = dir.job(
        "ext.yaml",
        JobYaml::new()
            .name("ext")
            .command("sh -c 'echo {{\"test_acc\": 0.5}}' {out_dir}")
            .run_cap(2)
            .param("x", "{min: 0.0, max: 1.0}"),
    );
    let o = sweep_within(&dir, &ext, &out, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("trials is a link"), "{}", stderr(&o));
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        1,
        "only target.csv"
    );
    // A link planted in `trials/` in the place of a trial's folder, before the run, or between
    // the check and the trial (a bayes sweep's trials are named as they come): refused, nothing
    // written through it.
    let out = dir.join("out-trial-folder");
    fs::create_dir_all(out.join("trials")).unwrap();
    std::os::unix::fs::symlink(&outside, out.join("trials").join("planted")).unwrap();
    let o = sweep_within(&dir, &ext, &out, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("planted is a link"), "{}", stderr(&o));
    fs::remove_file(out.join("trials").join("planted")).unwrap();
    let listed = dir
        .run(&["sweep", s(&ext), "--out", s(&out), "--dry-run"])
        .output();
    let first = stdout(&listed)
        .lines()
        .find_map(|l| {
            l.split_whitespace()
                .next()
                .filter(|w| w.len() == 16)
                .map(str::to_string)
        })
        .expect("a trial id in the dry run");
    let maker = gpumux::outdir::make_dir_within(&out, &["trials", &first]);
    assert!(maker.is_ok());
    fs::remove_dir(out.join("trials").join(&first)).unwrap();
    std::os::unix::fs::symlink(&outside, out.join("trials").join(&first)).unwrap();
    let err = gpumux::outdir::make_dir_within(&out, &["trials", &first]).unwrap_err();
    assert!(err.to_string().contains("is a link"), "{err}");
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        1,
        "only target.csv"
    );
}

#[test]
fn a_file_size_limit_is_a_write_error_that_names_it_and_keeps_whole_rows() {
    // Under `ulimit -f 1` (one block: 512 bytes in sh, 1 KiB in bash) the results outgrow the
    // limit: exit 1, a message naming the file and the limit (not SIGXFSZ's silent exit 153),
    // and every row kept whole.
    let dir = sandbox();
    let job = dir.job("rf.yaml", sweep_job(6, 1, 256));
    let out = dir.join("out");
    let script = format!(
        "ulimit -f 1; exec {} sweep {} --out {}",
        bin().display(),
        job.display(),
        out.display()
    );
    let o = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("trials.csv: cannot write"), "{err}");
    assert!(err.contains("the file-size limit (ulimit -f) is "), "{err}");
    for name in ["trials.csv", "progress.csv"] {
        let text = fs::read(out.join(name)).unwrap();
        assert!(
            text.len() <= 1024 && text.ends_with(b"\n"),
            "{name}: {text:?}"
        );
    }
    // The rows read, and a resume without the limit finishes the sweep.
    let before = trials(&out).len();
    assert!(before < 6, "{before}");
    let o = dir.run_into("sweep", &job, &out, &["--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    complete_once(&out, 6);
}

#[test]
fn a_trial_whose_progress_rows_were_not_all_written_is_never_complete() {
    // Under a file-size limit progress.csv (three rows a trial) fills before trials.csv: at
    // whatever epoch its write fails, no trial is recorded COMPLETE without all its epochs.
    let dir = sandbox();
    let job = dir.job("rf.yaml", sweep_job(12, 3, 256).concurrency(1));
    for blocks in 2..=9 {
        let out = dir.join(format!("out{blocks}"));
        let script = format!(
            "ulimit -f {blocks}; exec {} sweep {} --out {}",
            bin().display(),
            job.display(),
            out.display()
        );
        let o = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{blocks}: {}", stderr(&o));
        let epochs: HashSet<(String, u32)> = progress(&out)
            .into_iter()
            .map(|p| (p.trial_id, p.epoch))
            .collect();
        for r in trials(&out) {
            if r.state == "COMPLETE" {
                for e in 1..=3 {
                    assert!(
                        epochs.contains(&(r.trial_id.clone(), e)),
                        "{blocks}: {} COMPLETE without epoch {e}",
                        r.trial_id
                    );
                }
            }
            if r.error.contains("progress rows could not all be written") {
                assert_eq!(r.state, "FAIL", "{r:?}");
            }
        }
    }
}
