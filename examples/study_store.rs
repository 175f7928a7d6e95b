//! The study store's throughput with nothing to run: N worker processes of one study take trials and record their ends (a result row and three epoch rows each) until the run cap is reached; the input of `bench/study.sh`.
//!
//! `cargo run --release --example study_store -- URL WORKERS TRIALS`
//!
//! Each worker is this program again (`--worker URL TRIALS NAME`), with its own connection, as
//! `gpumux sweep --study` workers are. Once all have ended, the study is read back: every index
//! below TRIALS must have ended COMPLETE exactly once (exit 1 otherwise). Prints one CSV line:
//! `what,workers,trials,seconds,results_per_s`.

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use gpumux::job::Goal;
use gpumux::report::{ProgressRow, TrialRow};
use gpumux::runners::sweep::study::{self, End, EpochRow, Study, StudyKey};

const LEASE: Duration = Duration::from_secs(60);

fn key() -> StudyKey {
    StudyKey {
        job: "store-bench".into(),
        space: "store-bench".into(),
        goal: Goal::Maximize,
    }
}

/// One worker: takes and ends trials until none is left; how many it ended.
fn worker(url: &str, trials: u32, name: &str) -> Result<u32, study::StudyError> {
    let mut store = Study::open(url, &key(), name)?;
    let mut ended = 0;
    while let Some(c) = study::with_retries(|| store.claim(trials, LEASE, study::now(), None))? {
        let row = TrialRow {
            trial_id: format!("t{:06}", c.index),
            state: "COMPLETE".into(),
            metric: Some(0.5),
            epochs: 3,
            params: "{\"lr\": 0.01}".into(),
            ..Default::default()
        };
        let epochs: Vec<EpochRow> = (1..=3)
            .map(|e| EpochRow {
                index: c.index,
                epoch: e,
                row: study::encode_epoch(&ProgressRow {
                    trial_id: row.trial_id.clone(),
                    epoch: e,
                    test_acc: 0.5,
                    ..Default::default()
                })
                .unwrap_or_default(),
            })
            .collect();
        let text = study::encode_row(&row)?;
        let end = End {
            state: "COMPLETE",
            metric: row.metric,
            epochs: 3,
            row: &text,
        };
        if study::with_retries(|| store.finish(c.index, &end, &epochs))? {
            ended += 1;
        }
    }
    Ok(ended)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, url, trials, name] = args.as_slice() {
        if flag == "--worker" {
            let trials = trials.parse().unwrap_or(0);
            return match worker(url, trials, name) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("study_store worker {name}: {e}");
                    ExitCode::FAILURE
                }
            };
        }
    }
    let [url, workers, trials] = args.as_slice() else {
        eprintln!("usage: study_store URL WORKERS TRIALS");
        return ExitCode::from(2);
    };
    let (Ok(workers), Ok(trials)) = (workers.parse::<u32>(), trials.parse::<u32>()) else {
        eprintln!("WORKERS and TRIALS are whole numbers");
        return ExitCode::from(2);
    };
    let Ok(me) = std::env::current_exe() else {
        eprintln!("cannot find this program");
        return ExitCode::FAILURE;
    };
    // The store is made before the clock starts.
    if let Err(e) = Study::open(url, &key(), "setup") {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let start = Instant::now();
    let children: Vec<_> = (0..workers)
        .filter_map(|w| {
            Command::new(&me)
                .args(["--worker", url, &trials.to_string(), &format!("w{w}")])
                .spawn()
                .ok()
        })
        .collect();
    let mut ok = children.len() == workers as usize;
    for mut c in children {
        ok &= c.wait().is_ok_and(|s| s.success());
    }
    let secs = start.elapsed().as_secs_f64();
    // Every index ended COMPLETE once.
    let read = Study::open_existing(url).and_then(|mut s| s.trials());
    let complete = match read {
        Ok(rows) => {
            let idx: Vec<u32> = rows
                .iter()
                .filter(|(_, s, _)| s == "COMPLETE")
                .map(|(i, _, _)| *i)
                .collect();
            idx == (0..trials).collect::<Vec<_>>() && rows.len() == trials as usize
        }
        Err(e) => {
            eprintln!("{e}");
            false
        }
    };
    if !ok || !complete {
        eprintln!("study_store: a worker failed, or the study does not hold each trial once");
        return ExitCode::FAILURE;
    }
    println!(
        "store only (take + end with 3 epochs; {}),{workers},{trials},{secs:.2},{:.0}",
        url.split(':').next().unwrap_or("?"),
        f64::from(trials) / secs
    );
    ExitCode::SUCCESS
}
