//! The store's handle (transactions, change notices, the lease fence),
//! [`Store`](crate::Store) and [`TaskStore`](crate::TaskStore), and the
//! steps other concerns' transactions share: a task's state moved by core's
//! transition table, its row locked, its row inserted, its log extended.

/// Writes the part for `$store` on `$db` (see [`super::store!`]).
macro_rules! tasks {
    ($store:ident, $db:ty, $conn:ty) => {
        mod tasks {
            use async_trait::async_trait;
            use cairn_core::{NewEvent, SandboxState, Task, TaskConfig, TaskId, TaskState, Transition};

            use super::$store;
            use $crate::lease::{drops_lease, Fence};
            use $crate::queries::rows::{self, LeaseRow, TaskRow};
            use $crate::queries::Dialect;
            use $crate::tx::WriteTx;
            use $crate::{now_ms, ChangeListener, Error, Result, Store, TaskStore};

            type Db = $db;
            type Conn = $conn;

            impl $store {
                /// Tells the listener, if any, that `task` changed.
                pub(crate) fn notify_change(&self, task: &TaskId) {
                    self.listener.tell(task);
                }

                /// Begins a write transaction (`Dialect::BEGIN`).
                pub(crate) async fn begin(&self) -> sqlx::Result<WriteTx<Db>> {
                    WriteTx::begin(&self.pool, Db::BEGIN).await
                }

                /// Commits `tx`, then tells waiters which tasks it changed
                /// (each once: a batch of a proxy's decisions is one change
                /// of its task).
                pub(crate) async fn commit<'a>(&self, tx: WriteTx<Db>, tasks: impl IntoIterator<Item = &'a TaskId>) -> sqlx::Result<()> {
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

                /// Refuses a write for `task` that its lease does not allow,
                /// inside the writer's transaction (`lease.rs` says what it
                /// checks). The lease is read as the task's row is locked,
                /// so it cannot change before the write commits. An unknown
                /// task passes (the write itself then says so).
                pub(crate) async fn fence(&self, conn: &mut Conn, task: &TaskId, fence: Fence) -> Result<()> {
                    match Self::lease_in(conn, task).await? {
                        Some(stored) => self.fences.check(&stored, fence, now_ms()),
                        None => Ok(()),
                    }
                }

                pub(crate) async fn lease_in(conn: &mut Conn, task: &TaskId) -> Result<Option<$crate::Lease>> {
                    let row: Option<LeaseRow> = sqlx::query_as(Db::LOCK_LEASE)
                        .bind(task.as_str())
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(|e| Error::Query("read task lease", e))?;
                    row.map(LeaseRow::parse).transpose()
                }

                /// Locks the row of task `id` until the end of the
                /// transaction (where rows are locked) and returns its state
                /// as stored (`None`: no such task). Every write transaction
                /// that reads a task before it writes locks it first.
                pub(crate) async fn locked_state(conn: &mut Conn, id: &TaskId, what: &'static str) -> Result<Option<TaskState>> {
                    let found: Option<String> =
                        sqlx::query_scalar(Db::LOCK_TASK).bind(id.as_str()).fetch_optional(&mut *conn).await.map_err(|e| Error::Query(what, e))?;
                    found.map(rows::task_state).transpose()
                }

                /// Locks the row of task `id`, if there is one, where rows
                /// are locked (a write transaction of SQLite holds the whole
                /// database already).
                pub(crate) async fn lock_task(conn: &mut Conn, id: &str) -> sqlx::Result<()> {
                    if Db::ROW_LOCKS {
                        sqlx::query(Db::LOCK_TASK).bind(id).fetch_optional(&mut *conn).await?;
                    }
                    Ok(())
                }

                /// Locks the rows of several tasks, each once, in id order
                /// (so that two such transactions cannot deadlock).
                pub(crate) async fn lock_tasks<'a>(conn: &mut Conn, ids: impl IntoIterator<Item = &'a TaskId>) -> sqlx::Result<()> {
                    if !Db::ROW_LOCKS {
                        return Ok(());
                    }
                    let mut ids: Vec<&str> = ids.into_iter().map(TaskId::as_str).collect();
                    ids.sort_unstable();
                    ids.dedup();
                    for id in ids {
                        Self::lock_task(conn, id).await?;
                    }
                    Ok(())
                }

                /// [`TaskStore::transition`] inside a transaction of the
                /// caller's: one `UPDATE ... WHERE state = $from`. A
                /// concurrent writer of the row makes it wait (or, in
                /// SQLite, holds the database), then it re-checks `state` on
                /// the row as that writer left it, so of two moves from one
                /// state exactly one matches.
                pub(crate) async fn transition_in(conn: &mut Conn, id: &TaskId, from: TaskState, t: Transition) -> Result<TaskState> {
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
                    match Self::task_state_in(conn, id, "change task state").await? {
                        None => Err(Error::UnknownTask(id.to_string())),
                        Some(found) => Err(Error::StateChanged { task: id.to_string(), expected: from, found, action: t.action() }),
                    }
                }

                /// Wakes the task if core's transition table lets an event
                /// (or a cancelled wait) wake it from `state`, the state it
                /// is in, inside the caller's transaction: true when it is
                /// now `waking` and the caller wakes it.
                pub(crate) async fn wake_in(conn: &mut Conn, id: &TaskId, state: TaskState) -> Result<bool> {
                    if state.apply(Transition::Wake).is_err() {
                        return Ok(false);
                    }
                    Self::transition_in(conn, id, state, Transition::Wake).await?;
                    Ok(true)
                }

                /// The state of task `id` as stored, or `None` when there is
                /// no such task.
                pub(crate) async fn task_state_in(conn: &mut Conn, id: &TaskId, what: &'static str) -> Result<Option<TaskState>> {
                    let found: Option<String> = sqlx::query_scalar("SELECT state FROM tasks WHERE id = $1")
                        .bind(id.as_str())
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(|e| Error::Query(what, e))?;
                    found.map(rows::task_state).transpose()
                }

                /// Inserts a task's row (a taken name is [`Error::NameTaken`]).
                pub(crate) async fn insert_task_row(conn: &mut Conn, task: &Task) -> Result<()> {
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
                        Err(sqlx::Error::Database(e)) if e.is_unique_violation() && Db::violates(&*e, Db::TASK_NAME_KEY) => {
                            Err(Error::NameTaken(task.name.clone().unwrap_or_default()))
                        }
                        Err(e) => Err(Error::Query("insert task", e)),
                    }
                }

                /// Appends `ev` as the next entry of its task's log, chained
                /// to the one before it (its `prev_hash`) with its own
                /// `hash` (see `cairn_ledger::chain`).
                ///
                /// Runs inside the caller's transaction and locks the task's
                /// row first (SQLite's transaction holds the database from
                /// `BEGIN IMMEDIATE`), so the head is read and extended by
                /// one writer at a time and the chain cannot fork (the
                /// primary key would refuse a second entry with the same seq
                /// if one tried). A task that does not exist is refused by
                /// the foreign key.
                pub(crate) async fn insert_event(conn: &mut Conn, ev: &NewEvent) -> sqlx::Result<u64> {
                    Self::lock_task(conn, ev.task.as_str()).await?;
                    $crate::chain::append_one(conn, ev).await
                }
            }

            #[cfg(test)]
            impl $store {
                /// Runs `sql` past the store's methods, as someone editing
                /// the database by hand would (`$1` bound to `task` when
                /// given): the database's message when it refuses.
                pub(crate) async fn tamper(&self, sql: &str, task: Option<&str>) -> std::result::Result<(), String> {
                    let mut q = sqlx::query(sql);
                    if let Some(task) = task {
                        q = q.bind(task);
                    }
                    q.execute(&self.pool).await.map(drop).map_err(|e| e.to_string())
                }
            }

            #[async_trait]
            impl Store for $store {
                fn location(&self) -> String {
                    self.location_url()
                }

                fn shared(&self) -> bool {
                    Db::SHARED
                }

                fn on_change(&self, listener: ChangeListener) {
                    self.listener.set(listener);
                }

                async fn copy_to(&self, path: &std::path::Path) -> Result<()> {
                    self.copy_database_to(path).await
                }

                async fn close(&self) {
                    self.pool.close().await;
                }
            }

            #[async_trait]
            impl TaskStore for $store {
                async fn insert_task(&self, task: &Task) -> Result<()> {
                    let mut conn = self.pool.acquire().await.map_err(|e| Error::Query("insert task", e))?;
                    Self::insert_task_row(&mut conn, task).await
                }

                async fn find_task(&self, id_or_name: &str) -> Result<Task> {
                    let sql = if TaskId::looks_like(id_or_name) { "SELECT * FROM tasks WHERE id = $1" } else { "SELECT * FROM tasks WHERE name = $1" };
                    let row: Option<TaskRow> =
                        sqlx::query_as(sql).bind(id_or_name).fetch_optional(&self.pool).await.map_err(|e| Error::Query("find task", e))?;
                    row.map(TaskRow::parse).transpose()?.ok_or_else(|| Error::UnknownTask(id_or_name.to_owned()))
                }

                async fn list_tasks(&self) -> Result<Vec<Task>> {
                    let rows: Vec<TaskRow> = sqlx::query_as("SELECT * FROM tasks ORDER BY created_ms, id")
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("list tasks", e))?;
                    rows.into_iter().map(TaskRow::parse).collect()
                }

                async fn list_tasks_page(&self, filter: &$crate::TaskFilter, offset: u64, limit: u64) -> Result<(Vec<Task>, u64)> {
                    const MATCHES: &str = "FROM tasks WHERE ($1 = '' OR state = $1) \
                         AND ($2 = '' OR lower(id) LIKE $2 ESCAPE '\\' OR lower(COALESCE(name, '')) LIKE $2 ESCAPE '\\')";
                    let q = |e| Error::Query("list tasks", e);
                    let state = filter.state.map(|s| s.as_str()).unwrap_or("");
                    let like = filter.like();
                    let total: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) {MATCHES}"))
                        .bind(state)
                        .bind(&like)
                        .fetch_one(&self.pool)
                        .await
                        .map_err(q)?;
                    let rows: Vec<TaskRow> = sqlx::query_as(&format!("SELECT * {MATCHES} ORDER BY created_ms DESC, id LIMIT $3 OFFSET $4"))
                        .bind(state)
                        .bind(&like)
                        .bind(limit.min(i64::MAX as u64) as i64)
                        .bind(offset.min(i64::MAX as u64) as i64)
                        .fetch_all(&self.pool)
                        .await
                        .map_err(q)?;
                    Ok((rows.into_iter().map(TaskRow::parse).collect::<Result<_>>()?, total as u64))
                }

                async fn idle_tasks(&self, now_ms: i64) -> Result<Vec<Task>> {
                    let rows: Vec<TaskRow> = sqlx::query_as(Db::IDLE_TASKS)
                        .bind(TaskState::Running.as_str())
                        .bind(now_ms)
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("list idle tasks", e))?;
                    rows.into_iter().map(TaskRow::parse).collect()
                }

                async fn transition(&self, id: &TaskId, from: TaskState, t: Transition) -> Result<TaskState> {
                    let q = |e| Error::Query("change task state", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    self.fence(&mut tx, id, Fence::Owner).await?;
                    let to = Self::transition_in(&mut tx, id, from, t).await?;
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
                    // A command's start and end are written by the node that
                    // runs its sandbox: never by one whose lease another node
                    // has taken since, even once it has forgotten its token.
                    self.fence(&mut tx, id, Fence::Owner).await?;
                    let step: i64 = sqlx::query_scalar("UPDATE tasks SET step = step + 1, last_activity_ms = $1 WHERE id = $2 RETURNING step")
                        .bind(now_ms())
                        .bind(id.as_str())
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(q)?
                        .ok_or_else(|| Error::UnknownTask(id.to_string()))?;
                    tx.commit().await.map_err(q)?;
                    Ok(step as u64)
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
                    Self::insert_event(&mut tx, ev).await.map_err(q)?;
                    self.commit(tx, [id]).await.map_err(q)
                }

                async fn end_command(&self, ev: &NewEvent) -> Result<u64> {
                    let q = |e| Error::Query("log a command's end", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    self.fence(&mut tx, &ev.task, Fence::Owner).await?;
                    let seq = Self::insert_event(&mut tx, ev).await.map_err(q)?;
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
                    Self::transition_in(&mut tx, task, from, Transition::Recover).await?;
                    sqlx::query("UPDATE tasks SET step = $1, memory = $2, recovery_note = $3, last_activity_ms = $4 WHERE id = $5")
                        .bind(step as i64)
                        .bind(memory)
                        .bind(note)
                        .bind(now_ms())
                        .bind(task.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(q)?;
                    Self::insert_event(&mut tx, ev).await.map_err(q)?;
                    self.commit(tx, [task]).await.map_err(q)
                }
            }
        }
    };
}
pub(crate) use tasks;
