//! A trial's end as a value: COMPLETE with its result, FAILED with a typed reason, or INTERRUPTED; the CSV's words are made from it at the edge.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::child::{signal_name, Exit};
use super::signals::Cancel;
use crate::error::{CudaLibrary, EngineError, TrialError};
use crate::train::{json_float, TrialResult};

/// Which kind of process a trial ran in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildKind {
    /// A `process`-mode worker (`gpumux worker`).
    Worker,
    /// A job's external training command.
    Command,
}

/// How long a trial killed by SIGTERM, SIGINT or SIGHUP from outside waits for gpumux's own signal.
pub const STOP_WAIT: Duration = Duration::from_secs(1);

/// How a trial ended.
#[derive(Clone, Debug, PartialEq)]
pub enum TrialEnd {
    Complete(TrialResult),
    Failed(Failure),
    /// Stopped by a signal before it ended; `--resume` runs it again.
    Interrupted,
    /// Stopped early by the sweep's early termination: what it reached (its `epochs` are those
    /// it trained). Done: `--resume` does not run it again.
    Pruned(TrialResult),
}

/// Why a trial stopped short of COMPLETE.
#[derive(Clone, Debug, PartialEq)]
pub enum Stop {
    /// A signal stopped the run (or the trial) before the trial ended.
    Interrupted,
    /// The sweep's early termination stopped it after an epoch, with its figures so far.
    Pruned(Box<TrialResult>),
    Failed(Failure),
}

impl From<Failure> for Stop {
    fn from(f: Failure) -> Stop {
        Stop::Failed(f)
    }
}

impl From<EngineError> for Stop {
    fn from(e: EngineError) -> Stop {
        Stop::Failed(Failure::from(e))
    }
}

impl From<TrialError> for Stop {
    /// A trial's error as its end: [`Stop::Interrupted`] when the trial (or one replica of a
    /// mirrored training) was stopped, else the typed failure.
    fn from(e: TrialError) -> Stop {
        let failed = match e {
            TrialError::Interrupted => return Stop::Interrupted,
            TrialError::Slice { slice, source } => match Stop::from(*source) {
                Stop::Interrupted => return Stop::Interrupted,
                Stop::Pruned(r) => return Stop::Pruned(r),
                Stop::Failed(f) => Failure::Slice {
                    slice,
                    source: Box::new(f),
                },
            },
            TrialError::Engine(e) => Failure::from(e),
            TrialError::NonFiniteLoss { value, epoch, step } => Failure::NonFiniteLoss {
                value: f64::from(value),
                epoch,
                step,
            },
            TrialError::DoesNotFit {
                batch,
                need_mib,
                cap_mib,
                largest,
                floor_mib,
            } => Failure::DoesNotFit {
                batch,
                need_mib,
                cap_mib,
                largest,
                floor_mib,
            },
            TrialError::Injected(s) => Failure::Injected(s),
            TrialError::Panic(s) => Failure::Panic(s),
            TrialError::Worker(s) => Failure::Worker(s),
            TrialError::Data(e) => Failure::Data(e.to_string()),
        };
        Stop::Failed(failed)
    }
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Interrupted => f.write_str("interrupted"),
            Stop::Pruned(r) => write!(f, "pruned at epoch {}", r.epochs),
            Stop::Failed(why) => why.fmt(f),
        }
    }
}

impl TrialEnd {
    /// The end of a trial that ran, from its result.
    pub fn of(res: Result<TrialResult, Stop>) -> TrialEnd {
        match res {
            Ok(r) => TrialEnd::Complete(r),
            Err(Stop::Interrupted) => TrialEnd::Interrupted,
            Err(Stop::Pruned(r)) => TrialEnd::Pruned(*r),
            Err(Stop::Failed(f)) => TrialEnd::Failed(f),
        }
    }

    /// A failure that is really the run being stopped: a trial's process killed by SIGTERM,
    /// SIGINT or SIGHUP (a scheduler such as Slurm signals every process of the job) while the run drains,
    /// or by SIGKILL once it aborts, ends INTERRUPTED, so that `--resume` runs it again. The
    /// trial's process may get its signal a moment before gpumux gets its own: a trial killed
    /// by SIGTERM, SIGINT or SIGHUP waits up to [`STOP_WAIT`] for the run to start draining.
    pub fn settle(self, cancel: &Cancel) -> TrialEnd {
        if let TrialEnd::Failed(f) = &self {
            if matches!(
                f.signal(),
                Some(libc::SIGTERM | libc::SIGINT | libc::SIGHUP)
            ) {
                let until = Instant::now() + STOP_WAIT;
                while !cancel.draining() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        match self {
            TrialEnd::Failed(f) if stopped_by_the_run(&f, cancel) => TrialEnd::Interrupted,
            other => other,
        }
    }
}

/// Whether a failure is the signal that stops the run, seen from the trial's side.
fn stopped_by_the_run(f: &Failure, cancel: &Cancel) -> bool {
    if !cancel.draining() {
        return false;
    }
    match f.signal() {
        Some(libc::SIGTERM | libc::SIGINT | libc::SIGHUP) => true,
        Some(libc::SIGKILL) => cancel.aborted(),
        _ => false,
    }
}

/// Why a trial failed. Serialisable: a `process`-mode worker sends it to its supervisor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// The trial's plan at its batch size does not fit under its slice's cap; it never started.
    #[error("batch {batch} needs {need_mib:.1} MiB, slice cap {cap_mib:.1} MiB; {}", match largest {
        Some(b) => format!("the largest batch that fits is {b}"),
        None => format!("no batch size fits (batch 1 needs {floor_mib:.1} MiB)"),
    })]
    DoesNotFit {
        batch: usize,
        #[serde(with = "json_float")]
        need_mib: f64,
        #[serde(with = "json_float")]
        cap_mib: f64,
        largest: Option<usize>,
        #[serde(with = "json_float")]
        floor_mib: f64,
    },
    /// An allocation went over the slice's cap.
    #[error("needs {need_mib:.1} MiB, slice cap {cap_mib:.1} MiB")]
    CapExceeded {
        #[serde(with = "json_float")]
        need_mib: f64,
        #[serde(with = "json_float")]
        cap_mib: f64,
    },
    /// The device had not the memory free that the trial needs, whatever its cap.
    #[error("{}", EngineError::DeviceFull { need_mib: *need_mib, free_mib: *free_mib })]
    DeviceFull {
        #[serde(with = "json_float")]
        need_mib: f64,
        free_mib: Option<f64>,
    },
    #[error("loss is {value} at epoch {epoch} step {step}")]
    NonFiniteLoss {
        #[serde(with = "json_float")]
        value: f64,
        epoch: usize,
        step: usize,
    },
    #[error("panic: {0}")]
    Panic(String),
    #[error("injected fault: {0}")]
    Injected(String),
    /// The dataset could not be read (in a worker process, which loads its own).
    #[error("{0}")]
    Data(String),
    /// A CUDA library call failed on the device: a kernel fault, an illegal address, a failed
    /// launch, a cuBLAS or cuDNN failure.
    #[error("{call}: {status}")]
    Kernel {
        library: CudaLibrary,
        call: String,
        status: String,
    },
    /// The engine failed otherwise (a shape the model cannot take, a device that cannot be used).
    #[error("{0}")]
    Device(String),
    /// The trial's slice has nothing to run on: its device was not opened, or its green
    /// partition could not be made.
    #[error("{0}")]
    NoSlice(String),
    /// A trial's process ended without a result: a `process`-mode worker that exited or was
    /// killed before reporting, or an external command that exited with a non-zero code or was
    /// killed. `stderr` holds the last lines it wrote there.
    #[error("{}", exit_words(*child, *exit, stderr))]
    ChildExit {
        child: ChildKind,
        exit: Exit,
        stderr: Vec<String>,
    },
    /// A `process`-mode worker could not be started, waited for or understood.
    #[error("worker process: {0}")]
    Worker(String),
    /// One replica of a data-parallel training failed.
    #[error("slice {slice}: {source}")]
    Slice { slice: u32, source: Box<Failure> },
    /// An external command could not be made or started, or what it printed is not a result.
    #[error("{0}")]
    Command(String),
    /// A trial's process could not be started: its program, the folder it was to run in (when
    /// not the current one), and the system's reason.
    #[error("{}", start_words(*child, program, cwd.as_deref(), reason))]
    Start {
        child: ChildKind,
        program: String,
        cwd: Option<String>,
        reason: String,
    },
    /// A trial's process could not be waited for.
    #[error("{}", match child {
        ChildKind::Worker => format!("worker process: cannot wait for the worker: {reason}"),
        ChildKind::Command => format!("cannot wait for the command: {reason}"),
    })]
    Wait { child: ChildKind, reason: String },
    /// An external command's last non-empty stdout line is not a JSON object of metrics: that
    /// line, cut for a message (empty when it printed nothing).
    #[error("{}", if last.is_empty() {
        "the command printed nothing on stdout; its last line must be a JSON object of metrics".to_string()
    } else {
        format!("the command's last stdout line is not a JSON object of metrics: `{last}`")
    })]
    NoMetrics { last: String },
    /// The memory watchdog killed an external command's process group.
    #[error("the command exceeded its memory cap: used {used_mib:.0} MiB, cap {cap_mib:.0} MiB (+{}%)", (margin * 1000.0).round() / 10.0)]
    MemoryCap {
        used_mib: f64,
        cap_mib: f64,
        margin: f64,
    },
    /// The trial's result has no (finite) value for the sweep's metric.
    #[error("no value for metric {metric} in the trial's result")]
    MissingMetric { metric: String },
}

impl Failure {
    /// The signal that killed the trial's process, when that is how it failed.
    pub fn signal(&self) -> Option<i32> {
        match self {
            Failure::ChildExit {
                exit: Exit::Signal(signal),
                ..
            } => Some(*signal),
            Failure::Slice { source, .. } => source.signal(),
            _ => None,
        }
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Failure {
        match e {
            EngineError::CapExceeded { need_mib, cap_mib } => {
                Failure::CapExceeded { need_mib, cap_mib }
            }
            EngineError::DeviceFull { need_mib, free_mib } => {
                Failure::DeviceFull { need_mib, free_mib }
            }
            EngineError::Cuda {
                library,
                call,
                status,
            } => Failure::Kernel {
                library,
                call,
                status,
            },
            other => Failure::Device(other.to_string()),
        }
    }
}

/// The words for a trial's process that ended without a result.
fn exit_words(child: ChildKind, exit: Exit, stderr: &[String]) -> String {
    match (child, exit) {
        (ChildKind::Worker, Exit::Signal(s)) => format!(
            "worker process killed by signal {s} ({}){}",
            signal_name(s),
            last_line(stderr)
        ),
        (ChildKind::Worker, Exit::Code(c)) => format!(
            "worker process exited with code {c} before reporting{}",
            last_line(stderr)
        ),
        (ChildKind::Worker, Exit::Unknown) => format!(
            "worker process: ended without reporting{}",
            last_line(stderr)
        ),
        (ChildKind::Command, Exit::Signal(s)) => format!(
            "the command was killed by signal {s} ({}){}",
            signal_name(s),
            stderr_words(stderr)
        ),
        (ChildKind::Command, Exit::Code(c)) => {
            format!("the command exited with code {c}{}", stderr_words(stderr))
        }
        (ChildKind::Command, Exit::Unknown) => "the command ended abnormally".to_string(),
    }
}

/// The words for a trial's process that could not be started.
fn start_words(child: ChildKind, program: &str, cwd: Option<&str>, reason: &str) -> String {
    match (child, cwd) {
        (ChildKind::Worker, _) => {
            format!("worker process: cannot start worker {program}: {reason}")
        }
        (ChildKind::Command, Some(dir)) => format!("cannot start `{program}` in {dir}: {reason}"),
        (ChildKind::Command, None) => format!("cannot start `{program}`: {reason}"),
    }
}

/// The non-empty lines of a stderr tail, trimmed.
fn said(stderr: &[String]) -> impl DoubleEndedIterator<Item = &str> {
    stderr.iter().map(|l| l.trim()).filter(|l| !l.is_empty())
}

/// `: <the last non-empty line>` of a worker's stderr, or nothing.
fn last_line(stderr: &[String]) -> String {
    said(stderr)
        .next_back()
        .map(|l| format!(": {l}"))
        .unwrap_or_default()
}

/// How many stderr lines the message of a failed external command quotes.
const STDERR_QUOTE: usize = 5;

/// `; stderr: <its last lines, joined with ` | `>` of an external command, or ` (no stderr)`.
fn stderr_words(stderr: &[String]) -> String {
    let lines: Vec<&str> = said(stderr).collect();
    if lines.is_empty() {
        " (no stderr)".to_string()
    } else {
        let from = lines.len().saturating_sub(STDERR_QUOTE);
        format!("; stderr: {}", lines[from..].join(" | "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_crosses_the_worker_pipe_whole_even_with_a_nan_in_it() {
        let all = [
            Failure::NonFiniteLoss {
                value: f64::NAN,
                epoch: 1,
                step: 2,
            },
            Failure::NonFiniteLoss {
                value: f64::INFINITY,
                epoch: 1,
                step: 2,
            },
            Failure::DoesNotFit {
                batch: 64,
                need_mib: 9.5,
                cap_mib: 5.5,
                largest: None,
                floor_mib: 6.0,
            },
            Failure::DeviceFull {
                need_mib: 100.0,
                free_mib: None,
            },
            Failure::Panic("boom".into()),
            Failure::Kernel {
                library: CudaLibrary::Cudnn,
                call: "cudnnConvolutionForward".into(),
                status: "CUDNN_STATUS_EXECUTION_FAILED".into(),
            },
        ];
        for f in all {
            let text = serde_json::to_string(&f).unwrap();
            let back: Failure = serde_json::from_str(&text).unwrap();
            assert_eq!(back.to_string(), f.to_string(), "{text}");
        }
    }

    #[test]
    fn the_words_are_those_of_the_typed_errors() {
        let fit = || TrialError::DoesNotFit {
            batch: 64,
            need_mib: 9.5,
            cap_mib: 5.5,
            largest: Some(37),
            floor_mib: 1.0,
        };
        assert_eq!(Stop::from(fit()).to_string(), fit().to_string());
        let full = || {
            TrialError::Engine(EngineError::DeviceFull {
                need_mib: 10.0,
                free_mib: Some(2.0),
            })
        };
        assert_eq!(Stop::from(full()).to_string(), full().to_string());
        let nan = TrialError::NonFiniteLoss {
            value: f32::NAN,
            epoch: 2,
            step: 7,
        };
        assert_eq!(Stop::from(nan).to_string(), "loss is NaN at epoch 2 step 7");
        let w = Failure::ChildExit {
            child: ChildKind::Worker,
            exit: Exit::Signal(libc::SIGKILL),
            stderr: vec!["a".into(), "last words".into(), " ".into()],
        };
        assert_eq!(
            w.to_string(),
            "worker process killed by signal 9 (SIGKILL): last words"
        );
        let c = Failure::ChildExit {
            child: ChildKind::Command,
            exit: Exit::Code(3),
            stderr: Vec::new(),
        };
        assert_eq!(c.to_string(), "the command exited with code 3 (no stderr)");
        assert_eq!(
            Failure::MissingMetric {
                metric: "test_acc".into()
            }
            .to_string(),
            "no value for metric test_acc in the trial's result"
        );
    }

    #[test]
    fn a_cuda_error_is_a_typed_kernel_failure_worded_as_before() {
        let e = EngineError::Cuda {
            library: CudaLibrary::Driver,
            call: "cuStreamSynchronize".into(),
            status: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        };
        let words = e.to_string();
        assert_eq!(words, "cuStreamSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS");
        let f = Failure::from(e);
        assert!(
            matches!(&f, Failure::Kernel { library: CudaLibrary::Driver, status, .. }
                if status == "CUDA_ERROR_ILLEGAL_ADDRESS"),
            "{f:?}"
        );
        assert_eq!(f.to_string(), words);
        let other = Failure::from(EngineError::Device("no device".into()));
        assert!(matches!(other, Failure::Device(_)), "{other:?}");
    }

    #[test]
    fn an_interrupted_trial_is_no_failure_even_in_one_replica() {
        assert_eq!(Stop::from(TrialError::Interrupted), Stop::Interrupted);
        let replica = TrialError::Slice {
            slice: 1,
            source: Box::new(TrialError::Interrupted),
        };
        assert_eq!(Stop::from(replica), Stop::Interrupted);
        let nan = TrialError::Slice {
            slice: 1,
            source: Box::new(TrialError::NonFiniteLoss {
                value: f32::NAN,
                epoch: 1,
                step: 0,
            }),
        };
        assert_eq!(
            Stop::from(nan).to_string(),
            "slice 1: loss is NaN at epoch 1 step 0"
        );
    }

    #[test]
    fn a_process_that_cannot_start_or_report_is_worded_at_the_edge() {
        let start = |child, cwd: Option<&str>| Failure::Start {
            child,
            program: "/x/prog".into(),
            cwd: cwd.map(str::to_string),
            reason: "No such file or directory (os error 2)".into(),
        };
        assert_eq!(
            start(ChildKind::Worker, None).to_string(),
            "worker process: cannot start worker /x/prog: No such file or directory (os error 2)"
        );
        assert_eq!(
            start(ChildKind::Command, Some("/w")).to_string(),
            "cannot start `/x/prog` in /w: No such file or directory (os error 2)"
        );
        assert_eq!(
            Failure::NoMetrics {
                last: String::new()
            }
            .to_string(),
            "the command printed nothing on stdout; its last line must be a JSON object of metrics"
        );
        assert_eq!(
            Failure::NoMetrics { last: "[1]".into() }.to_string(),
            "the command's last stdout line is not a JSON object of metrics: `[1]`"
        );
    }

    #[test]
    fn a_signal_ends_a_trial_interrupted_only_while_the_run_stops() {
        let term = || {
            TrialEnd::Failed(Failure::ChildExit {
                child: ChildKind::Command,
                exit: Exit::Signal(libc::SIGTERM),
                stderr: Vec::new(),
            })
        };
        let kill = || {
            TrialEnd::Failed(Failure::ChildExit {
                child: ChildKind::Worker,
                exit: Exit::Signal(libc::SIGKILL),
                stderr: Vec::new(),
            })
        };
        let cancel = Cancel::new();
        assert!(matches!(term().settle(&cancel), TrialEnd::Failed(_)));
        cancel.drain();
        assert_eq!(term().settle(&cancel), TrialEnd::Interrupted);
        assert!(
            matches!(kill().settle(&cancel), TrialEnd::Failed(_)),
            "an OOM kill while draining is a failure"
        );
        cancel.abort();
        assert_eq!(kill().settle(&cancel), TrialEnd::Interrupted);
        // The trial's SIGTERM came first; the run's own comes a moment later.
        let late = Cancel::new();
        let drains = late.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drains.drain();
        });
        assert_eq!(term().settle(&late), TrialEnd::Interrupted);
        t.join().unwrap();
        let segv = TrialEnd::Failed(Failure::ChildExit {
            child: ChildKind::Worker,
            exit: Exit::Signal(libc::SIGSEGV),
            stderr: Vec::new(),
        });
        assert!(matches!(segv.settle(&cancel), TrialEnd::Failed(_)));
    }
}
