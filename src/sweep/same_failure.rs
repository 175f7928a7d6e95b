//! A sweep of an external command whose first trials all fail the same way is stopped early: a typo in the command or a missing module would fail every trial, each with the same error.
//!
//! Two failures are the same when their texts are, once what is the trial's own is masked: its
//! id (and so its folder), the values of its word parameters, and every word with a digit in it
//! (numeric parameters, seeds, line numbers, process ids, addresses, timings). The text holds
//! the failure's kind (an exit code, a signal, a missing metric) and stderr's last lines, where
//! a Python traceback ends.

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
}

impl SameFailures {
    /// Sees the end of one trial.
    pub fn see(&mut self, o: &TrialOutcome) -> Seen {
        if self.over {
            return Seen::Nothing;
        }
        let error = match &o.end {
            TrialEnd::Interrupted => return Seen::Nothing,
            TrialEnd::Complete(_) => {
                self.over = true;
                return Seen::Nothing;
            }
            TrialEnd::Failed(f) => f.to_string(),
        };
        let sig = signature(&error, o);
        let Some((first, first_error, first_sig)) = &self.first else {
            self.first = Some((o.trial.id.clone(), error, sig));
            self.trials.push(o.trial.id.clone());
            return Seen::First;
        };
        if *first_sig != sig {
            self.over = true;
            return Seen::Nothing;
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
        self.over = true;
        Seen::Stop(stopped)
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
}
