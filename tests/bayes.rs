//! `method: bayes` sweeps on the real binary: examples/fake_train.py (best near lr 3e-3) run to its run_cap, proposals moving toward the optimum, the dry run, `--resume` after SIGTERM and after SIGKILL (ten kills in a row, three trials at a time: each index runs once), a resumed sweep of an edited job, and a built-in model under fused.

mod support;
use std::path::{Path, PathBuf};
use support::*;

/// The bayes job of `jobs/sweep-bayes.yaml`, with the example script's absolute path and
/// `sleep` seconds per epoch.
fn bayes_job(dir: &Sandbox, sleep: f64) -> PathBuf {
    let script = root().join("examples/fake_train.py");
    let text = std::fs::read_to_string(root().join("jobs/sweep-bayes.yaml")).expect("example job");
    let text = text.replace(
        "python3 examples/fake_train.py",
        &format!("python3 {} --sleep {sleep}", script.display()),
    );
    dir.job("bayes.yaml", text)
}

/// How far each trial's lr is from 3e-3, in decades, in the order of `trials.csv`.
fn decades(out: &Path) -> Vec<f64> {
    read_csv(&out.join("trials.csv"))
        .iter()
        .map(|r| {
            let params: serde_json::Value = serde_json::from_str(&r["params"]).expect("params");
            let lr = params["lr"].as_f64().expect("lr");
            (lr.log10() - 3e-3f64.log10()).abs()
        })
        .collect()
}

fn complete(out: &Path) -> usize {
    read_csv(&out.join("trials.csv"))
        .iter()
        .filter(|r| r["state"] == "COMPLETE")
        .count()
}

#[test]
fn a_bayes_sweep_runs_its_run_cap_and_moves_toward_the_optimum() {
    let dir = sandbox();
    let job = bayes_job(&dir, 0.02);
    let out = dir.join("out");
    let dry = dir.run_into("sweep", &job, &out, &["--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    let said = stdout(&dry);
    assert!(
        said.contains("4 random startup trials, then multivariate TPE (24 candidates"),
        "{said}"
    );
    assert_eq!(
        said.lines().filter(|l| l.contains(" seed ")).count(),
        4,
        "{said}"
    );
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(complete(&out), 16);
    let d = decades(&out);
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    assert!(
        mean(&d[4..]) < mean(&d[..4]),
        "proposed trials {} decades from the optimum on average, startup ones {}: {d:?}",
        mean(&d[4..]),
        mean(&d[..4])
    );
    assert!(stdout(&o).contains("best trial"), "{}", stdout(&o));
}

/// Stops a 16-trial bayes sweep with `signal` once 5 trials have ended, checks the exit, then
/// `--resume`s it: it proposes the trials left, and ends with 16 COMPLETE, none run twice.
fn stop_then_resume(signal: i32, exit: Option<i32>) {
    let dir = sandbox();
    let job = bayes_job(&dir, 0.3);
    let out = dir.join("out");
    let mut run = dir.run(&["sweep", s(&job), "--out", s(&out)]).watch();
    let trials = out.join("trials.csv");
    assert!(
        run.wait_for(&|_| rows_in(&trials) >= 5),
        "no trials ended: {}",
        run.err()
    );
    run.signal(signal);
    let (code, _, err) = run.finish();
    assert_eq!(code, exit, "{err}");
    let before = complete(&out);
    assert!((5..16).contains(&before), "{before} COMPLETE");
    let o = dir.run_into("sweep", &job, &out, &["--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!(
            "{before} already COMPLETE, {} to propose",
            16 - before
        )),
        "{}",
        stdout(&o)
    );
    assert_eq!(complete(&out), 16);
    let ids: Vec<String> = trials_csv(&out)
        .into_iter()
        .filter(|r| r["state"] == "COMPLETE")
        .map(|r| r["trial_id"].clone())
        .collect();
    let unique: std::collections::BTreeSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a trial ran twice: {ids:?}");
}

#[test]
fn an_interrupted_bayes_sweep_resumes_to_its_run_cap() {
    stop_then_resume(libc::SIGTERM, Some(3));
}

#[test]
fn a_bayes_sweep_killed_with_sigkill_resumes_to_its_run_cap() {
    // No grace, no handler: the rows fsynced before the kill are all there is.
    stop_then_resume(libc::SIGKILL, None);
}

/// Each trial's (id, epoch) pairs in `progress.csv`, and how often each appears.
fn epochs_seen(out: &Path) -> std::collections::BTreeMap<(String, String), usize> {
    let mut seen = std::collections::BTreeMap::new();
    for r in progress_csv(out) {
        *seen
            .entry((r["trial_id"].clone(), r["epoch"].clone()))
            .or_insert(0) += 1;
    }
    seen
}

/// Runs the sweep of `job` into `out` (with `extra` flags; `--resume` after the first) `kills`
/// times, each killed with SIGKILL once `more(kill)` rows more than before are in trials.csv,
/// and never at its `run_cap`.
fn kill_at_rows(
    dir: &Sandbox,
    job: &Path,
    out: &Path,
    extra: &[&str],
    run_cap: u32,
    kills: usize,
    more: &dyn Fn(usize) -> usize,
) {
    let trials = out.join("trials.csv");
    let mut rows = 0;
    for kill in 0..kills {
        let mut args = vec!["sweep", s(job), "--out", s(out)];
        args.extend_from_slice(extra);
        if kill > 0 {
            args.push("--resume");
        }
        let mut child = dir.spawn(&args);
        let want = rows + more(kill);
        let reached = wait_for(&mut child, std::time::Duration::from_secs(120), || {
            rows_in(&trials) >= want
        });
        child.kill().expect("SIGKILL");
        let said = child
            .wait_with_output()
            .map(|o| o.stderr)
            .unwrap_or_default();
        assert!(
            reached,
            "kill {kill}: the sweep ended before {want} rows: {}",
            String::from_utf8_lossy(&said)
        );
        rows = rows_in(&trials);
        assert!(rows < run_cap as usize, "kill {kill}: done too soon");
    }
}

/// The rows of `out`'s trials.csv, checked to hold each index of a sweep of `run_cap` trials
/// with seed `seed` once: no id twice, and the trials' seeds those of indices 0..run_cap.
fn each_index_once(out: &Path, run_cap: u32, seed: u64) -> Vec<Row> {
    let all = trials_csv(out);
    let ids: Vec<&str> = all.iter().map(|r| r["trial_id"].as_str()).collect();
    let distinct: std::collections::BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len(), "an id twice: {ids:?}");
    assert_eq!(ids.len(), run_cap as usize, "{ids:?}");
    let seeds: std::collections::BTreeSet<u64> =
        all.iter().map(|r| r["seed"].parse().unwrap()).collect();
    let want: std::collections::BTreeSet<u64> = (0..run_cap)
        .map(|i| gpumux::plan::trial_seed(seed, i))
        .collect();
    assert_eq!(seeds, want, "each index of the sweep once");
    all
}

#[test]
fn a_bayes_sweep_killed_ten_times_runs_each_of_its_indices_once() {
    // Three trials at a time end out of order: a kill leaves holes below the last index.
    let dir = sandbox();
    let run_cap = 24u32;
    let job = bayes_job(&dir, 0.15);
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("run_cap: 16", &format!("run_cap: {run_cap}"));
    std::fs::write(&job, text).unwrap();
    let out = dir.join("out");
    // At a point that moves: one to three more rows than before, then SIGKILL.
    kill_at_rows(
        &dir,
        &job,
        &out,
        &["--concurrency", "3"],
        run_cap,
        10,
        &|kill| 1 + kill % 3,
    );
    let o = dir.run_into("sweep", &job, &out, &["--resume", "--concurrency", "3"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let all = each_index_once(&out, run_cap, 7);
    assert!(all.iter().all(|r| r["state"] == "COMPLETE"), "{all:?}");
    // No epoch twice, and every trial's epochs there.
    let seen = epochs_seen(&out);
    assert!(seen.values().all(|&n| n == 1), "an epoch twice: {seen:?}");
    assert_eq!(seen.len(), 3 * run_cap as usize, "{seen:?}");
}

#[test]
fn a_resumed_bayes_sweep_of_an_edited_job_ignores_the_old_rows_and_says_so() {
    let dir = sandbox();
    let job = bayes_job(&dir, 0.0);
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("run_cap: 16", "run_cap: 6");
    std::fs::write(&job, &text).unwrap();
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(complete(&out), 6);
    // Another command (one more epoch), then another range: neither counts the old rows.
    for (edit, old) in [
        (text.replace("--sleep 0", "--sleep 0 --epochs 4"), 6),
        (
            text.replace("--sleep 0", "--sleep 0 --epochs 4")
                .replace("min: 0.0001, max: 0.1", "min: 0.2, max: 0.5"),
            12,
        ),
    ] {
        std::fs::write(&job, &edit).unwrap();
        let o = dir.run_into("sweep", &job, &out, &["--resume"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let said = stdout(&o);
        assert!(said.contains("0 already COMPLETE, 6 to propose"), "{said}");
        assert!(
            said.contains(&format!(
                "note: {old} rows of trials.csv are not this job's"
            )),
            "{said}"
        );
        assert_eq!(complete(&out), old + 6);
    }
    // The last job's trials all lie in its range.
    let rows = trials_csv(&out);
    for r in &rows[12..] {
        let params: serde_json::Value = serde_json::from_str(&r["params"]).unwrap();
        let lr = params["lr"].as_f64().unwrap();
        assert!((0.2..=0.5).contains(&lr), "{r:?}");
    }
}

/// A bayes sweep of a small built-in MLP on synthetic data, `run_cap` trials on `backend`.
fn bayes_mlp(name: &str, backend: &str, run_cap: u64) -> JobYaml {
    JobYaml::new()
        .name(name)
        .model(mlp(&[16]))
        .data(synthetic(256, 64))
        .train(epochs(2, 32))
        .seed(5)
        .backend(backend)
        .method("bayes")
        .run_cap(run_cap)
        .param(
            "lr",
            "{min: 0.0001, max: 0.1, distribution: log_uniform_values}",
        )
}

#[test]
fn a_bayes_sweep_of_a_built_in_model_runs_its_run_cap_under_fused() {
    let dir = sandbox();
    let job = dir.job(
        "bayes-mlp.yaml",
        bayes_mlp("bayes-mlp", "cpu", 8)
            .concurrency(2)
            .split("fused")
            .param("momentum", "{min: 0.5, max: 0.99}"),
    );
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(complete(&out), 8, "{}", stdout(&o));
    // It says how its groups take each proposed trial.
    assert!(
        stdout(&o).contains("frees its slot in its group"),
        "{}",
        stdout(&o)
    );
    // Past the random start, the proposals are the estimator's: every point differs.
    let lrs: std::collections::BTreeSet<String> = trials_csv(&out)
        .iter()
        .map(|r| r["params_lr"].clone())
        .collect();
    assert_eq!(lrs.len(), 8, "{lrs:?}");
}

#[test]
fn a_fused_bayes_sweep_with_hyperband_killed_three_times_runs_each_index_once() {
    // Fused groups refill the slots their pruned trials free: a SIGKILL lands while groups
    // hold trials that joined at different epochs.
    let dir = sandbox();
    let run_cap = 40u32;
    let job = dir.job(
        "fused-hb.yaml",
        bayes_mlp("fused-hb", "cpu", run_cap.into())
            .model(mlp(&[64]))
            .data(synthetic(4096, 256))
            .train(epochs(9, 32))
            .concurrency(8)
            .split("fused")
            .set("early_terminate", "{type: hyperband, min_iter: 1, eta: 3}"),
    );
    let out = dir.join("out");
    kill_at_rows(&dir, &job, &out, &[], run_cap, 3, &|kill| 3 + 2 * kill);
    let o = dir.run_into("sweep", &job, &out, &["--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let all = each_index_once(&out, run_cap, 5);
    let pruned = all.iter().filter(|r| r["state"] == "PRUNED").count();
    assert!(pruned > 0, "hyperband pruned none: {all:?}");
    assert!(
        all.iter()
            .all(|r| r["state"] == "COMPLETE" || r["state"] == "PRUNED"),
        "{all:?}"
    );
    // No epoch twice, and each trial's epochs, up to where it stopped.
    let seen = epochs_seen(&out);
    assert!(seen.values().all(|&n| n == 1), "an epoch twice: {seen:?}");
    for r in &all {
        let trained: usize = r["epochs"].parse().unwrap();
        let rows = seen.keys().filter(|(id, _)| id == &r["trial_id"]).count();
        assert_eq!(rows, trained, "{r:?}");
    }
}

#[test]
fn concurrency_auto_is_refused_before_a_device_is_opened() {
    let dir = sandbox();
    // backend: cuda on a machine with or without a GPU: the refusal comes first, exit 2, not 4.
    let bayes = dir.job(
        "bayes-auto.yaml",
        bayes_mlp("bayes-auto", "cuda", 4).concurrency("auto"),
    );
    let external = dir.job(
        "external-auto.yaml",
        JobYaml::new()
            .name("external-auto")
            .command("true {lr}")
            .backend("cuda")
            .run_cap(4)
            .concurrency("auto")
            .param("lr", "{min: 0.0001, max: 0.1}"),
    );
    let random_with_bayes = dir.job(
        "random-bayes.yaml",
        JobYaml::new()
            .name("random-bayes")
            .command("true {lr}")
            .run_cap(4)
            .param("lr", "{min: 0.0001, max: 0.1}")
            .set("bayes", "{multivariate: false}"),
    );
    for (job, why) in [
        (random_with_bayes, "only applies with `method: bayes`"),
        (bayes, "auto is not available with method: bayes"),
        (external, "auto probes built-in models only"),
    ] {
        let o = dir.run_into("sweep", &job, &dir.join("out"), &[]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(why), "{}", stderr(&o));
    }
}

#[test]
fn a_value_whose_trials_always_fail_stops_being_proposed() {
    // `mode: broken` fails every time (the command exits 1 before it trains).
    let dir = sandbox();
    let script = root().join("examples/fake_train.py");
    let job = dir.job(
        "failing.yaml",
        format!(
            "name: failing\ncommand: \"sh -c 'test {{mode}} != broken && exec python3 {} --lr {{lr}} --epochs 1 --sleep 0'\"\nmetric: {{name: test_acc, goal: maximize}}\nseed: 3\nmethod: bayes\nrun_cap: 30\nconcurrency: 1\nparameters:\n  lr: {{min: 0.0001, max: 0.1, distribution: log_uniform_values}}\n  mode: {{values: [fast, slow, broken]}}\n",
            script.display()
        ),
    );
    let out = dir.join("out");
    let o = dir.run_into("sweep", &job, &out, &[]);
    // Some trials failed: exit 1.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let rows = read_csv(&out.join("trials.csv"));
    assert_eq!(rows.len(), 30);
    let mut failures = 0;
    let (mut after, mut broken_after) = (0, 0);
    for r in &rows {
        let params: serde_json::Value = serde_json::from_str(&r["params"]).expect("params");
        let broken = params["mode"] == "broken";
        if failures >= 3 {
            after += 1;
            broken_after += usize::from(broken);
        }
        if broken {
            assert_eq!(r["state"], "FAIL", "{r:?}");
            failures += 1;
        }
    }
    assert!(
        failures >= 3,
        "the random startup trials gave {failures} failures"
    );
    assert!(
        3 * broken_after <= after,
        "broken proposed {broken_after} times of {after} after its third failure"
    );
}
