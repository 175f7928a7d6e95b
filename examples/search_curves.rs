//! Early termination and bayes on learning curves that cross: simulated asynchronous sweeps judged by the sweep's own pruner and proposed by its own sampler; the input of `bench/search-quality.sh`.
//!
//! `cargo run --release --example search_curves -- [TRIALS] [EPOCHS] [CONCURRENCY] [SEEDS] [DIR]`
//! (default 300 27 8 10, no DIR)
//!
//! Two parts, each a CSV row per seed and way of pruning on stdout
//! (`kind,pruner,seed,trial_epochs_ratio,best_kept,best_rank_of_kept,late_share,best_trial,startup,best_value`):
//!
//! - `prune`: each trial's test accuracy after epoch `t` is `q·(1 − e^(−t/τ))` plus a little
//!   noise, its final quality `q` uniform in [0.5, 0.95] and its pace `τ` log-uniform in
//!   [0.5, 12] epochs: a slow starter with a high `q` trails at the first rungs and leads at the
//!   end. Judged with one bracket and with Hyperband's (eta 3, rungs 1, 3, 9): the trial-epochs
//!   trained against the sweep unpruned, and whether the unpruned sweep's best trial was kept
//!   to its last epoch. With DIR, each seed's curves go to `DIR/curves-SEED.csv` (one row per
//!   trial and epoch), for a peer's pruner to judge the very same curves.
//! - `bayes`: TRIALS trials proposed by `method: bayes` over a training-like space (a log
//!   learning rate, a batch size among 32, 64, 128 and 256, an integer width), each trial's
//!   curve made by its point: a larger batch ends higher at its own best learning rate but
//!   starts slower, so that the first rungs favour the small batches. Unpruned, one bracket and
//!   Hyperband's: the trial-epochs trained against the sweep unpruned, the share of the late
//!   half of the trials on their most proposed batch size, the trial that found the best final
//!   value, and that value.
//!
//! `CONCURRENCY` slots take the trials in order as they come free, an epoch a time unit.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;
use std::process::ExitCode;

use gpumux::job::{EarlyTerminate, Goal};
use gpumux::rng::HostRng;
use gpumux::runners::sweep::hyperband::Pruner;
use gpumux::space::tpe::{History, Observation, Tpe};
use gpumux::space::{Dist, Method, ParamValue, Space};
use gpumux::train::EpochStats;

/// A learning curve: its final quality, its pace and its noise per epoch.
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

/// An asynchronous sweep of `count` trials, `concurrency` at a time, an epoch a time unit: the
/// epochs each trial trained. `start(i)` gives trial `i`'s curve as its slot takes it (after
/// `ended` was told of every trial that ended before), and `ended(i, epochs)` is told when a
/// trial ends, pruned or not.
fn sweep(
    count: usize,
    epochs: u32,
    concurrency: usize,
    pruner: Option<&Pruner>,
    seed: u64,
    start: &mut dyn FnMut(usize) -> Curve,
    ended: &mut dyn FnMut(usize, u32, f64),
) -> Vec<u32> {
    let mut trained = vec![0u32; count];
    let mut curves: Vec<Option<Curve>> = (0..count).map(|_| None).collect();
    // (time its next epoch ends, trial, that epoch): the earliest first, then the lower trial.
    let mut events = BinaryHeap::new();
    let mut next = 0usize;
    for _ in 0..concurrency.min(count) {
        curves[next] = Some(start(next));
        events.push(Reverse((1u64, next, 1u32)));
        next += 1;
    }
    while let Some(Reverse((time, i, t))) = events.pop() {
        trained[i] = t;
        let value = curves[i].as_ref().map_or(0.0, |c| c.at(t));
        let id = format!("s{seed}-t{i:04}");
        let goes_on = pruner.is_none_or(|p| p.goes_on(&id, &stats(t, value)));
        if goes_on && t < epochs {
            events.push(Reverse((time + 1, i, t + 1)));
            continue;
        }
        ended(i, t, value);
        if next < count {
            curves[next] = Some(start(next));
            events.push(Reverse((time + 1, next, 1)));
            next += 1;
        }
    }
    trained
}

/// The pruners compared: none, one bracket, and Hyperband's brackets (one more than the rungs).
fn pruners(epochs: u32) -> Vec<(String, Option<Pruner>)> {
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
    let with = |b: usize| Pruner::with_brackets(rungs.clone(), 3.0, Goal::Maximize, "test_acc", b);
    vec![
        ("unpruned".into(), None),
        ("gpumux hyperband 1 bracket".into(), Some(with(1))),
        (
            format!("gpumux hyperband {} brackets", rungs.len() + 1),
            Some(with(rungs.len() + 1)),
        ),
    ]
}

/// The `prune` part for one seed: its rows, and its curves as CSV.
fn prune(n: usize, epochs: u32, concurrency: usize, seed: u64) -> (String, String) {
    let mut rng = HostRng::new(seed);
    let curves: Vec<Curve> = (0..n)
        .map(|_| Curve {
            q: rng.uniform_f32(0.5, 0.95) as f64,
            tau: (rng.uniform_f32(0.5f32.ln(), 12f32.ln()) as f64).exp(),
            noise: (0..epochs).map(|_| 0.005 * rng.normal()).collect(),
        })
        .collect();
    let mut dump = String::from("trial,epoch,value\n");
    for (i, c) in curves.iter().enumerate() {
        for t in 1..=epochs {
            let _ = writeln!(dump, "{i},{t},{}", c.at(t));
        }
    }
    let finals: Vec<f64> = curves.iter().map(|c| c.at(epochs)).collect();
    let best = (0..n)
        .max_by(|&a, &b| finals[a].total_cmp(&finals[b]))
        .unwrap_or(0);
    let mut rows = String::new();
    for (name, pruner) in pruners(epochs).iter().skip(1) {
        let clone = |i: usize| Curve {
            q: curves[i].q,
            tau: curves[i].tau,
            noise: curves[i].noise.clone(),
        };
        let trained = sweep(
            n,
            epochs,
            concurrency,
            pruner.as_ref(),
            seed,
            &mut |i| clone(i),
            &mut |_, _, _| {},
        );
        let total: u64 = trained.iter().map(|&t| u64::from(t)).sum();
        let ratio = total as f64 / (n as u64 * u64::from(epochs)) as f64;
        // The best of the trials kept to the end, ranked among all by their final value.
        let kept_best = (0..n)
            .filter(|&i| trained[i] == epochs)
            .max_by(|&a, &b| finals[a].total_cmp(&finals[b]));
        let rank = kept_best.map_or(n, |k| finals.iter().filter(|&&f| f > finals[k]).count());
        let _ = writeln!(
            rows,
            "prune,{name},{seed},{ratio:.3},{},{rank},,,,",
            u8::from(trained[best] == epochs)
        );
    }
    (rows, dump)
}

/// The training-like space of the `bayes` part.
fn space() -> Space {
    let dists = BTreeMap::from([
        (
            "lr".to_string(),
            Dist::LogUniformValues {
                min: 1e-4,
                max: 1e-1,
            },
        ),
        (
            "batch_size".to_string(),
            Dist::Categorical {
                values: [32.0, 64.0, 128.0, 256.0].map(ParamValue::Num).to_vec(),
                probabilities: None,
            },
        ),
        ("width".to_string(), Dist::IntUniform { min: 1, max: 8 }),
    ]);
    Space {
        method: Method::Bayes,
        dists,
    }
}

fn num(p: &BTreeMap<String, ParamValue>, k: &str) -> f64 {
    match p.get(k) {
        Some(ParamValue::Num(x)) => *x,
        _ => f64::NAN,
    }
}

/// The curve a point trains: batch `b` is best at learning rate `1e-3·b/32` and ends higher
/// the larger it is, but its pace is `2^k` epochs for `b = 32·2^k`.
fn curve_of(p: &BTreeMap<String, ParamValue>, epochs: u32, rng: &mut HostRng) -> Curve {
    let k = (num(p, "batch_size") / 32.0).log2();
    let d = num(p, "lr").log10() - (-3.0 + k * 2f64.log10());
    let q =
        (0.80 + 0.04 * k - 0.25 * d * d - 0.005 * (num(p, "width") - 5.0).powi(2)).clamp(0.1, 0.95);
    Curve {
        q,
        tau: 2f64.powf(k) * (1.0 + 0.5 * d.abs()),
        noise: (0..epochs).map(|_| 0.005 * rng.normal()).collect(),
    }
}

/// The `bayes` part for one seed: its rows.
fn bayes(n: usize, epochs: u32, concurrency: usize, seed: u64) -> String {
    let space = space();
    let tpe = Tpe::for_run_cap(n as u32);
    let mut rows = String::new();
    for (name, pruner) in pruners(epochs) {
        let mut done = History::default();
        let mut points: Vec<BTreeMap<String, ParamValue>> = Vec::new();
        let mut open: BTreeMap<usize, BTreeMap<String, ParamValue>> = BTreeMap::new();
        let mut finals: Vec<Option<f64>> = vec![None; n];
        let mut noise = HostRng::new(seed ^ 0x5eed);
        // The sweep's sampler and its observations, shared by the two callbacks.
        let state = std::cell::RefCell::new((&mut done, &mut points, &mut open, &mut finals));
        let trained = sweep(
            n,
            epochs,
            concurrency,
            pruner.as_ref(),
            seed,
            &mut |i| {
                let mut s = state.borrow_mut();
                let (done, points, open, _) = &mut *s;
                let pending: Vec<_> = open.values().cloned().collect();
                let p = tpe.propose(&space, seed, i, done, &pending);
                let c = curve_of(&p, epochs, &mut noise);
                open.insert(i, p.clone());
                points.push(p);
                c
            },
            &mut |i, t, value| {
                let mut s = state.borrow_mut();
                let (done, _, open, finals) = &mut *s;
                let Some(p) = open.remove(&i) else { return };
                done.push(Observation {
                    pruned_at: (t < epochs).then_some(t),
                    ..Observation::new(p, -value)
                });
                if t == epochs {
                    finals[i] = Some(value);
                }
            },
        );
        let (_, points, _, finals) = state.into_inner();
        let late: Vec<f64> = points[n / 2..]
            .iter()
            .map(|p| num(p, "batch_size"))
            .collect();
        let most = [32.0, 64.0, 128.0, 256.0]
            .iter()
            .map(|b| late.iter().filter(|&&x| x == *b).count())
            .max()
            .unwrap_or(0);
        let (best_trial, best_value) = finals
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| (i, v)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, f64::NAN));
        let total: u64 = trained.iter().map(|&t| u64::from(t)).sum();
        let _ = writeln!(
            rows,
            "bayes,{name},{seed},{:.3},,,{:.3},{},{},{best_value:.4}",
            total as f64 / (n as u64 * u64::from(epochs)) as f64,
            most as f64 / late.len().max(1) as f64,
            best_trial + 1,
            tpe.startup
        );
    }
    rows
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let nums: Vec<Option<u64>> = (0..4)
        .map(|_| args.next().map(|a| a.parse().ok()).unwrap_or(Some(0)))
        .collect();
    let dir = args.next();
    if nums.iter().any(Option::is_none) {
        eprintln!("usage: search_curves [TRIALS] [EPOCHS] [CONCURRENCY] [SEEDS] [DIR]");
        return ExitCode::from(2);
    }
    let arg = |i: usize, d: u64| nums[i].filter(|&x| x > 0).unwrap_or(d);
    let (n, epochs, concurrency, seeds) = (
        arg(0, 300) as usize,
        arg(1, 27) as u32,
        arg(2, 8) as usize,
        arg(3, 10),
    );
    println!("kind,pruner,seed,trial_epochs_ratio,best_kept,best_rank_of_kept,late_share,best_trial,startup,best_value");
    for seed in 1..=seeds {
        let (rows, dump) = prune(n, epochs, concurrency, seed);
        print!("{rows}");
        if let Some(dir) = &dir {
            if let Err(e) = std::fs::write(format!("{dir}/curves-{seed}.csv"), dump) {
                eprintln!("search_curves: {dir}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    for seed in 1..=seeds {
        print!("{}", bayes(n, epochs, concurrency, seed));
    }
    ExitCode::SUCCESS
}
