//! `concurrency: auto` on the real binary: its probe under `process` mode, and a signal while it probes.

mod support;
use std::io::BufReader;
use support::*;

/// Five trials of a small MLP, as many at a time as the probe finds.
fn auto() -> JobYaml {
    JobYaml::new()
        .name("auto")
        .model(mlp(&[32]))
        .data(synthetic(1024, 128))
        .train(epochs(2, 32))
        .method("grid")
        .param("lr", values(&["0.001", "0.002", "0.003", "0.004", "0.005"]))
        .concurrency("auto")
        .backend("cpu")
}

#[test]
fn the_probe_runs_under_process_mode_and_the_sweep_completes() {
    let dir = sandbox();
    let job = dir.job("auto.yaml", auto());
    for split in ["process", "logical"] {
        let out = dir.join(split);
        let o = dir.run_into("sweep", &job, &out, &["--split", split]);
        assert_eq!(o.status.code(), Some(0), "{split}: {}", stderr(&o));
        let said = stdout(&o);
        assert!(said.contains("concurrency auto: probed"), "{split}: {said}");
        let rows = trials_csv(&out);
        assert_eq!(rows.len(), 5);
        assert!(rows.iter().all(|r| r["state"] == "COMPLETE"), "{rows:?}");
        assert!(rows.iter().all(|r| r["split"] == split), "{rows:?}");
    }
}

#[test]
fn a_signal_during_the_probe_is_an_interruption_not_bad_input() {
    let dir = sandbox();
    // A model whose 20 probe steps take a while: the signal comes while the probe calibrates.
    let slow = auto()
        .model(mlp(&[2048, 2048]))
        .data(synthetic(16384, 128))
        .train(epochs(2, 512));
    let job = dir.job("slow.yaml", slow);
    for grace in ["30", "0"] {
        let out = dir.join(format!("out-{grace}"));
        let mut child = dir.spawn(&[
            "sweep",
            s(&job),
            "--out",
            s(&out),
            "--grace",
            grace,
            "--split",
            "logical",
        ]);
        // The data line comes just before the probe starts.
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let seen = read_until(&mut err, |line| line.starts_with("data: "));
        assert!(seen.contains("data: "), "{seen}");
        signal(&child, libc::SIGTERM);
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(3), "grace {grace}: {seen}{rest}");
        assert!(rest.contains("interrupted"), "{rest}");
        assert!(!rest.contains("set a number instead"), "{rest}");
    }
}
