//! External-command sweeps on the real binary, as a user watches them: the trials' output shown live when it can be read, a sweep whose trials all fail the same way stopped early, and the best trial's parameters.

mod support;
use std::path::PathBuf;
use support::*;

/// A job running `command` (YAML-quoted here) for `trials` trials of parameter `lr`,
/// `concurrency` at a time.
fn command_job(
    dir: &Sandbox,
    name: &str,
    command: &str,
    trials: usize,
    concurrency: usize,
) -> PathBuf {
    let lrs: Vec<String> = (1..=trials).map(|i| format!("0.{i:02}")).collect();
    let lrs: Vec<&str> = lrs.iter().map(String::as_str).collect();
    dir.job(
        &format!("{name}.yaml"),
        JobYaml::new()
            .name(name)
            .command(command)
            .method("grid")
            .param("lr", values(&lrs))
            .concurrency(concurrency),
    )
}

/// Writes an executable shell script.
fn script(dir: &Sandbox, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    write_executable(&p, &format!("#!/bin/sh\n{body}"));
    p
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
    script(
        &dir,
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
