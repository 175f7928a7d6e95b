//! Writes a sweep output folder at a given scale (trials × epochs), with the project's own writer: the input of `bench/results-memory.sh`.
//!
//! `cargo run --release --example results_at_scale -- OUT TRIALS EPOCHS [PREFIX]`
//!
//! Every trial is COMPLETE and has one progress row per epoch, trial after trial; a `PREFIX`
//! makes the ids of one folder differ from another's (merge inputs that are not copies).

use std::path::PathBuf;
use std::process::ExitCode;

use gpumux::report::{write_rows, ProgressRow, TrialRow, PROGRESS_CSV, TRIALS_CSV};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || {
        eprintln!("usage: results_at_scale OUT TRIALS EPOCHS [PREFIX]");
        ExitCode::from(2)
    };
    let (Some(out), Some(trials), Some(epochs)) = (args.first(), args.get(1), args.get(2)) else {
        return usage();
    };
    let (Ok(trials), Ok(epochs)) = (trials.parse::<u32>(), epochs.parse::<u32>()) else {
        return usage();
    };
    let prefix = args.get(3).cloned().unwrap_or_default();
    let out = PathBuf::from(out);
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("{}: {e}", out.display());
        return ExitCode::from(2);
    }
    let id = |t: u32| {
        format!(
            "{prefix}{:016x}",
            (t as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        )
    };
    let rows: Vec<TrialRow> = (0..trials)
        .map(|t| TrialRow {
            trial_id: id(t),
            split: "logical".into(),
            n: 8,
            slice: t % 8,
            model: "mlp".into(),
            params_lr: 1e-3 * (1.0 + t as f64 / trials as f64),
            params_batch_size: 64,
            params_optimizer: "adam".into(),
            params_momentum: 0.9,
            seed: t as u64,
            state: "COMPLETE".into(),
            test_acc: Some(0.9),
            final_loss: Some(0.3),
            epochs,
            wall_s: 12.5,
            samples_per_s: Some(25_000.0),
            metric: Some(0.9 + t as f64 * 1e-7),
            params: format!(r#"{{"lr":{}}}"#, 1e-3 * (1.0 + t as f64 / trials as f64)),
            ..Default::default()
        })
        .collect();
    if let Err(e) = write_rows(&out.join(TRIALS_CSV), &rows) {
        eprintln!("{e}");
        return ExitCode::from(1);
    }
    let progress = (0..trials).flat_map(|t| {
        (1..=epochs).map(move |e| ProgressRow {
            trial_id: id(t),
            split: "logical".into(),
            n: 8,
            epoch: e,
            train_loss: 1.0 / (e as f64 + t as f64 * 1e-6),
            train_acc: 0.5 + 0.4 * e as f64 / epochs as f64,
            test_loss: 1.1 / e as f64,
            test_acc: 0.5 + 0.39 * e as f64 / epochs as f64,
            wall_s: 0.21 * e as f64,
            ..Default::default()
        })
    });
    let all: Vec<ProgressRow> = progress.collect();
    if let Err(e) = write_rows(&out.join(PROGRESS_CSV), &all) {
        eprintln!("{e}");
        return ExitCode::from(1);
    }
    println!(
        "{}: {trials} trials × {epochs} epochs written",
        out.display()
    );
    ExitCode::SUCCESS
}
