//! What the subcommands' flags share: the engine switches, the enums (each a clap `ValueEnum`, the one way words reach the library's types), bounded seconds, and job files with flag overrides.

use std::path::{Path, PathBuf};

use gpumux::data::Source;
use gpumux::error::Error;
use gpumux::job::{BackendChoice, Goal, Job, JobFile, ModelKind, Optimizer, SplitMode, Stem};

/// Engine switches shared by `train`, `fib` and `sweep` (GPU only; the CPU ignores them).
#[derive(clap::Args, Debug, Default)]
pub struct EngineFlags {
    /// Run each training step eagerly instead of replaying a captured CUDA graph.
    #[arg(long)]
    no_graphs: bool,
    /// Let cuBLAS use TF32 tensor cores for FP32 GEMMs.
    #[arg(long)]
    tf32: bool,
}

impl EngineFlags {
    pub fn apply(&self, file: &mut JobFile) {
        if self.no_graphs {
            file.engine.graphs = false;
        }
        if self.tf32 {
            file.engine.tf32 = true;
        }
    }
}

/// Where a job's run finds its data and which backend it uses: the flags of every command that
/// runs a job's trials (`fib`, `sweep`, `parallel`, `batch-scan`).
#[derive(clap::Args, Debug, Default)]
pub struct RunFlags {
    /// Folder that relative data paths are taken from.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Override the job's backend.
    #[arg(long, value_enum)]
    pub backend: Option<BackendChoice>,
}

impl RunFlags {
    /// Sets the job's backend when the flag gives one.
    pub fn apply(&self, file: &mut JobFile) {
        if let Some(b) = self.backend {
            file.backend = b;
        }
    }
}

/// Declares a flag's enum, with the library type each word stands for.
macro_rules! flag_enum {
    ($(#[$doc:meta])* $name:ident => $target:ty { $($(#[$vattr:meta])* $variant:ident => $value:expr),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vattr])* $variant),+
        }

        impl From<$name> for $target {
            fn from(v: $name) -> $target {
                match v {
                    $($name::$variant => $value),+
                }
            }
        }
    };
}

flag_enum!(
    /// A split mode.
    SplitArg => SplitMode {
        Shared => SplitMode::Shared,
        Process => SplitMode::Process,
        Logical => SplitMode::Logical,
        Green => SplitMode::Green,
        Mps => SplitMode::Mps,
        Fused => SplitMode::Fused,
    }
);

flag_enum!(
    /// Whether a larger or a smaller metric is better.
    GoalArg => Goal {
        Maximize => Goal::Maximize,
        Minimize => Goal::Minimize,
    }
);

flag_enum!(
    /// A built-in model.
    ModelArg => ModelKind {
        Mlp => ModelKind::Mlp,
        Cnn => ModelKind::Cnn,
        Resnet50 => ModelKind::Resnet50,
    }
);

flag_enum!(
    /// A ResNet stem.
    StemArg => Stem {
        Imagenet => Stem::Imagenet,
        Cifar => Stem::Cifar,
    }
);

flag_enum!(
    /// An optimiser.
    OptArg => Optimizer {
        Sgd => Optimizer::Sgd,
        Adam => Optimizer::Adam,
    }
);

flag_enum!(
    /// A data source.
    SourceArg => Source {
        #[value(name = "mnist-10k")]
        Mnist10k => Source::Mnist10k,
        FashionMnist => Source::FashionMnist,
        Idx => Source::Idx,
        Cifar10 => Source::Cifar10,
        Synthetic => Source::Synthetic,
    }
);

/// The longest `--grace`, in seconds (a week).
const MAX_GRACE_S: f64 = 7.0 * 24.0 * 3600.0;
/// The longest `--seconds` of batch-scan, in seconds (an hour per batch size).
const MAX_SCAN_S: f64 = 3600.0;

/// A number of seconds given as a flag: finite, in `[min, max]` (above `min` when `open`).
fn seconds_between(s: &str, min: f64, open: bool, max: f64) -> Result<f64, String> {
    let x: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    let low_ok = if open { x > min } else { x >= min };
    if !(x.is_finite() && low_ok && x <= max) {
        let low = if open { "above" } else { "from" };
        return Err(format!("wants seconds {low} {min} up to {max}, not {s}"));
    }
    Ok(x)
}

/// `--grace`: 0 to a week.
pub fn grace_seconds(s: &str) -> Result<f64, String> {
    seconds_between(s, 0.0, false, MAX_GRACE_S)
}

/// `--seconds` of batch-scan: more than 0, up to an hour.
pub fn scan_seconds(s: &str) -> Result<f64, String> {
    seconds_between(s, 0.0, true, MAX_SCAN_S)
}

/// Loads a job file and applies flag overrides; a changed job is checked again.
pub fn load_with(path: &Path, overrides: impl FnOnce(&mut JobFile)) -> Result<Job, Error> {
    let loaded = Job::load(path)?;
    let mut file = loaded.file.clone();
    overrides(&mut file);
    if file == loaded.file {
        Ok(loaded)
    } else {
        rebuild(file, &loaded)
    }
}

/// A job whose fields were overridden by flags, checked again; it keeps the original name.
pub fn rebuild(mut file: JobFile, original: &Job) -> Result<Job, Error> {
    file.name = Some(original.name.clone());
    Ok(Job::from_file(file, &original.path)?)
}
