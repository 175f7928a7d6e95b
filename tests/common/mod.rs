//! Helpers shared by the integration tests: run the real binary in a temporary folder.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

/// The repository root (tests run with it as the current directory): `GPUMUX_ROOT` when set
/// (test binaries carried to a copy of the tree elsewhere), else where the crate was built.
pub fn root() -> PathBuf {
    std::env::var_os("GPUMUX_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Runs gpumux with `args` in `cwd`.
pub fn gpumux(cwd: &Path, args: &[&str]) -> Output {
    assert_cmd::Command::cargo_bin("gpumux")
        .expect("the gpumux binary is built for tests")
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("gpumux runs")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Writes a job file into `dir` and returns its path.
pub fn job(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("job written");
    p
}

/// Reads a CSV file into records keyed by header.
pub fn read_csv(path: &Path) -> Vec<std::collections::HashMap<String, String>> {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let headers = r.headers().expect("headers").clone();
    r.records()
        .map(|rec| {
            let rec = rec.expect("record");
            headers
                .iter()
                .map(String::from)
                .zip(rec.iter().map(String::from))
                .collect()
        })
        .collect()
}
