//! Run setup: what every command does once before its runner works: the backend and its devices, the dataset, the output folder with its lock and `command.txt`, the signals and the telemetry.
//!
//! Each step is written here only, and every command takes them through one [`Session`]
//! (`session.rs`), which keeps their order.

pub mod backend_choice;
pub mod session;
pub mod split_policy;
pub mod workload;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::data::Dataset;
use crate::error::{Error, ReportError, Result};
use crate::job::Job;
use crate::outdir::{self, OutLock};
use crate::sched::signals::{self, Cancel};
use crate::telemetry::Sampler;

pub use backend_choice::{resolve_backend, Resolved};
pub use session::{Modes, Opened, Session, Setup, Signals};
pub use split_policy::{mps_daemon_running, unavailable, Unavailable, Work};
pub use workload::{builtin_context, swept_names};

/// The file of an output folder that records the command line that wrote it.
pub const COMMAND_TXT: &str = "command.txt";

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

/// The files a command's results are made of, in an output folder (every command's).
pub const RESULTS_FILES: &[&str] = &[
    "trials.csv",
    "progress.csv",
    "runs.csv",
    "best.yaml",
    "parallel.csv",
    "ratios.csv",
    "batch_scan.csv",
    "summary.txt",
    "time_per_training.svg",
    "samples_per_s.svg",
    COMMAND_TXT,
];

/// The results files ([`RESULTS_FILES`]) that are in `dir`.
fn results_in(dir: &Path) -> Vec<&'static str> {
    RESULTS_FILES
        .iter()
        .copied()
        .filter(|name| dir.join(name).symlink_metadata().is_ok())
        .collect()
}

/// Moves the results files in `dir` (those of [`RESULTS_FILES`] that are there), whole, into a
/// new `earlier-<seconds>/` folder beside them, and says so.
pub fn set_aside(dir: &Path) -> Result<PathBuf> {
    let present = results_in(dir);
    let aside = earlier_folder(dir)?;
    for name in &present {
        std::fs::rename(dir.join(name), aside.join(name)).map_err(|source| ReportError::Write {
            path: aside.join(name),
            source,
        })?;
    }
    for d in [dir, aside.as_path()] {
        outdir::sync_dir(d).map_err(|source| ReportError::Write {
            path: d.to_path_buf(),
            source,
        })?;
    }
    crate::note!(
        "note: {} held earlier results: moved to {}",
        dir.display(),
        aside.display()
    );
    Ok(aside)
}

/// A new, empty `earlier-<seconds>[-k]/` folder in `dir`, for results set aside.
fn earlier_folder(dir: &Path) -> Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for k in 0..1000 {
        let name = match k {
            0 => format!("earlier-{secs}"),
            _ => format!("earlier-{secs}-{k}"),
        };
        let path = dir.join(name);
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(source) => return Err(ReportError::Write { path, source }.into()),
        }
    }
    Err(Error::Usage(format!(
        "{}: too many earlier-* folders: remove some",
        dir.display()
    )))
}

/// The output folder of a run: `out` when given, else `out/<default_name>`.
pub fn out_dir(out: Option<&Path>, default_name: &str) -> PathBuf {
    out.map_or_else(
        || PathBuf::from("out").join(default_name),
        Path::to_path_buf,
    )
}

/// An output folder held by this run (created, and locked until this is dropped).
#[derive(Debug)]
pub struct OutFolder {
    lock: OutLock,
}

impl OutFolder {
    /// Creates `dir` if needed and takes its lock, or refuses (exit 2) when another gpumux
    /// holds it.
    pub fn lock(dir: &Path) -> Result<OutFolder> {
        Ok(OutFolder {
            lock: outdir::lock(dir)?,
        })
    }

    /// [`lock`](Self::lock) for a command that starts its results afresh (`fib`, `parallel`,
    /// `batch-scan`). Results that this same command wrote earlier (its name in `command.txt`)
    /// are moved, whole, into a new `earlier-<seconds>/` folder beside them: nothing is deleted.
    /// Results of another command, or of none that is recorded (a sweep, a merge), are refused
    /// (exit 2) and left as they are.
    pub fn lock_fresh(dir: &Path, command: &str) -> Result<OutFolder> {
        let folder = Self::lock(dir)?;
        let present = results_in(dir);
        if present.iter().all(|name| *name == COMMAND_TXT) {
            return Ok(folder);
        }
        // Results that do not read are refused and left where they are, not set aside.
        if dir.join(crate::report::TRIALS_CSV).exists() {
            let held = crate::report::ResultsDir::open(dir)?;
            held.runs()?;
            held.trials()?;
            held.check_progress(&crate::report::Interrupt::Never)?;
        }
        let recorded = std::fs::read_to_string(dir.join(COMMAND_TXT)).unwrap_or_default();
        let same = recorded
            .lines()
            .next()
            .is_some_and(|line| line.split_whitespace().skip(1).any(|w| w == command));
        if !same {
            return Err(Error::Usage(format!(
                "{} already holds results that `gpumux {command}` did not write ({}): choose \
                 another --out",
                dir.display(),
                present.join(", ")
            )));
        }
        set_aside(dir)?;
        Ok(folder)
    }

    pub fn dir(&self) -> &Path {
        self.lock.dir()
    }

    /// Records the command line next to the results, with the gpumux version and the device
    /// (`command.txt`, replaced whole).
    pub fn record_command(&self, command: &str, device: &str) -> Result<()> {
        let text = format!(
            "{command}\n# gpumux {}, device: {device}\n",
            env!("CARGO_PKG_VERSION")
        );
        outdir::replace_bytes(&self.dir().join(COMMAND_TXT), text.as_bytes())?;
        Ok(())
    }
}

/// The command line of this process, as recorded in `command.txt`.
pub fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// The gpumux executable, which `process` mode runs as `gpumux worker`.
pub fn worker_exe() -> Result<PathBuf> {
    std::env::current_exe().map_err(Error::io("cannot find the gpumux executable"))
}

/// Starts watching SIGINT, SIGTERM and SIGHUP for the whole process (the long-running commands do so from
/// their first moment: a signal stops them with what they measured kept, and exit code 3).
pub fn watch_signals() {
    if let Err(e) = signals::watch_signals() {
        tracing::warn!("cannot watch for SIGINT, SIGTERM and SIGHUP: {e}");
    }
}

/// A cancel that a signal drains (and aborts `grace` later). When the handlers cannot be
/// installed the run goes on unwatched, with a note.
pub fn cancel_on_signals(grace: Duration) -> Cancel {
    let cancel = Cancel::new();
    if let Err(e) = signals::on_signals(&cancel, grace) {
        crate::note!("note: cannot watch for signals: {e}");
    }
    cancel
}

/// NVML sampling of device 0 at `hz` while a round runs (GPU only); `None`, with a note, when
/// it cannot start.
pub fn telemetry(r: &Resolved, hz: f64) -> Option<Sampler> {
    r.engine.as_ref().and_then(|e| {
        Sampler::start(&e.info().uuid, hz)
            .map_err(|why| crate::note!("note: no telemetry for this round: {why}"))
            .ok()
    })
}
