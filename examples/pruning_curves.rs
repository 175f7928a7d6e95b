//! Early termination on learning curves that cross: a simulated asynchronous sweep judged by the sweep's own pruner, one bracket against Hyperband's several; the input of `bench/pruning-curves.sh`.
//!
//! `cargo run --release --example pruning_curves -- [TRIALS] [EPOCHS] [CONCURRENCY] [SEEDS]`
//! (default 300 27 8 10)
//!
//! Each trial's test accuracy after epoch `t` is `q·(1 − e^(−t/τ))` plus a little noise, its
//! final quality `q` uniform in [0.5, 0.95] and its pace `τ` log-uniform in [0.5, 12] epochs:
//! a slow starter with a high `q` trails at the first rungs and leads at the end. `CONCURRENCY`
//! slots take the trials in order as they come free, an epoch a time unit, and each epoch is
//! judged as the sweep judges it (`Pruner::goes_on`, `eta` 3, rungs at 1, 3, 9). For each seed
//! and each way of pruning, it prints the trial-epochs trained against the sweep unpruned, and
//! whether the unpruned sweep's best trial was kept to its last epoch. CSV:
//! `seed,brackets,trial_epochs_ratio,best_kept,best_rank_of_kept`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::process::ExitCode;

use gpumux::job::{EarlyTerminate, Goal};
use gpumux::rng::HostRng;
use gpumux::runners::sweep::hyperband::Pruner;
use gpumux::train::EpochStats;

struct Curve {
    q: f64,
    tau: f64,
    noise: Vec<f64>,
}

impl Curve {
    fn at(&self, t: u32) -> f64 {
        self.q * (1.0 - (-f64::from(t) / self.tau).exp()) + self.noise[t as usize - 1]
    }
}

fn stats(epoch: u32, acc: f64) -> EpochStats {
    EpochStats {
        epoch,
        train_loss: 1.0 - acc,
        train_acc: acc,
        test_loss: 1.0 - acc,
        test_acc: acc,
        wall_s: 0.0,
        extra: Default::default(),
    }
}

/// Runs the sweep of `curves` under `pruner`: the epochs each trial trained.
fn sweep(
    curves: &[Curve],
    epochs: u32,
    concurrency: usize,
    pruner: &Pruner,
    seed: u64,
) -> Vec<u32> {
    let mut trained = vec![0u32; curves.len()];
    // (time its next epoch ends, trial, that epoch): the earliest first, then the lower trial.
    let mut events = BinaryHeap::new();
    let mut next = 0usize;
    for _ in 0..concurrency.min(curves.len()) {
        events.push(Reverse((1u64, next, 1u32)));
        next += 1;
    }
    while let Some(Reverse((time, i, t))) = events.pop() {
        trained[i] = t;
        let id = format!("s{seed}-t{i:04}");
        let goes_on = pruner.goes_on(&id, &stats(t, curves[i].at(t)));
        if goes_on && t < epochs {
            events.push(Reverse((time + 1, i, t + 1)));
        } else if next < curves.len() {
            events.push(Reverse((time + 1, next, 1)));
            next += 1;
        }
    }
    trained
}

fn main() -> ExitCode {
    let args: Vec<u64> = match std::env::args().skip(1).map(|a| a.parse()).collect() {
        Ok(a) => a,
        Err(_) => {
            eprintln!("usage: pruning_curves [TRIALS] [EPOCHS] [CONCURRENCY] [SEEDS]");
            return ExitCode::from(2);
        }
    };
    let arg = |i: usize, d: u64| args.get(i).copied().unwrap_or(d);
    let (n, epochs, concurrency, seeds) = (
        arg(0, 300) as usize,
        arg(1, 27) as u32,
        arg(2, 8) as usize,
        arg(3, 10),
    );
    let schedule = EarlyTerminate {
        kind: "hyperband".into(),
        min_iter: Some(1),
        max_iter: None,
        eta: 3.0,
        strict: None,
        s: None,
        brackets: None,
    };
    let rungs = schedule.rungs(epochs);
    println!("seed,brackets,trial_epochs_ratio,best_kept,best_rank_of_kept");
    for seed in 1..=seeds {
        let mut rng = HostRng::new(seed);
        let curves: Vec<Curve> = (0..n)
            .map(|_| Curve {
                q: rng.uniform_f32(0.5, 0.95) as f64,
                tau: (rng.uniform_f32(0.5f32.ln(), 12f32.ln()) as f64).exp(),
                noise: (0..epochs).map(|_| 0.005 * rng.normal()).collect(),
            })
            .collect();
        let finals: Vec<f64> = curves.iter().map(|c| c.at(epochs)).collect();
        let best = (0..n)
            .max_by(|&a, &b| finals[a].total_cmp(&finals[b]))
            .unwrap_or(0);
        for brackets in [1, rungs.len() + 1] {
            let pruner =
                Pruner::with_brackets(rungs.clone(), 3.0, Goal::Maximize, "test_acc", brackets);
            let trained = sweep(&curves, epochs, concurrency, &pruner, seed);
            let total: u64 = trained.iter().map(|&t| u64::from(t)).sum();
            let ratio = total as f64 / (n as u64 * u64::from(epochs)) as f64;
            // The best of the trials kept to the end, ranked among all by their final value.
            let kept_best = (0..n)
                .filter(|&i| trained[i] == epochs)
                .max_by(|&a, &b| finals[a].total_cmp(&finals[b]));
            let rank = kept_best.map_or(n, |k| finals.iter().filter(|&&f| f > finals[k]).count());
            println!(
                "{seed},{brackets},{ratio:.3},{},{rank}",
                u8::from(trained[best] == epochs)
            );
        }
    }
    ExitCode::SUCCESS
}
