//! The two stores a study lives in, SQLite (`sqlite:PATH`) and PostgreSQL (`postgresql://…`), behind one small interface: transactions that run SQL written once (with `?N` parameters) and give rows of plain cells.

use std::time::Duration;

use rusqlite::TransactionBehavior;

/// How long a worker waits for another's lock before the store counts as busy.
pub const BUSY_WAIT: Duration = Duration::from_secs(30);

/// How long a connection to PostgreSQL may take to open, unless the URL says
/// (`connect_timeout=`).
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// A connection to a study's store.
pub enum Conn {
    Lite(rusqlite::Connection),
    Pg(Box<PgConn>),
}

/// A PostgreSQL connection and the statements it has prepared, by their text: each is parsed
/// by the server once per connection, not at every use.
pub struct PgConn {
    client: postgres::Client,
    prepared: std::collections::HashMap<String, postgres::Statement>,
}

/// A value a statement takes: one both stores take.
pub trait Param: rusqlite::ToSql + postgres::types::ToSql + Sync {}
impl<T: rusqlite::ToSql + postgres::types::ToSql + Sync> Param for T {}

/// One cell of a row read.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

impl Cell {
    pub fn int(&self) -> Option<i64> {
        match self {
            Cell::Int(i) => Some(*i),
            Cell::Real(r) => Some(*r as i64),
            _ => None,
        }
    }

    pub fn real(&self) -> Option<f64> {
        match self {
            Cell::Real(r) => Some(*r),
            Cell::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    pub fn text(&self) -> Option<String> {
        match self {
            Cell::Text(t) => Some(t.clone()),
            _ => None,
        }
    }
}

/// What a transaction holds from its start.
#[derive(Clone, Copy, Debug)]
pub enum Lock<'a> {
    /// Nothing: it reads, or makes one change.
    Nothing,
    /// These tables, against every other writer of them (SQLite: the whole store).
    Tables(&'a [&'a str]),
    /// The rows it changes, one by one (SQLite: the whole store, from the start).
    Rows,
    /// The store's set-up (tables made, the version checked), one worker at a time.
    Setup,
}

/// Which store a URL names, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Sqlite(std::path::PathBuf),
    Postgres,
}

/// The store of a URL: `sqlite:PATH`, or `postgresql://…` (`postgres://…`); `None` for anything
/// else.
pub fn kind(url: &str) -> Option<Kind> {
    if let Some(path) = url.strip_prefix("sqlite:") {
        return (!path.is_empty()).then(|| Kind::Sqlite(path.into()));
    }
    (url.starts_with("postgresql://") || url.starts_with("postgres://")).then_some(Kind::Postgres)
}

/// A URL as it may be shown (logs, errors): a PostgreSQL password replaced by `***`.
pub fn shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // userinfo is what comes before the last `@` of the authority (before the first `/`).
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{path}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

impl Conn {
    /// Opens the store at `url`; the error says why it cannot be reached.
    pub fn open(url: &str) -> Result<Conn, String> {
        match kind(url) {
            Some(Kind::Sqlite(path)) => {
                let conn = rusqlite::Connection::open(&path).map_err(|e| e.to_string())?;
                // SQLite's own busy wait (longer and longer sleeps) keeps more results per
                // second under 8 to 64 workers than short sleeps do: fewer workers wake to find
                // the store still busy.
                conn.busy_timeout(BUSY_WAIT).map_err(|e| e.to_string())?;
                // Readers never wait for the writer; each commit is on disk before it returns.
                // Workers opening a new store at once race to switch its journal, and SQLite
                // answers a lock it cannot wait for without waiting (a deadlock it avoids): the
                // switch is tried again for as long as a busy store is waited for.
                let started = std::time::Instant::now();
                loop {
                    match conn.pragma_update(None, "journal_mode", "WAL") {
                        Ok(()) => break,
                        Err(e) if busy(&e) && started.elapsed() < BUSY_WAIT => {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => return Err(e.to_string()),
                    }
                }
                conn.pragma_update(None, "synchronous", "FULL")
                    .map_err(|e| e.to_string())?;
                Ok(Conn::Lite(conn))
            }
            Some(Kind::Postgres) => {
                let mut config: postgres::Config = url.parse().map_err(|e| format!("{e}"))?;
                // As libpq: a password not in the URL may come from PGPASSWORD.
                if config.get_password().is_none() {
                    if let Ok(p) = std::env::var("PGPASSWORD") {
                        config.password(p);
                    }
                }
                if config.get_connect_timeout().is_none() {
                    config.connect_timeout(CONNECT_WAIT);
                }
                config.application_name("gpumux");
                let mut client = config.connect(postgres::NoTls).map_err(|e| pg_error(&e))?;
                // A lock held longer than this by another worker is an error (and retried).
                client
                    .batch_execute(&format!(
                        "SET lock_timeout = '{}s'; SET statement_timeout = '{}s'",
                        BUSY_WAIT.as_secs(),
                        2 * BUSY_WAIT.as_secs()
                    ))
                    .map_err(|e| pg_error(&e))?;
                Ok(Conn::Pg(Box::new(PgConn {
                    client,
                    prepared: Default::default(),
                })))
            }
            None => Err(format!("`{}` is not a study URL", shown(url))),
        }
    }

    /// Whether the connection was lost (PostgreSQL; a SQLite file is never lost).
    pub fn is_lost(&self) -> bool {
        match self {
            Conn::Lite(_) => false,
            Conn::Pg(c) => c.client.is_closed(),
        }
    }

    /// Whether a table of this name is in the store.
    pub fn has_table(&mut self, name: &str) -> Result<bool, String> {
        let mut tx = self.begin(Lock::Nothing)?;
        let sql = match tx {
            Tx::Lite(_) => "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            Tx::Pg(..) => "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = ?1",
        };
        let n = tx.row(sql, &[&name])?.and_then(|r| r.first()?.int());
        tx.commit()?;
        Ok(n.unwrap_or(0) > 0)
    }

    /// A transaction holding `lock` from its start.
    pub fn begin(&mut self, lock: Lock) -> Result<Tx<'_>, String> {
        match self {
            Conn::Lite(c) => {
                let behavior = match lock {
                    Lock::Nothing => TransactionBehavior::Deferred,
                    Lock::Tables(_) | Lock::Rows | Lock::Setup => TransactionBehavior::Immediate,
                };
                let tx = c
                    .transaction_with_behavior(behavior)
                    .map_err(|e| e.to_string())?;
                Ok(Tx::Lite(tx))
            }
            Conn::Pg(c) => {
                let PgConn { client, prepared } = &mut **c;
                let mut tx = client.transaction().map_err(|e| pg_error(&e))?;
                match lock {
                    Lock::Nothing | Lock::Rows => {}
                    // Writers of these tables one at a time; readers go on.
                    Lock::Tables(tables) => tx
                        .batch_execute(&format!(
                            "LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE",
                            tables.join(", ")
                        ))
                        .map_err(|e| pg_error(&e))?,
                    // Tables made by two workers at once collide in PostgreSQL's catalog.
                    Lock::Setup => tx
                        .batch_execute("SELECT pg_advisory_xact_lock(7486131270131011)")
                        .map_err(|e| pg_error(&e))?,
                }
                Ok(Tx::Pg(tx, prepared))
            }
        }
    }
}

/// Whether SQLite said the store is busy or locked.
fn busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// A PostgreSQL error with the server's own message, where it sent one.
fn pg_error(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => e.to_string(),
    }
}

/// A transaction of either store.
pub enum Tx<'a> {
    Lite(rusqlite::Transaction<'a>),
    Pg(
        postgres::Transaction<'a>,
        &'a mut std::collections::HashMap<String, postgres::Statement>,
    ),
}

/// The statement of `sql` on this connection, prepared the first time.
fn statement(
    t: &mut postgres::Transaction,
    prepared: &mut std::collections::HashMap<String, postgres::Statement>,
    sql: &str,
) -> Result<postgres::Statement, String> {
    if let Some(s) = prepared.get(sql) {
        return Ok(s.clone());
    }
    let s = t.prepare(&pg_sql(sql)).map_err(|e| pg_error(&e))?;
    prepared.insert(sql.to_string(), s.clone());
    Ok(s)
}

/// `?N` parameters as PostgreSQL writes them (`$N`).
fn pg_sql(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

impl Tx<'_> {
    /// Runs statements without parameters (tables made).
    pub fn batch(&mut self, sql: &str) -> Result<(), String> {
        match self {
            Tx::Lite(t) => t.execute_batch(sql).map_err(|e| e.to_string()),
            Tx::Pg(t, _) => t.batch_execute(sql).map_err(|e| pg_error(&e)),
        }
    }

    /// Runs one statement; how many rows it changed.
    pub fn exec(&mut self, sql: &str, params: &[&dyn Param]) -> Result<u64, String> {
        match self {
            Tx::Lite(t) => {
                let p: Vec<&dyn rusqlite::ToSql> =
                    params.iter().map(|p| *p as &dyn rusqlite::ToSql).collect();
                let mut stmt = t.prepare_cached(sql).map_err(|e| e.to_string())?;
                stmt.execute(p.as_slice())
                    .map(|n| n as u64)
                    .map_err(|e| e.to_string())
            }
            Tx::Pg(t, prepared) => {
                let p: Vec<&(dyn postgres::types::ToSql + Sync)> = params
                    .iter()
                    .map(|p| *p as &(dyn postgres::types::ToSql + Sync))
                    .collect();
                let stmt = statement(t, prepared, sql)?;
                t.execute(&stmt, &p).map_err(|e| pg_error(&e))
            }
        }
    }

    /// The rows of a query, each as its cells.
    pub fn rows(&mut self, sql: &str, params: &[&dyn Param]) -> Result<Vec<Vec<Cell>>, String> {
        match self {
            Tx::Lite(t) => {
                let p: Vec<&dyn rusqlite::ToSql> =
                    params.iter().map(|p| *p as &dyn rusqlite::ToSql).collect();
                let mut stmt = t.prepare_cached(sql).map_err(|e| e.to_string())?;
                let width = stmt.column_count();
                let mut rows = stmt.query(p.as_slice()).map_err(|e| e.to_string())?;
                let mut out = Vec::new();
                while let Some(r) = rows.next().map_err(|e| e.to_string())? {
                    let mut cells = Vec::with_capacity(width);
                    for i in 0..width {
                        use rusqlite::types::ValueRef;
                        cells.push(match r.get_ref(i).map_err(|e| e.to_string())? {
                            ValueRef::Null | ValueRef::Blob(_) => Cell::Null,
                            ValueRef::Integer(i) => Cell::Int(i),
                            ValueRef::Real(f) => Cell::Real(f),
                            ValueRef::Text(t) => Cell::Text(String::from_utf8_lossy(t).into()),
                        });
                    }
                    out.push(cells);
                }
                Ok(out)
            }
            Tx::Pg(t, prepared) => {
                let p: Vec<&(dyn postgres::types::ToSql + Sync)> = params
                    .iter()
                    .map(|p| *p as &(dyn postgres::types::ToSql + Sync))
                    .collect();
                let stmt = statement(t, prepared, sql)?;
                let rows = t.query(&stmt, &p).map_err(|e| pg_error(&e))?;
                rows.iter().map(pg_cells).collect()
            }
        }
    }

    /// The first row of a query, if any.
    pub fn row(&mut self, sql: &str, params: &[&dyn Param]) -> Result<Option<Vec<Cell>>, String> {
        Ok(self.rows(sql, params)?.into_iter().next())
    }

    pub fn commit(self) -> Result<(), String> {
        match self {
            Tx::Lite(t) => t.commit().map_err(|e| e.to_string()),
            Tx::Pg(t, _) => t.commit().map_err(|e| pg_error(&e)),
        }
    }
}

/// A PostgreSQL row's cells, by the types the study's tables use.
fn pg_cells(row: &postgres::Row) -> Result<Vec<Cell>, String> {
    use postgres::types::Type;
    let err = |e: postgres::Error| pg_error(&e);
    let mut cells = Vec::with_capacity(row.len());
    for (i, col) in row.columns().iter().enumerate() {
        let t = col.type_();
        let cell = if *t == Type::INT8 {
            row.try_get::<_, Option<i64>>(i)
                .map_err(err)?
                .map(Cell::Int)
        } else if *t == Type::INT4 {
            row.try_get::<_, Option<i32>>(i)
                .map_err(err)?
                .map(|v| Cell::Int(v.into()))
        } else if *t == Type::FLOAT8 {
            row.try_get::<_, Option<f64>>(i)
                .map_err(err)?
                .map(Cell::Real)
        } else if *t == Type::BOOL {
            row.try_get::<_, Option<bool>>(i)
                .map_err(err)?
                .map(|b| Cell::Int(b.into()))
        } else {
            row.try_get::<_, Option<String>>(i)
                .map_err(err)?
                .map(Cell::Text)
        };
        cells.push(cell.unwrap_or(Cell::Null));
    }
    Ok(cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_never_shown_and_parameters_are_written_as_postgresql_reads_them() {
        assert_eq!(
            shown("postgresql://me:secret@db:5432/s?connect_timeout=2"),
            "postgresql://me:***@db:5432/s?connect_timeout=2"
        );
        assert_eq!(shown("postgresql://me@db/s"), "postgresql://me@db/s");
        assert_eq!(shown("sqlite:/a/b:c@d.db"), "sqlite:/a/b:c@d.db");
        assert_eq!(
            pg_sql("SELECT ?1, '?' FROM t WHERE a = ?12"),
            "SELECT $1, '?' FROM t WHERE a = $12"
        );
        assert_eq!(kind("postgres://x/y"), Some(Kind::Postgres));
        assert_eq!(kind("sqlite:"), None);
        assert_eq!(kind("mysql://x"), None);
    }
}
