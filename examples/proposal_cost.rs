//! Times `method: bayes` proposals after n trials (the TPE's fit and draw, with trials in flight, and the history's insert of a result): the input of `bench/proposal-cost.sh`.
//!
//! `cargo run --release --example proposal_cost -- [N...]` (default 100 1000 5900 10000 35000)
//!
//! The space has nine parameters: six uniform in [0, 1] (Hartmann-6's), a log-uniform learning
//! rate, a categorical optimizer and an integer depth. For each n, a history of n trials at
//! random points (their value Hartmann-6's, with a penalty for two of the three optimizers) is
//! built; then 50 proposals are timed, each with 8 trials in flight, and each result's insert.
//! Prints CSV: `n,proposals,median_ms,p90_ms,max_ms,insert_us`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use gpumux::space::tpe::{Observation, Tpe};
use gpumux::space::{Dist, ParamValue, Space};

/// The history a proposal reads (the one line `bench/proposal-cost.sh --against` adapts to an
/// older build's type).
type Hist = gpumux::space::tpe::History;

const PROPOSALS: usize = 50;
const IN_FLIGHT: usize = 8;

fn space() -> Space {
    let mut dists = BTreeMap::new();
    for i in 1..=6 {
        dists.insert(format!("x{i}"), Dist::Uniform { min: 0.0, max: 1.0 });
    }
    dists.insert(
        "lr".into(),
        Dist::LogUniformValues {
            min: 1e-5,
            max: 1.0,
        },
    );
    dists.insert(
        "opt".into(),
        Dist::Categorical {
            values: ["sgd", "adam", "rmsprop"]
                .iter()
                .map(|w| ParamValue::Word(w.to_string()))
                .collect(),
            probabilities: None,
        },
    );
    dists.insert("depth".into(), Dist::IntUniform { min: 1, max: 8 });
    Space {
        method: gpumux::space::Method::Bayes,
        dists,
    }
}

/// Hartmann-6 (its minimum is about −3.32), plus 1 for the optimizers other than `adam`.
fn value(p: &BTreeMap<String, ParamValue>) -> f64 {
    const A: [[f64; 6]; 4] = [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ];
    const P: [[f64; 6]; 4] = [
        [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
        [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
        [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
        [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
    ];
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    let x: Vec<f64> = (1..=6)
        .map(|i| match p.get(&format!("x{i}")) {
            Some(ParamValue::Num(v)) => *v,
            _ => 0.5,
        })
        .collect();
    let h: f64 = (0..4)
        .map(|i| {
            let s: f64 = (0..6).map(|j| A[i][j] * (x[j] - P[i][j]).powi(2)).sum();
            ALPHA[i] * (-s).exp()
        })
        .sum();
    let penalty = match p.get("opt") {
        Some(ParamValue::Word(w)) if w == "adam" => 0.0,
        _ => 1.0,
    };
    -h + penalty
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ns: Vec<usize> = if args.is_empty() {
        vec![100, 1_000, 5_900, 10_000, 35_000]
    } else {
        match args.iter().map(|a| a.parse()).collect::<Result<_, _>>() {
            Ok(ns) => ns,
            Err(_) => {
                eprintln!("usage: proposal_cost [N...]");
                return ExitCode::from(2);
            }
        }
    };
    let space = space();
    let seed = 7;
    let tpe = Tpe::for_run_cap(u32::MAX);
    println!("n,proposals,median_ms,p90_ms,max_ms,insert_us");
    for n in ns {
        let mut done: Hist = Default::default();
        for i in 0..n {
            let point = space.random_point(seed, i);
            let loss = value(&point);
            done.push(Observation::new(point, loss));
        }
        let pending: Vec<_> = (0..IN_FLIGHT)
            .map(|k| space.random_point(seed ^ 0x5eed, n + k))
            .collect();
        let mut times = Vec::with_capacity(PROPOSALS);
        let mut insert_s = 0.0;
        for k in 0..PROPOSALS {
            let t = Instant::now();
            let point = tpe.propose(&space, seed, n + k, &done, &pending);
            times.push(t.elapsed().as_secs_f64() * 1e3);
            let loss = value(&point);
            let t = Instant::now();
            done.push(Observation::new(point, loss));
            insert_s += t.elapsed().as_secs_f64();
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{n},{PROPOSALS},{:.3},{:.3},{:.3},{:.1}",
            quantile(&times, 0.5),
            quantile(&times, 0.9),
            times[times.len() - 1],
            insert_s / PROPOSALS as f64 * 1e6
        );
    }
    ExitCode::SUCCESS
}
