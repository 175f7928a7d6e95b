//! A study shared by the sweep processes that join it (`sqlite:PATH`): which trial each worker runs, under a lease it renews, each trial's end, and the job and space every worker must share, decided in transactions.
//!
//! The store holds three tables: `meta` (the schema version, the study's job name and the hash
//! of its space), and `trials`: one row per trial index taken, with its state (`RUNNING`,
//! `COMPLETE`, `PRUNED`, `FAIL` or `INTERRUPTED`), the worker holding it and until when, how many
//! times it was started, and its result row as the worker wrote it. A worker takes the next
//! trial with [`Study::claim`]: first a trial whose worker's lease ran out (recorded
//! `INTERRUPTED`, and run again once), then the next index below the run cap. Every decision is
//! one `BEGIN IMMEDIATE` transaction, so two workers never take one trial.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

/// The store's layout. A store of a higher version is refused: it was written by a newer gpumux.
pub const SCHEMA_VERSION: i64 = 1;

/// How often a trial may start in all: once, and once more after its worker's lease ran out.
pub const MAX_STARTS: i64 = 2;

/// How long a worker waits for another's transaction before the store counts as busy.
const BUSY_WAIT: Duration = Duration::from_secs(30);

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
    #[error("study `{url}`: {why}")]
    Store { url: String, why: String },
}

/// What every worker of a study shares: the job's name and a hash of its space (and of what
/// else makes its trials the same trials: the seed, the data, the epochs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StudyKey {
    pub job: String,
    pub space: String,
}

/// A trial a worker holds: its index, and how many times it has started (2: it runs again after
/// a worker that held it was lost).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    pub index: u32,
    pub starts: i64,
}

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

impl Study {
    /// Joins the study at `url` as `worker` (a name unique among its workers), creating it
    /// for `key` when it is new. Refused: a store of a newer schema, or of another job's space.
    pub fn open(url: &str, key: &StudyKey, worker: &str) -> Result<Study, StudyError> {
        let path = sqlite_path(url)?;
        let unreachable = |e: rusqlite::Error| StudyError::Unreachable {
            url: url.to_string(),
            why: e.to_string(),
        };
        let conn = Connection::open(&path).map_err(unreachable)?;
        conn.busy_timeout(BUSY_WAIT).map_err(unreachable)?;
        // Readers never wait for the writer; each commit is on disk before it returns.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(unreachable)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(unreachable)?;
        let mut study = Study {
            conn,
            url: url.to_string(),
            worker: worker.to_string(),
        };
        study.join(key)?;
        Ok(study)
    }

    fn store_error(&self, e: rusqlite::Error) -> StudyError {
        store_error(&self.url)(e)
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
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS trials (
                 idx INTEGER PRIMARY KEY,
                 state TEXT NOT NULL,
                 worker TEXT,
                 lease_until REAL,
                 starts INTEGER NOT NULL,
                 row TEXT
             );",
        )
        .map_err(&store)?;
        let get = |k: &str| -> Result<Option<String>, StudyError> {
            tx.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0))
                .optional()
                .map_err(&store)
        };
        match get("version")? {
            None => {
                for (k, v) in [
                    ("version", SCHEMA_VERSION.to_string()),
                    ("job", key.job.clone()),
                    ("space", key.space.clone()),
                ] {
                    tx.execute(
                        "INSERT INTO meta (key, value) VALUES (?1, ?2)",
                        params![k, v],
                    )
                    .map_err(&store)?;
                }
            }
            Some(v) => {
                let found: i64 = v.parse().map_err(|_| StudyError::Store {
                    url: url.clone(),
                    why: format!("its schema version `{v}` is not a number"),
                })?;
                if found > SCHEMA_VERSION {
                    return Err(StudyError::Newer {
                        url: url.clone(),
                        found,
                    });
                }
                let (theirs, their_space) = (get("job")?.unwrap_or_default(), get("space")?);
                let their_space = their_space.unwrap_or_default();
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
    /// first, trials whose worker's lease ran out are recorded `INTERRUPTED`, and the first of
    /// them that has started fewer than [`MAX_STARTS`] times is taken again; else the next
    /// index below `run_cap`. `None` when there is nothing left to take.
    pub fn claim(
        &mut self,
        run_cap: u32,
        lease: Duration,
        now: f64,
    ) -> Result<Option<Claim>, StudyError> {
        let until = now + lease.as_secs_f64();
        let (worker, url) = (self.worker.clone(), self.url.clone());
        let store = store_error(&url);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&store)?;
        tx.execute(
            "UPDATE trials SET state = 'INTERRUPTED', worker = NULL
             WHERE state = 'RUNNING' AND lease_until < ?1",
            [now],
        )
        .map_err(&store)?;
        let again: Option<(i64, i64)> = tx
            .query_row(
                "SELECT idx, starts FROM trials WHERE state = 'INTERRUPTED' AND starts < ?1
                 ORDER BY idx LIMIT 1",
                [MAX_STARTS],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(&store)?;
        let claim = match again {
            Some((idx, starts)) => {
                tx.execute(
                    "UPDATE trials SET state = 'RUNNING', worker = ?2, lease_until = ?3,
                     starts = starts + 1 WHERE idx = ?1",
                    params![idx, worker, until],
                )
                .map_err(&store)?;
                Some((idx, starts + 1))
            }
            None => {
                let next: i64 = tx
                    .query_row("SELECT COALESCE(MAX(idx) + 1, 0) FROM trials", [], |r| {
                        r.get(0)
                    })
                    .map_err(&store)?;
                if next < i64::from(run_cap) {
                    tx.execute(
                        "INSERT INTO trials (idx, state, worker, lease_until, starts)
                         VALUES (?1, 'RUNNING', ?2, ?3, 1)",
                        params![next, worker, until],
                    )
                    .map_err(&store)?;
                    Some((next, 1))
                } else {
                    None
                }
            }
        };
        tx.commit().map_err(&store)?;
        Ok(claim
            .and_then(|(idx, starts)| u32::try_from(idx).ok().map(|index| Claim { index, starts })))
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

    /// Records the end of trial `index` (`state`, and its result row as text) when this worker
    /// still holds it; `false` when it does not (the end is then not the study's: another
    /// worker runs the trial again).
    pub fn finish(&mut self, index: u32, state: &str, row: &str) -> Result<bool, StudyError> {
        let n = self
            .conn
            .execute(
                "UPDATE trials SET state = ?3, row = ?4, worker = NULL, lease_until = NULL
                 WHERE idx = ?1 AND worker = ?2 AND state = 'RUNNING'",
                params![index, self.worker, state, row],
            )
            .map_err(|e| self.store_error(e))?;
        Ok(n == 1)
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
            got.push(w.claim(5, LEASE, 100.0).unwrap().map(|c| c.index));
        }
        assert_eq!(got, [Some(0), Some(1), Some(2), Some(3), Some(4), None]);
        // Only the holder records a trial's end.
        assert!(!b.finish(0, "COMPLETE", "r0").unwrap());
        assert!(a.finish(0, "COMPLETE", "r0").unwrap());
        assert!(!a.finish(0, "COMPLETE", "r0").unwrap(), "ended once");
        let counts = a.counts().unwrap();
        assert_eq!((counts["COMPLETE"], counts["RUNNING"]), (1, 4));
    }

    #[test]
    fn a_lost_workers_trial_is_interrupted_and_taken_again_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Study::open(&url(&dir), &key("s"), "a").unwrap();
        let mut b = Study::open(&url(&dir), &key("s"), "b").unwrap();
        assert_eq!(a.claim(3, LEASE, 100.0).unwrap().unwrap().index, 0);
        // A renews in time once, then is lost: its lease runs out at 120.
        assert!(a.renew(0, LEASE, 110.0).unwrap());
        let again = b.claim(3, LEASE, 121.0).unwrap().unwrap();
        assert_eq!(
            again,
            Claim {
                index: 0,
                starts: 2
            }
        );
        // The lost worker neither renews nor ends it any more.
        assert!(!a.renew(0, LEASE, 121.5).unwrap());
        assert!(!a.finish(0, "COMPLETE", "late").unwrap());
        // Lost a second time: recorded INTERRUPTED, and not taken again.
        let next = a.claim(3, LEASE, 140.0).unwrap().unwrap();
        assert_eq!(
            next,
            Claim {
                index: 1,
                starts: 1
            }
        );
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
                        while let Some(c) = study.claim(run_cap, LEASE, 100.0).unwrap() {
                            assert!(study.finish(c.index, "COMPLETE", "r").unwrap());
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
