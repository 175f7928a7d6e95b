//! External-command sweeps on the real binary: templates checked at load and filled with the trial's own names, epochs and best.yaml of external trials, a result without the metric, output in bounded memory, and daemons that try to outlive their trial.

mod support;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::*;

/// A job running `command` (YAML-quoted here) for `trials` trials of parameter `lr` (0.1,
/// 0.2, …), all at once.
fn command_job(dir: &Sandbox, name: &str, command: &str, trials: usize) -> PathBuf {
    let lrs: Vec<String> = (1..=trials).map(|i| format!("0.{i}")).collect();
    dir.command_job(name, command, &lrs, trials)
}

#[test]
fn an_unknown_placeholder_is_bad_input_at_load_even_in_a_dry_run() {
    let dir = sandbox();
    let typo = command_job(&dir, "typo", "echo --lr {lr} --m {momentm}", 2);
    for extra in [&["--dry-run"][..], &[]] {
        let out = dir.join("out");
        let o = dir.run_into("sweep", &typo, &out, extra);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains("{momentm}"), "{err}");
        assert!(
            err.contains("known: batch_size, dropout, epochs, lr"),
            "{err}"
        );
        assert!(err.contains("command"), "{err}");
        assert!(
            !stdout(&o).contains("results would go"),
            "nothing is planned"
        );
        assert!(!out.exists(), "nothing is written");
    }
    // A brace that is not closed is found as early.
    let brace = command_job(&dir, "brace", "echo {lr", 1);
    let o = dir.gpumux(&["sweep", s(&brace), "--dry-run"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("unclosed"), "{}", stderr(&o));
    // Known names, escaped braces and parameters of the space pass.
    let fine = dir.job(
        "ok.yaml",
        JobYaml::new()
            .name("ok")
            .command("echo {{x}} {lr} {width}")
            .method("grid")
            .param("lr", values(&["0.1"]))
            .param("width", values(&["8"]))
            .concurrency(1),
    );
    let o = dir.gpumux(&["sweep", s(&fine), "--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// The thread-pool variables gpumux sets for every external trial.
const THREAD_VARS: [&str; 8] = [
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "PJRT_NPROC",
];

#[test]
fn each_trial_gets_its_share_of_the_cores_and_no_gpu_variables_on_the_cpu() {
    let dir = sandbox();
    // The trial prints what it was given in its result line, and keeps it in a file by trial.
    let keys: Vec<&str> = THREAD_VARS
        .iter()
        .copied()
        .chain(["GPUMUX_THREADS", "XLA_FLAGS", "GPUMUX_MEM_CAP_MIB"])
        .chain([
            "XLA_PYTHON_CLIENT_MEM_FRACTION",
            "XLA_PYTHON_CLIENT_PREALLOCATE",
        ])
        .collect();
    let py = format!(
        "import json, os\n\
         got = {{k: os.environ.get(k) for k in {keys:?}}}\n\
         with open('seen-' + os.environ['GPUMUX_TRIAL'] + '.json', 'w') as f:\n\
         \x20   json.dump(got, f)\n\
         print(json.dumps({{'test_acc': 0.5, 'omp_num_threads': int(got['OMP_NUM_THREADS'])}}))\n"
    );
    std::fs::write(dir.join("env.py"), py).unwrap();
    let job = dir.job(
        "threads.yaml",
        JobYaml::new()
            .name("threads")
            .command("python3 env.py {lr}")
            .method("grid")
            .param("lr", values(&["0.1", "0.2", "0.3"]))
            .backend("cpu")
            .split("logical")
            .memory("{mib_per_slice: 64}")
            .concurrency(2),
    );
    let out = dir.join("out");
    let mut run = dir
        .run(&["sweep", s(&job), "--out", s(&out)])
        .env("MKL_NUM_THREADS", "5")
        .env("XLA_FLAGS", "--xla_cpu_enable_fast_math=false");
    for name in THREAD_VARS.iter().filter(|n| **n != "MKL_NUM_THREADS") {
        run = run.env_remove(name);
    }
    let o = run.output();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = (cores / 2).max(1).to_string();
    let rows = trials_csv(&out);
    assert_eq!(rows.len(), 3);
    for r in &rows {
        assert_eq!(r["state"], "COMPLETE", "{r:?}");
        assert!(!r["mem_cap_mib"].is_empty(), "the slices are capped: {r:?}");
        let seen = std::fs::read_to_string(dir.join(format!("seen-{}.json", r["trial_id"])));
        let seen: std::collections::BTreeMap<String, Option<String>> =
            serde_json::from_str(&seen.unwrap()).unwrap();
        let got = |k: &str| seen[k].clone();
        for name in THREAD_VARS.iter().chain(&["GPUMUX_THREADS"]) {
            // The user's own setting wins over the share.
            let want = if *name == "MKL_NUM_THREADS" {
                "5"
            } else {
                share.as_str()
            };
            assert_eq!(got(name).as_deref(), Some(want), "{name}: {seen:?}");
        }
        // The user's XLA_FLAGS reach the command as they are: XLA aborts on words it does not
        // know, and sizes its pool by PJRT_NPROC.
        assert_eq!(
            got("XLA_FLAGS").as_deref(),
            Some("--xla_cpu_enable_fast_math=false"),
            "{seen:?}"
        );
        // A memory cap means nothing to a command on the CPU.
        for gpu_only in ["GPUMUX_MEM_CAP_MIB", "XLA_PYTHON_CLIENT_MEM_FRACTION"] {
            assert_eq!(got(gpu_only), None, "{gpu_only}: {seen:?}");
        }
        assert_eq!(got("XLA_PYTHON_CLIENT_PREALLOCATE"), None, "{seen:?}");
    }
}

#[test]
fn the_trials_names_reach_its_command_and_its_folder_survives_a_resume() {
    let dir = sandbox();
    // Trial lr=0.2 fails on its first run and leaves a mark in its folder; run again, it finds
    // the mark and reports `epochs` itself. Both print three epoch lines.
    dir.script(
        "names.sh",
        r#"echo "$2 $3 $4" > "$5/names.txt"
echo '{"epoch": 1}'; echo '{"epoch": 2}'; echo '{"epoch": 3}'
if [ "$1" = "0.2" ] && [ ! -e "$5/tried" ]; then touch "$5/tried"; echo boom >&2; exit 1; fi
if [ "$1" = "0.2" ]; then echo '{"test_acc": 0.9, "epochs": 5}'; else echo '{"test_acc": 0.5}'; fi
"#,
    );
    let job = command_job(
        &dir,
        "names",
        "./names.sh {lr} {seed} {trial_id} {slice} {out_dir}",
        2,
    );
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &["--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let o = dir.run_into("sweep", &job, &out, &["--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = trials_csv(&out);
    let complete: Vec<&Row> = rows.iter().filter(|r| r["state"] == "COMPLETE").collect();
    assert_eq!(complete.len(), 2, "{rows:?}");
    for r in complete {
        let id = &r["trial_id"];
        let folder = out.join("trials").join(id);
        let names = std::fs::read_to_string(folder.join("names.txt")).unwrap();
        assert_eq!(
            names.trim(),
            format!("{} {id} {}", r["seed"], r["slice"]),
            "{r:?}"
        );
        // Three epoch lines, or the `epochs` the result line gives.
        let lr2 = folder.join("tried").exists();
        assert_eq!(r["epochs"], if lr2 { "5" } else { "3" }, "{r:?}");
    }
    // best.yaml lists the one parameter the command received.
    let best: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(out.join("best.yaml")).unwrap()).unwrap();
    let params = best["parameters"].as_mapping().unwrap();
    let names: Vec<&str> = params.keys().filter_map(|k| k.as_str()).collect();
    assert_eq!(names, ["lr"], "{best:?}");
    assert_eq!(best["parameters"]["lr"]["value"].as_f64(), Some(0.2));
}

#[test]
fn a_parameter_named_like_a_trials_own_name_is_refused_at_load() {
    let dir = sandbox();
    for name in ["seed", "trial_id", "slice", "out_dir"] {
        let job = dir.job(
            &format!("{name}.yaml"),
            JobYaml::new()
                .name(name)
                .command("echo {lr} {seed}")
                .method("grid")
                .param("lr", values(&["0.1"]))
                .param(name, values(&["1"]))
                .concurrency(1),
        );
        for extra in [&["--dry-run"][..], &[]] {
            let out = dir.join(format!("out-{name}"));
            let o = dir.run_into("sweep", &job, &out, extra);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{name} {extra:?}: {err}");
            assert!(err.contains(&format!("parameters.{name}")), "{err}");
            assert!(err.contains("rename the parameter"), "{err}");
            assert!(!out.exists(), "nothing is written");
        }
    }
}

#[test]
fn a_result_without_the_sweeps_metric_is_a_failed_trial() {
    let dir = sandbox();
    // The metric is test_acc (the default); the command reports loss only, or test_acc: null.
    let cases = [
        ("loss", r#"echo "{\"loss\": $1}""#),
        ("null", r#"echo "{\"test_acc\": null, \"loss\": $1}""#),
    ];
    for (name, body) in cases {
        dir.script(&format!("{name}.sh"), &format!("{body}\n"));
        let job = command_job(&dir, name, &format!("./{name}.sh {{lr}}"), 2);
        let out = dir.join(name);
        let o = dir.run_into("sweep", &job, &out, &[]);
        assert_eq!(o.status.code(), Some(1), "{name}: {}", stderr(&o));
        let rows = trials_csv(&out);
        assert_eq!(rows.len(), 2);
        for r in &rows {
            assert_eq!(r["state"], "FAIL", "{r:?}");
            assert_eq!(
                r["error"], "no value for metric test_acc in the trial's result",
                "{r:?}"
            );
        }
        assert!(!out.join("best.yaml").exists(), "no trial to rank");
        // A resumed sweep runs them again: they are not COMPLETE.
        let o = dir.run_into("sweep", &job, &out, &["--resume", "--dry-run"]);
        assert!(
            stdout(&o).contains("0 already COMPLETE, 2 to run"),
            "{}",
            stdout(&o)
        );
    }
}

/// A gpumux run whose own peak resident memory is measured: wait4's figure for the gpumux
/// process (the largest of it and of the children it waited for).
struct Measured {
    pid: i32,
    started: Instant,
}

impl Measured {
    /// Starts gpumux with `args` in `dir`, its output dropped.
    // The child is waited for with wait4(2), which gives its resource usage, not with
    // `Child::wait`.
    #[allow(clippy::zombie_processes)]
    fn start(dir: &Path, args: &[&str]) -> Measured {
        let child = run(dir, args).spawn_with(Stdio::null(), Stdio::null());
        Measured {
            pid: child.id() as i32,
            started: Instant::now(),
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child, not waited for yet.
        unsafe { libc::kill(self.pid, sig) };
    }

    /// Waits up to `limit` from now for the end: the exit code (None when it was still running
    /// at the limit, and was killed), the peak RSS in MiB, and the time since its start.
    fn wait(self, limit: Duration) -> (Option<i32>, f64, Duration) {
        let until = Instant::now() + limit;
        let mut status = 0;
        // SAFETY: rusage is plain data, filled by wait4 for our own child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let mut killed = false;
        loop {
            let flags = if killed { 0 } else { libc::WNOHANG };
            // SAFETY: wait4 on our own child, with valid pointers.
            let r = unsafe { libc::wait4(self.pid, &mut status, flags, &mut usage) };
            if r == self.pid {
                break;
            }
            assert_eq!(r, 0, "wait4 failed");
            if Instant::now() > until {
                self.signal(libc::SIGKILL);
                killed = true;
            } else {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let took = self.started.elapsed();
        let code = (!killed && libc::WIFEXITED(status)).then(|| libc::WEXITSTATUS(status));
        (code, usage.ru_maxrss as f64 / 1024.0, took)
    }
}

/// Runs a sweep and returns its exit code and its own peak resident memory in MiB.
fn peak_rss(dir: &Path, job: &Path, out: &Path) -> (Option<i32>, f64) {
    let (code, mib, _) = Measured::start(dir, &["sweep", s(job), "--out", s(out)]).wait(RUN_LIMIT);
    (code, mib)
}

/// The epochs of each progress row of `out`, in the file's order, read a line at a time (a
/// flood's file is too large for [`progress_csv`]'s maps).
fn epochs_written(out: &Path) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(out.join("progress.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (id, epoch) = (at("trial_id"), at("epoch"));
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            (cells[id].to_string(), cells[epoch].parse().unwrap())
        })
        .collect()
}

/// A script that prints `{"epoch": i, ...}` for i from 1 to `count` (without end when None)
/// as fast as it can, then its result.
fn epoch_flood(dir: &Sandbox, name: &str, count: Option<u64>) -> PathBuf {
    let until = count.map_or(String::new(), |n| format!("i <= {n}"));
    dir.script(name,
        &format!(
            r#"awk 'BEGIN {{ for (i = 1; {until}; i++) printf "{{\"epoch\": %d, \"test_acc\": 0.5, \"train_loss\": 1}}\n", i }}'
echo '{{"test_acc": 0.5}}'
"#
        ),
    )
}

/// The peak memory of gpumux while it records a flood of epoch lines.
const FLOOD_MIB: f64 = 200.0;

#[test]
fn a_flood_of_epoch_lines_is_recorded_in_bounded_memory_and_time() {
    let dir = sandbox();
    const LINES: u64 = 600_000;
    epoch_flood(&dir, "flood.sh", Some(LINES));
    let job = command_job(&dir, "flood", "./flood.sh {lr}", 1);
    let out = dir.join("out");
    let (code, mib, took) = Measured::start(dir.path(), &["sweep", s(&job), "--out", s(&out)])
        .wait(Duration::from_secs(120));
    assert_eq!(code, Some(0), "ended in {took:?}, peak RSS {mib:.0} MiB");
    assert!(mib < FLOOD_MIB, "peak RSS {mib:.0} MiB");
    assert_eq!(trials_csv(&out)[0]["state"], "COMPLETE");
    // Every epoch once, in order.
    let epochs = epochs_written(&out);
    assert_eq!(epochs.len() as u64, LINES);
    assert!(epochs.iter().zip(1..).all(|((_, e), i)| *e == i));
}

#[test]
fn sigterm_during_a_flood_of_epoch_lines_stops_within_the_grace() {
    let dir = sandbox();
    epoch_flood(&dir, "endless.sh", None);
    let job = command_job(&dir, "endless", "./endless.sh {lr}", 1);
    let out = dir.join("out");
    let run = Measured::start(
        dir.path(),
        &["sweep", s(&job), "--out", s(&out), "--grace", "2"],
    );
    let progress = out.join("progress.csv");
    let deadline = Instant::now() + Duration::from_secs(60);
    while rows_in(&progress) < 1000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(rows_in(&progress) >= 1000, "no epoch came");
    run.signal(libc::SIGTERM);
    let signalled = Instant::now();
    // The grace (2 s), the trial's own 5 s between SIGTERM and SIGKILL at most, and some slack.
    let (code, mib, _) = run.wait(Duration::from_secs(60));
    let took = signalled.elapsed();
    assert_eq!(code, Some(3), "ended {took:?} after SIGTERM");
    assert!(took < Duration::from_secs(12), "{took:?} after SIGTERM");
    assert!(mib < FLOOD_MIB, "peak RSS {mib:.0} MiB");
    assert_eq!(trials_csv(&out)[0]["state"], "INTERRUPTED");
    let epochs = epochs_written(&out);
    assert!(epochs.iter().zip(1..).all(|((_, e), i)| *e == i));
}

#[test]
fn an_epoch_printed_again_is_kept_once_as_first_printed() {
    let dir = sandbox();
    dir.script(
        "again.sh",
        r#"echo '{"epoch": 1, "test_acc": 0.1}'
echo '{"epoch": 1, "test_acc": 0.2}'
echo '{"epoch": 2, "test_acc": 0.3}'
echo '{"epoch": 1, "test_acc": 0.4}'
echo '{"epoch": 3, "test_acc": 0.5}'
echo '{"test_acc": 0.5}'
"#,
    );
    let job = command_job(&dir, "again", "./again.sh {lr}", 2);
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = progress_csv(&out);
    for trial in trials_csv(&out) {
        let mine: Vec<(&str, &str)> = rows
            .iter()
            .filter(|r| r["trial_id"] == trial["trial_id"])
            .map(|r| (r["epoch"].as_str(), r["test_acc"].as_str()))
            .collect();
        assert_eq!(mine, [("1", "0.1"), ("2", "0.3"), ("3", "0.5")], "{rows:?}");
    }
}

#[test]
fn a_flood_of_output_or_one_endless_line_keeps_gpumux_small() {
    let dir = sandbox();
    // Made by tools that hold none of it: 100 MB of 2-byte lines (50 million lines) and 300 MB
    // of 1,000-byte lines on stdout; one 300 MB line on stdout; one on stderr. The last stdout
    // line is the result.
    let floods = [
        ("short", "yes x | head -c 100000000"),
        ("lines", "yes $(printf %0999d 0) | head -c 300000000"),
        ("line", "head -c 300000000 /dev/zero | tr '\\0' x; echo"),
        ("stderr", "head -c 300000000 /dev/zero | tr '\\0' y >&2"),
    ];
    for (name, flood) in floods {
        dir.script(
            &format!("{name}.sh"),
            &format!("{flood}\necho '{{\"test_acc\": 0.5}}'\n"),
        );
        let job = command_job(&dir, name, &format!("./{name}.sh {{lr}}"), 1);
        let out = dir.join(name);
        let (code, mib) = peak_rss(dir.path(), &job, &out);
        assert_eq!(code, Some(0), "{name}");
        let rows = trials_csv(&out);
        assert_eq!(rows[0]["state"], "COMPLETE", "{name}: {rows:?}");
        assert!(mib < 500.0, "{name}: peak RSS {mib:.0} MiB");
    }
}

/// The pids written in `dir/*.pid`.
fn pids(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "pid")
                .then(|| std::fs::read_to_string(&p).ok()?.trim().parse().ok())
                .flatten()
        })
        .collect()
}

/// Kills what a failed test left, so that it never outlives the test.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for pid in pids(&self.0) {
            if alive(pid) && pid > 1 {
                // SAFETY: kill(2) on a daemon this test's script started.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
}

/// Waits a little for `pid` to be gone (a killed process is reaped by its new parent).
fn gone_soon(pid: u32) -> bool {
    gone_within(pid, Duration::from_secs(10))
}

#[test]
fn a_setsid_daemon_does_not_outlive_its_trial() {
    let dir = sandbox();
    let _cleanup = Cleanup(dir.path().to_path_buf());
    // Each trial starts daemons that leave its process group and session: `setsid sleep 1000 &`
    // and one more that hold the trial's stdout, one double-forked with its output closed, one
    // that ignores SIGTERM; then it reports and exits.
    dir.script("daemon.sh",
        r#"setsid sleep 1000 &
echo $! > "d0-$GPUMUX_TRIAL.pid"
setsid sh -c 'echo $$ > "d1-$GPUMUX_TRIAL.pid"; exec sleep 1000' &
( setsid sh -c 'echo $$ > "d2-$GPUMUX_TRIAL.pid"; exec sleep 1000' > /dev/null 2>&1 < /dev/null & )
setsid sh -c 'trap "" TERM; echo $$ > "d3-$GPUMUX_TRIAL.pid"; while :; do sleep 1; done' > /dev/null 2>&1 &
while [ $(ls *-"$GPUMUX_TRIAL".pid 2>/dev/null | wc -l) -lt 4 ]; do sleep 0.05; done
echo '{"test_acc": 0.5}'
"#,
    );
    let job = command_job(&dir, "dm", "./daemon.sh {lr}", 2);
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let started = pids(dir.path());
    assert_eq!(started.len(), 8, "four daemons per trial: {started:?}");
    for pid in started {
        assert!(gone_soon(pid), "daemon {pid} outlived its trial");
    }
}

#[test]
fn an_interrupted_trials_setsid_daemons_are_ended_with_it() {
    let dir = sandbox();
    let _cleanup = Cleanup(dir.path().to_path_buf());
    dir.script(
        "long.sh",
        r#"setsid sh -c 'echo $$ > "d-$GPUMUX_TRIAL.pid"; exec sleep 1000' > /dev/null 2>&1 &
echo '{"epoch": 1}'
sleep 1000
"#,
    );
    let job = command_job(&dir, "lg", "./long.sh {lr}", 2);
    let out = dir.join("out");
    let mut child = dir
        .run(&["sweep", s(&job), "--out", s(&out), "--grace", "0"])
        .spawn_with(Stdio::null(), Stdio::piped());
    let started = wait_for(&mut child, Duration::from_secs(60), || {
        pids(dir.path()).len() >= 2 && rows_in(&out.join("progress.csv")) >= 2
    });
    assert!(started, "the trials did not start");
    let o = terminate(child);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let rows = trials_csv(&out);
    assert!(rows.iter().all(|r| r["state"] == "INTERRUPTED"), "{rows:?}");
    for pid in pids(dir.path()) {
        assert!(gone_soon(pid), "daemon {pid} outlived its trial");
    }
}

#[test]
fn a_third_signal_exits_at_once_and_takes_the_trials_processes_along() {
    let dir = sandbox();
    let _cleanup = Cleanup(dir.path().to_path_buf());
    // A trial that ignores SIGTERM, with a setsid daemon that ignores it too.
    dir.script("stubborn.sh",
        r#"trap '' TERM
setsid sh -c 'trap "" TERM; echo $$ > "d-$GPUMUX_TRIAL.pid"; while :; do sleep 1; done' > /dev/null 2>&1 &
echo $$ > "c-$GPUMUX_TRIAL.pid"
echo '{"epoch": 1}'
while :; do sleep 1; done
"#,
    );
    let job = command_job(&dir, "st", "./stubborn.sh {lr}", 1);
    let out = dir.join("out");
    let mut child = dir
        .run(&["sweep", s(&job), "--out", s(&out), "--grace", "600"])
        .spawn_with(Stdio::null(), Stdio::piped());
    let started = wait_for(&mut child, Duration::from_secs(60), || {
        pids(dir.path()).len() >= 2 && rows_in(&out.join("progress.csv")) >= 1
    });
    assert!(started, "the trial did not start");
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    // Each signal once the one before it was taken: drain, abort, exit.
    for taken in ["launching no more trials", "stopping running trials now"] {
        signal(&child, libc::SIGTERM);
        let seen = read_until(&mut err, |line| line.contains(taken));
        log.push_str(&seen);
        assert!(
            seen.lines().last().is_some_and(|l| l.contains(taken)),
            "gpumux ended early: {log}"
        );
    }
    signal(&child, libc::SIGTERM);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3), "{log}{rest}");
    assert!(rest.contains("again: stopping now"), "{log}{rest}");
    for pid in pids(dir.path()) {
        assert!(gone_soon(pid), "process {pid} outlived gpumux");
    }
}

/// A Keras-like script: `fit(verbose=1)`'s progress bar (backspaces, carriage returns,
/// colours) with an epoch line printed at each epoch's end under Keras' names, then a result
/// printed as Python prints a dict of numpy and PyTorch scalars; `json.dumps`' `NaN` for lr 0.3.
const KERAS_LIKE: &str = r#"import json, sys
lr = float(sys.argv[1])
w = sys.stdout.write
for epoch in (1, 2):
    print(f"Epoch {epoch}/2")
    w("\x1b[1m1/2\x1b[0m \x1b[32m━━\x1b[0m 0s 1ms/step - accuracy: 0.5 - loss: 0.9")
    w("\b" * 40 + "\r\x1b[1m2/2\x1b[0m \x1b[32m━━━━\x1b[0m 0s 1ms/step - accuracy: 0.6 - loss: 0.8")
    print(json.dumps({"epoch": epoch, "loss": 0.8 / epoch, "accuracy": 0.6, "val_loss": 0.7, "val_accuracy": lr + epoch / 10}))
    print("\b" * 40 + "\r\x1b[1m2/2\x1b[0m 1s 1ms/step - accuracy: 0.6 - loss: 0.8 - val_loss: 0.7", flush=True)
if lr == 0.3:
    print(json.dumps({"val_accuracy": float("nan")}))
else:
    print("{'val_accuracy': np.float32(%s), 'loss': tensor(0.1000, grad_fn=<MeanBackward0>)}" % (lr + 0.2))
"#;

#[test]
fn keras_names_bars_and_numpy_scalars_are_read_and_the_metric_may_use_either_name() {
    let dir = sandbox();
    std::fs::write(dir.join("keras_like.py"), KERAS_LIKE).unwrap();
    let job = dir.job(
        "keras.yaml",
        JobYaml::new()
            .name("keras")
            .command("python3 keras_like.py {lr}")
            .method("grid")
            .param("lr", values(&["0.1", "0.2", "0.3"]))
            .set("metric", "{name: val_accuracy, goal: maximize}")
            .concurrency(3),
    );
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(1), "one trial fails: {}", stderr(&o));
    let mut rows = trials_csv(&out);
    rows.sort_by(|a, b| a["params_lr"].cmp(&b["params_lr"]));
    let states: Vec<&str> = rows.iter().map(|r| r["state"].as_str()).collect();
    assert_eq!(states, ["COMPLETE", "COMPLETE", "FAIL"], "{rows:?}");
    assert_eq!(
        rows[2]["error"],
        "no value for metric val_accuracy in the trial's result"
    );
    // gpumux's name is filled from Keras' one.
    let acc: f64 = rows[1]["test_acc"].parse().unwrap();
    assert!((acc - 0.4).abs() < 1e-6, "{rows:?}");
    let progress = progress_csv(&out);
    assert_eq!(progress.len(), 6, "two epochs for each trial: {progress:?}");
    for r in &progress {
        let num = |k: &str| r[k].parse::<f64>().unwrap();
        let epoch = num("epoch");
        assert!((num("train_loss") - 0.8 / epoch).abs() < 1e-9, "{r:?}");
        assert_eq!((num("train_acc"), num("test_loss")), (0.6, 0.7), "{r:?}");
        assert!(num("test_acc") > 0.1, "{r:?}");
    }
    let best = std::fs::read_to_string(out.join("best.yaml")).unwrap();
    assert!(best.contains("0.2"), "{best}");
}

/// Prints epoch lines with keys of its own (`lr`, and `grad_norm` from epoch 2 on), next to
/// Keras' names, then its result.
const EXTRA_KEYS: &str = r#"import json, sys
lr = float(sys.argv[1])
for epoch in (1, 2, 3):
    line = {"epoch": epoch, "loss": 1 / epoch, "val_accuracy": lr, "lr": lr / epoch}
    if epoch > 1:
        line["grad_norm"] = 10 * lr + epoch
    print(json.dumps(line), flush=True)
print(json.dumps({"test_acc": lr}))
"#;

#[test]
fn other_numeric_keys_of_epoch_lines_are_columns_of_progress_csv() {
    let dir = sandbox();
    std::fs::write(dir.join("extra_keys.py"), EXTRA_KEYS).unwrap();
    let job = command_job(&dir, "extra", "python3 extra_keys.py {lr}", 2);
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(out.join("progress.csv")).unwrap();
    let header = text.lines().next().unwrap();
    // The keys follow wall_s, in order of first appearance; the common names only fill the
    // fixed columns.
    assert_eq!(
        header,
        "round,trial_id,split,n,epoch,train_loss,train_acc,test_loss,test_acc,wall_s,lr,grad_norm,check"
    );
    let progress = progress_csv(&out);
    assert_eq!(progress.len(), 6, "{progress:?}");
    for r in &progress {
        let lr: f64 = r["test_acc"].parse().unwrap();
        let epoch: f64 = r["epoch"].parse().unwrap();
        let got: f64 = r["lr"].parse().unwrap();
        assert!((got - lr / epoch).abs() < 1e-12, "{r:?}");
        if epoch == 1.0 {
            assert_eq!(r["grad_norm"], "", "not reported in epoch 1: {r:?}");
        } else {
            let g: f64 = r["grad_norm"].parse().unwrap();
            assert!((g - (10.0 * lr + epoch)).abs() < 1e-12, "{r:?}");
        }
    }
    // The folder reads back whole with the one reader: `report` and `merge` take it, and the
    // merged file keeps the columns.
    let o = dir.gpumux(&["report", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let merged = dir.join("merged");
    let o = dir.gpumux(&[
        "merge",
        out.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let again = std::fs::read_to_string(merged.join("progress.csv")).unwrap();
    assert_eq!(again.lines().next(), Some(header));
}

#[test]
fn a_line_of_calls_nested_past_any_limit_is_read_without_a_crash() {
    // A 45 KB line of 15,000 nested calls on stdout, then a good result line: the trial
    // ends COMPLETE with a row, and gpumux exits 0 (no stack overflow on a reader thread).
    let dir = sandbox();
    dir.script(
        "deep.sh",
        "python3 -c \"d=15000; print('{\\\"test_acc\\\": ' + 'f('*d + '0.5' + ')'*d + '}'); print('{\\\"test_acc\\\": 0.75}')\"\n",
    );
    let job = dir.command_job("deep", "./deep.sh {lr}", &["0.1".into(), "0.2".into()], 2);
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = trials_csv(&out);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert_eq!(
            (r["state"].as_str(), r["metric"].as_str()),
            ("COMPLETE", "0.75"),
            "{r:?}"
        );
    }
}

#[test]
fn an_out_folder_with_shell_code_in_its_name_is_no_code_in_an_sh_c_template() {
    // `{out_dir}` inside `sh -c '...'` is substituted shell-quoted: the folder's name, which
    // holds `$(touch pwned)`, is a name to the shell, not a command.
    let dir = sandbox();
    let job = dir.job(
        "q.yaml",
        JobYaml::new()
            .name("q")
            .command(r#"sh -c 'echo "{{\"test_acc\": {lr}}}" > {out_dir}/m.json && cat {out_dir}/m.json'"#)
            .method("grid")
            .param("lr", values(&["0.5"])),
    );
    let out = dir.join("x$(touch pwned)");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        !dir.join("pwned").exists(),
        "the shell ran code from the folder's name"
    );
    let rows = trials_csv(&out);
    assert_eq!(
        (rows[0]["state"].as_str(), rows[0]["metric"].as_str()),
        ("COMPLETE", "0.5")
    );
    let m = out.join("trials").join(&rows[0]["trial_id"]).join("m.json");
    assert!(m.exists(), "{m:?}");
}
