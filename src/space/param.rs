//! A parameter as the job file writes it (`{value}`, `{values}`, a range, nested `parameters`), and its checks into a [`Dist`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_yaml::Value;

use super::dist::{Dist, DISTRIBUTIONS, MAX_EXACT_INT};
use super::value::{err, finite, to_value, SpaceError};

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
pub(super) const MAX_NESTING: usize = 8;

pub(super) fn flatten_into(
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
