//! The subcommands behind the CLI: devices, train, fib, report and the hidden worker.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use crate::data::Dataset;
use crate::engine::cuda::{self, CudaEngine};
use crate::engine::BackendKind;
use crate::error::{EngineError, Error, Result};
use crate::gpu::{self, Discovery};
use crate::job::{BackendChoice, EngineOptions, Job, SplitMode};
use crate::plan::{self, Budgets, DeviceBudget, Round, SliceSpec, MIB};
use crate::report::{self, ProgressRow, RunRow, TrialRow};
use crate::sched::cancel::Cancel;
use crate::sched::{
    self, Device, Devices, Event, RoundContext, RoundOutcome, TrialOutcome, TrialState,
};
use crate::telemetry::{Sampler, Telemetry};
use crate::train::{run_trial, TrialConfig};

/// The engine a run uses, and why.
#[derive(Clone)]
pub struct Resolved {
    pub kind: BackendKind,
    /// The device in words, for every report row (each device, when slices span several).
    pub device: String,
    /// A line for the user: which backend and why.
    pub note: String,
    /// What the slice plan knows of device 0 and of the further devices opened.
    pub budgets: Budgets,
    /// The CUDA engine of device 0 in this process, when the backend is `cuda`.
    pub engine: Option<Arc<CudaEngine>>,
    /// The engines of the further CUDA devices the job's slices name, by number.
    pub more: Vec<(u32, Arc<CudaEngine>)>,
}

impl Resolved {
    /// Opens the devices for this process's trials, uploading the dataset once to each GPU.
    pub fn device_for(&self, data: &Dataset) -> Result<Devices> {
        let Some(engine) = &self.engine else {
            return Ok(Devices::one(Device::Cpu));
        };
        let cuda = |e: &Arc<CudaEngine>| -> Result<Device> {
            Ok(Device::Cuda {
                engine: Arc::clone(e),
                data: e.upload(data)?,
            })
        };
        let more = self
            .more
            .iter()
            .map(|(d, e)| Ok((*d, cuda(e)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Devices::with(cuda(engine)?, more))
    }

    /// Why green contexts cannot be made on one of the CUDA devices, if they cannot.
    pub fn without_green(&self) -> Option<String> {
        let all = self
            .engine
            .iter()
            .map(|e| (0, e))
            .chain(self.more.iter().map(|(d, e)| (*d, e)));
        for (d, e) in all {
            if e.info().green.is_none() {
                return Some(if self.more.is_empty() {
                    "this device or driver has no green contexts".into()
                } else {
                    format!(
                        "device {d} ({}) or its driver has no green contexts",
                        e.info().name
                    )
                });
            }
        }
        None
    }

    /// Opens the further CUDA devices the job's slices name (`slices[i].device`), adding them
    /// to the budgets and the device words. The CPU backend has device 0 only.
    pub fn open_devices(&mut self, job: &Job) -> Result<()> {
        let key = |d: u32| {
            job.file
                .slices
                .as_ref()
                .and_then(|s| s.iter().position(|x| x.device == Some(d)))
                .map_or_else(|| "slices".to_string(), |i| format!("slices.{i}.device"))
        };
        let wanted: Vec<u32> = job.devices().into_iter().filter(|&d| d != 0).collect();
        let Some(first) = &self.engine else {
            return match wanted.first() {
                None => Ok(()),
                Some(&d) => Err(job
                    .invalid(
                        &key(d),
                        format!(
                            "names device {d}, but the CPU backend has device 0 only: drop `device`, or run where the GPUs are — {}",
                            self.note
                        ),
                    )
                    .into()),
            };
        };
        let first = Arc::clone(first);
        for d in wanted {
            if self.more.iter().any(|(n, _)| *n == d) {
                continue;
            }
            let engine = CudaEngine::open(d as usize, &job.engine_options()).map_err(|e| {
                let why = match e {
                    EngineError::Unavailable { reason, .. } => reason,
                    other => other.to_string(),
                };
                Error::NoDevice(format!(
                    "{}: {}: cannot open CUDA device {d}: {why}",
                    job.path.display(),
                    key(d)
                ))
            })?;
            self.budgets.more.push((d, budget_of(&engine)));
            self.more.push((d, engine));
        }
        if !self.more.is_empty() {
            let words = std::iter::once(format!("0: {}", device_words(&first)))
                .chain(
                    self.more
                        .iter()
                        .map(|(d, e)| format!("{d}: {}", device_words(e))),
                )
                .collect::<Vec<_>>();
            self.device = words.join(" + ");
        }
        Ok(())
    }
}

/// A CUDA device in words: name, SMs and memory.
fn device_words(engine: &CudaEngine) -> String {
    let info = engine.info();
    format!(
        "{} ({} SMs, {:.0} MiB)",
        info.name,
        info.sm_count,
        info.total_mem_bytes as f64 / MIB
    )
}

/// What the slice plan needs to know of a CUDA device.
fn budget_of(engine: &CudaEngine) -> DeviceBudget {
    let info = engine.info();
    DeviceBudget {
        memory_bytes: info.total_mem_bytes,
        sm_count: Some(info.sm_count),
        sm_granularity: info.green.as_ref().map(|g| g.unit()),
        sm_groups: info.green.as_ref().and_then(|g| g.groups),
        mem_granularity: Some(info.mem_granularity),
    }
}

/// Picks the backend for a choice on this machine, with CUDA device 0 when it is a GPU. `cuda`
/// with no usable GPU is an error. [`Resolved::open_devices`] opens the further devices a job
/// names.
pub fn resolve_backend(
    choice: BackendChoice,
    found: &Discovery,
    opts: &EngineOptions,
) -> Result<Resolved> {
    let cpu = |note: String| Resolved {
        kind: BackendKind::Cpu,
        device: found.host.device_line(),
        note,
        budgets: Budgets::one(DeviceBudget {
            memory_bytes: found.host.memory_bytes,
            sm_count: None,
            sm_granularity: None,
            sm_groups: None,
            mem_granularity: None,
        }),
        engine: None,
        more: Vec::new(),
    };
    if choice == BackendChoice::Cpu {
        return Ok(cpu("backend: cpu (asked for)".into()));
    }
    let cuda =
        cuda::available().and_then(|()| CudaEngine::open(0, opts).map_err(|e| e.to_string()));
    match (choice, cuda) {
        (_, Ok(engine)) => {
            let device = device_words(&engine);
            Ok(Resolved {
                kind: BackendKind::Cuda,
                note: format!("backend: cuda — {device}, {}", engine.info().uuid),
                device,
                budgets: Budgets::one(budget_of(&engine)),
                engine: Some(engine),
                more: Vec::new(),
            })
        }
        (BackendChoice::Cuda, Err(why)) => Err(Error::NoDevice(format!(
            "backend cuda is not usable here: {why}"
        ))),
        (_, Err(why)) => {
            // NVML's reason is the shorter one when there is no driver at all.
            let why = found.no_gpu_reason.clone().unwrap_or(why);
            Ok(cpu(format!(
                "backend: cpu — no usable GPU ({why}); running on the CPU backend"
            )))
        }
    }
}

/// `gpumux devices`: what this machine has, and optionally the slice plan for N trials.
pub fn devices(
    backend: BackendChoice,
    n: Option<u32>,
    split: SplitMode,
    mib_per_slice: Option<f64>,
    fraction: Option<f64>,
    ratios: Option<&[f64]>,
    out: &mut dyn Write,
) -> Result<()> {
    let found = gpu::discover();
    if found.gpus.is_empty() {
        say(
            out,
            format!(
                "GPUs: none ({})",
                found.no_gpu_reason.as_deref().unwrap_or("unknown reason")
            ),
        )?;
    } else {
        if let Some(d) = &found.driver_version {
            say(out, format!("driver {d}"))?;
        }
        for g in &found.gpus {
            let sms = g
                .sm_count
                .map(|s| format!("{s} SMs"))
                .unwrap_or_else(|| "SMs: n/a without CUDA".into());
            say(
                out,
                format!(
                    "GPU {}: {} [{}] {:.0} MiB, {sms}",
                    g.index,
                    g.name,
                    g.uuid,
                    g.memory_bytes as f64 / MIB
                ),
            )?;
        }
    }
    say(out, format!("host: {}", found.host.device_line()))?;
    let r = resolve_backend(backend, &found, &EngineOptions::default())?;
    say(out, r.note.clone())?;
    if let Some(engine) = &r.engine {
        say(out, cuda_device_line(engine.info(), &found))?;
        // The files the CUDA libraries were really bound from, by absolute path.
        for b in gpu::libs::bound() {
            say(out, b.line())?;
        }
        let loading = cuda::module_loading().unwrap_or("unknown");
        let var = std::env::var("CUDA_MODULE_LOADING").unwrap_or_default();
        say(
            out,
            format!("module loading: {loading} (CUDA_MODULE_LOADING={var})"),
        )?;
        if engine.conv_engine() == "gemm" {
            say(
                out,
                "library cudnn: none (convolutions run as im2col kernels and cuBLAS GEMMs)",
            )?;
        }
        // The other devices a job's `slices` may name, described without opening them.
        match cuda::describe_all() {
            Ok(all) => {
                for info in all.iter().filter(|i| i.ordinal != 0) {
                    say(out, cuda_device_line(info, &found))?;
                }
            }
            Err(e) => say(
                out,
                format!("note: cannot list the other CUDA devices: {e}"),
            )?,
        }
    }
    let Some(n) = n else { return Ok(()) };
    let mut memory = String::new();
    if let Some(m) = mib_per_slice {
        memory = format!("memory: {{mib_per_slice: {m}}}\n");
    } else if let Some(f) = fraction {
        memory = format!("memory: {{fraction: {f}}}\n");
    }
    if let Some(r) = ratios {
        let list: Vec<String> = r.iter().map(|x| x.to_string()).collect();
        memory.push_str(&format!("ratios: [{}]\n", list.join(", ")));
    }
    let text = format!(
        "name: devices\nmodel: {{kind: mlp}}\ndata: {{source: synthetic}}\nn: [{n}]\nsplits: [{split}]\n{memory}"
    );
    let job = Job::parse(&text, Path::new("<flags>"))?;
    if split.gpu_only() && r.kind == BackendKind::Cpu {
        say(
            out,
            format!("split {split} needs a GPU; on the CPU backend it is not available"),
        )?;
        return Ok(());
    }
    let slices = plan::slices(&job, n, split, &r.budgets)?;
    let plan_words = match ratios {
        Some(r) => format!(
            "{} unequal slices (ratios {}) for N={n}",
            slices.len(),
            r.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(":")
        ),
        None => format!("N={n}"),
    };
    say(
        out,
        format!("slice plan: {plan_words}, split {split}, on {}", r.device),
    )?;
    for line in crate::parallel::run::slice_table(&slices) {
        say(out, line)?;
    }
    for note in crate::parallel::run::sm_notes(&job, split, r.kind, &slices) {
        say(out, note)?;
    }
    Ok(())
}

/// A CUDA device in one line: what it is, how green contexts split it, and its NVML match.
fn cuda_device_line(i: &cuda::CudaDeviceInfo, found: &Discovery) -> String {
    let nvml = found.gpus.iter().find(|g| g.uuid == i.uuid);
    let green = match &i.green {
        Some(g) => format!(
            "green contexts: partitions of at least {} SMs, aligned to {}; {}",
            g.min_sms,
            g.sm_alignment,
            g.groups.map_or_else(
                || "the driver did not say how many groups it makes".to_string(),
                |n| format!("the driver makes {n} groups of {} SMs", g.unit())
            )
        ),
        None => "green contexts: not supported".into(),
    };
    format!(
        "CUDA device {}: {} [{}], compute capability {}.{}, {} SMs, {:.0} MiB; {green}; NVML match by UUID: {}",
        i.ordinal,
        i.name,
        i.uuid,
        i.compute_capability.0,
        i.compute_capability.1,
        i.sm_count,
        i.total_mem_bytes as f64 / MIB,
        nvml.map(|g| format!("NVML index {}", g.index))
            .unwrap_or_else(|| "none".into())
    )
}

/// Writes one line of a command's output.
pub fn say(out: &mut dyn Write, line: impl std::fmt::Display) -> Result<()> {
    writeln!(out, "{line}").map_err(Error::io("stdout"))
}

/// Loads a job's dataset, saying what was loaded.
pub fn load_data(job: &Job, data_dir: Option<&Path>) -> Result<Arc<Dataset>> {
    let started = Instant::now();
    let data = job.data()?.load(data_dir, job.file.seed)?;
    crate::note!(
        "data: {} — {} train, {} test, {}×{}×{}, {} classes ({:.1} s)",
        data.name,
        data.train.len(),
        data.test.len(),
        data.shape[0],
        data.shape[1],
        data.shape[2],
        data.classes,
        started.elapsed().as_secs_f64()
    );
    Ok(Arc::new(data))
}

/// `gpumux train`: one trial of a job, with loss and accuracy each epoch.
pub fn train(job: &Job, trial: u32, data_dir: Option<&Path>, out: &mut dyn Write) -> Result<()> {
    job.model()?;
    let found = gpu::discover();
    let r = resolve_backend(job.file.backend, &found, &job.engine_options())?;
    crate::note!("{}", r.note);
    let data = load_data(job, data_dir)?;
    check_batch(job, &data, &[trial])?;
    let device = r.device_for(&data)?;
    let spec = plan::trial(job, trial)?;
    // A signal stops the training at its next step (exit 3); the epochs printed stay printed.
    let cancel = Cancel::new();
    if let Err(e) = cancel.on_signals(std::time::Duration::ZERO) {
        crate::note!("note: cannot watch for signals: {e}");
    }
    let cfg = TrialConfig {
        model: job.model()?.clone(),
        hyper: spec.hyper.clone(),
        epochs: job.file.train.epochs,
        seed: spec.seed,
        input: data.shape,
        classes: data.classes,
        fault: spec.fault.clone(),
        engine: job.file.engine.clone(),
        max_steps: None,
        cancel,
    };
    let h = &spec.hyper;
    say(out, format!(
        "trial {}: {} on {}, {} epochs, batch {}, {} lr {}, momentum {}, weight decay {}, dropout {}, seed {}",
        spec.id, job.model()?.kind, data.name, cfg.epochs, h.batch_size, h.optimizer, h.lr, h.momentum, h.weight_decay, h.dropout, spec.seed
    ))?;
    let slice = plan::SliceSpec {
        index: 0,
        device: 0,
        mem_cap_bytes: None,
        sm_count: None,
        partition: None,
    };
    let mut be = sched::open_backend(device.device(0)?, Arc::clone(&data), &slice, None)?;
    let net = crate::models::build(
        &cfg.model,
        cfg.input,
        cfg.classes,
        h.batch_size as usize,
        h.dropout as f32,
        h.optimizer,
        &|s| be.conv_workspace_len(s),
    )
    .map_err(|m| Error::Usage(format!("model: {m}")))?;
    say(out, format!("memory plan: {}", net.plan.summary()))?;
    let mut lines = Vec::new();
    let res = run_trial(be.as_mut(), &cfg, &mut |e| {
        let line = format!(
            "epoch {:>3}  train loss {:.4}  train acc {:.4}  test loss {:.4}  test acc {:.4}  {:.2} s",
            e.epoch, e.train_loss, e.train_acc, e.test_loss, e.test_acc, e.wall_s
        );
        let _ = writeln!(out, "{line}");
        lines.push(line);
    });
    match res {
        Ok(r) => say(out, format!(
            "done: test acc {:.4}, final loss {:.4}, {:.2} s, {:.0} samples/s, {} parameters, arena {:.2} MiB",
            r.test_acc, r.final_loss, r.wall_s, r.samples_per_s, r.param_count, r.peak_mem_bytes as f64 / MIB
        )),
        Err(e) => Err(Error::from_trial(&format!("trial {}", spec.id), e)),
    }
}

/// A batch larger than the training split is a job error, found before anything starts.
fn check_batch(job: &Job, data: &Dataset, trials: &[u32]) -> Result<()> {
    for &i in trials {
        let h = job.hyper(i as usize)?;
        if h.batch_size as usize > data.train.len() {
            let key = if job.file.parameters.contains_key("batch_size") {
                "parameters.batch_size"
            } else {
                "train.batch_size"
            };
            return Err(job
                .invalid(
                    key,
                    format!(
                        "{} is larger than the {} training samples of {}",
                        h.batch_size,
                        data.train.len(),
                        data.name
                    ),
                )
                .into());
        }
    }
    Ok(())
}

/// Options of `gpumux fib` beyond the job.
#[derive(Clone, Debug, Default)]
pub struct FibOptions {
    pub out: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    /// The gpumux executable, for `process` mode.
    pub worker_exe: PathBuf,
    /// The command line, recorded next to the results.
    pub command: String,
    /// Show a progress bar (stderr is a terminal).
    pub progress: bool,
}

/// Why a split mode cannot run with this backend, if it cannot.
fn split_unavailable(mode: SplitMode, r: &Resolved) -> Option<String> {
    match (mode, &r.engine) {
        (SplitMode::Green | SplitMode::Mps, None) => Some("it needs a GPU".into()),
        (SplitMode::Green, Some(_)) if r.without_green().is_some() => r.without_green(),
        (SplitMode::Mps, Some(_)) if !mps_daemon_running() => Some(
            "no MPS control daemon is running (gpumux never starts one; see nvidia-cuda-mps-control)".into(),
        ),
        _ => None,
    }
}

/// Whether an MPS control daemon is listening: its control pipe exists in
/// `$CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`).
pub fn mps_daemon_running() -> bool {
    let dir = std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/nvidia-mps"));
    dir.join("control").exists()
}

/// `gpumux fib`: every round of the job; writes the CSVs row by row, the plots and the summary.
pub fn fib(job: &Job, opts: &FibOptions, out: &mut dyn Write) -> Result<PathBuf> {
    job.model()?;
    // `splits` is read by fib only (parallel and batch-scan take `split`), so it is checked here.
    if job.file.backend == BackendChoice::Cpu {
        if let Some(m) = job.file.splits.iter().find(|m| m.gpu_only()) {
            return Err(Error::Usage(format!(
                "{}: `splits` lists {m}, which needs a GPU, but the job says backend: cpu \
                 (remove {m}, or use backend: auto)",
                job.path.display()
            )));
        }
    }
    let found = gpu::discover();
    let mut r = resolve_backend(job.file.backend, &found, &job.engine_options())?;
    crate::note!("{}", r.note);
    r.open_devices(job)?;
    let mut splits = job.file.splits.clone();
    splits.retain(|m| match split_unavailable(*m, &r) {
        Some(why) => {
            crate::note!("note: skipping split mode {m}: {why}");
            false
        }
        None => true,
    });
    if splits.is_empty() {
        return Err(Error::Usage(
            "no split mode of the job can run on the CPU backend".into(),
        ));
    }
    let data = load_data(job, opts.data_dir.as_deref())?;
    let max_n = job.file.n.iter().copied().max().unwrap_or(1);
    check_batch(job, &data, &(0..max_n).collect::<Vec<_>>())?;
    let rounds = plan::rounds(job, &r.budgets, &splits)?;
    let dir = opts
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("out").join(&job.name));
    let _lock = crate::outdir::lock(&dir)?;
    // Earlier results are replaced, but only results that read: anything else is refused
    // (exit 2) and left as it is.
    if dir.join(report::TRIALS_CSV).exists() {
        report::read_dir(&dir)?;
        crate::note!("note: replacing the earlier results in {}", dir.display());
    }
    let mut writer = report::ReportWriter::create(&dir)?;
    crate::outdir::replace_bytes(
        &dir.join("command.txt"),
        format!(
            "{}\n# gpumux {}, device: {}\n",
            opts.command,
            env!("CARGO_PKG_VERSION"),
            r.device
        )
        .as_bytes(),
    )?;
    // A signal stops the experiment: running trials end as INTERRUPTED, the round is not
    // recorded (its makespan would be wrong), and gpumux exits with code 3.
    let cancel = Cancel::new();
    if let Err(e) = cancel.on_signals(std::time::Duration::ZERO) {
        crate::note!("note: cannot watch for signals: {e}");
    }
    let ctx = builtin_context(
        job,
        &data,
        &r,
        opts.data_dir.as_deref(),
        &opts.worker_exe,
        &cancel,
    )?;
    let total: u64 = rounds.iter().map(|r| r.n as u64).sum();
    crate::note!(
        "{}: {} rounds ({} trials) of {} on {}, N = {:?}, splits {}; writing {}",
        job.name,
        rounds.len(),
        total,
        job.model()?.kind,
        data.name,
        job.file.n,
        splits
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", "),
        dir.display()
    );
    let bar = if opts.progress {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} trials  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut runs = Vec::new();
    let mut trials = Vec::new();
    for round in &rounds {
        let mut states = StateCounts {
            queued: round.n,
            ..Default::default()
        };
        bar.set_message(states.line(round));
        let mut write_err = None;
        // NVML samples the device at 20 Hz while the round runs (GPU only).
        let sampler = r.engine.as_ref().and_then(|e| {
            Sampler::start(&e.info().uuid, 20.0)
                .map_err(|why| crate::note!("note: no telemetry for this round: {why}"))
                .ok()
        });
        let outcome = sched::run_round(round, &ctx, &mut |ev| {
            let res = match ev {
                Event::Started { .. } => {
                    states.queued -= 1;
                    states.running += 1;
                    bar.set_message(states.line(round));
                    Ok(())
                }
                Event::Epoch { trial, stats, .. } => {
                    writer.progress(&progress_row(round, &trial.id, stats))
                }
                Event::Finished(o) => {
                    bar.inc(1);
                    states.running -= 1;
                    match o.state() {
                        TrialState::Complete => states.complete += 1,
                        _ => states.failed += 1,
                    }
                    bar.set_message(states.line(round));
                    let row = trial_row(job, round.index, round.split, round.n, o);
                    let res = writer.trial(&row);
                    trials.push(row);
                    res
                }
            };
            if let Err(e) = res {
                write_err.get_or_insert(e);
            }
        });
        if let Some(e) = write_err {
            return Err(e.into());
        }
        let telemetry = sampler.map(Sampler::stop).unwrap_or_default();
        if cancel.draining() {
            bar.finish_and_clear();
            return Err(Error::Interrupted(format!(
                "stopped during round {} (N={} {}); {} rounds recorded in {}",
                round.index,
                round.n,
                round.split,
                runs.len(),
                dir.display()
            )));
        }
        let row = run_row(job, round, &outcome, &data, &r, &telemetry);
        writer.run(&row)?;
        bar.println(format!(
            "round {:>3}: N={:<3} {:<8} makespan {:>8.2} s  time/training {:>7.3} s  ok {}  failed {}",
            round.index, round.n, round.split.name(), row.makespan_s, row.time_per_training_s, row.ok, row.failed
        ));
        if !opts.progress {
            crate::note!(
                "round {}/{}: N={} {} makespan {:.2} s, time per training {:.3} s, ok {}, failed {}",
                round.index + 1,
                rounds.len(),
                round.n,
                round.split,
                row.makespan_s,
                row.time_per_training_s,
                row.ok,
                row.failed
            );
        }
        runs.push(row);
    }
    bar.finish_and_clear();
    finish(&dir, &runs, &trials, out)?;
    let ok: u32 = runs.iter().map(|r| r.ok).sum();
    if ok == 0 && !runs.is_empty() {
        return Err(Error::TrialsFailed(format!(
            "every trial failed ({total} of {total}); trials.csv in {} gives each one's reason",
            dir.display()
        )));
    }
    Ok(dir)
}

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

/// How many trials of a round are in each state, for the progress line.
#[derive(Default)]
struct StateCounts {
    queued: u32,
    running: u32,
    complete: u32,
    failed: u32,
}

impl StateCounts {
    fn line(&self, round: &Round) -> String {
        format!(
            "N={} {}: {} QUEUED, {} RUNNING, {} COMPLETE, {} FAIL",
            round.n, round.split, self.queued, self.running, self.complete, self.failed
        )
    }
}

fn finish(dir: &Path, runs: &[RunRow], trials: &[TrialRow], out: &mut dyn Write) -> Result<()> {
    let paths = report::write_report(dir, runs, trials)?;
    let text = report::summary_text(runs, trials);
    write!(out, "{text}").map_err(Error::io("stdout"))?;
    say(out, format!("results: {}", dir.display()))?;
    print_paths(&paths, out)
}

fn print_paths(paths: &report::ReportPaths, out: &mut dyn Write) -> Result<()> {
    for p in [&paths.time_per_training, &paths.samples_per_s]
        .into_iter()
        .flatten()
        .chain([&paths.summary])
    {
        say(out, format!("wrote {}", p.display()))?;
    }
    if paths.time_per_training.is_none() {
        say(out, "no charts: no round completed a trial")?;
    }
    Ok(())
}

/// The model column of a job's rows: the built-in kind, or `external`.
pub fn model_name(job: &Job) -> String {
    job.file
        .model
        .as_ref()
        .map_or_else(|| "external".to_string(), |m| m.kind.to_string())
}

/// What the workers of a built-in model's rounds share: the dataset (on the device too, on a
/// GPU), how a child process finds it again, the model and the engine options.
pub fn builtin_context(
    job: &Job,
    data: &Arc<Dataset>,
    r: &Resolved,
    data_dir: Option<&Path>,
    worker_exe: &Path,
    cancel: &Cancel,
) -> Result<RoundContext> {
    Ok(RoundContext {
        data: Arc::clone(data),
        data_spec: job.data()?.clone(),
        data_base: data_dir.map(Path::to_path_buf),
        data_seed: job.file.seed,
        model: job.model()?.clone(),
        epochs: job.file.train.epochs,
        engine: job.file.engine.clone(),
        devices: r.device_for(data)?,
        worker_exe: worker_exe.to_path_buf(),
        cancel: cancel.clone(),
        max_steps: None,
        external: None,
        metric: None,
    })
}

/// The `progress.csv` row of one trial's epoch in a round.
pub fn progress_row(
    round: &Round,
    trial_id: &str,
    stats: &crate::train::EpochStats,
) -> ProgressRow {
    ProgressRow {
        round: round.index,
        trial_id: trial_id.to_string(),
        split: round.split.to_string(),
        n: round.n,
        epoch: stats.epoch,
        train_loss: stats.train_loss,
        train_acc: stats.train_acc,
        test_loss: stats.test_loss,
        test_acc: stats.test_acc,
        wall_s: stats.wall_s,
    }
}

/// The `trials.csv` row of a trial that ended in round `round` (N trials under `split`).
pub fn trial_row(job: &Job, round: u32, split: SplitMode, n: u32, o: &TrialOutcome) -> TrialRow {
    let h = &o.trial.hyper;
    let r = o.result();
    let metric = |name: &str| r.and_then(|r| r.metrics.get(name).copied());
    TrialRow {
        trial_id: o.trial.id.clone(),
        round,
        split: split.to_string(),
        n,
        slice: o.slice.index,
        model: model_name(job),
        params_lr: h.lr,
        params_batch_size: h.batch_size,
        params_optimizer: h.optimizer.to_string(),
        params_momentum: h.momentum,
        params_weight_decay: h.weight_decay,
        params_dropout: h.dropout,
        seed: o.trial.seed,
        state: o.state().name().to_string(),
        test_acc: metric("test_acc"),
        final_loss: metric("final_loss"),
        epochs: r.map(|r| r.epochs).unwrap_or(0),
        wall_s: o.wall_s,
        samples_per_s: r.map(|r| r.samples_per_s).filter(|x| *x > 0.0),
        peak_mem_mib: r
            .map(|r| r.peak_mem_bytes as f64 / MIB)
            .filter(|x| *x > 0.0),
        mem_cap_mib: o.slice.cap_mib(),
        error: o.error().unwrap_or_default(),
        metric: metric(&job.file.metric.name),
        params: serde_json::to_string(&o.trial.params).unwrap_or_default(),
    }
}

fn run_row(
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

/// `gpumux report`: redraws plots and the summary from result folders, merging several into `out`.
pub fn report(dirs: &[PathBuf], out_dir: Option<&Path>, out: &mut dyn Write) -> Result<()> {
    if dirs.is_empty() {
        return Err(Error::Usage("give at least one result folder".into()));
    }
    let target = match (out_dir, dirs) {
        (Some(o), _) => o.to_path_buf(),
        (None, [one]) => one.clone(),
        (None, _) => {
            return Err(Error::Usage(
                "merging several folders needs --out DIR".into(),
            ))
        }
    };
    // A missing folder is said as such (exit 2) before any folder is made or locked.
    for d in dirs {
        std::fs::metadata(d).map_err(|source| crate::error::ReportError::Read {
            path: d.clone(),
            source,
        })?;
    }
    // The folder written is held from before the reading, as every writing command does.
    let _lock = crate::outdir::lock(&target)?;
    let (runs, trials, progress) = report::merge_dirs(dirs)?;
    if out_dir.is_some() {
        report::write_merged(&target, &runs, &trials, &progress)?;
    }
    let paths = report::write_report(&target, &runs, &trials)?;
    write!(out, "{}", report::summary_text(&runs, &trials)).map_err(Error::io("stdout"))?;
    print_paths(&paths, out)
}

/// `gpumux worker`: the child side of `process` mode.
pub fn worker() -> Result<()> {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    sched::process::worker_main(&mut stdin.lock(), &mut stdout.lock()).map_err(Error::Usage)
}

/// Split modes, parsed from a comma list.
pub fn parse_splits(s: &str) -> std::result::Result<Vec<SplitMode>, String> {
    s.split(',').map(|p| p.trim().parse()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(index: u32, sm: Option<u32>, mib: Option<u64>) -> SliceSpec {
        SliceSpec {
            index,
            device: 0,
            mem_cap_bytes: mib.map(|m| m << 20),
            sm_count: sm,
            partition: sm.map(|_| index),
        }
    }

    #[test]
    fn unequal_slices_are_listed_and_averaged_in_runs_csv() {
        let unequal = [
            slice(0, Some(80), Some(30_000)),
            slice(1, Some(48), Some(20_000)),
        ];
        assert_eq!(slice_plan(&unequal), "80sm/30000MiB;48sm/20000MiB");
        assert_eq!(mean_of(&unequal, |s| s.sm_count.map(f64::from)), Some(64.0));
        assert_eq!(mean_of(&unequal, SliceSpec::cap_mib), Some(25_000.0));
        let equal = [slice(0, None, Some(100)), slice(1, None, Some(100))];
        assert_eq!(slice_plan(&equal), "");
        assert_eq!(mean_of(&equal, |s| s.sm_count.map(f64::from)), None);
        let mixed = [slice(0, None, Some(100)), slice(1, None, None)];
        assert_eq!(slice_plan(&mixed), "100MiB;uncapped");
        let spread = [
            slice(0, Some(64), Some(100)),
            SliceSpec {
                device: 1,
                ..slice(1, Some(64), Some(100))
            },
        ];
        assert_eq!(slice_plan(&spread), "d0:64sm/100MiB;d1:64sm/100MiB");
        let moved = [SliceSpec {
            device: 2,
            ..slice(0, None, Some(100))
        }];
        assert_eq!(slice_plan(&moved), "d2:100MiB");
    }
}
