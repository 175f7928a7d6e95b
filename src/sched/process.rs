//! Process workers (`process` mode): each trial runs in a child `gpumux worker` that answers over a pipe; a child that dies fails only its own trial.

use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;

use super::child::{describe_exit, End, OnStderr, Supervised, Timing};
use super::end::ChildKind;
use super::{
    epoch_event, open_backend, outcome, BuiltinWork, Device, Event, Failure, RoundContext, Stop,
    TrialOutcome,
};
use crate::data::DataSpec;
use crate::engine::BackendKind;
use crate::job::SplitMode;
use crate::plan::{Round, SliceSpec, TrialSpec};
use crate::train::{run_trial, EpochStats, TrialConfig, TrialResult};

/// What the parent sends a worker on its standard input (one JSON document).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerRequest {
    pub trial: TrialSpec,
    pub slice: SliceSpec,
    pub config: TrialConfig,
    pub data: DataSpec,
    pub data_base: Option<PathBuf>,
    pub data_seed: u64,
    pub backend: BackendKind,
}

/// What a worker writes on its standard output, one JSON line each.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerMessage {
    /// The worker has its data, engine and backend, and starts training.
    Ready(WorkerReady),
    Epoch(EpochStats),
    Done(TrialResult),
    Failed(Failure),
    /// The trial was stopped before it ended.
    Interrupted,
}

/// What a worker says when it is ready to train: its host memory so far.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerReady {
    /// The worker's peak resident memory (MiB) at that point: data, libraries, engine.
    pub host_peak_mib: Option<f64>,
}

/// The line `--verbose` prints when a worker is ready: how long it took to start (process,
/// data, engine, backend) and the memory it holds, which every `process`-mode trial pays.
pub fn ready_line(
    trial: &str,
    pid: u32,
    startup_s: f64,
    host_mib: Option<f64>,
    gpu_mib: Option<f64>,
) -> String {
    let mib = |m: Option<f64>| m.map_or_else(|| "n/a".to_string(), |m| format!("{m:.0} MiB"));
    format!(
        "worker ready: trial {trial}, pid {pid}, {startup_s:.2} s after its start; host memory \
         peak {}, GPU memory {}",
        mib(host_mib),
        mib(gpu_mib)
    )
}

/// Runs one trial in a child process and waits for it.
pub fn run(
    ctx: &RoundContext,
    work: &BuiltinWork,
    slice: &SliceSpec,
    round: &Round,
    trial: TrialSpec,
    events: &Sender<Event>,
) -> TrialOutcome {
    let started = Instant::now();
    let env = if round.split == SplitMode::Mps {
        mps_env(round.n, slice)
    } else {
        Vec::new()
    };
    let req = WorkerRequest {
        config: work.config(ctx, &trial),
        trial: trial.clone(),
        slice: slice.clone(),
        data: work.data_spec.clone(),
        data_base: work.data_base.clone(),
        data_seed: work.data_seed,
        backend: ctx.devices.kind(),
    };
    // The trial's own stop: early termination ends this worker alone, as a signal would.
    let stop = ctx.cancel.child();
    let prune = ctx.prune.as_ref().map(|p| p.for_trial(&trial));
    let mut pruned = None;
    let res = supervise(ctx, &stop, &req, &env, &mut |s| {
        // A pruned trial's epochs end where it was stopped.
        if pruned.is_some() {
            return;
        }
        epoch_event(events, &trial, slice.index, s);
        if prune.as_ref().is_some_and(|p| p.stops(s)) {
            pruned = Some(s.clone());
            stop.abort();
        }
    });
    let wall_s = started.elapsed().as_secs_f64();
    let res = match pruned {
        Some(stats) => Err(Stop::Pruned(Box::new(super::pruned_result(stats, wall_s)))),
        None => res,
    };
    outcome(trial, slice, res, wall_s)
}

/// The MPS client limits of one of `n` slices: an equal share of the SMs' threads, and the
/// slice's memory cap as the pinned device-memory limit of its device.
pub fn mps_env(n: u32, slice: &SliceSpec) -> Vec<(String, String)> {
    let mut env = vec![(
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(),
        (100 / n.max(1)).max(1).to_string(),
    )];
    if let Some(cap) = slice.cap_mib() {
        env.push((
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
            format!("{}={}M", slice.device, cap.floor().max(1.0) as u64),
        ));
    }
    env
}

/// Runs the worker as a [`Supervised`] child, sends it the request and reads its messages.
fn supervise(
    ctx: &RoundContext,
    cancel: &crate::cancel::Cancel,
    req: &WorkerRequest,
    env: &[(String, String)],
    on_epoch: &mut dyn FnMut(&EpochStats),
) -> Result<TrialResult, Stop> {
    let body = serde_json::to_vec(req)
        .map_err(|e| Failure::Worker(format!("cannot encode the worker request: {e}")))?;
    let mut cmd = Command::new(&ctx.worker_exe);
    // Its own process group: a terminal's Ctrl-C reaches the supervisor, which then drains.
    cmd.arg("worker")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped());
    let spawned = Instant::now();
    let mut child = Supervised::spawn(&mut cmd, Timing::default(), echo_stderr(&req.trial.id))
        .map_err(|e| Failure::Start {
            child: ChildKind::Worker,
            program: ctx.worker_exe.display().to_string(),
            cwd: None,
            reason: e.to_string(),
        })?;
    if let Some(mut stdin) = child.take_stdin() {
        // A child that died at once shows up below through its exit status.
        let _ = stdin.write_all(&body);
    }
    let pid = child.id();
    let mut result = None;
    let mut feed = |line: String| match serde_json::from_str::<WorkerMessage>(&line) {
        Ok(WorkerMessage::Ready(r)) if tracing::enabled!(tracing::Level::DEBUG) => {
            let secs = spawned.elapsed().as_secs_f64();
            let gpu = match ctx.devices.get(req.slice.device) {
                Some(Device::Cuda { engine, .. }) => {
                    crate::gpu::process_gpu_mib(&engine.info().uuid, pid)
                }
                _ => None,
            };
            let line = ready_line(&req.trial.id, pid, secs, r.host_peak_mib, gpu);
            tracing::debug!("{line}");
        }
        Ok(WorkerMessage::Ready(_)) => {}
        Ok(WorkerMessage::Epoch(s)) => on_epoch(&s),
        Ok(WorkerMessage::Done(r)) => result = Some(Ok(r)),
        Ok(WorkerMessage::Failed(e)) => result = Some(Err(Stop::Failed(e))),
        Ok(WorkerMessage::Interrupted) => result = Some(Err(Stop::Interrupted)),
        Err(e) => {
            // Stray output is not ours to interpret; a message we cannot read is said.
            if line.starts_with("{\"") {
                tracing::warn!("trial {}: unreadable worker message: {e}", req.trial.id);
            }
        }
    };
    let end = child.supervise(cancel, &mut feed);
    child.finish(&end, &mut feed);
    let end = end.map_err(|e| Failure::Wait {
        child: ChildKind::Worker,
        reason: e.to_string(),
    })?;
    match (result, end) {
        (Some(r), _) => r,
        (None, End::Interrupted) => Err(Stop::Interrupted),
        (None, End::Exited(status)) => Err(Failure::ChildExit {
            child: ChildKind::Worker,
            exit: describe_exit(status),
            stderr: child.stderr_lines(),
        }
        .into()),
    }
}

/// With `--verbose`, shows each line of a worker's standard error as it comes, prefixed with
/// the trial's id.
fn echo_stderr(trial: &str) -> Option<OnStderr> {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return None;
    }
    let trial = trial.to_string();
    Some(Box::new(move |line: &str| {
        // Not eprintln!, which panics when stderr is closed.
        let _ = writeln!(std::io::stderr(), "[{trial}] {}", line.trim_end());
    }))
}

/// The child side: reads a request from `input`, trains, and writes messages to `output`.
/// Returns an error only when the request itself cannot be read.
pub fn worker_main(input: &mut dyn Read, output: &mut dyn Write) -> Result<(), String> {
    let mut body = String::new();
    input
        .read_to_string(&mut body)
        .map_err(|e| format!("cannot read the worker request: {e}"))?;
    let req: WorkerRequest =
        serde_json::from_str(&body).map_err(|e| format!("bad worker request: {e}"))?;
    let send = |out: &mut dyn Write, msg: &WorkerMessage| {
        if let Ok(line) = serde_json::to_string(msg) {
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    };
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(
        || -> Result<TrialResult, Stop> {
            let data = req
                .data
                .load(req.data_base.as_deref(), req.data_seed)
                .map_err(|e| Failure::Data(e.to_string()))?;
            let opts = req
                .config
                .engine
                .for_model(req.config.model.kind.has_convolutions());
            let device = Device::open(req.backend, req.slice.device, &data, &opts)?;
            let mut be = open_backend(&device, Arc::new(data), &req.slice, None)?;
            let ready = WorkerReady {
                host_peak_mib: crate::gpu::peak_rss_mib(),
            };
            send(output, &WorkerMessage::Ready(ready));
            run_trial(be.as_mut(), &req.config, &mut |s| {
                send(output, &WorkerMessage::Epoch(s.clone()))
            })
        },
    ));
    let msg = match res {
        Ok(Ok(r)) => WorkerMessage::Done(r),
        Ok(Err(Stop::Failed(e))) => WorkerMessage::Failed(e),
        // A worker's trial is pruned by its supervisor, which ends it: never here.
        Ok(Err(Stop::Interrupted | Stop::Pruned(_))) => WorkerMessage::Interrupted,
        Err(p) => WorkerMessage::Failed(Failure::Panic(crate::error::panic_text(p.as_ref()))),
    };
    send(output, &msg);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_result_with_nan_metrics_crosses_the_pipe() {
        // A probe trains a few steps and skips evaluation: its test figures are NaN, which JSON
        // cannot hold. The message must still read back, or the worker "exits before reporting".
        let result = TrialResult {
            test_acc: f64::NAN,
            final_loss: 0.5,
            epochs: 1,
            wall_s: 0.1,
            train_samples: 64,
            samples_per_s: 640.0,
            peak_mem_bytes: 1,
            param_count: 2,
            metrics: Default::default(),
            ..Default::default()
        };
        let stats = EpochStats {
            epoch: 1,
            train_loss: f64::INFINITY,
            train_acc: 0.1,
            test_loss: f64::NAN,
            test_acc: f64::NAN,
            wall_s: 0.1,
            extra: [("lr".to_string(), f64::NAN), ("grad_norm".to_string(), 1.5)]
                .into_iter()
                .collect(),
        };
        let failed = Failure::NonFiniteLoss {
            value: f64::NAN,
            epoch: 1,
            step: 3,
        };
        for msg in [
            WorkerMessage::Done(result),
            WorkerMessage::Epoch(stats),
            WorkerMessage::Failed(failed),
            WorkerMessage::Interrupted,
        ] {
            let line = serde_json::to_string(&msg).unwrap();
            let back: WorkerMessage =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
            match (back, msg) {
                (WorkerMessage::Done(a), WorkerMessage::Done(b)) => {
                    assert!(a.test_acc.is_nan() && a.final_loss == b.final_loss)
                }
                (WorkerMessage::Epoch(a), WorkerMessage::Epoch(_)) => {
                    assert!(a.test_loss.is_nan() && a.train_loss == f64::INFINITY)
                }
                (WorkerMessage::Failed(a), WorkerMessage::Failed(b)) => {
                    assert_eq!(a.to_string(), b.to_string())
                }
                (WorkerMessage::Interrupted, WorkerMessage::Interrupted) => {}
                (a, b) => panic!("{a:?} read back from {b:?}"),
            }
        }
    }

    #[test]
    fn a_ready_worker_says_its_start_up_time_and_memory() {
        let line = ready_line("t003", 4242, 0.8456, Some(212.4), None);
        assert_eq!(
            line,
            "worker ready: trial t003, pid 4242, 0.85 s after its start; host memory peak \
             212 MiB, GPU memory n/a"
        );
        let msg = serde_json::to_string(&WorkerMessage::Ready(WorkerReady {
            host_peak_mib: Some(1.5),
        }))
        .unwrap();
        assert_eq!(msg, r#"{"ready":{"host_peak_mib":1.5}}"#);
        // This process's own peak is known on Linux, and is above zero.
        if cfg!(target_os = "linux") {
            assert!(crate::gpu::peak_rss_mib().is_some_and(|m| m > 0.0));
        }
    }

    #[test]
    fn mps_limits_share_threads_and_pin_the_cap() {
        let slice = SliceSpec::at(0, 0).capped(3 << 30);
        let env = mps_env(8, &slice);
        assert_eq!(
            env[0],
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "12".into())
        );
        assert_eq!(
            env[1],
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), "0=3072M".into())
        );
        let uncapped = SliceSpec::at(0, 0);
        assert_eq!(mps_env(200, &uncapped).len(), 1);
        let second = SliceSpec::at(0, 2).capped(3 << 30);
        assert_eq!(mps_env(8, &second)[1].1, "2=3072M");
        assert_eq!(mps_env(200, &uncapped)[0].1, "1");
    }
}
