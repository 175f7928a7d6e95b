//! External-command sweeps on the real binary: templates checked at load, a result without the metric, output in bounded memory, and daemons that try to outlive their trial.

mod support;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use support::*;

/// A job running `command` (YAML-quoted here) for `trials` trials of parameter `lr`, all at once.
fn command_job(dir: &Sandbox, name: &str, command: &str, trials: usize) -> PathBuf {
    let lrs: Vec<String> = (1..=trials).map(|i| format!("0.{i}")).collect();
    let lrs: Vec<&str> = lrs.iter().map(String::as_str).collect();
    dir.job(
        &format!("{name}.yaml"),
        JobYaml::new()
            .name(name)
            .command(command)
            .method("grid")
            .param("lr", values(&lrs))
            .concurrency(trials),
    )
}

/// Writes an executable shell script.
fn script(dir: &Sandbox, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    write_executable(&p, &format!("#!/bin/sh\n{body}"));
    p
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

#[test]
fn a_result_without_the_sweeps_metric_is_a_failed_trial() {
    let dir = sandbox();
    // The metric is test_acc (the default); the command reports loss only, or test_acc: null.
    let cases = [
        ("loss", r#"echo "{\"loss\": $1}""#),
        ("null", r#"echo "{\"test_acc\": null, \"loss\": $1}""#),
    ];
    for (name, body) in cases {
        script(&dir, &format!("{name}.sh"), &format!("{body}\n"));
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

/// Runs a sweep and returns its exit code and its own peak resident memory in MiB (wait4's
/// figure for the gpumux process: the largest of it and of the children it waited for).
// The child is waited for with wait4(2), which gives its resource usage, not with `Child::wait`.
#[allow(clippy::zombie_processes)]
fn peak_rss(dir: &Path, job: &Path, out: &Path) -> (Option<i32>, f64) {
    let child =
        run(dir, &["sweep", s(job), "--out", s(out)]).spawn_with(Stdio::null(), Stdio::null());
    let mut status = 0;
    // SAFETY: rusage is plain data, filled by wait4 for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child, with valid pointers.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(r, child.id() as i32);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    (code, usage.ru_maxrss as f64 / 1024.0)
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
        script(
            &dir,
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
    script(
        &dir,
        "daemon.sh",
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
    script(
        &dir,
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
    script(
        &dir,
        "stubborn.sh",
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
