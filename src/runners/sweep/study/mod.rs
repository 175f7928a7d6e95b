//! A study shared by the sweep processes that join it (`sqlite:PATH` or `postgresql://…`): which trial each worker runs and at which point, under a lease it renews; each trial's epochs, end and rung values; and the job and space every worker must share, decided in transactions.
//!
//! The store holds five tables. `meta`: the schema version, the study's job name and the hash
//! of its space. `trials`: one row per trial index taken, with its state (`RUNNING`,
//! `COMPLETE`, `PRUNED`, `FAIL` or `INTERRUPTED`), the worker holding it and until when, how
//! many times it was started, the point of the space it runs at (a bayes sweep's proposal),
//! its metric value and epochs, and its result row as the worker wrote it. `epochs`: each
//! trial's progress rows. `rungs`: the metric value of each trial at each rung of early
//! termination, which every worker judges by.
//!
//! A worker takes the next trial with [`Study::claim`]: first a trial whose worker's lease ran
//! out (recorded `INTERRUPTED`, and run again once at its point), or one its worker handed back
//! when a signal stopped it; then the next index below the run cap, at the point the worker
//! proposes from the whole study's history in the same transaction. Every decision is one
//! `BEGIN IMMEDIATE` transaction, so two workers never take one trial, and two proposals made
//! at once each see the other as running.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

mod sql;

pub use sql::shown;
use sql::{Cell, Conn, Kind, Lock, Tx};

/// The store's layout. A store of a higher version is refused: it was written by a newer gpumux.
/// Version 1 (trials without points, epochs or rungs) is brought up to this one when joined.
pub const SCHEMA_VERSION: i64 = 2;

/// How often a trial may start in all: once, and once more after its worker's lease ran out.
/// A trial its worker handed back (a signal stopped it) does not count its start.
pub const MAX_STARTS: i64 = 2;

/// The tables of the current layout in SQLite (made where missing).
const SQLITE_TABLES: &str = "
    CREATE TABLE IF NOT EXISTS trials (
        idx INTEGER PRIMARY KEY,
        state TEXT NOT NULL,
        worker TEXT,
        lease_until REAL,
        starts INTEGER NOT NULL,
        point TEXT,
        metric REAL,
        epochs INTEGER,
        row TEXT
    );
    CREATE INDEX IF NOT EXISTS trials_by_state ON trials (state, lease_until);
    CREATE TABLE IF NOT EXISTS epochs (
        idx INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        row TEXT NOT NULL,
        PRIMARY KEY (idx, epoch)
    );
    CREATE TABLE IF NOT EXISTS rungs (
        bracket INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        trial_id TEXT NOT NULL,
        value REAL NOT NULL,
        PRIMARY KEY (bracket, epoch, trial_id)
    );";

/// The same tables in PostgreSQL: 64-bit integers and floats throughout.
const POSTGRES_TABLES: &str = "
    CREATE TABLE IF NOT EXISTS trials (
        idx BIGINT PRIMARY KEY,
        state TEXT NOT NULL,
        worker TEXT,
        lease_until DOUBLE PRECISION,
        starts BIGINT NOT NULL,
        point TEXT,
        metric DOUBLE PRECISION,
        epochs BIGINT,
        row TEXT
    );
    CREATE INDEX IF NOT EXISTS trials_by_state ON trials (state, lease_until);
    CREATE TABLE IF NOT EXISTS epochs (
        idx BIGINT NOT NULL,
        epoch BIGINT NOT NULL,
        row TEXT NOT NULL,
        PRIMARY KEY (idx, epoch)
    );
    CREATE TABLE IF NOT EXISTS rungs (
        bracket BIGINT NOT NULL,
        epoch BIGINT NOT NULL,
        trial_id TEXT NOT NULL,
        value DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (bracket, epoch, trial_id)
    );";

/// The tables a claim changes, locked against every other writer: one claim at a time, after
/// the ends and epochs being written (PostgreSQL's SHARE ROW EXCLUSIVE waits for them). An end
/// or an epoch then changes its own rows only, and several are written at once.
const CLAIM_TABLES: Lock = Lock::Tables(&["trials", "epochs"]);

/// Why a study store cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    #[error("study `{0}`: expected sqlite:PATH (a file on a disk every worker can lock) or postgresql://USER@HOST:PORT/DATABASE")]
    BadUrl(String),
    #[error("study `{url}` cannot be opened: {why}")]
    Unreachable { url: String, why: String },
    #[error("study `{url}` has schema version {found}, newer than this gpumux reads ({SCHEMA_VERSION}): use the gpumux that made it, or a newer one")]
    Newer { url: String, found: i64 },
    #[error("study `{url}` belongs to job `{theirs}` (space {their_space}); job `{ours}` has space {our_space}: two jobs with different spaces cannot share a study")]
    OtherSpace {
        url: String,
        theirs: String,
        their_space: String,
        ours: String,
        our_space: String,
    },
    #[error("study `{url}` is not a gpumux study: it has no schema version")]
    NotAStudy { url: String },
    #[error("study `{url}`: {why}")]
    Store { url: String, why: String },
}

/// What every worker of a study shares: the job's name and a hash of its space (and of what
/// else makes its trials the same trials: the seed, the data, the epochs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StudyKey {
    pub job: String,
    pub space: String,
    /// Whether a larger metric is better: kept for `gpumux export` to name the best trial.
    pub goal: crate::job::Goal,
}

/// A goal as the store keeps it.
fn goal_name(goal: crate::job::Goal) -> &'static str {
    match goal {
        crate::job::Goal::Maximize => "maximize",
        crate::job::Goal::Minimize => "minimize",
    }
}

/// A trial a worker holds: its index, how many times it has started (2: it runs again after a
/// worker that held it was lost), and the point it runs at, where the study keeps one (a bayes
/// sweep's proposal, as JSON).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub index: u32,
    pub starts: i64,
    pub point: Option<String>,
}

/// A trial of the study that ended, as a proposal sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Ended {
    /// Its point, as JSON.
    pub point: String,
    /// `COMPLETE`, `PRUNED` or `FAIL`.
    pub state: String,
    pub metric: Option<f64>,
    pub epochs: u32,
}

/// The whole study's trials at the moment of a proposal: those that ended, and the points of
/// those running.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    pub ended: Vec<Ended>,
    pub running: Vec<String>,
}

/// How a trial ended, as the study records it: its state, metric value and epochs, and its
/// result row (JSON).
#[derive(Clone, Copy, Debug)]
pub struct End<'a> {
    pub state: &'a str,
    pub metric: Option<f64>,
    pub epochs: u32,
    pub row: &'a str,
}

/// A trial's epoch row (JSON), by trial index and epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochRow {
    pub index: u32,
    pub epoch: u32,
    pub row: String,
}

/// How a worker starts a new trial index, in the transaction that takes it.
pub trait Starts {
    /// Whether the point is proposed from the study's history (a bayes sweep's), which is then
    /// read for it.
    fn proposes(&self) -> bool;
    /// New trial `index`: its point (JSON; `None` for a grid or random trial, whose index
    /// says it), given the history where [`Starts::proposes`], and the result row it keeps
    /// should its worker be lost (`INTERRUPTED`, as it is then recorded). `None` when it
    /// cannot: nothing is taken.
    fn start(&mut self, index: u32, history: Option<&History>) -> Option<Start>;
}

/// A new trial's point and the row it keeps should its worker be lost ([`Starts`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Start {
    pub point: Option<String>,
    pub row: Option<String>,
}

/// [`Starts`] from a function.
pub struct StartWith<F> {
    pub proposes: bool,
    pub start: F,
}

impl<F: FnMut(u32, Option<&History>) -> Option<Start>> Starts for StartWith<F> {
    fn proposes(&self) -> bool {
        self.proposes
    }

    fn start(&mut self, index: u32, history: Option<&History>) -> Option<Start> {
        (self.start)(index, history)
    }
}

/// One worker's connection to a study.
pub struct Study {
    conn: Conn,
    url: String,
    worker: String,
}

/// The file of a `sqlite:PATH` study; `None` for a PostgreSQL one; refused for anything else.
pub fn sqlite_path(url: &str) -> Result<Option<PathBuf>, StudyError> {
    match sql::kind(url) {
        Some(Kind::Sqlite(path)) => Ok(Some(path)),
        Some(Kind::Postgres) => Ok(None),
        None => Err(StudyError::BadUrl(shown(url))),
    }
}

/// An index as the store keeps it.
fn int(i: u32) -> i64 {
    i64::from(i)
}

/// A value of the `meta` table.
fn meta(tx: &mut Tx, key: &str) -> Result<Option<String>, String> {
    let row = tx.row("SELECT value FROM meta WHERE key = ?1", &[&key])?;
    Ok(row.and_then(|r| r.first().and_then(Cell::text)))
}

/// What went wrong at the store, as a study's error.
enum Fault {
    Store(String),
    Study(StudyError),
}

impl From<String> for Fault {
    fn from(why: String) -> Fault {
        Fault::Store(why)
    }
}

impl From<StudyError> for Fault {
    fn from(e: StudyError) -> Fault {
        Fault::Study(e)
    }
}

/// Brings a store of schema `version` up to the current layout (refused when newer than this
/// gpumux's).
fn upgraded(tx: &mut Tx, url: &str, version: &str) -> Result<(), Fault> {
    let found: i64 = version.parse().map_err(|_| StudyError::Store {
        url: shown(url),
        why: format!("its schema version `{version}` is not a number"),
    })?;
    if found > SCHEMA_VERSION {
        return Err(StudyError::Newer {
            url: shown(url),
            found,
        }
        .into());
    }
    let tables = match tx {
        Tx::Lite(_) => SQLITE_TABLES,
        Tx::Pg(..) => POSTGRES_TABLES,
    };
    if found < 2 {
        tx.batch(
            "ALTER TABLE trials ADD COLUMN point TEXT;
             ALTER TABLE trials ADD COLUMN metric REAL;
             ALTER TABLE trials ADD COLUMN epochs INTEGER;",
        )?;
    }
    tx.batch(tables)?;
    if found < SCHEMA_VERSION {
        tx.exec(
            "UPDATE meta SET value = ?1 WHERE key = 'version'",
            &[&SCHEMA_VERSION.to_string()],
        )?;
    }
    Ok(())
}

/// The study's history ([`History`]), read in the transaction of a claim.
fn history(tx: &mut Tx) -> Result<History, String> {
    let mut h = History::default();
    for r in tx.rows(
        "SELECT point, state, metric, epochs FROM trials
         WHERE point IS NOT NULL AND state IN ('COMPLETE', 'PRUNED', 'FAIL') ORDER BY idx",
        &[],
    )? {
        h.ended.push(Ended {
            point: r[0].text().unwrap_or_default(),
            state: r[1].text().unwrap_or_default(),
            metric: r[2].real(),
            epochs: r[3].int().and_then(|e| u32::try_from(e).ok()).unwrap_or(0),
        });
    }
    for r in tx.rows(
        "SELECT point FROM trials WHERE point IS NOT NULL
             AND (state = 'RUNNING' OR (state = 'INTERRUPTED' AND starts < ?1)) ORDER BY idx",
        &[&MAX_STARTS],
    )? {
        h.running.extend(r[0].text());
    }
    Ok(h)
}

/// Inserts epoch rows: of trials `holder` holds (others' are left out), or, without a holder,
/// all (those of a trial ended in the same transaction); how many.
fn insert_epochs(tx: &mut Tx, holder: Option<&str>, rows: &[EpochRow]) -> Result<usize, String> {
    let mut n = 0;
    for r in rows {
        let (index, epoch) = (int(r.index), int(r.epoch));
        n += match holder {
            Some(worker) => tx.exec(
                "INSERT INTO epochs (idx, epoch, row)
                 SELECT CAST(?1 AS BIGINT), CAST(?2 AS BIGINT), CAST(?3 AS TEXT) WHERE EXISTS
                     (SELECT 1 FROM trials WHERE idx = ?1 AND worker = ?4 AND state = 'RUNNING')
                 ON CONFLICT (idx, epoch) DO UPDATE SET row = excluded.row",
                &[&index, &epoch, &r.row, &worker],
            )?,
            None => tx.exec(
                "INSERT INTO epochs (idx, epoch, row) VALUES (?1, ?2, ?3)
                 ON CONFLICT (idx, epoch) DO UPDATE SET row = excluded.row",
                &[&index, &epoch, &r.row],
            )?,
        } as usize;
    }
    Ok(n)
}

impl Study {
    /// Joins the study at `url` as `worker` (a name unique among its workers), creating it
    /// for `key` when it is new. Refused: a URL that is not a study's, a store that cannot be
    /// reached, one of a newer schema, or of another job's space.
    pub fn open(url: &str, key: &StudyKey, worker: &str) -> Result<Study, StudyError> {
        let mut study = Study::connect(url, worker)?;
        study.join(key)?;
        Ok(study)
    }

    /// A connection to the store at `url` as `worker`, nothing read yet. The URL is kept whole
    /// (to open the connection again); it is shown only through [`shown`].
    fn connect(url: &str, worker: &str) -> Result<Study, StudyError> {
        sqlite_path(url)?;
        let conn = Conn::open(url).map_err(|why| StudyError::Unreachable {
            url: shown(url),
            why,
        })?;
        Ok(Study {
            conn,
            url: url.to_string(),
            worker: worker.to_string(),
        })
    }

    /// Opens the existing study at `url` to read it (`gpumux export`): refused when there is
    /// no such store, when it is not a study, or when its schema is newer.
    pub fn open_existing(url: &str) -> Result<Study, StudyError> {
        if let Some(path) = sqlite_path(url)? {
            if !path.is_file() {
                return Err(StudyError::Unreachable {
                    url: shown(url),
                    why: format!("there is no file {}", path.display()),
                });
            }
        }
        let mut study = Study::connect(url, "")?;
        let not_a_study = || StudyError::NotAStudy { url: shown(url) };
        if !study
            .conn
            .has_table("meta")
            .map_err(|e| study.fault(e.into()))?
        {
            return Err(not_a_study());
        }
        // Read only, unless the store is of an older layout (then brought up to date once).
        let version = study
            .read(|tx| meta(tx, "version"))?
            .ok_or_else(not_a_study)?;
        if version != SCHEMA_VERSION.to_string() {
            study.write(Lock::Setup, |tx, url| upgraded(tx, url, &version))?;
        }
        Ok(study)
    }

    /// A fault at the store, as a study's error.
    fn fault(&self, f: Fault) -> StudyError {
        match f {
            Fault::Study(e) => e,
            Fault::Store(why) => StudyError::Store {
                url: shown(&self.url),
                why,
            },
        }
    }

    /// Runs `op` in one transaction holding `lock`, and commits it; nothing is committed when
    /// `op` fails. A lost connection (PostgreSQL) is opened again first.
    fn write<T>(
        &mut self,
        lock: Lock,
        op: impl FnOnce(&mut Tx, &str) -> Result<T, Fault>,
    ) -> Result<T, StudyError> {
        if self.conn.is_lost() {
            self.conn = Conn::open(&self.url).map_err(|why| StudyError::Store {
                url: shown(&self.url),
                why: format!("the connection was lost and cannot be opened again: {why}"),
            })?;
        }
        let url = self.url.clone();
        let run = |conn: &mut Conn| -> Result<T, Fault> {
            let mut tx = conn.begin(lock)?;
            let v = op(&mut tx, &url)?;
            tx.commit()?;
            Ok(v)
        };
        run(&mut self.conn).map_err(|f| self.fault(f))
    }

    /// Reads in one transaction.
    fn read<T>(&mut self, op: impl FnOnce(&mut Tx) -> Result<T, String>) -> Result<T, StudyError> {
        self.write(Lock::Nothing, |tx, _| op(tx).map_err(Fault::Store))
    }

    /// The study's job name and goal (maximize where the store does not say).
    pub fn job_and_goal(&mut self) -> Result<(String, crate::job::Goal), StudyError> {
        self.read(|tx| {
            let job = meta(tx, "job")?.unwrap_or_default();
            let goal = match meta(tx, "goal")?.as_deref() {
                Some("minimize") => crate::job::Goal::Minimize,
                _ => crate::job::Goal::Maximize,
            };
            Ok((job, goal))
        })
    }

    /// Creates the tables of a new store, and checks an existing one's version and key.
    fn join(&mut self, key: &StudyKey) -> Result<(), StudyError> {
        self.write(Lock::Setup, |tx, url| {
            tx.batch(
                "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
            )?;
            match meta(tx, "version")? {
                None => {
                    let tables = match tx {
                        Tx::Lite(_) => SQLITE_TABLES,
                        Tx::Pg(..) => POSTGRES_TABLES,
                    };
                    tx.batch(tables)?;
                    for (k, v) in [
                        ("version", SCHEMA_VERSION.to_string()),
                        ("job", key.job.clone()),
                        ("space", key.space.clone()),
                        ("goal", goal_name(key.goal).to_string()),
                    ] {
                        tx.exec("INSERT INTO meta (key, value) VALUES (?1, ?2)", &[&k, &v])?;
                    }
                }
                Some(v) => {
                    upgraded(tx, url, &v)?;
                    let theirs = meta(tx, "job")?.unwrap_or_default();
                    let their_space = meta(tx, "space")?.unwrap_or_default();
                    if their_space != key.space {
                        return Err(StudyError::OtherSpace {
                            url: shown(url),
                            theirs,
                            their_space,
                            ours: key.job.clone(),
                            our_space: key.space.clone(),
                        }
                        .into());
                    }
                }
            }
            Ok(())
        })
    }

    /// Takes the next trial to run at time `now` (seconds since the epoch), held for `lease`:
    /// first, trials whose worker's lease ran out are recorded `INTERRUPTED`, and the first
    /// `INTERRUPTED` trial that has started fewer than [`MAX_STARTS`] times is taken again, at
    /// its point; else the next index below `run_cap`, at the point and with the row `starts`
    /// gives it (none without). `None` when there is nothing left to take, or when `starts`
    /// gave nothing (nothing is taken then).
    pub fn claim(
        &mut self,
        run_cap: u32,
        lease: Duration,
        now: f64,
        starts: Option<&mut dyn Starts>,
    ) -> Result<Option<Claim>, StudyError> {
        let until = now + lease.as_secs_f64();
        let worker = self.worker.clone();
        self.write(CLAIM_TABLES, |tx, _| {
            tx.exec(
                "UPDATE trials SET state = 'INTERRUPTED'
                 WHERE state = 'RUNNING' AND lease_until < ?1",
                &[&now],
            )?;
            let again = tx.row(
                "SELECT idx, starts, point FROM trials WHERE state = 'INTERRUPTED' AND starts < ?1
                 ORDER BY idx LIMIT 1",
                &[&MAX_STARTS],
            )?;
            if let Some(r) = again {
                let (idx, starts, point) = (
                    r[0].int().unwrap_or(-1),
                    r[1].int().unwrap_or(0),
                    r[2].text(),
                );
                tx.exec(
                    "UPDATE trials SET state = 'RUNNING', worker = ?2, lease_until = ?3,
                     starts = starts + 1 WHERE idx = ?1",
                    &[&idx, &worker, &until],
                )?;
                // The epochs of the run that was lost are not this one's.
                tx.exec("DELETE FROM epochs WHERE idx = ?1", &[&idx])?;
                return Ok(claimed(idx, starts + 1, point));
            }
            let next = tx
                .row("SELECT COALESCE(MAX(idx) + 1, 0) FROM trials", &[])?
                .and_then(|r| r[0].int())
                .unwrap_or(0);
            if next >= i64::from(run_cap) {
                return Ok(None);
            }
            let start = match starts {
                None => Start::default(),
                Some(starts) => {
                    let h = match starts.proposes() {
                        true => Some(history(tx)?),
                        false => None,
                    };
                    // Nothing is committed: nothing taken.
                    let Some(start) = starts.start(next as u32, h.as_ref()) else {
                        return Err(Fault::Store(String::new()));
                    };
                    start
                }
            };
            tx.exec(
                "INSERT INTO trials (idx, state, worker, lease_until, starts, point, row)
                 VALUES (?1, 'RUNNING', ?2, ?3, 1, ?4, ?5)",
                &[&next, &worker, &until, &start.point, &start.row],
            )?;
            Ok(claimed(next, 1, start.point))
        })
        .or_else(|e| match e {
            // No point proposed: nothing taken, and nothing wrong with the store.
            StudyError::Store { why, .. } if why.is_empty() => Ok(None),
            e => Err(e),
        })
    }

    /// Renews this worker's lease on trial `index` until `now + lease`; `false` when it no
    /// longer holds it (its lease ran out and the trial was taken again).
    pub fn renew(&mut self, index: u32, lease: Duration, now: f64) -> Result<bool, StudyError> {
        let until = now + lease.as_secs_f64();
        let worker = self.worker.clone();
        self.write(Lock::Rows, |tx, _| {
            let n = tx.exec(
                "UPDATE trials SET lease_until = ?3, state = 'RUNNING'
                 WHERE idx = ?1 AND worker = ?2 AND state IN ('RUNNING', 'INTERRUPTED')",
                &[&int(index), &worker, &until],
            )?;
            Ok(n == 1)
        })
    }

    /// Records epoch rows of trials this worker holds, in one transaction (those of a trial it
    /// no longer holds are left out); how many were recorded.
    pub fn record_epochs(&mut self, rows: &[EpochRow]) -> Result<usize, StudyError> {
        let worker = self.worker.clone();
        self.write(Lock::Rows, |tx, _| {
            Ok(insert_epochs(tx, Some(&worker), rows)?)
        })
    }

    /// Records the end of trial `index`, with its last epoch rows, when this worker still holds
    /// it; `false` when it does not (the end is then not the study's: another worker runs the
    /// trial again). A trial that ends `INTERRUPTED` here was handed back (a signal stopped
    /// this worker): its start is not counted, and any worker takes it again.
    pub fn finish(
        &mut self,
        index: u32,
        end: &End,
        epochs: &[EpochRow],
    ) -> Result<bool, StudyError> {
        let worker = self.worker.clone();
        let epochs_done = i64::from(end.epochs);
        // The trial's row first: a claim that would take it again waits for this end.
        self.write(Lock::Rows, |tx, _| {
            let n = tx.exec(
                "UPDATE trials SET state = ?3, row = ?4, metric = ?5, epochs = ?6,
                     worker = NULL, lease_until = NULL,
                     starts = CASE WHEN ?3 = 'INTERRUPTED' THEN starts - 1 ELSE starts END
                 WHERE idx = ?1 AND worker = ?2 AND state IN ('RUNNING', 'INTERRUPTED')",
                &[
                    &int(index),
                    &worker,
                    &end.state,
                    &end.row,
                    &end.metric,
                    &epochs_done,
                ],
            )?;
            // Ended here: its last epochs are its own.
            if n == 1 {
                insert_epochs(tx, None, epochs)?;
            }
            Ok(n == 1)
        })
    }

    /// Hands trial `index` back to the study without an end, when this worker still holds it:
    /// taken but never started (a signal came first). Its start is not counted; any worker
    /// takes it again. Whether it was this worker's.
    pub fn hand_back(&mut self, index: u32) -> Result<bool, StudyError> {
        let worker = self.worker.clone();
        self.write(Lock::Rows, |tx, _| {
            let n = tx.exec(
                "UPDATE trials SET state = 'INTERRUPTED', worker = NULL, lease_until = NULL,
                     starts = starts - 1
                 WHERE idx = ?1 AND worker = ?2 AND state IN ('RUNNING', 'INTERRUPTED')",
                &[&int(index), &worker],
            )?;
            Ok(n == 1)
        })
    }

    /// Records trial `trial_id`'s metric `value` at a rung (`bracket`, `epoch`) and returns
    /// every value recorded there, by trial id, all workers' (one transaction).
    pub fn rung(
        &mut self,
        bracket: usize,
        epoch: u32,
        trial_id: &str,
        value: f64,
    ) -> Result<BTreeMap<String, f64>, StudyError> {
        let bracket = bracket as i64;
        self.write(Lock::Tables(&["rungs"]), |tx, _| {
            tx.exec(
                "INSERT INTO rungs (bracket, epoch, trial_id, value) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (bracket, epoch, trial_id) DO UPDATE SET value = excluded.value",
                &[&bracket, &int(epoch), &trial_id, &value],
            )?;
            let rows = tx.rows(
                "SELECT trial_id, value FROM rungs WHERE bracket = ?1 AND epoch = ?2",
                &[&bracket, &int(epoch)],
            )?;
            Ok(rows
                .into_iter()
                .filter_map(|r| Some((r[0].text()?, r[1].real()?)))
                .collect())
        })
    }

    /// Whether the study may still give a trial at `now`: `Some(true)` when one can be taken
    /// (a lost worker's, or one handed back), `Some(false)` when trials run on other workers
    /// (one may yet be lost), `None` when nothing runs and nothing is left to take below
    /// `run_cap`.
    pub fn open_trials(&mut self, run_cap: u32, now: f64) -> Result<Option<bool>, StudyError> {
        let r = self.read(|tx| {
            tx.row(
                "SELECT
                     COALESCE(SUM(CASE WHEN state = 'RUNNING' THEN 1 ELSE 0 END), 0),
                     COALESCE(SUM(CASE WHEN state = 'RUNNING' AND lease_until < ?1 THEN 1 ELSE 0 END), 0),
                     COALESCE(SUM(CASE WHEN state = 'INTERRUPTED' AND starts < ?2 THEN 1 ELSE 0 END), 0),
                     COALESCE(MAX(idx) + 1, 0)
                 FROM trials",
                &[&now, &MAX_STARTS],
            )
        })?;
        let n = |i: usize| r.as_ref().and_then(|r| r.get(i)?.int()).unwrap_or(0);
        let (running, expired, again, taken) = (n(0), n(1), n(2), n(3));
        Ok(
            match (
                expired + again > 0 || taken < i64::from(run_cap),
                running > 0,
            ) {
                (true, _) => Some(true),
                (false, true) => Some(false),
                (false, false) => None,
            },
        )
    }

    /// How many trials are in each state.
    pub fn counts(&mut self) -> Result<BTreeMap<String, usize>, StudyError> {
        let rows =
            self.read(|tx| tx.rows("SELECT state, COUNT(*) FROM trials GROUP BY state", &[]))?;
        Ok(rows
            .into_iter()
            .filter_map(|r| Some((r[0].text()?, usize::try_from(r[1].int()?).ok()?)))
            .collect())
    }

    /// Every trial's index, state and result row, by index.
    pub fn trials(&mut self) -> Result<Vec<(u32, String, Option<String>)>, StudyError> {
        let rows =
            self.read(|tx| tx.rows("SELECT idx, state, row FROM trials ORDER BY idx", &[]))?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let idx = u32::try_from(r[0].int()?).ok()?;
                Some((idx, r[1].text()?, r[2].text()))
            })
            .collect())
    }

    /// Every epoch row, by trial index and epoch, handed to `each` one at a time, read a
    /// thousand at a time.
    pub fn each_epoch(
        &mut self,
        each: &mut dyn FnMut(EpochRow) -> Result<(), StudyError>,
    ) -> Result<(), StudyError> {
        const PAGE: i64 = 1000;
        let mut after: (i64, i64) = (-1, -1);
        loop {
            let rows = self.read(|tx| {
                tx.rows(
                    "SELECT idx, epoch, row FROM epochs
                     WHERE idx > ?1 OR (idx = ?1 AND epoch > ?2)
                     ORDER BY idx, epoch LIMIT ?3",
                    &[&after.0, &after.1, &PAGE],
                )
            })?;
            let last = rows.len() < PAGE as usize;
            for r in rows {
                let (Some(idx), Some(epoch)) = (r[0].int(), r[1].int()) else {
                    continue;
                };
                after = (idx, epoch);
                let Some(row) = r[2].text() else { continue };
                if let (Ok(index), Ok(epoch)) = (u32::try_from(idx), u32::try_from(epoch)) {
                    each(EpochRow { index, epoch, row })?;
                }
            }
            if last {
                return Ok(());
            }
        }
    }
}

/// A claim as the store gave it.
fn claimed(idx: i64, starts: i64, point: Option<String>) -> Option<Claim> {
    u32::try_from(idx).ok().map(|index| Claim {
        index,
        starts,
        point,
    })
}

/// A worker's connection to its study, shared by its threads (the trials' ends, the heartbeat,
/// the rungs): one connection per worker, as a PostgreSQL server counts them.
pub type Shared = Arc<Mutex<Study>>;

/// The shared connection, for one use.
pub fn lock(shared: &Shared) -> MutexGuard<'_, Study> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// The rungs of early termination kept in a study, judged through the worker's connection.
pub struct StudyRungs {
    study: Shared,
}

impl StudyRungs {
    pub fn new(study: Shared) -> StudyRungs {
        StudyRungs { study }
    }
}

impl std::fmt::Debug for StudyRungs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StudyRungs")
    }
}

impl super::hyperband::SharedRungs for StudyRungs {
    fn record(
        &self,
        bracket: usize,
        epoch: u32,
        trial_id: &str,
        value: f64,
    ) -> Result<BTreeMap<String, f64>, String> {
        with_retries(|| lock(&self.study).rung(bracket, epoch, trial_id, value))
            .map_err(|e| e.to_string())
    }
}

/// A results row as the store keeps it: one CSV record of its fields in their order (what
/// JSON cannot hold, a value that is not finite, a CSV field holds).
pub fn encode_row<T: serde::Serialize>(row: &T) -> Result<String, StudyError> {
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    let bad = |why: String| StudyError::Store {
        url: String::new(),
        why: format!("a row cannot be encoded: {why}"),
    };
    w.serialize(row).map_err(|e| bad(e.to_string()))?;
    let bytes = w.into_inner().map_err(|e| bad(e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| bad(e.to_string()))
}

/// A results row from the store's record ([`encode_row`]); `None` when it does not read.
pub fn decode_row<T: serde::de::DeserializeOwned>(text: &str) -> Option<T> {
    csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(text.as_bytes())
        .deserialize()
        .next()?
        .ok()
}

/// An epoch's row as the store keeps it: its record ([`encode_row`]), then on a second line
/// its other values (an external command's) as JSON, those that are finite.
pub fn encode_epoch(row: &crate::report::ProgressRow) -> Result<String, StudyError> {
    let mut text = encode_row(row)?;
    if !row.extra.is_empty() {
        let finite: BTreeMap<&String, &f64> =
            row.extra.iter().filter(|(_, v)| v.is_finite()).collect();
        text.push_str(&serde_json::to_string(&finite).unwrap_or_default());
    }
    Ok(text)
}

/// An epoch's row from the store's text ([`encode_epoch`]).
pub fn decode_epoch(text: &str) -> Option<crate::report::ProgressRow> {
    let (record, extra) = match text.split_once('\n') {
        Some((r, e)) => (r, e),
        None => (text, ""),
    };
    let mut row: crate::report::ProgressRow = decode_row(record)?;
    if !extra.trim().is_empty() {
        row.extra = serde_json::from_str(extra).ok()?;
    }
    Some(row)
}

/// How long a worker's hold on a trial lasts without renewal: `GPUMUX_STUDY_LEASE_S` seconds
/// (default 60); a worker renews every third of it.
pub fn lease() -> Duration {
    std::env::var("GPUMUX_STUDY_LEASE_S")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.5)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(Duration::from_secs(60))
}

/// Seconds since the epoch, as the store's leases count them.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This worker's name in a study: the host and the process.
pub fn worker_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!("{host}-{}", std::process::id())
}

/// Runs `op` on the store, and again after 0.5, 1 and 2 s when it fails (a store busy or gone
/// for a moment); the last error when every try failed.
pub fn with_retries<T>(mut op: impl FnMut() -> Result<T, StudyError>) -> Result<T, StudyError> {
    const TRIES: u32 = 4;
    let (mut wait, mut tried) = (Duration::from_millis(500), 0);
    loop {
        tried += 1;
        match op() {
            Ok(v) => return Ok(v),
            // What no retry mends, and the last try's error.
            Err(e @ (StudyError::Newer { .. } | StudyError::OtherSpace { .. })) => return Err(e),
            Err(e) if tried >= TRIES => return Err(e),
            Err(e) => {
                tracing::warn!("{e}; trying again in {:.1} s", wait.as_secs_f64());
                std::thread::sleep(wait);
                wait *= 2;
            }
        }
    }
}

/// The trials a worker holds, renewed every third of the lease by a thread of its own (through
/// the worker's shared connection) until it is dropped.
pub struct Heartbeat {
    held: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<u32>>>,
    /// Dropped to stop the thread: it waits on the other end between renewals.
    stop: Option<crossbeam_channel::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    /// Starts renewing, through the worker's connection.
    pub fn start(study: Shared) -> Heartbeat {
        let held: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<u32>>> =
            Default::default();
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let h = std::sync::Arc::clone(&held);
        let thread = std::thread::spawn(move || {
            let lease = lease();
            while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(lease / 3)
            {
                let indices: Vec<u32> = h
                    .lock()
                    .map(|g| g.iter().copied().collect())
                    .unwrap_or_default();
                for index in indices {
                    match lock(&study).renew(index, lease, now()) {
                        Ok(true) => {}
                        Ok(false) => tracing::warn!(
                            "the study gave trial {index} to another worker: this worker's hold on it ran out"
                        ),
                        Err(e) => tracing::warn!("renewing the hold on trial {index}: {e}"),
                    }
                }
            }
        });
        Heartbeat {
            held,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The trials held now.
    pub fn held(&self) -> Vec<u32> {
        self.held
            .lock()
            .map(|g| g.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Trial `index` is held (`true`) or no longer (`false`).
    pub fn hold(&self, index: u32, held: bool) {
        if let Ok(mut g) = self.held.lock() {
            if held {
                g.insert(index);
            } else {
                g.remove(&index);
            }
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(10);

    fn key(space: &str) -> StudyKey {
        StudyKey {
            job: "j".into(),
            space: space.into(),
            goal: crate::job::Goal::Maximize,
        }
    }

    fn end<'a>(state: &'a str, row: &'a str) -> End<'a> {
        End {
            state,
            metric: None,
            epochs: 0,
            row,
        }
    }

    fn url(dir: &tempfile::TempDir) -> String {
        format!("sqlite:{}", dir.path().join("study.db").display())
    }

    /// A fresh store for the test `name`: SQLite in a temporary folder and, when
    /// GPUMUX_TEST_POSTGRES names a PostgreSQL server (CI starts one), a new database there.
    fn stores(name: &str) -> Vec<(String, Option<tempfile::TempDir>)> {
        let dir = tempfile::tempdir().unwrap();
        let mut out = vec![(url(&dir), Some(dir))];
        out.extend(fresh_postgres(name).map(|u| (u, None)));
        out
    }

    /// A new, empty database `gpumux_<name>` on the server GPUMUX_TEST_POSTGRES names (a URL
    /// of one of its databases), and its URL.
    pub fn fresh_postgres(name: &str) -> Option<String> {
        let base = std::env::var("GPUMUX_TEST_POSTGRES")
            .ok()
            .filter(|s| !s.is_empty())?;
        let mut c = postgres::Client::connect(&base, postgres::NoTls)
            .expect("GPUMUX_TEST_POSTGRES names a server that answers");
        let db = format!("gpumux_{}", name.to_lowercase());
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
            .unwrap();
        c.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
        let (server, _) = base.rsplit_once('/').expect("a URL with a database");
        Some(format!("{server}/{db}"))
    }

    #[test]
    fn workers_take_each_index_once_up_to_the_run_cap() {
        for (store, _dir) in stores("workers_take_each_index_once_up_to_the_r") {
            let (mut a, mut b) = (
                Study::open(&store, &key("s"), "a").unwrap(),
                Study::open(&store, &key("s"), "b").unwrap(),
            );
            let mut got = Vec::new();
            for i in 0..6 {
                let w = if i % 2 == 0 { &mut a } else { &mut b };
                got.push(w.claim(5, LEASE, 100.0, None).unwrap().map(|c| c.index));
            }
            assert_eq!(got, [Some(0), Some(1), Some(2), Some(3), Some(4), None]);
            // Only the holder records a trial's end.
            assert!(!b.finish(0, &end("COMPLETE", "r0"), &[]).unwrap());
            assert!(a.finish(0, &end("COMPLETE", "r0"), &[]).unwrap());
            assert!(
                !a.finish(0, &end("COMPLETE", "r0"), &[]).unwrap(),
                "ended once"
            );
            let counts = a.counts().unwrap();
            assert_eq!((counts["COMPLETE"], counts["RUNNING"]), (1, 4));
        }
    }

    #[test]
    fn a_lost_workers_trial_is_interrupted_and_taken_again_once() {
        for (store, _dir) in stores("a_lost_workers_trial_is_interrupted_and_") {
            let mut a = Study::open(&store, &key("s"), "a").unwrap();
            let mut b = Study::open(&store, &key("s"), "b").unwrap();
            assert_eq!(a.claim(3, LEASE, 100.0, None).unwrap().unwrap().index, 0);
            // A renews in time once, then is lost: its lease runs out at 120.
            assert!(a.renew(0, LEASE, 110.0).unwrap());
            let again = b.claim(3, LEASE, 121.0, None).unwrap().unwrap();
            assert_eq!((again.index, again.starts), (0, 2));
            // The lost worker neither renews nor ends it any more.
            assert!(!a.renew(0, LEASE, 121.5).unwrap());
            assert!(!a.finish(0, &end("COMPLETE", "late"), &[]).unwrap());
            // Lost a second time: recorded INTERRUPTED, and not taken again.
            let next = a.claim(3, LEASE, 140.0, None).unwrap().unwrap();
            assert_eq!((next.index, next.starts), (1, 1));
            let trials = a.trials().unwrap();
            assert_eq!(
                (trials[0].1.as_str(), trials[0].2.as_ref()),
                ("INTERRUPTED", None)
            );
        }
    }

    #[test]
    fn a_newer_store_or_another_space_is_refused_naming_both() {
        for (store, _dir) in stores("a_newer_store_or_another_space_is_refuse") {
            let u = store.clone();
            drop(Study::open(&u, &key("s1"), "a").unwrap());
            let e = Study::open(
                &u,
                &StudyKey {
                    job: "k".into(),
                    space: "s2".into(),
                    goal: crate::job::Goal::Maximize,
                },
                "b",
            )
            .err()
            .unwrap()
            .to_string();
            assert!(
                e.contains("job `j` (space s1)") && e.contains("job `k` has space s2"),
                "{e}"
            );
            let mut conn = Conn::open(&u).unwrap();
            let mut tx = conn.begin(Lock::Nothing).unwrap();
            tx.exec("UPDATE meta SET value = '99' WHERE key = 'version'", &[])
                .unwrap();
            tx.commit().unwrap();
            let e = Study::open(&u, &key("s1"), "a").err().unwrap();
            assert!(matches!(e, StudyError::Newer { found: 99, .. }), "{e}");
            for bad in ["sqlite:", "mysql://x", "study.db"] {
                assert!(matches!(
                    Study::open(bad, &key("s"), "a"),
                    Err(StudyError::BadUrl(_))
                ));
            }
            for gone in [
                "sqlite:/nonexistent-dir/x/study.db",
                "postgresql://gpumux@127.0.0.1:1/none?connect_timeout=2",
            ] {
                let e = Study::open(gone, &key("s"), "a").err().unwrap();
                assert!(matches!(e, StudyError::Unreachable { .. }), "{e}");
            }
        }
    }

    #[test]
    fn eight_workers_at_once_take_every_index_exactly_once() {
        for (store, _dir) in stores("eight_workers_at_once_take_every_index_e") {
            let u = store.clone();
            let run_cap = 200;
            let taken: Vec<Vec<u32>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..8)
                    .map(|w| {
                        let u = u.clone();
                        s.spawn(move || {
                            let mut study = Study::open(&u, &key("s"), &format!("w{w}")).unwrap();
                            let mut mine = Vec::new();
                            while let Some(c) = study.claim(run_cap, LEASE, 100.0, None).unwrap() {
                                assert!(study.finish(c.index, &end("COMPLETE", "r"), &[]).unwrap());
                                mine.push(c.index);
                            }
                            mine
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let mut all: Vec<u32> = taken.into_iter().flatten().collect();
            all.sort_unstable();
            assert_eq!(all, (0..run_cap).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_proposal_sees_the_whole_study_and_a_retaken_trial_keeps_its_point() {
        for (store, _dir) in stores("a_proposal_sees_the_whole_study_and_a_re") {
            let mut a = Study::open(&store, &key("s"), "a").unwrap();
            let mut b = Study::open(&store, &key("s"), "b").unwrap();
            let mut seen = Vec::new();
            let mut propose = StartWith {
                proposes: true,
                start: |i: u32, h: Option<&History>| {
                    let h = h.expect("a history to propose from");
                    seen.push((i, h.ended.len(), h.running.clone()));
                    Some(Start {
                        point: Some(format!("p{i}")),
                        row: None,
                    })
                },
            };
            let c0 = a
                .claim(9, LEASE, 100.0, Some(&mut propose))
                .unwrap()
                .unwrap();
            assert_eq!(c0.point.as_deref(), Some("p0"));
            let c1 = b
                .claim(9, LEASE, 100.0, Some(&mut propose))
                .unwrap()
                .unwrap();
            let done = End {
                state: "COMPLETE",
                metric: Some(0.5),
                epochs: 3,
                row: "{}",
            };
            assert!(a.finish(0, &done, &[]).unwrap());
            let _ = a
                .claim(9, LEASE, 100.0, Some(&mut propose))
                .unwrap()
                .unwrap();
            // Trial 1 ran (b's) while 0 ended (a's): the third proposal saw both.
            assert_eq!(seen[2], (2, 1, vec!["p1".to_string()]));
            let h = a.read(history).unwrap();
            assert_eq!(
                h.ended,
                [Ended {
                    point: "p0".into(),
                    state: "COMPLETE".into(),
                    metric: Some(0.5),
                    epochs: 3
                }]
            );
            // No point proposed: nothing is taken.
            let mut none = StartWith {
                proposes: true,
                start: |_: u32, _: Option<&History>| None,
            };
            assert_eq!(b.claim(9, LEASE, 100.0, Some(&mut none)).unwrap(), None);
            // b is lost: its trial is taken again at its own point, not proposed anew.
            let again = a.claim(9, LEASE, 200.0, Some(&mut none)).unwrap().unwrap();
            assert_eq!((again.index, again.point), (c1.index, Some("p1".into())));
        }
    }

    #[test]
    fn a_trial_handed_back_runs_again_whatever_its_starts_and_lost_epochs_are_dropped() {
        for (store, _dir) in stores("a_trial_handed_back_runs_again_whatever_") {
            let mut a = Study::open(&store, &key("s"), "a").unwrap();
            let mut b = Study::open(&store, &key("s"), "b").unwrap();
            let epoch = |e: u32| EpochRow {
                index: 0,
                epoch: e,
                row: format!("e{e}"),
            };
            assert_eq!(a.claim(1, LEASE, 100.0, None).unwrap().unwrap().index, 0);
            assert_eq!(a.record_epochs(&[epoch(1), epoch(2)]).unwrap(), 2);
            // Not b's: not recorded.
            assert_eq!(b.record_epochs(&[epoch(3)]).unwrap(), 0);
            // a is lost; b takes it again, and a's epochs go.
            let c = b.claim(1, LEASE, 200.0, None).unwrap().unwrap();
            assert_eq!(c.starts, 2);
            let mut epochs = Vec::new();
            b.each_epoch(&mut |r| {
                epochs.push(r);
                Ok(())
            })
            .unwrap();
            assert!(epochs.is_empty(), "{epochs:?}");
            // A signal stops b: it hands the trial back, and its second start is not counted.
            let back = end("INTERRUPTED", "{}");
            assert!(b.finish(0, &back, &[epoch(1)]).unwrap());
            let c = a.claim(1, LEASE, 201.0, None).unwrap().unwrap();
            assert_eq!((c.index, c.starts), (0, 2));
            assert!(a.finish(0, &end("COMPLETE", "done"), &[epoch(1)]).unwrap());
            let mut epochs = Vec::new();
            a.each_epoch(&mut |r| {
                epochs.push(r);
                Ok(())
            })
            .unwrap();
            assert_eq!(epochs, [epoch(1)]);
        }
    }

    #[test]
    fn every_worker_judges_a_rung_by_every_workers_values() {
        for (store, _dir) in stores("every_worker_judges_a_rung_by_every_work") {
            let mut a = Study::open(&store, &key("s"), "a").unwrap();
            let mut b = Study::open(&store, &key("s"), "b").unwrap();
            a.rung(0, 1, "t1", 0.5).unwrap();
            b.rung(0, 1, "t2", 0.7).unwrap();
            // Another bracket's or epoch's values are not this rung's.
            b.rung(1, 1, "t9", 0.1).unwrap();
            b.rung(0, 3, "t8", 0.1).unwrap();
            let seen = a.rung(0, 1, "t3", 0.6).unwrap();
            let ids: Vec<&str> = seen.keys().map(String::as_str).collect();
            assert_eq!(ids, ["t1", "t2", "t3"]);
        }
    }

    #[test]
    fn a_version_1_store_is_brought_up_to_date_and_export_refuses_what_is_not_a_study() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("study.db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO meta VALUES ('version', '1'), ('job', 'j'), ('space', 's');
             CREATE TABLE trials (idx INTEGER PRIMARY KEY, state TEXT NOT NULL, worker TEXT,
                 lease_until REAL, starts INTEGER NOT NULL, row TEXT);
             INSERT INTO trials VALUES (0, 'COMPLETE', NULL, NULL, 1, 'r0');",
        )
        .unwrap();
        drop(conn);
        let mut a = Study::open(&url(&dir), &key("s"), "a").unwrap();
        assert_eq!(a.claim(5, LEASE, 1.0, None).unwrap().unwrap().index, 1);
        assert_eq!(a.trials().unwrap()[0].2.as_deref(), Some("r0"));
        assert!(Study::open_existing(&url(&dir)).is_ok());
        let e = Study::open_existing(&format!("sqlite:{}", dir.path().join("none.db").display()))
            .err()
            .unwrap();
        assert!(matches!(e, StudyError::Unreachable { .. }), "{e}");
        let other = dir.path().join("other.db");
        rusqlite::Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE x (y);")
            .unwrap();
        let e = Study::open_existing(&format!("sqlite:{}", other.display()))
            .err()
            .unwrap();
        assert!(matches!(e, StudyError::NotAStudy { .. }), "{e}");
    }

    #[test]
    fn rows_go_through_the_store_unchanged_values_that_are_not_finite_included() {
        let trial = crate::report::TrialRow {
            trial_id: "t, \"quoted\"".into(),
            state: "FAIL".into(),
            metric: Some(f64::NAN),
            final_loss: Some(f64::INFINITY),
            test_acc: None,
            error: "line one\nline two".into(),
            params: "{\"lr\": 0.1}".into(),
            wall_s: 1.25,
            ..Default::default()
        };
        let back: crate::report::TrialRow = decode_row(&encode_row(&trial).unwrap()).unwrap();
        assert!(back.metric.unwrap().is_nan());
        let (mut a, mut b) = (back, trial);
        a.metric = None;
        b.metric = None;
        assert_eq!(a, b);
        let mut epoch = crate::report::ProgressRow {
            trial_id: "t1".into(),
            epoch: 3,
            train_loss: f64::NAN,
            test_acc: 0.5,
            ..Default::default()
        };
        epoch.extra.insert("val_f1".into(), 0.25);
        epoch.extra.insert("gone".into(), f64::NAN);
        let back = decode_epoch(&encode_epoch(&epoch).unwrap()).unwrap();
        assert!(back.train_loss.is_nan());
        assert_eq!((back.epoch, back.test_acc), (3, 0.5));
        assert_eq!(
            back.extra.into_iter().collect::<Vec<_>>(),
            [("val_f1".to_string(), 0.25)]
        );
        assert!(decode_row::<crate::report::TrialRow>("not,a,row").is_none());
    }

    #[test]
    fn a_connection_lost_mid_run_is_opened_again_and_loses_nothing_committed() {
        let Some(u) = fresh_postgres("lost_connection") else {
            return; // PostgreSQL only: a SQLite file is never lost.
        };
        // A password (the test server trusts every local connection, and ignores it) is kept
        // whole for opening the connection again, and never shown.
        let with_password = u.replacen("gpumux@", "gpumux:hush@", 1);
        let mut a = Study::open(&with_password, &key("s"), "a").unwrap();
        assert_eq!(a.url, with_password);
        assert!(!a
            .fault(Fault::Store("x".into()))
            .to_string()
            .contains("hush"));
        assert_eq!(a.claim(5, LEASE, 100.0, None).unwrap().unwrap().index, 0);
        // The server ends a's session, as a restart or a network fault would.
        let mut admin = postgres::Client::connect(&u, postgres::NoTls).unwrap();
        let ended = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name = 'gpumux' AND datname = current_database()
                     AND pid <> pg_backend_pid()",
                &[],
            )
            .unwrap();
        assert_eq!(ended.len(), 1, "a's session was there to end");
        // The next call finds the connection lost, and a retry opens it again.
        let next = with_retries(|| a.claim(5, LEASE, 101.0, None))
            .unwrap()
            .unwrap();
        assert_eq!(next.index, 1);
        assert!(
            a.finish(0, &end("COMPLETE", "r0"), &[]).unwrap(),
            "trial 0 is still a's"
        );
        let trials = a.trials().unwrap();
        assert_eq!(
            trials
                .iter()
                .map(|(i, s, _)| (*i, s.as_str()))
                .collect::<Vec<_>>(),
            [(0, "COMPLETE"), (1, "RUNNING")]
        );
    }

    #[test]
    fn a_worker_slow_to_renew_still_ends_its_trial_unless_it_was_taken_again() {
        for (store, _dir) in stores("slow_to_renew") {
            let mut a = Study::open(&store, &key("s"), "a").unwrap();
            let mut b = Study::open(&store, &key("s"), "b").unwrap();
            assert_eq!(a.claim(2, LEASE, 100.0, None).unwrap().unwrap().index, 0);
            // a's lease runs out at 110: b's claim records trial 0 INTERRUPTED and takes it.
            assert_eq!(b.claim(2, LEASE, 111.0, None).unwrap().unwrap().index, 0);
            // b's lease runs out too; a's claim finds nothing left (0 started twice, 1 taken).
            assert_eq!(a.claim(2, LEASE, 130.0, None).unwrap().unwrap().index, 1);
            assert_eq!(a.claim(2, LEASE, 131.0, None).unwrap(), None);
            // b was slow, not lost: its end still counts, and renewing gives it back first.
            assert!(b.renew(0, LEASE, 131.5).unwrap());
            assert!(b.finish(0, &end("COMPLETE", "r0"), &[]).unwrap());
            // A trial taken and never started goes back, its start not counted.
            assert!(a.hand_back(1).unwrap());
            assert!(!b.hand_back(1).unwrap(), "not b's");
            let again = b.claim(2, LEASE, 132.0, None).unwrap().unwrap();
            assert_eq!((again.index, again.starts), (1, 1));
        }
    }
}
