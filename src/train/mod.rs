//! Training: what a trial trains and what it reports, one loop of epochs and steps ([`epochs`]) over one seed schedule ([`seeds`]), used by single trials ([`run_trial`]) and mirrored training ([`mirrored`]) alike.

/// What trials must share to train in one fused group: the model and its shape, the batch, the
/// optimizer, whether dropout is on (a rate above 0 adds a layer), the data's shape, the
/// epochs, the step cap and the engine options. The rates (lr, momentum, weight decay, dropout
/// above 0) and the seed may differ. Equal keys mean compatible trials.
pub fn group_key(cfg: &TrialConfig) -> String {
    let h = &cfg.hyper;
    serde_json::json!({
        "model": cfg.model,
        "batch": h.batch_size,
        "optimizer": h.optimizer,
        "dropout": h.dropout > 0.0,
        "input": cfg.input,
        "classes": cfg.classes,
        "epochs": cfg.epochs,
        "max_steps": cfg.max_steps,
        "engine": cfg.engine,
    })
    .to_string()
}

#[cfg(test)]
mod counts_tests;
pub mod epochs;
pub mod fault;
pub mod fit;
pub mod fused;
#[cfg(test)]
mod metric_names_tests;
pub mod mirrored;
pub mod seeds;
mod single;
pub mod stop;

use serde::{Deserialize, Serialize};

use crate::engine::EngineOptions;
use crate::models::{Hyper, ModelSpec};
use fault::FaultSpec;

/// Steps a trial's thread may issue ahead of its device ([`crate::engine::Backend::pace`]):
/// enough to keep the device busy from one step to the next, and few enough that a cancel
/// waits for no more than these.
pub(crate) const STEPS_AHEAD: usize = 2;

pub use fit::largest_fitting;

pub use single::run_trial;
pub(crate) use single::{evaluate, Loads};

/// What a trial trains.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrialConfig {
    pub model: ModelSpec,
    pub hyper: Hyper,
    pub epochs: u32,
    pub seed: u64,
    /// Sample shape `[c, h, w]` and classes of the dataset.
    pub input: [usize; 3],
    pub classes: usize,
    #[serde(default)]
    pub fault: Option<FaultSpec>,
    #[serde(default)]
    pub engine: EngineOptions,
    /// Stop after this many steps per epoch (short probes); `None` runs whole epochs.
    #[serde(default)]
    pub max_steps: Option<usize>,
    /// A warm-up: its steps capped by `max_steps`, it still evaluates once after each epoch, so
    /// that every kernel a trial runs (its evaluation's too) is loaded before timed trials run.
    #[serde(default)]
    pub warm_up: bool,
    /// Checked at every step: an aborted trial stops with [`stop::Stop::Interrupted`].
    #[serde(skip)]
    pub cancel: crate::cancel::Cancel,
    /// Asked after each epoch, once its figures are reported: when it says stop, the training
    /// ends there with the result so far, and the rule remembers it ([`Prune::stopped`]).
    #[serde(skip)]
    pub prune: Option<Prune>,
}

/// A sweep's early-termination rule for one trial, as the training loop sees it: given an
/// epoch's figures, whether the trial stops there; and, once it said so, the epoch.
#[derive(Clone)]
pub struct Prune {
    rule: std::sync::Arc<PruneFn>,
    /// The epoch it stopped the trial after; 0 while it has not.
    stopped: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

/// Whether a trial stops after an epoch with these figures.
pub type PruneFn = dyn Fn(&EpochStats) -> bool + Send + Sync;

impl Prune {
    pub fn new(rule: std::sync::Arc<PruneFn>) -> Prune {
        Prune {
            rule,
            stopped: Default::default(),
        }
    }

    /// Whether the trial stops after this epoch (remembered when it does).
    pub fn stops(&self, stats: &EpochStats) -> bool {
        let stop = (self.rule)(stats);
        if stop {
            let order = std::sync::atomic::Ordering::SeqCst;
            self.stopped.store(stats.epoch.max(1), order);
        }
        stop
    }

    /// The epoch after which it stopped the trial, if it did: a training that ended with a
    /// result then was PRUNED, not COMPLETE.
    pub fn stopped(&self) -> Option<u32> {
        let at = self.stopped.load(std::sync::atomic::Ordering::SeqCst);
        (at > 0).then_some(at)
    }
}

impl std::fmt::Debug for Prune {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Prune")
    }
}

/// The figures of one epoch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochStats {
    /// 1-based.
    pub epoch: u32,
    #[serde(with = "json_float")]
    pub train_loss: f64,
    #[serde(with = "json_float")]
    pub train_acc: f64,
    /// NaN in short probes, which skip evaluation.
    #[serde(with = "json_float")]
    pub test_loss: f64,
    #[serde(with = "json_float")]
    pub test_acc: f64,
    /// Seconds since the trial started.
    pub wall_s: f64,
    /// Other numeric values an external command's epoch line reported, by name (each becomes a
    /// column of `progress.csv`); empty for a built-in model.
    #[serde(
        default,
        skip_serializing_if = "std::collections::BTreeMap::is_empty",
        with = "json_float::map"
    )]
    pub extra: std::collections::BTreeMap<String, f64>,
}

/// The metric names Keras, W&B and most scripts print, and gpumux's name for each: an epoch's
/// figure answers to either. Of two common names for one of gpumux's, the first here wins.
pub const COMMON_METRIC_NAMES: [(&str, &str); 6] = [
    ("loss", "train_loss"),
    ("accuracy", "train_acc"),
    ("acc", "train_acc"),
    ("val_loss", "test_loss"),
    ("val_accuracy", "test_acc"),
    ("val_acc", "test_acc"),
];

/// gpumux's name for the metric `name` (itself when it is no common name of one).
pub fn own_metric_name(name: &str) -> &str {
    COMMON_METRIC_NAMES
        .iter()
        .find(|(common, _)| *common == name)
        .map_or(name, |(_, own)| own)
}

/// The name a built-in trial's result gives the metric `name`: gpumux's own name for it, its
/// last training loss being `final_loss`.
pub fn builtin_metric_name(name: &str) -> &str {
    match own_metric_name(name) {
        "train_loss" => "final_loss",
        own => own,
    }
}

/// The value of the metric `name` in `metrics`: by that name, else by gpumux's name for it,
/// else by a common name of gpumux's (a sweep whose metric is `val_accuracy` reads a built-in
/// trial's `test_acc`, and one whose metric is `test_acc` a Keras script's `val_accuracy`).
pub fn metric_in(metrics: &std::collections::BTreeMap<String, f64>, name: &str) -> Option<f64> {
    let own = own_metric_name(name);
    let builtin = builtin_metric_name(name);
    metrics
        .get(name)
        .or_else(|| metrics.get(own))
        .or_else(|| metrics.get(builtin))
        .or_else(|| {
            COMMON_METRIC_NAMES
                .iter()
                .filter(|(_, o)| *o == own)
                .find_map(|(common, _)| metrics.get(*common))
        })
        .copied()
}

impl EpochStats {
    /// The value of the metric `name` after this epoch: a built-in trial's by its result's
    /// names (`test_acc`, `test_loss`, `final_loss`, `train_acc`, and `train_loss`, or their
    /// common names: `val_accuracy`, `val_loss`, `loss`, ...), else an external command's own
    /// value by that name; `None` when it has none that is finite.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let v = match own_metric_name(name) {
            "test_acc" => self.test_acc,
            "test_loss" => self.test_loss,
            "final_loss" | "train_loss" => self.train_loss,
            "train_acc" => self.train_acc,
            other => *self.extra.get(other)?,
        };
        v.is_finite().then_some(v)
    }
}

/// A completed trial.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrialResult {
    /// NaN in short probes, which skip evaluation.
    #[serde(with = "json_float")]
    pub test_acc: f64,
    /// Mean training loss of the last epoch.
    #[serde(with = "json_float")]
    pub final_loss: f64,
    pub epochs: u32,
    pub wall_s: f64,
    pub train_samples: u64,
    pub samples_per_s: f64,
    /// The arena's bytes (the static plan, allocated once).
    pub peak_mem_bytes: u64,
    pub param_count: u64,
    /// Backend calls in one training step ([`crate::engine::Counted`]); `None` where the
    /// training is not counted (mirrored replicas, external commands).
    #[serde(default)]
    pub launches_per_step: Option<u64>,
    /// Host reads and waits during the training's epochs, the one read of each epoch's metrics
    /// excluded; `None` where not counted.
    #[serde(default)]
    pub host_syncs: Option<u64>,
    /// The trial's metrics by name: `test_acc`, `test_loss`, `final_loss`, `train_acc` for a
    /// built-in model; whatever an external command printed.
    #[serde(default)]
    pub metrics: std::collections::BTreeMap<String, f64>,
}

/// A float field that crosses a JSON pipe whole (a `process`-mode worker's messages): JSON has
/// no NaN or infinity, and serde_json writes them as `null`, which would not read back as a
/// number. Finite values are numbers; NaN is `null`; infinities are `"inf"` and `"-inf"`.
pub mod json_float {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        if x.is_finite() {
            s.serialize_f64(*x)
        } else if x.is_nan() {
            s.serialize_none()
        } else if *x > 0.0 {
            s.serialize_str("inf")
        } else {
            s.serialize_str("-inf")
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Num(f64),
        Word(String),
        Null(()),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Option::<Repr>::deserialize(d)? {
            Some(Repr::Num(x)) => Ok(x),
            Some(Repr::Word(w)) => match w.as_str() {
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                "nan" | "NaN" => Ok(f64::NAN),
                other => Err(serde::de::Error::custom(format!(
                    "expected a number, null, \"inf\" or \"-inf\", not {other:?}"
                ))),
            },
            None | Some(Repr::Null(())) => Ok(f64::NAN),
        }
    }

    /// A map of such floats by name.
    pub mod map {
        use std::collections::BTreeMap;

        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        #[derive(Serialize, Deserialize)]
        struct Float(#[serde(with = "super")] f64);

        pub fn serialize<S: Serializer>(
            m: &BTreeMap<String, f64>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            s.collect_map(m.iter().map(|(k, v)| (k, Float(*v))))
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<BTreeMap<String, f64>, D::Error> {
            let m = BTreeMap::<String, Float>::deserialize(d)?;
            Ok(m.into_iter().map(|(k, Float(v))| (k, v)).collect())
        }
    }
}
