//! External-command sweeps on the real binary, as a user watches them: the trials' output shown live when it can be read, a sweep whose trials all fail the same way stopped early, and the best trial's parameters.

mod support;
use std::path::PathBuf;
use support::*;

/// A job running `command` (YAML-quoted here) for `trials` trials of parameter `lr` (0.01,
/// 0.02, …), `concurrency` at a time.
fn command_job(
    dir: &Sandbox,
    name: &str,
    command: &str,
    trials: usize,
    concurrency: usize,
) -> PathBuf {
    let lrs: Vec<String> = (1..=trials).map(|i| format!("0.{i:02}")).collect();
    dir.command_job(name, command, &lrs, concurrency)
}

/// The lines of gpumux's stderr that are a trial's own, prefixed with its id.
fn shown_lines(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| l.starts_with('[') && l.contains("] "))
        .collect()
}

#[test]
fn a_trials_output_is_shown_live_one_at_a_time_or_with_verbose() {
    let dir = sandbox();
    dir.script(
        "talk.sh",
        r#"echo "epoch line $1"
echo "a warning $1" >&2
printf 'bar 1\rbar 2\rbar done\n'
echo '{"test_acc": 0.5}'
"#,
    );
    let run = |name: &str, concurrency: usize, extra: &[&str], env: Option<(&str, &str)>| {
        let job = command_job(&dir, name, "./talk.sh {lr}", 2, concurrency);
        let out = dir.join(name);
        let mut args = vec!["sweep", s(&job), "--out", s(&out)];
        args.extend(extra);
        let mut r = dir.run(&args).env_remove("GPUMUX_VERBOSE");
        if let Some((k, v)) = env {
            r = r.env(k, v);
        }
        let o = r.output();
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let ids: Vec<String> = trials_csv(&out)
            .iter()
            .map(|r| r["trial_id"].clone())
            .collect();
        assert_eq!(ids.len(), 2);
        (o, ids)
    };
    // One trial at a time, and two with --verbose or GPUMUX_VERBOSE=1: every line shows, on
    // stderr, prefixed with its trial's id; a bar's redraws show as their last state.
    for (name, concurrency, extra, env) in [
        ("one", 1, &[][..], None),
        ("verbose", 2, &["--verbose"][..], None),
        ("env", 2, &[][..], Some(("GPUMUX_VERBOSE", "1"))),
    ] {
        let (o, ids) = run(name, concurrency, extra, env);
        let err = stderr(&o);
        let shown = shown_lines(&err);
        for lr in ["0.01", "0.02"] {
            for tail in [format!("] epoch line {lr}"), format!("] a warning {lr}")] {
                assert!(
                    ids.iter()
                        .any(|id| shown.contains(&format!("[{id}{tail}").as_str())),
                    "{name}: {tail}\n{err}"
                );
            }
        }
        for id in &ids {
            for want in [
                format!("[{id}] bar done"),
                format!("[{id}] {{\"test_acc\": 0.5}}"),
            ] {
                assert!(shown.contains(&want.as_str()), "{name}: {want}\n{err}");
            }
        }
        assert!(!err.contains("bar 1"), "{name}: {err}");
        assert!(
            !stdout(&o).contains("epoch line"),
            "{name}: stdout is the summary's"
        );
    }
    // Two at a time: their lines would be mixed, and are not shown.
    let (o, _) = run("two", 2, &[], None);
    let err = stderr(&o);
    assert!(shown_lines(&err).is_empty(), "{err}");
    assert!(!err.contains("epoch line"), "{err}");
}

/// The trials of `out/trials.csv` in each state.
fn states(out: &std::path::Path) -> std::collections::BTreeMap<String, usize> {
    let mut n = std::collections::BTreeMap::new();
    for r in trials_csv(out) {
        *n.entry(r["state"].clone()).or_insert(0) += 1;
    }
    n
}

#[test]
fn a_sweep_whose_first_trials_fail_the_same_way_stops_and_resumes_after_the_fix() {
    let dir = sandbox();
    // Fails as a missing module does, until the file `fixed` is there; the traceback names the
    // trial's own values.
    dir.script(
        "train.sh",
        r#"if [ -e fixed ]; then echo "{\"test_acc\": $1}"; exit 0; fi
sleep 0.3
echo "Traceback (most recent call last):" >&2
echo "  File \"train.py\", line 3, in <module>  # lr $1, trial $GPUMUX_TRIAL" >&2
echo "ModuleNotFoundError: No module named 'torhc'" >&2
exit 1
"#,
    );
    let job = command_job(&dir, "typo", "./train.sh {lr}", 12, 2);
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(
        err.matches("stopped after 3 trials failed the same way before any completed")
            .count(),
        1,
        "{err}"
    );
    assert!(err.contains("--resume"), "{err}");
    let n = states(&out);
    let failed = n.get("FAIL").copied().unwrap_or(0);
    // A trial that ended by itself as the stop came is a FAIL of its own, said in full.
    assert!((3..=5).contains(&failed), "{n:?}");
    // The slots freed by the first failures are filled before the stop reaches the scheduler:
    // at most 2 trials a slot after the first 3 (of 12) were started.
    assert!(
        failed + n.get("INTERRUPTED").copied().unwrap_or(0) <= 3 + 2 * 2,
        "{n:?}"
    );
    assert!(!n.contains_key("COMPLETE"), "{n:?}");
    // The error: in the first failure's line and in the stop's message, not once per trial.
    assert_eq!(
        err.matches("No module named 'torhc'").count(),
        2 + failed - 3,
        "{err}"
    );
    assert_eq!(err.matches("the same failure as").count(), 2, "{err}");
    let rows = trials_csv(&out).len();
    assert!(
        stdout(&o).contains(&format!("{} not started", 12 - rows)),
        "{}",
        stdout(&o)
    );
    // Fixed, the sweep resumed runs every trial that did not complete.
    std::fs::write(dir.join("fixed"), "").unwrap();
    let o = dir.run_into("sweep", &job, &out, &["--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("0 already COMPLETE, 12 to run"),
        "{}",
        stdout(&o)
    );
    let latest: std::collections::BTreeMap<String, String> = trials_csv(&out)
        .into_iter()
        .map(|r| (r["trial_id"].clone(), r["state"].clone()))
        .collect();
    assert_eq!(latest.len(), 12);
    assert!(latest.values().all(|s| s == "COMPLETE"), "{latest:?}");
}

#[test]
fn a_sweep_that_fails_for_some_parameters_runs_to_its_end() {
    let dir = sandbox();
    // Half the learning rates fail, each slowly, the same way; the others complete at once.
    dir.script(
        "half.sh",
        r#"case "$1" in
  *[13579]) sleep 0.5; echo "ValueError: lr $1 is too large" >&2; exit 1 ;;
esac
echo "{\"test_acc\": $1}"
"#,
    );
    let job = command_job(&dir, "half", "./half.sh {lr}", 12, 2);
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("stopped after"), "{err}");
    let n = states(&out);
    // 0.01, 0.03, ..., 0.11 and 0.1 (0.10 as the command gets it) fail.
    assert_eq!(n.get("FAIL"), Some(&7), "{n:?}");
    assert_eq!(n.get("COMPLETE"), Some(&5), "{n:?}");
}

#[test]
fn the_best_trials_line_names_only_the_parameters_its_command_received() {
    let dir = sandbox();
    dir.script("acc.sh", "echo \"{\\\"test_acc\\\": $1}\"\n");
    let job = dir.job(
        "best.yaml",
        JobYaml::new()
            .name("best")
            .command("./acc.sh {lr}")
            .method("grid")
            .param("lr", values(&["0.2", "0.7"]))
            .param("opt", values(&["adam"]))
            .concurrency(2),
    );
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let line = text
        .lines()
        .find(|l| l.starts_with("best trial"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(", params lr=0.7; written to"), "{line}");
}
