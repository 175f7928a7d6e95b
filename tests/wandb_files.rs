//! W&B sweep files load unchanged: `program` with W&B's default command, the list form of `command` with its macros, every distribution of W&B's reference under random and bayes, nested parameters, `metric.goal`'s default, `metric.target`, `--seed`, and the keys W&B keeps for its server; each file of tests/fixtures/wandb dry-run and run end to end.

mod support;
use std::path::{Path, PathBuf};
use support::*;

/// The fixture folder copied into a sandbox (W&B's `program` is relative to where the agent runs).
fn wandb_dir() -> (Sandbox, PathBuf) {
    let dir = sandbox();
    let from = root().join("tests/fixtures/wandb");
    for e in std::fs::read_dir(&from).expect("fixtures") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, dir.join(p.file_name().expect("a name"))).expect("copy");
    }
    let job = dir.join("program.yaml");
    (dir, job)
}

fn sweep(dir: &Sandbox, file: &str, more: &[&str]) -> (std::process::Output, PathBuf) {
    let out = dir.join(format!("out-{file}"));
    let job = dir.join(format!("{file}.yaml"));
    let o = dir.run_into("sweep", &job, &out, more);
    (o, out)
}

fn params(row: &Row) -> serde_json::Value {
    serde_json::from_str(&row["params"]).expect("params json")
}

#[test]
fn every_fixture_dry_runs() {
    let (dir, _) = wandb_dir();
    let files = [
        "program",
        "command-list",
        "distributions",
        "distributions-bayes",
        "nested",
        "args-forms",
    ];
    for f in files {
        let (o, _) = sweep(&dir, f, &["--dry-run"]);
        assert_eq!(o.status.code(), Some(0), "{f}: {}", stderr(&o));
    }
}

#[test]
fn a_program_runs_with_wandbs_default_command_and_minimizes_by_default() {
    let (dir, _) = wandb_dir();
    let (o, out) = sweep(&dir, "program", &["--concurrency", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("metric.goal is not given: val_loss minimized, as W&B does"),
        "{err}"
    );
    for key in ["description", "project", "entity"] {
        assert!(err.contains(&format!("`{key}` is W&B's")), "{key}: {err}");
    }
    let rows = trials_csv(&out);
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|r| r["state"] == "COMPLETE"), "{rows:?}");
    // `optimizer` is the command's own parameter, values W&B users give it included.
    for r in &rows {
        let o = params(r)["optimizer"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(o == "adamw" || o == "lion", "{r:?}");
    }
    // The best is the smallest val_loss.
    let best: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(out.join("best.yaml")).unwrap()).unwrap();
    let least = rows
        .iter()
        .min_by(|a, b| {
            let m = |r: &Row| r["metric"].parse::<f64>().unwrap();
            m(a).total_cmp(&m(b))
        })
        .unwrap();
    assert_eq!(best["trial_id"].as_str(), Some(least["trial_id"].as_str()));
    // --seed runs the same file over another seed.
    let s1 = dir.join("seed1");
    let s2 = dir.join("seed2");
    for (seed, out) in [("1", &s1), ("2", &s2)] {
        let o = dir.gpumux(&[
            "sweep",
            s(&dir.join("program.yaml")),
            "--out",
            s(out),
            "--seed",
            seed,
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let lrs = |out: &Path| -> Vec<String> {
        trials_csv(out)
            .iter()
            .map(|r| params(r)["lr"].to_string())
            .collect()
    };
    assert_ne!(lrs(&s1), lrs(&s2));
}

#[test]
fn wandbs_list_command_runs_its_macros_and_a_float_eta() {
    let (dir, _) = wandb_dir();
    let (o, out) = sweep(&dir, "command-list", &["--concurrency", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = trials_csv(&out);
    assert_eq!(rows.len(), 6);
    for r in &rows {
        // `--epochs=2` came before ${args}: every trial trained at most 2 epochs.
        let e: u32 = r["epochs"].parse().unwrap();
        assert!(e <= 2, "{r:?}");
        assert!(
            ["COMPLETE", "PRUNED"].contains(&r["state"].as_str()),
            "{r:?}"
        );
    }
}

#[test]
fn every_distribution_of_wandbs_reference_draws_what_it_says() {
    let (dir, _) = wandb_dir();
    for file in ["distributions", "distributions-bayes"] {
        let (o, out) = sweep(&dir, file, &["--concurrency", "2"]);
        assert_eq!(o.status.code(), Some(0), "{file}: {}", stderr(&o));
        let rows = trials_csv(&out);
        assert_eq!(rows.len(), 8, "{file}");
        for r in &rows {
            assert_eq!(r["state"], "COMPLETE", "{file}: {r:?}");
            let p = params(r);
            let num = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("{k}: {p}"));
            let whole = |x: f64, q: f64| ((x / q).round() * q - x).abs() < 1e-9;
            assert_eq!(num("constant_p"), 5.0, "{p}");
            assert!(["a", "b", "c"].contains(&p["categorical_p"].as_str().unwrap()));
            assert!(["a", "b"].contains(&p["weighted_p"].as_str().unwrap()));
            let i = num("int_p");
            assert!(i.fract() == 0.0 && (1.0..=9.0).contains(&i), "{p}");
            assert!((-1.5..=2.5).contains(&num("uniform_p")), "{p}");
            assert!(whole(num("q_uniform_p"), 2.0), "{p}");
            assert!((0.0183..=1.0).contains(&num("log_uniform_p")), "{p}");
            assert!(whole(num("q_log_uniform_p"), 4.0), "{p}");
            assert!(whole(num("q_log_uniform_values_p"), 10.0), "{p}");
            assert!((0.0067..=1.0).contains(&num("inv_log_uniform_p")), "{p}");
            assert!(
                (0.001..=1.0).contains(&num("inv_log_uniform_values_p")),
                "{p}"
            );
            assert!(num("normal_p").is_finite(), "{p}");
            assert!(whole(num("q_normal_p"), 0.5), "{p}");
            assert!(num("log_normal_p") > 0.0, "{p}");
            assert!(whole(num("q_log_normal_p"), 1.0), "{p}");
            assert!((0.0..=1.0).contains(&num("beta_p")), "{p}");
            assert!(
                whole(num("q_beta_p"), 0.1) && (0.0..=1.0).contains(&num("q_beta_p")),
                "{p}"
            );
        }
    }
}

#[test]
fn nested_parameters_are_dotted_names_passed_back_nested() {
    let (dir, _) = wandb_dir();
    let (o, out) = sweep(&dir, "nested", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for r in trials_csv(&out) {
        let p = params(&r);
        assert!(p["optimizer.lr"].is_f64(), "{p}");
        assert!(
            [0.8, 0.9].contains(&p["optimizer.momentum"].as_f64().unwrap()),
            "{p}"
        );
        // The script read `{"epochs": 2, "optimizer": {...}}` and trained 2 epochs.
        assert_eq!(r["epochs"], "2", "{r:?}");
    }
}

#[test]
fn args_forms_and_a_target_that_ends_the_sweep() {
    let (dir, _) = wandb_dir();
    let (o, out) = sweep(&dir, "args-forms", &["--concurrency", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = stdout(&o);
    assert!(
        said.contains("metric.target 0.5 reached by trial"),
        "{said}"
    );
    let rows = trials_csv(&out);
    assert!(rows.len() < 4, "the sweep stopped early: {rows:?}");
    for r in &rows {
        let file = out.join("trials").join(&r["trial_id"]).join("args.json");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(json["lr"], params(r)["lr"], "{file:?}");
    }
    // A resume finds the target reached and starts nothing.
    let (o, _) = sweep(&dir, "args-forms", &["--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("already reached metric.target"),
        "{}",
        stdout(&o)
    );
    assert_eq!(trials_csv(&out).len(), rows.len());
    // Another command's rows reached nobody's target but their own: the edited job runs.
    let job = dir.join("args-forms.yaml");
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("  - ${program}\n", "  - ${program}\n  - --note=edited\n");
    std::fs::write(&job, text).unwrap();
    let (o, _) = sweep(&dir, "args-forms", &["--resume", "--concurrency", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stdout(&o).contains("already reached"), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("metric.target 0.5 reached by trial"),
        "{}",
        stdout(&o)
    );
    assert!(trials_csv(&out).len() > rows.len());
}

#[test]
fn wandb_entries_gpumux_cannot_take_are_refused_in_its_own_words() {
    let dir = sandbox();
    for (entry, key, says) in [
        (
            "lr: {min: abc, max: 1}",
            "parameters",
            "min and max must be numbers",
        ),
        (
            "lr: {a: 2, b: 3}",
            "parameters.lr.distribution",
            "write `distribution: beta`",
        ),
        (
            "lr: {values: [1, 2], distribution: uniform}",
            "parameters.lr.distribution",
            "does not apply to `values`",
        ),
        (
            "lr: {min: 1, max: 2, distribution: gamma}",
            "parameters.lr.distribution",
            "categorical_w_probabilities",
        ),
        (
            "opt: {parameters: {lr: {value: 1}}, value: 3}",
            "parameters.opt",
            "has nested `parameters` and a distribution of its own",
        ),
    ] {
        let job = dir.job(
            "bad.yaml",
            format!("program: train.py\nrun_cap: 2\nparameters:\n  {entry}\n"),
        );
        let o = dir.run_into("sweep", &job, &dir.join("out"), &["--dry-run"]);
        assert_eq!(o.status.code(), Some(2), "{entry}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(key) && e.contains(says), "{entry}: {e}");
        assert!(e.contains("line"), "{entry}: {e}");
        assert!(
            !e.contains("untagged") && !e.contains("unknown field"),
            "{entry}: {e}"
        );
    }
}

#[test]
fn a_wandb_display_name_names_its_folders_and_unsafe_names_stay_refused() {
    let (dir, job) = wandb_dir();
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("name: wandb-program", "name: \"My sweep #1 (lr)\"");
    let named = dir.job("named.yaml", text);
    let o = dir.gpumux(&["sweep", s(&named), "--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("its folders are named \"My-sweep-1-lr\""),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).contains("My-sweep-1-lr-sweep"), "{}", stdout(&o));
    for bad in ["\"a/b c\"", "\"..\"", "\"a\\tb\""] {
        let text = std::fs::read_to_string(&job)
            .unwrap()
            .replace("name: wandb-program", &format!("name: {bad}"));
        let j = dir.job("bad.yaml", text);
        let o = dir.gpumux(&["sweep", s(&j), "--dry-run"]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
    }
}
