//! The Parzen estimators of `method: bayes`: mixtures of product kernels over one or several parameters, fitted on observations, sampled and scored.
//!
//! A mixture has one component per observation and a prior component, each a product over the
//! parameters it models (its columns) of one kernel per parameter:
//! - a range, worked in its own scale (the log of the value for the log-uniform ones; an integer
//!   or quantised range continuous, rounded afterwards): a Gaussian truncated to the range at the
//!   observation, its bandwidth the larger distance to its neighbouring observations in that
//!   parameter (the range's ends and the prior are no neighbours), clipped to
//!   `[range / min(100, n + 2), range]` for `n` observations; the prior's at the middle, with
//!   sigma the range;
//! - a categorical parameter: the observed value, smoothed by a share `prior / (n + 1)` of the
//!   prior (uniform over the values, or their `probabilities`), so that every value the prior
//!   allows keeps some mass; the prior component is the prior itself.
//!
//! Each observation weighs 1 and the prior [`PRIOR_WEIGHT`]. With one column per mixture the
//! estimator is the independent TPE; with a group's columns together, the multivariate one.

use super::super::{Dist, ParamValue};
use crate::rng::HostRng;

/// The prior component's weight against an observation's 1.
pub const PRIOR_WEIGHT: f64 = 1.0;

/// A range in the scale the estimator works in, and the way back to a value.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
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
    /// The scale of a range (`None` for a distribution without a bounded range).
    pub fn of(dist: &Dist) -> Option<Scale> {
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
    pub fn inner(&self, v: &ParamValue) -> Option<f64> {
        let ParamValue::Num(x) = v else { return None };
        let x = if self.log { x.ln() } else { *x };
        x.is_finite().then(|| x.clamp(self.lo, self.hi))
    }

    /// The value at `x` of the estimator's scale: back from the log, rounded to its step.
    pub fn value_at(&self, x: f64) -> ParamValue {
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

/// How one parameter is modelled: a range in its scale, or categorical values.
#[derive(Clone, Debug)]
pub enum Axis {
    Range(Scale),
    Values {
        values: Vec<ParamValue>,
        /// The prior over the values (uniform unless the job gives `probabilities`).
        prior: Vec<f64>,
    },
}

impl Axis {
    /// The axis of a distribution the estimator models: a range or `values` (`None` for the
    /// others, which are drawn as `method: random` draws them).
    pub fn of(dist: &Dist) -> Option<Axis> {
        if let Dist::Categorical {
            values,
            probabilities,
        } = dist
        {
            // A value given probability 0 is never drawn, as `method: random` never draws it.
            let n = values.len() as f64;
            let given = |i: usize| probabilities.as_ref().and_then(|p| p.get(i).copied());
            let mut prior: Vec<f64> = (0..values.len())
                .map(|i| given(i).map_or(1.0 / n, |p| p.max(0.0)))
                .collect();
            let sum: f64 = prior.iter().sum();
            if sum > 0.0 && sum.is_finite() {
                prior.iter_mut().for_each(|p| *p /= sum);
            } else {
                prior.fill(1.0 / n);
            }
            return (!values.is_empty()).then(|| Axis::Values {
                values: values.clone(),
                prior,
            });
        }
        Scale::of(dist).map(Axis::Range)
    }

    /// A value as a coordinate of this axis: the scale's number, or the value's index.
    pub fn coord(&self, v: &ParamValue) -> Option<f64> {
        match self {
            Axis::Range(s) => s.inner(v),
            Axis::Values { values, .. } => values.iter().position(|x| x == v).map(|i| i as f64),
        }
    }

    /// The value at a coordinate of this axis.
    pub fn value_at(&self, x: f64) -> ParamValue {
        match self {
            Axis::Range(s) => s.value_at(x),
            Axis::Values { values, .. } => values[(x as usize).min(values.len() - 1)].clone(),
        }
    }
}

/// One parameter's kernels, one per component (the observations', then the prior's).
#[derive(Clone, Debug)]
enum Column {
    Range {
        mus: Vec<f64>,
        sigmas: Vec<f64>,
        /// Each kernel's `ln σ + ln √(2π) + ln(its mass inside the range)`, computed once.
        ln_norms: Vec<f64>,
        lo: f64,
        hi: f64,
    },
    Values {
        /// Each observation's value (an index); the prior component has none.
        seen: Vec<usize>,
        prior: Vec<f64>,
        /// The prior's share in an observation's kernel.
        smoothing: f64,
    },
}

impl Column {
    fn fit(axis: &Axis, xs: &[f64]) -> Column {
        match axis {
            Axis::Range(s) => range_column(xs, s.lo, s.hi),
            Axis::Values { prior, .. } => Column::Values {
                seen: xs.iter().map(|&x| x as usize).collect(),
                prior: prior.clone(),
                smoothing: PRIOR_WEIGHT / (xs.len() as f64 + 1.0),
            },
        }
    }

    /// The log of component `c`'s kernel at `x`.
    fn ln_kernel(&self, c: usize, x: f64) -> f64 {
        match self {
            Column::Range {
                mus,
                sigmas,
                ln_norms,
                ..
            } => {
                let z = (x - mus[c]) / sigmas[c];
                -0.5 * z * z - ln_norms[c]
            }
            Column::Values {
                seen,
                prior,
                smoothing,
            } => {
                let v = x as usize;
                let p = match seen.get(c) {
                    Some(&s) => {
                        (f64::from(u8::from(s == v)) + smoothing * prior[v]) / (1.0 + smoothing)
                    }
                    None => prior[v],
                };
                p.max(1e-300).ln()
            }
        }
    }

    /// A draw from component `c`'s kernel.
    fn sample(&self, c: usize, rng: &mut HostRng) -> f64 {
        match self {
            Column::Range {
                mus,
                sigmas,
                lo,
                hi,
                ..
            } => {
                let (mu, s) = (mus[c], sigmas[c]);
                for _ in 0..64 {
                    let x = mu + s * rng.normal();
                    if (*lo..=*hi).contains(&x) {
                        return x;
                    }
                }
                lo + (hi - lo) * rng.next_f64()
            }
            Column::Values {
                seen,
                prior,
                smoothing,
            } => match seen.get(c) {
                // The observed value, or (by the prior's share) a draw from the prior.
                Some(&s) if rng.next_f64() * (1.0 + smoothing) < 1.0 => s as f64,
                _ => rng.pick(prior) as f64,
            },
        }
    }
}

/// The Gaussian kernels of a range, at `xs` and the prior's at the middle.
fn range_column(xs: &[f64], lo: f64, hi: f64) -> Column {
    let width = hi - lo;
    let mut order: Vec<usize> = (0..xs.len()).collect();
    order.sort_by(|&a, &b| xs[a].total_cmp(&xs[b]).then(a.cmp(&b)));
    let min_sigma = width / (100.0f64).min(2.0 + xs.len() as f64);
    let mut sigmas = vec![width; xs.len()];
    for (rank, &i) in order.iter().enumerate() {
        // The range's ends are no neighbours: an observation at the edge of the observations
        // takes its one neighbour's distance.
        let left = (rank > 0).then(|| xs[i] - xs[order[rank - 1]]);
        let right = order.get(rank + 1).map(|&j| xs[j] - xs[i]);
        let spread = match (left, right) {
            (Some(a), Some(b)) => a.max(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => width,
        };
        sigmas[i] = spread.clamp(min_sigma, width);
    }
    let mut mus = xs.to_vec();
    mus.push(0.5 * (lo + hi));
    sigmas.push(width);
    let ln_sqrt_2pi = 0.5 * (2.0 * std::f64::consts::PI).ln();
    let ln_norms = mus
        .iter()
        .zip(&sigmas)
        .map(|(&mu, &s)| {
            let mass = (phi((hi - mu) / s) - phi((lo - mu) / s)).max(1e-12);
            s.ln() + ln_sqrt_2pi + mass.ln()
        })
        .collect();
    Column::Range {
        mus,
        sigmas,
        ln_norms,
        lo,
        hi,
    }
}

/// A mixture of product kernels over some axes, fitted on observations' coordinates.
#[derive(Clone, Debug)]
pub struct Mixture {
    columns: Vec<Column>,
    /// Each component's weight (the observations', then the prior's), as a cumulative share
    /// for drawing and as a log for the density.
    cumulative: Vec<f64>,
    ln_weights: Vec<f64>,
}

impl Mixture {
    /// The mixture of `points` (each a coordinate per axis, in the axes' order) and the prior.
    pub fn fit(axes: &[&Axis], points: &[Vec<f64>]) -> Mixture {
        let columns = axes
            .iter()
            .enumerate()
            .map(|(d, axis)| {
                let xs: Vec<f64> = points.iter().map(|p| p[d]).collect();
                Column::fit(axis, &xs)
            })
            .collect();
        let total = points.len() as f64 + PRIOR_WEIGHT;
        let mut weights = vec![1.0 / total; points.len()];
        weights.push(PRIOR_WEIGHT / total);
        let mut acc = 0.0;
        let cumulative = weights
            .iter()
            .map(|w| {
                acc += w;
                acc
            })
            .collect();
        Mixture {
            columns,
            cumulative,
            ln_weights: weights.iter().map(|w| w.ln()).collect(),
        }
    }

    /// A draw: a component by weight, then each axis from its kernel.
    pub fn sample(&self, rng: &mut HostRng) -> Vec<f64> {
        let u = rng.next_f64() * self.cumulative.last().copied().unwrap_or(1.0);
        let c = self
            .cumulative
            .partition_point(|&a| a <= u)
            .min(self.ln_weights.len() - 1);
        self.columns.iter().map(|col| col.sample(c, rng)).collect()
    }

    /// The log density at `x` (a coordinate per axis).
    pub fn log_pdf(&self, x: &[f64]) -> f64 {
        let term = |c: usize| {
            self.ln_weights[c]
                + self
                    .columns
                    .iter()
                    .zip(x)
                    .map(|(col, &xd)| col.ln_kernel(c, xd))
                    .sum::<f64>()
        };
        // Two passes over the components (the largest, then the sum) instead of a list.
        let n = self.ln_weights.len();
        let top = (0..n).map(term).fold(f64::NEG_INFINITY, f64::max);
        if !top.is_finite() {
            return top;
        }
        top + (0..n).map(|c| (term(c) - top).exp()).sum::<f64>().ln()
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
    use super::*;

    #[test]
    fn erf_is_close() {
        assert!((erf(0.5) - 0.520_499_877_8).abs() < 1e-6);
        assert!((phi(0.0) - 0.5).abs() < 1e-9);
        assert!((phi(-1.96) - 0.025).abs() < 1e-3);
    }

    /// The density integrates to 1 over the range (a Riemann sum), with and without points.
    #[test]
    fn a_range_mixture_is_a_density_on_its_range() {
        let axis = Axis::Range(
            Scale::of(&Dist::Uniform {
                min: -2.0,
                max: 3.0,
            })
            .unwrap(),
        );
        for pts in [
            vec![],
            vec![vec![0.5]],
            vec![vec![-2.0], vec![2.9], vec![1.0]],
        ] {
            let m = Mixture::fit(&[&axis], &pts);
            let steps = 20_000;
            let h = 5.0 / steps as f64;
            let mass: f64 = (0..steps)
                .map(|i| m.log_pdf(&[-2.0 + (i as f64 + 0.5) * h]).exp() * h)
                .sum();
            assert!((mass - 1.0).abs() < 1e-3, "{pts:?}: {mass}");
        }
    }

    /// A categorical column sums to 1 over the values in every component, keeps mass on the
    /// values never seen, and draws the seen value most.
    #[test]
    fn a_categorical_mixture_keeps_every_value_possible() {
        let axis = Axis::of(&Dist::Categorical {
            values: (0..3).map(|i| ParamValue::Num(i as f64)).collect(),
            probabilities: None,
        })
        .unwrap();
        let pts = vec![vec![0.0]; 5];
        let m = Mixture::fit(&[&axis], &pts);
        let p: Vec<f64> = (0..3).map(|v| m.log_pdf(&[v as f64]).exp()).collect();
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{p:?}");
        assert!(p[0] > 0.8 && p[1] > 0.02 && p[2] > 0.02, "{p:?}");
        let mut rng = HostRng::new(7);
        let draws: Vec<usize> = (0..2_000).map(|_| m.sample(&mut rng)[0] as usize).collect();
        let share = |v: usize| draws.iter().filter(|&&d| d == v).count() as f64 / 2_000.0;
        assert!((share(0) - p[0]).abs() < 0.03 && (share(2) - p[2]).abs() < 0.03);
    }

    /// A value the job gives probability 0 has no mass, in the prior and in every kernel.
    #[test]
    fn a_value_of_probability_zero_has_no_mass() {
        let axis = Axis::of(&Dist::Categorical {
            values: (0..3).map(|i| ParamValue::Num(i as f64)).collect(),
            probabilities: Some(vec![0.25, 0.75, 0.0]),
        })
        .unwrap();
        for pts in [vec![], vec![vec![0.0], vec![1.0], vec![1.0]]] {
            let m = Mixture::fit(&[&axis], &pts);
            assert!(m.log_pdf(&[2.0]) < -600.0, "{pts:?}: {}", m.log_pdf(&[2.0]));
            let mut rng = HostRng::new(3);
            assert!((0..2_000).all(|_| m.sample(&mut rng)[0] != 2.0));
        }
    }

    /// Two axes together: the joint density sees which pairs were observed, where two
    /// independent ones would not.
    #[test]
    fn a_joint_mixture_tells_the_observed_pairs_from_their_mirror() {
        let a = Axis::Range(Scale::of(&Dist::Uniform { min: 0.0, max: 1.0 }).unwrap());
        let pts: Vec<Vec<f64>> = (0..20)
            .map(|i| {
                let t = (i % 2) as f64;
                vec![0.1 + 0.8 * t + 0.001 * i as f64, 0.1 + 0.8 * t]
            })
            .collect();
        let joint = Mixture::fit(&[&a, &a], &pts);
        let on = joint.log_pdf(&[0.1, 0.1]);
        let off = joint.log_pdf(&[0.1, 0.9]);
        assert!(on > off + 3.0, "observed {on}, mirrored {off}");
        let x = Mixture::fit(&[&a], &pts.iter().map(|p| vec![p[0]]).collect::<Vec<_>>());
        let y = Mixture::fit(&[&a], &pts.iter().map(|p| vec![p[1]]).collect::<Vec<_>>());
        let indep = |p: [f64; 2]| x.log_pdf(&p[..1]) + y.log_pdf(&p[1..]);
        assert!((indep([0.1, 0.1]) - indep([0.1, 0.9])).abs() < 0.5);
    }
}
