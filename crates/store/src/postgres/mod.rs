//! The PostgreSQL store: a database server that several daemons can reach.
//!
//! It keeps the contract exactly as the SQLite store does, with the same
//! statements where the two dialects agree. Where SQLite's single writer
//! made a read-then-write safe (`BEGIN IMMEDIATE`), this store takes **row
//! locks**, not `SERIALIZABLE`: every transaction that reads a task's
//! state, its log head, its pending wait or its inbox before writing first
//! locks the task's row (`SELECT ... FOR NO KEY UPDATE`, [`lock_task`]), so
//! that writers of one task take turns and writers of different tasks do
//! not wait for each other. Transactions that touch several tasks lock
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
//!
//! Tasks, events and sandbox slots are here; snapshots, waits,
//! checkpoints, nodes, leases and API keys in the submodules, one per
//! concern of the contract, as in `sqlite/`.

mod api_keys;
mod secrets;
mod leases;
mod ledger;
mod nodes;
mod snapshots;
mod waits;

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use cairn_core::{Event, EventKind, NewEvent, SandboxState, Task, TaskConfig, TaskId, TaskState, Transition};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{PgConnection, PgPool, Postgres, Row};

use crate::lease::{drops_lease, Fence, Fences};
use crate::tx::WriteTx;
use crate::{now_ms, ChangeListener, Error, EventStore, Result, SandboxRow, SandboxStore, Store, TaskStore};

/// How long connecting, and waiting for a free connection of the pool, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The change listener, shared by every clone of the store.
#[derive(Clone, Default)]
struct Listener(std::sync::Arc<std::sync::RwLock<Option<ChangeListener>>>);

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Listener")
    }
}

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

    /// Tells the listener, if any, that `task` changed.
    pub(crate) fn notify_change(&self, task: &TaskId) {
        if let Some(listener) = self.listener.0.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            listener(task);
        }
    }

    /// Begins a transaction (`READ COMMITTED`; see the module's note on locks).
    pub(crate) async fn begin(&self) -> sqlx::Result<WriteTx<Postgres>> {
        WriteTx::begin(&self.pool, "BEGIN").await
    }

    /// Commits `tx`, then tells waiters which tasks it changed (each once:
    /// a batch of a proxy's decisions is one change of its task).
    pub(crate) async fn commit<'a>(&self, tx: WriteTx<Postgres>, tasks: impl IntoIterator<Item = &'a TaskId>) -> sqlx::Result<()> {
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
impl Store for PostgresStore {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn shared(&self) -> bool {
        true
    }

    fn on_change(&self, listener: ChangeListener) {
        *self.listener.0.write().unwrap_or_else(|e| e.into_inner()) = Some(listener);
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}

#[async_trait]
impl TaskStore for PostgresStore {
    async fn insert_task(&self, task: &Task) -> Result<()> {
        let mut conn = self.pool.acquire().await.map_err(|e| Error::Query("insert task", e))?;
        insert_task_row(&mut conn, task).await
    }

    async fn find_task(&self, id_or_name: &str) -> Result<Task> {
        let row = if TaskId::looks_like(id_or_name) {
            sqlx::query("SELECT * FROM tasks WHERE id = $1").bind(id_or_name).fetch_optional(&self.pool).await
        } else {
            sqlx::query("SELECT * FROM tasks WHERE name = $1").bind(id_or_name).fetch_optional(&self.pool).await
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
        // `json`, not `jsonb`: it takes any text serde_json writes (jsonb
        // refuses a \u0000 escape) and only this one field is read.
        let rows = sqlx::query(
            "SELECT * FROM (SELECT *, (config::json ->> 'idle_suspend_ms')::bigint AS idle_ms FROM tasks WHERE state = $1) t
              WHERE idle_ms IS NOT NULL AND last_activity_ms + idle_ms <= $2",
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
        let done = sqlx::query("UPDATE tasks SET sandbox_state = $1, sandbox_note = $2, node = CASE WHEN $3 THEN node END WHERE id = $4")
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
        let row = sqlx::query("UPDATE tasks SET step = step + 1, last_activity_ms = $1 WHERE id = $2 RETURNING step")
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
        let done = sqlx::query("UPDATE tasks SET config = $1 WHERE id = $2")
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
        sqlx::query("UPDATE tasks SET last_activity_ms = $1 WHERE id = $2")
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
        sqlx::query("UPDATE tasks SET step = $1, memory = $2, recovery_note = $3, last_activity_ms = $4 WHERE id = $5")
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
impl EventStore for PostgresStore {
    async fn append_event(&self, ev: &NewEvent) -> Result<u64> {
        let q = |e| Error::Query("append event", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, &ev.task, Fence::Writer).await?;
        let seq = insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx, [&ev.task]).await.map_err(q)?;
        Ok(seq)
    }

    async fn append_events(&self, events: &[NewEvent]) -> Result<()> {
        let q = |e| Error::Query("append events", e);
        let mut tx = self.begin().await.map_err(q)?;
        lock_tasks(&mut tx, events.iter().map(|e| &e.task)).await.map_err(q)?;
        for task in crate::chain::distinct_tasks(events) {
            self.fence(&mut tx, task, Fence::Writer).await?;
        }
        crate::chain::append(&mut *tx, events).await.map_err(q)?;
        self.commit(tx, events.iter().map(|e| &e.task)).await.map_err(q)
    }

    async fn events(&self, id: &TaskId) -> Result<Vec<Event>> {
        let rows = sqlx::query("SELECT * FROM events WHERE task_id = $1 ORDER BY seq")
            .bind(id.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("read events", e))?;
        rows.iter().map(event_from_row).collect()
    }

    async fn events_after(&self, id: &TaskId, after: u64) -> Result<Vec<Event>> {
        let rows = sqlx::query("SELECT * FROM events WHERE task_id = $1 AND seq > $2 ORDER BY seq")
            .bind(id.as_str())
            .bind(after as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("read events", e))?;
        rows.iter().map(event_from_row).collect()
    }
}

#[async_trait]
impl SandboxStore for PostgresStore {
    async fn claim_sandbox_slot_from(&self, id: &TaskId, min: u32) -> Result<u32> {
        let q = |e| Error::Query("claim sandbox slot", e);
        let mut tx = self.begin().await.map_err(q)?;
        // SQLite runs the statement below alone; here two claims would both
        // pick the same lowest free slot and one would fail on the unique
        // slot. The table lock makes claims take turns (reads go on).
        sqlx::query("LOCK TABLE sandboxes IN SHARE ROW EXCLUSIVE MODE").execute(&mut *tx).await.map_err(q)?;
        let row = sqlx::query(
            "INSERT INTO sandboxes (task_id, uid_slot, started_ms)
             VALUES ($1, (SELECT MIN(s.slot) FROM
                          (SELECT $2::bigint AS slot UNION SELECT uid_slot + 1 FROM sandboxes WHERE uid_slot >= $2) s
                          WHERE s.slot NOT IN (SELECT uid_slot FROM sandboxes)), $3)
             RETURNING uid_slot",
        )
        .bind(id.as_str())
        .bind(i64::from(min))
        .bind(now_ms())
        .fetch_one(&mut *tx)
        .await
        .map_err(q)?;
        tx.commit().await.map_err(q)?;
        Ok(row.get::<i64, _>(0) as u32)
    }

    async fn try_claim_sandbox_slot(&self, task: &TaskId, slot: u32) -> Result<bool> {
        // One insert: the unique slot (and the one row per task) decide.
        let res = sqlx::query("INSERT INTO sandboxes (task_id, uid_slot, started_ms) VALUES ($1, $2, $3)")
            .bind(task.as_str())
            .bind(i64::from(slot))
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
        let state = locked_state(&mut tx, id, "record sandbox start").await?;
        sqlx::query("UPDATE sandboxes SET init_pid = $1, init_start_time = $2 WHERE task_id = $3")
            .bind(pid)
            .bind(start_time as i64)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        if state == Some(TaskState::Created) {
            transition_in(&mut tx, id, TaskState::Created, Transition::Start).await?;
        }
        let updated = sqlx::query("UPDATE tasks SET sandbox_state = $1, sandbox_note = NULL, node = $2, last_activity_ms = $3 WHERE id = $4")
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
        let row = sqlx::query("SELECT * FROM sandboxes WHERE task_id = $1")
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
        // The task's row first, as every transaction that writes for a task locks it.
        sqlx::query("UPDATE tasks SET node = NULL WHERE id = $1").bind(id.as_str()).execute(&mut *tx).await.map_err(q)?;
        sqlx::query("DELETE FROM sandboxes WHERE task_id = $1").bind(id.as_str()).execute(&mut *tx).await.map_err(q)?;
        tx.commit().await.map_err(q)
    }

    async fn set_last_uid_slot(&self, task: &TaskId, slot: Option<u32>) -> Result<()> {
        let q = |e| Error::Query("set last uid slot", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, task, Fence::Owner).await?;
        sqlx::query("UPDATE tasks SET last_uid_slot = $1 WHERE id = $2")
            .bind(slot.map(i64::from))
            .bind(task.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        tx.commit().await.map_err(q)
    }

    async fn last_uid_slot(&self, task: &TaskId) -> Result<Option<u32>> {
        let row = sqlx::query("SELECT last_uid_slot FROM tasks WHERE id = $1")
            .bind(task.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("read last uid slot", e))?;
        Ok(row.and_then(|r| r.get::<Option<i64>, _>(0)).map(|s| s as u32))
    }
}

/// Locks the row of task `id` until the end of the transaction and returns
/// its state as stored (`None`: no such task). Every write transaction that
/// reads before it writes locks first (the module's note says why).
pub(crate) async fn lock_task(conn: &mut PgConnection, id: &TaskId) -> sqlx::Result<Option<String>> {
    let row = sqlx::query("SELECT state FROM tasks WHERE id = $1 FOR NO KEY UPDATE").bind(id.as_str()).fetch_optional(&mut *conn).await?;
    Ok(row.map(|r| r.get(0)))
}

/// [`lock_task`], with the state parsed.
pub(crate) async fn locked_state(conn: &mut PgConnection, id: &TaskId, what: &'static str) -> Result<Option<TaskState>> {
    let found = lock_task(conn, id).await.map_err(|e| Error::Query(what, e))?;
    found.map(|s| s.parse().map_err(|e| Error::Corrupt("task state", e))).transpose()
}

/// Locks the rows of several tasks, each once, in id order.
pub(crate) async fn lock_tasks<'a>(conn: &mut PgConnection, ids: impl IntoIterator<Item = &'a TaskId>) -> sqlx::Result<()> {
    let mut ids: Vec<&str> = ids.into_iter().map(TaskId::as_str).collect();
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        sqlx::query("SELECT 1 FROM tasks WHERE id = $1 FOR NO KEY UPDATE").bind(id).fetch_optional(&mut *conn).await?;
    }
    Ok(())
}

/// [`TaskStore::transition`] inside a transaction of the caller's: one
/// `UPDATE ... WHERE state = $from`. A concurrent writer of the row makes
/// it wait, then it re-checks `state` on the row as that writer left it,
/// so of two moves from one state exactly one matches.
pub(crate) async fn transition_in(conn: &mut PgConnection, id: &TaskId, from: TaskState, t: Transition) -> Result<TaskState> {
    let to = from.apply(t).map_err(|_| Error::Transition { task: id.to_string(), from, action: t.action() })?;
    let q = |e| Error::Query("change task state", e);
    // Suspended or ended, the task needs no node: its lease goes with the move.
    let res = sqlx::query(
        "UPDATE tasks SET state = $1, last_activity_ms = $2,
             lease_node = CASE WHEN $5 THEN NULL ELSE lease_node END,
             lease_expires_ms = CASE WHEN $5 THEN NULL ELSE lease_expires_ms END
         WHERE id = $3 AND state = $4",
    )
        .bind(to.as_str())
        .bind(now_ms())
        .bind(id.as_str())
        .bind(from.as_str())
        .bind(drops_lease(to))
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
pub(crate) async fn task_state_in(conn: &mut PgConnection, id: &TaskId, what: &'static str) -> Result<Option<TaskState>> {
    let found: Option<String> = sqlx::query("SELECT state FROM tasks WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| Error::Query(what, e))?
        .map(|r| r.get(0));
    found.map(|s| s.parse().map_err(|e| Error::Corrupt("task state", e))).transpose()
}

/// Inserts a task's row (a taken name is [`Error::NameTaken`]).
pub(crate) async fn insert_task_row(conn: &mut PgConnection, task: &Task) -> Result<()> {
    let config = serde_json::to_string(&task.config).map_err(|e| Error::Corrupt("config", e.to_string()))?;
    let res = sqlx::query(
        "INSERT INTO tasks (id, name, state, config, step, memory, created_ms, last_activity_ms, sandbox_state, sandbox_note, webhook_secret)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
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
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() && e.constraint() == Some("tasks_name_key") => {
            Err(Error::NameTaken(task.name.clone().unwrap_or_default()))
        }
        Err(e) => Err(Error::Query("insert task", e)),
    }
}

/// Appends `ev` as the next entry of its task's log, chained to the one
/// before it (its `prev_hash`) with its own `hash` (see `cairn_ledger::chain`).
///
/// Runs inside the caller's transaction and locks the task's row first, so
/// the head is read and extended by one writer at a time and the chain
/// cannot fork (the primary key would refuse a second entry with the same
/// seq if one tried). A task that does not exist is refused by the foreign
/// key, as in SQLite.
pub(crate) async fn insert_event(conn: &mut PgConnection, ev: &NewEvent) -> sqlx::Result<u64> {
    lock_task(conn, &ev.task).await?;
    crate::chain::append_one(conn, ev).await
}

impl crate::chain::EventRows for PgConnection {
    async fn head(&mut self, task: &str) -> sqlx::Result<crate::chain::Head> {
        let last = sqlx::query("SELECT seq, hash FROM events WHERE task_id = $1 ORDER BY seq DESC LIMIT 1").bind(task).fetch_optional(&mut *self).await?;
        Ok(crate::chain::Head::from_last(task, last.map(|r| (r.get::<i64, _>(0), r.get::<Option<String>, _>(1)))))
    }

    async fn insert(&mut self, rows: &[crate::chain::Row]) -> sqlx::Result<()> {
        crate::chain::insert::<sqlx::Postgres>(rows).build().execute(&mut *self).await.map(|_| ())
    }
}

fn task_from_row(r: &PgRow) -> Result<Task> {
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

pub(crate) fn event_from_row(r: &PgRow) -> Result<Event> {
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

fn sandbox_from_row(r: &PgRow) -> Result<SandboxRow> {
    let task: String = r.get("task_id");
    Ok(SandboxRow {
        task: task.parse().map_err(|_| Error::Corrupt("sandbox task id", task.clone()))?,
        uid_slot: r.get::<i64, _>("uid_slot") as u32,
        init_pid: r.get("init_pid"),
        init_start_time: r.get::<Option<i64>, _>("init_start_time").map(|v| v as u64),
        started_ms: r.get("started_ms"),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use cairn_core::{EventSource, InboxEvent, InboxId};

    use super::*;
    use crate::conformance::{assert_chain, TestDatabase};
    use crate::testing::postgres::TempPostgres;
    use crate::WaitStore;

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
}
