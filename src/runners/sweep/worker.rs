//! One worker of a study (`gpumux sweep --study URL`): the trials the study gives it, each epoch and end recorded in the store as well as in its own folder.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, JobError, Result};
use crate::job::Job;
use crate::plan::{self, TrialSpec};
use crate::report::{self, ProgressRow, TrialRow};
use crate::rounds::say;
use crate::run::Session;
use crate::sched;

use super::setup::Sweep;
use super::study::{self, EpochRow, Heartbeat, Shared, Study, StudyError, StudyKey};
use super::{bayes, finish, hyperband, latest_rows, sweep_trials, Recorded, Trials};

/// How often the epochs recorded here go to the store, at most (one transaction each time).
const EPOCHS_TO_STORE: Duration = Duration::from_millis(500);

/// A sweep as one worker of the study at `url`.
pub(super) struct Worker<'a> {
    pub job: &'a Job,
    pub sweep: &'a Sweep<'a>,
    pub session: &'a Session<'a>,
    pub url: &'a str,
}

/// The key of the study a job's workers share: its name, and a hash of every trial id of its
/// sweep (its model or command, data, epochs, space and seed; a bayes sweep's: those of its
/// random draws), of its method, its metric (name and goal) and its early termination, by
/// which proposals and rungs judge.
fn study_key(job: &Job, all: &[TrialSpec]) -> StudyKey {
    let metric = &job.file.metric;
    let judged = format!(
        "{:?} {} {:?} {:?}",
        job.space.method, metric.name, metric.goal, job.file.early_terminate
    );
    let mut h = crate::hash::fnv1a(b"gpumux study");
    h = crate::hash::fnv1a_more(h, judged.as_bytes());
    for t in all {
        h = crate::hash::fnv1a_more(h, t.id.as_bytes());
    }
    StudyKey {
        job: job.name.clone(),
        space: format!("{h:016x}"),
        goal: metric.goal,
    }
}

/// What goes wrong with a worker while it runs: its store fails (after retries), or a proposal
/// cannot be built into a trial.
#[derive(Default)]
struct Failed {
    store: Option<StudyError>,
    trial: Option<JobError>,
}

impl Failed {
    fn any(&self) -> bool {
        self.store.is_some() || self.trial.is_some()
    }
}

/// Each epoch and end of the trials this worker runs, recorded in the study while it holds
/// them: epochs in batches, an end with its last epochs in one transaction.
struct ToStore<'a> {
    store: &'a Shared,
    beat: &'a Heartbeat,
    failed: &'a RefCell<Failed>,
    epochs: Vec<EpochRow>,
    flushed: Instant,
}

impl ToStore<'_> {
    fn flush(&mut self) {
        if self.epochs.is_empty() || self.failed.borrow().store.is_some() {
            return;
        }
        match study::with_retries(|| study::lock(self.store).record_epochs(&self.epochs)) {
            Ok(_) => self.epochs.clear(),
            Err(e) => {
                self.failed.borrow_mut().store.get_or_insert(e);
            }
        }
        self.flushed = Instant::now();
    }
}

impl Recorded for ToStore<'_> {
    fn epoch(&mut self, trial: &TrialSpec, row: &ProgressRow) {
        match study::encode_epoch(row) {
            Ok(text) => self.epochs.push(EpochRow {
                index: trial.index,
                epoch: row.epoch,
                row: text,
            }),
            Err(e) => tracing::warn!("epoch {} of trial {}: {e}", row.epoch, trial.id),
        }
    }

    fn end(&mut self, o: &sched::TrialOutcome, row: &TrialRow) {
        let index = o.trial.index;
        // Held, and renewed, until its end is recorded.
        let beat = self.beat;
        let _released = Released(|| beat.hold(index, false));
        if self.failed.borrow().store.is_some() {
            return;
        }
        let (mine, rest): (Vec<EpochRow>, Vec<EpochRow>) = std::mem::take(&mut self.epochs)
            .into_iter()
            .partition(|e| e.index == index);
        self.epochs = rest;
        let text = match study::encode_row(row) {
            Ok(t) => t,
            Err(e) => {
                self.failed.borrow_mut().store.get_or_insert(e);
                return;
            }
        };
        let end = study::End {
            state: &row.state,
            metric: row.metric,
            epochs: row.epochs,
            row: &text,
        };
        match study::with_retries(|| study::lock(self.store).finish(index, &end, &mine)) {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                "trial {} ended after the study gave it to another worker: its end is this folder's only",
                o.trial.id
            ),
            Err(e) => {
                self.failed.borrow_mut().store.get_or_insert(e);
            }
        }
    }

    fn idle(&mut self) {
        if self.flushed.elapsed() >= EPOCHS_TO_STORE {
            self.flush();
        }
    }
}

impl Worker<'_> {
    /// Joins the study and runs the trials it gives this worker (grid and random in index
    /// order; bayes proposed from the whole study's history; early termination judged by every
    /// worker's values at each rung), each held under a lease a heartbeat renews. A store that
    /// cannot be opened is refused (exit 2); one that fails during the run, after retries,
    /// stops the worker (exit 3) with every local row kept.
    pub fn run(
        &self,
        previous: Vec<TrialRow>,
        writer: &mut report::ReportWriter,
        out: &mut dyn Write,
    ) -> Result<PathBuf> {
        let (job, sweep, url) = (self.job, self.sweep, self.url);
        let all = sweep_trials(job)?;
        let count = plan::sweep_count(job)?;
        let key = study_key(job, &all);
        let worker = study::worker_name();
        let usage = |e: StudyError| Error::Usage(e.to_string());
        let shown = study::shown(url);
        let store: Shared = Arc::new(Mutex::new(Study::open(url, &key, &worker).map_err(usage)?));
        let beat = Heartbeat::start(Arc::clone(&store));
        let pruner = hyperband::Pruner::of(job).map(|p| {
            let rungs = study::StudyRungs::new(Arc::clone(&store));
            Arc::new(p.shared(Box::new(rungs)))
        });
        let so_far = match study::lock(&store).counts().map_err(usage)? {
            c if c.is_empty() => "a new study".to_string(),
            c => format!("so far {}", in_words(&c)),
        };
        say(
            out,
            format!("study {shown}: joined as worker {worker}; {so_far}, of {count} trials"),
        )?;
        let by_index: BTreeMap<u32, TrialSpec> = all.iter().map(|t| (t.index, t.clone())).collect();
        let lease = study::lease();
        let failed = RefCell::new(Failed::default());
        let tpe = sweep.is_bayes.then(|| bayes::tpe_of(job, count));
        // The trial of index `index`: a bayes one at its point, a grid or random one by its
        // index (`None`: the same draw as an earlier index, recorded DUPLICATE once taken).
        let trial_at = |index: u32, point: Option<&Point>| match point {
            Some(p) => bayes::trial(job, index, p).map(Some),
            None => Ok(by_index.get(&index).cloned()),
        };
        // A new index: its point (a bayes one proposed from the study's history), and the row
        // it keeps should this worker be lost.
        let mut starts = study::StartWith {
            proposes: sweep.is_bayes,
            start: |index: u32, h: Option<&study::History>| {
                let point = match (h, &tpe) {
                    (Some(h), Some(tpe)) => Some(bayes::study_point(job, tpe, index, h)),
                    _ => None,
                };
                let trial = match trial_at(index, point.as_ref()) {
                    Ok(t) => t,
                    Err(e) => {
                        failed.borrow_mut().trial.get_or_insert(e);
                        return None;
                    }
                };
                let row = trial
                    .map(|t| crate::rounds::lost_trial_row(job, sweep.split, &t))
                    .and_then(|r| study::encode_row(&r).ok());
                let point = point.and_then(|p| serde_json::to_string(&p).ok());
                Some(study::Start { point, row })
            },
        };
        // The next trial the study gives this worker.
        let mut feed = |_: Option<&sched::TrialOutcome>| -> Option<TrialSpec> {
            if failed.borrow().any() {
                return None;
            }
            loop {
                let claimed = study::with_retries(|| {
                    study::lock(&store).claim(count, lease, study::now(), Some(&mut starts))
                });
                let c = match claimed {
                    Ok(Some(c)) => c,
                    // Nothing left, or a proposal that could not be built (said at the end).
                    Ok(None) => return None,
                    Err(e) => {
                        failed.borrow_mut().store.get_or_insert(e);
                        return None;
                    }
                };
                let point: Option<Point> = match (&c.point, sweep.is_bayes) {
                    (Some(text), true) => match serde_json::from_str(text) {
                        Ok(point) => Some(point),
                        Err(e) => {
                            let why = format!("the point of trial {} does not read: {e}", c.index);
                            let e = StudyError::Store {
                                url: shown.clone(),
                                why,
                            };
                            failed.borrow_mut().store.get_or_insert(e);
                            return None;
                        }
                    },
                    _ => None,
                };
                match trial_at(c.index, point.as_ref()) {
                    Ok(Some(t)) => {
                        beat.hold(c.index, true);
                        return Some(t);
                    }
                    // The same draw as an earlier index: one trial, run once.
                    Ok(None) => {
                        let end = study::End {
                            state: "DUPLICATE",
                            metric: None,
                            epochs: 0,
                            row: "",
                        };
                        let _ = study::lock(&store).finish(c.index, &end, &[]);
                    }
                    Err(e) => {
                        failed.borrow_mut().trial.get_or_insert(e);
                        return None;
                    }
                }
            }
        };
        let mut to_store = ToStore {
            store: &store,
            beat: &beat,
            failed: &failed,
            epochs: Vec::new(),
            flushed: Instant::now(),
        };
        let trials = Trials {
            sweep,
            session: self.session,
        };
        let to_run = match sweep.is_bayes {
            true => count as usize,
            false => all.len(),
        };
        let cancel = self.session.cancel();
        let mut ran = Vec::new();
        let stopped = loop {
            let (rows, stop) = trials.run(
                &all,
                to_run,
                pruner.clone(),
                (None, &mut *writer),
                Some((&mut feed, &mut to_store)),
                out,
            )?;
            ran.extend(rows);
            if stop.is_some() || failed.borrow().any() || cancel.draining() {
                break stop;
            }
            // Nothing left to take: while other workers run trials, this one stays to take any
            // whose worker is lost, and leaves once none runs.
            match others(&store, count, lease, cancel, out) {
                Ok(true) => continue,
                Ok(false) => break None,
                Err(e) => {
                    failed.borrow_mut().store.get_or_insert(e);
                    break None;
                }
            }
        };
        to_store.flush();
        drop(to_store);
        // Trials taken but never started (a signal came first) go back to the study.
        for index in beat.held() {
            match study::lock(&store).hand_back(index) {
                Ok(_) => beat.hold(index, false),
                Err(e) => tracing::warn!("trial {index} could not be handed back: {e}; it runs again once its lease runs out"),
            }
        }
        drop(beat);
        let failed = failed.into_inner();
        let mine: Vec<String> = ran.iter().map(|r| r.trial_id.clone()).collect();
        let planned = latest_rows(&ran).len();
        let mut rows = previous;
        rows.extend(ran);
        // How the study stands, where the store says (it may be what failed).
        match study::lock(&store).counts() {
            Ok(counts) => say(
                out,
                format!("study {shown}: {} of {count} trials", in_words(&counts)),
            )?,
            Err(e) => tracing::warn!("{e}"),
        }
        if let Some(e) = failed.trial {
            return Err(e.into());
        }
        if let Some(e) = failed.store {
            return Err(Error::Interrupted(format!(
                "the study store failed: {e}; this worker's rows are kept in {}",
                sweep.dir.display()
            )));
        }
        finish(
            job,
            &sweep.dir,
            &mine,
            planned,
            &rows,
            cancel,
            stopped.as_ref(),
            out,
        )?;
        Ok(sweep.dir.clone())
    }
}

/// A study's trials by state, in words: `12 COMPLETE, 3 RUNNING`.
fn in_words(counts: &BTreeMap<String, usize>) -> String {
    let words: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    words.join(", ")
}

/// A point of the space, as a bayes trial's.
type Point = BTreeMap<String, crate::space::ParamValue>;

/// Waits while trials run on other workers and none can be taken: `true` once one can (its
/// worker was lost, or handed it back), `false` when none runs any more or a signal came.
fn others(
    store: &Shared,
    run_cap: u32,
    lease: Duration,
    cancel: &crate::cancel::Cancel,
    out: &mut dyn Write,
) -> std::result::Result<bool, StudyError> {
    let poll = (lease / 3).clamp(Duration::from_millis(200), Duration::from_secs(5));
    let mut said = false;
    loop {
        let open = study::with_retries(|| study::lock(store).open_trials(run_cap, study::now()))?;
        match open {
            Some(true) => return Ok(true),
            None => return Ok(false),
            Some(false) if !said => {
                said = true;
                let _ = say(
                    out,
                    "nothing left to take: waiting while other workers run their trials, to take any whose worker is lost".to_string(),
                );
            }
            Some(false) => {}
        }
        let until = Instant::now() + poll;
        while Instant::now() < until {
            if cancel.draining() {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Runs its function when dropped: on every way out of the scope.
struct Released<F: FnMut()>(F);

impl<F: FnMut()> Drop for Released<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}
