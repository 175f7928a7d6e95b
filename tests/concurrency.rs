//! `concurrency: auto` on the real binary: its probe under `process` mode, and a signal while it probes.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("gpumux")
}

const AUTO: &str = "name: auto
model: {kind: mlp, hidden: [32]}
data: {source: synthetic, train_samples: 1024, test_samples: 128}
train: {epochs: 2, batch_size: 32}
method: grid
parameters:
  lr: {values: [0.001, 0.002, 0.003, 0.004, 0.005]}
concurrency: auto
backend: cpu
";

#[test]
fn the_probe_runs_under_process_mode_and_the_sweep_completes() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path(), "auto.yaml", AUTO);
    for split in ["process", "logical"] {
        let out = dir.path().join(split);
        let o = gpumux(
            dir.path(),
            &[
                "sweep",
                job.to_str().unwrap(),
                "--split",
                split,
                "--out",
                out.to_str().unwrap(),
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{split}: {}", stderr(&o));
        let said = stdout(&o);
        assert!(said.contains("concurrency auto: probed"), "{split}: {said}");
        let rows = read_csv(&out.join("trials.csv"));
        assert_eq!(rows.len(), 5);
        assert!(rows.iter().all(|r| r["state"] == "COMPLETE"), "{rows:?}");
        assert!(rows.iter().all(|r| r["split"] == split), "{rows:?}");
    }
}

#[test]
fn a_signal_during_the_probe_is_an_interruption_not_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    // A model whose 20 probe steps take a while: the signal comes while the probe calibrates.
    let text = AUTO
        .replace("hidden: [32]", "hidden: [2048, 2048]")
        .replace("batch_size: 32", "batch_size: 512")
        .replace("train_samples: 1024", "train_samples: 16384");
    let job = job(dir.path(), "slow.yaml", &text);
    for grace in ["30", "0"] {
        let out = dir.path().join(format!("out-{grace}"));
        let mut child = Command::new(bin())
            .current_dir(dir.path())
            .args([
                "sweep",
                job.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--grace",
                grace,
                "--split",
                "logical",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The data line comes just before the probe starts.
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            if err.read_line(&mut line).unwrap() == 0 {
                break;
            }
            seen.push_str(&line);
            if line.starts_with("data: ") {
                break;
            }
        }
        assert!(seen.contains("data: "), "{seen}");
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(3), "grace {grace}: {seen}{rest}");
        assert!(rest.contains("interrupted"), "{rest}");
        assert!(!rest.contains("set a number instead"), "{rest}");
    }
}
