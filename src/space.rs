//! The hyperparameter space, in the W&B sweep vocabulary, and how trials draw from it.
//!
//! A parameter is one of: `{value: x}`, `{values: [..]}` (optionally with `probabilities`), or a
//! range `{min, max}` with a `distribution` among `int_uniform`, `uniform`, `q_uniform`,
//! `log_uniform` (min and max are natural-log exponents, as in W&B), `log_uniform_values`,
//! `q_log_uniform_values`; or `{distribution: normal | log_normal, mu, sigma}`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::rng::{derive, HostRng};

mod dist;
mod param;
pub mod tpe;
mod value;

pub use dist::{Dist, DISTRIBUTIONS, MAX_EXACT_INT, NORMAL_REACH};
pub use param::{Bound, ParamSpec};
pub use value::{ParamValue, SpaceError, NUMBER_BYTES};

/// How trials are drawn from the space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Trial `i` draws each parameter at random from a stream seeded by `(seed, i)`.
    #[default]
    Random,
    /// Trial `i` takes the `i`-th point of the Cartesian product of the `values` (cycling).
    Grid,
    /// Trial `i` is proposed by a Tree-structured Parzen Estimator from the results so far
    /// (see [`tpe`]); its first trials take the points of `random`.
    Bayes,
}

/// The whole space: checked distributions by parameter name, and the method.
#[derive(Clone, Debug, PartialEq)]
pub struct Space {
    pub method: Method,
    pub dists: BTreeMap<String, Dist>,
}

impl Space {
    /// The values of trial `index`: deterministic in `(seed, index)` and independent of N and split mode.
    ///
    /// Each point is computed from its index alone (random draws from a stream seeded by
    /// `(seed, index)`, grid points by their digits in the mixed radix of the value counts), so
    /// no list of points is ever built, whatever the size of the space.
    pub fn point(&self, seed: u64, index: usize) -> BTreeMap<String, ParamValue> {
        match self.method {
            // A bayes sweep's points come from its sampler: by index alone, its random ones.
            Method::Random | Method::Bayes => self.random_point(seed, index),
            Method::Grid => {
                // Past the end the grid cycles; a grid too large to count never gets there.
                let mut rest = match self.grid_size() {
                    Some(size) if size > 0 => index as u64 % size,
                    _ => index as u64,
                };
                let mut out = BTreeMap::new();
                for (name, d) in &self.dists {
                    let len = d.grid_len().max(1) as u64;
                    if let Some(v) = d.grid_value((rest % len) as usize) {
                        out.insert(name.clone(), v.clone());
                    }
                    rest /= len;
                }
                out
            }
        }
    }

    /// The random point of trial `index`: each parameter drawn from a stream seeded by
    /// `(seed, index, its place in name order)`.
    pub fn random_point(&self, seed: u64, index: usize) -> BTreeMap<String, ParamValue> {
        self.dists
            .iter()
            .enumerate()
            .map(|(k, (name, d))| {
                let mut rng = HostRng::new(derive(derive(seed, index as u64), k as u64));
                (name.clone(), d.sample(&mut rng))
            })
            .collect()
    }

    /// The point of this space held in `params` (a trial's parameters, which may hold more),
    /// when every parameter of the space is there with a value its distribution can give.
    pub fn point_in(
        &self,
        params: &BTreeMap<String, ParamValue>,
    ) -> Option<BTreeMap<String, ParamValue>> {
        self.dists
            .iter()
            .map(|(name, d)| {
                let v = params.get(name).filter(|v| d.admits(v))?;
                Some((name.clone(), v.clone()))
            })
            .collect()
    }

    /// The points of trials `0, 1, 2, ...`, each computed when asked for (see [`Space::point`]).
    pub fn points(&self, seed: u64) -> impl Iterator<Item = BTreeMap<String, ParamValue>> + '_ {
        (0..).map(move |i| self.point(seed, i))
    }

    /// Points in the grid (1 for an empty space), or `None` when the count does not fit in a
    /// `u64`: the product of the value counts is computed with checked multiplication.
    /// The most bytes one point of this space can hold: each parameter's name and its longest
    /// value. It bounds a trial's `params` cell in the results files.
    pub fn bytes_per_point(&self) -> u64 {
        self.dists
            .iter()
            .map(|(name, dist)| (name.len() + dist.max_bytes()) as u64)
            .sum()
    }

    pub fn grid_size(&self) -> Option<u64> {
        self.dists
            .values()
            .try_fold(1u64, |acc, d| acc.checked_mul(d.grid_len().max(1) as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> ParamSpec {
        serde_yaml::from_str(yaml).expect("test yaml parses")
    }

    #[test]
    fn every_draw_is_admitted_and_values_outside_are_not() {
        let mut rng = HostRng::new(3);
        for yaml in [
            "{min: 16, max: 256}",
            "{min: -5.0, max: 10.0}",
            "{min: 0.5, max: 3.0, distribution: q_uniform, q: 0.25}",
            "{min: -9.0, max: -2.0, distribution: log_uniform}",
            "{min: 0.0001, max: 0.1, distribution: log_uniform_values}",
            "{min: 1.0, max: 100.0, distribution: q_log_uniform_values, q: 5}",
            "{values: [sgd, adam]}",
            "{value: 3}",
            "{distribution: log_normal, mu: -3, sigma: 1}",
        ] {
            let d = spec(yaml).to_dist("x").unwrap();
            for _ in 0..200 {
                let v = d.sample(&mut rng);
                assert!(d.admits(&v), "{yaml}: {v:?}");
            }
        }
        let d = spec("{min: 0.0001, max: 0.1, distribution: log_uniform_values}")
            .to_dist("x")
            .unwrap();
        assert!(!d.admits(&ParamValue::Num(0.2)));
        assert!(!d.admits(&ParamValue::Word("0.01".into())));
        let ints = spec("{min: 16, max: 256}").to_dist("x").unwrap();
        assert!(!ints.admits(&ParamValue::Num(16.5)));
        let words = spec("{values: [sgd, adam]}").to_dist("x").unwrap();
        assert!(!words.admits(&ParamValue::Word("lion".into())));
        assert!(!spec("{distribution: log_normal, mu: 0, sigma: 1}")
            .to_dist("x")
            .unwrap()
            .admits(&ParamValue::Num(-1.0)));
    }

    #[test]
    fn a_range_that_overflows_a_double_is_refused() {
        let e = spec("{min: -1e308, max: 1e308}").to_dist("x").unwrap_err();
        assert!(e.message.contains("wider than a double"), "{e:?}");
        let e = spec("{min: 0, max: 710, distribution: log_uniform}")
            .to_dist("x")
            .unwrap_err();
        assert_eq!(e.key, "parameters.x.max");
        assert!(spec("{min: 0, max: 709, distribution: log_uniform}")
            .to_dist("x")
            .is_ok());
    }

    #[test]
    fn forms_are_recognised() {
        assert_eq!(
            spec("{value: 0.1}").to_dist("lr").unwrap(),
            Dist::Constant(ParamValue::Num(0.1))
        );
        assert!(matches!(
            spec("{values: [sgd, adam]}").to_dist("optimizer").unwrap(),
            Dist::Categorical { .. }
        ));
        assert_eq!(
            spec("{min: 16, max: 256}").to_dist("batch_size").unwrap(),
            Dist::IntUniform { min: 16, max: 256 }
        );
        // A bound written as a float makes the range a float one, even at a whole value.
        for yaml in [
            "{min: -5.0, max: 10.0}",
            "{min: -5, max: 10.0}",
            "{min: -5.0, max: 10}",
        ] {
            assert_eq!(
                spec(yaml).to_dist("x").unwrap(),
                Dist::Uniform {
                    min: -5.0,
                    max: 10.0
                },
                "{yaml}"
            );
        }
        assert_eq!(
            spec("{min: 0.0001, max: 0.1, distribution: log_uniform_values}")
                .to_dist("lr")
                .unwrap(),
            Dist::LogUniformValues {
                min: 0.0001,
                max: 0.1
            }
        );
    }

    #[test]
    fn bad_entries_name_the_key() {
        let e = spec("{min: 0.1, max: 0.01}").to_dist("lr").unwrap_err();
        assert_eq!(e.key, "parameters.lr.max");
        let e = spec("{min: 0.1, max: 1.0, distribution: zipf}")
            .to_dist("lr")
            .unwrap_err();
        assert_eq!(e.key, "parameters.lr.distribution");
        let e = spec("{values: []}").to_dist("lr").unwrap_err();
        assert_eq!(e.key, "parameters.lr.values");
        let e = spec("{value: 1, values: [1]}").to_dist("lr").unwrap_err();
        assert!(e.message.contains("mixes"));
        let e = spec("{values: [1, 2], probabilities: [0.5, 0.4]}")
            .to_dist("lr")
            .unwrap_err();
        assert!(e.message.contains("sum"));
    }

    #[test]
    fn samples_stay_in_range_and_are_deterministic() {
        let d = spec("{min: 0.0001, max: 0.1, distribution: log_uniform_values}")
            .to_dist("lr")
            .unwrap();
        let mut space = Space {
            method: Method::Random,
            dists: BTreeMap::new(),
        };
        space.dists.insert("lr".into(), d);
        for i in 0..200 {
            let p = space.point(3, i);
            let ParamValue::Num(lr) = p["lr"] else {
                panic!("not a number")
            };
            assert!((0.0001..=0.1).contains(&lr), "{lr}");
            assert_eq!(p, space.point(3, i));
        }
        assert_ne!(space.point(3, 0), space.point(3, 1));
        assert_ne!(space.point(3, 0), space.point(4, 0));
    }

    #[test]
    fn grid_enumerates_the_product() {
        let mut dists = BTreeMap::new();
        dists.insert(
            "lr".into(),
            spec("{values: [0.1, 0.01]}").to_dist("lr").unwrap(),
        );
        dists.insert(
            "optimizer".into(),
            spec("{values: [sgd, adam, adam2]}")
                .to_dist("optimizer")
                .unwrap(),
        );
        let space = Space {
            method: Method::Grid,
            dists,
        };
        assert_eq!(space.grid_size(), Some(6));
        let pts: Vec<_> = (0..6).map(|i| space.point(0, i)).collect();
        for i in 0..6 {
            for j in 0..i {
                assert_ne!(pts[i], pts[j]);
            }
        }
        assert_eq!(space.point(0, 6), pts[0]);
    }

    /// Every point of a small grid, built eagerly: the product of the values, the first
    /// parameter (in name order) changing fastest.
    fn eager_grid(space: &Space) -> Vec<BTreeMap<String, ParamValue>> {
        let mut points = vec![BTreeMap::new()];
        for (name, d) in &space.dists {
            let mut next = Vec::new();
            for v in d.grid_values() {
                for p in &points {
                    let mut p: BTreeMap<String, ParamValue> = p.clone();
                    p.insert(name.clone(), v.clone());
                    next.push(p);
                }
            }
            points = next;
        }
        points
    }

    fn grid_of(counts: &[usize]) -> Space {
        let dists = counts
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let values = (0..n)
                    .map(|v| ParamValue::Num((i * 1000 + v) as f64))
                    .collect();
                (
                    format!("p{i:02}"),
                    Dist::Categorical {
                        values,
                        probabilities: None,
                    },
                )
            })
            .collect();
        Space {
            method: Method::Grid,
            dists,
        }
    }

    proptest::proptest! {
        #[test]
        fn the_lazy_grid_gives_the_eager_points(counts in proptest::collection::vec(1usize..5, 0..5)) {
            let space = grid_of(&counts);
            let eager = eager_grid(&space);
            proptest::prop_assert_eq!(space.grid_size(), Some(eager.len() as u64));
            let lazy: Vec<_> = space.points(7).take(eager.len()).collect();
            proptest::prop_assert_eq!(&lazy, &eager);
            // Past the end the grid cycles.
            proptest::prop_assert_eq!(space.point(7, eager.len()), eager[0].clone());
        }

        #[test]
        fn every_index_maps_to_a_valid_point(counts in proptest::collection::vec(1usize..1000, 1..12), index in proptest::num::usize::ANY) {
            let space = grid_of(&counts);
            let p = space.point(0, index);
            proptest::prop_assert_eq!(p.len(), counts.len());
            for (i, (name, v)) in p.iter().enumerate() {
                proptest::prop_assert_eq!(name, &format!("p{i:02}"));
                let ParamValue::Num(x) = v else { panic!("a number") };
                let own = *x as usize - i * 1000;
                proptest::prop_assert!(own < counts[i], "{} has value {} of {}", name, own, counts[i]);
            }
        }

        #[test]
        fn grid_sizes_never_overflow_silently(counts in proptest::collection::vec(1usize..100_000, 0..20)) {
            let space = grid_of(&counts);
            let exact = counts.iter().try_fold(1u128, |a, &n| a.checked_mul(n as u128));
            let want = exact.and_then(|n| u64::try_from(n).ok());
            proptest::prop_assert_eq!(space.grid_size(), want);
        }

        #[test]
        fn int_uniform_draws_stay_in_range(min in -(1i64 << 53)..(1i64 << 53), width in 0i64..(1i64 << 53), seed in proptest::num::u64::ANY) {
            let max = min.saturating_add(width).min(1i64 << 53);
            let d = Dist::IntUniform { min, max };
            let mut rng = HostRng::new(seed);
            for _ in 0..20 {
                let ParamValue::Num(x) = d.sample(&mut rng) else { panic!("a number") };
                proptest::prop_assert!(x >= min as f64 && x <= max as f64, "{} not in {}..={}", x, min, max);
            }
        }
    }

    #[test]
    fn a_grid_of_two_to_the_64_points_has_no_size_and_still_enumerates() {
        let space = grid_of(&[2; 64]);
        assert_eq!(space.grid_size(), None);
        assert_eq!(grid_of(&[2; 63]).grid_size(), Some(1 << 63));
        // Index 5 = binary 101: the first and third parameters take their second value.
        let p = space.point(0, 5);
        assert_eq!(p["p00"], ParamValue::Num(1.0));
        assert_eq!(p["p01"], ParamValue::Num(1000.0));
        assert_eq!(p["p02"], ParamValue::Num(2001.0));
        assert_ne!(
            space.point(0, 0),
            space.point(0, 1),
            "no wrap to a single point"
        );
    }

    #[test]
    fn int_uniform_bounds_past_2_to_the_53_are_refused() {
        let e = spec("{min: -9e18, max: 9e18, distribution: int_uniform}")
            .to_dist("k")
            .unwrap_err();
        assert_eq!(e.key, "parameters.k.min");
        let e = spec("{min: 0, max: 1e300, distribution: int_uniform}")
            .to_dist("k")
            .unwrap_err();
        assert_eq!(e.key, "parameters.k.max");
    }
}
