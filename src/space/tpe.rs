//! `method: bayes`: a Tree-structured Parzen Estimator that proposes a trial's point from the results so far.
//!
//! The first [`Tpe::startup`] trials take the random points of `method: random` (those of
//! their indices). After them,
//! the observations (finished trials, and the trials in flight at the worst value seen: a
//! constant liar) are split by their value into the best `γ(n) = min(⌈0.1·n⌉, 25)` ("good") and
//! the rest ("bad"). Each parameter, on its own, gets two Parzen estimators, `l` over the good
//! and `g` over the bad; [`Tpe::candidates`] values are drawn from `l` and the one with the
//! largest `log l − log g` is taken.
//!
//! A proposal costs the same however many trials came before: the observations are kept sorted
//! as they come ([`History`]), and `g` is fitted on at most [`MAX_BAD`] of the rest, spread
//! evenly over their ranks (every one while there are no more), with every trial in flight.
//! A failure (a NaN loss) ranks after every result: it is never good, and while nothing but
//! failures has ended the proposals are random points.
//!
//! A range is worked in its own scale (the log of the value for the log-uniform ones; an
//! integer or quantised range is drawn continuous, then rounded): the estimator is a mixture of
//! Gaussians truncated to the range, one at each observation and one wide prior component at
//! the middle (sigma = the range), each observation's bandwidth the larger distance to its
//! neighbouring observations (the range's ends and the prior are no neighbours), clipped to
//! `[range / min(100, n + 2), range]` for `n` observations. A categorical parameter's estimator
//! is its counts plus one prior draw spread over the values (by `probabilities` when given).
//! `normal` and `log_normal` parameters, which have no range, are drawn as in `method: random`.
//!
//! The proposal of trial `i` depends on the job's seed, `i`, and the observations in the order
//! given, and on nothing else.

use std::collections::BTreeMap;

use super::{Dist, ParamValue, Space};
use crate::rng::{derive, HostRng};

/// A point of the space and the value it reached, as a loss (lower is better).
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub point: BTreeMap<String, ParamValue>,
    pub loss: f64,
}

/// The sampler's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tpe {
    /// Trials that take the random points before the estimator takes over.
    pub startup: usize,
    /// Values drawn from `l` per parameter, of which the best ratio is taken.
    pub candidates: usize,
}

/// The fraction of the observations counted good.
pub const GAMMA: f64 = 0.1;
/// The most observations counted good.
pub const MAX_GOOD: usize = 25;
/// Values drawn from `l` per parameter.
pub const CANDIDATES: usize = 24;
/// Random trials before the estimator, at most.
pub const STARTUP: usize = 10;
/// The most finished observations `g` is fitted on: beyond them, a sample spread evenly over
/// the ranks of the rest, so that a proposal's cost stops growing with the trials.
pub const MAX_BAD: usize = 200;

/// The observations so far, kept sorted by loss as they come (equal losses in the order they
/// came, a NaN loss after every number), so that a proposal reads its good ones and a sample of
/// the rest without sorting them again.
#[derive(Clone, Debug, Default)]
pub struct History {
    all: Vec<Observation>,
    /// Indices into `all`, by rank.
    ranked: Vec<u32>,
}

impl History {
    /// Adds an observation at its rank (a binary search and a move of the ranks after it).
    pub fn push(&mut self, o: Observation) {
        let key = rank_key(o.loss);
        let at = self
            .ranked
            .partition_point(|&i| rank_key(self.all[i as usize].loss) <= key);
        self.ranked.insert(at, self.all.len() as u32);
        self.all.push(o);
    }

    pub fn len(&self) -> usize {
        self.all.len()
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// How many observations have a loss that is a number (not a failure): the failures rank
    /// last.
    pub fn finite(&self) -> usize {
        self.ranked
            .partition_point(|&i| !self.all[i as usize].loss.is_nan())
    }

    /// The observation of rank `r` (0: the lowest loss).
    pub fn ranked(&self, r: usize) -> &Observation {
        &self.all[self.ranked[r] as usize]
    }
}

impl FromIterator<Observation> for History {
    fn from_iter<I: IntoIterator<Item = Observation>>(iter: I) -> History {
        let mut h = History::default();
        for o in iter {
            h.push(o);
        }
        h
    }
}

/// An observation's place in the order: its loss, a NaN after every number.
fn rank_key(loss: f64) -> f64 {
    if loss.is_nan() {
        f64::INFINITY
    } else {
        loss
    }
}

/// The ranks `l` and `g` are fitted on, out of `done` finished observations (the first
/// `finite` of them with a loss that is a number, the failures after them) and `pending` in
/// flight (ranked after them): the best [`good_count`] ranks, never a failure; and the rest's
/// finished ones (at most [`MAX_BAD`], spread evenly over their ranks) with every one in flight.
pub fn fit_ranks(done: usize, finite: usize, pending: usize) -> (Vec<usize>, Vec<usize>) {
    let n = done + pending;
    let n_good = good_count(n).min(finite);
    let good: Vec<usize> = (0..n_good).collect();
    let rest_done = done.saturating_sub(n_good);
    let mut bad: Vec<usize> = if rest_done <= MAX_BAD {
        (n_good..done).collect()
    } else {
        (0..MAX_BAD)
            .map(|j| n_good + j * rest_done / MAX_BAD)
            .collect()
    };
    bad.extend(n_good.max(done)..n);
    (good, bad)
}

impl Tpe {
    /// The settings for a sweep of `run_cap` trials: `min(10, max(2, run_cap / 4))` random
    /// trials first, then 24 candidates a proposal.
    pub fn for_run_cap(run_cap: u32) -> Tpe {
        Tpe {
            startup: STARTUP.min((run_cap as usize / 4).max(2)),
            candidates: CANDIDATES,
        }
    }

    /// The point of trial `index`: its random point (that of `method: random`) while fewer
    /// than `startup` observations (finished and pending) came before it, or while nothing has
    /// finished; otherwise a TPE proposal from
    /// `done` and the points `pending` (in flight, counted at the worst loss of `done`).
    pub fn propose(
        &self,
        space: &Space,
        seed: u64,
        index: usize,
        done: &History,
        pending: &[BTreeMap<String, ParamValue>],
    ) -> BTreeMap<String, ParamValue> {
        // Until a trial has ended with a value there is nothing to model: random points.
        if done.len() + pending.len() < self.startup || done.finite() == 0 {
            return space.random_point(seed, index);
        }
        let point = |r: usize| -> &BTreeMap<String, ParamValue> {
            match r.checked_sub(done.len()) {
                None => &done.ranked(r).point,
                Some(p) => &pending[p],
            }
        };
        let (good, bad) = fit_ranks(done.len(), done.finite(), pending.len());
        let good: Vec<_> = good.into_iter().map(point).collect();
        let bad: Vec<_> = bad.into_iter().map(point).collect();
        let mut out = BTreeMap::new();
        for (k, (name, dist)) in space.dists.iter().enumerate() {
            let mut rng = HostRng::new(derive(
                derive(derive(seed, 0x0074_7065), index as u64),
                k as u64,
            ));
            let values = |set: &[&BTreeMap<String, ParamValue>]| -> Vec<ParamValue> {
                set.iter().filter_map(|p| p.get(name).cloned()).collect()
            };
            let v = propose_one(
                dist,
                &values(&good),
                &values(&bad),
                self.candidates,
                &mut rng,
            );
            out.insert(name.clone(), v);
        }
        out
    }
}

/// How many of `n` observations count as good: `min(⌈0.1·n⌉, 25)`, at least 1.
pub fn good_count(n: usize) -> usize {
    ((GAMMA * n as f64).ceil() as usize)
        .clamp(1, MAX_GOOD)
        .min(n)
}

/// One parameter's proposal from the values of the good and the bad observations.
fn propose_one(
    dist: &Dist,
    good: &[ParamValue],
    bad: &[ParamValue],
    candidates: usize,
    rng: &mut HostRng,
) -> ParamValue {
    if let Dist::Categorical {
        values,
        probabilities,
    } = dist
    {
        let l = categorical_weights(values, probabilities.as_deref(), good);
        let g = categorical_weights(values, probabilities.as_deref(), bad);
        let best = (0..candidates.max(1))
            .map(|_| pick(&l, rng))
            .max_by(|&a, &b| {
                let score = |i: usize| l[i].ln() - g[i].ln();
                score(a).total_cmp(&score(b)).then(b.cmp(&a))
            })
            .unwrap_or(0);
        return values[best].clone();
    }
    let Some(scale) = Scale::of(dist) else {
        return dist.sample(rng);
    };
    let xs = |vs: &[ParamValue]| -> Vec<f64> { vs.iter().filter_map(|v| scale.inner(v)).collect() };
    let l = Parzen::new(&xs(good), scale.lo, scale.hi);
    let g = Parzen::new(&xs(bad), scale.lo, scale.hi);
    let mut best: Option<(f64, f64)> = None;
    for _ in 0..candidates.max(1) {
        let x = l.sample(rng);
        let score = l.log_pdf(x) - g.log_pdf(x);
        if best.is_none_or(|(s, _)| score > s) {
            best = Some((score, x));
        }
    }
    scale.value_at(best.map_or(0.5 * (scale.lo + scale.hi), |(_, x)| x))
}

/// Smoothed counts: one prior draw spread over the values, plus one per observation.
fn categorical_weights(
    values: &[ParamValue],
    prior: Option<&[f64]>,
    seen: &[ParamValue],
) -> Vec<f64> {
    let n = values.len() as f64;
    let mut w: Vec<f64> = (0..values.len())
        .map(|i| prior.map_or(1.0 / n, |p| p[i]).max(1e-3 / n))
        .collect();
    for v in seen {
        if let Some(i) = values.iter().position(|x| x == v) {
            w[i] += 1.0;
        }
    }
    let sum: f64 = w.iter().sum();
    w.iter_mut().for_each(|x| *x /= sum);
    w
}

/// An index drawn by weight.
fn pick(weights: &[f64], rng: &mut HostRng) -> usize {
    let u = rng.next_f64();
    let mut acc = 0.0;
    weights
        .iter()
        .position(|w| {
            acc += w;
            u < acc
        })
        .unwrap_or(weights.len().saturating_sub(1))
}

/// A range in the scale the estimator works in, and the way back to a value.
#[derive(Clone, Copy, Debug)]
struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    /// Round to a multiple of this (after `exp` for a log scale); 1 for integers.
    q: Option<f64>,
    /// The value's own bounds, which a rounded value must stay within.
    min: f64,
    max: f64,
}

impl Scale {
    fn of(dist: &Dist) -> Option<Scale> {
        let lin = |min: f64, max: f64, q: Option<f64>| Scale {
            lo: min,
            hi: max,
            log: false,
            q,
            min,
            max,
        };
        let log = |min: f64, max: f64, q: Option<f64>| Scale {
            lo: min.ln(),
            hi: max.ln(),
            log: true,
            q,
            min,
            max,
        };
        match *dist {
            Dist::Uniform { min, max } => Some(lin(min, max, None)),
            Dist::QUniform { min, max, q } => Some(lin(min, max, Some(q))),
            Dist::IntUniform { min, max } => Some(Scale {
                lo: min as f64 - 0.5,
                hi: max as f64 + 0.5,
                ..lin(min as f64, max as f64, Some(1.0))
            }),
            Dist::LogUniform { min, max } => Some(log(min.exp(), max.exp(), None)),
            Dist::LogUniformValues { min, max } => Some(log(min, max, None)),
            Dist::QLogUniformValues { min, max, q } => Some(log(min, max, Some(q))),
            _ => None,
        }
        .filter(|s| s.lo.is_finite() && s.hi.is_finite() && s.hi > s.lo)
    }

    /// A value in the estimator's scale (`None` for one it cannot hold).
    fn inner(&self, v: &ParamValue) -> Option<f64> {
        let ParamValue::Num(x) = v else { return None };
        let x = if self.log { x.ln() } else { *x };
        x.is_finite().then(|| x.clamp(self.lo, self.hi))
    }

    fn value_at(&self, x: f64) -> ParamValue {
        let mut v = if self.log { x.exp() } else { x };
        if let Some(q) = self.q {
            v = (v / q).round() * q;
            // A rounded value past an end goes back inside by one step when it can.
            if v > self.max {
                v -= q;
            }
            if v < self.min {
                v += q;
            }
        }
        if self.q.is_none() {
            v = v.clamp(self.min, self.max);
        }
        ParamValue::Num(v)
    }
}

/// A mixture of Gaussians truncated to `[lo, hi]`, equally weighted: one at each point and a
/// prior one at the middle.
#[derive(Clone, Debug)]
struct Parzen {
    mus: Vec<f64>,
    sigmas: Vec<f64>,
    /// Each component's `ln σ` and the log of its mass inside the range, computed once.
    ln_sigmas: Vec<f64>,
    ln_masses: Vec<f64>,
    lo: f64,
    hi: f64,
}

impl Parzen {
    fn new(points: &[f64], lo: f64, hi: f64) -> Parzen {
        let width = hi - lo;
        let mut order: Vec<usize> = (0..points.len()).collect();
        order.sort_by(|&a, &b| points[a].total_cmp(&points[b]).then(a.cmp(&b)));
        // One kernel per point, and the prior's.
        let min_sigma = width / (100.0f64).min(2.0 + points.len() as f64);
        let mut sigmas = vec![width; points.len()];
        for (rank, &i) in order.iter().enumerate() {
            // The range's ends are no neighbours: an observation at the edge of the
            // observations takes its one neighbour's distance.
            let left = (rank > 0).then(|| points[i] - points[order[rank - 1]]);
            let right = order.get(rank + 1).map(|&j| points[j] - points[i]);
            let spread = match (left, right) {
                (Some(a), Some(b)) => a.max(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => width,
            };
            sigmas[i] = spread.clamp(min_sigma, width);
        }
        let mut mus = points.to_vec();
        mus.push(0.5 * (lo + hi));
        sigmas.push(width);
        let ln_sigmas = sigmas.iter().map(|s| s.ln()).collect();
        let ln_masses = mus
            .iter()
            .zip(&sigmas)
            .map(|(&mu, &s)| (phi((hi - mu) / s) - phi((lo - mu) / s)).max(1e-12).ln())
            .collect();
        Parzen {
            mus,
            sigmas,
            ln_sigmas,
            ln_masses,
            lo,
            hi,
        }
    }

    /// A draw: a component chosen uniformly, then its Gaussian until it falls in range.
    fn sample(&self, rng: &mut HostRng) -> f64 {
        let i = rng.below(self.mus.len());
        let (mu, s) = (self.mus[i], self.sigmas[i]);
        for _ in 0..64 {
            let x = mu + s * rng.normal();
            if (self.lo..=self.hi).contains(&x) {
                return x;
            }
        }
        self.lo + (self.hi - self.lo) * rng.next_f64()
    }

    fn log_pdf(&self, x: f64) -> f64 {
        let n = self.mus.len() as f64;
        let ln_2pi_half = 0.5 * (2.0 * std::f64::consts::PI).ln();
        let term = |i: usize| {
            let z = (x - self.mus[i]) / self.sigmas[i];
            -0.5 * z * z - self.ln_sigmas[i] - ln_2pi_half - self.ln_masses[i]
        };
        // Two passes over the terms (the largest, then the sum) instead of a list of them.
        let top = (0..self.mus.len())
            .map(term)
            .fold(f64::NEG_INFINITY, f64::max);
        top + (0..self.mus.len())
            .map(|i| (term(i) - top).exp())
            .sum::<f64>()
            .ln()
            - n.ln()
    }
}

/// The standard normal's CDF.
fn phi(z: f64) -> f64 {
    0.5 * (1.0 + erf(z / std::f64::consts::SQRT_2))
}

/// The error function (Abramowitz and Stegun 7.1.26, absolute error below 1.5e-7).
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let y = 1.0 - poly * (-x * x).exp();
    if x < 0.0 {
        -y
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::super::Method;
    use super::*;

    fn space(dists: &[(&str, Dist)]) -> Space {
        Space {
            method: Method::Bayes,
            dists: dists
                .iter()
                .map(|(n, d)| (n.to_string(), d.clone()))
                .collect(),
        }
    }

    fn x_of(p: &BTreeMap<String, ParamValue>) -> f64 {
        match p["x"] {
            ParamValue::Num(x) => x,
            _ => panic!("a number"),
        }
    }

    /// Runs `n` trials one at a time on `f` with `seed`, returning the points in order.
    fn run(space: &Space, tpe: Tpe, seed: u64, n: usize, f: impl Fn(f64) -> f64) -> Vec<f64> {
        let mut done = History::default();
        let mut xs = Vec::new();
        for i in 0..n {
            let p = tpe.propose(space, seed, i, &done, &[]);
            let x = x_of(&p);
            done.push(Observation {
                point: p,
                loss: f(x),
            });
            xs.push(x);
        }
        xs
    }

    /// The mean of `dist` over the last 10 of 40 TPE proposals and over 40 random points, each
    /// averaged over 8 seeds.
    fn late_and_random(
        s: &Space,
        f: impl Fn(f64) -> f64 + Copy,
        dist: impl Fn(f64) -> f64,
    ) -> (f64, f64) {
        let tpe = Tpe::for_run_cap(40);
        let (mut late, mut random) = (0.0, 0.0);
        for seed in 0..8 {
            let xs = run(s, tpe, seed, 40, f);
            // The startup trials are the random points.
            for (i, x) in xs.iter().enumerate().take(tpe.startup) {
                assert_eq!(*x, x_of(&s.random_point(seed, i)));
            }
            late += xs[30..].iter().map(|&x| dist(x)).sum::<f64>() / 10.0 / 8.0;
            random += (0..40)
                .map(|i| dist(x_of(&s.random_point(seed, i))))
                .sum::<f64>()
                / 40.0
                / 8.0;
        }
        (late, random)
    }

    #[test]
    fn tpe_concentrates_near_the_optimum_of_a_quadratic() {
        let s = space(&[(
            "x",
            Dist::Uniform {
                min: -5.0,
                max: 5.0,
            },
        )]);
        let (late, random) = late_and_random(&s, |x| (x - 1.3) * (x - 1.3), |x| (x - 1.3).abs());
        assert!(
            late < random / 1.5,
            "late proposals {late} from the optimum, random points {random}"
        );
    }

    #[test]
    fn log_ranges_find_a_small_optimum() {
        let s = space(&[(
            "x",
            Dist::LogUniformValues {
                min: 1e-5,
                max: 1.0,
            },
        )]);
        let decades = |x: f64| (x.log10() - 3e-3f64.log10()).abs();
        let (late, random) = late_and_random(&s, |x| decades(x).powi(2), decades);
        assert!(
            late < random / 2.0,
            "late proposals {late} decades from 3e-3, random points {random}"
        );
        let xs = run(&s, Tpe::for_run_cap(40), 1, 40, |x| decades(x).powi(2));
        assert!(xs.iter().all(|x| (1e-5..=1.0).contains(x)));
    }

    #[test]
    fn categorical_favours_the_good_value_and_ints_stay_whole() {
        let words = ["a", "b", "c", "d"];
        let s = space(&[
            (
                "c",
                Dist::Categorical {
                    values: words
                        .iter()
                        .map(|w| ParamValue::Word(w.to_string()))
                        .collect(),
                    probabilities: None,
                },
            ),
            ("k", Dist::IntUniform { min: 1, max: 9 }),
        ]);
        let tpe = Tpe::for_run_cap(40);
        let mut done = History::default();
        let mut late_c = 0;
        for i in 0..40 {
            let p = tpe.propose(&s, 5, i, &done, &[]);
            let ParamValue::Num(k) = p["k"] else { panic!() };
            assert!(k.fract() == 0.0 && (1.0..=9.0).contains(&k), "{k}");
            let good = p["c"] == ParamValue::Word("c".into());
            if i >= 30 && good {
                late_c += 1;
            }
            done.push(Observation {
                point: p,
                loss: if good { 0.0 } else { 1.0 } + (k - 4.0).abs() * 0.01,
            });
        }
        assert!(
            late_c >= 7,
            "only {late_c} of the last 10 took the good value"
        );
    }

    #[test]
    fn the_same_history_and_seed_give_the_same_proposal() {
        let s = space(&[
            ("x", Dist::Uniform { min: 0.0, max: 1.0 }),
            ("k", Dist::IntUniform { min: 0, max: 100 }),
        ]);
        let tpe = Tpe::for_run_cap(20);
        let done: History = (0..12)
            .map(|i| {
                let p = s.random_point(3, i);
                let loss = (x_of(&p) - 0.2).abs();
                Observation { point: p, loss }
            })
            .collect();
        let a = tpe.propose(&s, 3, 12, &done, &[]);
        assert_eq!(a, tpe.propose(&s, 3, 12, &done, &[]));
        assert_ne!(a, tpe.propose(&s, 4, 12, &done, &[]), "another seed");
        assert_ne!(a, tpe.propose(&s, 3, 13, &done, &[]), "another index");
    }

    #[test]
    fn the_constant_liar_makes_concurrent_proposals_differ() {
        let s = space(&[("x", Dist::Uniform { min: 0.0, max: 1.0 })]);
        let tpe = Tpe::for_run_cap(20);
        let done: History = (0..10)
            .map(|i| {
                let p = s.random_point(3, i);
                let loss = (x_of(&p) - 0.6).abs();
                Observation { point: p, loss }
            })
            .collect();
        let first = tpe.propose(&s, 3, 10, &done, &[]);
        let second = tpe.propose(&s, 3, 10, &done, std::slice::from_ref(&first));
        assert_ne!(first, second, "a pending point changes the estimators");
        // In flight, it counts at the worst loss: the next proposal moves away from it.
        assert!(good_count(11) >= 1);
    }

    #[test]
    fn the_history_ranks_by_loss_as_observations_come() {
        let at = |x: f64| BTreeMap::from([("x".to_string(), ParamValue::Num(x))]);
        let h: History = [
            (0.0, 3.0),
            (1.0, 1.0),
            (2.0, 2.0),
            (3.0, f64::NAN),
            (4.0, 1.0),
        ]
        .into_iter()
        .map(|(x, loss)| Observation { point: at(x), loss })
        .collect();
        let order: Vec<f64> = (0..h.len()).map(|r| x_of(&h.ranked(r).point)).collect();
        // Equal losses keep their order; a NaN comes after every number.
        assert_eq!(order, [1.0, 4.0, 2.0, 0.0, 3.0]);
    }

    #[test]
    fn the_estimators_are_fitted_on_a_bounded_set_however_many_trials_came_before() {
        // Few: every observation, as ever.
        let (good, bad) = fit_ranks(100, 100, 3);
        assert_eq!(good, (0..good_count(103)).collect::<Vec<_>>());
        assert_eq!(bad, (good.len()..103).collect::<Vec<_>>());
        // Many: the good ones, MAX_BAD of the rest spread over their ranks, every one in flight.
        for done in [MAX_BAD + 30, 5_000, 50_000, 1_000_000] {
            let (good, bad) = fit_ranks(done, done, 8);
            assert_eq!(good.len(), good_count(done + 8).min(MAX_GOOD));
            assert_eq!(bad.len(), MAX_BAD + 8, "{done}");
            assert_eq!(bad[0], good.len());
            assert!(
                bad.windows(2).all(|w| w[0] < w[1]),
                "{done}: ranks in order, once each"
            );
            assert!(
                bad[MAX_BAD - 1] >= done - done / MAX_BAD - 1,
                "{done}: the sample reaches the worst"
            );
            assert_eq!(bad[MAX_BAD..], (done..done + 8).collect::<Vec<_>>()[..]);
        }
    }

    #[test]
    fn failures_are_never_good_and_only_failures_give_random_points() {
        // 1 result and 9 failures: good is the one, never a failure (γ would take 2).
        let (good, bad) = fit_ranks(10, 1, 1);
        assert_eq!(good, [0]);
        assert_eq!(bad, (1..11).collect::<Vec<_>>());
        let (good, _) = fit_ranks(30, 2, 0);
        assert_eq!(good, [0, 1]);
        // Only failures: the random point of the index, as before anything ended.
        let s = space(&[("x", Dist::Uniform { min: 0.0, max: 1.0 })]);
        let failed: History = (0..12)
            .map(|i| Observation {
                point: s.random_point(3, i),
                loss: f64::NAN,
            })
            .collect();
        assert_eq!(failed.finite(), 0);
        let tpe = Tpe::for_run_cap(40);
        assert_eq!(tpe.propose(&s, 3, 12, &failed, &[]), s.random_point(3, 12));
    }

    #[test]
    fn a_long_history_still_concentrates_near_the_optimum() {
        let s = space(&[("x", Dist::Uniform { min: 0.0, max: 1.0 })]);
        let tpe = Tpe::for_run_cap(5_000);
        let done: History = (0..4_000)
            .map(|i| {
                let p = s.random_point(9, i);
                let loss = (x_of(&p) - 0.3).powi(2);
                Observation { point: p, loss }
            })
            .collect();
        let mean: f64 = (0..20)
            .map(|i| (x_of(&tpe.propose(&s, 9, 4_000 + i, &done, &[])) - 0.3).abs())
            .sum::<f64>()
            / 20.0;
        // Random points lie 0.29 from 0.3 on average; the proposals close to it.
        assert!(mean < 0.05, "mean distance {mean}");
    }

    /// Runs `n` trials one at a time on a space of `opt` in {a, b, c} and `x` in [0, 1], where
    /// every trial with `c` fails (NaN) unless `skip_failures`, which leaves failures out of
    /// the history; returns how often `c` was proposed after its third failure, and after it.
    fn failing_value_proposals(seed: u64, skip_failures: bool) -> (usize, usize) {
        let s = space(&[
            (
                "opt",
                Dist::Categorical {
                    values: ["a", "b", "c"]
                        .iter()
                        .map(|w| ParamValue::Word(w.to_string()))
                        .collect(),
                    probabilities: None,
                },
            ),
            ("x", Dist::Uniform { min: 0.0, max: 1.0 }),
        ]);
        let tpe = Tpe::for_run_cap(60);
        let mut done = History::default();
        let (mut failures, mut after, mut c_after) = (0, 0, 0);
        for i in 0..60 {
            let p = tpe.propose(&s, seed, i, &done, &[]);
            let c = p["opt"] == ParamValue::Word("c".into());
            if failures >= 3 {
                after += 1;
                c_after += usize::from(c);
            }
            let loss = match &p["opt"] {
                ParamValue::Word(w) if w == "a" => (x_of(&p) - 0.5).powi(2),
                ParamValue::Word(w) if w == "b" => (x_of(&p) - 0.5).powi(2) + 0.05,
                _ => f64::NAN,
            };
            if c {
                failures += 1;
                if skip_failures {
                    continue;
                }
            }
            done.push(Observation { point: p, loss });
        }
        (c_after, after)
    }

    #[test]
    fn a_value_that_always_fails_is_proposed_at_most_a_third_of_the_time_after_three_failures() {
        for seed in 1..=10 {
            let (c, after) = failing_value_proposals(seed, false);
            assert!(
                3 * c <= after,
                "seed {seed}: c proposed {c} times of {after}"
            );
        }
        // Left out of the history, its failures would not stop it: the test can fail.
        let proposed: usize = (1..=10)
            .map(|seed| failing_value_proposals(seed, true).0)
            .sum();
        let of: usize = (1..=10)
            .map(|seed| failing_value_proposals(seed, true).1)
            .sum();
        assert!(
            3 * proposed > of,
            "without failures counted: {proposed} of {of}"
        );
    }

    #[test]
    fn erf_is_close() {
        assert!((erf(0.5) - 0.520_499_877_8).abs() < 1e-6);
        assert!((phi(0.0) - 0.5).abs() < 1e-9);
        assert!((phi(-1.96) - 0.025).abs() < 1e-3);
    }
}
