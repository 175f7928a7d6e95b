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
use crate::run::split_policy::Work;
use crate::run::{self, Modes, Signals};
use crate::sched;
use crate::train::largest_fitting;
use crate::train::mirrored::{plan_on, ratio_probe as probe, ParallelConfig};
use crate::train::stop::{Failure, Stop};

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
}

impl ScanOptions {
    /// Refuses options no scan can take (bad input, exit 2).
    fn check(&self) -> Result<()> {
        if self.start == 0 {
            return Err(Error::Usage("--start must be at least 1".into()));
        }
        if !(self.seconds.is_finite() && self.seconds > 0.0) {
            return Err(Error::Usage(format!(
                "--seconds wants a positive number, not {}",
                self.seconds
            )));
        }
        Ok(())
    }
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
pub enum ScanEnd {
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
    opts.check()?;
    // A signal stops the scan (exit 3): at once, inside a measurement, or before the next
    // batch size; the rows measured until then are in the CSV.
    let split = opts.split.unwrap_or(job.file.split);
    let opened = run::Setup {
        command: "batch-scan",
        modes: Modes::One(split, Work::Threads("batch-scan")),
        signals: Signals::Stop,
        opens_device: true,
        data_dir: opts.data_dir.as_deref(),
    }
    .open(job)?;
    let (r, cancel) = (opened.resolved()?, opened.cancel().clone());
    let slices = plan::slices(job, 1, split, &r.budgets)?;
    let slice = slices.get(opts.slice as usize).cloned().ok_or_else(|| {
        Error::Usage(format!(
            "--slice {}: the slice plan has {} slice(s)",
            opts.slice,
            slices.len()
        ))
    })?;
    let data = Arc::clone(opened.data()?);
    let h = job.hyper(0)?;
    let devices = r.device_for(&data)?;
    // The scanned slice's partition alone: the other slices of the plan stay idle.
    let parts = sched::partitions(split, std::slice::from_ref(&slice), &devices)
        .map_err(Error::NoDevice)?;
    let cap_words = slice.mem_cap_bytes.map_or_else(
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
    let mut scan = Scan {
        device: devices.device(slice.device)?,
        part: sched::partition_of(&parts, &slice),
        cfg: ParallelConfig {
            trial: crate::train::TrialConfig {
                epochs: 1,
                ..crate::rounds::lone_trial(job, &data, model, h, cancel.clone())
            },
            shards: Vec::new(),
        },
        sizer: None,
        data,
        slice,
        seconds: opts.seconds,
        rows: Vec::new(),
    };
    scan.sizer = Some(scan.open()?);
    let dir = run::out_dir(opts.out.as_deref(), &format!("{}-batch-scan", job.name));
    let _session = opened.fresh_folder(&dir)?;
    let path = dir.join(SCAN_CSV);
    // Each row is written and fsynced as it is measured, in increasing batch order.
    let mut csv = CsvFile::create(path.clone())?;
    let (stop, largest) = scan.walk(opts, &mut csv, out)?;
    say(out, scan.verdict(&stop, largest))?;
    if let Some((b, s)) = scan.fastest() {
        say(out, format!("fastest: batch {b}, {s:.0} samples/s"))?;
    }
    say(out, format!("wrote {}", path.display()))?;
    Ok(dir)
}

/// One batch scan: the slice it runs on, and the rows measured so far.
struct Scan<'a> {
    device: &'a sched::Device,
    part: Option<Arc<crate::engine::cuda::GreenPartition>>,
    cfg: ParallelConfig,
    /// A backend on the slice that sizes convolution workspaces for the plans.
    sizer: Option<Box<dyn Backend>>,
    data: Arc<crate::data::Dataset>,
    slice: plan::SliceSpec,
    seconds: f64,
    rows: Vec<ScanRow>,
}

impl Scan<'_> {
    /// A fresh backend on the scanned slice.
    fn open(&self) -> Result<Box<dyn Backend>> {
        Ok(sched::open_backend(
            self.device,
            Arc::clone(&self.data),
            &self.slice,
            self.part.clone(),
        )?)
    }

    fn cap(&self) -> Option<u64> {
        self.slice.mem_cap_bytes
    }

    /// The bytes of the static memory plan at batch `b`.
    fn plan_bytes(&self, b: usize) -> Result<u64> {
        let t = &self.cfg.trial;
        let sizer = self.sizer.as_deref();
        let net = models::build(
            &t.model,
            self.data.shape,
            self.data.classes,
            b,
            t.hyper.dropout as f32,
            t.hyper.optimizer,
            &|s| sizer.map_or(0, |be| be.conv_workspace_len(s)),
        )
        .map_err(|m| Error::Usage(format!("model: {m}")))?;
        Ok(net.plan.bytes() as u64)
    }

    /// Whether batch `b` fits: the static plan first, then a real allocation from the slice's
    /// pool (on a GPU the pool also holds the cuBLAS workspace and the epoch's order). `Err`
    /// carries the cap error's figures.
    fn fits(&self, b: usize) -> Result<std::result::Result<(), (f64, f64)>> {
        let need = self.plan_bytes(b)?;
        if let Some(c) = self.cap() {
            if need > c {
                return Ok(Err((need as f64 / MIB, c as f64 / MIB)));
            }
        }
        let mut be = self.open()?;
        let t = &self.cfg.trial;
        match plan_on(be.as_mut(), &t.model, t.input, t.classes, b, &t.hyper) {
            Ok(_) => Ok(Ok(())),
            Err(Stop::Failed(Failure::CapExceeded { need_mib, cap_mib })) => {
                Ok(Err((need_mib, cap_mib)))
            }
            Err(e) => Err(Error::Internal(format!("batch {b}: {e}"))),
        }
    }

    fn interrupted(&self, csv: &CsvFile) -> Error {
        Error::Interrupted(format!(
            "batch scan stopped by a signal; the {} batch size(s) measured are in {}",
            self.rows.len(),
            csv.path().display()
        ))
    }

    /// Measures batch `b` and writes its row.
    fn time(&mut self, b: usize, csv: &mut CsvFile, out: &mut dyn Write) -> Result<()> {
        if self.cfg.trial.cancel.draining() {
            return Err(self.interrupted(csv));
        }
        let mut be = self.open()?;
        let speed = match probe::measure(be.as_mut(), &self.cfg, b, self.seconds) {
            Ok(s) => s,
            Err(Stop::Interrupted) => return Err(self.interrupted(csv)),
            Err(e) => return Err(e.into_error(&format!("batch {b}"))),
        };
        let row = ScanRow {
            batch: b,
            arena_mib: self.plan_bytes(b)? as f64 / MIB,
            mem_cap_mib: self.cap().map(|c| c as f64 / MIB),
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
        self.rows.push(row);
        Ok(())
    }

    /// Doubles the batch from `--start` until it no longer fits (or meets the data or
    /// `--max-batch`), measuring each; then measures the largest batch that fits. Returns why
    /// it stopped, and that largest batch.
    fn walk(
        &mut self,
        opts: &ScanOptions,
        csv: &mut CsvFile,
        out: &mut dyn Write,
    ) -> Result<(ScanEnd, Option<usize>)> {
        let n_train = self.data.train.len();
        let mut b = opts.start;
        let mut last_ok: Option<usize> = None;
        let stop = loop {
            if let Some(m) = opts.max_batch {
                if b > m {
                    break ScanEnd::MaxBatch(m);
                }
            }
            if b > n_train {
                break ScanEnd::Data { samples: n_train };
            }
            if let Err((need_mib, cap_mib)) = self.fits(b)? {
                break ScanEnd::Cap {
                    batch: b,
                    need_mib,
                    cap_mib,
                };
            }
            self.time(b, csv, out)?;
            last_ok = Some(b);
            b = b.saturating_mul(2);
        };
        let largest = self.largest(&stop, last_ok)?;
        if self.cfg.trial.cancel.draining() {
            return Err(self.interrupted(csv));
        }
        if let Some(l) = largest {
            if last_ok != Some(l) {
                self.time(l, csv, out)?;
            }
        }
        if let ScanEnd::Cap {
            batch, need_mib, ..
        } = &stop
        {
            let row = ScanRow {
                batch: *batch,
                arena_mib: *need_mib,
                mem_cap_mib: self.cap().map(|c| c as f64 / MIB),
                fits: false,
                ..Default::default()
            };
            csv.row(&row)?;
            self.rows.push(row);
        }
        Ok((stop, largest))
    }

    /// The largest batch that fits, searched between the last that fit and the one that did not.
    fn largest(&self, stop: &ScanEnd, last_ok: Option<usize>) -> Result<Option<usize>> {
        let mut fits = |m: usize| Ok(self.fits(m)?.is_ok());
        Ok(match (stop, last_ok) {
            (ScanEnd::Cap { batch, .. }, Some(ok)) => {
                Some(largest_fitting::<Error>(ok, *batch, &mut fits)?)
            }
            (ScanEnd::Data { samples }, Some(ok)) if ok < *samples => {
                if self.fits(*samples)?.is_ok() {
                    Some(*samples)
                } else {
                    Some(largest_fitting::<Error>(ok, *samples, &mut fits)?)
                }
            }
            (ScanEnd::Cap { batch, .. }, None) if *batch > 1 => {
                Some(largest_fitting::<Error>(0, *batch, &mut fits)?).filter(|&l| l > 0)
            }
            (_, ok) => ok,
        })
    }

    /// The batch measured fastest, and its samples/s.
    fn fastest(&self) -> Option<(usize, f64)> {
        self.rows
            .iter()
            .filter_map(|r| r.samples_per_s.map(|s| (r.batch, s)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// Why the scan stopped, and the largest batch that fits, in words.
    fn verdict(&self, stop: &ScanEnd, largest: Option<usize>) -> String {
        let largest_words = match largest {
            Some(l) => format!("largest batch that fits: {l}"),
            None => "no batch fits".to_string(),
        };
        match stop {
            ScanEnd::Cap {
                batch,
                need_mib,
                cap_mib,
            } => format!(
                "batch {batch} does not fit: needs {need_mib:.1} MiB, slice cap {cap_mib:.1} MiB; {largest_words}"
            ),
            ScanEnd::Data { samples } => format!(
                "stopped at the {samples} training samples of {} (the cap was not reached); {largest_words}",
                self.data.name
            ),
            ScanEnd::MaxBatch(m) => format!("stopped at --max-batch {m}; {largest_words}"),
        }
    }
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
