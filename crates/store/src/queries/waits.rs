//! [`WaitStore`](crate::WaitStore): waits, the durable inbox, and the
//! task-state steps of suspend and wake that must happen in the same
//! transaction as them.
//!
//! Each transaction here locks the task's row first: a delivery and a new
//! wait (or a suspend ending) of one task then take turns, so an event is
//! never stored unmatched while a wait it matches is being inserted, and a
//! retried delivery finds the first one. Whether a delivery (or a cancel)
//! wakes the task is core's transition table's call
//! (`TaskState::apply(Transition::Wake)`), made on the state read under
//! that lock and written in the same transaction.

/// Writes the part for `$store` on `$db` (see [`super::store!`]).
macro_rules! waits {
    ($store:ident, $db:ty, $conn:ty) => {
        mod waits {
            use async_trait::async_trait;
            use cairn_core::{EventKind, InboxEvent, NewEvent, SandboxState, TaskId, TaskState, Transition, Wait, WaitFor, WaitId};

            use super::$store;
            use $crate::lease::{drops_lease, Fence};
            use $crate::queries::rows::{InboxRow, WaitRow};
            use $crate::queries::Dialect;
            use $crate::{now_ms, Delivered, Error, Result, WaitStore};

            type Db = $db;
            type Conn = $conn;

            #[async_trait]
            impl WaitStore for $store {
                async fn insert_wait(&self, w: &Wait, ev: &NewEvent) -> Result<Option<InboxEvent>> {
                    let q = |e| Error::Query("insert wait", e);
                    let what = serde_json::to_string(&w.what).map_err(|e| Error::Corrupt("wait", e.to_string()))?;
                    let fire_at = match w.what {
                        WaitFor::Timer { fire_at_ms } => Some(fire_at_ms),
                        _ => None,
                    };
                    let mut tx = self.begin().await.map_err(q)?;
                    Self::lock_task(&mut tx, w.task.as_str()).await.map_err(q)?;
                    self.fence(&mut tx, &w.task, Fence::Writer).await?;
                    let res = sqlx::query("INSERT INTO waits (id, task_id, what, kind, fire_at_ms, created_ms) VALUES ($1, $2, $3, $4, $5, $6)")
                        .bind(w.id.as_str())
                        .bind(w.task.as_str())
                        .bind(what)
                        .bind(w.what.kind())
                        .bind(fire_at)
                        .bind(w.created_ms)
                        .execute(&mut *tx)
                        .await;
                    match res {
                        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => return Err(Error::WaitPending(w.task.to_string())),
                        other => other.map_err(q)?,
                    };
                    let rows: Vec<InboxRow> = sqlx::query_as(Db::UNMATCHED_INBOX).bind(w.task.as_str()).fetch_all(&mut *tx).await.map_err(q)?;
                    let mut found = None;
                    for r in rows {
                        let e = r.parse()?;
                        if e.matches(w) {
                            found = Some(e);
                            break;
                        }
                    }
                    if let Some(e) = &mut found {
                        satisfy(&mut tx, w.id.as_str(), e).await.map_err(q)?;
                    }
                    Self::insert_event(&mut tx, ev).await.map_err(q)?;
                    self.commit(tx, [&w.task]).await.map_err(q)?;
                    Ok(found)
                }

                async fn deliver(&self, ev: &InboxEvent) -> Result<Delivered> {
                    let q = |e| Error::Query("deliver event", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    self.fence(&mut tx, &ev.task, Fence::Writer).await?;
                    // Locked before the check for a repeated delivery, so
                    // that of two concurrent retries the second finds the first.
                    let state = Self::locked_state(&mut tx, &ev.task, "deliver event").await?;
                    if let Some(d) = &ev.delivery {
                        let seen: Option<InboxRow> = sqlx::query_as("SELECT * FROM inbox WHERE task_id = $1 AND source = $2 AND delivery = $3")
                            .bind(ev.task.as_str())
                            .bind(ev.source.as_str())
                            .bind(d)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(q)?;
                        if let Some(r) = seen {
                            let first = r.parse()?;
                            return Ok(Delivered { satisfied: first.wait.clone(), event: first, duplicate: true, wake: false });
                        }
                    }
                    let state = state.ok_or_else(|| Error::UnknownTask(ev.task.to_string()))?;
                    sqlx::query("INSERT INTO inbox (id, task_id, source, name, delivery, data, received_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)")
                        .bind(ev.id.as_str())
                        .bind(ev.task.as_str())
                        .bind(ev.source.as_str())
                        .bind(&ev.name)
                        .bind(ev.delivery.as_deref())
                        .bind(ev.data.to_string())
                        .bind(ev.received_ms)
                        .execute(&mut *tx)
                        .await
                        .map_err(q)?;
                    let mut event = ev.clone();
                    let pending = pending_wait_in(&mut tx, &ev.task).await?;
                    let mut satisfied = None;
                    let mut wake = false;
                    if let Some(w) = pending.filter(|w| ev.matches(w)) {
                        satisfy(&mut tx, w.id.as_str(), &mut event).await.map_err(q)?;
                        satisfied = Some(w.id.clone());
                        wake = Self::wake_in(&mut tx, &ev.task, state).await?;
                    }
                    let log = NewEvent {
                        task: ev.task.clone(),
                        kind: EventKind::EventReceived,
                        actor: ev.source.as_str().to_owned(),
                        args: serde_json::json!({ "event": ev.id, "source": ev.source, "name": ev.name, "delivery": ev.delivery, "satisfied": satisfied }),
                        exit_code: None,
                        duration_ms: None,
                    };
                    Self::insert_event(&mut tx, &log).await.map_err(q)?;
                    self.commit(tx, [&ev.task]).await.map_err(q)?;
                    Ok(Delivered { event, duplicate: false, satisfied, wake })
                }

                async fn finish_suspend(&self, task: &TaskId, waiting_for: Option<&WaitId>, ev: &NewEvent) -> Result<TaskState> {
                    let q = |e| Error::Query("finish suspend", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    // Locked first: a delivery that satisfies the wait either
                    // committed before (and is read below) or runs after (and
                    // sees `suspended`).
                    Self::lock_task(&mut tx, task.as_str()).await.map_err(q)?;
                    self.fence(&mut tx, task, Fence::Owner).await?;
                    let satisfied = match waiting_for {
                        Some(w) => sqlx::query_scalar("SELECT satisfied_ms IS NOT NULL FROM waits WHERE id = $1")
                            .bind(w.as_str())
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(q)?
                            .unwrap_or(false),
                        None => false,
                    };
                    let done = if satisfied { Transition::SuspendedIntoWake } else { Transition::Suspended };
                    let state = Self::transition_in(&mut tx, task, TaskState::Suspending, done).await?;
                    sqlx::query("UPDATE tasks SET sandbox_state = $1, sandbox_note = NULL, node = NULL WHERE id = $2")
                        .bind(SandboxState::None.as_str())
                        .bind(task.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(q)?;
                    Self::insert_event(&mut tx, ev).await.map_err(q)?;
                    self.commit(tx, [task]).await.map_err(q)?;
                    if drops_lease(state) {
                        self.fences.forget(task);
                    }
                    Ok(state)
                }

                async fn finish_wake(&self, task: &TaskId, ev: &NewEvent) -> Result<()> {
                    let q = |e| Error::Query("finish wake", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    self.fence(&mut tx, task, Fence::Owner).await?;
                    Self::transition_in(&mut tx, task, TaskState::Waking, Transition::Woke).await?;
                    Self::insert_event(&mut tx, ev).await.map_err(q)?;
                    self.commit(tx, [task]).await.map_err(q)
                }

                async fn cancel_wait(&self, task: &TaskId, ev: &NewEvent) -> Result<Option<(Wait, bool)>> {
                    let q = |e| Error::Query("cancel wait", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    self.fence(&mut tx, task, Fence::Writer).await?;
                    let state = Self::locked_state(&mut tx, task, "cancel wait").await?;
                    let Some(mut wait) = pending_wait_in(&mut tx, task).await? else {
                        return Ok(None);
                    };
                    let now = now_ms();
                    sqlx::query("UPDATE waits SET satisfied_ms = $1, cancelled_ms = $1 WHERE id = $2")
                        .bind(now)
                        .bind(wait.id.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(q)?;
                    wait.satisfied_ms = Some(now);
                    wait.cancelled_ms = Some(now);
                    let state = state.ok_or_else(|| Error::UnknownTask(task.to_string()))?;
                    let wake = Self::wake_in(&mut tx, task, state).await?;
                    Self::insert_event(&mut tx, ev).await.map_err(q)?;
                    self.commit(tx, [task]).await.map_err(q)?;
                    Ok(Some((wait, wake)))
                }

                async fn pending_wait(&self, task: &TaskId) -> Result<Option<Wait>> {
                    let mut conn = self.pool.acquire().await.map_err(|e| Error::Query("pending wait", e))?;
                    pending_wait_in(&mut conn, task).await
                }

                async fn pending_waits(&self, kind: &str) -> Result<Vec<Wait>> {
                    let rows: Vec<WaitRow> = sqlx::query_as("SELECT * FROM waits WHERE kind = $1 AND satisfied_ms IS NULL ORDER BY created_ms, id")
                        .bind(kind)
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("pending waits", e))?;
                    rows.into_iter().map(WaitRow::parse).collect()
                }

                async fn find_wait(&self, id: &str) -> Result<Wait> {
                    let row: Option<WaitRow> = sqlx::query_as("SELECT * FROM waits WHERE id = $1")
                        .bind(id)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(|e| Error::Query("find wait", e))?;
                    row.map(WaitRow::parse).transpose()?.ok_or_else(|| Error::UnknownWait(id.to_owned()))
                }

                async fn due_timers(&self, now_ms: i64) -> Result<Vec<Wait>> {
                    let rows: Vec<WaitRow> =
                        sqlx::query_as("SELECT * FROM waits WHERE kind = 'timer' AND satisfied_ms IS NULL AND fire_at_ms <= $1 ORDER BY fire_at_ms")
                            .bind(now_ms)
                            .fetch_all(&self.pool)
                            .await
                            .map_err(|e| Error::Query("due timers", e))?;
                    rows.into_iter().map(WaitRow::parse).collect()
                }

                async fn next_timer_ms(&self) -> Result<Option<i64>> {
                    sqlx::query_scalar("SELECT MIN(fire_at_ms) FROM waits WHERE kind = 'timer' AND satisfied_ms IS NULL")
                        .fetch_one(&self.pool)
                        .await
                        .map_err(|e| Error::Query("next timer", e))
                }

                async fn inbox_event(&self, id: &str) -> Result<InboxEvent> {
                    let row: Option<InboxRow> = sqlx::query_as("SELECT * FROM inbox WHERE id = $1")
                        .bind(id)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(|e| Error::Query("read event", e))?;
                    row.map(InboxRow::parse).transpose()?.ok_or_else(|| Error::Corrupt("inbox event", id.to_owned()))
                }

                async fn inbox(&self, task: &TaskId) -> Result<Vec<InboxEvent>> {
                    let rows: Vec<InboxRow> =
                        sqlx::query_as(Db::INBOX).bind(task.as_str()).fetch_all(&self.pool).await.map_err(|e| Error::Query("read inbox", e))?;
                    rows.into_iter().map(InboxRow::parse).collect()
                }
            }

            async fn satisfy(conn: &mut Conn, wait: &str, event: &mut InboxEvent) -> sqlx::Result<()> {
                let now = now_ms();
                sqlx::query("UPDATE waits SET satisfied_ms = $1, event_id = $2 WHERE id = $3").bind(now).bind(event.id.as_str()).bind(wait).execute(&mut *conn).await?;
                sqlx::query("UPDATE inbox SET wait_id = $1 WHERE id = $2").bind(wait).bind(event.id.as_str()).execute(&mut *conn).await?;
                event.wait = wait.parse().ok();
                Ok(())
            }

            async fn pending_wait_in(conn: &mut Conn, task: &TaskId) -> Result<Option<Wait>> {
                let row: Option<WaitRow> = sqlx::query_as("SELECT * FROM waits WHERE task_id = $1 AND satisfied_ms IS NULL")
                    .bind(task.as_str())
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(|e| Error::Query("pending wait", e))?;
                row.map(WaitRow::parse).transpose()
            }
        }
    };
}
pub(crate) use waits;
