//! Every malformed job in tests/fixtures/bad-jobs gives exit code 2 and one line naming the problem; none panics.

mod support;
use support::*;

#[test]
fn every_bad_job_is_a_one_line_error_with_exit_code_2() {
    let root = root();
    let expect = std::fs::read_to_string(root.join("tests/fixtures/bad-jobs/EXPECT.tsv"))
        .expect("EXPECT.tsv");
    let out = sandbox();
    let mut checked = 0;
    let mut failures = Vec::new();
    for line in expect
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (file, needle) = line.split_once('\t').expect("fixture<TAB>text");
        let path = root.join("tests/fixtures/bad-jobs").join(file);
        assert!(path.exists(), "fixture {file} is listed but missing");
        let o = gpumux(&root, &["fib", s(&path), "--out", s(out.path())]);
        let err = stderr(&o);
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        let ok = o.status.code() == Some(2)
            && lines.len() == 1
            && lines[0].contains(needle)
            && !err.contains("panicked");
        if !ok {
            failures.push(format!(
                "{file}: exit {:?}, stderr: {err:?} (wanted {needle:?})",
                o.status.code()
            ));
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} fixtures");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_fixture_file_is_listed() {
    let dir = root().join("tests/fixtures/bad-jobs");
    let expect = std::fs::read_to_string(dir.join("EXPECT.tsv")).expect("EXPECT.tsv");
    for entry in std::fs::read_dir(&dir).expect("fixtures") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name.ends_with(".yaml") {
            assert!(
                expect.lines().any(|l| l.starts_with(&format!("{name}\t"))),
                "{name} has no expectation"
            );
        }
    }
}

#[test]
fn bad_flags_exit_2() {
    let o = gpumux(&root(), &["fib"]);
    assert_eq!(o.status.code(), Some(2));
    let o = gpumux(&root(), &["devices", "--n", "3", "--split", "sideways"]);
    assert_eq!(o.status.code(), Some(2));
    let o = gpumux(&root(), &["train", "--data", "imagenet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("imagenet"));
    let o = gpumux(&root(), &["train", "--lr", "-1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("train.lr"));
}

#[test]
fn an_unusable_backend_is_exit_4() {
    if gpu_usable() {
        eprintln!("skipped: a GPU is usable here, so backend cuda is not an error");
        return;
    }
    let o = gpumux(
        &root(),
        &[
            "fib",
            "jobs/mnist-fib.yaml",
            "--backend",
            "cuda",
            "--n",
            "1",
        ],
    );
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(stderr(&o).contains("backend cuda"), "{}", stderr(&o));
}

#[test]
fn a_missing_job_file_is_exit_2() {
    let o = gpumux(&root(), &["fib", "/nonexistent/job.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read the job file"));
}

#[test]
fn an_external_command_job_is_for_sweep_only() {
    for cmd in ["fib", "train"] {
        let o = gpumux(&root(), &[cmd, "jobs/sweep-external.yaml"]);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", stderr(&o));
        assert!(stderr(&o).contains("gpumux sweep"), "{cmd}: {}", stderr(&o));
    }
}
