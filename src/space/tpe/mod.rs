//! `method: bayes`: a Tree-structured Parzen Estimator that proposes a trial's point from the results so far.
//!
//! The first [`Tpe::startup`] trials take the random points of `method: random` (those of
//! their indices). After them,
//! the observations (finished trials, and the trials in flight at the worst value seen: a
//! constant liar) are split by their value into the best `γ(n) = min(⌈0.1·n⌉, 25)` ("good") and
//! the rest ("bad"). Two Parzen estimators ([`mixture`]) are fitted, `l` over the good and `g`
//! over the bad; [`Tpe::candidates`] points are drawn from `l` and the one with the largest
//! `log l − log g` is taken.
//!
//! Multivariate (the default): the parameters that every observation holds together are one
//! group, and a group's estimators are joint densities over its parameters, so that the
//! proposal sees which values went well together. The parameters are grouped by which
//! observations hold them, so a conditional parameter (one that only some points hold) is
//! modelled with the others it comes with, on the observations that have it. Independent
//! (`bayes: {multivariate: false}`): each parameter on its own.
//!
//! The order of the observations: results that are numbers before failures (a failure, a NaN
//! loss, is never good, and while nothing but failures has ended the proposals are random
//! points), and among the results, the trials that trained to their end before those pruned
//! (a later rung before an earlier one), each by loss. So a trial pruned at its first rung,
//! judged on a value few epochs made, is never counted better than one that trained through.
//!
//! A proposal costs the same however many trials came before: the observations are kept sorted
//! as they come ([`History`]), and `g` is fitted on at most [`MAX_BAD`] of the rest, spread
//! evenly over their ranks (every one while there are no more), with every trial in flight.
//!
//! `normal` and `log_normal` parameters, which have no range, are drawn as in `method: random`.
//!
//! The proposal of trial `i` depends on the job's seed, `i`, and the observations in the order
//! given, and on nothing else.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::{ParamValue, Space};
use crate::rng::{derive, HostRng};

pub mod mixture;

use mixture::{Axis, Mixture};

/// A point of the space and the value it reached, as a loss (lower is better).
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub point: BTreeMap<String, ParamValue>,
    pub loss: f64,
    /// The epoch a pruned trial stopped at (its loss is that epoch's); `None` for a trial that
    /// trained to its end, or failed.
    pub pruned_at: Option<u32>,
}

impl Observation {
    /// A trial that ended with `loss` (NaN: it failed).
    pub fn new(point: BTreeMap<String, ParamValue>, loss: f64) -> Observation {
        Observation {
            point,
            loss,
            pruned_at: None,
        }
    }

    /// The order of observations: a number before a failure; a trial trained through before
    /// one pruned, a later rung before an earlier; then the loss.
    pub fn rank_cmp(&self, other: &Observation) -> Ordering {
        let key = |o: &Observation| (o.loss.is_nan(), o.pruned_at.map(|e| u32::MAX - e));
        key(self)
            .cmp(&key(other))
            .then_with(|| self.loss.total_cmp(&other.loss))
    }
}

/// The sampler's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tpe {
    /// Trials that take the random points before the estimator takes over.
    pub startup: usize,
    /// Points drawn from `l`, of which the best ratio is taken.
    pub candidates: usize,
    /// One joint estimator per group of parameters (`true`), or one per parameter.
    pub multivariate: bool,
}

/// The fraction of the observations counted good.
pub const GAMMA: f64 = 0.1;
/// The most observations counted good.
pub const MAX_GOOD: usize = 25;
/// Points drawn from `l` per proposal.
pub const CANDIDATES: usize = 24;
/// Random trials before the estimator, at most.
pub const STARTUP: usize = 10;
/// The most finished observations `g` is fitted on: beyond them, a sample spread evenly over
/// the ranks of the rest, so that a proposal's cost stops growing with the trials.
pub const MAX_BAD: usize = 200;

/// The observations so far, kept in their order ([`Observation::rank_cmp`]; equal ones in the
/// order they came) as they come, so that a proposal reads its good ones and a sample of the
/// rest without sorting them again.
#[derive(Clone, Debug, Default)]
pub struct History {
    all: Vec<Observation>,
    /// Indices into `all`, by rank.
    ranked: Vec<u32>,
}

impl History {
    /// Adds an observation at its rank (a binary search and a move of the ranks after it).
    pub fn push(&mut self, o: Observation) {
        let at = self
            .ranked
            .partition_point(|&i| self.all[i as usize].rank_cmp(&o) != Ordering::Greater);
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

    /// The observation of rank `r` (0: the best).
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

/// A point of the space, as the proposals read them.
type Point = BTreeMap<String, ParamValue>;

/// A parameter the estimators model: its place in name order, its name and its axis.
struct Modelled<'a> {
    k: usize,
    name: &'a str,
    axis: Axis,
}

impl Tpe {
    /// The settings for a sweep of `run_cap` trials: `min(10, max(2, run_cap / 4))` random
    /// trials first, then 24 candidates a proposal, multivariate.
    pub fn for_run_cap(run_cap: u32) -> Tpe {
        Tpe {
            startup: STARTUP.min((run_cap as usize / 4).max(2)),
            candidates: CANDIDATES,
            multivariate: true,
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
        pending: &[Point],
    ) -> Point {
        // Until a trial has ended with a value there is nothing to model: random points.
        if done.len() + pending.len() < self.startup || done.finite() == 0 {
            return space.random_point(seed, index);
        }
        let point = |r: usize| -> &Point {
            match r.checked_sub(done.len()) {
                None => &done.ranked(r).point,
                Some(p) => &pending[p],
            }
        };
        let (good, bad) = fit_ranks(done.len(), done.finite(), pending.len());
        let good: Vec<&Point> = good.into_iter().map(point).collect();
        let bad: Vec<&Point> = bad.into_iter().map(point).collect();
        let stream = |k: usize| {
            HostRng::new(derive(
                derive(derive(seed, 0x0074_7065), index as u64),
                k as u64,
            ))
        };
        let mut out = BTreeMap::new();
        let mut modelled = Vec::new();
        for (k, (name, dist)) in space.dists.iter().enumerate() {
            match Axis::of(dist) {
                Some(axis) => modelled.push(Modelled { k, name, axis }),
                // No range to model: drawn as `method: random` draws it.
                None => {
                    out.insert(name.clone(), dist.sample(&mut stream(k)));
                }
            }
        }
        let groups = if self.multivariate {
            groups(&modelled, &good, &bad)
        } else {
            (0..modelled.len()).map(|j| vec![j]).collect()
        };
        for group in groups {
            let params: Vec<&Modelled> = group.iter().map(|&j| &modelled[j]).collect();
            let mut rng = stream(params[0].k);
            let x = self.best_candidate(&params, &good, &bad, &mut rng);
            for (m, xd) in params.iter().zip(x) {
                out.insert(m.name.to_string(), m.axis.value_at(xd));
            }
        }
        out
    }

    /// The candidate of `l` over `params` with the largest `log l − log g`.
    fn best_candidate(
        &self,
        params: &[&Modelled],
        good: &[&Point],
        bad: &[&Point],
        rng: &mut HostRng,
    ) -> Vec<f64> {
        let axes: Vec<&Axis> = params.iter().map(|m| &m.axis).collect();
        // The observations that hold every parameter of the group, as coordinates.
        let coords = |set: &[&Point]| -> Vec<Vec<f64>> {
            set.iter()
                .filter_map(|p| {
                    params
                        .iter()
                        .map(|m| p.get(m.name).and_then(|v| m.axis.coord(v)))
                        .collect()
                })
                .collect()
        };
        let l = Mixture::fit(&axes, &coords(good));
        let g = Mixture::fit(&axes, &coords(bad));
        let mut best: Option<(f64, Vec<f64>)> = None;
        for _ in 0..self.candidates.max(1) {
            let x = l.sample(rng);
            let score = l.log_pdf(&x) - g.log_pdf(&x);
            if best.as_ref().is_none_or(|(s, _)| score > *s) {
                best = Some((score, x));
            }
        }
        best.map(|(_, x)| x).unwrap_or_default()
    }
}

/// The modelled parameters grouped by which of the observations hold them (in name order,
/// each group in the order of its first parameter): those held by the same observations are
/// modelled together.
fn groups(modelled: &[Modelled], good: &[&Point], bad: &[&Point]) -> Vec<Vec<usize>> {
    let mut out: Vec<(Vec<bool>, Vec<usize>)> = Vec::new();
    for (j, m) in modelled.iter().enumerate() {
        let held: Vec<bool> = good
            .iter()
            .chain(bad)
            .map(|p| p.contains_key(m.name))
            .collect();
        match out.iter_mut().find(|(h, _)| *h == held) {
            Some((_, members)) => members.push(j),
            None => out.push((held, vec![j])),
        }
    }
    out.into_iter().map(|(_, members)| members).collect()
}

/// How many of `n` observations count as good: `min(⌈0.1·n⌉, 25)`, at least 1.
pub fn good_count(n: usize) -> usize {
    ((GAMMA * n as f64).ceil() as usize)
        .clamp(1, MAX_GOOD)
        .min(n)
}

#[cfg(test)]
mod tests {
    use super::super::{Dist, Method};
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
            done.push(Observation::new(p, f(x)));
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
            let loss = if good { 0.0 } else { 1.0 } + (k - 4.0).abs() * 0.01;
            done.push(Observation::new(p, loss));
        }
        assert!(
            late_c >= 7,
            "only {late_c} of the last 10 took the good value"
        );
    }

    #[test]
    fn a_value_of_probability_zero_is_never_proposed() {
        let s = space(&[
            (
                "c",
                Dist::Categorical {
                    values: ["a", "b", "c"]
                        .iter()
                        .map(|w| ParamValue::Word(w.to_string()))
                        .collect(),
                    probabilities: Some(vec![0.5, 0.5, 0.0]),
                },
            ),
            ("x", Dist::Uniform { min: 0.0, max: 1.0 }),
        ]);
        for multivariate in [true, false] {
            let tpe = Tpe {
                multivariate,
                ..Tpe::for_run_cap(60)
            };
            let mut done = History::default();
            for i in 0..60 {
                let p = tpe.propose(&s, 2, i, &done, &[]);
                assert_ne!(p["c"], ParamValue::Word("c".into()), "trial {i}");
                let loss = x_of(&p);
                done.push(Observation::new(p, loss));
            }
        }
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
                Observation::new(p, loss)
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
                Observation::new(p, loss)
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
        .map(|(x, loss)| Observation::new(at(x), loss))
        .collect();
        let order: Vec<f64> = (0..h.len()).map(|r| x_of(&h.ranked(r).point)).collect();
        // Equal losses keep their order; a NaN comes after every number.
        assert_eq!(order, [1.0, 4.0, 2.0, 0.0, 3.0]);
    }

    #[test]
    fn trials_trained_through_rank_before_pruned_ones_and_later_rungs_before_earlier() {
        let at = |x: f64| BTreeMap::from([("x".to_string(), ParamValue::Num(x))]);
        let pruned = |x: f64, loss: f64, epoch: u32| Observation {
            pruned_at: Some(epoch),
            ..Observation::new(at(x), loss)
        };
        let h: History = [
            pruned(0.0, -0.99, 1),
            Observation::new(at(1.0), -0.5),
            pruned(2.0, -0.9, 3),
            Observation::new(at(3.0), f64::NAN),
            pruned(4.0, -0.2, 3),
            Observation::new(at(5.0), -0.7),
        ]
        .into_iter()
        .collect();
        let order: Vec<f64> = (0..h.len()).map(|r| x_of(&h.ranked(r).point)).collect();
        // Through first (by loss), then pruned at 3 (by loss), then at 1, the failure last,
        // though the pruned ones' losses are lower.
        assert_eq!(order, [5.0, 1.0, 2.0, 4.0, 0.0, 3.0]);
        assert_eq!(h.finite(), 5);
    }

    /// The share of 60 proposals in the quadrants of the diagonal of `[0, 1]²` from a history whose good
    /// observations sit at two modes on it, (0.2, 0.2) and (0.8, 0.8), and the rest anywhere:
    /// each parameter alone has two good regions, and only the pairs tell which go together.
    fn diagonal_share(multivariate: bool) -> f64 {
        let s = space(&[
            ("x", Dist::Uniform { min: 0.0, max: 1.0 }),
            ("y", Dist::Uniform { min: 0.0, max: 1.0 }),
        ]);
        let at = |x: f64, y: f64| {
            BTreeMap::from([
                ("x".to_string(), ParamValue::Num(x)),
                ("y".to_string(), ParamValue::Num(y)),
            ])
        };
        let mut done: History = (0..108)
            .map(|i| Observation::new(s.random_point(2, i), 1.0 + i as f64 / 1000.0))
            .collect();
        for j in 0..12 {
            let c = if j % 2 == 0 { 0.2 } else { 0.8 };
            let d = 0.01 * (j / 2) as f64;
            done.push(Observation::new(at(c + d, c - d), 0.0));
        }
        let tpe = Tpe {
            multivariate,
            ..Tpe::for_run_cap(200)
        };
        let near = (0..60)
            .filter(|&i| {
                let p = tpe.propose(&s, 4, 120 + i, &done, &[]);
                let num = |k: &str| match p[k] {
                    ParamValue::Num(v) => v,
                    _ => panic!("a number"),
                };
                (num("x") < 0.5) == (num("y") < 0.5)
            })
            .count();
        near as f64 / 60.0
    }

    #[test]
    fn the_joint_estimator_sees_what_parameters_do_together() {
        let (joint, alone) = (diagonal_share(true), diagonal_share(false));
        assert!(
            joint >= 0.95,
            "multivariate: {joint} of the proposals on the diagonal"
        );
        // Each alone draws x and y from modes chosen apart: some pairs cross.
        assert!(
            alone <= 0.85,
            "independent: {alone} of the proposals on the diagonal"
        );
    }

    #[test]
    fn parameters_that_come_in_different_observations_are_modelled_apart() {
        let s = space(&[
            ("x", Dist::Uniform { min: 0.0, max: 1.0 }),
            ("y", Dist::Uniform { min: 0.0, max: 1.0 }),
            ("z", Dist::Uniform { min: 0.0, max: 1.0 }),
        ]);
        // z is held by the odd observations only (a conditional parameter).
        let done: History = (0..30)
            .map(|i| {
                let mut p = s.random_point(1, i);
                if i % 2 == 0 {
                    p.remove("z");
                }
                let loss = (x_of(&p) - 0.3).abs();
                Observation::new(p, loss)
            })
            .collect();
        let refs: Vec<&Point> = (0..done.len()).map(|r| &done.ranked(r).point).collect();
        let modelled: Vec<Modelled> = s
            .dists
            .iter()
            .enumerate()
            .map(|(k, (name, d))| Modelled {
                k,
                name,
                axis: Axis::of(d).expect("a range"),
            })
            .collect();
        assert_eq!(
            groups(&modelled, &refs[..3], &refs[3..]),
            vec![vec![0, 1], vec![2]]
        );
        // Every parameter of the space is proposed, and x near its optimum.
        let p = Tpe::for_run_cap(40).propose(&s, 1, 30, &done, &[]);
        assert_eq!(p.keys().collect::<Vec<_>>(), ["x", "y", "z"]);
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
            .map(|i| Observation::new(s.random_point(3, i), f64::NAN))
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
                Observation::new(p, loss)
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
            done.push(Observation::new(p, loss));
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
}
