//! A sweep of an external command whose first trials all fail the same way is stopped early: a typo in the command or a missing module would fail every trial, each with the same error.
//!
//! Only a failure at once counts: the trial reported no epoch, and its command could not start,
//! exited with a code, or printed no result. A failure that may come from the trial's own
//! parameters (a memory-cap kill, a signal such as the OOM killer's, a missing or non-finite
//! metric, a trial that trained for an epoch or more) ends the watch instead.
//! Two failures are the same when they are of one kind, with one exit code, and their texts are
//! the same once what is the trial's own is masked: its id (and so its folder), the values of
//! its word parameters, and every word with a digit in it (numeric parameters, seeds, line
//! numbers, process ids, addresses, timings). The text holds stderr's last lines, where a
//! Python traceback ends.

use std::collections::HashSet;

use crate::sched::child::Exit;
use crate::sched::end::Failure;
use crate::sched::{TrialEnd, TrialOutcome};
use crate::space::ParamValue;

/// How many trials must end FAILED the same way, before any ends COMPLETE or fails another
/// way, for the sweep to stop.
pub const SAME_FAILURES: usize = 3;

/// What [`SameFailures::see`] makes of a trial's end.
#[derive(Clone, Debug, PartialEq)]
pub enum Seen {
    /// Nothing to say: the trial completed, was interrupted, or the watch is over.
    Nothing,
    /// The first failure.
    First,
    /// A failure the same as the first one's, by this trial id.
    Same { first: String },
    /// The [`SAME_FAILURES`]th of them: the sweep stops.
    Stop(Stopped),
}

/// Why a sweep stopped early.
#[derive(Clone, Debug, PartialEq)]
pub struct Stopped {
    /// The trials that failed the same way, in the order they ended.
    pub trials: Vec<String>,
    /// The first one's failure, in words.
    pub error: String,
}

impl Stopped {
    /// The sweep's error message: the shared failure once, and what to do.
    pub fn message(&self) -> String {
        format!(
            "stopped after {} trials failed the same way before any completed ({}): {}\n\
             fix the command, then run the sweep again with --resume: it runs the trials that \
             were not started or were ended with the stop",
            self.trials.len(),
            self.trials.join(", "),
            self.error
        )
    }
}

/// Watches the trials' ends, in the order they come.
#[derive(Debug, Default)]
pub struct SameFailures {
    /// The first failure's trial, text and signature.
    first: Option<(String, String, String)>,
    /// The trials that failed that way, the first included.
    trials: Vec<String>,
    /// A trial completed, or failed another way, or the sweep stopped: nothing more to watch.
    over: bool,
    /// The trials that reported an epoch while the watch went on.
    ran: HashSet<String>,
}

impl SameFailures {
    /// Notes that trial `id` reported an epoch: its command runs, so its failure is no failure
    /// at once.
    pub fn ran(&mut self, id: &str) {
        if !self.over && !self.ran.contains(id) {
            self.ran.insert(id.to_string());
        }
    }

    /// Sees the end of one trial.
    pub fn see(&mut self, o: &TrialOutcome) -> Seen {
        if self.over {
            return Seen::Nothing;
        }
        let failure = match &o.end {
            TrialEnd::Interrupted => return Seen::Nothing,
            TrialEnd::Complete(_) | TrialEnd::Pruned(_) => return self.end(),
            TrialEnd::Failed(f) => f,
        };
        let Some(kind) = at_once(failure).filter(|_| !self.ran.contains(&o.trial.id)) else {
            return self.end();
        };
        let error = failure.to_string();
        let sig = format!("{kind}: {}", signature(&error, o));
        let Some((first, first_error, first_sig)) = &self.first else {
            self.first = Some((o.trial.id.clone(), error, sig));
            self.trials.push(o.trial.id.clone());
            return Seen::First;
        };
        if *first_sig != sig {
            return self.end();
        }
        self.trials.push(o.trial.id.clone());
        if self.trials.len() < SAME_FAILURES {
            return Seen::Same {
                first: first.clone(),
            };
        }
        let stopped = Stopped {
            trials: self.trials.clone(),
            error: first_error.clone(),
        };
        self.end();
        Seen::Stop(stopped)
    }

    /// Ends the watch.
    fn end(&mut self) -> Seen {
        self.over = true;
        self.ran = HashSet::new();
        Seen::Nothing
    }
}

/// The kind of a failure that can come at once from a broken command, with its exit code; None
/// for a failure that may come from the trial's own parameters.
fn at_once(failure: &Failure) -> Option<String> {
    match failure {
        Failure::ChildExit {
            exit: Exit::Code(code),
            ..
        } => Some(format!("exit {code}")),
        Failure::Start { .. } => Some("start".into()),
        Failure::NoMetrics { .. } => Some("no metrics".into()),
        Failure::Command(_) => Some("command".into()),
        _ => None,
    }
}

/// A failure's text with what is the trial's own masked (see the module's comment).
fn signature(error: &str, o: &TrialOutcome) -> String {
    let mut text = error.replace(&o.trial.id, "{trial_id}");
    for (name, value) in &o.trial.params {
        // A short word would mask parts of other words.
        if let ParamValue::Word(w) = value {
            if w.chars().count() >= 3 {
                text = text.replace(w.as_str(), &format!("{{{name}}}"));
            }
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.chars().any(|c| c.is_ascii_digit()) {
            out.push('#');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in text.chars() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{SliceSpec, TrialSpec};
    use crate::sched::child::Exit;
    use crate::sched::end::{ChildKind, Failure};
    use crate::train::TrialResult;

    fn trial(id: &str, lr: f64, opt: &str) -> TrialSpec {
        TrialSpec {
            id: id.into(),
            index: 0,
            hyper: crate::plan::mlp_job("").hyper(0).unwrap(),
            params: [
                ("lr".to_string(), ParamValue::Num(lr)),
                ("opt".to_string(), ParamValue::Word(opt.into())),
            ]
            .into(),
            seed: 17,
            fault: None,
        }
    }

    fn failed(id: &str, lr: f64, opt: &str, stderr: &[&str]) -> TrialOutcome {
        TrialOutcome {
            trial: trial(id, lr, opt),
            slice: SliceSpec::at(0, 0),
            end: TrialEnd::Failed(Failure::ChildExit {
                child: ChildKind::Command,
                exit: Exit::Code(1),
                stderr: stderr.iter().map(|s| s.to_string()).collect(),
            }),
            wall_s: 0.1,
        }
    }

    fn complete(id: &str) -> TrialOutcome {
        TrialOutcome {
            end: TrialEnd::Complete(TrialResult {
                test_acc: 0.9,
                final_loss: 0.1,
                epochs: 1,
                wall_s: 0.1,
                train_samples: 0,
                samples_per_s: 0.0,
                peak_mem_bytes: 0,
                param_count: 0,
                metrics: Default::default(),
                ..Default::default()
            }),
            ..failed(id, 0.1, "sgd", &[])
        }
    }

    #[test]
    fn what_is_the_trials_own_is_masked() {
        let a = failed(
            "a1b2",
            0.01,
            "adam",
            &[
                "File \"/out/trials/a1b2/train.py\", line 12, in <module>",
                "ValueError: adam cannot take lr=0.01 (pid 4242, 0x7ffd3a)",
            ],
        );
        let b = failed(
            "c3d4",
            0.3,
            "sgdw",
            &[
                "File \"/out/trials/c3d4/train.py\", line 12, in <module>",
                "ValueError: sgdw cannot take lr=0.3 (pid 77, 0x55aa01)",
            ],
        );
        let sig = |o: &TrialOutcome| signature(&o.error().unwrap_or_default(), o);
        assert_eq!(sig(&a), sig(&b));
        assert!(sig(&a).contains("{opt} cannot take lr=#.#"), "{}", sig(&a));
        let c = failed("e5f6", 0.3, "sgd", &["KeyError: 'momentum'"]);
        assert_ne!(sig(&a), sig(&c));
    }

    #[test]
    fn the_third_same_failure_before_any_completes_stops() {
        let missing = ["ModuleNotFoundError: No module named 'torhc'"];
        let mut w = SameFailures::default();
        assert_eq!(w.see(&failed("t1", 0.1, "sgd", &missing)), Seen::First);
        let mut interrupted = failed("t9", 0.1, "sgd", &[]);
        interrupted.end = TrialEnd::Interrupted;
        assert_eq!(w.see(&interrupted), Seen::Nothing);
        assert_eq!(
            w.see(&failed("t2", 0.2, "sgd", &missing)),
            Seen::Same { first: "t1".into() }
        );
        let Seen::Stop(s) = w.see(&failed("t3", 0.3, "adam", &missing)) else {
            panic!("no stop");
        };
        assert_eq!(s.trials, ["t1", "t2", "t3"]);
        assert!(s
            .error
            .ends_with("stderr: ModuleNotFoundError: No module named 'torhc'"));
        assert!(s.message().starts_with(
            "stopped after 3 trials failed the same way before any completed (t1, t2, t3): "
        ));
        assert_eq!(w.see(&failed("t4", 0.4, "sgd", &missing)), Seen::Nothing);
    }

    #[test]
    fn a_completed_trial_or_another_failure_ends_the_watch() {
        let missing = ["ModuleNotFoundError: No module named 'torhc'"];
        let mut w = SameFailures::default();
        w.see(&failed("t1", 0.1, "sgd", &missing));
        assert_eq!(w.see(&complete("t2")), Seen::Nothing);
        for id in ["t3", "t4", "t5"] {
            assert_eq!(w.see(&failed(id, 0.1, "sgd", &missing)), Seen::Nothing);
        }
        let mut w = SameFailures::default();
        w.see(&failed("t1", 0.1, "sgd", &missing));
        assert_eq!(
            w.see(&failed("t2", 0.1, "sgd", &["MemoryError"])),
            Seen::Nothing
        );
        for id in ["t3", "t4", "t5"] {
            assert_eq!(w.see(&failed(id, 0.1, "sgd", &missing)), Seen::Nothing);
        }
    }

    fn ended(id: &str, failure: Failure) -> TrialOutcome {
        TrialOutcome {
            end: TrialEnd::Failed(failure),
            ..failed(id, 0.1, "sgd", &[])
        }
    }

    #[test]
    fn failures_that_may_come_from_the_parameters_do_not_stop_the_sweep() {
        // Large batches killed for their memory, by the OOM killer, or a NaN metric: the same
        // text for every trial, but no broken command.
        let kinds = [
            Failure::MemoryCap {
                used_mib: 900.0,
                cap_mib: 512.0,
                margin: 0.05,
            },
            Failure::ChildExit {
                child: ChildKind::Command,
                exit: Exit::Signal(9),
                stderr: vec![],
            },
            Failure::MissingMetric {
                metric: "test_acc".into(),
            },
        ];
        for kind in kinds {
            let mut w = SameFailures::default();
            for id in ["t1", "t2", "t3", "t4"] {
                assert_eq!(w.see(&ended(id, kind.clone())), Seen::Nothing, "{kind}");
            }
        }
    }

    #[test]
    fn a_trial_that_reported_an_epoch_did_not_fail_at_once() {
        let oom = ["RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"];
        let mut w = SameFailures::default();
        assert_eq!(w.see(&failed("t1", 0.1, "sgd", &oom)), Seen::First);
        w.ran("t2");
        assert_eq!(w.see(&failed("t2", 0.2, "sgd", &oom)), Seen::Nothing);
        assert_eq!(w.see(&failed("t3", 0.3, "sgd", &oom)), Seen::Nothing);
    }

    #[test]
    fn exit_codes_are_not_masked() {
        let code = |id: &str, c: i32| {
            ended(
                id,
                Failure::ChildExit {
                    child: ChildKind::Command,
                    exit: Exit::Code(c),
                    stderr: vec!["error".into()],
                },
            )
        };
        let mut w = SameFailures::default();
        assert_eq!(w.see(&code("t1", 1)), Seen::First);
        assert_eq!(w.see(&code("t2", 2)), Seen::Nothing);
        assert_eq!(w.see(&code("t3", 1)), Seen::Nothing);
        let mut w = SameFailures::default();
        w.see(&code("t1", 2));
        w.see(&code("t2", 2));
        assert!(matches!(w.see(&code("t3", 2)), Seen::Stop(_)));
    }
}
