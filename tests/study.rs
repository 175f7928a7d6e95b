//! `gpumux sweep --study sqlite:PATH` and `gpumux export` on the real binary: several workers of one study, each with its own folder, run each trial once between them (grid, random, and bayes with hyperband judged over all workers); a worker killed with SIGKILL leaves a trial whose lease runs out, and another worker runs it again; the exported study holds every trial once; refusals with `--shard`, another space and a bad URL.

mod support;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use support::*;

/// A random sweep of examples/fake_train.py, `run_cap` trials, `sleep` seconds an epoch.
fn study_job(dir: &Sandbox, run_cap: u32, sleep: f64) -> PathBuf {
    let script = root().join("examples/fake_train.py");
    dir.job(
        "study.yaml",
        JobYaml::new()
            .name("study")
            .command(&format!(
                "python3 {} --lr {{lr}} --epochs 2 --sleep {sleep}",
                script.display()
            ))
            .method("random")
            .run_cap(run_cap.into())
            .seed(11)
            .param(
                "lr",
                "{min: 0.0001, max: 0.1, distribution: log_uniform_values}",
            )
            .concurrency(2),
    )
}

/// The COMPLETE rows of every folder, by trial id.
fn complete_by_id(outs: &[PathBuf]) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for out in outs {
        for r in trials_csv(out) {
            if r["state"] == "COMPLETE" {
                *by.entry(r["trial_id"].clone()).or_insert(0) += 1;
            }
        }
    }
    by
}

fn study_url(dir: &Sandbox) -> String {
    format!("sqlite:{}", dir.join("study.db").display())
}

/// A new, empty database `gpumux_<name>` on the PostgreSQL server GPUMUX_TEST_POSTGRES names
/// (a URL of one of its databases; CI starts one), and its URL; `None` without one.
fn fresh_postgres(name: &str) -> Option<String> {
    let base = std::env::var("GPUMUX_TEST_POSTGRES")
        .ok()
        .filter(|s| !s.is_empty())?;
    let mut c = postgres::Client::connect(&base, postgres::NoTls)
        .expect("GPUMUX_TEST_POSTGRES names a server that answers");
    let db = format!("gpumux_cli_{name}");
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .expect("an old test database dropped");
    c.batch_execute(&format!("CREATE DATABASE {db}"))
        .expect("a test database made");
    let (server, _) = base.rsplit_once('/').expect("a URL with a database");
    Some(format!("{server}/{db}"))
}

#[test]
fn three_workers_of_one_study_run_each_trial_once_between_them() {
    let dir = sandbox();
    let job = study_job(&dir, 24, 0.05);
    let url = study_url(&dir);
    let outs: Vec<PathBuf> = (0..3).map(|w| dir.join(format!("out-{w}"))).collect();
    let children: Vec<_> = outs
        .iter()
        .map(|out| dir.spawn(&["sweep", s(&job), "--out", s(out), "--study", &url]))
        .collect();
    for child in children {
        let o = child.wait_with_output().expect("a worker ends");
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(stdout(&o).contains("study sqlite:"), "{}", stdout(&o));
    }
    let by = complete_by_id(&outs);
    assert_eq!(by.len(), 24, "{by:?}");
    assert!(by.values().all(|&n| n == 1), "a trial ran twice: {by:?}");
    // Every worker took some (they ran at once).
    assert!(outs.iter().filter(|o| !trials_csv(o).is_empty()).count() >= 2);
    // A worker that joins a done study runs nothing, and says so.
    let late = dir.join("out-late");
    let o = dir.run_into("sweep", &job, &late, &["--study", &url]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("24 COMPLETE of 24 trials"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_trial_of_a_killed_worker_is_run_again_once_its_lease_runs_out() {
    let dir = sandbox();
    let job = study_job(&dir, 6, 0.4);
    let url = study_url(&dir);
    let first = dir.join("out-killed");
    let mut killed = dir
        .run(&[
            "sweep",
            s(&job),
            "--out",
            s(&first),
            "--study",
            &url,
            "--concurrency",
            "1",
        ])
        .env("GPUMUX_STUDY_LEASE_S", "1.5")
        .spawn();
    // Once its first trial has printed an epoch, kill it: its trial stays held, then lost.
    let progress = first.join("progress.csv");
    let started = wait_for(&mut killed, std::time::Duration::from_secs(60), || {
        rows_in(&progress) >= 1
    });
    killed.kill().expect("SIGKILL");
    let _ = killed.wait();
    assert!(started, "the worker printed no epoch");
    let second = dir.join("out-second");
    let o = dir
        .run(&["sweep", s(&job), "--out", s(&second), "--study", &url])
        .env("GPUMUX_STUDY_LEASE_S", "1.5")
        .output();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let by = complete_by_id(&[first.clone(), second.clone()]);
    assert_eq!(by.len(), 6, "every trial COMPLETE once: {by:?}");
    assert!(by.values().all(|&n| n == 1), "{by:?}");
    assert!(
        stdout(&o).contains("6 COMPLETE of 6 trials"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_study_is_refused_with_shards_a_bad_url_or_another_space() {
    let dir = sandbox();
    let job = study_job(&dir, 4, 0.0);
    let out = dir.join("out");
    let url = study_url(&dir);
    for (args, says) in [
        (
            vec!["--study", url.as_str(), "--shard", "1/2"],
            "--study and --shard",
        ),
        (vec!["--study", "mysql://nowhere"], "expected sqlite:PATH"),
        (
            vec!["--study", "sqlite:/no/such/folder/s.db"],
            "cannot be opened",
        ),
        (
            vec![
                "--study",
                "postgresql://gpumux@127.0.0.1:1/none?connect_timeout=2",
            ],
            "cannot be opened",
        ),
    ] {
        let o = dir.run_into("sweep", &job, &out, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        let _ = std::fs::remove_dir_all(&out);
    }
    let o = dir.run_into("sweep", &job, &out, &["--study", &url]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The same job with another method is another study.
    let bayes = dir.job(
        "bayes.yaml",
        std::fs::read_to_string(&job)
            .unwrap()
            .replace("method: random", "method: bayes"),
    );
    let o = dir.run_into("sweep", &bayes, &dir.join("out-b"), &["--study", &url]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("two jobs with different spaces cannot share a study"),
        "{}",
        stderr(&o)
    );
    // export: a study that is not there, or a URL that is not one, is refused (exit 2).
    for bad in ["sqlite:/no/such/s.db", "mysql://x"] {
        let o = dir
            .run(&["export", "--study", bad, "--out", s(&dir.join("e"))])
            .output();
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
    }
    let _ = Path::new(&out);
}

#[test]
fn a_bayes_sweep_with_hyperband_over_three_workers_runs_each_index_once_and_exports_whole_sqlite() {
    let dir = sandbox();
    bayes_with_hyperband_over_three_workers(&dir, &study_url(&dir));
}

#[test]
fn a_bayes_sweep_with_hyperband_over_three_workers_runs_each_index_once_and_exports_whole_postgresql(
) {
    match fresh_postgres("bayes_three") {
        Some(url) => bayes_with_hyperband_over_three_workers(&sandbox(), &url),
        None => eprintln!("skipped: GPUMUX_TEST_POSTGRES names no PostgreSQL server"),
    }
}

fn bayes_with_hyperband_over_three_workers(dir: &Sandbox, url: &str) {
    let script = root().join("examples/fake_train.py");
    let job = dir.job(
        "bh.yaml",
        JobYaml::new()
            .name("study-bh")
            .command(&format!(
                "python3 {} --lr {{lr}} --batch-size {{batch_size}} --epochs 9 --sleep 0.02",
                script.display()
            ))
            .method("bayes")
            .run_cap(30)
            .seed(7)
            .set("early_terminate", "{type: hyperband, min_iter: 1, eta: 3}")
            .param(
                "lr",
                "{min: 0.0001, max: 0.1, distribution: log_uniform_values}",
            )
            .param("batch_size", "{values: [32, 64, 128]}")
            .concurrency(2),
    );
    let outs: Vec<PathBuf> = (0..3).map(|w| dir.join(format!("out-{w}"))).collect();
    let children: Vec<_> = outs
        .iter()
        .map(|out| dir.spawn(&["sweep", s(&job), "--out", s(out), "--study", url]))
        .collect();
    for child in children {
        let o = child.wait_with_output().expect("a worker ends");
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    // Each trial ended in one folder only (COMPLETE or PRUNED), 30 in all.
    let mut ended: BTreeMap<String, usize> = BTreeMap::new();
    let mut pruned = 0;
    for out in &outs {
        for r in trials_csv(out) {
            assert!(
                ["COMPLETE", "PRUNED"].contains(&r["state"].as_str()),
                "{r:?}"
            );
            pruned += usize::from(r["state"] == "PRUNED");
            *ended.entry(r["trial_id"].clone()).or_insert(0) += 1;
        }
    }
    assert_eq!(ended.len(), 30, "{ended:?}");
    assert!(ended.values().all(|&n| n == 1), "{ended:?}");
    assert!(pruned > 0, "hyperband pruned nothing");
    // The study as one folder: every trial once, each with as many epochs as its row says.
    let merged = dir.join("merged");
    let o = dir
        .run(&["export", "--study", url, "--out", s(&merged)])
        .output();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("30 trials ended"), "{}", stdout(&o));
    let rows = trials_csv(&merged);
    let ids: BTreeMap<String, String> = rows
        .iter()
        .map(|r| (r["trial_id"].clone(), r["epochs"].clone()))
        .collect();
    assert_eq!((rows.len(), ids.len()), (30, 30));
    assert_eq!(
        ids.keys().cloned().collect::<Vec<_>>(),
        ended.keys().cloned().collect::<Vec<_>>()
    );
    let mut epochs: BTreeMap<String, usize> = BTreeMap::new();
    for r in progress_csv(&merged) {
        *epochs.entry(r["trial_id"].clone()).or_insert(0) += 1;
    }
    for (id, n) in &ids {
        assert_eq!(
            epochs.get(id).copied().unwrap_or(0).to_string(),
            *n,
            "trial {id}"
        );
    }
    // Exported again (at any time): the same rows.
    let o = dir
        .run(&["export", "--study", url, "--out", s(&merged)])
        .output();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(trials_csv(&merged).len(), 30);
}

/// A random sweep whose trial is `trial.sh LR`: `sleep` seconds, then the result line.
fn sleep_job(dir: &Sandbox, run_cap: u32, sleep: f64) -> PathBuf {
    let script = dir.script(
        "trial.sh",
        &format!("sleep {sleep}\necho \"{{\\\"test_acc\\\": $1}}\"\n"),
    );
    dir.job(
        "many.yaml",
        JobYaml::new()
            .name("many")
            .command(&format!("{} {{lr}}", script.display()))
            .method("random")
            .run_cap(run_cap.into())
            .seed(5)
            .param(
                "lr",
                "{min: 0.0001, max: 0.1, distribution: log_uniform_values}",
            )
            .concurrency(1),
    )
}

#[test]
fn sixty_four_workers_some_killed_and_restarted_end_each_trial_once_up_to_the_run_cap_sqlite() {
    let dir = sandbox();
    sixty_four_workers_some_killed(&dir, &study_url(&dir));
}

#[test]
fn sixty_four_workers_some_killed_and_restarted_end_each_trial_once_up_to_the_run_cap_postgresql() {
    match fresh_postgres("sixty_four") {
        Some(url) => sixty_four_workers_some_killed(&sandbox(), &url),
        None => eprintln!("skipped: GPUMUX_TEST_POSTGRES names no PostgreSQL server"),
    }
}

fn sixty_four_workers_some_killed(dir: &Sandbox, url: &str) {
    const WORKERS: usize = 64;
    const RUN_CAP: u32 = 640;
    let job = sleep_job(dir, RUN_CAP, 0.2);
    let start = |w: usize| {
        let out = dir.join(format!("out-{w}"));
        dir.run(&[
            "sweep",
            s(&job),
            "--out",
            s(&out),
            "--study",
            url,
            "--resume",
        ])
        .env("GPUMUX_STUDY_LEASE_S", "1")
        .spawn_with(std::process::Stdio::null(), std::process::Stdio::piped())
    };
    let mut workers: Vec<std::process::Child> = (0..WORKERS).map(start).collect();
    // Twelve workers, picked by a fixed stride, killed with SIGKILL while they run trials and
    // started again on their folders.
    let mut kills = 0;
    for k in 0..12 {
        std::thread::sleep(std::time::Duration::from_millis(150));
        let w = (k * 37 + 5) % WORKERS;
        if workers[w].try_wait().expect("a worker's state").is_some() {
            continue;
        }
        workers[w].kill().expect("SIGKILL");
        let _ = workers[w].wait();
        kills += 1;
        workers[w] = start(w);
    }
    assert!(
        kills >= 6,
        "only {kills} workers were still running to be killed"
    );
    for (w, child) in workers.into_iter().enumerate() {
        let o = child.wait_with_output().expect("a worker ends");
        assert_eq!(o.status.code(), Some(0), "worker {w}: {}", stderr(&o));
    }
    // The study: every index below the run cap ended once, none above.
    let merged = dir.join("merged");
    let o = dir
        .run(&["export", "--study", url, "--out", s(&merged)])
        .output();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = trials_csv(&merged);
    let ids: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r["trial_id"].as_str()).collect();
    assert_eq!(
        (rows.len(), ids.len()),
        (RUN_CAP as usize, RUN_CAP as usize),
        "{}",
        stdout(&o)
    );
    let interrupted = rows.iter().filter(|r| r["state"] == "INTERRUPTED").count();
    let complete = rows.iter().filter(|r| r["state"] == "COMPLETE").count();
    assert_eq!(complete + interrupted, RUN_CAP as usize, "{rows:?}");
    // A trial stays INTERRUPTED only when it was lost twice, and its row says so.
    for r in rows.iter().filter(|r| r["state"] == "INTERRUPTED") {
        assert!(r["error"].contains("worker was lost"), "{r:?}");
    }
    assert!(
        2 * interrupted <= kills,
        "{interrupted} INTERRUPTED after {kills} kills"
    );
    // Every COMPLETE trial of the study is COMPLETE in a worker's folder.
    let local = complete_by_id(
        &(0..WORKERS)
            .map(|w| dir.join(format!("out-{w}")))
            .collect::<Vec<_>>(),
    );
    for r in rows.iter().filter(|r| r["state"] == "COMPLETE") {
        assert!(
            local.contains_key(&r["trial_id"]),
            "{} is in no folder",
            r["trial_id"]
        );
    }
}

#[test]
fn a_store_that_fails_mid_run_stops_the_worker_with_exit_3_and_its_rows_kept() {
    // PostgreSQL only: the study's database is dropped under the running worker.
    let Some(url) = fresh_postgres("fails_mid_run") else {
        eprintln!("skipped: GPUMUX_TEST_POSTGRES names no PostgreSQL server");
        return;
    };
    let dir = sandbox();
    let job = study_job(&dir, 12, 0.3);
    let out = dir.join("out");
    let mut worker = dir
        .run(&["sweep", s(&job), "--out", s(&out), "--study", &url])
        .spawn();
    let trials = out.join("trials.csv");
    let ended_one = wait_for(&mut worker, std::time::Duration::from_secs(60), || {
        rows_in(&trials) >= 1
    });
    assert!(ended_one, "no trial ended");
    let base = std::env::var("GPUMUX_TEST_POSTGRES").unwrap();
    let mut admin = postgres::Client::connect(&base, postgres::NoTls).unwrap();
    admin
        .batch_execute("DROP DATABASE gpumux_cli_fails_mid_run WITH (FORCE)")
        .unwrap();
    let o = worker.wait_with_output().expect("the worker ends");
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the study store failed"),
        "{}",
        stderr(&o)
    );
    // Every row this worker wrote is still there, and reads.
    let kept = trials_csv(&out);
    assert!(kept.iter().any(|r| r["state"] == "COMPLETE"), "{kept:?}");
}
