//! `gpumux batch-scan`: samples/s against batch size for one model on one slice, up to the largest batch that fits its cap: a batch too small leaves the device idle.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::engine::Backend;
use crate::error::{Error, Result};
use crate::job::{Job, SplitMode};
use crate::models;
use crate::plan::{self, MIB};
use crate::rounds::{say, CsvFile};
use crate::run::split_policy::{check_here, check_use, Work};
use crate::run::{self, OutFolder};
use crate::sched;
use crate::train::largest_fitting;
use crate::train::mirrored::{plan_on, ratio_probe as probe, ParallelConfig};
use crate::train::stop::{Failure, Stop as TrialStop};

/// The file with one row per batch size tried.
pub const SCAN_CSV: &str = "batch_scan.csv";

/// Options of `gpumux batch-scan` beyond the job.
#[derive(Clone, Debug)]
pub struct ScanOptions {
    pub out: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    /// The split mode whose slice plan gives the cap (default: the job's `split`).
    pub split: Option<SplitMode>,
    /// Which slice of the plan (an unequal plan's slices have different caps).
    pub slice: u32,
    /// The first batch size; each next one doubles it.
    pub start: usize,
    /// Stop after this batch size even when larger ones fit.
    pub max_batch: Option<usize>,
    /// Seconds of timed training per batch size.
    pub seconds: f64,
    pub command: String,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            out: None,
            data_dir: None,
            split: None,
            slice: 0,
            start: 1,
            max_batch: None,
            seconds: probe::TARGET_S,
            command: String::new(),
        }
    }
}

/// A `batch_scan.csv` row.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ScanRow {
    pub batch: usize,
    /// The static memory plan of a training at this batch size.
    pub arena_mib: f64,
    pub mem_cap_mib: Option<f64>,
    /// Whether it fits under the cap (a row with `false` is the first size that does not).
    pub fits: bool,
    pub steps: Option<usize>,
    pub seconds: Option<f64>,
    pub samples_per_s: Option<f64>,
}

/// Why the doubling stopped.
#[derive(Clone, Debug, PartialEq)]
pub enum Stop {
    /// `batch` does not fit: it needs `need_mib`, the slice's cap is `cap_mib`.
    Cap {
        batch: usize,
        need_mib: f64,
        cap_mib: f64,
    },
    /// The next size would exceed the training split.
    Data { samples: usize },
    /// `--max-batch` was reached.
    MaxBatch(usize),
}

/// `gpumux batch-scan`: doubles the batch from `start`, timing a short training at each size on
/// the slice, until the memory plan no longer fits the slice's cap (or the data, or
/// `--max-batch`); then finds the largest batch that fits and times it too. Stopping at the cap
/// is the normal end.
pub fn run(job: &Job, opts: &ScanOptions, out: &mut dyn Write) -> Result<PathBuf> {
    let model = job.model()?.clone();
    if opts.start == 0 {
        return Err(Error::Usage("--start must be at least 1".into()));
    }
    if !(opts.seconds.is_finite() && opts.seconds > 0.0) {
        return Err(Error::Usage(format!(
            "--seconds wants a positive number, not {}",
            opts.seconds
        )));
    }
    // A signal stops the scan (exit 3): at once, inside a measurement, or before the next
    // batch size; the rows measured until then are in the CSV.
    let split = opts.split.unwrap_or(job.file.split);
    check_use(split, Work::Threads("batch-scan"))?;
    let cancel = run::cancel_on_signals(std::time::Duration::ZERO);
    let r = run::backend(job)?;
    check_here(split, Work::Threads("batch-scan"), &r)?;
    let slices = plan::slices(job, 1, split, &r.budgets)?;
    let slice = slices.get(opts.slice as usize).cloned().ok_or_else(|| {
        Error::Usage(format!(
            "--slice {}: the slice plan has {} slice(s)",
            opts.slice,
            slices.len()
        ))
    })?;
    let data = run::load_data(job, opts.data_dir.as_deref())?;
    let n_train = data.train.len();
    let h = job.hyper(0)?;
    let devices = r.device_for(&data)?;
    let device = devices.device(slice.device)?;
    // The scanned slice's partition alone: the other slices of the plan stay idle.
    let parts = sched::partitions(split, std::slice::from_ref(&slice), &devices)
        .map_err(Error::NoDevice)?;
    let part = sched::partition_of(&parts, &slice);
    let open = || -> Result<Box<dyn Backend>> {
        Ok(sched::open_backend(
            device,
            Arc::clone(&data),
            &slice,
            part.clone(),
        )?)
    };
    let sizer = open()?;
    let plan_bytes = |b: usize| -> Result<u64> {
        let net = models::build(
            &model,
            data.shape,
            data.classes,
            b,
            h.dropout as f32,
            h.optimizer,
            &|s| sizer.conv_workspace_len(s),
        )
        .map_err(|m| Error::Usage(format!("model: {m}")))?;
        Ok(net.plan.bytes() as u64)
    };
    let cap = slice.mem_cap_bytes;
    let cap_words = cap.map_or_else(
        || format!("no cap under split {split}"),
        |c| format!("cap {:.1} MiB", c as f64 / MIB),
    );
    say(
        out,
        format!(
            "batch scan: {} on {}, slice {} ({cap_words}), {} lr {}, on {}",
            model.kind, data.name, slice.index, h.optimizer, h.lr, r.device
        ),
    )?;
    let cfg = ParallelConfig {
        trial: crate::train::TrialConfig {
            model: model.clone(),
            hyper: h.clone(),
            epochs: 1,
            seed: job.file.seed,
            input: data.shape,
            classes: data.classes,
            fault: None,
            engine: job.engine_options(),
            max_steps: None,
            warm_up: false,
            cancel: cancel.clone(),
            prune: None,
        },
        shards: Vec::new(),
    };
    // Whether batch `b` fits: the static plan first, then a real allocation from the slice's
    // pool (on a GPU the pool also holds the cuBLAS workspace and the epoch's order). `Err`
    // carries the cap error's figures.
    let fits = |b: usize| -> Result<std::result::Result<(), (f64, f64)>> {
        let need = plan_bytes(b)?;
        if let Some(c) = cap {
            if need > c {
                return Ok(Err((need as f64 / MIB, c as f64 / MIB)));
            }
        }
        let mut be = open()?;
        match plan_on(be.as_mut(), &model, data.shape, data.classes, b, &h) {
            Ok(_) => Ok(Ok(())),
            Err(TrialStop::Failed(Failure::CapExceeded { need_mib, cap_mib })) => {
                Ok(Err((need_mib, cap_mib)))
            }
            Err(e) => Err(Error::Internal(format!("batch {b}: {e}"))),
        }
    };
    let dir = run::out_dir(opts.out.as_deref(), &format!("{}-batch-scan", job.name));
    let folder = OutFolder::lock_fresh(&dir, "batch-scan")?;
    folder.record_command(&opts.command, &r.device)?;
    let path = dir.join(SCAN_CSV);
    // Each row is written and fsynced as it is measured, in increasing batch order.
    let mut csv = CsvFile::create(path.clone())?;
    let mut rows: Vec<ScanRow> = Vec::new();
    let interrupted = |rows: &[ScanRow]| {
        Error::Interrupted(format!(
            "batch scan stopped by a signal; the {} batch size(s) measured are in {}",
            rows.len(),
            path.display()
        ))
    };
    let time =
        |b: usize, rows: &mut Vec<ScanRow>, csv: &mut CsvFile, out: &mut dyn Write| -> Result<()> {
            if cancel.draining() {
                return Err(interrupted(rows));
            }
            let mut be = open()?;
            let speed = match probe::measure(be.as_mut(), &cfg, b, opts.seconds) {
                Ok(s) => s,
                Err(TrialStop::Interrupted) => return Err(interrupted(rows)),
                Err(e) => return Err(e.into_error(&format!("batch {b}"))),
            };
            let row = ScanRow {
                batch: b,
                arena_mib: plan_bytes(b)? as f64 / MIB,
                mem_cap_mib: cap.map(|c| c as f64 / MIB),
                fits: true,
                steps: Some(speed.steps),
                seconds: Some(speed.seconds),
                samples_per_s: Some(speed.samples_per_s),
            };
            csv.row(&row)?;
            say(
                out,
                format!(
                    "batch {:>7}  arena {:>9.1} MiB  {:>4} steps  {:>10.0} samples/s",
                    b, row.arena_mib, speed.steps, speed.samples_per_s
                ),
            )?;
            rows.push(row);
            Ok(())
        };
    let mut b = opts.start;
    let mut last_ok: Option<usize> = None;
    let stop = loop {
        if let Some(m) = opts.max_batch {
            if b > m {
                break Stop::MaxBatch(m);
            }
        }
        if b > n_train {
            break Stop::Data { samples: n_train };
        }
        if let Err((need_mib, cap_mib)) = fits(b)? {
            break Stop::Cap {
                batch: b,
                need_mib,
                cap_mib,
            };
        }
        time(b, &mut rows, &mut csv, out)?;
        last_ok = Some(b);
        b = b.saturating_mul(2);
    };
    let largest = match (&stop, last_ok) {
        (Stop::Cap { batch, .. }, Some(ok)) => {
            Some(largest_fitting::<Error>(ok, *batch, &mut |m| {
                Ok(fits(m)?.is_ok())
            })?)
        }
        (Stop::Data { samples }, Some(ok)) if ok < *samples => {
            if fits(*samples)?.is_ok() {
                Some(*samples)
            } else {
                Some(largest_fitting::<Error>(ok, *samples, &mut |m| {
                    Ok(fits(m)?.is_ok())
                })?)
            }
        }
        (Stop::Cap { batch, .. }, None) if *batch > 1 => {
            Some(largest_fitting::<Error>(0, *batch, &mut |m| {
                Ok(fits(m)?.is_ok())
            })?)
            .filter(|&l| l > 0)
        }
        (_, ok) => ok,
    };
    if cancel.draining() {
        return Err(interrupted(&rows));
    }
    if let Some(l) = largest {
        if last_ok != Some(l) {
            time(l, &mut rows, &mut csv, out)?;
        }
    }
    if let Stop::Cap {
        batch, need_mib, ..
    } = &stop
    {
        let row = ScanRow {
            batch: *batch,
            arena_mib: *need_mib,
            mem_cap_mib: cap.map(|c| c as f64 / MIB),
            fits: false,
            ..Default::default()
        };
        csv.row(&row)?;
        rows.push(row);
    }
    let best = rows
        .iter()
        .filter_map(|r| r.samples_per_s.map(|s| (r.batch, s)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let largest_words = match largest {
        Some(l) => format!("largest batch that fits: {l}"),
        None => "no batch fits".to_string(),
    };
    let verdict = match &stop {
        Stop::Cap {
            batch,
            need_mib,
            cap_mib,
        } => format!(
            "batch {batch} does not fit: needs {need_mib:.1} MiB, slice cap {cap_mib:.1} MiB; {largest_words}"
        ),
        Stop::Data { samples } => format!(
            "stopped at the {samples} training samples of {} (the cap was not reached); {largest_words}",
            data.name
        ),
        Stop::MaxBatch(m) => format!("stopped at --max-batch {m}; {largest_words}"),
    };
    say(out, verdict)?;
    if let Some((b, s)) = best {
        say(out, format!("fastest: batch {b}, {s:.0} samples/s"))?;
    }
    say(out, format!("wrote {}", path.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_stops_at_the_cap_and_names_the_largest_batch_that_fits() {
        let text = "model: {kind: mlp}\ndata: {source: synthetic, train_samples: 1000, test_samples: 10}\n\
                    backend: cpu\nsplit: logical\nmemory: {mib_per_slice: 3}\n";
        let job = Job::parse(text, std::path::Path::new("scan.yaml")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let opts = ScanOptions {
            out: Some(dir.path().to_path_buf()),
            seconds: 0.01,
            ..Default::default()
        };
        let mut out = Vec::new();
        run(&job, &opts, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("batch 512 does not fit: needs "))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains("slice cap 3.0 MiB"), "{line}");
        let largest: usize = line
            .rsplit("largest batch that fits: ")
            .next()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        let bytes = |b: usize| {
            let spec = crate::job::ModelSpec::of(crate::job::ModelKind::Mlp);
            let net = models::build(
                &spec,
                [1, 28, 28],
                10,
                b,
                0.0,
                crate::job::Optimizer::Adam,
                &|s| s.ws_len(),
            )
            .unwrap();
            net.plan.bytes() as u64
        };
        assert!(
            bytes(largest) <= 3 << 20 && bytes(largest + 1) > 3 << 20,
            "{largest}"
        );
        assert!((256..512).contains(&largest));
        let csv = std::fs::read_to_string(dir.path().join(SCAN_CSV)).unwrap();
        // 1, 2, ..., 256, the largest that fits, and 512 that does not.
        assert_eq!(csv.lines().count(), 1 + 9 + 1 + 1, "{csv}");
        assert!(
            csv.lines().last().unwrap().starts_with("512,") && csv.contains(",false,"),
            "{csv}"
        );
    }
}
