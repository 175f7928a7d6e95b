//! The distributions a parameter draws from (W&B's list), and drawing from them.

use super::value::{ParamValue, NUMBER_BYTES};
use crate::rng::HostRng;

/// A checked distribution.
#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    Constant(ParamValue),
    Categorical {
        values: Vec<ParamValue>,
        probabilities: Option<Vec<f64>>,
    },
    IntUniform {
        min: i64,
        max: i64,
    },
    Uniform {
        min: f64,
        max: f64,
    },
    QUniform {
        min: f64,
        max: f64,
        q: f64,
    },
    /// `exp(U(min, max))`.
    LogUniform {
        min: f64,
        max: f64,
    },
    /// Log-uniform between the values `min` and `max`.
    LogUniformValues {
        min: f64,
        max: f64,
    },
    QLogUniformValues {
        min: f64,
        max: f64,
        q: f64,
    },
    Normal {
        mu: f64,
        sigma: f64,
    },
    LogNormal {
        mu: f64,
        sigma: f64,
    },
    /// `exp(−U(min, max))`: W&B's `inv_log_uniform` (`log(1/X)` uniform on `[min, max]`).
    InvLogUniform {
        min: f64,
        max: f64,
    },
    /// Beta(a, b) on [0, 1].
    Beta {
        a: f64,
        b: f64,
    },
    /// Another distribution's draws rounded to a multiple of `q` (W&B's `q_normal`,
    /// `q_log_normal`, `q_beta`).
    Quantised {
        inner: Box<Dist>,
        q: f64,
    },
}

/// Every `distribution` a parameter may name: W&B's sweep-configuration list.
pub const DISTRIBUTIONS: [&str; 18] = [
    "constant",
    "categorical",
    "categorical_w_probabilities",
    "int_uniform",
    "uniform",
    "q_uniform",
    "log_uniform",
    "log_uniform_values",
    "q_log_uniform",
    "q_log_uniform_values",
    "inv_log_uniform",
    "inv_log_uniform_values",
    "normal",
    "q_normal",
    "log_normal",
    "q_log_normal",
    "beta",
    "q_beta",
];

/// How many standard deviations from its mean a normal draw can reach: the sampler's
/// Box–Muller transform reaches `√(−2·ln u)` for its smallest `u` (the smallest positive
/// `f64`), about 37.6.
pub const NORMAL_REACH: f64 = 38.0;

/// The largest magnitude of an `int_uniform` bound: every integer up to it is exact in an `f64`.
pub const MAX_EXACT_INT: f64 = 9_007_199_254_740_992.0;

impl Dist {
    /// Whether `grid` search can enumerate it.
    /// The most bytes one of this distribution's values takes ([`ParamValue::held_bytes`]).
    pub fn max_bytes(&self) -> usize {
        match self {
            Dist::Constant(v) => v.held_bytes(),
            Dist::Categorical { values, .. } => {
                values.iter().map(ParamValue::held_bytes).max().unwrap_or(0)
            }
            _ => NUMBER_BYTES,
        }
    }

    pub fn is_discrete(&self) -> bool {
        matches!(self, Dist::Constant(_) | Dist::Categorical { .. })
    }

    /// The distinct values a grid enumerates.
    pub fn grid_values(&self) -> Vec<ParamValue> {
        match self {
            Dist::Constant(v) => vec![v.clone()],
            Dist::Categorical { values, .. } => values.clone(),
            _ => Vec::new(),
        }
    }

    /// How many values a grid enumerates (0 for a range, which a grid cannot enumerate).
    pub fn grid_len(&self) -> usize {
        match self {
            Dist::Constant(_) => 1,
            Dist::Categorical { values, .. } => values.len(),
            _ => 0,
        }
    }

    /// The `i`-th value a grid enumerates, if there is one.
    pub(super) fn grid_value(&self, i: usize) -> Option<&ParamValue> {
        match self {
            Dist::Constant(v) if i == 0 => Some(v),
            Dist::Categorical { values, .. } => values.get(i),
            _ => None,
        }
    }

    /// Every value a check must accept: the constant or categorical values, or the range's ends.
    pub fn extremes(&self) -> Vec<ParamValue> {
        match self {
            Dist::Constant(_) | Dist::Categorical { .. } => self.grid_values(),
            Dist::IntUniform { min, max } => {
                vec![ParamValue::Num(*min as f64), ParamValue::Num(*max as f64)]
            }
            Dist::Uniform { min, max }
            | Dist::QUniform { min, max, .. }
            | Dist::LogUniformValues { min, max }
            | Dist::QLogUniformValues { min, max, .. } => {
                vec![ParamValue::Num(*min), ParamValue::Num(*max)]
            }
            Dist::LogUniform { min, max } => {
                vec![ParamValue::Num(min.exp()), ParamValue::Num(max.exp())]
            }
            // As far as the sampler reaches: every draw lies between these.
            Dist::Normal { mu, sigma } => vec![
                ParamValue::Num(mu - NORMAL_REACH * sigma),
                ParamValue::Num(mu + NORMAL_REACH * sigma),
            ],
            Dist::LogNormal { mu, sigma } => vec![
                ParamValue::Num((mu - NORMAL_REACH * sigma).exp()),
                ParamValue::Num((mu + NORMAL_REACH * sigma).exp()),
            ],
            Dist::InvLogUniform { min, max } => {
                vec![ParamValue::Num((-max).exp()), ParamValue::Num((-min).exp())]
            }
            Dist::Beta { .. } => vec![ParamValue::Num(0.0), ParamValue::Num(1.0)],
            Dist::Quantised { inner, q } => inner
                .extremes()
                .into_iter()
                .map(|v| match v {
                    ParamValue::Num(x) => ParamValue::Num((x / q).round() * q),
                    w => w,
                })
                .collect(),
        }
    }

    /// Whether the distribution is a normal or a log-normal one (unbounded, or nearly).
    pub fn is_normal(&self) -> bool {
        match self {
            Dist::Normal { .. } | Dist::LogNormal { .. } => true,
            Dist::Quantised { inner, .. } => inner.is_normal(),
            _ => false,
        }
    }

    /// Whether `v` is a value this distribution can give: one of its values, or a number in its
    /// range (a quantised range's ends widened by half a step, a log range's by rounding).
    pub fn admits(&self, v: &ParamValue) -> bool {
        let within = |x: f64, lo: f64, hi: f64| {
            let slack = 1e-12 * lo.abs().max(hi.abs());
            x.is_finite() && x >= lo - slack && x <= hi + slack
        };
        let num = match v {
            ParamValue::Num(x) => Some(*x),
            ParamValue::Word(_) => None,
        };
        match (self, num) {
            (Dist::Constant(c), _) => c == v,
            (Dist::Categorical { values, .. }, _) => values.contains(v),
            (_, None) => false,
            (Dist::IntUniform { min, max }, Some(x)) => {
                x.fract() == 0.0 && within(x, *min as f64, *max as f64)
            }
            (Dist::Uniform { min, max }, Some(x)) => within(x, *min, *max),
            (Dist::QUniform { min, max, q }, Some(x)) => within(x, min - q / 2.0, max + q / 2.0),
            (Dist::LogUniform { min, max }, Some(x)) => within(x, min.exp(), max.exp()),
            (Dist::LogUniformValues { min, max }, Some(x)) => within(x, *min, *max),
            (Dist::QLogUniformValues { min, max, q }, Some(x)) => {
                within(x, min - q / 2.0, max + q / 2.0)
            }
            (Dist::Normal { .. }, Some(x)) => x.is_finite(),
            (Dist::LogNormal { .. }, Some(x)) => x.is_finite() && x > 0.0,
            (Dist::InvLogUniform { min, max }, Some(x)) => within(x, (-max).exp(), (-min).exp()),
            (Dist::Beta { .. }, Some(x)) => within(x, 0.0, 1.0),
            (Dist::Quantised { inner, q }, Some(x)) => {
                let whole = (x / q).round() * q;
                x.is_finite()
                    && (whole - x).abs() <= 1e-9 * q.max(x.abs())
                    && match inner.as_ref() {
                        Dist::LogNormal { .. } => x >= 0.0,
                        Dist::Beta { .. } => within(x, 0.0, 1.0),
                        _ => true,
                    }
            }
        }
    }

    /// Draws one value.
    pub fn sample(&self, rng: &mut HostRng) -> ParamValue {
        let quantise = |x: f64, q: f64| (x / q).round() * q;
        match self {
            Dist::Constant(v) => v.clone(),
            Dist::Categorical {
                values,
                probabilities,
            } => {
                let i = match probabilities {
                    None => rng.below(values.len()),
                    Some(p) => rng.pick(p),
                };
                values[i].clone()
            }
            Dist::IntUniform { min, max } => {
                // Bounds are within ±2^53 (checked when the job is read), so the width fits.
                let width = (*max as i128 - *min as i128 + 1).clamp(1, 1 << 60) as u128;
                let offset = (rng.next_u64() as u128 * width) >> 64;
                ParamValue::Num((*min as i128 + offset as i128) as f64)
            }
            Dist::Uniform { min, max } => ParamValue::Num(min + (max - min) * rng.next_f64()),
            Dist::QUniform { min, max, q } => {
                ParamValue::Num(quantise(min + (max - min) * rng.next_f64(), *q))
            }
            Dist::LogUniform { min, max } => {
                ParamValue::Num((min + (max - min) * rng.next_f64()).exp())
            }
            Dist::LogUniformValues { min, max } => {
                let (a, b) = (min.ln(), max.ln());
                ParamValue::Num((a + (b - a) * rng.next_f64()).exp())
            }
            Dist::QLogUniformValues { min, max, q } => {
                let (a, b) = (min.ln(), max.ln());
                ParamValue::Num(quantise((a + (b - a) * rng.next_f64()).exp(), *q))
            }
            Dist::Normal { mu, sigma } => ParamValue::Num(mu + sigma * rng.normal()),
            Dist::LogNormal { mu, sigma } => ParamValue::Num((mu + sigma * rng.normal()).exp()),
            Dist::InvLogUniform { min, max } => {
                ParamValue::Num((-(min + (max - min) * rng.next_f64())).exp())
            }
            Dist::Beta { a, b } => {
                let x = gamma(*a, rng);
                let y = gamma(*b, rng);
                ParamValue::Num(if x + y > 0.0 { x / (x + y) } else { 0.5 })
            }
            Dist::Quantised { inner, q } => match inner.sample(rng) {
                ParamValue::Num(x) => ParamValue::Num(quantise(x, *q)),
                w => w,
            },
        }
    }
}

/// A Gamma(shape, 1) draw (Marsaglia and Tsang; for shape < 1, boosted by `U^(1/shape)`).
pub(super) fn gamma(shape: f64, rng: &mut HostRng) -> f64 {
    if shape < 1.0 {
        let u = rng.next_f64().max(f64::MIN_POSITIVE);
        return gamma(shape + 1.0, rng) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = rng.normal();
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = rng.next_f64().max(f64::MIN_POSITIVE);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}
