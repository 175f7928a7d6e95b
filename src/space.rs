//! The hyperparameter space, in the W&B sweep vocabulary, and how trials draw from it.
//!
//! A parameter is one of: `{value: x}`, `{values: [..]}` (optionally with `probabilities`), or a
//! range `{min, max}` with a `distribution` among `int_uniform`, `uniform`, `q_uniform`,
//! `log_uniform` (min and max are natural-log exponents, as in W&B), `log_uniform_values`,
//! `q_log_uniform_values`; or `{distribution: normal | log_normal, mu, sigma}`.

use serde::{Deserialize, Serialize};
use serde_yaml::Value;
use std::collections::BTreeMap;

use crate::rng::{derive, HostRng};

pub mod tpe;

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

/// A range's `min` or `max` as the job wrote it: an integer (`10`) or a float (`10.0`). As in
/// W&B, a range whose bounds are both written as integers is `int_uniform` by default, and one
/// with a bound written as a float is `uniform`, whatever the float's value.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged, try_from = "Value")]
pub enum Bound {
    Int(i64),
    Float(f64),
}

impl TryFrom<Value> for Bound {
    type Error = String;
    fn try_from(v: Value) -> Result<Bound, String> {
        match &v {
            Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => Ok(Bound::Int(i)),
                (None, Some(x)) => Ok(Bound::Float(x)),
                _ => Err(format!("min and max must be numbers, not {n}")),
            },
            other => Err(format!(
                "min and max must be numbers, not {}",
                serde_yaml::to_string(other)
                    .map(|t| t.trim().to_string())
                    .unwrap_or_else(|_| "that".into())
            )),
        }
    }
}

impl Bound {
    pub fn value(self) -> f64 {
        match self {
            Bound::Int(i) => i as f64,
            Bound::Float(x) => x,
        }
    }
    fn written_as_int(self) -> bool {
        matches!(self, Bound::Int(_))
    }
}

/// One parameter's entry under `parameters:`, as written in the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probabilities: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<Bound>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<Bound>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mu: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sigma: Option<f64>,
    /// `beta`'s shape parameters (W&B's names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b: Option<f64>,
    /// Nested parameters (W&B): each is the parameter `<this name>.<its name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, ParamSpec>>,
}

impl ParamSpec {
    /// Every parameter under `parameters:`, nested ones flattened to dotted names
    /// (`optimizer: {parameters: {lr: ...}}` is `optimizer.lr`), in name order; an error names
    /// an entry that mixes `parameters` with a distribution of its own, or nests too deep.
    pub fn flatten(
        specs: &BTreeMap<String, ParamSpec>,
    ) -> Result<Vec<(String, ParamSpec)>, SpaceError> {
        let mut out = Vec::new();
        flatten_into(specs, "", 0, &mut out)?;
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// How deep `parameters` may nest.
const MAX_NESTING: usize = 8;

fn flatten_into(
    specs: &BTreeMap<String, ParamSpec>,
    prefix: &str,
    depth: usize,
    out: &mut Vec<(String, ParamSpec)>,
) -> Result<(), SpaceError> {
    for (name, spec) in specs {
        let full = format!("{prefix}{name}");
        let Some(inner) = &spec.parameters else {
            out.push((full, spec.clone()));
            continue;
        };
        let own = ParamSpec {
            parameters: None,
            ..spec.clone()
        };
        if own != ParamSpec::default() {
            return Err(err(
                format!("parameters.{full}"),
                "has nested `parameters` and a distribution of its own: give one",
            ));
        }
        if depth + 1 >= MAX_NESTING {
            return Err(err(
                format!("parameters.{full}"),
                format!("nests parameters more than {MAX_NESTING} deep"),
            ));
        }
        flatten_into(inner, &format!("{full}."), depth + 1, out)?;
    }
    Ok(())
}

/// A parameter's value: a number or a word.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ParamValue {
    Num(f64),
    Word(String),
}

/// Whole numbers are written as integers (`batch_size: 32`, not `32.0`).
impl Serialize for ParamValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ParamValue::Num(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => {
                s.serialize_i64(*x as i64)
            }
            ParamValue::Num(x) => s.serialize_f64(*x),
            ParamValue::Word(w) => s.serialize_str(w),
        }
    }
}

impl ParamValue {
    /// About how many bytes a trial spends holding this value: its text, or a number's cell.
    pub fn held_bytes(&self) -> usize {
        match self {
            ParamValue::Num(_) => NUMBER_BYTES,
            ParamValue::Word(w) => w.len(),
        }
    }
}

/// What a number is counted as in [`ParamValue::held_bytes`]: the longest text of an `f64`.
pub const NUMBER_BYTES: usize = 24;

impl std::fmt::Display for ParamValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamValue::Num(x) => write!(f, "{x}"),
            ParamValue::Word(s) => f.write_str(s),
        }
    }
}

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

/// A problem with one parameter: the key under `parameters.<name>` and the message.
#[derive(Clone, Debug, PartialEq)]
pub struct SpaceError {
    pub key: String,
    pub message: String,
}

fn err(key: impl Into<String>, message: impl Into<String>) -> SpaceError {
    SpaceError {
        key: key.into(),
        message: message.into(),
    }
}

fn to_value(v: &Value, key: &str) -> Result<ParamValue, SpaceError> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .map(ParamValue::Num)
            .ok_or_else(|| err(key, "is not a representable number")),
        Value::String(s) => Ok(ParamValue::Word(s.clone())),
        Value::Bool(b) => Ok(ParamValue::Word(b.to_string())),
        _ => Err(err(key, "must be a number or a word")),
    }
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

fn finite(x: f64, key: &str) -> Result<f64, SpaceError> {
    if x.is_finite() {
        Ok(x)
    } else {
        Err(err(key, "must be finite"))
    }
}

impl ParamSpec {
    /// Checks the entry and turns it into a [`Dist`]. `name` is the parameter's name.
    pub fn to_dist(&self, name: &str) -> Result<Dist, SpaceError> {
        let key = |k: &str| format!("parameters.{name}.{k}");
        let base = format!("parameters.{name}");
        let forms = [
            self.value.is_some(),
            self.values.is_some(),
            self.min.is_some() || self.max.is_some(),
            self.mu.is_some() || self.sigma.is_some(),
            self.a.is_some() || self.b.is_some(),
        ];
        let beta_named = matches!(self.distribution.as_deref(), Some("beta" | "q_beta"));
        match forms.iter().filter(|f| **f).count() {
            0 if beta_named => {}
            0 => {
                return Err(err(
                    base,
                    "needs `value`, `values`, `min`/`max`, `mu`/`sigma`, or (for beta) `a`/`b`",
                ))
            }
            1 => {}
            _ => {
                return Err(err(
                    base,
                    "mixes `value`, `values`, `min`/`max`, `mu`/`sigma` and `a`/`b`: use one",
                ))
            }
        }
        if beta_named || self.a.is_some() || self.b.is_some() {
            return self.beta(name);
        }
        if self.probabilities.is_some() && self.values.is_none() {
            return Err(err(key("probabilities"), "only applies with `values`"));
        }
        if let Some(v) = &self.value {
            self.no_distribution(name, "value")?;
            return Ok(Dist::Constant(to_value(v, &key("value"))?));
        }
        if let Some(vs) = &self.values {
            self.no_distribution(name, "values")?;
            if vs.is_empty() {
                return Err(err(key("values"), "must not be empty"));
            }
            let values = vs
                .iter()
                .map(|v| to_value(v, &key("values")))
                .collect::<Result<Vec<_>, _>>()?;
            if let Some(p) = &self.probabilities {
                if p.len() != values.len() {
                    return Err(err(
                        key("probabilities"),
                        format!("has {} entries for {} values", p.len(), values.len()),
                    ));
                }
                if p.iter().any(|x| !x.is_finite() || *x < 0.0) {
                    return Err(err(key("probabilities"), "must be non-negative numbers"));
                }
                let sum: f64 = p.iter().sum();
                if (sum - 1.0).abs() > 1e-6 {
                    return Err(err(key("probabilities"), format!("sum to {sum}, not 1")));
                }
            }
            return Ok(Dist::Categorical {
                values,
                probabilities: self.probabilities.clone(),
            });
        }
        if self.mu.is_some() || self.sigma.is_some() {
            let mu = finite(self.mu.unwrap_or(0.0), &key("mu"))?;
            let sigma = finite(self.sigma.unwrap_or(1.0), &key("sigma"))?;
            if sigma <= 0.0 {
                return Err(err(key("sigma"), "must be positive"));
            }
            if self.q.is_some()
                && !matches!(
                    self.distribution.as_deref(),
                    Some("q_normal" | "q_log_normal")
                )
            {
                return Err(err(
                    key("q"),
                    "applies to q_normal and q_log_normal, not to normal or log_normal",
                ));
            }
            return match self.distribution.as_deref() {
                Some("normal") | None => Ok(Dist::Normal { mu, sigma }),
                Some("log_normal") => Ok(Dist::LogNormal { mu, sigma }),
                Some("q_normal") => Ok(Dist::Quantised {
                    inner: Box::new(Dist::Normal { mu, sigma }),
                    q: self.step(name)?,
                }),
                Some("q_log_normal") => Ok(Dist::Quantised {
                    inner: Box::new(Dist::LogNormal { mu, sigma }),
                    q: self.step(name)?,
                }),
                Some(d) => Err(err(
                    key("distribution"),
                    format!(
                        "`{d}` does not take mu/sigma (use normal, log_normal, q_normal or q_log_normal)"
                    ),
                )),
            };
        }
        let (Some(min), Some(max)) = (self.min, self.max) else {
            return Err(err(base, "a range needs both `min` and `max`"));
        };
        let written_as_ints = min.written_as_int() && max.written_as_int();
        let min = finite(min.value(), &key("min"))?;
        let max = finite(max.value(), &key("max"))?;
        if min >= max {
            return Err(err(
                key("max"),
                format!("must be above min ({max} <= {min})"),
            ));
        }
        if !(max - min).is_finite() {
            return Err(err(
                base.clone(),
                format!(
                    "the range from {min} to {max} is wider than a double holds (its width overflows to infinity, and draws would be infinite): narrow it"
                ),
            ));
        }
        let both_int = min.fract() == 0.0 && max.fract() == 0.0;
        let dist = self.distribution.as_deref().unwrap_or(if written_as_ints {
            "int_uniform"
        } else {
            "uniform"
        });
        let q = || -> Result<f64, SpaceError> {
            let q = finite(self.q.unwrap_or(1.0), &key("q"))?;
            if q <= 0.0 {
                Err(err(key("q"), "must be positive"))
            } else {
                Ok(q)
            }
        };
        if self.q.is_some() && !dist.starts_with("q_") {
            return Err(err(key("q"), format!("does not apply to `{dist}`")));
        }
        match dist {
            "int_uniform" => {
                if !both_int {
                    return Err(err(base, "int_uniform needs integer min and max"));
                }
                for (k, x) in [("min", min), ("max", max)] {
                    if x.abs() > MAX_EXACT_INT {
                        return Err(err(
                            key(k),
                            format!("must lie between -2^53 and 2^53 for int_uniform, not {x}"),
                        ));
                    }
                }
                Ok(Dist::IntUniform {
                    min: min as i64,
                    max: max as i64,
                })
            }
            "uniform" => Ok(Dist::Uniform { min, max }),
            "q_uniform" => Ok(Dist::QUniform { min, max, q: q()? }),
            "log_uniform" => {
                // min and max are exponents: e^max must be a finite double.
                if !max.exp().is_finite() {
                    return Err(err(
                        key("max"),
                        format!(
                            "is a natural-log exponent for log_uniform, and e^{max} overflows a double (at most {:.2}); for bounds given as values use log_uniform_values",
                            f64::MAX.ln()
                        ),
                    ));
                }
                Ok(Dist::LogUniform { min, max })
            }
            "q_log_uniform" => {
                // exp(U(min, max)) rounded: log-uniform between e^min and e^max.
                if !max.exp().is_finite() {
                    return Err(err(
                        key("max"),
                        format!("is a natural-log exponent for q_log_uniform, and e^{max} overflows a double"),
                    ));
                }
                Ok(Dist::QLogUniformValues {
                    min: min.exp(),
                    max: max.exp(),
                    q: q()?,
                })
            }
            "inv_log_uniform" => {
                if !(-min).exp().is_finite() {
                    return Err(err(
                        key("min"),
                        format!("is a natural-log exponent for inv_log_uniform, and e^{} overflows a double", -min),
                    ));
                }
                Ok(Dist::InvLogUniform { min, max })
            }
            // log(1/X) uniform between log(1/max) and log(1/min): X log-uniform on [min, max].
            "inv_log_uniform_values" => {
                if min <= 0.0 {
                    return Err(err(key("min"), format!("must be positive for {dist}")));
                }
                Ok(Dist::LogUniformValues { min, max })
            }
            "log_uniform_values" | "q_log_uniform_values" => {
                if min <= 0.0 {
                    return Err(err(key("min"), format!("must be positive for {dist}")));
                }
                if dist == "log_uniform_values" {
                    Ok(Dist::LogUniformValues { min, max })
                } else {
                    Ok(Dist::QLogUniformValues { min, max, q: q()? })
                }
            }
            other => Err(err(
                key("distribution"),
                format!(
                    "unknown distribution `{other}` (expected one of {})",
                    DISTRIBUTIONS.join(", ")
                ),
            )),
        }
    }

    fn no_distribution(&self, name: &str, form: &str) -> Result<(), SpaceError> {
        let fits = match form {
            "value" => ["constant"].as_slice(),
            _ => ["categorical", "categorical_w_probabilities", "constant"].as_slice(),
        };
        match &self.distribution {
            Some(d) if !fits.contains(&d.as_str()) => Err(err(
                format!("parameters.{name}.distribution"),
                format!(
                    "`{d}` does not apply to `{form}` (with `{form}`: {}; a range takes min/max)",
                    fits.join(" or ")
                ),
            )),
            _ => Ok(()),
        }
    }

    /// `q` of a quantised distribution: positive and finite (default 1).
    fn step(&self, name: &str) -> Result<f64, SpaceError> {
        let key = format!("parameters.{name}.q");
        let q = finite(self.q.unwrap_or(1.0), &key)?;
        if q <= 0.0 {
            return Err(err(key, "must be positive"));
        }
        Ok(q)
    }

    /// `beta` (`q_beta`): Beta(a, b) on [0, 1], both positive (default 1).
    fn beta(&self, name: &str) -> Result<Dist, SpaceError> {
        let key = |k: &str| format!("parameters.{name}.{k}");
        match self.distribution.as_deref() {
            Some("beta" | "q_beta") => {}
            other => {
                return Err(err(
                    key("distribution"),
                    format!(
                        "`a`/`b` are beta's: write `distribution: beta` (not {})",
                        other.map_or("nothing".to_string(), |d| format!("`{d}`"))
                    ),
                ))
            }
        }
        let a = finite(self.a.unwrap_or(1.0), &key("a"))?;
        let b = finite(self.b.unwrap_or(1.0), &key("b"))?;
        for (k, v) in [("a", a), ("b", b)] {
            if v <= 0.0 {
                return Err(err(key(k), format!("must be positive, not {v}")));
            }
        }
        let beta = Dist::Beta { a, b };
        if self.distribution.as_deref() == Some("q_beta") {
            return Ok(Dist::Quantised {
                inner: Box::new(beta),
                q: self.step(name)?,
            });
        }
        if self.q.is_some() {
            return Err(err(key("q"), "applies to q_beta, not to beta"));
        }
        Ok(beta)
    }
}

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
    fn grid_value(&self, i: usize) -> Option<&ParamValue> {
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
                    Some(p) => {
                        let u = rng.next_f64();
                        let mut acc = 0.0;
                        p.iter()
                            .position(|pi| {
                                acc += pi;
                                u < acc
                            })
                            .unwrap_or(values.len() - 1)
                    }
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
fn gamma(shape: f64, rng: &mut HostRng) -> f64 {
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
