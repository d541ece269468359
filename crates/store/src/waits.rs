//! Waits, the durable inbox, and the task-state steps of suspend and wake
//! that must happen in the same transaction as them.

use std::str::FromStr;

use cairn_core::{EventSource, InboxEvent, NewEvent, TaskId, TaskState, Transition, Wait, WaitFor, WaitId};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use crate::sqlite::{insert_event, transition_in};
use crate::{now_ms, Error, Result, Store};

/// What delivering an event did.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivered {
    /// The stored event (for a repeated delivery: the first one).
    pub event: InboxEvent,
    /// The same delivery id was seen before: nothing changed.
    pub duplicate: bool,
    /// The wait it satisfied, if any.
    pub satisfied: Option<WaitId>,
    /// The task was suspended and is now `waking`: the caller wakes it.
    pub wake: bool,
}

impl Store {
    /// Registers a wait. If the inbox already holds a matching event, the
    /// wait is satisfied at once by the oldest one, which is returned. A
    /// task has at most one pending wait.
    pub async fn insert_wait(&self, w: &Wait, ev: &NewEvent) -> Result<Option<InboxEvent>> {
        let q = |e| Error::Query("insert wait", e);
        let what = serde_json::to_string(&w.what).map_err(|e| Error::Corrupt("wait", e.to_string()))?;
        let fire_at = match w.what {
            WaitFor::Timer { fire_at_ms } => Some(fire_at_ms),
            _ => None,
        };
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(q)?;
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
        self.commit(tx).await.map_err(q)?;
        Ok(found)
    }

    /// Writes an event to the task's inbox and satisfies its pending wait
    /// when it matches, all in one transaction: once this returns, the event
    /// is durable and has taken effect exactly once. A delivery id seen
    /// before makes it a no-op.
    pub async fn deliver(&self, ev: &InboxEvent) -> Result<Delivered> {
        let q = |e| Error::Query("deliver event", e);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(q)?;
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
        let state: Option<String> = sqlx::query("SELECT state FROM tasks WHERE id = ?")
            .bind(ev.task.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(q)?
            .map(|r| r.get(0));
        let state = state.ok_or_else(|| Error::UnknownTask(ev.task.to_string()))?;
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
            if state == TaskState::Suspended.as_str() {
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
        self.commit(tx).await.map_err(q)?;
        Ok(Delivered { event, duplicate: false, satisfied, wake })
    }

    /// Ends a suspend: `suspended`, or straight to `waking` when the wait
    /// it suspended for was satisfied meanwhile (an event that came in while
    /// the snapshot was being stored). Returns the state written.
    pub async fn finish_suspend(&self, task: &TaskId, waiting_for: Option<&WaitId>, ev: &NewEvent) -> Result<TaskState> {
        let q = |e| Error::Query("finish suspend", e);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(q)?;
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
        sqlx::query("UPDATE tasks SET sandbox_state = 'none', sandbox_note = NULL WHERE id = ?")
            .bind(task.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx).await.map_err(q)?;
        Ok(state)
    }

    /// Moves a suspended task to `waking` (resume, exec, cp). False when it
    /// was not suspended.
    pub async fn begin_wake(&self, task: &TaskId) -> Result<bool> {
        match self.transition(task, TaskState::Suspended, Transition::Wake).await {
            Ok(_) => Ok(true),
            Err(Error::StateChanged { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub async fn pending_wait(&self, task: &TaskId) -> Result<Option<Wait>> {
        let mut conn = self.pool.acquire().await.map_err(|e| Error::Query("pending wait", e))?;
        pending_wait_in(&mut conn, task).await
    }

    pub async fn find_wait(&self, id: &str) -> Result<Wait> {
        let row = sqlx::query("SELECT * FROM waits WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("find wait", e))?;
        row.map(|r| wait_from_row(&r)).transpose()?.ok_or_else(|| Error::UnknownWait(id.to_owned()))
    }

    /// Pending timers due at `now_ms`.
    pub async fn due_timers(&self, now_ms: i64) -> Result<Vec<Wait>> {
        let rows = sqlx::query("SELECT * FROM waits WHERE kind = 'timer' AND satisfied_ms IS NULL AND fire_at_ms <= ? ORDER BY fire_at_ms")
            .bind(now_ms)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("due timers", e))?;
        rows.iter().map(wait_from_row).collect()
    }

    /// The earliest pending timer, for the timer loop to sleep until.
    pub async fn next_timer_ms(&self) -> Result<Option<i64>> {
        let row = sqlx::query("SELECT MIN(fire_at_ms) FROM waits WHERE kind = 'timer' AND satisfied_ms IS NULL")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| Error::Query("next timer", e))?;
        Ok(row.get(0))
    }

    pub async fn inbox_event(&self, id: &str) -> Result<InboxEvent> {
        let row = sqlx::query("SELECT * FROM inbox WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("read event", e))?;
        row.map(|r| inbox_from_row(&r)).transpose()?.ok_or_else(|| Error::Corrupt("inbox event", id.to_owned()))
    }

    pub async fn inbox(&self, task: &TaskId) -> Result<Vec<InboxEvent>> {
        let rows = sqlx::query("SELECT * FROM inbox WHERE task_id = ? ORDER BY received_ms, rowid")
            .bind(task.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("read inbox", e))?;
        rows.iter().map(inbox_from_row).collect()
    }

    /// Takes exactly uid slot `slot` for a new sandbox of `task`; false
    /// when another sandbox holds it.
    pub async fn try_claim_sandbox_slot(&self, task: &TaskId, slot: u32) -> Result<bool> {
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

    pub async fn set_last_uid_slot(&self, task: &TaskId, slot: Option<u32>) -> Result<()> {
        sqlx::query("UPDATE tasks SET last_uid_slot = ? WHERE id = ?")
            .bind(slot.map(i64::from))
            .bind(task.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| Error::Query("set last uid slot", e))?;
        Ok(())
    }

    pub async fn last_uid_slot(&self, task: &TaskId) -> Result<Option<u32>> {
        let row = sqlx::query("SELECT last_uid_slot FROM tasks WHERE id = ?")
            .bind(task.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("read last uid slot", e))?;
        Ok(row.and_then(|r| r.get::<Option<i64>, _>(0)).map(|s| s as u32))
    }

    /// Marks a recovered task running again with its recovery note, in one
    /// transaction with the `recovered` event.
    pub async fn record_recovery(&self, task: &TaskId, from: TaskState, step: u64, memory: &str, note: &str, ev: &NewEvent) -> Result<()> {
        let q = |e| Error::Query("record recovery", e);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(q)?;
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
        self.commit(tx).await.map_err(q)
    }

    /// Marks a waking task running, in one transaction with its `wake`
    /// event: a crash leaves both or neither.
    pub async fn finish_wake(&self, task: &TaskId, ev: &NewEvent) -> Result<()> {
        let q = |e| Error::Query("finish wake", e);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(q)?;
        transition_in(&mut tx, task, TaskState::Waking, Transition::Woke).await?;
        insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx).await.map_err(q)
    }

    /// Marks activity (the end of a long command counts as activity).
    pub async fn touch(&self, task: &TaskId) -> Result<()> {
        sqlx::query("UPDATE tasks SET last_activity_ms = ? WHERE id = ?")
            .bind(now_ms())
            .bind(task.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| Error::Query("touch task", e))?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use cairn_core::{EventKind, InboxId, Task, TaskConfig};

    use super::*;

    fn log(task: &TaskId) -> NewEvent {
        NewEvent { task: task.clone(), kind: EventKind::Wait, actor: "test".into(), args: serde_json::json!({}), exit_code: None, duration_ms: None }
    }

    fn event(task: &TaskId, source: EventSource, name: &str, delivery: Option<&str>) -> InboxEvent {
        InboxEvent {
            id: InboxId::random(),
            task: task.clone(),
            source,
            name: name.into(),
            delivery: delivery.map(str::to_owned),
            data: serde_json::json!({"n": 1}),
            received_ms: now_ms(),
            wait: None,
        }
    }

    async fn store_with_task() -> (tempfile::TempDir, Store, TaskId) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("cairn.db")).await.unwrap();
        let t = Task::new(TaskId::random(), None, TaskConfig::default(), now_ms());
        store.insert_task(&t).await.unwrap();
        store.transition(&t.id, TaskState::Created, Transition::Start).await.unwrap();
        (dir, store, t.id)
    }

    fn wait(task: &TaskId, what: WaitFor) -> Wait {
        Wait { id: WaitId::random(), task: task.clone(), what, created_ms: now_ms(), satisfied_ms: None, event: None }
    }

    #[tokio::test]
    async fn an_event_satisfies_the_pending_wait_once_and_wakes_a_suspended_task() {
        let (_d, store, t) = store_with_task().await;
        let w = wait(&t, WaitFor::Webhook { name: "build".into() });
        assert_eq!(store.insert_wait(&w, &log(&t)).await.unwrap(), None);
        let second = wait(&t, WaitFor::Timer { fire_at_ms: 1 });
        assert!(matches!(store.insert_wait(&second, &log(&t)).await, Err(Error::WaitPending(_))), "one pending wait per task");
        store.transition(&t, TaskState::Running, Transition::Suspend).await.unwrap();
        store.transition(&t, TaskState::Suspending, Transition::Suspended).await.unwrap();

        let other = store.deliver(&event(&t, EventSource::Webhook, "lint", Some("d0"))).await.unwrap();
        assert_eq!((other.satisfied, other.wake), (None, false), "another name waits in the inbox");
        let first = store.deliver(&event(&t, EventSource::Webhook, "build", Some("d1"))).await.unwrap();
        assert_eq!((first.satisfied.as_ref(), first.wake, first.duplicate), (Some(&w.id), true, false));
        assert_eq!(store.find_task(t.as_str()).await.unwrap().state, TaskState::Waking);
        let retry = store.deliver(&event(&t, EventSource::Webhook, "build", Some("d1"))).await.unwrap();
        assert!(retry.duplicate && !retry.wake);
        assert_eq!(retry.event.id, first.event.id, "a retry answers with the first delivery");
        assert_eq!(store.inbox(&t).await.unwrap().len(), 2);
        let back = store.find_wait(w.id.as_str()).await.unwrap();
        assert_eq!(back.event.as_ref(), Some(&first.event.id));
        assert!(store.pending_wait(&t).await.unwrap().is_none());
        let unknown = event(&TaskId::random(), EventSource::Operator, "x", None);
        assert!(matches!(store.deliver(&unknown).await, Err(Error::UnknownTask(_))));
    }

    #[tokio::test]
    async fn an_event_before_its_wait_satisfies_the_next_matching_wait() {
        let (_d, store, t) = store_with_task().await;
        store.deliver(&event(&t, EventSource::Operator, "deploy", None)).await.unwrap();
        let approval = wait(&t, WaitFor::Approval { prompt: "ok?".into() });
        assert_eq!(store.insert_wait(&approval, &log(&t)).await.unwrap(), None, "a deploy event does not approve");
        let a = store.deliver(&event(&t, EventSource::Approval, "approval", None)).await.unwrap();
        assert_eq!((a.satisfied.as_ref(), a.wake), (Some(&approval.id), false), "a running task is not woken");
        let hook = wait(&t, WaitFor::Webhook { name: "deploy".into() });
        let got = store.insert_wait(&hook, &log(&t)).await.unwrap().expect("satisfied by the early event");
        assert_eq!(got.name, "deploy");
        assert!(store.pending_wait(&t).await.unwrap().is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_deliveries_wait_their_turn() {
        let (_d, store, t) = store_with_task().await;
        let mut all = Vec::new();
        for i in 0..48 {
            let (store, t) = (store.clone(), t.clone());
            all.push(tokio::spawn(async move { store.deliver(&event(&t, EventSource::Webhook, "x", Some(&format!("d{i}")))).await }));
        }
        for h in all {
            h.await.unwrap().expect("no delivery is refused for a busy database");
        }
        assert_eq!(store.inbox(&t).await.unwrap().len(), 48);
    }

    #[tokio::test]
    async fn timers_and_finishing_a_suspend() {
        let (_d, store, t) = store_with_task().await;
        let w = wait(&t, WaitFor::Timer { fire_at_ms: 1000 });
        store.insert_wait(&w, &log(&t)).await.unwrap();
        assert_eq!(store.next_timer_ms().await.unwrap(), Some(1000));
        assert!(store.due_timers(999).await.unwrap().is_empty());
        assert_eq!(store.due_timers(1000).await.unwrap()[0].id, w.id);
        store.transition(&t, TaskState::Running, Transition::Suspend).await.unwrap();
        // The timer fires while the task is still suspending.
        let fired = store.deliver(&event(&t, EventSource::Timer, w.id.as_str(), None)).await.unwrap();
        assert_eq!((fired.satisfied.as_ref(), fired.wake), (Some(&w.id), false));
        let end = NewEvent { args: serde_json::json!({"phase": "end"}), kind: EventKind::Suspend, ..log(&t) };
        assert_eq!(store.finish_suspend(&t, Some(&w.id), &end).await.unwrap(), TaskState::Waking, "satisfied meanwhile: wake at once");
        store.transition(&t, TaskState::Waking, Transition::Woke).await.unwrap();
        store.transition(&t, TaskState::Running, Transition::Suspend).await.unwrap();
        assert_eq!(store.finish_suspend(&t, None, &end).await.unwrap(), TaskState::Suspended, "a plain suspend stays suspended");
        assert!(store.begin_wake(&t).await.unwrap());
        assert!(!store.begin_wake(&t).await.unwrap(), "only a suspended task begins waking");
    }
}
