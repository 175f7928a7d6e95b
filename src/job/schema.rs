//! The job file as written: the serde structs and enums of its sections, and their defaults.

use serde::{Deserialize, Serialize};
use serde_yaml::Value;
use std::collections::BTreeMap;

use super::{
    BackendChoice, EngineOptions, FaultSpec, ModelSpec, Optimizer, SplitMode, DEFAULT_N, MAX_N,
};
use crate::data::DataSpec;
use crate::space::{Method, ParamSpec};

/// The `train:` section: epochs and the default value of every hyperparameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSpec {
    pub epochs: u32,
    pub batch_size: u32,
    pub optimizer: Optimizer,
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    pub dropout: f64,
}

impl Default for TrainSpec {
    fn default() -> Self {
        TrainSpec {
            epochs: 5,
            batch_size: 64,
            optimizer: Optimizer::Adam,
            lr: 1e-3,
            momentum: 0.9,
            weight_decay: 0.0,
            dropout: 0.0,
        }
    }
}

/// The `memory:` section: how big each slice's cap is, in capped split modes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySpec {
    /// An equal share of this fraction of the device's memory (default 0.9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// An explicit cap per slice, in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mib_per_slice: Option<f64>,
}

/// The memory-cap policy after checking.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CapPolicy {
    Fraction(f64),
    MibPerSlice(f64),
}

impl MemorySpec {
    pub fn policy(&self) -> CapPolicy {
        match (self.mib_per_slice, self.fraction) {
            (Some(m), _) => CapPolicy::MibPerSlice(m),
            (None, Some(f)) => CapPolicy::Fraction(f),
            (None, None) => CapPolicy::Fraction(0.9),
        }
    }
}

/// A job file as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The built-in network every trial trains (or give `command`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSpec>,
    /// The dataset of the built-in model (not used by an external `command`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataSpec>,
    /// An external training command run for each trial in place of a built-in model, with
    /// `{name}` replaced by the trial's parameter values; its last stdout line is JSON metrics.
    /// Also W&B's list form (`[${env}, python3, ${program}, ${args}]`), held as the template of
    /// its words.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "command_words"
    )]
    pub command: Option<String>,
    /// W&B's `program`: the script the command runs (`${program}`); without `command`, W&B's
    /// default command `${env} ${interpreter} ${program} ${args}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// W&B's `description`, `project` and `entity`: accepted, and unused (said when loaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity: Option<Value>,
    /// What a sweep optimises (W&B vocabulary): default `{name: test_acc, goal: maximize}`.
    #[serde(default)]
    pub metric: MetricSpec,
    /// The number of trials a random sweep draws (a cap on the grid for `method: grid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_cap: Option<u32>,
    /// How many trials a sweep runs at a time: a number, or `auto` (a short probe picks it).
    #[serde(default)]
    pub concurrency: Concurrency,
    /// The split mode a sweep runs its trials under (default logical).
    #[serde(default = "default_sweep_split")]
    pub split: SplitMode,
    #[serde(default)]
    pub train: TrainSpec,
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default)]
    pub method: Method,
    #[serde(default)]
    pub parameters: BTreeMap<String, ParamSpec>,
    #[serde(default = "default_n")]
    pub n: Vec<u32>,
    #[serde(default = "default_splits")]
    pub splits: Vec<SplitMode>,
    #[serde(default)]
    pub memory: MemorySpec,
    #[serde(default)]
    pub backend: BackendChoice,
    #[serde(default)]
    pub engine: EngineOptions,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<FaultSpec>,
    /// An explicit plan of unequal slices: `[{sm: 80, mem_mib: 30000}, {sm: 48, mem_mib: 20000}]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slices: Option<Vec<SliceDef>>,
    /// Slices sized in proportion to these numbers (their SMs in green mode, and their caps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratios: Option<Vec<f64>>,
    /// Data-parallel training of one model mirrored on several slices (`gpumux parallel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<ParallelSpec>,
    /// A sweep's early termination (W&B names): trials whose metric lags at a rung stop there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_terminate: Option<EarlyTerminate>,
    /// `method: bayes`'s settings (gpumux's key; W&B has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bayes: Option<BayesSpec>,
}

/// `bayes:`: how `method: bayes` models the results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BayesSpec {
    /// One joint estimator over the parameters that come together (the default, `true`), or
    /// one per parameter (`false`, the independent TPE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multivariate: Option<bool>,
}

/// W&B's command macros, written `${name}`: `${args}` and `${args_no_hyphens}` stand alone as
/// a word of the command (each becomes one word per parameter); the others may sit inside one.
pub const WANDB_MACROS: [&str; 7] = [
    "env",
    "interpreter",
    "program",
    "args",
    "args_no_hyphens",
    "args_json",
    "args_json_file",
];

/// W&B's default command for a job with `program` and no `command`.
pub const WANDB_DEFAULT_COMMAND: &str = "${env} ${interpreter} ${program} ${args}";

/// `command`: gpumux's template string, or W&B's list of words, made the template of those
/// words (each quoted for the shell-words split, its braces literal but in W&B's `${macro}`s).
fn command_words<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        Template(String),
        Words(Vec<Value>),
    }
    let form = Option::<Form>::deserialize(d).map_err(|_| {
        serde::de::Error::custom(
            "command must be a string (gpumux's template) or a list of words (W&B's form)",
        )
    })?;
    let words = match form {
        None => return Ok(None),
        Some(Form::Template(t)) => return Ok(Some(t)),
        Some(Form::Words(w)) => w,
    };
    let mut out = Vec::new();
    for w in words {
        let word = match w {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => {
                return Err(serde::de::Error::custom(
                    "each word of a command list must be a string or a number",
                ))
            }
        };
        out.push(shell_words::quote(&literal_braces(&word)).into_owned());
    }
    Ok(Some(out.join(" ")))
}

/// `word` with its braces doubled (literal in a template), but in W&B's `${macro}`s.
fn literal_braces(word: &str) -> String {
    let mut out = String::new();
    let mut rest = word;
    'scan: while !rest.is_empty() {
        for name in WANDB_MACROS {
            let token = format!("${{{name}}}");
            if rest.starts_with(&token) {
                out.push_str(&token);
                rest = &rest[token.len()..];
                continue 'scan;
            }
        }
        let c = rest.chars().next().unwrap_or(' ');
        match c {
            '{' => out.push_str("{{"),
            '}' => out.push_str("}}"),
            c => out.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// `early_terminate:` as W&B names it: `type: hyperband`, checked asynchronously at rungs,
/// the epochs `min_iter·eta^k` below `max_iter` (at most `s` of them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EarlyTerminate {
    /// The only one: `hyperband`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The first rung's epoch (default 1, or `max_iter / eta^s` when `s` is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_iter: Option<u32>,
    /// The epochs a trial trains in all (default: the job's `train.epochs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iter: Option<u32>,
    /// At each rung a trial goes on only in the top 1/eta of those that reached it (default 3;
    /// a float, as W&B allows, is fine).
    #[serde(default = "default_eta")]
    pub eta: f64,
    /// W&B's `strict` (its bracket bookkeeping): accepted; the asynchronous rule here has no
    /// other mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
    /// How many rungs at most (W&B's brackets); all that fit below `max_iter` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s: Option<u32>,
    /// Hyperband's brackets (gpumux's key): 1 up to one more than the rungs; bracket `b`
    /// judges its own trials from the `b`-th rung on, the last at none. By default 1 (as W&B:
    /// every trial judged at every rung), and every bracket under `method: bayes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brackets: Option<u32>,
}

fn default_eta() -> f64 {
    3.0
}

impl EarlyTerminate {
    /// The epochs a trial trains in all, for a job whose `train.epochs` is `epochs`.
    pub fn max_iter(&self, epochs: u32) -> u32 {
        self.max_iter.unwrap_or(epochs)
    }

    /// The rungs: the epochs `min_iter·eta^k` (k = 0, 1, ...) below `max_iter` and below
    /// `epochs` (a trial's last epoch is no rung: stopping there saves nothing, and would record
    /// PRUNED a trial that trained all its epochs), at most `s` of them.
    pub fn rungs(&self, epochs: u32) -> Vec<u32> {
        let max_iter = self.max_iter(epochs);
        let eta = if self.eta.is_finite() {
            self.eta.max(2.0)
        } else {
            3.0
        };
        let min_iter = self.min_iter.unwrap_or_else(|| match self.s {
            Some(s) => (f64::from(max_iter) / eta.powi(s.min(64) as i32))
                .floor()
                .max(1.0) as u32,
            None => 1,
        });
        let mut out: Vec<u32> = Vec::new();
        let mut r = f64::from(min_iter.max(1));
        let end = f64::from(max_iter.min(epochs));
        // With a float eta the rungs are the whole epochs min_iter·eta^k rounded down.
        while r.floor() < end && self.s.is_none_or(|s| out.len() < s as usize) {
            let epoch = r.floor() as u32;
            if out.last() != Some(&epoch) {
                out.push(epoch);
            }
            r *= eta;
        }
        out
    }
}

/// One slice of an explicit slice plan (`slices:`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SliceDef {
    /// SMs of the slice's green partition (green mode on a GPU), rounded up to the device's
    /// partition granularity; by default the SMs left over, shared equally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm: Option<u32>,
    /// The slice's memory cap in MiB (capped split modes); by default the memory policy's share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_mib: Option<f64>,
    /// The CUDA device the slice sits on, as numbered among the visible ones (default 0).
    /// Slices on one device share its memory and SMs; each device has its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
}

/// The `parallel:` section: one model replicated on `slices` slices, each global batch split
/// between them by `ratios` (evenly by default, or measured with `auto`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelSpec {
    /// Replicas, one per slice (default: the length of `ratios`, or of the slice plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slices: Option<u32>,
    /// How each global batch is split between the replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratios: Option<BatchRatios>,
}

/// `parallel.ratios`: a list of positive weights, `even`, or `auto` (a short probe measures each
/// slice's samples/s alone and splits in proportion).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "serde_yaml::Value", into = "serde_yaml::Value")]
pub enum BatchRatios {
    Even,
    Auto,
    Weights(Vec<f64>),
}

impl TryFrom<serde_yaml::Value> for BatchRatios {
    type Error = String;
    fn try_from(v: serde_yaml::Value) -> Result<Self, String> {
        use serde_yaml::Value;
        let bad =
            || "parallel.ratios must be a list of positive numbers, even, or auto".to_string();
        match v {
            Value::String(s) if s == "auto" => Ok(BatchRatios::Auto),
            Value::String(s) if s == "even" => Ok(BatchRatios::Even),
            Value::Sequence(items) => items
                .iter()
                .map(|x| x.as_f64().ok_or_else(bad))
                .collect::<Result<Vec<_>, _>>()
                .map(BatchRatios::Weights),
            _ => Err(bad()),
        }
    }
}

impl From<BatchRatios> for serde_yaml::Value {
    fn from(r: BatchRatios) -> Self {
        match r {
            BatchRatios::Even => serde_yaml::Value::String("even".into()),
            BatchRatios::Auto => serde_yaml::Value::String("auto".into()),
            BatchRatios::Weights(w) => w.into_iter().map(serde_yaml::Value::from).collect(),
        }
    }
}

impl std::str::FromStr for BatchRatios {
    type Err = String;
    /// `auto`, `even`, or weights separated by commas or colons (`3,2` or `3:2`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(BatchRatios::Auto),
            "even" => Ok(BatchRatios::Even),
            list => list
                .split([',', ':'])
                .map(|x| {
                    x.trim().parse::<f64>().map_err(|_| {
                        format!("ratios: `{x}` is not a number (give e.g. 3,2 or auto)")
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(BatchRatios::Weights),
        }
    }
}

pub(super) fn default_sweep_split() -> SplitMode {
    SplitMode::Logical
}

/// Whether a larger or a smaller metric is better.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Goal {
    #[default]
    Maximize,
    Minimize,
}

/// The `metric:` of a sweep. As in W&B, a `metric` without `goal` minimizes (a job without
/// `metric` ranks by `test_acc`, maximized).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "MetricWritten")]
pub struct MetricSpec {
    pub name: String,
    pub goal: Goal,
    /// W&B's `target`: the sweep stops starting trials once one reaches it (at or past it, by
    /// the goal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<f64>,
    /// Whether the job wrote `goal` (a load says which goal it took when it did not).
    #[serde(skip)]
    pub goal_given: bool,
}

/// `metric:` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricWritten {
    name: String,
    #[serde(default)]
    goal: Option<Goal>,
    #[serde(default)]
    target: Option<f64>,
}

impl From<MetricWritten> for MetricSpec {
    fn from(m: MetricWritten) -> Self {
        MetricSpec {
            name: m.name,
            goal: m.goal.unwrap_or(Goal::Minimize),
            target: m.target,
            goal_given: m.goal.is_some(),
        }
    }
}

impl Default for MetricSpec {
    fn default() -> Self {
        MetricSpec {
            name: "test_acc".into(),
            goal: Goal::Maximize,
            target: None,
            goal_given: true,
        }
    }
}

/// `concurrency:` a number of trials at a time, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Concurrency {
    Fixed(u32),
    Auto(AutoWord),
}

impl Concurrency {
    /// The concurrency a job file's value gives: a whole number (its range is checked with the
    /// rest of the job) or `auto`. The error says what the value must be, for `concurrency`.
    pub fn from_value(value: &Value) -> Result<Concurrency, String> {
        match value {
            Value::Number(n) => {
                if let Some(c) = n.as_u64().and_then(|c| u32::try_from(c).ok()) {
                    return Ok(Concurrency::Fixed(c));
                }
            }
            Value::String(s) if s == "auto" => return Ok(Concurrency::Auto(AutoWord::Auto)),
            _ => {}
        }
        let shown = match value {
            Value::Null => "empty".to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => n.to_string(),
            Value::String(s) => format!("`{s}`"),
            Value::Sequence(_) => "a list".to_string(),
            Value::Mapping(_) => "a mapping".to_string(),
            Value::Tagged(_) => "a tagged value".to_string(),
        };
        Err(format!(
            "must be a whole number from 1 to {MAX_N}, or auto, not {shown}"
        ))
    }
}

impl<'de> Deserialize<'de> for Concurrency {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        Concurrency::from_value(&value).map_err(serde::de::Error::custom)
    }
}

/// The word `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoWord {
    Auto,
}

impl Default for Concurrency {
    fn default() -> Self {
        Concurrency::Fixed(4)
    }
}

/// The metrics a built-in trial reports, by name.
pub const BUILTIN_METRICS: [&str; 4] = ["test_acc", "test_loss", "final_loss", "train_acc"];

pub(super) fn default_seed() -> u64 {
    0
}
pub(super) fn default_n() -> Vec<u32> {
    DEFAULT_N.to_vec()
}
pub(super) fn default_splits() -> Vec<SplitMode> {
    vec![SplitMode::Shared, SplitMode::Process, SplitMode::Logical]
}
