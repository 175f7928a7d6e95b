//! A trial's hyperparameters and parameter values, built from the `train:` defaults and a point of the space.

use std::collections::BTreeMap;

use super::{Hyper, Job, Optimizer, TrainSpec, MAX_BATCH_SIZE};
use crate::error::JobError;
use crate::space::ParamValue;

/// The names a job may put under `parameters:`.
pub const PARAMETERS: [&str; 6] = [
    "lr",
    "batch_size",
    "optimizer",
    "momentum",
    "weight_decay",
    "dropout",
];

impl Hyper {
    /// The defaults of `train:` overridden by a point of the space.
    pub fn from_point(
        train: &TrainSpec,
        point: &BTreeMap<String, ParamValue>,
    ) -> Result<Hyper, (String, String)> {
        let mut h = Hyper {
            lr: train.lr,
            batch_size: train.batch_size,
            optimizer: train.optimizer,
            momentum: train.momentum,
            weight_decay: train.weight_decay,
            dropout: train.dropout,
        };
        for (name, v) in point {
            h.set(name, v)?;
        }
        h.check()?;
        Ok(h)
    }

    fn set(&mut self, name: &str, v: &ParamValue) -> Result<(), (String, String)> {
        let key = format!("parameters.{name}");
        let num = || match v {
            ParamValue::Num(x) => Ok(*x),
            ParamValue::Word(w) => Err((key.clone(), format!("must be a number, not `{w}`"))),
        };
        match name {
            "lr" => self.lr = num()?,
            "momentum" => self.momentum = num()?,
            "weight_decay" => self.weight_decay = num()?,
            "dropout" => self.dropout = num()?,
            "batch_size" => {
                let x = num()?;
                if x.fract() != 0.0 || !(1.0..=MAX_BATCH_SIZE as f64).contains(&x) {
                    return Err((
                        key,
                        format!("must be a whole number from 1 to {MAX_BATCH_SIZE}, not {x}"),
                    ));
                }
                self.batch_size = x as u32;
            }
            "optimizer" => {
                self.optimizer = match v {
                    ParamValue::Word(w) if w == "sgd" => Optimizer::Sgd,
                    ParamValue::Word(w) if w == "adam" => Optimizer::Adam,
                    other => {
                        return Err((key, format!("must be sgd or adam, not `{other}`")));
                    }
                }
            }
            other => {
                return Err((
                    key,
                    format!(
                        "`{other}` is not a parameter (expected one of {})",
                        PARAMETERS.join(", ")
                    ),
                ))
            }
        }
        Ok(())
    }

    /// Checks the values; the key names the parameter.
    pub fn check(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, m: String| Err((k.to_string(), m));
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("lr", format!("must be a positive number, not {}", self.lr));
        }
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return bad(
                "batch_size",
                format!(
                    "must be from 1 to {MAX_BATCH_SIZE}, not {}",
                    self.batch_size
                ),
            );
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return bad(
                "momentum",
                format!("must be in [0, 1), not {}", self.momentum),
            );
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(
                "weight_decay",
                format!("must be 0 or more, not {}", self.weight_decay),
            );
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(
                "dropout",
                format!("must be in [0, 1), not {}", self.dropout),
            );
        }
        Ok(())
    }
}

impl Job {
    /// The hyperparameters of trial `index` (names an external command invents are left out).
    pub fn hyper(&self, index: usize) -> Result<Hyper, JobError> {
        self.hyper_at(index, &self.space.point(self.file.seed, index))
    }

    /// The hyperparameters of trial `index` given its point of the space.
    pub fn hyper_at(
        &self,
        index: usize,
        point: &BTreeMap<String, ParamValue>,
    ) -> Result<Hyper, JobError> {
        let mut point = point.clone();
        point.retain(|name, _| PARAMETERS.contains(&name.as_str()));
        if self.file.command.is_some() {
            // An external command gives its parameters its own meaning: one named like a
            // built-in hyperparameter (`optimizer: adamw`) is its own, and the built-in columns
            // of trials.csv keep what they can hold.
            point.retain(|name, v| {
                let one = BTreeMap::from([(name.clone(), v.clone())]);
                Hyper::from_point(&self.file.train, &one).is_ok()
            });
        }
        Hyper::from_point(&self.file.train, &point).map_err(|(k, m)| {
            let key = if k.starts_with("parameters.") {
                k
            } else {
                format!("parameters.{k}")
            };
            self.invalid(&key, format!("drew a bad value for trial {index}: {m}"))
        })
    }

    /// Every value trial `index` is given: the built-in hyperparameters (drawn or default),
    /// `epochs`, and any other parameter of the space (for an external command's template).
    pub fn params(&self, index: usize) -> Result<BTreeMap<String, ParamValue>, JobError> {
        self.params_at(index, &self.space.point(self.file.seed, index))
    }

    /// Every value trial `index` is given (see [`Job::params`]), given its point of the space.
    pub fn params_at(
        &self,
        index: usize,
        point: &BTreeMap<String, ParamValue>,
    ) -> Result<BTreeMap<String, ParamValue>, JobError> {
        let h = self.hyper_at(index, point)?;
        let mut out = BTreeMap::new();
        out.insert("lr".into(), ParamValue::Num(h.lr));
        out.insert("batch_size".into(), ParamValue::Num(h.batch_size as f64));
        out.insert(
            "optimizer".into(),
            ParamValue::Word(h.optimizer.to_string()),
        );
        out.insert("momentum".into(), ParamValue::Num(h.momentum));
        out.insert("weight_decay".into(), ParamValue::Num(h.weight_decay));
        out.insert("dropout".into(), ParamValue::Num(h.dropout));
        out.insert(
            "epochs".into(),
            ParamValue::Num(self.file.train.epochs as f64),
        );
        out.extend(point.clone());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::job::test_jobs::{parse, OK};

    #[test]
    fn hyper_draws_differ_between_trials_but_not_between_calls() {
        let j = parse(&format!(
            "{OK}parameters:\n  lr: {{min: 0.0001, max: 0.1, distribution: log_uniform_values}}\n"
        ))
        .unwrap();
        assert_eq!(j.hyper(3).unwrap(), j.hyper(3).unwrap());
        assert_ne!(j.hyper(3).unwrap().lr, j.hyper(4).unwrap().lr);
    }
}
