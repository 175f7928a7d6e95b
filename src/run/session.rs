//! One run session: the setup every command goes through, once and in one fixed order (signals, the split modes allowed, backend and devices, data, the locked output folder with what it held, `command.txt`, the results writer).
//!
//! A command describes what it needs in a [`Setup`] and opens it: [`Setup::open`] watches the
//! signals, asks the split-mode policy, opens the backend and its devices and loads the data;
//! the [`Opened`] it returns is the only way to the output folder ([`Opened::fresh_folder`],
//! [`Opened::held_folder`], [`Opened::without_folder`]), which gives the [`Session`] the runner
//! works in. The order is in the types: no runner can lock its folder before the job has been
//! checked against the backend and the data, nor write `command.txt` before what its folder
//! held has been read. A signal between two steps stops the setup there (exit 3).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::cancel::Cancel;
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::gpu;
use crate::job::{Job, SplitMode};
use crate::report::{Interrupt, ReportWriter};
use crate::sched::RoundContext;
use crate::telemetry::Sampler;

use super::split_policy::{check_here, check_listed, check_use, runnable, Work};
use super::{workload, OutFolder, Resolved};

/// The split modes a command asks for, which the one policy checks.
#[derive(Clone, Copy, Debug)]
pub enum Modes {
    /// One mode for work of this kind (`sweep`, `parallel`, `batch-scan`): refused when the
    /// work cannot use it, or when it cannot run here.
    One(SplitMode, Work),
    /// The job's list of modes (`fib`'s `splits`): those that cannot run here are skipped.
    Listed,
    /// No split (`train`: one trial alone, on device 0).
    Unsplit,
}

/// What a signal does to the command.
#[derive(Clone, Copy, Debug)]
pub enum Signals {
    /// It stops the command at once (`fib`, `parallel`, `batch-scan`, `train`, `merge`).
    Stop,
    /// It drains: running trials may go on for the grace, then are stopped, and so are the
    /// rewrites of results files (`sweep`).
    Drain(Duration),
}

/// What a command needs from its session, before anything is opened.
#[derive(Clone, Debug)]
pub struct Setup<'a> {
    /// The command's name (`fib`, `sweep`, …), as `command.txt` records it.
    pub command: &'static str,
    pub modes: Modes,
    pub signals: Signals,
    /// Whether the backend is opened (and the data loaded): not in a sweep's dry run.
    pub opens_device: bool,
    /// Where the datasets are (`--data-dir`).
    pub data_dir: Option<&'a Path>,
}

impl<'a> Setup<'a> {
    /// A session with no job: a command that only reads and writes results (`merge`,
    /// `report`), with its signals and, once opened, its folder.
    pub fn results_only(command: &'static str) -> Setup<'a> {
        Setup {
            command,
            modes: Modes::Unsplit,
            signals: Signals::Stop,
            opens_device: false,
            data_dir: None,
        }
    }

    /// The first steps, in this order: the signals watched, the split modes asked of the
    /// policy (bad input before any device opens), the backend and its devices, the modes
    /// that run here, and the job's data (a built-in model's; an external command has none).
    pub fn open(self, job: &Job) -> Result<Opened<'a>> {
        let cancel = self.cancel();
        match self.modes {
            Modes::One(split, work) => check_use(split, work)?,
            Modes::Listed => check_listed(job)?,
            Modes::Unsplit => {}
        }
        let mut opened = Opened {
            setup: self,
            cancel,
            resolved: None,
            modes: Vec::new(),
            data: None,
        };
        if !opened.setup.opens_device {
            opened.modes = match opened.setup.modes {
                Modes::One(split, _) => vec![split],
                Modes::Listed => job.file.splits.clone(),
                Modes::Unsplit => Vec::new(),
            };
            return Ok(opened);
        }
        let options = job.engine_options();
        let mut r = super::resolve_backend(job.file.backend, &gpu::discover(), &options)?;
        crate::note!("{}", r.note);
        // One trial on device 0 (`train`) opens no device its slices name.
        if !matches!(opened.setup.modes, Modes::Unsplit) {
            r.open_devices(job)?;
        }
        opened.modes = match opened.setup.modes {
            Modes::One(split, work) => {
                check_here(split, work, &r)?;
                vec![split]
            }
            Modes::Listed => runnable(&job.file.splits, &r)?,
            Modes::Unsplit => Vec::new(),
        };
        opened.resolved = Some(r);
        opened.between_steps("opening the backend")?;
        if job.file.model.is_some() {
            opened.data = Some(super::load_data(job, opened.setup.data_dir)?);
            opened.between_steps("loading the data")?;
        }
        Ok(opened)
    }

    /// [`Setup::results_only`]'s first step: the signals watched.
    pub fn open_results_only(self) -> Opened<'a> {
        Opened {
            cancel: self.cancel(),
            setup: self,
            resolved: None,
            modes: Vec::new(),
            data: None,
        }
    }

    fn cancel(&self) -> Cancel {
        match self.signals {
            Signals::Stop => super::cancel_on_signals(Duration::ZERO),
            Signals::Drain(grace) => super::cancel_on_signals(grace),
        }
    }
}

/// A session opened up to its output folder: backend, devices and data are there, the folder
/// is not yet touched. Checks of the job against them go here, before the folder is taken.
pub struct Opened<'a> {
    setup: Setup<'a>,
    cancel: Cancel,
    resolved: Option<Resolved>,
    modes: Vec<SplitMode>,
    data: Option<Arc<Dataset>>,
}

impl<'a> Opened<'a> {
    /// The cancel that the signals drain (and abort).
    pub fn cancel(&self) -> &Cancel {
        &self.cancel
    }

    /// The backend and its devices (an internal error where the setup opens none).
    pub fn resolved(&self) -> Result<&Resolved> {
        self.resolved.as_ref().ok_or_else(|| {
            Error::Internal(format!("{}: no backend was opened", self.setup.command))
        })
    }

    /// The split modes the command runs, in the job's order: those that run here (without a
    /// device, those asked for).
    pub fn modes(&self) -> &[SplitMode] {
        &self.modes
    }

    /// The job's dataset (an internal error where none was loaded: an external command, a dry
    /// run).
    pub fn data(&self) -> Result<&Arc<Dataset>> {
        self.data
            .as_ref()
            .ok_or_else(|| Error::Internal(format!("{}: no data was loaded", self.setup.command)))
    }

    /// The output folder of a command that starts its results afresh (`fib`, `parallel`,
    /// `batch-scan`): locked, this command's earlier results set aside (others refused, see
    /// [`OutFolder::lock_fresh`]), and `command.txt` written.
    pub fn fresh_folder(self, dir: &Path) -> Result<Session<'a>> {
        let folder = OutFolder::lock_fresh(dir, self.setup.command)?;
        self.with_folder(folder, true)
    }

    /// The output folder of a command that goes on from what it holds (`sweep`, `merge`,
    /// `report`): locked (unless `lock` is false: a dry run, which writes nothing), then read
    /// by `read` (which refuses what it cannot take), and only then `command.txt` written, by
    /// a command that records one (`sweep`) and that locked. Returns what `read` found.
    pub fn held_folder<T>(
        self,
        dir: &Path,
        lock: bool,
        read: impl FnOnce(&Path, &Cancel) -> Result<T>,
    ) -> Result<(Session<'a>, T)> {
        let folder = if lock {
            Some(OutFolder::lock(dir)?)
        } else {
            None
        };
        let held = read(dir, &self.cancel)?;
        let records = folder.is_some() && self.setup.opens_device;
        let session = match folder {
            Some(f) => self.with_folder(f, records)?,
            None => self.without_folder(),
        };
        Ok((session, held))
    }

    /// A session that writes no folder (`train`, a dry run).
    pub fn without_folder(self) -> Session<'a> {
        Session {
            opened: self,
            folder: None,
        }
    }

    fn with_folder(self, folder: OutFolder, record: bool) -> Result<Session<'a>> {
        self.between_steps("taking the output folder")?;
        if record {
            let device = self.resolved.as_ref().map_or("none", |r| r.device.as_str());
            folder.record_command(&super::command_line(), device)?;
        }
        Ok(Session {
            opened: self,
            folder: Some(folder),
        })
    }

    /// A signal between two steps stops the setup there (exit 3), before the next opens.
    fn between_steps(&self, step: &str) -> Result<()> {
        if self.cancel.draining() {
            return Err(Error::Interrupted(format!(
                "{}: stopped by a signal while {step}; nothing was run",
                self.setup.command
            )));
        }
        Ok(())
    }
}

/// The session a runner works in: everything [`Opened`] holds (its accessors are the
/// session's), and its locked output folder (held until the session is dropped).
pub struct Session<'a> {
    opened: Opened<'a>,
    folder: Option<OutFolder>,
}

impl<'a> std::ops::Deref for Session<'a> {
    type Target = Opened<'a>;

    fn deref(&self) -> &Opened<'a> {
        &self.opened
    }
}

impl Session<'_> {
    /// The locked output folder (an internal error where the session holds none).
    pub fn dir(&self) -> Result<&Path> {
        self.folder
            .as_ref()
            .map(OutFolder::dir)
            .ok_or_else(|| Error::Internal("no output folder was taken".into()))
    }

    /// The writer of the folder's `trials.csv`, `progress.csv` and `runs.csv`: `resumed` when
    /// the folder's reading opened it for appending, else new files. Under [`Signals::Drain`]
    /// a rewrite stops once the grace is over.
    pub fn results_writer(&self, resumed: Option<ReportWriter>) -> Result<ReportWriter> {
        let mut w = match resumed {
            Some(w) => w,
            None => ReportWriter::create(self.dir()?)?,
        };
        if let Signals::Drain(_) = self.setup.signals {
            w.interrupted_by(&Interrupt::OnAbort(self.cancel.clone()));
        }
        Ok(w)
    }

    /// What the workers of this session's rounds share: for a built-in model, its data (on
    /// the device too, on a GPU); for an external command, the template and each device's
    /// environment, its trials' folders under the output folder's `trials/`.
    pub fn round_context(&self, job: &Job, worker_exe: &Path) -> Result<RoundContext> {
        let r = self.resolved()?;
        match (&job.file.model, &job.file.command) {
            (Some(_), _) => workload::builtin_context(
                job,
                self.data()?,
                r,
                self.setup.data_dir,
                worker_exe,
                &self.cancel,
            ),
            (None, Some(template)) => Ok(workload::external_context(
                job,
                template,
                worker_exe,
                r,
                &self.cancel,
                &self.dir()?.join("trials"),
            )),
            (None, None) => Err(job
                .invalid("model", "is missing: give model (with data), or command")
                .into()),
        }
    }

    /// NVML sampling of device 0 at `hz` while a round runs (GPU only; see [`super::telemetry`]).
    pub fn telemetry(&self, hz: f64) -> Option<Sampler> {
        self.resolved.as_ref().and_then(|r| super::telemetry(r, hz))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::SplitMode;

    fn job(extra: &str) -> Job {
        let yaml = format!(
            "backend: cpu\nmodel: {{kind: mlp, hidden: [8]}}\ndata: {{source: synthetic, train_samples: 128, test_samples: 32}}\ntrain: {{epochs: 1, batch_size: 32}}\n{extra}"
        );
        Job::parse(&yaml, Path::new("j.yaml")).unwrap()
    }

    fn setup(modes: Modes, opens_device: bool) -> Setup<'static> {
        Setup {
            command: "sweep",
            modes,
            signals: Signals::Stop,
            opens_device,
            data_dir: None,
        }
    }

    const SHARED: Modes = Modes::One(SplitMode::Shared, Work::BuiltinTrials);

    #[test]
    fn a_held_folder_whose_reading_refuses_it_keeps_its_command_txt() {
        let dir = tempfile::tempdir().unwrap();
        let txt = dir.path().join(super::super::COMMAND_TXT);
        std::fs::write(&txt, "gpumux sweep old.yaml\n").unwrap();
        let opened = setup(SHARED, true).open(&job("")).unwrap();
        let refused = opened.held_folder(dir.path(), true, |_, _| {
            Err::<(), _>(Error::Usage("holds results".into()))
        });
        assert!(matches!(refused, Err(Error::Usage(_))));
        assert_eq!(
            std::fs::read_to_string(&txt).unwrap(),
            "gpumux sweep old.yaml\n"
        );
        // Read and taken: command.txt is this run's, with its device.
        let opened = setup(SHARED, true).open(&job("")).unwrap();
        let (session, held) = opened
            .held_folder(dir.path(), true, |d, _| Ok(d.to_path_buf()))
            .unwrap();
        assert_eq!(held, dir.path());
        assert_eq!(session.dir().unwrap(), dir.path());
        let written = std::fs::read_to_string(&txt).unwrap();
        assert!(written.contains("device: cpu"), "{written}");
        assert!(!written.contains("old.yaml"), "{written}");
    }

    #[test]
    fn a_setup_that_opens_no_device_takes_no_lock_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let opened = setup(SHARED, false).open(&job("")).unwrap();
        assert!(opened.resolved().is_err() && opened.data().is_err());
        assert_eq!(opened.modes(), [SplitMode::Shared]);
        let (session, existed) = opened
            .held_folder(&out, false, |d, _| Ok(d.exists()))
            .unwrap();
        assert!(!existed && !out.exists());
        assert!(session.dir().is_err());
    }

    #[test]
    fn a_signal_before_the_folder_stops_the_setup_with_the_folder_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let opened = setup(SHARED, true).open(&job("")).unwrap();
        opened.cancel().drain();
        let stopped = opened.fresh_folder(&out);
        assert!(matches!(stopped, Err(Error::Interrupted(_))));
        assert!(!out.join(super::super::COMMAND_TXT).exists());
    }

    #[test]
    fn the_policy_refuses_before_any_device_and_a_list_keeps_what_runs_here() {
        // `fused` is no mode for threads of one training: refused with no device opened.
        let threads = Modes::One(SplitMode::Fused, Work::Threads("parallel"));
        let e = setup(threads, false).open(&job("")).err().unwrap();
        assert!(matches!(e, Error::Usage(_)), "{e}");
        // A list with a GPU-only mode under `backend: cpu` contradicts itself.
        let listed = job("splits: [shared, green]\n");
        let e = setup(Modes::Listed, true).open(&listed).err().unwrap();
        assert!(e.to_string().contains("green"), "{e}");
        let opened = setup(Modes::Listed, true)
            .open(&job("splits: [shared, logical]\n"))
            .unwrap();
        assert_eq!(opened.modes(), [SplitMode::Shared, SplitMode::Logical]);
        assert!(opened.data().is_ok());
    }
}
