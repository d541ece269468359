//! Waits, the durable inbox, and the task-state steps of suspend and wake
//! that must happen in the same transaction as them (SQLite).

use std::str::FromStr;

use async_trait::async_trait;
use cairn_core::{EventSource, InboxEvent, NewEvent, SandboxState, TaskId, TaskState, Transition, Wait, WaitFor, WaitId};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use super::{insert_event, task_state_in, transition_in, SqliteStore};
use crate::lease::{drops_lease, Fence};
use crate::{now_ms, Delivered, Error, Result, WaitStore};

#[async_trait]
impl WaitStore for SqliteStore {
    async fn insert_wait(&self, w: &Wait, ev: &NewEvent) -> Result<Option<InboxEvent>> {
        let q = |e| Error::Query("insert wait", e);
        let what = serde_json::to_string(&w.what).map_err(|e| Error::Corrupt("wait", e.to_string()))?;
        let fire_at = match w.what {
            WaitFor::Timer { fire_at_ms } => Some(fire_at_ms),
            _ => None,
        };
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, &w.task, Fence::Writer).await?;
        let res = sqlx::query("INSERT INTO waits (id, task_id, what, kind, fire_at_ms, created_ms) VALUES (?, ?, ?, ?, ?, ?)")
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
        let rows = sqlx::query("SELECT * FROM inbox WHERE task_id = ? AND wait_id IS NULL ORDER BY received_ms, rowid")
            .bind(w.task.as_str())
            .fetch_all(&mut *tx)
            .await
            .map_err(q)?;
        let mut found = None;
        for r in &rows {
            let e = inbox_from_row(r)?;
            if e.matches(w) {
                found = Some(e);
                break;
            }
        }
        if let Some(e) = &mut found {
            satisfy(&mut tx, w.id.as_str(), e).await.map_err(q)?;
        }
        insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx, [&w.task]).await.map_err(q)?;
        Ok(found)
    }

    async fn deliver(&self, ev: &InboxEvent) -> Result<Delivered> {
        let q = |e| Error::Query("deliver event", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, &ev.task, Fence::Writer).await?;
        if let Some(d) = &ev.delivery {
            let seen = sqlx::query("SELECT * FROM inbox WHERE task_id = ? AND source = ? AND delivery = ?")
                .bind(ev.task.as_str())
                .bind(ev.source.as_str())
                .bind(d)
                .fetch_optional(&mut *tx)
                .await
                .map_err(q)?;
            if let Some(r) = seen {
                let first = inbox_from_row(&r)?;
                return Ok(Delivered { satisfied: first.wait.clone(), event: first, duplicate: true, wake: false });
            }
        }
        let state = task_state_in(&mut tx, &ev.task, "deliver event").await?.ok_or_else(|| Error::UnknownTask(ev.task.to_string()))?;
        sqlx::query("INSERT INTO inbox (id, task_id, source, name, delivery, data, received_ms) VALUES (?, ?, ?, ?, ?, ?, ?)")
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
            if state == TaskState::Suspended {
                transition_in(&mut tx, &ev.task, TaskState::Suspended, Transition::Wake).await?;
                wake = true;
            }
        }
        let log = NewEvent {
            task: ev.task.clone(),
            kind: cairn_core::EventKind::EventReceived,
            actor: ev.source.as_str().to_owned(),
            args: serde_json::json!({ "event": ev.id, "source": ev.source, "name": ev.name, "delivery": ev.delivery, "satisfied": satisfied }),
            exit_code: None,
            duration_ms: None,
        };
        insert_event(&mut tx, &log).await.map_err(q)?;
        self.commit(tx, [&ev.task]).await.map_err(q)?;
        Ok(Delivered { event, duplicate: false, satisfied, wake })
    }

    async fn finish_suspend(&self, task: &TaskId, waiting_for: Option<&WaitId>, ev: &NewEvent) -> Result<TaskState> {
        let q = |e| Error::Query("finish suspend", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, task, Fence::Owner).await?;
        let satisfied = match waiting_for {
            Some(w) => sqlx::query("SELECT satisfied_ms IS NOT NULL FROM waits WHERE id = ?")
                .bind(w.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(q)?
                .map(|r| r.get::<bool, _>(0))
                .unwrap_or(false),
            None => false,
        };
        let done = if satisfied { Transition::SuspendedIntoWake } else { Transition::Suspended };
        let state = transition_in(&mut tx, task, TaskState::Suspending, done).await?;
        sqlx::query("UPDATE tasks SET sandbox_state = ?, sandbox_note = NULL, node = NULL WHERE id = ?")
            .bind(SandboxState::None.as_str())
            .bind(task.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        insert_event(&mut tx, ev).await.map_err(q)?;
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
        transition_in(&mut tx, task, TaskState::Waking, Transition::Woke).await?;
        insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx, [task]).await.map_err(q)
    }

    async fn cancel_wait(&self, task: &TaskId, ev: &NewEvent) -> Result<Option<(Wait, bool)>> {
        let q = |e| Error::Query("cancel wait", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, task, Fence::Writer).await?;
        let Some(mut wait) = pending_wait_in(&mut tx, task).await? else {
            return Ok(None);
        };
        let now = now_ms();
        sqlx::query("UPDATE waits SET satisfied_ms = ?, cancelled_ms = ? WHERE id = ?")
            .bind(now)
            .bind(now)
            .bind(wait.id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        wait.satisfied_ms = Some(now);
        wait.cancelled_ms = Some(now);
        let state = task_state_in(&mut tx, task, "cancel wait").await?.ok_or_else(|| Error::UnknownTask(task.to_string()))?;
        let mut wake = false;
        if state == TaskState::Suspended {
            transition_in(&mut tx, task, TaskState::Suspended, Transition::Wake).await?;
            wake = true;
        }
        insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx, [task]).await.map_err(q)?;
        Ok(Some((wait, wake)))
    }

    async fn pending_wait(&self, task: &TaskId) -> Result<Option<Wait>> {
        let mut conn = self.pool.acquire().await.map_err(|e| Error::Query("pending wait", e))?;
        pending_wait_in(&mut conn, task).await
    }

    async fn find_wait(&self, id: &str) -> Result<Wait> {
        let row = sqlx::query("SELECT * FROM waits WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("find wait", e))?;
        row.map(|r| wait_from_row(&r)).transpose()?.ok_or_else(|| Error::UnknownWait(id.to_owned()))
    }

    async fn due_timers(&self, now_ms: i64) -> Result<Vec<Wait>> {
        let rows = sqlx::query("SELECT * FROM waits WHERE kind = 'timer' AND satisfied_ms IS NULL AND fire_at_ms <= ? ORDER BY fire_at_ms")
            .bind(now_ms)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("due timers", e))?;
        rows.iter().map(wait_from_row).collect()
    }

    async fn next_timer_ms(&self) -> Result<Option<i64>> {
        let row = sqlx::query("SELECT MIN(fire_at_ms) FROM waits WHERE kind = 'timer' AND satisfied_ms IS NULL")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| Error::Query("next timer", e))?;
        Ok(row.get(0))
    }

    async fn inbox_event(&self, id: &str) -> Result<InboxEvent> {
        let row = sqlx::query("SELECT * FROM inbox WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("read event", e))?;
        row.map(|r| inbox_from_row(&r)).transpose()?.ok_or_else(|| Error::Corrupt("inbox event", id.to_owned()))
    }

    async fn inbox(&self, task: &TaskId) -> Result<Vec<InboxEvent>> {
        let rows = sqlx::query("SELECT * FROM inbox WHERE task_id = ? ORDER BY received_ms, rowid")
            .bind(task.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("read inbox", e))?;
        rows.iter().map(inbox_from_row).collect()
    }
}

async fn satisfy(conn: &mut sqlx::SqliteConnection, wait: &str, event: &mut InboxEvent) -> sqlx::Result<()> {
    let now = now_ms();
    sqlx::query("UPDATE waits SET satisfied_ms = ?, event_id = ? WHERE id = ?").bind(now).bind(event.id.as_str()).bind(wait).execute(&mut *conn).await?;
    sqlx::query("UPDATE inbox SET wait_id = ? WHERE id = ?").bind(wait).bind(event.id.as_str()).execute(&mut *conn).await?;
    event.wait = wait.parse().ok();
    Ok(())
}

async fn pending_wait_in(conn: &mut sqlx::SqliteConnection, task: &TaskId) -> Result<Option<Wait>> {
    let row = sqlx::query("SELECT * FROM waits WHERE task_id = ? AND satisfied_ms IS NULL")
        .bind(task.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| Error::Query("pending wait", e))?;
    row.map(|r| wait_from_row(&r)).transpose()
}

fn wait_from_row(r: &SqliteRow) -> Result<Wait> {
    let id: String = r.get("id");
    let task: String = r.get("task_id");
    let what: String = r.get("what");
    let event: Option<String> = r.get("event_id");
    Ok(Wait {
        id: id.parse().map_err(|_| Error::Corrupt("wait id", id.clone()))?,
        task: task.parse().map_err(|_| Error::Corrupt("wait task id", task.clone()))?,
        what: serde_json::from_str(&what).map_err(|e| Error::Corrupt("wait", e.to_string()))?,
        created_ms: r.get("created_ms"),
        satisfied_ms: r.get("satisfied_ms"),
        event: event.map(|e| e.parse().map_err(|_| Error::Corrupt("wait event id", e.clone()))).transpose()?,
        cancelled_ms: r.get("cancelled_ms"),
    })
}

fn inbox_from_row(r: &SqliteRow) -> Result<InboxEvent> {
    let id: String = r.get("id");
    let task: String = r.get("task_id");
    let source: String = r.get("source");
    let data: String = r.get("data");
    let wait: Option<String> = r.get("wait_id");
    Ok(InboxEvent {
        id: id.parse().map_err(|_| Error::Corrupt("event id", id.clone()))?,
        task: task.parse().map_err(|_| Error::Corrupt("event task id", task.clone()))?,
        source: EventSource::from_str(&source).map_err(|e| Error::Corrupt("event source", e))?,
        name: r.get("name"),
        delivery: r.get("delivery"),
        data: serde_json::from_str(&data).map_err(|e| Error::Corrupt("event data", e.to_string()))?,
        received_ms: r.get("received_ms"),
        wait: wait.map(|w| w.parse().map_err(|_| Error::Corrupt("event wait id", w.clone()))).transpose()?,
    })
}
