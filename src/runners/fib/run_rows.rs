//! The rows of `runs.csv`: one per round of the experiment, with its slices in words.

use crate::data::Dataset;
use crate::job::Job;
use crate::plan::{Round, SliceSpec};
use crate::report::RunRow;
use crate::rounds::model_name;
use crate::run::Resolved;
use crate::sched::{RoundOutcome, TrialState};
use crate::telemetry::Telemetry;

/// The mean of a slice figure over a round's slices; `None` when the slices do not have it.
fn mean_of(slices: &[SliceSpec], value: impl Fn(&SliceSpec) -> Option<f64>) -> Option<f64> {
    let values: Vec<f64> = slices.iter().filter_map(value).collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// runs.csv's `slice_plan`: each slice's SMs and cap when they differ between slices, and with
/// each slice's device (`d1:`) whenever one is off device 0; else empty.
fn slice_plan(slices: &[SliceSpec]) -> String {
    let key = |s: &SliceSpec| (s.sm_count, s.mem_cap_bytes);
    let spans = slices.iter().any(|s| s.device != 0);
    if !spans && slices.windows(2).all(|w| key(&w[0]) == key(&w[1])) {
        return String::new();
    }
    slices
        .iter()
        .map(|s| {
            let on = if spans {
                format!("d{}:", s.device)
            } else {
                String::new()
            };
            let sm = s.sm_count.map(|c| format!("{on}{c}sm/")).unwrap_or(on);
            let cap = s
                .cap_mib()
                .map_or_else(|| "uncapped".to_string(), |c| format!("{c:.0}MiB"));
            format!("{sm}{cap}")
        })
        .collect::<Vec<_>>()
        .join(";")
}

pub(super) fn run_row(
    job: &Job,
    round: &Round,
    outcome: &RoundOutcome,
    data: &Dataset,
    r: &Resolved,
    t: &Telemetry,
) -> RunRow {
    let ok = outcome
        .outcomes
        .iter()
        .filter(|o| o.state() == TrialState::Complete)
        .count() as u32;
    let samples: u64 = outcome
        .outcomes
        .iter()
        .filter_map(|o| o.result())
        .map(|r| r.train_samples)
        .sum();
    let makespan = outcome.makespan_s.max(1e-9);
    let partitions = round
        .slices
        .iter()
        .filter_map(|s| s.partition)
        .max()
        .map(|p| p + 1);
    RunRow {
        model: model_name(job),
        dataset: data.name.clone(),
        split: round.split.to_string(),
        n: round.n,
        slices: round.slices.len() as u32,
        sm_per_slice: mean_of(&round.slices, |s| s.sm_count.map(f64::from)),
        slices_per_partition: partitions.map(|p| round.slices.len() as f64 / p as f64),
        mem_cap_mib: mean_of(&round.slices, SliceSpec::cap_mib),
        slice_plan: slice_plan(&round.slices),
        makespan_s: outcome.makespan_s,
        time_per_training_s: outcome.makespan_s / round.n as f64,
        samples_per_s: samples as f64 / makespan,
        gpu_util_mean: t.gpu_util_mean,
        gpu_mem_peak_mib: t.mem_used_peak_mib,
        power_w_mean: t.power_w_mean,
        sm_clock_mhz_mean: t.sm_clock_mhz_mean,
        proc_mem_peak_mib: t.per_process_peak_mib.values().cloned().reduce(f64::max),
        device: r.device.clone(),
        backend: r.kind.to_string(),
        epochs: job.file.train.epochs,
        ok,
        failed: round.n - ok,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unequal_slices_are_listed_and_averaged_in_runs_csv() {
        let unequal = [
            SliceSpec::at(0, 0).green(0, 80).capped(30_000 << 20),
            SliceSpec::at(1, 0).green(1, 48).capped(20_000 << 20),
        ];
        assert_eq!(slice_plan(&unequal), "80sm/30000MiB;48sm/20000MiB");
        assert_eq!(mean_of(&unequal, |s| s.sm_count.map(f64::from)), Some(64.0));
        assert_eq!(mean_of(&unequal, SliceSpec::cap_mib), Some(25_000.0));
        let equal = [
            SliceSpec::at(0, 0).capped(100 << 20),
            SliceSpec::at(1, 0).capped(100 << 20),
        ];
        assert_eq!(slice_plan(&equal), "");
        assert_eq!(mean_of(&equal, |s| s.sm_count.map(f64::from)), None);
        let mixed = [SliceSpec::at(0, 0).capped(100 << 20), SliceSpec::at(1, 0)];
        assert_eq!(slice_plan(&mixed), "100MiB;uncapped");
        let spread = [
            SliceSpec::at(0, 0).green(0, 64).capped(100 << 20),
            SliceSpec::at(1, 1).green(1, 64).capped(100 << 20),
        ];
        assert_eq!(slice_plan(&spread), "d0:64sm/100MiB;d1:64sm/100MiB");
        let moved = [SliceSpec::at(0, 2).capped(100 << 20)];
        assert_eq!(slice_plan(&moved), "d2:100MiB");
    }
}
