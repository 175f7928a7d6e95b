//! The library's error types and the stable exit code each one maps to.

use std::path::PathBuf;

/// `eprintln!` that never panics: one line of the log on stderr, where a closed stderr
/// (`gpumux ... 2>&1 | head`) is no error.
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Exit codes are part of the interface: scripts (Slurm jobs included) branch on them.
pub mod exit {
    /// Everything asked for was done (`fib` records failed trials as data and still exits 0, unless
    /// every trial failed).
    pub const OK: i32 = 0;
    /// Some trials of a sweep failed, every trial of a `fib` failed, or an unexpected failure (results could not be written).
    pub const FAILURE: i32 = 1;
    /// Bad input: the job file, a flag, a data file named by them, a results file that cannot be
    /// read, or an output folder in use by another gpumux.
    pub const BAD_INPUT: i32 = 2;
    /// Interrupted (SIGINT, SIGTERM or SIGHUP): completed trials are recorded; `--resume` finishes the rest.
    pub const INTERRUPTED: i32 = 3;
    /// The requested backend or device cannot be used on this machine.
    pub const NO_DEVICE: i32 = 4;
}

/// Errors in reading or validating a job file. Each one names the key and, where known, the line.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("{path}: cannot read the job file: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{path}:{}`{key}` {message}", line.map(|l| format!(" line {l}: ")).unwrap_or_else(|| " ".into()))]
    Invalid {
        path: PathBuf,
        key: String,
        line: Option<usize>,
        message: String,
    },
}

/// Errors in reading a dataset.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("data file {path} not found{hint}")]
    Missing { path: PathBuf, hint: String },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },
    #[error("dataset: {0}")]
    Invalid(String),
}

/// Errors raised by a backend or a model on it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum EngineError {
    /// The trial's static memory plan does not fit under its slice's cap; it never starts.
    #[error("needs {need_mib:.1} MiB, slice cap {cap_mib:.1} MiB")]
    CapExceeded { need_mib: f64, cap_mib: f64 },
    /// The device has not the memory free that a trial needs, whatever its cap: other trials
    /// or processes hold it.
    #[error("the device is full: needs {need_mib:.1} MiB, {} (other trials or processes hold the rest)", match free_mib {
        Some(f) => format!("{f:.1} MiB free"),
        None => "free memory unknown".to_string(),
    })]
    DeviceFull {
        need_mib: f64,
        free_mib: Option<f64>,
    },
    #[error("backend {backend} is not available: {reason}")]
    Unavailable { backend: String, reason: String },
    #[error("region {offset}+{len} lies outside the arena of {arena} elements")]
    OutOfArena {
        offset: usize,
        len: usize,
        arena: usize,
    },
    #[error("shape mismatch in {op}: {message}")]
    Shape { op: &'static str, message: String },
    #[error("the arena is not allocated yet")]
    NoArena,
    /// A call into a CUDA library returned an error status: a kernel fault, an illegal
    /// address, a failed launch or a library's own failure.
    #[error("{call}: {status}")]
    Cuda {
        library: CudaLibrary,
        call: String,
        /// The library's name for the status (e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`).
        status: String,
    },
    #[error("{0}")]
    Device(String),
}

/// The CUDA library whose call failed ([`EngineError::Cuda`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CudaLibrary {
    Driver,
    Cublas,
    Cudnn,
}

/// Errors in writing or reading results files (and the output folder they live in).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A results folder or file that cannot be read: missing, not a folder, not readable.
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A results file that cannot be written: a full disk, a read-only folder.
    #[error("{path}: cannot write: {}", write_reason(source))]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A results file with a damaged line; the file is left as it is.
    #[error("{path} line {line}: {message}; the file is left as it is: mend or remove that line, or choose another folder")]
    Damaged {
        path: PathBuf,
        line: u64,
        message: String,
    },
    #[error("{path}: {source}")]
    Csv { path: PathBuf, source: csv::Error },
    #[error("{path}: cannot draw the plot: {message}")]
    Plot { path: PathBuf, message: String },
    /// Another gpumux process writes this output folder.
    #[error("{dir} is in use by another gpumux{holder}: it holds the lock {lock}; wait for it to end, or choose another output folder")]
    Locked {
        dir: PathBuf,
        lock: PathBuf,
        /// ` (pid N)` when the lock file says which process holds it, else empty.
        holder: String,
    },
    /// Results that cannot be used as asked (no results files in a folder, other columns).
    #[error("{0}")]
    Invalid(String),
    /// A long read or rewrite of a results file stopped by a signal; a file being replaced is
    /// left as it was.
    #[error("{path}: stopped by a signal; the file is left as it was")]
    Interrupted { path: PathBuf },
}

/// Why a write failed, in words: past the file-size limit (`ulimit -f`), the limit is named.
fn write_reason(e: &std::io::Error) -> String {
    if e.raw_os_error() != Some(libc::EFBIG) {
        return e.to_string();
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`.
    let limited = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) } == 0
        && lim.rlim_cur != libc::RLIM_INFINITY;
    if limited {
        format!(
            "{e}: the file-size limit (ulimit -f) is {} bytes; every whole row before it is kept",
            lim.rlim_cur
        )
    } else {
        e.to_string()
    }
}

impl ReportError {
    /// Whether a signal stopped the work (exit 3).
    pub fn is_interrupted(&self) -> bool {
        matches!(self, ReportError::Interrupted { .. })
    }

    /// Whether the error is in what the user gave (exit 2) rather than in writing (exit 1).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            ReportError::Read { .. }
                | ReportError::Damaged { .. }
                | ReportError::Locked { .. }
                | ReportError::Invalid(_)
        )
    }
}

/// The top-level error of every library entry point.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Job(#[from] JobError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    NoDevice(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Internal(String),
    /// A command was interrupted by a signal; what completed is recorded.
    #[error("interrupted: {0}")]
    Interrupted(String),
    /// A sweep finished but some of its trials failed, a `fib` finished with none completed, or
    /// the training of `train`, `parallel` or `batch-scan` failed.
    #[error("{0}")]
    TrialsFailed(String),
}

impl Error {
    /// Turns an I/O error into one that says what was being done (`map_err(Error::io("..."))`).
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }

    /// The stable exit code for this error: the one place where errors become exit codes.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Job(_) | Error::Data(_) | Error::Usage(_) => exit::BAD_INPUT,
            Error::Report(e) if e.is_bad_input() => exit::BAD_INPUT,
            Error::Report(e) if e.is_interrupted() => exit::INTERRUPTED,
            Error::Engine(EngineError::Unavailable { .. }) | Error::NoDevice(_) => exit::NO_DEVICE,
            Error::Interrupted(_) => exit::INTERRUPTED,
            Error::Engine(_)
            | Error::Report(_)
            | Error::Io { .. }
            | Error::Internal(_)
            | Error::TrialsFailed(_) => exit::FAILURE,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The text of a panic's payload.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}
