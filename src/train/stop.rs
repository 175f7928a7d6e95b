//! Why a trial stops short of COMPLETE: interrupted, pruned, or failed with a typed reason, one failure type from the training loop up to the CSV cell.
//!
//! The training loop returns a [`Stop`]; the scheduler adds the failures of processes (a
//! worker or an external command that exited, could not start, printed no result) to the same
//! [`Failure`]; the words are made when a CSV cell or a message is written.

use serde::{Deserialize, Serialize};

use super::{json_float, TrialResult};
use crate::error::{CudaLibrary, DataError, EngineError, Error};

/// Which kind of process a trial ran in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildKind {
    /// A `process`-mode worker (`gpumux worker`).
    Worker,
    /// A job's external training command.
    Command,
}

/// How a child exited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exit {
    /// It exited by itself with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
    /// Neither a code nor a signal (not seen on Linux).
    Unknown,
}

/// The usual name of a signal number.
pub fn signal_name(sig: i32) -> &'static str {
    const NAMES: [(i32, &str); 15] = [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
    ];
    NAMES
        .iter()
        .find(|(n, _)| *n == sig)
        .map_or("unknown signal", |(_, name)| name)
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

impl From<DataError> for Stop {
    fn from(e: DataError) -> Stop {
        Stop::Failed(Failure::Data(e.to_string()))
    }
}

impl Stop {
    /// This stop as one replica's of a data-parallel training, on slice `slice`: a failure
    /// names the slice; an interruption or a prune is the training's own.
    pub fn in_slice(self, slice: u32) -> Stop {
        match self {
            Stop::Failed(f) => Stop::Failed(Failure::Slice {
                slice,
                source: Box::new(f),
            }),
            other => other,
        }
    }

    /// The error of a command that runs one training, from how the training ended: stopped by
    /// a signal (exit 3), or failed (exit 1) with its reason after `what`.
    pub fn into_error(self, what: &str) -> Error {
        match self {
            Stop::Interrupted => Error::Interrupted(format!("{what}: stopped by a signal")),
            other => Error::TrialsFailed(format!("{what} failed: {other}")),
        }
    }

    /// A failure made of words only (a replica that answered out of turn, a worker's own fault).
    pub fn worker(words: impl Into<String>) -> Stop {
        Stop::Failed(Failure::Worker(words.into()))
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
        let fit = Failure::DoesNotFit {
            batch: 64,
            need_mib: 9.5,
            cap_mib: 5.5,
            largest: Some(37),
            floor_mib: 1.0,
        };
        assert_eq!(
            Stop::from(fit).to_string(),
            "batch 64 needs 9.5 MiB, slice cap 5.5 MiB; the largest batch that fits is 37"
        );
        let full = || EngineError::DeviceFull {
            need_mib: 10.0,
            free_mib: Some(2.0),
        };
        assert_eq!(Stop::from(full()).to_string(), full().to_string());
        let nan = Failure::NonFiniteLoss {
            value: f64::from(f32::NAN),
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
        assert_eq!(Stop::Interrupted.in_slice(1), Stop::Interrupted);
        let nan = Stop::Failed(Failure::NonFiniteLoss {
            value: f64::NAN,
            epoch: 1,
            step: 0,
        });
        assert_eq!(
            nan.in_slice(1).to_string(),
            "slice 1: loss is NaN at epoch 1 step 0"
        );
        let e = Stop::Interrupted.into_error("the parallel training");
        assert_eq!(e.exit_code(), crate::error::exit::INTERRUPTED);
        let e = Stop::worker("out of turn").into_error("trial t0");
        assert_eq!(
            e.to_string(),
            "trial t0 failed: worker process: out of turn"
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
}
