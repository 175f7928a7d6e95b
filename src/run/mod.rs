//! Run setup: what every command does once before its runner works, in one place: the backend and its devices, the dataset, the output folder with its lock and `command.txt`, the signals and the telemetry.
//!
//! The commands call it in their own order (a dry run opens no device; a folder whose results
//! cannot be read is refused before anything is written in it), but each step is written here
//! only.

pub mod backend;
pub mod split;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::gpu;
use crate::job::Job;
use crate::outdir::{self, OutLock};
use crate::sched::cancel::{self, Cancel};
use crate::telemetry::Sampler;

pub use backend::{resolve_backend, Resolved};
pub use split::{mps_daemon_running, unavailable, Unavailable};

/// The file of an output folder that records the command line that wrote it.
pub const COMMAND_TXT: &str = "command.txt";

/// The backend of a job's run, said on stderr, with every device its slices name opened.
pub fn backend(job: &Job) -> Result<Resolved> {
    let mut r = resolve_backend(job.file.backend, &gpu::discover(), &job.engine_options())?;
    crate::note!("{}", r.note);
    r.open_devices(job)?;
    Ok(r)
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

/// Starts watching SIGINT/SIGTERM for the whole process (the long-running commands do so from
/// their first moment: a signal stops them with what they measured kept, and exit code 3).
pub fn watch_signals() {
    if let Err(e) = cancel::watch_signals() {
        tracing::warn!("cannot watch for SIGINT/SIGTERM: {e}");
    }
}

/// A cancel that a signal drains (and aborts `grace` later). When the handlers cannot be
/// installed the run goes on unwatched, with a note.
pub fn cancel_on_signals(grace: Duration) -> Cancel {
    let cancel = Cancel::new();
    if let Err(e) = cancel.on_signals(grace) {
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

#[cfg(test)]
mod tests {
    /// Run setup and what the runners share sit below the runners: they import none of them
    /// (the runners call down into them, never the other way).
    #[test]
    fn run_setup_imports_no_runner() {
        let src = crate::test_root().join("src");
        let runners = [
            "crate::fib",
            "crate::trial",
            "crate::sweep",
            "crate::parallel::run",
            "crate::parallel::scan",
        ];
        for file in ["run/mod.rs", "run/backend.rs", "run/split.rs", "rounds.rs"] {
            let text = std::fs::read_to_string(src.join(file)).unwrap();
            for runner in runners {
                assert!(
                    !text
                        .lines()
                        .any(|l| l.trim_start().starts_with("use ") && l.contains(runner)),
                    "src/{file} imports {runner}"
                );
            }
        }
    }
}
