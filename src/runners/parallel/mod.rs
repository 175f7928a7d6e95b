//! `gpumux parallel`: one data-parallel training of a job's model over its slices, with per-slice samples/s live and in CSVs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::data::Dataset;
use crate::engine::cuda::GreenPartition;
use crate::engine::{Backend, BackendKind};
use crate::error::{Error, Result};
use crate::job::{BatchRatios, Job, SplitMode};
use crate::plan::{self, SliceSpec};
use crate::rounds::{model_name, say, CsvFile};
use crate::run::split_policy::Work;
use crate::run::{self, Modes, Resolved, Signals};
use crate::sched::{self, Devices};
use crate::train::mirrored::{
    ratio_probe as probe, train, ParallelConfig, ParallelEpoch, ParallelOutcome,
};
use crate::train::stop::Stop;

/// The file with one row per slice and epoch, and one for their total.
pub const PROGRESS_CSV: &str = "progress.csv";
/// The file with one row for the whole training.
pub const PARALLEL_CSV: &str = "parallel.csv";
/// The file with what `ratios: auto` measured and chose.
pub const RATIOS_CSV: &str = "ratios.csv";

/// Options of `gpumux parallel` beyond the job.
#[derive(Clone, Debug, Default)]
pub struct ParallelOptions {
    pub out: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    /// The split mode of the slices (default: the job's `split`).
    pub split: Option<SplitMode>,
    /// Print the slice plan and the shards, and train nothing.
    pub dry_run: bool,
}

/// A `progress.csv` row: the columns of the other commands' `progress.csv`, then the slice
/// (`0`, `1`, ... or `total`), its rows of each global batch, its samples/s and its busy seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SliceProgressRow {
    pub round: u32,
    pub trial_id: String,
    pub split: String,
    pub n: u32,
    pub epoch: u32,
    pub train_loss: f64,
    pub train_acc: f64,
    pub test_loss: f64,
    pub test_acc: f64,
    pub wall_s: f64,
    pub slice: String,
    pub shard_rows: usize,
    pub samples_per_s: f64,
    /// Seconds the slice computed during the epoch's training (empty on the total row).
    pub busy_s: Option<f64>,
    /// Seconds of the epoch's training steps (evaluation excluded).
    pub train_s: f64,
}

/// The `parallel.csv` row of one data-parallel training.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ParallelRow {
    pub model: String,
    pub dataset: String,
    pub split: String,
    pub slices: u32,
    /// Each slice's rows of the global batch, `;`-separated.
    pub shards: String,
    /// `even`, `auto`, or the weights given.
    pub ratios: String,
    pub global_batch: usize,
    pub epochs: u32,
    pub steps_per_epoch: usize,
    /// The median epoch, evaluation included.
    pub time_per_epoch_s: f64,
    /// From the first allocation to the end of the last evaluation.
    pub total_s: f64,
    /// Training samples per second of training steps (evaluation excluded).
    pub samples_per_s: f64,
    /// Each slice's samples/s over the training steps, `;`-separated.
    pub slice_samples_per_s: String,
    /// Each slice's busy fraction of the training time, `;`-separated: 1 on the slowest slice,
    /// less on one that waits for it.
    pub slice_busy: String,
    pub test_acc: f64,
    pub final_loss: f64,
    /// The largest parameter difference between replicas at the end (0: they stayed identical).
    pub replica_spread: f64,
    pub lr: f64,
    pub optimizer: String,
    pub device: String,
    pub backend: String,
}

/// A `ratios.csv` row: one slice's speed alone, and the share of the batch it was given.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RatioRow {
    pub slice: u32,
    pub sm_count: Option<u32>,
    pub mem_cap_mib: Option<f64>,
    pub probe_rows: usize,
    pub probe_steps: usize,
    pub probe_s: f64,
    pub samples_per_s: f64,
    pub ratio: f64,
    pub shard_rows: usize,
}

/// The slice plan as a table, one line per slice; with a device column when the slices span
/// several devices.
pub fn slice_table(slices: &[SliceSpec]) -> Vec<String> {
    let spans = slices.iter().any(|s| s.device != 0);
    let device = |d: String| {
        if spans {
            format!("  {d:>6}")
        } else {
            String::new()
        }
    };
    let mut lines = vec![format!(
        "{:>5}{}  {:>12}  {:>8}  {:>9}",
        "slice",
        device("device".into()),
        "mem cap MiB",
        "SMs",
        "partition"
    )];
    for s in slices {
        let cap = s
            .cap_mib()
            .map(|c| format!("{c:.1}"))
            .unwrap_or_else(|| "none".into());
        let sm = s
            .sm_count
            .map(|c| c.to_string())
            .unwrap_or_else(|| "all".into());
        let part = s
            .partition
            .map(|c| c.to_string())
            .unwrap_or_else(|| "-".into());
        lines.push(format!(
            "{:>5}{}  {:>12}  {:>8}  {:>9}",
            s.index,
            device(s.device.to_string()),
            cap,
            sm,
            part
        ));
    }
    lines
}

/// What the slice plan did with the `sm` values of the job, in words: rounded on a GPU,
/// unused on the CPU.
pub fn sm_notes(
    job: &Job,
    split: SplitMode,
    kind: BackendKind,
    slices: &[SliceSpec],
) -> Vec<String> {
    let Some(defs) = &job.file.slices else {
        if job.file.ratios.is_none() {
            return Vec::new();
        }
        return vec![match (kind, split) {
            (BackendKind::Cpu, _) => "note: on the CPU backend ratios size the caps only: there are no SMs to split".into(),
            (_, SplitMode::Green) => "note: ratios split the SMs in whole partitions (multiples of the device's granularity)".into(),
            _ => format!("note: ratios size the caps; SMs are split in green mode only, and under split {split} every slice runs on all of them"),
        }];
    };
    let given: Vec<(usize, u32)> = defs
        .iter()
        .enumerate()
        .filter_map(|(i, d)| d.sm.map(|s| (i, s)))
        .collect();
    if given.is_empty() {
        return Vec::new();
    }
    if kind == BackendKind::Cpu {
        return vec!["note: `sm` sizes green partitions on a GPU; the CPU backend has no SMs, so only the slices' caps apply".into()];
    }
    if split != SplitMode::Green {
        return vec![format!(
            "note: `sm` applies in green mode; under split {split} every slice runs on all SMs"
        )];
    }
    given
        .into_iter()
        .filter_map(|(i, asked)| {
            let got = slices.get(i)?.sm_count?;
            (got != asked).then(|| {
                format!("note: slice {i}: {asked} SMs rounded up to {got} (the device's partition granularity)")
            })
        })
        .collect()
}

/// Each slice's backend, in its partition when it has one.
fn open_all(
    devices: &Devices,
    data: &Arc<Dataset>,
    slices: &[SliceSpec],
    parts: &[Option<Arc<GreenPartition>>],
) -> Result<Vec<(u32, Box<dyn Backend>)>> {
    slices
        .iter()
        .map(|s| {
            let part = sched::partition_of(parts, s);
            let be = sched::open_backend(devices.device(s.device)?, Arc::clone(data), s, part)?;
            Ok((s.index, be))
        })
        .collect()
}

fn trial_error(e: Stop) -> Error {
    e.into_error("the parallel training")
}

fn joined<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    items
        .into_iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(";")
}

/// `gpumux parallel`: trains the job's model (trial 0's hyperparameters, `train.batch_size` as
/// the global batch) mirrored on the slices of its plan.
pub fn run(job: &Job, opts: &ParallelOptions, out: &mut dyn Write) -> Result<PathBuf> {
    let model = job.model()?.clone();
    let k = job.replicas()?;
    let split = opts.split.unwrap_or(job.file.split);
    let opened = run::Setup {
        command: "parallel",
        modes: Modes::One(split, Work::Threads("parallel")),
        signals: Signals::Stop,
        opens_device: true,
        data_dir: opts.data_dir.as_deref(),
    }
    .open(job)?;
    let r = opened.resolved()?;
    let slices = plan::slices(job, k, split, &r.budgets)?;
    let ratios = ratios_of(job);
    say_plan(out, job, split, r, &slices)?;
    let h = job.hyper(0)?;
    let global = h.batch_size as usize;
    let data = opened.data()?;
    let fixed = fixed_shards(job, &ratios, global, k, data)?;
    let ratio_words = words_of(&ratios);
    let spec = plan::trials(job, 1)?
        .pop()
        .ok_or_else(|| Error::Internal("no trial".into()))?;
    if opts.dry_run {
        let shards = fixed
            .as_ref()
            .map_or_else(|| "measured at run time (ratios: auto)".into(), joined);
        let what = format!("{} on {}: global batch {global}", model.kind, data.name);
        say(
            out,
            format!("{what}, ratios {ratio_words}, shards {shards}; dry run, nothing trained"),
        )?;
        return Ok(PathBuf::new());
    }
    let dir = run::out_dir(opts.out.as_deref(), &format!("{}-parallel", job.name));
    let session = opened.fresh_folder(&dir)?;
    let (r, data) = (session.resolved()?, session.data()?);
    let devices = r.device_for(data)?;
    let parts = sched::partitions(split, &slices, &devices).map_err(Error::NoDevice)?;
    let cancel = session.cancel().clone();
    let mut cfg = ParallelConfig {
        trial: crate::train::TrialConfig {
            seed: spec.seed,
            ..crate::rounds::lone_trial(job, data, model.clone(), h.clone(), cancel)
        },
        shards: fixed.clone().unwrap_or_default(),
    };
    if fixed.is_none() {
        cfg.shards = choose_ratios(&cfg, &devices, data, &slices, &parts, &dir, out)?;
    }
    say(
        out,
        format!(
            "{} on {}: {} epochs, global batch {global} split {} (ratios {ratio_words}), {} lr {}, seed {}",
            model.kind,
            data.name,
            cfg.trial.epochs,
            joined(&cfg.shards),
            h.optimizer,
            h.lr,
            spec.seed
        ),
    )?;
    let backends = open_all(&devices, data, &slices, &parts)?;
    let outcome = train_recording(backends, &cfg, split, &dir, out)?;
    let row = summary_row(job, data, r, split, &cfg, &ratio_words, &outcome);
    let mut summary = CsvFile::create(dir.join(PARALLEL_CSV))?;
    summary.row(&row)?;
    say_done(out, &row, &outcome)?;
    say(out, format!("results: {}", dir.display()))?;
    Ok(dir)
}

/// The slice plan, as the run starts: one line per slice, and notes on SM partitions.
fn say_plan(
    out: &mut dyn Write,
    job: &Job,
    split: SplitMode,
    r: &run::Resolved,
    slices: &[plan::SliceSpec],
) -> Result<()> {
    let k = slices.len();
    say(
        out,
        format!(
            "slice plan: {k} slice{}, split {split}, on {}",
            if k == 1 { "" } else { "s" },
            r.device
        ),
    )?;
    for line in slice_table(slices) {
        say(out, line)?;
    }
    for note in sm_notes(job, split, r.kind, slices) {
        say(out, note)?;
    }
    Ok(())
}

/// The shards of the global batch that `ratios` fixes before the run (`None` for `auto`, which
/// measures them); refused: a global batch larger than the data, a slice given no rows.
fn fixed_shards(
    job: &Job,
    ratios: &BatchRatios,
    global: usize,
    k: u32,
    data: &Dataset,
) -> Result<Option<Vec<usize>>> {
    if global > data.train.len() {
        return Err(job
            .invalid(
                "train.batch_size",
                format!(
                    "the global batch of {global} is larger than the {} training samples of {}",
                    data.train.len(),
                    data.name
                ),
            )
            .into());
    }
    Ok(match ratios {
        BatchRatios::Even => Some(plan::shares(global, &vec![1.0; k as usize], false)),
        BatchRatios::Weights(w) => {
            let shards = plan::shares(global, w, false);
            if let Some(i) = shards.iter().position(|&n| n == 0) {
                return Err(job
                    .invalid(
                        "parallel.ratios",
                        format!("give slice {i} no rows of the global batch of {global}: raise its ratio or the batch"),
                    )
                    .into());
            }
            Some(shards)
        }
        BatchRatios::Auto => None,
    })
}

/// The job's `parallel.ratios` (even when it gives none).
fn ratios_of(job: &Job) -> BatchRatios {
    let given = job.file.parallel.as_ref().and_then(|p| p.ratios.clone());
    given.unwrap_or(BatchRatios::Even)
}

/// The ratios in words: `even`, `auto`, or the weights joined by `:`.
fn words_of(ratios: &BatchRatios) -> String {
    match ratios {
        BatchRatios::Even => "even".to_string(),
        BatchRatios::Auto => "auto".to_string(),
        BatchRatios::Weights(w) => w
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(":"),
    }
}

/// Trains on `backends`, printing each epoch and writing its rows to `progress.csv` in `dir`.
fn train_recording(
    backends: Vec<(u32, Box<dyn crate::engine::Backend>)>,
    cfg: &ParallelConfig,
    split: SplitMode,
    dir: &Path,
    out: &mut dyn Write,
) -> Result<ParallelOutcome> {
    let k = cfg.shards.len() as u32;
    let mut progress = CsvFile::create(dir.join(PROGRESS_CSV))?;
    let mut write_err = None;
    let outcome = train(backends, cfg, &mut |e: &ParallelEpoch| {
        let s = &e.stats;
        let _ = writeln!(
            out,
            "epoch {:>3}  train loss {:.4}  train acc {:.4}  test loss {:.4}  test acc {:.4}  {:.2} s",
            s.epoch, s.train_loss, s.train_acc, s.test_loss, s.test_acc, e.train_s
        );
        let samples = s.epoch as usize * e.steps * cfg.shards.iter().sum::<usize>();
        let _ = writeln!(out, "after {samples} samples: {}", e.speed_line());
        for row in progress_rows(e, split, k) {
            if let Err(err) = progress.row(&row) {
                write_err.get_or_insert(err);
            }
        }
    })
    .map_err(trial_error)?;
    match write_err {
        Some(e) => Err(e),
        None => Ok(outcome),
    }
}

/// The last line of a parallel run.
fn say_done(out: &mut dyn Write, row: &ParallelRow, outcome: &ParallelOutcome) -> Result<()> {
    say(
        out,
        format!(
            "done: test acc {:.4}, final loss {:.4}, {:.2} s per epoch, {:.2} s in all, {:.0} samples/s; replicas identical: {}",
            row.test_acc,
            row.final_loss,
            row.time_per_epoch_s,
            row.total_s,
            row.samples_per_s,
            if outcome.replica_spread == 0.0 {
                "yes".to_string()
            } else {
                format!("no (max |Δ| {:e})", outcome.replica_spread)
            }
        ),
    )
}

/// `ratios: auto`: each slice trains alone for a moment on the even shard size; the batch is
/// split in proportion to the samples/s measured. Says what it measured and chose, and writes
/// `ratios.csv`.
fn choose_ratios(
    cfg: &ParallelConfig,
    devices: &Devices,
    data: &Arc<Dataset>,
    slices: &[SliceSpec],
    parts: &[Option<Arc<GreenPartition>>],
    dir: &Path,
    out: &mut dyn Write,
) -> Result<Vec<usize>> {
    let global = cfg.trial.hyper.batch_size as usize;
    let rows = global.div_ceil(slices.len()).max(1);
    let mut speeds = Vec::new();
    for s in slices {
        // Each probe has its own backend, dropped before the next slice runs: slices alone.
        let part = sched::partition_of(parts, s);
        let mut be = sched::open_backend(devices.device(s.device)?, Arc::clone(data), s, part)?;
        let speed = probe::measure(be.as_mut(), cfg, rows, probe::TARGET_S)
            .map_err(|e| e.into_error(&format!("ratios auto: the probe of slice {}", s.index)))?;
        speeds.push(speed);
    }
    let weights = probe::ratios(&speeds.iter().map(|s| s.samples_per_s).collect::<Vec<_>>());
    let shards = plan::shares(global, &weights, true);
    let ints = probe::small_integers(&weights);
    let measured: Vec<String> = speeds
        .iter()
        .zip(slices)
        .map(|(sp, s)| {
            format!(
                "slice {} alone [{}] {:.0} sps",
                s.index, sp.rows, sp.samples_per_s
            )
        })
        .collect();
    say(out, format!("ratios auto: {}", measured.join(" · ")))?;
    say(
        out,
        format!(
            "ratios auto: chose {} (about {}), shards {} of the global batch {global}",
            weights
                .iter()
                .map(|w| format!("{w:.3}"))
                .collect::<Vec<_>>()
                .join(":"),
            ints.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(":"),
            joined(&shards)
        ),
    )?;
    let mut csv = CsvFile::create(dir.join(RATIOS_CSV))?;
    for ((s, sp), (w, &n)) in slices.iter().zip(&speeds).zip(weights.iter().zip(&shards)) {
        csv.row(&RatioRow {
            slice: s.index,
            sm_count: s.sm_count,
            mem_cap_mib: s.cap_mib(),
            probe_rows: sp.rows,
            probe_steps: sp.steps,
            probe_s: sp.seconds,
            samples_per_s: sp.samples_per_s,
            ratio: *w,
            shard_rows: n,
        })?;
    }
    Ok(shards)
}

/// The `progress.csv` rows of one epoch: one per slice, then the total.
fn progress_rows(e: &ParallelEpoch, split: SplitMode, k: u32) -> Vec<SliceProgressRow> {
    let s = &e.stats;
    let base = SliceProgressRow {
        round: 0,
        trial_id: "t000".into(),
        split: split.to_string(),
        n: k,
        epoch: s.epoch,
        train_loss: s.train_loss,
        train_acc: s.train_acc,
        test_loss: s.test_loss,
        test_acc: s.test_acc,
        wall_s: s.wall_s,
        train_s: e.train_s,
        ..Default::default()
    };
    let mut rows: Vec<SliceProgressRow> = e
        .slices
        .iter()
        .map(|sl| SliceProgressRow {
            slice: sl.slice.to_string(),
            shard_rows: sl.rows,
            samples_per_s: sl.samples_per_s,
            busy_s: Some(sl.busy_s),
            ..base.clone()
        })
        .collect();
    rows.push(SliceProgressRow {
        slice: "total".into(),
        shard_rows: e.slices.iter().map(|s| s.rows).sum(),
        samples_per_s: e.samples_per_s,
        busy_s: None,
        ..base
    });
    rows
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let m = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[m]
    } else {
        (xs[m - 1] + xs[m]) / 2.0
    }
}

fn summary_row(
    job: &Job,
    data: &Dataset,
    r: &Resolved,
    split: SplitMode,
    cfg: &ParallelConfig,
    ratio_words: &str,
    o: &ParallelOutcome,
) -> ParallelRow {
    let lengths = o.epochs.iter().map(|e| e.epoch_s).collect();
    let train_s: f64 = o.epochs.iter().map(|e| e.train_s).sum::<f64>().max(1e-9);
    let steps: usize = o.epochs.iter().map(|e| e.steps).sum();
    let slice_sps = cfg
        .shards
        .iter()
        .map(|&n| format!("{:.0}", (n * steps) as f64 / train_s));
    let busy = (0..cfg.shards.len()).map(|i| {
        let b: f64 = o
            .epochs
            .iter()
            .filter_map(|e| e.slices.get(i))
            .map(|s| s.busy_s)
            .sum();
        format!("{:.2}", b / train_s)
    });
    ParallelRow {
        model: model_name(job),
        dataset: data.name.clone(),
        split: split.to_string(),
        slices: cfg.shards.len() as u32,
        shards: joined(&cfg.shards),
        ratios: ratio_words.to_string(),
        global_batch: cfg.shards.iter().sum(),
        epochs: cfg.trial.epochs,
        steps_per_epoch: o.epochs.first().map_or(0, |e| e.steps),
        time_per_epoch_s: median(lengths),
        total_s: o.result.wall_s,
        samples_per_s: o.result.train_samples as f64 / train_s,
        slice_samples_per_s: joined(slice_sps),
        slice_busy: joined(busy),
        test_acc: o.result.test_acc,
        final_loss: o.result.final_loss,
        replica_spread: o.replica_spread as f64,
        lr: cfg.trial.hyper.lr,
        optimizer: cfg.trial.hyper.optimizer.to_string(),
        device: r.device.clone(),
        backend: r.kind.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slice_table_shows_devices_only_when_slices_span_several() {
        let slice = |index, device| {
            crate::plan::SliceSpec::at(index, device)
                .capped(3 << 30)
                .green(index, 64)
        };
        let one = slice_table(&[slice(0, 0), slice(1, 0)]);
        assert!(!one[0].contains("device"), "{}", one[0]);
        let two = slice_table(&[slice(0, 0), slice(1, 1)]);
        assert!(two[0].contains("device"), "{}", two[0]);
        let cells: Vec<&str> = two[2].split_whitespace().collect();
        assert_eq!(cells, vec!["1", "1", "3072.0", "64", "1"]);
    }
}
