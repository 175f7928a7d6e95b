//! The supervisor: a crossbeam queue of trials, one worker per slice (a thread, or a thread minding a child process), and the trial lifecycle.

pub mod child;
pub mod end;
pub mod external;
pub mod group;
pub mod lines;
pub mod metric_line;
pub mod process;
pub mod queue;
pub mod reap;
pub mod signals;
pub mod template;
pub mod thread;
pub mod watchdog;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, RecvTimeoutError, Sender};

use crate::data::{DataSpec, Dataset};
use crate::engine::cpu::CpuBackend;
use crate::engine::cuda::{CudaEngine, DeviceData, GreenPartition};
use crate::engine::{Backend, BackendKind};
use crate::error::EngineError;
use crate::job::{EngineOptions, ModelSpec, SplitMode};
use crate::plan::{PerDevice, Round, SliceSpec, TrialSpec};
use crate::train::{EpochStats, Prune, TrialConfig, TrialResult};
pub use end::{Failure, Stop, TrialEnd};
use queue::TrialQueue;

/// Where a trial is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum TrialState {
    Queued,
    Running,
    Complete,
    Fail,
    /// Stopped by a signal before it ended; `--resume` runs it again.
    Interrupted,
    /// Stopped early by the sweep's early termination; done, like COMPLETE.
    Pruned,
}

impl TrialState {
    pub fn name(&self) -> &'static str {
        match self {
            TrialState::Queued => "QUEUED",
            TrialState::Running => "RUNNING",
            TrialState::Complete => "COMPLETE",
            TrialState::Fail => "FAIL",
            TrialState::Interrupted => "INTERRUPTED",
            TrialState::Pruned => "PRUNED",
        }
    }
}

/// How a trial ended, where it ran, and for how long.
#[derive(Clone, Debug)]
pub struct TrialOutcome {
    pub trial: TrialSpec,
    pub slice: SliceSpec,
    pub end: TrialEnd,
    pub wall_s: f64,
}

impl TrialOutcome {
    /// The state word of its end: COMPLETE, FAIL or INTERRUPTED.
    pub fn state(&self) -> TrialState {
        match self.end {
            TrialEnd::Complete(_) => TrialState::Complete,
            TrialEnd::Failed(_) => TrialState::Fail,
            TrialEnd::Interrupted => TrialState::Interrupted,
            TrialEnd::Pruned(_) => TrialState::Pruned,
        }
    }

    /// What a COMPLETE trial measured, or what a PRUNED one reached.
    pub fn result(&self) -> Option<&TrialResult> {
        match &self.end {
            TrialEnd::Complete(r) | TrialEnd::Pruned(r) => Some(r),
            _ => None,
        }
    }

    /// Why it did not complete, in words (the `error` column).
    pub fn error(&self) -> Option<String> {
        match &self.end {
            TrialEnd::Complete(_) => None,
            TrialEnd::Pruned(r) => Some(format!("pruned at epoch {}", r.epochs)),
            TrialEnd::Failed(f) => Some(f.to_string()),
            TrialEnd::Interrupted => Some("interrupted".into()),
        }
    }
}

/// What the supervisor reports while a round runs, in the order it happens.
#[derive(Clone, Debug)]
pub enum Event {
    Started {
        trial: TrialSpec,
        slice: u32,
    },
    Epoch {
        trial: TrialSpec,
        slice: u32,
        stats: EpochStats,
    },
    Finished(Box<TrialOutcome>),
    /// A line an external trial printed, on stdout or stderr, as it would show on a terminal
    /// (see [`metric_line::shown`]); sent only when [`ExternalTrials::stream`] is set.
    Output {
        trial_id: String,
        line: String,
    },
}

/// What a round's trials train: a built-in model on a dataset of ours, or a job's own command.
#[derive(Clone, Debug)]
pub enum Workload {
    Builtin(BuiltinWork),
    /// One process of the job's command per trial.
    External(ExternalTrials),
}

/// A built-in model's trials: the model, its dataset, and how a child process finds the same.
#[derive(Clone, Debug)]
pub struct BuiltinWork {
    /// The dataset, loaded once per process and shared read-only by its trials.
    pub data: Arc<Dataset>,
    /// How a child process finds the same dataset.
    pub data_spec: DataSpec,
    pub data_base: Option<PathBuf>,
    pub data_seed: u64,
    pub model: ModelSpec,
    pub epochs: u32,
    pub engine: crate::job::EngineOptions,
}

/// Everything a worker needs besides its trial and slice.
#[derive(Clone, Debug)]
pub struct RoundContext {
    /// What the trials train.
    pub work: Workload,
    /// Where the trials run, by device number (for `process` mode: which backend each child opens).
    pub devices: Devices,
    /// The gpumux executable that child processes run as `gpumux worker`.
    pub worker_exe: PathBuf,
    /// Draining stops workers taking new trials; aborting stops running ones.
    pub cancel: signals::Cancel,
    /// Short probes: at most this many steps per epoch.
    pub max_steps: Option<usize>,
    /// A warm-up round: its trials evaluate once after their capped steps (see
    /// [`TrialConfig::warm_up`]).
    pub warm_up: bool,
    /// The metric every COMPLETE trial must report (a sweep's `metric.name`): a trial whose
    /// result has no finite value for it fails. `None` checks nothing (probes, `fib`).
    pub metric: Option<String>,
    /// A sweep's early termination, asked after each epoch of each trial; `None` prunes none.
    pub prune: Option<Pruning>,
}

/// A sweep's early termination as the supervisor sees it: given a trial and one epoch's
/// figures, whether the trial stops there (it ends PRUNED).
#[derive(Clone)]
pub struct Pruning(pub Arc<PruneRule>);

/// Whether a trial stops after an epoch with these figures.
pub type PruneRule = dyn Fn(&TrialSpec, &EpochStats) -> bool + Send + Sync;

impl Pruning {
    /// The rule for one trial, as its training loop asks it.
    pub fn for_trial(&self, trial: &TrialSpec) -> Prune {
        let (rule, trial) = (Arc::clone(&self.0), trial.clone());
        Prune::new(Arc::new(move |stats: &EpochStats| rule(&trial, stats)))
    }
}

impl std::fmt::Debug for Pruning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pruning")
    }
}

/// An external command run for each trial, and where it runs.
#[derive(Clone, Debug)]
pub struct ExternalTrials {
    pub template: String,
    /// The job's `program` (W&B), for `${program}`.
    pub program: Option<String>,
    /// The names of the sweep's own parameters, which `${args}` and its kin pass.
    pub swept: Vec<String>,
    /// The folder of the trials' own folders: `{out_dir}` is `<trials_dir>/<trial id>`.
    pub trials_dir: PathBuf,
    /// Where a trial runs, by the device of its slice.
    pub envs: PerDevice<external::ExternalEnv>,
    /// Pass every line the trials print (stdout and stderr) on as an [`Event::Output`] as it
    /// comes; otherwise only stderr's last lines are kept, for the message of a failure.
    pub stream: bool,
}

impl ExternalTrials {
    /// The environment of a trial on device `number`, or why there is none.
    pub fn env_for(&self, number: u32) -> Result<&external::ExternalEnv, String> {
        self.envs.get(number).ok_or_else(|| not_opened(number))
    }
}

/// Why a slice on device `number` has nothing to run on.
fn not_opened(number: u32) -> String {
    format!("device {number} was not opened for this run")
}

impl RoundContext {
    /// The built-in model's trials, when they are what the round trains.
    pub fn builtin(&self) -> Option<&BuiltinWork> {
        match &self.work {
            Workload::Builtin(b) => Some(b),
            Workload::External(_) => None,
        }
    }

    /// [`RoundContext::builtin`], to change (a warm-up's or a probe's epochs).
    pub fn builtin_mut(&mut self) -> Option<&mut BuiltinWork> {
        match &mut self.work {
            Workload::Builtin(b) => Some(b),
            Workload::External(_) => None,
        }
    }

    /// The external command's trials, when they are what the round trains.
    pub fn external(&self) -> Option<&ExternalTrials> {
        match &self.work {
            Workload::External(e) => Some(e),
            Workload::Builtin(_) => None,
        }
    }

    /// [`RoundContext::external`], to change (whether its lines are shown).
    pub fn external_mut(&mut self) -> Option<&mut ExternalTrials> {
        match &mut self.work {
            Workload::External(e) => Some(e),
            Workload::Builtin(_) => None,
        }
    }

    /// How `split` runs this round's trials: chosen once per round, from what they train.
    fn worker_kind(&self, split: SplitMode) -> WorkerKind<'_> {
        match &self.work {
            Workload::External(e) => WorkerKind::Command(e),
            Workload::Builtin(b) if split.one_process_per_trial() => WorkerKind::Process(b),
            Workload::Builtin(b) if split == SplitMode::Fused => WorkerKind::Fused(b),
            Workload::Builtin(b) => WorkerKind::Thread(b),
        }
    }
}

/// How a round's trials run: one process of the job's command each, one `gpumux worker`
/// process each, in threads, or in fused groups on threads.
#[derive(Clone, Copy)]
enum WorkerKind<'a> {
    Command(&'a ExternalTrials),
    Process(&'a BuiltinWork),
    Thread(&'a BuiltinWork),
    Fused(&'a BuiltinWork),
}

impl BuiltinWork {
    /// The configuration of one trial of the round `ctx`.
    pub fn config(&self, ctx: &RoundContext, trial: &TrialSpec) -> TrialConfig {
        TrialConfig {
            model: self.model.clone(),
            hyper: trial.hyper.clone(),
            epochs: self.epochs,
            seed: trial.seed,
            input: self.data.shape,
            classes: self.data.classes,
            fault: trial.fault.clone(),
            engine: self.engine.clone(),
            max_steps: ctx.max_steps,
            warm_up: ctx.warm_up,
            cancel: ctx.cancel.clone(),
            prune: ctx.prune.as_ref().map(|p| p.for_trial(trial)),
        }
    }
}

/// A round's result: how long it took from launch to the last trial's end, and every trial's outcome.
#[derive(Clone, Debug)]
pub struct RoundOutcome {
    pub makespan_s: f64,
    pub outcomes: Vec<TrialOutcome>,
}

/// Where trials run: the host, or a CUDA device with the dataset resident on it.
#[derive(Clone)]
pub enum Device {
    Cpu,
    Cuda {
        engine: Arc<CudaEngine>,
        /// The dataset, uploaded once per process and shared read-only by its trials.
        data: Arc<DeviceData>,
    },
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("Device::Cpu"),
            Device::Cuda { engine, .. } => write!(f, "Device::Cuda({})", engine.info().name),
        }
    }
}

impl Device {
    /// Opens a device for this process: on CUDA, the engine of device `number` (among those
    /// visible) and the dataset uploaded once. The CPU backend has device 0 only.
    pub fn open(
        kind: BackendKind,
        number: u32,
        data: &Dataset,
        opts: &EngineOptions,
    ) -> Result<Device, EngineError> {
        match kind {
            BackendKind::Cpu if number == 0 => Ok(Device::Cpu),
            BackendKind::Cpu => Err(EngineError::Unavailable {
                backend: "cpu".into(),
                reason: format!("the CPU backend has device 0 only, not device {number}"),
            }),
            BackendKind::Cuda => {
                let engine = CudaEngine::open(number as usize, opts)?;
                let data = engine.upload(data)?;
                Ok(Device::Cuda { engine, data })
            }
        }
    }

    pub fn kind(&self) -> BackendKind {
        match self {
            Device::Cpu => BackendKind::Cpu,
            Device::Cuda { .. } => BackendKind::Cuda,
        }
    }
}

/// The devices a run's slices sit on, by number: device 0 always, and the further CUDA devices
/// its slice plan names.
pub type Devices = PerDevice<Device>;

impl PerDevice<Device> {
    /// Device `number`, or why it is not there.
    pub fn device(&self, number: u32) -> Result<&Device, EngineError> {
        self.get(number).ok_or_else(|| EngineError::Unavailable {
            backend: self.kind().to_string(),
            reason: not_opened(number),
        })
    }

    pub fn kind(&self) -> BackendKind {
        self.first.kind()
    }
}

/// Creates the engine for one trial on one slice, on the slice's device (in its green partition
/// when it has one).
pub fn open_backend(
    device: &Device,
    data: Arc<Dataset>,
    slice: &SliceSpec,
    partition: Option<Arc<GreenPartition>>,
) -> Result<Box<dyn Backend>, EngineError> {
    match device {
        Device::Cpu => Ok(Box::new(CpuBackend::new(data, slice.mem_cap_bytes))),
        Device::Cuda { engine, data } => {
            engine.backend(Arc::clone(data), slice.mem_cap_bytes, partition)
        }
    }
}

/// The green partitions of `slices` under `split`: on each CUDA device, one green context per
/// distinct partition of the slices on it, sized as the plan says. Indexed by partition number;
/// empty unless `split` is green on a GPU.
pub fn partitions(
    split: SplitMode,
    slices: &[SliceSpec],
    devices: &Devices,
) -> Result<Vec<Option<Arc<GreenPartition>>>, String> {
    if split != SplitMode::Green {
        return Ok(Vec::new());
    }
    let mut out: Vec<Option<Arc<GreenPartition>>> = Vec::new();
    for (number, device) in devices.all() {
        let Device::Cuda { engine, .. } = device else {
            continue;
        };
        let (ids, sizes) = partition_sizes(slices, number);
        if ids.is_empty() {
            continue;
        }
        let made = green_partitions(engine, &sizes).map_err(|e| {
            if devices.more.is_empty() {
                e
            } else {
                format!("device {number}: {e}")
            }
        })?;
        for (id, part) in ids.into_iter().zip(made) {
            let at = id as usize;
            if out.len() <= at {
                out.resize(at + 1, None);
            }
            out[at] = Some(part);
        }
    }
    Ok(out)
}

/// The partitions of the slices on device `number`, in increasing order, and the SMs of each
/// (those of its first slice: an unequal plan gives each slice its own partition and size).
fn partition_sizes(slices: &[SliceSpec], number: u32) -> (Vec<u32>, Vec<u32>) {
    let mut ids: Vec<u32> = slices
        .iter()
        .filter(|s| s.device == number)
        .filter_map(|s| s.partition)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let sizes = ids
        .iter()
        .map(|&p| {
            slices
                .iter()
                .find(|s| s.partition == Some(p))
                .and_then(|s| s.sm_count)
                .unwrap_or(0)
        })
        .collect();
    (ids, sizes)
}

/// The partition a slice runs in, when it has one.
pub fn partition_of(
    parts: &[Option<Arc<GreenPartition>>],
    slice: &SliceSpec,
) -> Option<Arc<GreenPartition>> {
    slice
        .partition
        .and_then(|p| parts.get(p as usize).cloned().flatten())
}

/// Green partitions of these sizes: equal ones in one split, unequal ones one at a time.
pub fn green_partitions(
    engine: &CudaEngine,
    sizes: &[u32],
) -> Result<Vec<Arc<GreenPartition>>, String> {
    let count = sizes.len() as u32;
    let sms = sizes.first().copied().unwrap_or(0);
    if sizes.iter().all(|&s| s == sms) {
        return engine
            .green_partitions(count, sms)
            .map_err(|e| format!("cannot create {count} green partitions of {sms} SMs: {e}"));
    }
    let list: Vec<String> = sizes.iter().map(u32::to_string).collect();
    engine.green_partitions_sized(sizes).map_err(|e| {
        format!(
            "cannot create green partitions of {} SMs: {e}",
            list.join(", ")
        )
    })
}

/// Trial events queued between the workers and the thread that records them, at most: a worker
/// that gets ahead (an external command flooding its stdout with epoch lines) waits, and so does
/// the command, on its pipe. Memory stays bounded whatever the trials print.
pub const EVENT_QUEUE: usize = 256;

/// How long the recording thread waits for an event before it calls its `idle` (see
/// [`run_round_with`]) again.
pub const IDLE_TICK: Duration = Duration::from_millis(100);

/// Runs a round: queues its trials, starts one worker per slice, and passes every event to `sink`
/// on the calling thread as it happens. Returns when every trial has ended.
pub fn run_round(round: &Round, ctx: &RoundContext, sink: &mut dyn FnMut(&Event)) -> RoundOutcome {
    run_round_with(round, ctx, sink, &mut || {})
}

/// [`run_round`], calling `idle` on the calling thread whenever no event is waiting: after the
/// events queued have all gone to `sink`, and every [`IDLE_TICK`] while none comes. A sink that
/// defers work (an fsync of rows written in a burst) does it then.
///
/// At most [`EVENT_QUEUE`] events wait between the workers and `sink`: a worker waits for room.
/// Neither `sink` nor `idle` may wait on a worker (they never do: they write rows and may
/// abort the round), so the workers always get their room back.
pub fn run_round_with(
    round: &Round,
    ctx: &RoundContext,
    sink: &mut dyn FnMut(&Event),
    idle: &mut dyn FnMut(),
) -> RoundOutcome {
    run_round_core(round, ctx, sink, idle, None)
}

/// What hands a fed round its trials: `feed(None)` for each of the first, and
/// `feed(Some(outcome))` after each trial ends; `None` back means no more.
pub type Feed<'a> = &'a mut dyn FnMut(Option<&TrialOutcome>) -> Option<TrialSpec>;

/// [`run_round_with`] for trials not known in advance (a sampler proposing each from the
/// results so far): `round.trials` is not read; the queue starts with one trial from
/// `feed(None)` per slice, and each trial's end is passed to `feed`, whose answer is queued
/// next. Once `feed` answers `None`, or the round drains, nothing more is queued.
pub fn run_round_fed(
    round: &Round,
    ctx: &RoundContext,
    sink: &mut dyn FnMut(&Event),
    idle: &mut dyn FnMut(),
    feed: Feed,
) -> RoundOutcome {
    run_round_core(round, ctx, sink, idle, Some(feed))
}

fn run_round_core(
    round: &Round,
    ctx: &RoundContext,
    sink: &mut dyn FnMut(&Event),
    idle: &mut dyn FnMut(),
    mut feed: Option<Feed>,
) -> RoundOutcome {
    let kind = ctx.worker_kind(round.split);
    // Fused groups refill their freed slots from a queue of single trials when trials are
    // proposed one by one or pruned: the groups stay full.
    let refill = group::refill_width(round, ctx, feed.is_some() || ctx.prune.is_some());
    let queue = TrialQueue::new(refill.is_some(), feed.is_some());
    match feed.as_mut() {
        None => {
            match refill {
                // Compatible trials one after another, as the groups would take them.
                Some(_) => group::queued(round, ctx)
                    .into_iter()
                    .flatten()
                    .for_each(|t| queue.push(vec![t])),
                None => group::queued(round, ctx)
                    .into_iter()
                    .for_each(|g| queue.push(g)),
            }
            queue.close();
        }
        Some(feed) => {
            // One trial per slice, or a whole group per slice.
            let first = round.slices.len().max(1) * refill.unwrap_or(1);
            for _ in 0..first {
                match feed(None) {
                    Some(t) => queue.push(vec![t]),
                    None => {
                        queue.close();
                        break;
                    }
                }
            }
        }
    };
    let (event_tx, event_rx) = bounded::<Event>(EVENT_QUEUE);
    let started = Instant::now();
    let mut outcomes = Vec::new();
    let mut makespan_s = 0.0;
    let parts = partitions(round.split, &round.slices, &ctx.devices);
    std::thread::scope(|s| {
        for slice in &round.slices {
            let queue = &queue;
            let events = event_tx.clone();
            let part = match &parts {
                Ok(p) => Ok(partition_of(p, slice)),
                Err(e) => Err(e.clone()),
            };
            s.spawn(move || {
                let finish = |mut outcome: TrialOutcome| {
                    outcome.end =
                        require_metric(outcome.end, ctx.metric.as_deref()).settle(&ctx.cancel);
                    queue.owe();
                    let _ = events.send(Event::Finished(Box::new(outcome)));
                };
                // A group not started stays queued, all its members: a resumed run picks them up.
                while let Some(mut group) = queue.recv() {
                    if ctx.cancel.draining() {
                        break;
                    }
                    // Only `fused` queues groups of several, or refills (built-in trials, in
                    // threads).
                    if let (WorkerKind::Fused(work), Ok(p), Some(first)) =
                        (kind, &part, group.first())
                    {
                        if group.len() > 1 || queue.refills() {
                            let key = crate::train::group_key(&work.config(ctx, first));
                            let fits = |t: &TrialSpec| {
                                crate::train::group_key(&work.config(ctx, t)) == key
                            };
                            let width = refill.unwrap_or(group.len()).max(group.len());
                            while group.len() < width {
                                match queue.take_if(&fits) {
                                    Some(t) => group.push(t),
                                    None => break,
                                }
                            }
                            for t in &group {
                                started_event(&events, t, slice.index);
                            }
                            let flow = thread::GroupFlow {
                                queue,
                                fits: &fits,
                                finish: &finish,
                            };
                            thread::run_group(
                                ctx,
                                work,
                                slice,
                                p.clone(),
                                group,
                                width,
                                &events,
                                flow,
                            );
                            continue;
                        }
                    }
                    for trial in group {
                        started_event(&events, &trial, slice.index);
                        finish(match (&part, kind) {
                            (Err(e), _) => {
                                outcome(trial, slice, Err(Failure::NoSlice(e.clone()).into()), 0.0)
                            }
                            (Ok(_), WorkerKind::Command(ext)) => {
                                run_external(ctx, ext, slice, round, trial, &events)
                            }
                            (Ok(_), WorkerKind::Process(work)) => {
                                process::run(ctx, work, slice, round, trial, &events)
                            }
                            (Ok(p), WorkerKind::Thread(work) | WorkerKind::Fused(work)) => {
                                thread::run(ctx, work, slice, p.clone(), trial, &events)
                            }
                        });
                    }
                }
            });
        }
        drop(event_tx);
        let mut open = feed.is_some();
        loop {
            if open && ctx.cancel.draining() {
                queue.close();
                open = false;
            }
            let ev = match event_rx.recv_timeout(IDLE_TICK) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => {
                    idle();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            // The sink records an end before the feed is asked for the next trial: a feed that
            // reads the results (a study's store) sees it.
            sink(&ev);
            if let Event::Finished(o) = &ev {
                outcomes.push((**o).clone());
                if outcomes.len() == round.trials.len() {
                    makespan_s = started.elapsed().as_secs_f64();
                }
                if let Some(feed) = feed.as_mut() {
                    // Every end reported in a fed round is answered: the next trial, or none.
                    // Nothing is asked for once the round drains (a store would hand out a
                    // trial that never runs).
                    let next = match open && !ctx.cancel.draining() {
                        true => feed(Some(o)),
                        false => None,
                    };
                    match next {
                        Some(t) if !ctx.cancel.draining() => queue.answer(Some(t)),
                        _ => {
                            queue.answer(None);
                            if open {
                                queue.close();
                                open = false;
                            }
                        }
                    }
                }
            }
            if event_rx.is_empty() {
                idle();
            }
        }
    });
    if feed.is_some() || outcomes.len() < round.trials.len() {
        makespan_s = started.elapsed().as_secs_f64();
    }
    outcomes.sort_by_key(|o| o.trial.index);
    RoundOutcome {
        makespan_s,
        outcomes,
    }
}

/// Runs a trial as its external command; epoch lines it prints (see [`metric_line`]) become progress rows,
/// one per epoch, in increasing order (see the comment on `last_epoch`).
fn run_external(
    ctx: &RoundContext,
    ext: &ExternalTrials,
    slice: &SliceSpec,
    round: &Round,
    trial: TrialSpec,
    events: &Sender<Event>,
) -> TrialOutcome {
    let started = Instant::now();
    let env = match ext.env_for(slice.device) {
        // Every slice of the round runs a trial at once: they share the host's cores.
        Ok(e) => e.shared_by(round.slices.len().try_into().unwrap_or(u32::MAX)),
        Err(why) => return outcome(trial, slice, Err(Failure::NoSlice(why).into()), 0.0),
    };
    // The epochs the trial reported: its epoch lines passed on.
    let mut reported: u32 = 0;
    // The trial's own stop: early termination ends this command alone, as a signal would.
    let stop = ctx.cancel.child();
    let prune = ctx.prune.as_ref().map(|p| p.for_trial(&trial));
    let mut pruned: Option<EpochStats> = None;
    // A command stopped at a rung may have trained its last epoch there: it is given
    // PRUNE_GRACE to end on its own (COMPLETE), and stopped (PRUNED) at its next epoch line or
    // when the grace is over, whichever comes first. `sent`: the stop came from here.
    let sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_now = |stop: &crate::cancel::Cancel| {
        sent.store(true, std::sync::atomic::Ordering::SeqCst);
        stop.abort();
    };
    // Stderr is read on a thread of its own: it reaches the events through this, until the
    // trial is over (a reader that outlives its trial must not hold the round open).
    let relay = Arc::new(std::sync::Mutex::new(ext.stream.then(|| events.clone())));
    let res = external::command(ext, &trial, slice)
        .map_err(Stop::from)
        .and_then(|argv| {
            // Epochs go up: a line whose epoch is not above the last one passed on (the same
            // epoch printed twice, or an earlier one) is not a new epoch, and is dropped.
            let mut last_epoch: Option<u32> = None;
            let on_stderr: Option<child::OnStderr> = ext.stream.then(|| {
                let relay = Arc::clone(&relay);
                let id = trial.id.clone();
                Box::new(move |line: &str| {
                    let relay = relay.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(events) = relay.as_ref() {
                        output_event(events, &id, line);
                    }
                }) as child::OnStderr
            });
            let mut on_line = |line: &str| {
                if ext.stream {
                    output_event(events, &trial.id, line);
                }
                for stats in metric_line::epochs(line, started) {
                    // A pruned trial's epochs end where it was stopped: later lines are dropped,
                    // and the first later epoch stops it at once.
                    if let Some(p) = &pruned {
                        if stats.epoch > p.epoch {
                            stop_now(&stop);
                        }
                    } else if last_epoch.is_none_or(|e| stats.epoch > e) {
                        last_epoch = Some(stats.epoch);
                        reported += 1;
                        epoch_event(events, &trial, slice.index, &stats);
                        if prune.as_ref().is_some_and(|p| p.stops(&stats)) {
                            pruned = Some(stats);
                            let (stop, sent, over) =
                                (stop.clone(), Arc::clone(&sent), Arc::clone(&over));
                            std::thread::spawn(move || {
                                std::thread::sleep(PRUNE_GRACE);
                                if !over.load(std::sync::atomic::Ordering::SeqCst) {
                                    sent.store(true, std::sync::atomic::Ordering::SeqCst);
                                    stop.abort();
                                }
                            });
                        }
                    }
                }
            };
            external::run(
                &argv,
                &trial.id,
                slice,
                &env,
                &stop,
                &mut on_line,
                on_stderr,
            )
        });
    over.store(true, std::sync::atomic::Ordering::SeqCst);
    relay.lock().unwrap_or_else(|p| p.into_inner()).take();
    let wall_s = started.elapsed().as_secs_f64();
    let stopped_here = sent.load(std::sync::atomic::Ordering::SeqCst);
    match pruned {
        // Stopped for its early termination, whatever it printed after: PRUNED where it was.
        Some(stats) if stopped_here || res.is_err() && stop.aborted() => {
            let res = Err(Stop::Pruned(Box::new(pruned_result(stats, wall_s))));
            return outcome(trial, slice, res, wall_s);
        }
        // It ended on its own before it was stopped: its rung was its last epoch, and it ended
        // as it would have without early termination (COMPLETE, or its own failure).
        _ => {}
    }
    let res = res.map(|o| TrialResult {
        test_acc: o.metrics.get("test_acc").copied().unwrap_or(f64::NAN),
        final_loss: o.metrics.get("final_loss").copied().unwrap_or(f64::NAN),
        // An `epochs` key in the result line wins over the count of its epoch lines.
        epochs: o
            .metrics
            .get("epochs")
            .filter(|e| e.is_finite() && **e >= 0.0)
            .map_or(reported, |e| *e as u32),
        wall_s: o.wall_s,
        train_samples: 0,
        samples_per_s: 0.0,
        peak_mem_bytes: o
            .peak_mem_mib
            .map_or(0, |m| (m * (1u64 << 20) as f64) as u64),
        param_count: 0,
        metrics: o.metrics,
        launches_per_step: None,
        host_syncs: None,
    });
    outcome(trial, slice, res, wall_s)
}

/// How long an external command stopped at a rung has to end on its own, its last epoch being
/// the rung, before it is stopped ([`run_external`]'s early termination).
const PRUNE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// A training that ended with a result after its early termination stopped it was PRUNED.
pub(crate) fn pruned_if_stopped(
    res: Result<TrialResult, Stop>,
    prune: Option<&Prune>,
) -> Result<TrialResult, Stop> {
    match res {
        Ok(r) if prune.is_some_and(|p| p.stopped().is_some()) => Err(Stop::Pruned(Box::new(r))),
        other => other,
    }
}

/// What an external trial ended by its early termination reached: the figures of the epoch
/// it was stopped after.
pub(crate) fn pruned_result(stats: EpochStats, wall_s: f64) -> TrialResult {
    let mut metrics = stats.extra.clone();
    for (name, v) in [
        ("test_acc", stats.test_acc),
        ("test_loss", stats.test_loss),
        ("final_loss", stats.train_loss),
        ("train_acc", stats.train_acc),
    ] {
        if v.is_finite() {
            metrics.entry(name.to_string()).or_insert(v);
        }
    }
    TrialResult {
        test_acc: stats.test_acc,
        final_loss: stats.train_loss,
        epochs: stats.epoch,
        wall_s,
        metrics,
        ..TrialResult::default()
    }
}

/// A COMPLETE end whose result has no finite value for `metric` is a failure: a sweep cannot
/// rank it, and a resumed sweep would never run it again.
fn require_metric(end: TrialEnd, metric: Option<&str>) -> TrialEnd {
    match (end, metric) {
        (TrialEnd::Complete(r), Some(m))
            if !crate::train::metric_in(&r.metrics, m).is_some_and(|v| v.is_finite()) =>
        {
            TrialEnd::Failed(Failure::MissingMetric {
                metric: m.to_string(),
            })
        }
        (end, _) => end,
    }
}

/// Sends what shows of a line a trial printed (nothing for a line that shows nothing).
fn output_event(events: &Sender<Event>, trial_id: &str, line: &str) {
    if let Some(line) = metric_line::shown(line) {
        let _ = events.send(Event::Output {
            trial_id: trial_id.to_string(),
            line,
        });
    }
}

/// Reports that `trial` started on slice `slice`.
pub(crate) fn started_event(events: &Sender<Event>, trial: &TrialSpec, slice: u32) {
    let _ = events.send(Event::Started {
        trial: trial.clone(),
        slice,
    });
}

/// Sends an epoch event for a trial.
pub(crate) fn epoch_event(
    events: &Sender<Event>,
    trial: &TrialSpec,
    slice: u32,
    stats: &EpochStats,
) {
    let _ = events.send(Event::Epoch {
        trial: trial.clone(),
        slice,
        stats: stats.clone(),
    });
}

/// The outcome of a trial that ran to an end, good or bad.
pub(crate) fn outcome(
    trial: TrialSpec,
    slice: &SliceSpec,
    res: Result<TrialResult, Stop>,
    wall_s: f64,
) -> TrialOutcome {
    TrialOutcome {
        trial,
        slice: slice.clone(),
        end: TrialEnd::of(res),
        wall_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_complete_trial_without_the_metric_fails() {
        let result = |pairs: &[(&str, f64)]| {
            TrialEnd::Complete(TrialResult {
                test_acc: 0.0,
                final_loss: 0.0,
                epochs: 1,
                wall_s: 0.0,
                train_samples: 0,
                samples_per_s: 0.0,
                peak_mem_bytes: 0,
                param_count: 0,
                metrics: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                ..Default::default()
            })
        };
        let missing = TrialEnd::Failed(Failure::MissingMetric {
            metric: "test_acc".into(),
        });
        assert_eq!(
            require_metric(result(&[("loss", 0.1)]), Some("test_acc")),
            missing
        );
        assert_eq!(
            require_metric(result(&[("test_acc", f64::NAN)]), Some("test_acc")),
            missing
        );
        let ok = result(&[("test_acc", 0.9)]);
        assert_eq!(require_metric(ok.clone(), Some("test_acc")), ok);
        assert_eq!(require_metric(result(&[]), None), result(&[]));
        assert_eq!(require_metric(missing.clone(), Some("x")), missing);
    }

    #[test]
    fn each_device_gets_the_partitions_of_its_own_slices() {
        let slices = [
            SliceSpec::at(0, 1).capped(64 << 20).green(0, 48),
            SliceSpec::at(1, 0).capped(64 << 20).green(1, 80),
            SliceSpec::at(2, 1).capped(64 << 20).green(2, 24),
        ];
        assert_eq!(partition_sizes(&slices, 0), (vec![1], vec![80]));
        assert_eq!(partition_sizes(&slices, 1), (vec![0, 2], vec![48, 24]));
        assert_eq!(partition_sizes(&slices, 2), (vec![], vec![]));
        // Without a GPU there are no partitions, and no slice gets one.
        let cpu = Devices::with(Device::Cpu, vec![(1, Device::Cpu)]);
        let parts = partitions(SplitMode::Green, &slices, &cpu).unwrap();
        assert!(slices.iter().all(|s| partition_of(&parts, s).is_none()));
    }

    #[test]
    fn an_external_trial_gets_the_environment_of_its_slices_device() {
        let env = |uuid: &str| external::ExternalEnv {
            cuda_visible_devices: Some(uuid.into()),
            ..Default::default()
        };
        let ext = ExternalTrials {
            template: "train".into(),
            program: None,
            swept: Vec::new(),
            trials_dir: PathBuf::from("trials"),
            envs: PerDevice::with(env("GPU-a"), vec![(2, env("GPU-c"))]),
            stream: false,
        };
        let uuid = |d: u32| ext.env_for(d).map(|e| e.cuda_visible_devices.clone());
        assert_eq!(uuid(0), Ok(Some("GPU-a".into())));
        assert_eq!(uuid(2), Ok(Some("GPU-c".into())));
        assert!(uuid(1).is_err_and(|e| e.contains("device 1 was not opened")));
    }

    #[test]
    fn devices_are_found_by_number_and_the_cpu_has_device_0_only() {
        let d = Devices::with(Device::Cpu, vec![(0, Device::Cpu), (3, Device::Cpu)]);
        assert_eq!(d.all().map(|(n, _)| n).collect::<Vec<_>>(), vec![0, 3]);
        assert!(d.device(3).is_ok());
        let e = d.device(1).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("device 1 was not opened"), "{e}");
        let data = crate::data::DataSpec::of(crate::data::Source::Synthetic)
            .load(None, 1)
            .unwrap();
        let e = Device::open(BackendKind::Cpu, 1, &data, &EngineOptions::default())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("device 0 only, not device 1"), "{e}");
    }
}
