//! The SQLite store: one file under `$CAIRN_HOME`, for a single daemon.
//!
//! Every write is one statement or one transaction, so a crash at any point
//! leaves either the old or the new state; each transaction is a
//! [`WriteTx`], which ends in a commit or a rollback on every path (a
//! failed commit on a full disk included: `tx.rs`). Transactions that write
//! begin `IMMEDIATE`: one that read first and then upgraded would fail at
//! once with "database is locked" under concurrent writers instead of
//! waiting its turn. The database runs in WAL mode with
//! `synchronous=FULL`: a call that returned has reached the disk.
//!
//! Tasks, events and sandbox slots are here; snapshots, waits,
//! checkpoints, nodes, leases and API keys in the submodules, one per
//! concern of the contract.

mod api_keys;
mod secrets;
mod leases;
mod ledger;
mod nodes;
mod snapshots;
mod waits;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use cairn_core::{Event, EventKind, NewEvent, SandboxState, Task, TaskConfig, TaskId, TaskState, Transition};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{Row, Sqlite, SqlitePool};

use crate::lease::{drops_lease, Fence, Fences};
use crate::tx::WriteTx;
use crate::{now_ms, ChangeListener, Error, EventStore, Result, SandboxRow, SandboxStore, Store, TaskStore};

/// Handle on the SQLite task database; clones share the connection pool.
/// The change listener, shared by every clone of the store.
#[derive(Clone, Default)]
struct Listener(std::sync::Arc<std::sync::RwLock<Option<ChangeListener>>>);

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Listener")
    }
}

#[derive(Clone, Debug)]
pub struct SqliteStore {
    pub(crate) pool: SqlitePool,
    path: PathBuf,
    /// Bumped after every committed change to a task's state, events or
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
        ledger::backfill(&pool).await?;
        Ok(SqliteStore { pool, path: path.to_owned(), listener: Listener::default(), fences: Default::default() })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tells the listener, if any, that `task` changed.
    pub(crate) fn notify_change(&self, task: &TaskId) {
        if let Some(listener) = self.listener.0.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            listener(task);
        }
    }

    /// Begins a write transaction (`IMMEDIATE`: see the module's note).
    pub(crate) async fn begin(&self) -> sqlx::Result<WriteTx<Sqlite>> {
        WriteTx::begin(&self.pool, "BEGIN IMMEDIATE").await
    }

    /// Commits `tx`, then tells waiters which tasks it changed (each once:
    /// a batch of a proxy's decisions is one change of its task).
    pub(crate) async fn commit<'a>(&self, tx: WriteTx<Sqlite>, tasks: impl IntoIterator<Item = &'a TaskId>) -> sqlx::Result<()> {
        tx.commit().await?;
        let mut told: Vec<&TaskId> = Vec::new();
        for t in tasks {
            if !told.contains(&t) {
                self.notify_change(t);
                told.push(t);
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn location(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    fn on_change(&self, listener: ChangeListener) {
        *self.listener.0.write().unwrap_or_else(|e| e.into_inner()) = Some(listener);
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}

#[async_trait]
impl TaskStore for SqliteStore {
    async fn insert_task(&self, task: &Task) -> Result<()> {
        let mut conn = self.pool.acquire().await.map_err(|e| Error::Query("insert task", e))?;
        insert_task_row(&mut conn, task).await
    }

    async fn find_task(&self, id_or_name: &str) -> Result<Task> {
        let row = if TaskId::looks_like(id_or_name) {
            sqlx::query("SELECT * FROM tasks WHERE id = ?").bind(id_or_name).fetch_optional(&self.pool).await
        } else {
            sqlx::query("SELECT * FROM tasks WHERE name = ?").bind(id_or_name).fetch_optional(&self.pool).await
        }
        .map_err(|e| Error::Query("find task", e))?;
        row.map(|r| task_from_row(&r)).transpose()?.ok_or_else(|| Error::UnknownTask(id_or_name.to_owned()))
    }

    async fn list_tasks(&self) -> Result<Vec<Task>> {
        let rows = sqlx::query("SELECT * FROM tasks ORDER BY created_ms, id")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("list tasks", e))?;
        rows.iter().map(task_from_row).collect()
    }

    async fn idle_tasks(&self, now_ms: i64) -> Result<Vec<Task>> {
        let rows = sqlx::query(
            "SELECT * FROM tasks WHERE state = ?
               AND json_extract(config, '$.idle_suspend_ms') IS NOT NULL
               AND last_activity_ms + json_extract(config, '$.idle_suspend_ms') <= ?",
        )
        .bind(TaskState::Running.as_str())
        .bind(now_ms)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| Error::Query("list idle tasks", e))?;
        rows.iter().map(task_from_row).collect()
    }

    async fn transition(&self, id: &TaskId, from: TaskState, t: Transition) -> Result<TaskState> {
        let q = |e| Error::Query("change task state", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, id, Fence::Owner).await?;
        let to = transition_in(&mut tx, id, from, t).await?;
        self.commit(tx, [id]).await.map_err(q)?;
        if drops_lease(to) {
            self.fences.forget(id);
        }
        Ok(to)
    }

    async fn set_sandbox_state(&self, id: &TaskId, state: SandboxState, note: Option<&str>) -> Result<()> {
        let q = |e| Error::Query("set sandbox state", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, id, Fence::Owner).await?;
        // A sandbox that is not up runs on no node; one that is keeps its node.
        let done = sqlx::query("UPDATE tasks SET sandbox_state = ?, sandbox_note = ?, node = CASE WHEN ? THEN node END WHERE id = ?")
            .bind(state.as_str())
            .bind(note)
            .bind(state == SandboxState::Ready)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        if done.rows_affected() == 0 {
            return Err(Error::UnknownTask(id.to_string()));
        }
        self.commit(tx, [id]).await.map_err(q)
    }

    async fn bump_step(&self, id: &TaskId) -> Result<u64> {
        let q = |e| Error::Query("bump step", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, id, Fence::Writer).await?;
        let row = sqlx::query("UPDATE tasks SET step = step + 1, last_activity_ms = ? WHERE id = ? RETURNING step")
            .bind(now_ms())
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(q)?
            .ok_or_else(|| Error::UnknownTask(id.to_string()))?;
        tx.commit().await.map_err(q)?;
        Ok(row.get::<i64, _>(0) as u64)
    }

    async fn set_config(&self, id: &TaskId, config: &TaskConfig, ev: &NewEvent) -> Result<()> {
        let q = |e| Error::Query("set task config", e);
        let text = serde_json::to_string(config).map_err(|e| Error::Corrupt("config", e.to_string()))?;
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, id, Fence::Writer).await?;
        let done = sqlx::query("UPDATE tasks SET config = ? WHERE id = ?")
            .bind(text)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        if done.rows_affected() == 0 {
            return Err(Error::UnknownTask(id.to_string()));
        }
        insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx, [id]).await.map_err(q)
    }

    async fn end_command(&self, ev: &NewEvent) -> Result<u64> {
        let q = |e| Error::Query("log a command's end", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, &ev.task, Fence::Writer).await?;
        let seq = insert_event(&mut tx, ev).await.map_err(q)?;
        sqlx::query("UPDATE tasks SET last_activity_ms = ? WHERE id = ?")
            .bind(now_ms())
            .bind(ev.task.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        self.commit(tx, [&ev.task]).await.map_err(q)?;
        Ok(seq)
    }

    async fn record_recovery(&self, task: &TaskId, from: TaskState, step: u64, memory: &str, note: &str, ev: &NewEvent) -> Result<()> {
        let q = |e| Error::Query("record recovery", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, task, Fence::Owner).await?;
        transition_in(&mut tx, task, from, Transition::Recover).await?;
        sqlx::query("UPDATE tasks SET step = ?, memory = ?, recovery_note = ?, last_activity_ms = ? WHERE id = ?")
            .bind(step as i64)
            .bind(memory)
            .bind(note)
            .bind(now_ms())
            .bind(task.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx, [task]).await.map_err(q)
    }
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn append_event(&self, ev: &NewEvent) -> Result<u64> {
        let q = |e| Error::Query("append event", e);
        // IMMEDIATE: the chain's head is read and extended under the write lock.
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, &ev.task, Fence::Writer).await?;
        let seq = insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx, [&ev.task]).await.map_err(q)?;
        Ok(seq)
    }

    async fn append_events(&self, events: &[NewEvent]) -> Result<()> {
        let q = |e| Error::Query("append events", e);
        let mut tx = self.begin().await.map_err(q)?;
        for task in crate::chain::distinct_tasks(events) {
            self.fence(&mut tx, task, Fence::Writer).await?;
        }
        crate::chain::append(&mut *tx, events).await.map_err(q)?;
        self.commit(tx, events.iter().map(|e| &e.task)).await.map_err(q)
    }

    async fn events(&self, id: &TaskId) -> Result<Vec<Event>> {
        let rows = sqlx::query("SELECT * FROM events WHERE task_id = ? ORDER BY seq")
            .bind(id.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("read events", e))?;
        rows.iter().map(event_from_row).collect()
    }

    async fn events_after(&self, id: &TaskId, after: u64) -> Result<Vec<Event>> {
        let rows = sqlx::query("SELECT * FROM events WHERE task_id = ? AND seq > ? ORDER BY seq")
            .bind(id.as_str())
            .bind(after as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("read events", e))?;
        rows.iter().map(event_from_row).collect()
    }
}

#[async_trait]
impl SandboxStore for SqliteStore {
    async fn claim_sandbox_slot_from(&self, id: &TaskId, min: u32) -> Result<u32> {
        // One statement, so two concurrent starts never share a slot.
        let row = sqlx::query(
            "INSERT INTO sandboxes (task_id, uid_slot, started_ms)
             VALUES (?1, (SELECT MIN(s.slot) FROM
                          (SELECT ?2 AS slot UNION SELECT uid_slot + 1 FROM sandboxes WHERE uid_slot >= ?2) s
                          WHERE s.slot NOT IN (SELECT uid_slot FROM sandboxes)), ?3)
             RETURNING uid_slot",
        )
        .bind(id.as_str())
        .bind(min as i64)
        .bind(now_ms())
        .fetch_one(&self.pool)
        .await
        .map_err(|e| Error::Query("claim sandbox slot", e))?;
        Ok(row.get::<i64, _>(0) as u32)
    }

    async fn try_claim_sandbox_slot(&self, task: &TaskId, slot: u32) -> Result<bool> {
        let res = sqlx::query("INSERT INTO sandboxes (task_id, uid_slot, started_ms) VALUES (?, ?, ?)")
            .bind(task.as_str())
            .bind(slot as i64)
            .bind(now_ms())
            .execute(&self.pool)
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
            Err(e) => Err(Error::Query("claim sandbox slot", e)),
        }
    }

    async fn record_sandbox_ready(&self, id: &TaskId, node: &str, pid: i32, start_time: u64, ev: &NewEvent) -> Result<u64> {
        let q = |e| Error::Query("record sandbox start", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, id, Fence::Owner).await?;
        sqlx::query("UPDATE sandboxes SET init_pid = ?, init_start_time = ? WHERE task_id = ?")
            .bind(pid)
            .bind(start_time as i64)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        if task_state_in(&mut tx, id, "record sandbox start").await? == Some(TaskState::Created) {
            transition_in(&mut tx, id, TaskState::Created, Transition::Start).await?;
        }
        let updated = sqlx::query("UPDATE tasks SET sandbox_state = ?, sandbox_note = NULL, node = ?, last_activity_ms = ? WHERE id = ?")
        .bind(SandboxState::Ready.as_str())
        .bind(node)
        .bind(now_ms())
        .bind(id.as_str())
        .execute(&mut *tx)
        .await
        .map_err(q)?;
        if updated.rows_affected() == 0 {
            return Err(Error::UnknownTask(id.to_string()));
        }
        let seq = insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx, [id]).await.map_err(q)?;
        Ok(seq)
    }

    async fn sandbox(&self, id: &TaskId) -> Result<Option<SandboxRow>> {
        let row = sqlx::query("SELECT * FROM sandboxes WHERE task_id = ?")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("read sandbox", e))?;
        row.map(|r| sandbox_from_row(&r)).transpose()
    }

    async fn sandboxes(&self) -> Result<Vec<SandboxRow>> {
        let rows = sqlx::query("SELECT * FROM sandboxes ORDER BY uid_slot")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("list sandboxes", e))?;
        rows.iter().map(sandbox_from_row).collect()
    }

    async fn release_sandbox(&self, id: &TaskId) -> Result<()> {
        let q = |e| Error::Query("release sandbox", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, id, Fence::Owner).await?;
        sqlx::query("DELETE FROM sandboxes WHERE task_id = ?").bind(id.as_str()).execute(&mut *tx).await.map_err(q)?;
        sqlx::query("UPDATE tasks SET node = NULL WHERE id = ?").bind(id.as_str()).execute(&mut *tx).await.map_err(q)?;
        tx.commit().await.map_err(q)
    }

    async fn set_last_uid_slot(&self, task: &TaskId, slot: Option<u32>) -> Result<()> {
        let q = |e| Error::Query("set last uid slot", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, task, Fence::Owner).await?;
        sqlx::query("UPDATE tasks SET last_uid_slot = ? WHERE id = ?")
            .bind(slot.map(i64::from))
            .bind(task.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        tx.commit().await.map_err(q)
    }

    async fn last_uid_slot(&self, task: &TaskId) -> Result<Option<u32>> {
        let row = sqlx::query("SELECT last_uid_slot FROM tasks WHERE id = ?")
            .bind(task.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("read last uid slot", e))?;
        Ok(row.and_then(|r| r.get::<Option<i64>, _>(0)).map(|s| s as u32))
    }
}

/// [`TaskStore::transition`] inside a transaction of the caller's.
pub(crate) async fn transition_in(conn: &mut sqlx::SqliteConnection, id: &TaskId, from: TaskState, t: Transition) -> Result<TaskState> {
    let to = from.apply(t).map_err(|_| Error::Transition { task: id.to_string(), from, action: t.action() })?;
    let q = |e| Error::Query("change task state", e);
    // Suspended or ended, the task needs no node: its lease goes with the move.
    let res = sqlx::query(
        "UPDATE tasks SET state = ?, last_activity_ms = ?,
             lease_node = CASE WHEN ? THEN NULL ELSE lease_node END,
             lease_expires_ms = CASE WHEN ? THEN NULL ELSE lease_expires_ms END
         WHERE id = ? AND state = ?",
    )
        .bind(to.as_str())
        .bind(now_ms())
        .bind(drops_lease(to))
        .bind(drops_lease(to))
        .bind(id.as_str())
        .bind(from.as_str())
        .execute(&mut *conn)
        .await
        .map_err(q)?;
    if res.rows_affected() == 1 {
        return Ok(to);
    }
    match task_state_in(conn, id, "change task state").await? {
        None => Err(Error::UnknownTask(id.to_string())),
        Some(found) => Err(Error::StateChanged { task: id.to_string(), expected: from, found, action: t.action() }),
    }
}

/// The state of task `id` as stored, or `None` when there is no such task.
pub(crate) async fn task_state_in(conn: &mut sqlx::SqliteConnection, id: &TaskId, what: &'static str) -> Result<Option<TaskState>> {
    let found: Option<String> = sqlx::query("SELECT state FROM tasks WHERE id = ?")
        .bind(id.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| Error::Query(what, e))?
        .map(|r| r.get(0));
    found.map(|s| s.parse().map_err(|e| Error::Corrupt("task state", e))).transpose()
}

/// Inserts a task's row (a taken name is [`Error::NameTaken`]).
pub(crate) async fn insert_task_row(conn: &mut sqlx::SqliteConnection, task: &Task) -> Result<()> {
    let config = serde_json::to_string(&task.config).map_err(|e| Error::Corrupt("config", e.to_string()))?;
    let res = sqlx::query(
        "INSERT INTO tasks (id, name, state, config, step, memory, created_ms, last_activity_ms, sandbox_state, sandbox_note, webhook_secret)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(task.id.as_str())
    .bind(task.name.as_deref())
    .bind(task.state.as_str())
    .bind(config)
    .bind(task.step as i64)
    .bind(&task.memory)
    .bind(task.created_ms)
    .bind(task.last_activity_ms)
    .bind(task.sandbox.as_str())
    .bind(task.sandbox_note.as_deref())
    .bind(task.webhook_secret.as_deref())
    .execute(conn)
    .await;
    match res {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() && e.message().contains("tasks.name") => {
            Err(Error::NameTaken(task.name.clone().unwrap_or_default()))
        }
        Err(e) => Err(Error::Query("insert task", e)),
    }
}

/// Appends `ev` as the next entry of its task's log, chained to the one
/// before it (its `prev_hash`) with its own `hash` (see `cairn_ledger::chain`).
///
/// Runs inside the caller's transaction, which must have begun `IMMEDIATE`:
/// the head is read and extended under the write lock, so two writers
/// cannot fork the chain (and the primary key refuses a second entry with
/// the same seq if one tried).
pub(crate) async fn insert_event(conn: &mut sqlx::SqliteConnection, ev: &NewEvent) -> sqlx::Result<u64> {
    crate::chain::append_one(conn, ev).await
}

impl crate::chain::EventRows for sqlx::SqliteConnection {
    async fn head(&mut self, task: &str) -> sqlx::Result<crate::chain::Head> {
        let last = sqlx::query("SELECT seq, hash FROM events WHERE task_id = ? ORDER BY seq DESC LIMIT 1").bind(task).fetch_optional(&mut *self).await?;
        Ok(crate::chain::Head::from_last(task, last.map(|r| (r.get::<i64, _>(0), r.get::<Option<String>, _>(1)))))
    }

    async fn insert(&mut self, rows: &[crate::chain::Row]) -> sqlx::Result<()> {
        crate::chain::insert::<sqlx::Sqlite>(rows).build().execute(&mut *self).await.map(|_| ())
    }
}

fn task_from_row(r: &SqliteRow) -> Result<Task> {
    let id: String = r.get("id");
    let state: String = r.get("state");
    let config: String = r.get("config");
    let sandbox: String = r.get("sandbox_state");
    Ok(Task {
        id: id.parse().map_err(|_| Error::Corrupt("task id", id.clone()))?,
        name: r.get("name"),
        state: TaskState::from_str(&state).map_err(|e| Error::Corrupt("task state", e))?,
        config: serde_json::from_str::<TaskConfig>(&config).map_err(|e| Error::Corrupt("task config", e.to_string()))?,
        step: r.get::<i64, _>("step") as u64,
        memory: r.get("memory"),
        created_ms: r.get("created_ms"),
        last_activity_ms: r.get("last_activity_ms"),
        sandbox: SandboxState::from_str(&sandbox).map_err(|e| Error::Corrupt("sandbox state", e))?,
        sandbox_note: r.get("sandbox_note"),
        recovery_note: r.get("recovery_note"),
        webhook_secret: r.get("webhook_secret"),
        node: r.get("node"),
        rollback_note: r
            .get::<Option<String>, _>("rollback_note")
            .map(|n| serde_json::from_str(&n).map_err(|e| Error::Corrupt("rollback note", e.to_string())))
            .transpose()?,
    })
}

pub(crate) fn event_from_row(r: &SqliteRow) -> Result<Event> {
    let task: String = r.get("task_id");
    let kind: String = r.get("kind");
    let args: String = r.get("args");
    Ok(Event {
        seq: r.get::<i64, _>("seq") as u64,
        task: task.parse().map_err(|_| Error::Corrupt("event task id", task.clone()))?,
        time_ms: r.get("time_ms"),
        kind: EventKind::from_str(&kind).map_err(|e| Error::Corrupt("event kind", e))?,
        actor: r.get("actor"),
        args: serde_json::from_str(&args).map_err(|e| Error::Corrupt("event args", e.to_string()))?,
        exit_code: r.get("exit_code"),
        duration_ms: r.get::<Option<i64>, _>("duration_ms").map(|d| d as u64),
        prev_hash: r.get("prev_hash"),
        hash: r.get("hash"),
    })
}

fn sandbox_from_row(r: &SqliteRow) -> Result<SandboxRow> {
    let task: String = r.get("task_id");
    Ok(SandboxRow {
        task: task.parse().map_err(|_| Error::Corrupt("sandbox task id", task.clone()))?,
        uid_slot: r.get::<i64, _>("uid_slot") as u32,
        init_pid: r.get("init_pid"),
        init_start_time: r.get::<Option<i64>, _>("init_start_time").map(|v| v as u64),
        started_ms: r.get("started_ms"),
    })
}

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::TestDatabase;

    #[tokio::test]
    async fn event_log_is_append_only() {
        let db = TempSqlite::create().await;
        let store = db.open_sqlite().await;
        let t = Task::new(TaskId::random(), None, TaskConfig::default(), now_ms());
        store.insert_task(&t).await.unwrap();
        let ev = NewEvent { task: t.id.clone(), kind: EventKind::Create, actor: "test".into(), args: serde_json::json!({}), exit_code: None, duration_ms: None };
        store.append_event(&ev).await.unwrap();
        let upd = sqlx::query("UPDATE events SET actor = 'mallory'").execute(&store.pool).await;
        assert!(upd.unwrap_err().to_string().contains("append-only"));
        let del = sqlx::query("DELETE FROM events").execute(&store.pool).await;
        assert!(del.unwrap_err().to_string().contains("append-only"));
        assert_eq!(store.events(&t.id).await.unwrap()[0].actor, "test");
    }
}
