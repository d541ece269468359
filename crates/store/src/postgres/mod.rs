//! The PostgreSQL store: a database server that several daemons can reach.
//!
//! Its queries are the shared ones (`src/queries/`), as the SQLite store's
//! are; what is PostgreSQL's own is here: connecting, its migrations
//! (`migrations/postgres/`) and its [`Dialect`]. Where SQLite's single writer
//! made a read-then-write safe (`BEGIN IMMEDIATE`), this store takes **row
//! locks**, not `SERIALIZABLE`: every transaction that reads a task's
//! state, its log head, its pending wait or its inbox before writing first
//! locks the task's row (`SELECT ... FOR NO KEY UPDATE`,
//! [`Dialect::LOCK_TASK`]), so that writers of one task take turns and
//! writers of different tasks do not wait for each other. Transactions that touch several tasks lock
//! them in id order, so two of them cannot deadlock. `NO KEY UPDATE` (the
//! lock an `UPDATE tasks` takes anyway) rather than `UPDATE`, so that it
//! does not conflict with the key-share locks foreign keys take: a
//! transaction that inserted an inbox row for a task can still lock it.
//! Uid slots, which belong to no task, are claimed under a table lock on
//! `sandboxes` instead. Transactions run at PostgreSQL's default level,
//! `READ COMMITTED`: each statement after a lock sees what the previous
//! holder committed.
//!
//! Change notifications are as SQLite's: the listener is called after the
//! commit, by the handle that wrote. Another daemon on the same database
//! is not told (that is the cluster's business, not the store's).

use std::str::FromStr;
use std::time::Duration;

use sqlx::error::DatabaseError;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};

use crate::lease::Fences;
use crate::queries::{Dialect, Listener};
use crate::{Error, Result};

/// How long connecting, and waiting for a free connection of the pool, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Handle on a PostgreSQL task database; clones share the connection pool.
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pub(crate) pool: PgPool,
    /// The URL without its password, for messages.
    location: String,
    /// Called after every committed change to a task's state, events or
    /// waits, so that waiters are woken by the change instead of polling.
    listener: Listener,
    /// The leases taken through this handle, which its writes carry.
    pub(crate) fences: std::sync::Arc<Fences>,
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://USER:PASSWORD@HOST/DB`)
    /// and applies migrations. The database must exist; the tables are
    /// created in it if needed (several daemons migrating at once take
    /// turns on a lock of the migrator's).
    pub async fn connect(url: &str) -> Result<PostgresStore> {
        let location = crate::url::redact(url);
        let opts = PgConnectOptions::from_str(url).map_err(|e| Error::Url(location.clone(), e.to_string()))?;
        let connect_error = |e| Error::Connect(location.clone(), e);
        // One connection first, for the migrations: a server that refuses
        // or cannot be reached fails the start at once (a pool would retry
        // until its acquire timeout), one that does not answer after a while.
        let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, <PgConnection as sqlx::Connection>::connect_with(&opts))
            .await
            .map_err(|_| connect_error(sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within 30 s"))))?
            .map_err(connect_error)?;
        sqlx::migrate!("./migrations/postgres").run(&mut conn).await.map_err(|e| Error::MigrateServer(location.clone(), e))?;
        sqlx::Connection::close(conn).await.map_err(connect_error)?;
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_with(opts)
            .await
            .map_err(connect_error)?;
        Ok(PostgresStore { pool, location, listener: Listener::default(), fences: Default::default() })
    }

    fn location_url(&self) -> String {
        self.location.clone()
    }

    async fn copy_database_to(&self, _path: &std::path::Path) -> Result<()> {
        Err(Error::Unsupported("a PostgreSQL store is backed up with PostgreSQL's own tools (pg_dump or a base backup), not `cairn backup`: see docs/operations.md, \"Backup and restore\""))
    }
}

impl Dialect for sqlx::Postgres {
    const BEGIN: &'static str = "BEGIN";
    const SHARED: bool = true;
    const ROW_LOCKS: bool = true;
    // `NO KEY UPDATE`: see the module's note.
    const LOCK_TASK: &'static str = "SELECT state FROM tasks WHERE id = $1 FOR NO KEY UPDATE";
    const LOCK_LEASE: &'static str = "SELECT id, lease_node, lease_token, lease_expires_ms, last_node FROM tasks WHERE id = $1 FOR NO KEY UPDATE";
    // Reads go on; claims take turns.
    const LOCK_SLOTS: Option<&'static str> = Some("LOCK TABLE sandboxes IN SHARE ROW EXCLUSIVE MODE");
    const LOCK_BLOB_HOLDS: Option<&'static str> = Some("LOCK TABLE blob_locks IN EXCLUSIVE MODE");
    // `json`, not `jsonb`: it takes any text serde_json writes (jsonb
    // refuses a \u0000 escape) and only this one field is read.
    const IDLE_TASKS: &'static str = "SELECT * FROM (SELECT *, (config::json ->> 'idle_suspend_ms')::bigint AS idle_ms FROM tasks WHERE state = $1) t
        WHERE idle_ms IS NOT NULL AND last_activity_ms + idle_ms <= $2";
    // `ord`: a column that numbers rows in the order they were inserted, as SQLite's rowid.
    const UNMATCHED_INBOX: &'static str = "SELECT * FROM inbox WHERE task_id = $1 AND wait_id IS NULL ORDER BY received_ms, ord";
    const INBOX: &'static str = "SELECT * FROM inbox WHERE task_id = $1 ORDER BY received_ms, ord";
    const TASK_SNAPSHOTS: &'static str = "SELECT * FROM snapshots WHERE task_id = $1 ORDER BY created_ms, ord";
    const ALL_SNAPSHOTS: &'static str = "SELECT * FROM snapshots ORDER BY created_ms, ord";
    const TASK_NAME_KEY: &'static str = "tasks_name_key";
    const API_KEY_NAME_KEY: &'static str = "api_keys_pkey";

    fn violates(e: &dyn DatabaseError, key: &str) -> bool {
        e.constraint() == Some(key)
    }
}

crate::queries::store!(PostgresStore, sqlx::Postgres, sqlx::PgConnection);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use cairn_core::{EventKind, EventSource, InboxEvent, InboxId, NewEvent, Task, TaskConfig, TaskId, TaskState, Transition};

    use super::*;
    use crate::conformance::{assert_chain, TestDatabase};
    use crate::testing::postgres::TempPostgres;
    use crate::{now_ms, EventStore, Store, TaskStore, WaitStore};

    /// Two daemons on one database (two pools, as two processes would
    /// have): their writes of one task take turns on its row, and each
    /// sees what the other committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_handles_on_one_database_take_turns() {
        let db = TempPostgres::create().await;
        let (a, b) = (db.open_postgres().await, db.open_postgres().await);
        let t = Task::new(TaskId::random(), None, TaskConfig::default(), now_ms());
        a.insert_task(&t).await.unwrap();
        b.transition(&t.id, TaskState::Created, Transition::Start).await.unwrap();
        let mut all = Vec::new();
        for i in 0..24 {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let id = t.id.clone();
            all.push(tokio::spawn(async move {
                if i % 3 == 0 {
                    let e = InboxEvent {
                        id: InboxId::random(),
                        task: id.clone(),
                        source: EventSource::Webhook,
                        name: "x".into(),
                        delivery: Some(format!("d{}", i / 6)),
                        data: serde_json::json!({}),
                        received_ms: now_ms(),
                        wait: None,
                    };
                    store.deliver(&e).await.map(|d| u64::from(!d.duplicate))
                } else {
                    let ev = NewEvent { task: id, kind: EventKind::Exec, actor: "t".into(), args: serde_json::json!({"i": i}), exit_code: None, duration_ms: None };
                    store.append_event(&ev).await.map(|_| 1)
                }
            }));
        }
        let mut logged = 0;
        for h in all {
            logged += h.await.unwrap().expect("no write is refused for a busy database");
        }
        // 16 appends and 4 distinct deliveries (8 calls, half of them retries).
        assert_eq!(logged, 20);
        assert_eq!(a.inbox(&t.id).await.unwrap().len(), 4);
        assert_chain(&b, &t.id, 20).await;
    }

    #[tokio::test]
    async fn its_location_hides_the_password() {
        let db = TempPostgres::create().await;
        let url = db.url().replacen("postgres@", "postgres:hunter2@", 1);
        let store = PostgresStore::connect(&url).await.unwrap();
        assert_eq!(store.location(), db.url().replacen("postgres@", "postgres:***@", 1));
        let gone = url.replacen("/cairn_test_", "/no_such_", 1);
        let err = PostgresStore::connect(&gone).await.unwrap_err();
        assert!(matches!(err, Error::Connect(..)) && !err.to_string().contains("hunter2"), "{err}");
    }

    /// PostgreSQL has `TRUNCATE`, which skips row triggers: the logs and
    /// checkpoints refuse it too (the rest of what they refuse is the
    /// conformance suite's `the_log_and_checkpoints_stay_append_only`).
    #[tokio::test]
    async fn truncating_a_log_is_refused() {
        let db = TempPostgres::create().await;
        for sql in ["TRUNCATE events", "TRUNCATE tasks CASCADE", "TRUNCATE checkpoints"] {
            let err = db.tamper(sql, None).await.unwrap_err();
            assert!(err.contains("append-only"), "{sql}: {err}");
        }
    }
}
