//! A study shared by the sweep processes that join it (`sqlite:PATH`): which trial each worker runs and at which point, under a lease it renews; each trial's epochs, end and rung values; and the job and space every worker must share, decided in transactions.
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
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

/// The store's layout. A store of a higher version is refused: it was written by a newer gpumux.
/// Version 1 (trials without points, epochs or rungs) is brought up to this one when joined.
pub const SCHEMA_VERSION: i64 = 2;

/// How often a trial may start in all: once, and once more after its worker's lease ran out.
/// A trial its worker handed back (a signal stopped it) does not count its start.
pub const MAX_STARTS: i64 = 2;

/// How long a worker waits for another's transaction before the store counts as busy.
const BUSY_WAIT: Duration = Duration::from_secs(30);

/// The tables of the current layout (made where missing).
const TABLES: &str = "
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

/// Why a study store cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    #[error("study `{0}`: expected sqlite:PATH (a file on this machine)")]
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

/// Proposes the point of a new trial index from the study's history (JSON); `None` when it
/// cannot, and the claim is then given up.
pub type Propose<'a> = &'a mut dyn FnMut(u32, &History) -> Option<String>;

/// One worker's connection to a study.
pub struct Study {
    conn: Connection,
    url: String,
    worker: String,
}

/// An error of the store at `url`, as a study's error.
fn store_error(url: &str) -> impl Fn(rusqlite::Error) -> StudyError + '_ {
    move |e| StudyError::Store {
        url: url.to_string(),
        why: e.to_string(),
    }
}

/// The file of a `sqlite:PATH` study.
pub fn sqlite_path(url: &str) -> Result<PathBuf, StudyError> {
    match url.strip_prefix("sqlite:") {
        Some(path) if !path.is_empty() => Ok(PathBuf::from(path)),
        _ => Err(StudyError::BadUrl(url.to_string())),
    }
}

/// The connection to the file at `url`: waits for others' transactions, readers never wait
/// for the writer, and each commit is on disk before it returns.
fn connect(url: &str) -> Result<Connection, StudyError> {
    let path = sqlite_path(url)?;
    let unreachable = |e: rusqlite::Error| StudyError::Unreachable {
        url: url.to_string(),
        why: e.to_string(),
    };
    let conn = Connection::open(&path).map_err(unreachable)?;
    // SQLite's own busy wait (longer and longer sleeps) keeps more results per second under 8
    // to 64 workers than short sleeps do: fewer workers wake to find the store still busy.
    conn.busy_timeout(BUSY_WAIT).map_err(unreachable)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(unreachable)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(unreachable)?;
    Ok(conn)
}

/// A value of the `meta` table.
fn meta(tx: &Transaction, url: &str, key: &str) -> Result<Option<String>, StudyError> {
    tx.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()
        .map_err(store_error(url))
}

/// The schema version of a store that has one (refused when newer than this gpumux's), brought
/// up to the current layout.
fn upgraded(tx: &Transaction, url: &str, version: &str) -> Result<(), StudyError> {
    let store = store_error(url);
    let found: i64 = version.parse().map_err(|_| StudyError::Store {
        url: url.to_string(),
        why: format!("its schema version `{version}` is not a number"),
    })?;
    if found > SCHEMA_VERSION {
        return Err(StudyError::Newer {
            url: url.to_string(),
            found,
        });
    }
    if found < 2 {
        tx.execute_batch(
            "ALTER TABLE trials ADD COLUMN point TEXT;
             ALTER TABLE trials ADD COLUMN metric REAL;
             ALTER TABLE trials ADD COLUMN epochs INTEGER;",
        )
        .map_err(&store)?;
    }
    tx.execute_batch(TABLES).map_err(&store)?;
    if found < SCHEMA_VERSION {
        tx.execute(
            "UPDATE meta SET value = ?1 WHERE key = 'version'",
            [SCHEMA_VERSION.to_string()],
        )
        .map_err(&store)?;
    }
    Ok(())
}

/// The study's history ([`History`]), read in the transaction of a claim.
fn history(tx: &Transaction, url: &str) -> Result<History, StudyError> {
    let store = store_error(url);
    let mut h = History::default();
    let mut stmt = tx
        .prepare(
            "SELECT point, state, metric, epochs FROM trials
             WHERE point IS NOT NULL AND state IN ('COMPLETE', 'PRUNED', 'FAIL') ORDER BY idx",
        )
        .map_err(&store)?;
    let rows = stmt
        .query_map([], |r| {
            Ok(Ended {
                point: r.get(0)?,
                state: r.get(1)?,
                metric: r.get(2)?,
                epochs: r.get::<_, Option<u32>>(3)?.unwrap_or(0),
            })
        })
        .map_err(&store)?;
    for row in rows {
        h.ended.push(row.map_err(&store)?);
    }
    let mut stmt = tx
        .prepare(
            "SELECT point FROM trials WHERE point IS NOT NULL AND state = 'RUNNING' ORDER BY idx",
        )
        .map_err(&store)?;
    let rows = stmt.query_map([], |r| r.get(0)).map_err(&store)?;
    for row in rows {
        h.running.push(row.map_err(&store)?);
    }
    Ok(h)
}

impl Study {
    /// Joins the study at `url` as `worker` (a name unique among its workers), creating it
    /// for `key` when it is new. Refused: a store of a newer schema, or of another job's space.
    pub fn open(url: &str, key: &StudyKey, worker: &str) -> Result<Study, StudyError> {
        let mut study = Study {
            conn: connect(url)?,
            url: url.to_string(),
            worker: worker.to_string(),
        };
        study.join(key)?;
        Ok(study)
    }

    /// Opens the existing study at `url` to read it (`gpumux export`): refused when there is
    /// no file, when it is not a study, or when its schema is newer.
    pub fn open_existing(url: &str) -> Result<Study, StudyError> {
        let path = sqlite_path(url)?;
        if !path.is_file() {
            return Err(StudyError::Unreachable {
                url: url.to_string(),
                why: format!("there is no file {}", path.display()),
            });
        }
        let mut study = Study {
            conn: connect(url)?,
            url: url.to_string(),
            worker: String::new(),
        };
        let url = study.url.clone();
        let store = store_error(&url);
        let tx = study
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&store)?;
        let has_meta: bool = tx
            .query_row(
                "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                [],
                |r| r.get(0),
            )
            .map_err(&store)?;
        let version = match has_meta {
            true => meta(&tx, &url, "version")?,
            false => None,
        };
        let Some(version) = version else {
            return Err(StudyError::NotAStudy { url: url.clone() });
        };
        upgraded(&tx, &url, &version)?;
        tx.commit().map_err(&store)?;
        Ok(study)
    }

    fn store_error(&self, e: rusqlite::Error) -> StudyError {
        store_error(&self.url)(e)
    }

    /// The study's job name and goal (maximize where the store does not say).
    pub fn job_and_goal(&mut self) -> Result<(String, crate::job::Goal), StudyError> {
        let url = self.url.clone();
        let tx = self.conn.transaction().map_err(store_error(&url))?;
        let job = meta(&tx, &url, "job")?.unwrap_or_default();
        let goal = match meta(&tx, &url, "goal")?.as_deref() {
            Some("minimize") => crate::job::Goal::Minimize,
            _ => crate::job::Goal::Maximize,
        };
        Ok((job, goal))
    }

    /// Creates the tables of a new store, and checks an existing one's version and key.
    fn join(&mut self, key: &StudyKey) -> Result<(), StudyError> {
        let url = self.url.clone();
        let store = store_error(&url);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&store)?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
        )
        .map_err(&store)?;
        match meta(&tx, &url, "version")? {
            None => {
                tx.execute_batch(TABLES).map_err(&store)?;
                for (k, v) in [
                    ("version", SCHEMA_VERSION.to_string()),
                    ("job", key.job.clone()),
                    ("space", key.space.clone()),
                    ("goal", goal_name(key.goal).to_string()),
                ] {
                    tx.execute(
                        "INSERT INTO meta (key, value) VALUES (?1, ?2)",
                        params![k, v],
                    )
                    .map_err(&store)?;
                }
            }
            Some(v) => {
                upgraded(&tx, &url, &v)?;
                let theirs = meta(&tx, &url, "job")?.unwrap_or_default();
                let their_space = meta(&tx, &url, "space")?.unwrap_or_default();
                if their_space != key.space {
                    return Err(StudyError::OtherSpace {
                        url: url.clone(),
                        theirs,
                        their_space,
                        ours: key.job.clone(),
                        our_space: key.space.clone(),
                    });
                }
            }
        }
        tx.commit().map_err(&store)
    }

    /// Takes the next trial to run at time `now` (seconds since the epoch), held for `lease`:
    /// first, trials whose worker's lease ran out are recorded `INTERRUPTED`, and the first
    /// `INTERRUPTED` trial that has started fewer than [`MAX_STARTS`] times is taken again, at
    /// its point; else the next index below `run_cap`, at the point `propose` gives it from the
    /// study's history (none without `propose`). `None` when there is nothing left to take, or
    /// when `propose` gave no point (nothing is taken then).
    pub fn claim(
        &mut self,
        run_cap: u32,
        lease: Duration,
        now: f64,
        propose: Option<Propose>,
    ) -> Result<Option<Claim>, StudyError> {
        let until = now + lease.as_secs_f64();
        let (worker, url) = (self.worker.clone(), self.url.clone());
        let store = store_error(&url);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&store)?;
        tx.execute(
            "UPDATE trials SET state = 'INTERRUPTED', worker = NULL, lease_until = NULL
             WHERE state = 'RUNNING' AND lease_until < ?1",
            [now],
        )
        .map_err(&store)?;
        let again: Option<(i64, i64, Option<String>)> = tx
            .query_row(
                "SELECT idx, starts, point FROM trials WHERE state = 'INTERRUPTED' AND starts < ?1
                 ORDER BY idx LIMIT 1",
                [MAX_STARTS],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(&store)?;
        let claim = match again {
            Some((idx, starts, point)) => {
                tx.execute(
                    "UPDATE trials SET state = 'RUNNING', worker = ?2, lease_until = ?3,
                     starts = starts + 1 WHERE idx = ?1",
                    params![idx, worker, until],
                )
                .map_err(&store)?;
                // The epochs of the run that was lost are not this one's.
                tx.execute("DELETE FROM epochs WHERE idx = ?1", [idx])
                    .map_err(&store)?;
                Some((idx, starts + 1, point))
            }
            None => {
                let next: i64 = tx
                    .query_row("SELECT COALESCE(MAX(idx) + 1, 0) FROM trials", [], |r| {
                        r.get(0)
                    })
                    .map_err(&store)?;
                if next >= i64::from(run_cap) {
                    None
                } else {
                    let point = match propose {
                        None => None,
                        Some(propose) => {
                            let h = history(&tx, &url)?;
                            // Dropped without a commit: nothing taken.
                            let Some(p) = propose(next as u32, &h) else {
                                return Ok(None);
                            };
                            Some(p)
                        }
                    };
                    tx.execute(
                        "INSERT INTO trials (idx, state, worker, lease_until, starts, point)
                         VALUES (?1, 'RUNNING', ?2, ?3, 1, ?4)",
                        params![next, worker, until, point],
                    )
                    .map_err(&store)?;
                    Some((next, 1, point))
                }
            }
        };
        tx.commit().map_err(&store)?;
        Ok(claim.and_then(|(idx, starts, point)| {
            u32::try_from(idx).ok().map(|index| Claim {
                index,
                starts,
                point,
            })
        }))
    }

    /// Renews this worker's lease on trial `index` until `now + lease`; `false` when it no
    /// longer holds it (its lease ran out and the trial was taken again).
    pub fn renew(&mut self, index: u32, lease: Duration, now: f64) -> Result<bool, StudyError> {
        let until = now + lease.as_secs_f64();
        let n = self
            .conn
            .execute(
                "UPDATE trials SET lease_until = ?3
                 WHERE idx = ?1 AND worker = ?2 AND state = 'RUNNING'",
                params![index, self.worker, until],
            )
            .map_err(|e| self.store_error(e))?;
        Ok(n == 1)
    }

    /// Records epoch rows of trials this worker holds, in one transaction (those of a trial it
    /// no longer holds are left out); how many were recorded.
    pub fn record_epochs(&mut self, rows: &[EpochRow]) -> Result<usize, StudyError> {
        let (worker, url) = (self.worker.clone(), self.url.clone());
        let store = store_error(&url);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&store)?;
        let n = insert_epochs(&tx, &worker, rows).map_err(&store)?;
        tx.commit().map_err(&store)?;
        Ok(n)
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
        let (worker, url) = (self.worker.clone(), self.url.clone());
        let store = store_error(&url);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&store)?;
        insert_epochs(&tx, &worker, epochs).map_err(&store)?;
        let n = tx
            .execute(
                "UPDATE trials SET state = ?3, row = ?4, metric = ?5, epochs = ?6,
                     worker = NULL, lease_until = NULL,
                     starts = CASE WHEN ?3 = 'INTERRUPTED' THEN starts - 1 ELSE starts END
                 WHERE idx = ?1 AND worker = ?2 AND state = 'RUNNING'",
                params![index, worker, end.state, end.row, end.metric, end.epochs],
            )
            .map_err(&store)?;
        tx.commit().map_err(&store)?;
        Ok(n == 1)
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
        let url = self.url.clone();
        let store = store_error(&url);
        let bracket = bracket as i64;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&store)?;
        tx.execute(
            "INSERT OR REPLACE INTO rungs (bracket, epoch, trial_id, value) VALUES (?1, ?2, ?3, ?4)",
            params![bracket, epoch, trial_id, value],
        )
        .map_err(&store)?;
        let mut out = BTreeMap::new();
        {
            let mut stmt = tx
                .prepare("SELECT trial_id, value FROM rungs WHERE bracket = ?1 AND epoch = ?2")
                .map_err(&store)?;
            let rows = stmt
                .query_map(params![bracket, epoch], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?))
                })
                .map_err(&store)?;
            for row in rows {
                let (id, v) = row.map_err(&store)?;
                out.insert(id, v);
            }
        }
        tx.commit().map_err(&store)?;
        Ok(out)
    }

    /// Whether the study may still give a trial at `now`: `Some(true)` when one can be taken
    /// (a lost worker's, or one handed back), `Some(false)` when trials run on other workers
    /// (one may yet be lost), `None` when nothing runs and nothing is left to take below
    /// `run_cap`.
    pub fn open_trials(&self, run_cap: u32, now: f64) -> Result<Option<bool>, StudyError> {
        let (running, expired, again, taken): (i64, i64, i64, i64) = self
            .conn
            .query_row(
                "SELECT
                     COALESCE(SUM(state = 'RUNNING'), 0),
                     COALESCE(SUM(state = 'RUNNING' AND lease_until < ?1), 0),
                     COALESCE(SUM(state = 'INTERRUPTED' AND starts < ?2), 0),
                     COALESCE(MAX(idx) + 1, 0)
                 FROM trials",
                params![now, MAX_STARTS],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .map_err(|e| self.store_error(e))?;
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
    pub fn counts(&self) -> Result<BTreeMap<String, usize>, StudyError> {
        let mut stmt = self
            .conn
            .prepare("SELECT state, COUNT(*) FROM trials GROUP BY state")
            .map_err(|e| self.store_error(e))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(|e| self.store_error(e))?;
        let mut out = BTreeMap::new();
        for row in rows {
            let (state, n) = row.map_err(|e| self.store_error(e))?;
            out.insert(state, usize::try_from(n).unwrap_or(0));
        }
        Ok(out)
    }

    /// Every trial's index, state and result row, by index.
    pub fn trials(&self) -> Result<Vec<(u32, String, Option<String>)>, StudyError> {
        let mut stmt = self
            .conn
            .prepare("SELECT idx, state, row FROM trials ORDER BY idx")
            .map_err(|e| self.store_error(e))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get(2)?))
            })
            .map_err(|e| self.store_error(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (idx, state, text) = row.map_err(|e| self.store_error(e))?;
            if let Ok(idx) = u32::try_from(idx) {
                out.push((idx, state, text));
            }
        }
        Ok(out)
    }

    /// Every epoch row, by trial index and epoch, handed to `each` one at a time.
    pub fn each_epoch(
        &self,
        each: &mut dyn FnMut(EpochRow) -> Result<(), StudyError>,
    ) -> Result<(), StudyError> {
        let mut stmt = self
            .conn
            .prepare("SELECT idx, epoch, row FROM epochs ORDER BY idx, epoch")
            .map_err(|e| self.store_error(e))?;
        let mut rows = stmt.query([]).map_err(|e| self.store_error(e))?;
        while let Some(r) = rows.next().map_err(|e| self.store_error(e))? {
            let (idx, epoch, row): (i64, i64, String) = (
                r.get(0).map_err(|e| self.store_error(e))?,
                r.get(1).map_err(|e| self.store_error(e))?,
                r.get(2).map_err(|e| self.store_error(e))?,
            );
            if let (Ok(index), Ok(epoch)) = (u32::try_from(idx), u32::try_from(epoch)) {
                each(EpochRow { index, epoch, row })?;
            }
        }
        Ok(())
    }
}

/// Inserts the epoch rows of trials `worker` holds; how many.
fn insert_epochs(tx: &Transaction, worker: &str, rows: &[EpochRow]) -> rusqlite::Result<usize> {
    let mut stmt = tx.prepare_cached(
        "INSERT OR REPLACE INTO epochs (idx, epoch, row)
         SELECT ?1, ?2, ?3 WHERE EXISTS
             (SELECT 1 FROM trials WHERE idx = ?1 AND worker = ?4 AND state = 'RUNNING')",
    )?;
    let mut n = 0;
    for r in rows {
        n += stmt.execute(params![r.index, r.epoch, r.row, worker])?;
    }
    Ok(n)
}

/// The rungs of early termination kept in a study, shared by its workers' trial threads (a
/// connection of its own).
pub struct StudyRungs {
    study: Mutex<Study>,
}

impl StudyRungs {
    pub fn open(url: &str, key: &StudyKey, worker: &str) -> Result<StudyRungs, StudyError> {
        Ok(StudyRungs {
            study: Mutex::new(Study::open(url, key, worker)?),
        })
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
        let mut study = self.study.lock().unwrap_or_else(|p| p.into_inner());
        with_retries(|| study.rung(bracket, epoch, trial_id, value)).map_err(|e| e.to_string())
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

/// The trials a worker holds, renewed every third of the lease by a thread of its own (with its
/// own connection) until it is dropped.
pub struct Heartbeat {
    held: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<u32>>>,
    /// Dropped to stop the thread: it waits on the other end between renewals.
    stop: Option<crossbeam_channel::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    /// Starts renewing, as `worker` of the study at `url`.
    pub fn start(url: &str, key: &StudyKey, worker: &str) -> Result<Heartbeat, StudyError> {
        let mut study = Study::open(url, key, worker)?;
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
                    match study.renew(index, lease, now()) {
                        Ok(true) => {}
                        Ok(false) => tracing::warn!(
                            "the study gave trial {index} to another worker: this worker's hold on it ran out"
                        ),
                        Err(e) => tracing::warn!("renewing the hold on trial {index}: {e}"),
                    }
                }
            }
        });
        Ok(Heartbeat {
            held,
            stop: Some(stop),
            thread: Some(thread),
        })
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

    #[test]
    fn workers_take_each_index_once_up_to_the_run_cap() {
        let dir = tempfile::tempdir().unwrap();
        let (mut a, mut b) = (
            Study::open(&url(&dir), &key("s"), "a").unwrap(),
            Study::open(&url(&dir), &key("s"), "b").unwrap(),
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

    #[test]
    fn a_lost_workers_trial_is_interrupted_and_taken_again_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Study::open(&url(&dir), &key("s"), "a").unwrap();
        let mut b = Study::open(&url(&dir), &key("s"), "b").unwrap();
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

    #[test]
    fn a_newer_store_or_another_space_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let u = url(&dir);
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
        let conn = Connection::open(dir.path().join("study.db")).unwrap();
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'version'", [])
            .unwrap();
        let e = Study::open(&u, &key("s1"), "a").err().unwrap();
        assert!(matches!(e, StudyError::Newer { found: 99, .. }), "{e}");
        for bad in ["sqlite:", "postgres://x", "study.db"] {
            assert!(matches!(
                Study::open(bad, &key("s"), "a"),
                Err(StudyError::BadUrl(_))
            ));
        }
        let e = Study::open("sqlite:/nonexistent-dir/x/study.db", &key("s"), "a")
            .err()
            .unwrap();
        assert!(matches!(e, StudyError::Unreachable { .. }), "{e}");
    }

    #[test]
    fn eight_workers_at_once_take_every_index_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        let u = url(&dir);
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

    #[test]
    fn a_proposal_sees_the_whole_study_and_a_retaken_trial_keeps_its_point() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Study::open(&url(&dir), &key("s"), "a").unwrap();
        let mut b = Study::open(&url(&dir), &key("s"), "b").unwrap();
        let mut seen = Vec::new();
        let mut propose = |i: u32, h: &History| {
            seen.push((i, h.ended.len(), h.running.clone()));
            Some(format!("p{i}"))
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
        let h = a
            .conn
            .transaction()
            .map(|tx| history(&tx, &a.url).unwrap())
            .unwrap();
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
        let mut none = |_: u32, _: &History| None;
        assert_eq!(b.claim(9, LEASE, 100.0, Some(&mut none)).unwrap(), None);
        // b is lost: its trial is taken again at its own point, not proposed anew.
        let again = a.claim(9, LEASE, 200.0, Some(&mut none)).unwrap().unwrap();
        assert_eq!((again.index, again.point), (c1.index, Some("p1".into())));
    }

    #[test]
    fn a_trial_handed_back_runs_again_whatever_its_starts_and_lost_epochs_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Study::open(&url(&dir), &key("s"), "a").unwrap();
        let mut b = Study::open(&url(&dir), &key("s"), "b").unwrap();
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

    #[test]
    fn every_worker_judges_a_rung_by_every_workers_values() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Study::open(&url(&dir), &key("s"), "a").unwrap();
        let mut b = Study::open(&url(&dir), &key("s"), "b").unwrap();
        a.rung(0, 1, "t1", 0.5).unwrap();
        b.rung(0, 1, "t2", 0.7).unwrap();
        // Another bracket's or epoch's values are not this rung's.
        b.rung(1, 1, "t9", 0.1).unwrap();
        b.rung(0, 3, "t8", 0.1).unwrap();
        let seen = a.rung(0, 1, "t3", 0.6).unwrap();
        let ids: Vec<&str> = seen.keys().map(String::as_str).collect();
        assert_eq!(ids, ["t1", "t2", "t3"]);
    }

    #[test]
    fn a_version_1_store_is_brought_up_to_date_and_export_refuses_what_is_not_a_study() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("study.db");
        let conn = Connection::open(&path).unwrap();
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
        Connection::open(&other)
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
}
