//! The SQLite store: one file under `$CAIRN_HOME`, for a single daemon.
//!
//! Its queries are the shared ones (`src/queries/`); what is SQLite's own
//! is here: opening the file, its migrations (`migrations/`), the hashing
//! of a log written before the ledger (`backfill.rs`), and its [`Dialect`].
//!
//! Every write is one statement or one transaction, so a crash at any point
//! leaves either the old or the new state; each transaction is a
//! [`WriteTx`](crate::tx::WriteTx), which ends in a commit or a rollback on
//! every path (a failed commit on a full disk included: `tx.rs`).
//! Transactions that write begin `IMMEDIATE` and so hold the database's
//! one write lock from their first statement: one that read first and then
//! upgraded would fail at once with "database is locked" under concurrent
//! writers instead of waiting its turn, and no row locks are needed. The
//! database runs in WAL mode with `synchronous=FULL`: a call that returned
//! has reached the disk.

mod backfill;

use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::error::DatabaseError;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;

use crate::lease::Fences;
use crate::queries::{Dialect, Listener};
use crate::{Error, Result};

/// Handle on the SQLite task database; clones share the connection pool.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pub(crate) pool: SqlitePool,
    path: PathBuf,
    /// Told after every committed change to a task's state, events or
    /// waits, so that waiters are woken by the change instead of polling.
    listener: Listener,
    /// The leases taken through this handle, which its writes carry.
    pub(crate) fences: std::sync::Arc<Fences>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and applies
    /// migrations.
    pub async fn open(path: &Path) -> Result<SqliteStore> {
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await
            .map_err(|e| Error::Open(path.to_owned(), e))?;
        sqlx::migrate!("./migrations").run(&pool).await.map_err(|e| Error::Migrate(path.to_owned(), e))?;
        backfill::backfill(&pool).await?;
        Ok(SqliteStore { pool, path: path.to_owned(), listener: Listener::default(), fences: Default::default() })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn location_url(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    /// `VACUUM INTO`: SQLite's own consistent copy, made in one read
    /// transaction while writers go on (they are not blocked under WAL).
    async fn copy_database_to(&self, path: &Path) -> Result<()> {
        let target = path.to_str().ok_or(Error::Unsupported("a backup copy of the task database needs a UTF-8 path"))?;
        sqlx::query("VACUUM INTO $1").bind(target).execute(&self.pool).await.map(drop).map_err(|e| Error::Query("copy the database", e))
    }
}

impl Dialect for sqlx::Sqlite {
    const BEGIN: &'static str = "BEGIN IMMEDIATE";
    const SHARED: bool = false;
    const ROW_LOCKS: bool = false;
    const LOCK_TASK: &'static str = "SELECT state FROM tasks WHERE id = $1";
    const LOCK_LEASE: &'static str = "SELECT id, lease_node, lease_token, lease_expires_ms, last_node FROM tasks WHERE id = $1";
    const LOCK_SLOTS: Option<&'static str> = None;
    const LOCK_BLOB_HOLDS: Option<&'static str> = None;
    const IDLE_TASKS: &'static str = "SELECT * FROM tasks WHERE state = $1
        AND json_extract(config, '$.idle_suspend_ms') IS NOT NULL
        AND last_activity_ms + json_extract(config, '$.idle_suspend_ms') <= $2";
    const UNMATCHED_INBOX: &'static str = "SELECT * FROM inbox WHERE task_id = $1 AND wait_id IS NULL ORDER BY received_ms, rowid";
    const INBOX: &'static str = "SELECT * FROM inbox WHERE task_id = $1 ORDER BY received_ms, rowid";
    const TASK_SNAPSHOTS: &'static str = "SELECT * FROM snapshots WHERE task_id = $1 ORDER BY created_ms, rowid";
    const ALL_SNAPSHOTS: &'static str = "SELECT * FROM snapshots ORDER BY created_ms, rowid";
    // SQLite names no constraint: its message names the column.
    const TASK_NAME_KEY: &'static str = "tasks.name";
    const API_KEY_NAME_KEY: &'static str = "api_keys.name";

    fn violates(e: &dyn DatabaseError, key: &str) -> bool {
        e.message().contains(key)
    }
}

crate::queries::store!(SqliteStore, sqlx::Sqlite, sqlx::SqliteConnection);

/// A SQLite database in a temporary directory, for the conformance suite
/// and the tests of what only SQLite has.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct TempSqlite {
    dir: tempfile::TempDir,
}

#[cfg(test)]
impl TempSqlite {
    pub(crate) fn file(&self) -> PathBuf {
        self.dir.path().join("cairn.db")
    }

    /// A handle that can also run raw SQL (`pool`).
    pub(crate) async fn open_sqlite(&self) -> SqliteStore {
        SqliteStore::open(&self.file()).await.expect("open a SQLite database in a temporary directory")
    }
}

#[cfg(test)]
impl crate::conformance::TestDatabase for TempSqlite {
    async fn create() -> Self {
        TempSqlite { dir: tempfile::tempdir().expect("create a temporary directory") }
    }

    async fn open(&self) -> crate::SharedStore {
        std::sync::Arc::new(self.open_sqlite().await)
    }

    async fn tamper(&self, sql: &str, task: Option<&str>) -> std::result::Result<(), String> {
        let store = self.open_sqlite().await;
        let res = store.tamper(sql, task).await;
        crate::Store::close(&store).await;
        res
    }
}
