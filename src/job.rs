//! The YAML job: model, data, parameter space, N list, split modes, memory caps, backend; read and validated with clear errors.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::data::DataSpec;
pub use crate::engine::{ConvEngine, EngineOptions};
use crate::error::JobError;
pub use crate::models::{Hyper, ModelKind, ModelSpec, Optimizer, Padding, Stem};
use crate::space::{Dist, Method, ParamSpec, ParamValue, Space};

mod defaults;
pub mod limits;
pub mod text;

/// The Fibonacci N list of the experiment.
pub const DEFAULT_N: [u32; 8] = [1, 2, 3, 5, 8, 13, 21, 34];
/// The most trials one round may launch together.
pub const MAX_N: u32 = 1024;
/// The most replicas of one data-parallel training.
pub const MAX_REPLICAS: u32 = 64;
/// Device numbers a slice may name are below this.
pub const MAX_DEVICES: u32 = 64;
/// The most SMs a slice may ask for (devices have a few hundred).
pub const MAX_SM: u32 = 1 << 16;
/// The largest batch size a trial may train with.
pub const MAX_BATCH_SIZE: u32 = 10_000_000;
/// The largest memory cap a slice may be given, in MiB (1 EiB).
pub const MAX_MIB: f64 = (1u64 << 40) as f64;
/// The largest weight in `ratios` and `parallel.ratios`.
pub const MAX_RATIO: f64 = 1e6;
/// The longest job name, in characters (it names the output folder).
pub const MAX_NAME_LEN: usize = 100;

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

/// How the trials of a round share the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    /// One process, one context; a stream (a thread on the CPU) per trial; no caps.
    Shared,
    /// One OS process per trial, each with its own context.
    Process,
    /// One process; each slice has a stream and a capped memory pool.
    Logical,
    /// One process; each slice has a green context with its own SM partition (GPU only).
    Green,
    /// `process` under a running MPS daemon (GPU only).
    Mps,
}

impl SplitMode {
    pub const ALL: [SplitMode; 5] = [
        SplitMode::Shared,
        SplitMode::Process,
        SplitMode::Logical,
        SplitMode::Green,
        SplitMode::Mps,
    ];
    pub fn name(&self) -> &'static str {
        match self {
            SplitMode::Shared => "shared",
            SplitMode::Process => "process",
            SplitMode::Logical => "logical",
            SplitMode::Green => "green",
            SplitMode::Mps => "mps",
        }
    }
    /// Whether each slice gets a memory cap (the seed's "split").
    pub fn capped(&self) -> bool {
        matches!(self, SplitMode::Logical | SplitMode::Green | SplitMode::Mps)
    }
    /// Whether the mode exists only on a GPU.
    pub fn gpu_only(&self) -> bool {
        matches!(self, SplitMode::Green | SplitMode::Mps)
    }
    /// Whether each trial runs in its own OS process.
    pub fn one_process_per_trial(&self) -> bool {
        matches!(self, SplitMode::Process | SplitMode::Mps)
    }
}

impl std::fmt::Display for SplitMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SplitMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        SplitMode::ALL
            .iter()
            .find(|m| m.name() == s)
            .copied()
            .ok_or_else(|| {
                format!(
                    "unknown split mode `{s}` (expected shared, process, logical, green or mps)"
                )
            })
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

/// Which engine runs the trials.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// The GPU when one works, else the CPU (and it says so).
    #[default]
    Auto,
    Cpu,
    Cuda,
}

pub use crate::train::fault::{FaultKind, FaultSpec};

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
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

fn default_sweep_split() -> SplitMode {
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

/// The `metric:` of a sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricSpec {
    pub name: String,
    #[serde(default)]
    pub goal: Goal,
}

impl Default for MetricSpec {
    fn default() -> Self {
        MetricSpec {
            name: "test_acc".into(),
            goal: Goal::Maximize,
        }
    }
}

/// `concurrency:` a number of trials at a time, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Concurrency {
    Fixed(u32),
    Auto(AutoWord),
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

fn default_seed() -> u64 {
    0
}
fn default_n() -> Vec<u32> {
    DEFAULT_N.to_vec()
}
fn default_splits() -> Vec<SplitMode> {
    vec![SplitMode::Shared, SplitMode::Process, SplitMode::Logical]
}

/// A checked job, with where it came from (for error lines).
#[derive(Clone, Debug)]
pub struct Job {
    pub name: String,
    pub file: JobFile,
    pub space: Space,
    pub path: PathBuf,
    text: String,
}

impl Job {
    /// Reads and checks a job file.
    ///
    /// The file must be a regular file of at most 1 MiB ([`text::read`]).
    pub fn load(path: &Path) -> Result<Job, JobError> {
        let text = text::read(path)?;
        Job::parse(&text, path)
    }

    /// Parses and checks job text; `path` is used in messages.
    ///
    /// Before the YAML parser sees it, the text is checked for what would make parsing slow or
    /// large ([`text::check`]: size, nesting depth, alias expansion) and for keys given twice.
    pub fn parse(text: &str, path: &Path) -> Result<Job, JobError> {
        let text = text::strip_bom(text);
        if text.trim().is_empty() {
            return Err(JobError::Syntax {
                path: path.into(),
                message: "the job file is empty".into(),
            });
        }
        text::check(text).map_err(|p| match p.key {
            Some(key) => {
                // A key given twice: the line of its second appearance, and the first named.
                let first = locate(text, &key);
                let second = first.and_then(|l| {
                    let blanked: Vec<&str> = text
                        .lines()
                        .enumerate()
                        .map(|(i, s)| if i + 1 == l { "" } else { s })
                        .collect();
                    locate(&blanked.join("\n"), &key)
                });
                let message = match (first, second) {
                    (Some(a), Some(b)) if a != b => format!("{} (first on line {a})", p.message),
                    _ => p.message,
                };
                JobError::Invalid {
                    path: path.into(),
                    line: p.line.or(second).or(first),
                    key,
                    message,
                }
            }
            None => JobError::Syntax {
                path: path.into(),
                message: match p.line {
                    Some(l) => format!("line {l}: {}", p.message),
                    None => p.message,
                },
            },
        })?;
        let file: JobFile = serde_yaml::from_str(text).map_err(|e| JobError::Syntax {
            path: path.into(),
            message: one_line(&e.to_string()),
        })?;
        let name = file.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "job".into())
        });
        let mut job = Job {
            name,
            space: Space {
                method: file.method,
                dists: BTreeMap::new(),
            },
            file,
            path: path.into(),
            text: text.into(),
        };
        job.check()?;
        Ok(job)
    }

    /// Checks a job built in code (from command-line flags); errors carry no line.
    pub fn from_file(file: JobFile, origin: &Path) -> Result<Job, JobError> {
        let name = file.name.clone().unwrap_or_else(|| "train".into());
        let mut job = Job {
            name,
            space: Space {
                method: file.method,
                dists: BTreeMap::new(),
            },
            file,
            path: origin.into(),
            text: String::new(),
        };
        job.check()?;
        Ok(job)
    }

    /// An error about `key` (a dotted path), with the line where it appears.
    pub fn invalid(&self, key: &str, message: impl Into<String>) -> JobError {
        JobError::Invalid {
            path: self.path.clone(),
            key: key.into(),
            line: locate(&self.text, key),
            message: message.into(),
        }
    }

    fn check(&mut self) -> Result<(), JobError> {
        let f = &self.file;
        if let Err(why) = check_name(&self.name) {
            // Shown escaped (control characters included) and cut short, on one line.
            let mut shown: String = self.name.chars().take(40).collect();
            if shown.len() < self.name.len() {
                shown.push_str("...");
            }
            if f.name.is_some() {
                return Err(self.invalid("name", format!("{why} (got {shown:?})")));
            }
            // The name comes from the file's name: say so.
            return Err(JobError::Invalid {
                path: self.path.clone(),
                key: "name".into(),
                line: None,
                message: format!(
                    "is not set, and the job file's name {shown:?} cannot stand for it: it {why}; set `name`"
                ),
            });
        }
        match (&f.model, &f.command) {
            (Some(_), Some(_)) => {
                return Err(self.invalid("command", "give either model or command, not both"))
            }
            (None, None) => {
                return Err(self.invalid("model", "is missing: give model (with data), or command"))
            }
            (Some(_), None) if f.data.is_none() => {
                return Err(self.invalid("data", "is missing: a built-in model needs data"))
            }
            (None, Some(c)) if c.trim().is_empty() => {
                return Err(self.invalid("command", "must not be empty"))
            }
            (None, Some(c)) => {
                if let Err(e) = shell_words::split(c) {
                    return Err(self.invalid("command", format!("cannot be split into words: {e}")));
                }
            }
            _ => {}
        }
        self.check_model()?;
        if let Some(d) = &f.data {
            if let Err((k, m)) = d.validate() {
                return Err(self.invalid(&format!("data.{k}"), m));
            }
        }
        if f.metric.name.trim().is_empty() {
            return Err(self.invalid("metric.name", "must not be empty"));
        }
        if f.command.is_none() && !BUILTIN_METRICS.contains(&f.metric.name.as_str()) {
            return Err(self.invalid(
                "metric.name",
                format!(
                    "`{}` is not a metric of a built-in trial (expected one of {})",
                    f.metric.name,
                    BUILTIN_METRICS.join(", ")
                ),
            ));
        }
        if let Some(cap) = f.run_cap {
            if cap == 0 || u64::from(cap) > limits::MAX_TRIALS {
                return Err(self.invalid(
                    "run_cap",
                    format!(
                        "must be from 1 to {}, not {cap}: each trial of a sweep is held in memory",
                        limits::MAX_TRIALS
                    ),
                ));
            }
        }
        if let Concurrency::Fixed(c) = f.concurrency {
            if c == 0 || c > MAX_N {
                return Err(self.invalid(
                    "concurrency",
                    format!("must be from 1 to {MAX_N}, or auto, not {c}"),
                ));
            }
        }
        let t = &f.train;
        if t.epochs == 0 || t.epochs > 100_000 {
            return Err(self.invalid(
                "train.epochs",
                format!("must be from 1 to 100000, not {}", t.epochs),
            ));
        }
        let defaults = Hyper {
            lr: t.lr,
            batch_size: t.batch_size,
            optimizer: t.optimizer,
            momentum: t.momentum,
            weight_decay: t.weight_decay,
            dropout: t.dropout,
        };
        if let Err((k, m)) = defaults.check() {
            return Err(self.invalid(&format!("train.{k}"), m));
        }
        self.check_space()?;
        let f = &self.file;
        if f.n.is_empty() {
            return Err(self.invalid("n", "must list at least one N"));
        }
        for &n in &f.n {
            if n == 0 || n > MAX_N {
                return Err(
                    self.invalid("n", format!("must hold values from 1 to {MAX_N}, not {n}"))
                );
            }
        }
        if let Some(d) = duplicate(&f.n) {
            return Err(self.invalid("n", format!("lists {d} twice")));
        }
        if f.splits.is_empty() {
            return Err(self.invalid("splits", "must list at least one split mode"));
        }
        if let Some(d) = duplicate(&f.splits) {
            return Err(self.invalid("splits", format!("lists {d} twice")));
        }
        // Every round of `fib` holds its trials: N of them under each split mode.
        let planned = f.n.iter().map(|&n| u64::from(n)).sum::<u64>() * f.splits.len() as u64;
        limits::check_trial_count(
            self,
            planned,
            "n",
            "with the split modes, make rounds of",
            "",
        )?;
        self.check_memory()?;
        self.check_slices()?;
        if self.file.engine.check_every == 0 {
            return Err(self.invalid("engine.check_every", "must be at least 1"));
        }
        if self.file.faults.len() > MAX_N as usize {
            return Err(self.invalid("faults", format!("must list at most {MAX_N} faults")));
        }
        let mut faulty = std::collections::HashSet::new();
        for (i, fault) in self.file.faults.iter().enumerate() {
            if fault.trial >= MAX_N {
                return Err(self.invalid(
                    &format!("faults.{i}.trial"),
                    format!("must be below {MAX_N}"),
                ));
            }
            if !faulty.insert(fault.trial) {
                return Err(self.invalid(
                    &format!("faults.{i}.trial"),
                    format!("names trial {} again: one fault per trial", fault.trial),
                ));
            }
        }
        Ok(())
    }

    fn check_model(&self) -> Result<(), JobError> {
        let Some(m) = &self.file.model else {
            return Ok(());
        };
        let only = |key: &str, present: bool, kind: ModelKind| {
            if present && m.kind != kind {
                Err(self.invalid(
                    &format!("model.{key}"),
                    format!("only applies to model kind {kind}"),
                ))
            } else {
                Ok(())
            }
        };
        only("hidden", m.hidden.is_some(), ModelKind::Mlp)?;
        only("channels", m.channels.is_some(), ModelKind::Cnn)?;
        only("kernel", m.kernel.is_some(), ModelKind::Cnn)?;
        only("padding", m.padding.is_some(), ModelKind::Cnn)?;
        only("fc", m.fc.is_some(), ModelKind::Cnn)?;
        only("width", m.width.is_some(), ModelKind::Resnet50)?;
        only("stem", m.stem.is_some(), ModelKind::Resnet50)?;
        if let Some(w) = m.width {
            if !(w.is_finite() && (1.0 / 64.0..=4.0).contains(&w)) {
                return Err(self.invalid(
                    "model.width",
                    format!("must be from 0.015625 (1/64) to 4, not {w}"),
                ));
            }
        }
        let width_ok = |w: &usize| (1..=1 << 16).contains(w);
        if let Some(h) = &m.hidden {
            if h.len() > 16 || !h.iter().all(width_ok) {
                return Err(self.invalid(
                    "model.hidden",
                    "must list at most 16 widths, each from 1 to 65536",
                ));
            }
        }
        if let Some(c) = &m.channels {
            if c.len() != 2 || !c.iter().all(width_ok) {
                return Err(self.invalid(
                    "model.channels",
                    "must list two channel counts, each from 1 to 65536",
                ));
            }
        }
        if let Some(k) = m.kernel {
            if k != 3 && k != 5 {
                return Err(self.invalid("model.kernel", format!("must be 3 or 5, not {k}")));
            }
        }
        if let Some(fc) = m.fc {
            if !width_ok(&fc) {
                return Err(self.invalid("model.fc", format!("must be from 1 to 65536, not {fc}")));
            }
        }
        Ok(())
    }

    fn check_space(&mut self) -> Result<(), JobError> {
        let mut dists = BTreeMap::new();
        let external = self.file.command.is_some();
        for (name, spec) in &self.file.parameters {
            if !external && !PARAMETERS.contains(&name.as_str()) {
                return Err(self.invalid(
                    &format!("parameters.{name}"),
                    format!(
                        "is not a parameter (expected one of {})",
                        PARAMETERS.join(", ")
                    ),
                ));
            }
            let dist = spec
                .to_dist(name)
                .map_err(|e| self.invalid(&e.key, e.message))?;
            if self.file.method == crate::space::Method::Grid && !dist.is_discrete() {
                return Err(self.invalid(
                    &format!("parameters.{name}"),
                    "grid search needs `value` or `values`, not a range",
                ));
            }
            let checked = !external || PARAMETERS.contains(&name.as_str());
            for v in dist.extremes().into_iter().filter(|_| checked) {
                let mut point = BTreeMap::new();
                point.insert(name.clone(), v);
                if let Err((k, m)) = Hyper::from_point(&self.file.train, &point) {
                    let key = if k.starts_with("parameters.") {
                        k
                    } else {
                        format!("parameters.{name}")
                    };
                    return Err(self.invalid(&key, m));
                }
            }
            if let Dist::LogUniform { max, .. } = &dist {
                if *max < 1.0 && name == "lr" {
                    warn(&format!(
                        "{}: parameters.{name} uses log_uniform, whose min and max are natural-log exponents \
                         (W&B semantics); for bounds given as values use log_uniform_values",
                        self.path.display()
                    ));
                }
            }
            dists.insert(name.clone(), dist);
        }
        self.space.dists = dists;
        if self.space.method == Method::Grid && self.space.grid_size().is_none() {
            return Err(self.invalid(
                "parameters",
                format!(
                    "make a grid of more than 2^64 points ({} parameters): its size overflows",
                    self.space.dists.len()
                ),
            ));
        }
        Ok(())
    }

    /// How many values each trial holds (its built-in hyperparameters and `epochs`, and every
    /// other parameter of the space).
    pub fn values_per_trial(&self) -> usize {
        PARAMETERS.len()
            + 1
            + self
                .space
                .dists
                .keys()
                .filter(|k| !PARAMETERS.contains(&k.as_str()))
                .count()
    }

    fn check_memory(&self) -> Result<(), JobError> {
        let m = &self.file.memory;
        if m.fraction.is_some() && m.mib_per_slice.is_some() {
            return Err(self.invalid("memory", "give either fraction or mib_per_slice, not both"));
        }
        if let Some(f) = m.fraction {
            if !(f > 0.0 && f <= 1.0) {
                return Err(self.invalid("memory.fraction", format!("must be in (0, 1], not {f}")));
            }
        }
        if let Some(mib) = m.mib_per_slice {
            if !(mib.is_finite() && mib > 0.0 && mib <= MAX_MIB) {
                return Err(self.invalid(
                    "memory.mib_per_slice",
                    format!("must be a positive number of MiB up to {MAX_MIB}, not {mib}"),
                ));
            }
        }
        Ok(())
    }

    /// Checks `slices`, `ratios` and `parallel`.
    fn check_slices(&self) -> Result<(), JobError> {
        let f = &self.file;
        if f.slices.is_some() && f.ratios.is_some() {
            return Err(self.invalid("ratios", "give either slices or ratios, not both"));
        }
        let positive = |key: &str, w: &[f64]| -> Result<(), JobError> {
            if w.is_empty() || w.len() > MAX_N as usize {
                return Err(self.invalid(key, format!("must list from 1 to {MAX_N} numbers")));
            }
            match w
                .iter()
                .find(|x| !(x.is_finite() && **x > 0.0 && **x <= MAX_RATIO))
            {
                Some(x) => Err(self.invalid(
                    key,
                    format!("must hold positive numbers up to {MAX_RATIO}, not {x}"),
                )),
                None => Ok(()),
            }
        };
        if let Some(r) = &f.ratios {
            positive("ratios", r)?;
        }
        if let Some(s) = &f.slices {
            if s.is_empty() || s.len() > MAX_N as usize {
                return Err(self.invalid("slices", format!("must list from 1 to {MAX_N} slices")));
            }
            for (i, d) in s.iter().enumerate() {
                if d.sm == Some(0) {
                    return Err(self.invalid(&format!("slices.{i}.sm"), "must be at least 1"));
                }
                if let Some(sm) = d.sm.filter(|&sm| sm > MAX_SM) {
                    return Err(self.invalid(
                        &format!("slices.{i}.sm"),
                        format!("must be at most {MAX_SM} SMs, not {sm}"),
                    ));
                }
                if d.device.is_some_and(|o| o >= MAX_DEVICES) {
                    return Err(self.invalid(
                        &format!("slices.{i}.device"),
                        format!("must be a device number below {MAX_DEVICES}"),
                    ));
                }
                if let Some(m) = d.mem_mib {
                    if !(m.is_finite() && m > 0.0 && m <= MAX_MIB) {
                        return Err(self.invalid(
                            &format!("slices.{i}.mem_mib"),
                            format!("must be a positive number of MiB up to {MAX_MIB}, not {m}"),
                        ));
                    }
                }
            }
        }
        if let Some(p) = &f.parallel {
            if let Some(BatchRatios::Weights(w)) = &p.ratios {
                positive("parallel.ratios", w)?;
            }
            let k = self.replicas()?;
            if k == 0 || k > MAX_REPLICAS {
                return Err(self.invalid(
                    "parallel.slices",
                    format!("must be from 1 to {MAX_REPLICAS}, not {k}"),
                ));
            }
            if let Some(BatchRatios::Weights(w)) = &p.ratios {
                if w.len() != k as usize {
                    return Err(self.invalid(
                        "parallel.ratios",
                        format!("lists {} ratios for {k} slices", w.len()),
                    ));
                }
            }
            if let Some(plan) = self.slice_plan_len() {
                if plan != k as usize {
                    let key = if f.slices.is_some() {
                        "slices"
                    } else {
                        "ratios"
                    };
                    return Err(self.invalid(
                        key,
                        format!("plans {plan} slices, but parallel.slices is {k}"),
                    ));
                }
            }
            if (f.train.batch_size as usize) < k as usize {
                return Err(self.invalid(
                    "train.batch_size",
                    format!(
                        "{} is smaller than the {k} slices of parallel: each slice needs at least one row of the global batch",
                        f.train.batch_size
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The devices the job's slices sit on, in increasing order: `[0]` unless `slices` names others.
    pub fn devices(&self) -> Vec<u32> {
        let mut list: Vec<u32> = match &self.file.slices {
            Some(defs) => defs.iter().map(|d| d.device.unwrap_or(0)).collect(),
            None => vec![0],
        };
        list.sort_unstable();
        list.dedup();
        list
    }

    /// The number of slices an unequal slice plan (`slices` or `ratios`) has, when the job gives one.
    pub fn slice_plan_len(&self) -> Option<usize> {
        let f = &self.file;
        f.slices
            .as_ref()
            .map(Vec::len)
            .or(f.ratios.as_ref().map(Vec::len))
    }

    /// The replicas of a data-parallel job: `parallel.slices`, else the number of
    /// `parallel.ratios`, else the slice plan's length; without `parallel`, the slice plan's
    /// length or 1.
    pub fn replicas(&self) -> Result<u32, JobError> {
        let Some(p) = &self.file.parallel else {
            return Ok(self.slice_plan_len().unwrap_or(1) as u32);
        };
        let from_ratios = match &p.ratios {
            Some(BatchRatios::Weights(w)) => Some(w.len()),
            _ => None,
        };
        p.slices
            .map(|k| k as usize)
            .or(from_ratios)
            .or(self.slice_plan_len())
            .map(|k| k as u32)
            .ok_or_else(|| {
                self.invalid(
                    "parallel.slices",
                    "is missing: give the number of slices, ratios, or a slice plan",
                )
            })
    }

    /// The hyperparameters of trial `index` (names an external command invents are left out).
    pub fn hyper(&self, index: usize) -> Result<Hyper, JobError> {
        let mut point = self.space.point(self.file.seed, index);
        point.retain(|name, _| PARAMETERS.contains(&name.as_str()));
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
        let h = self.hyper(index)?;
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
        out.extend(self.space.point(self.file.seed, index));
        Ok(out)
    }

    /// The engine options a process running this job opens its engine with
    /// ([`EngineOptions::for_model`]): an external command or a model without convolutions does
    /// not load cuDNN.
    pub fn engine_options(&self) -> EngineOptions {
        let convolutions = self
            .file
            .model
            .as_ref()
            .is_some_and(|m| m.kind.has_convolutions());
        self.file.engine.for_model(convolutions)
    }

    /// The built-in model; an error for a job that runs an external command.
    pub fn model(&self) -> Result<&ModelSpec, JobError> {
        self.file.model.as_ref().ok_or_else(|| {
            self.invalid(
                "command",
                "makes this an external-command job: run it with `gpumux sweep`",
            )
        })
    }

    /// The dataset of the built-in model.
    pub fn data(&self) -> Result<&DataSpec, JobError> {
        self.file
            .data
            .as_ref()
            .ok_or_else(|| self.invalid("data", "is missing: a built-in model needs data"))
    }
}

/// Why `name` cannot name a job (it names the output folder, `out/<name>`), if it cannot: it
/// must be 1 to [`MAX_NAME_LEN`] letters, digits, `-`, `_` or `.`, and not `.` or `..`.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.chars().count() > MAX_NAME_LEN {
        return Err(format!(
            "must be at most {MAX_NAME_LEN} characters, not {}",
            name.chars().count()
        ));
    }
    if name == "." || name == ".." {
        return Err("must not be `.` or `..`: the name is a folder under the output folder".into());
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err("must be letters, digits, '-', '_' or '.' (it names a folder)".into());
    }
    Ok(())
}

/// A warning printed once on stderr (the library has no logger of its own).
fn warn(message: &str) {
    crate::note!("warning: {message}");
}

fn duplicate<T: PartialEq + std::fmt::Display>(items: &[T]) -> Option<&T> {
    items
        .iter()
        .enumerate()
        .find(|(i, a)| items[..*i].contains(a))
        .map(|(_, a)| a)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The 1-based line where a dotted key (e.g. `memory.fraction`, `faults.0.trial`) is written,
/// found by walking the keys in order of indentation. A numeric part picks that item of a block
/// list (`- ...` lines under the key); in a flow list (`[...]`) it is skipped.
pub fn locate(text: &str, key: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut from = 0;
    let mut found = None;
    for part in key.split('.') {
        if let Ok(n) = part.parse::<usize>() {
            let Some(parent) = found.map(|f: usize| f - 1) else {
                continue;
            };
            let depth = indent(lines[parent]);
            let items = (parent + 1..lines.len())
                .take_while(|&i| {
                    lines[i].trim().is_empty()
                        || indent(lines[i]) > depth
                        || lines[i].trim_start().starts_with("- ")
                })
                .filter(|&i| lines[i].trim_start().starts_with("- "));
            if let Some(i) = items.clone().nth(n) {
                found = Some(i + 1);
                from = i;
            }
            continue;
        }
        let needle = format!("{part}:");
        let hit = (from..lines.len()).find(|&i| {
            let l = lines[i].split('#').next().unwrap_or("");
            let t = l.trim_start().trim_start_matches("- ");
            t.starts_with(&needle)
                || l.contains(&format!("{{{needle}"))
                || l.contains(&format!(" {needle}"))
        });
        match hit {
            Some(i) => {
                found = Some(i + 1);
                from = i;
            }
            None => break,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Job, JobError> {
        Job::parse(text, Path::new("t.yaml"))
    }

    const OK: &str = "model: {kind: mlp}\ndata: {source: synthetic}\n";

    #[test]
    fn a_minimal_job_gets_the_defaults() {
        let j = parse(OK).unwrap();
        assert_eq!(j.file.n, DEFAULT_N.to_vec());
        assert_eq!(j.file.train.epochs, 5);
        assert_eq!(j.file.memory.policy(), CapPolicy::Fraction(0.9));
        assert_eq!(j.name, "t");
    }

    #[test]
    fn errors_name_the_key_and_line() {
        let e = parse(&format!("{OK}n: [1, 0]\n")).unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("`n`"), "{e}");
        let e = parse(&format!("{OK}memory:\n  fraction: 1.5\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 4") && e.contains("memory.fraction"), "{e}");
        let e = parse(&format!("{OK}train:\n  batch_size: 0\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train.batch_size") && e.contains("line 4"),
            "{e}"
        );
        let e = parse(&format!("{OK}colour: red\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown field `colour`") && e.contains("line 3"),
            "{e}"
        );
    }

    #[test]
    fn parameters_are_checked_against_their_meaning() {
        let e = parse(&format!("{OK}parameters:\n  lr: {{values: [0.1, -1]}}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("parameters.lr") && e.contains("positive"), "{e}");
        let e = parse(&format!(
            "{OK}parameters:\n  optimizer: {{values: [sgd, rmsprop]}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("rmsprop"), "{e}");
        let e = parse(&format!("{OK}parameters:\n  colour: {{value: 1}}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("parameters.colour") && e.contains("line 4"),
            "{e}"
        );
        let e = parse(&format!(
            "{OK}method: grid\nparameters:\n  lr: {{min: 0.1, max: 0.2}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("grid"), "{e}");
    }

    #[test]
    fn hyper_draws_differ_between_trials_but_not_between_calls() {
        let j = parse(&format!(
            "{OK}parameters:\n  lr: {{min: 0.0001, max: 0.1, distribution: log_uniform_values}}\n"
        ))
        .unwrap();
        assert_eq!(j.hyper(3).unwrap(), j.hyper(3).unwrap());
        assert_ne!(j.hyper(3).unwrap().lr, j.hyper(4).unwrap().lr);
    }

    #[test]
    fn locate_walks_nested_keys() {
        let t = "a: 1\nmemory:\n  other: 2\n  fraction: 3\nfraction: 4\n";
        assert_eq!(locate(t, "memory.fraction"), Some(4));
        assert_eq!(locate(t, "fraction"), Some(4));
        assert_eq!(locate(t, "missing"), None);
        let t = "slices:\n  - {sm: 64}\n  - {sm: 0}\nn: [1]\n";
        assert_eq!(locate(t, "slices.1.sm"), Some(3));
        assert_eq!(locate(t, "slices.0.sm"), Some(2));
        let t = "faults:\n- {trial: 1}\n- trial: 2\n  kind: nan\nseed: 3\n";
        assert_eq!(locate(t, "faults.1.kind"), Some(4));
        assert_eq!(locate("faults: [{trial: 1}]\n", "faults.0.trial"), Some(1));
    }

    #[test]
    fn every_shipped_job_loads_and_its_model_plans() {
        let dir = crate::test_root().join("jobs");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let job = Job::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if let (Some(m), Some(d)) = (&job.file.model, &job.file.data) {
                let shape = d.shape.unwrap_or([1, 28, 28]);
                let shape = d.pad_to.map_or(shape, |[h, w]| [shape[0], h, w]);
                let classes = d.classes.unwrap_or(10);
                crate::models::nodes(m, shape, classes, 0.0)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
            seen += 1;
        }
        assert!(seen >= 8, "{seen} jobs");
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics_on_arbitrary_text(text in "\\PC{0,200}") {
            let _ = parse(&text);
        }

        #[test]
        fn parsing_never_panics_on_mutated_jobs(cut in 0usize..400, insert in "[ :{}\\[\\],\\-a-z0-9.\\n]{0,12}") {
            let base = include_str!("../jobs/example.yaml");
            let at = base.char_indices().map(|(i, _)| i).nth(cut % base.chars().count()).unwrap_or(0);
            let text = format!("{}{}{}", &base[..at], insert, &base[at..]);
            let _ = parse(&text);
        }
    }
}
