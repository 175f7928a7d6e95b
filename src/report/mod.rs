//! Reports: the CSV rows (their columns are the interface), CSV writing and reading, SVG plots and the summary table.

use serde::{Deserialize, Serialize};

pub mod extra;
mod finder;
pub mod folders;
pub mod line;
pub mod plot;
pub mod read;
mod scan;
pub mod summary;
#[cfg(test)]
pub(crate) mod tests;
pub mod write;

pub use self::folders::{
    merge_files, merge_into, union_of_columns, write_merged, write_report, ReportPaths, ResultsDir,
};
pub use self::line::{
    check_regular, Interrupt, ResultsRow, CHECK, PROGRESS_CSV, RUNS_CSV, TRIALS_CSV,
};
pub use self::plot::{plot_samples_per_s, plot_time_per_training};
pub use self::read::{
    check_rows, read_progress, read_rows, read_rows_and_lines, read_runs, read_trial_briefs,
    read_trials, Cells, LinePlan, RowReader,
};
pub use self::summary::{
    best_n, best_trial, format_best, format_best_n, format_parity, parity, summary_table,
    summary_text, BestN, ParityLine,
};
pub use self::write::{
    copy_rows, write_all, write_lines, write_lines_from, write_rows, LineOut, ReportWriter,
};

/// The state of a trial that ran to the end.
pub const COMPLETE: &str = "COMPLETE";

/// The state of a trial a sweep's early termination stopped: done, like COMPLETE.
pub const PRUNED: &str = "PRUNED";

/// Every state a row of `trials.csv` may hold; a row with another one is damaged.
pub const STATES: [&str; 5] = [COMPLETE, "FAIL", "FAILED", "INTERRUPTED", PRUNED];

/// The split modes in the order reports list them; others follow, by name.
const SPLIT_ORDER: [&str; 6] = ["shared", "process", "logical", "green", "mps", "fused"];

/// A sort key that puts split modes in report order.
pub(crate) fn split_rank(split: &str) -> (usize, &str) {
    let rank = SPLIT_ORDER.iter().position(|s| *s == split);
    (rank.unwrap_or(SPLIT_ORDER.len()), split)
}

/// One row of `runs.csv`: one round (N trials under one split mode).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    pub model: String,
    pub dataset: String,
    pub split: String,
    pub n: u32,
    pub slices: u32,
    /// SMs per slice on a GPU in `green` mode; empty elsewhere.
    pub sm_per_slice: Option<f64>,
    /// How many slices share one SM partition (green mode, N above the partition count); empty elsewhere.
    pub slices_per_partition: Option<f64>,
    /// The memory cap of each slice; empty when uncapped.
    pub mem_cap_mib: Option<f64>,
    pub makespan_s: f64,
    pub time_per_training_s: f64,
    /// Training samples processed by all trials of the round per second of makespan.
    pub samples_per_s: f64,
    pub gpu_util_mean: Option<f64>,
    pub gpu_mem_peak_mib: Option<f64>,
    pub power_w_mean: Option<f64>,
    /// Mean current SM clock over the round (NVML), MHz; empty on the CPU.
    pub sm_clock_mhz_mean: Option<f64>,
    /// The largest device memory any one process of the round held (NVML), MiB: in `process`
    /// mode, what one trial's process used; empty on the CPU.
    pub proc_mem_peak_mib: Option<f64>,
    /// The physical device, in words (e.g. `NVIDIA H100 80GB HBM3` or `cpu: 2 cores`).
    pub device: String,
    pub backend: String,
    pub epochs: u32,
    pub ok: u32,
    pub failed: u32,
    /// Each slice's SMs and cap when the slices are unequal (`slices:` or `ratios:` in the job),
    /// e.g. `80sm/30000MiB;48sm/20000MiB`; empty when they are equal. `sm_per_slice` and
    /// `mem_cap_mib` then hold the mean over the slices.
    #[serde(default)]
    pub slice_plan: String,
}

/// One row of `trials.csv`: one trial.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrialRow {
    /// Stable across rounds: the same id means the same hyperparameters and seed.
    pub trial_id: String,
    /// The round's index in the run.
    pub round: u32,
    pub split: String,
    pub n: u32,
    /// The slice (0-based) the trial ran on.
    pub slice: u32,
    pub model: String,
    pub params_lr: f64,
    pub params_batch_size: u32,
    pub params_optimizer: String,
    pub params_momentum: f64,
    pub params_weight_decay: f64,
    pub params_dropout: f64,
    pub seed: u64,
    /// `COMPLETE`, `FAIL`, `INTERRUPTED` or `PRUNED`.
    pub state: String,
    pub test_acc: Option<f64>,
    pub final_loss: Option<f64>,
    pub epochs: u32,
    pub wall_s: f64,
    pub samples_per_s: Option<f64>,
    pub peak_mem_mib: Option<f64>,
    pub mem_cap_mib: Option<f64>,
    pub error: String,
    /// The value of the job's metric (a sweep's `metric.name`; `test_acc` by default).
    pub metric: Option<f64>,
    /// Every parameter the trial was given, as a JSON object (external commands' too).
    pub params: String,
    /// Backend calls in one training step (a fused group's: the group's step); empty where
    /// not counted (external commands, mirrored training).
    pub launches_per_step: Option<u64>,
    /// Host reads and waits during the trial's epochs, the one read of each epoch's metrics
    /// excluded; empty where not counted.
    pub host_syncs: Option<u64>,
}

impl TrialRow {
    /// Whether the trial is done: COMPLETE, or PRUNED by early termination (`--resume`
    /// runs neither again).
    pub fn done(&self) -> bool {
        self.state == COMPLETE || self.state == PRUNED
    }
}

/// A row of `trials.csv` as a merge keeps it, read without making a whole [`TrialRow`]: what
/// it is chosen, counted and ranked by, and its line as its folder wrote it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrialBrief {
    pub trial_id: String,
    pub state: String,
    pub metric: Option<f64>,
    pub test_acc: Option<f64>,
    pub final_loss: Option<f64>,
    /// Every parameter the trial was given, as a JSON object.
    pub params: String,
    /// The row's line (its line end included).
    pub line: Vec<u8>,
}

/// A trial's row as it is ranked: the best trial is the one whose metric is best among those
/// that rank (ties: the lower trial id).
pub trait Ranked {
    fn id(&self) -> &str;
    fn metric(&self) -> Option<f64>;
    /// Whether the trial can be ranked: it is COMPLETE and every result it has (the metric,
    /// test accuracy and final loss) is a finite number. A NaN or infinite result is a failed
    /// value: such a trial is never the best one.
    fn ranks(&self) -> bool;
}

/// [`Ranked::ranks`] of a row's state and results.
fn ranks(state: &str, results: [Option<f64>; 3]) -> bool {
    state == COMPLETE && results.iter().all(|v| v.is_none_or(f64::is_finite))
}

/// [`Ranked`] for row types that hold a trial's id, state and results under the same names.
macro_rules! ranked_by_fields {
    ($($row:ty),*) => {$(
        impl Ranked for $row {
            fn id(&self) -> &str {
                &self.trial_id
            }

            fn metric(&self) -> Option<f64> {
                self.metric
            }

            fn ranks(&self) -> bool {
                ranks(&self.state, [self.metric, self.test_acc, self.final_loss])
            }
        }
    )*};
}

ranked_by_fields!(TrialRow, TrialBrief);

/// One row of `progress.csv`: one trial after one epoch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgressRow {
    pub round: u32,
    pub trial_id: String,
    pub split: String,
    pub n: u32,
    pub epoch: u32,
    pub train_loss: f64,
    pub train_acc: f64,
    pub test_loss: f64,
    pub test_acc: f64,
    /// Seconds since the trial started.
    pub wall_s: f64,
    /// Other numeric values the trial's epoch line reported (an external command's), by name:
    /// one column each, after `wall_s` (see [`extra`]).
    /// Not in serde's columns: the results file writes and reads them by name.
    #[serde(skip)]
    pub extra: std::collections::BTreeMap<String, f64>,
}
