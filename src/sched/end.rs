//! A trial's end as a value: COMPLETE with its result, FAILED with a typed reason, or INTERRUPTED; the CSV's words are made from it at the edge.

use std::time::{Duration, Instant};

use super::signals::Cancel;
pub use crate::train::stop::{ChildKind, Failure, Stop};
use crate::train::TrialResult;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::stop::Exit;

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
