//! Snapshot rows, rollback notes and the per-task baseline manifest.

use std::str::FromStr;

use cairn_core::{NewEvent, RollbackNote, Snapshot, SnapshotId, SnapshotKind, Task, TaskConfig, TaskId};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use crate::sqlite::{insert_event, insert_task_row};
use crate::{Error, Result, Store};

impl Store {
    /// Records a snapshot whose data is durable, in one transaction with the
    /// task's new baseline, its memory summary (when `memory` is given) and
    /// the snapshot event.
    pub async fn insert_snapshot(&self, s: &Snapshot, baseline: &str, memory: Option<&str>, ev: &NewEvent) -> Result<()> {
        let q = |e| Error::Query("insert snapshot", e);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(q)?;
        insert_snapshot_row(&mut tx, s, baseline, memory).await?;
        insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx).await.map_err(q)
    }

    /// Records a fork in one transaction: the new task, its creation event,
    /// and its branch snapshot (whose data is the source's, durable
    /// already), so that a crash leaves either no fork or a whole one that
    /// recovery restores from its branch.
    pub async fn insert_fork(&self, task: &Task, created: &NewEvent, branch: &Snapshot, snapshotted: &NewEvent) -> Result<()> {
        let q = |e| Error::Query("insert fork", e);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(q)?;
        insert_task_row(&mut tx, task).await?;
        insert_event(&mut tx, created).await.map_err(q)?;
        insert_snapshot_row(&mut tx, branch, &branch.manifest, None).await?;
        insert_event(&mut tx, snapshotted).await.map_err(q)?;
        self.commit(tx).await.map_err(q)
    }

    /// A task's snapshots, oldest first.
    pub async fn snapshots(&self, task: &TaskId) -> Result<Vec<Snapshot>> {
        let rows = sqlx::query("SELECT * FROM snapshots WHERE task_id = ? ORDER BY created_ms, rowid")
            .bind(task.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("list snapshots", e))?;
        rows.iter().map(snapshot_from_row).collect()
    }

    /// Every snapshot of every task (for `check` and `gc`).
    pub async fn all_snapshots(&self) -> Result<Vec<Snapshot>> {
        let rows = sqlx::query("SELECT * FROM snapshots ORDER BY created_ms, rowid")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("list snapshots", e))?;
        rows.iter().map(snapshot_from_row).collect()
    }

    pub async fn find_snapshot(&self, id: &str) -> Result<Snapshot> {
        let row = sqlx::query("SELECT * FROM snapshots WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("find snapshot", e))?;
        row.map(|r| snapshot_from_row(&r)).transpose()?.ok_or_else(|| Error::UnknownSnapshot(id.to_owned()))
    }

    /// Manifest ids that tasks use as baselines (live for `gc`).
    pub async fn baselines(&self) -> Result<Vec<String>> {
        let rows = sqlx::query("SELECT baseline FROM tasks WHERE baseline IS NOT NULL")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("list baselines", e))?;
        Ok(rows.iter().map(|r| r.get::<String, _>(0)).collect())
    }

    pub async fn baseline(&self, task: &TaskId) -> Result<Option<String>> {
        let row = sqlx::query("SELECT baseline FROM tasks WHERE id = ?")
            .bind(task.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("read baseline", e))?
            .ok_or_else(|| Error::UnknownTask(task.to_string()))?;
        Ok(row.get(0))
    }

    pub async fn set_baseline(&self, task: &TaskId, baseline: Option<&str>) -> Result<()> {
        sqlx::query("UPDATE tasks SET baseline = ? WHERE id = ?")
            .bind(baseline)
            .bind(task.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| Error::Query("set baseline", e))?;
        Ok(())
    }

    /// Records a finished rollback in one transaction: the task's step,
    /// memory summary, baseline and rollback note, and the event.
    pub async fn record_rollback(&self, task: &TaskId, to: &Snapshot, note: &RollbackNote, baseline: &str, ev: &NewEvent) -> Result<()> {
        let q = |e| Error::Query("record rollback", e);
        let note = serde_json::to_string(note).map_err(|e| Error::Corrupt("rollback note", e.to_string()))?;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(q)?;
        sqlx::query("UPDATE tasks SET step = ?, memory = ?, baseline = ?, rollback_note = ?, last_activity_ms = ? WHERE id = ?")
            .bind(to.step as i64)
            .bind(&to.memory)
            .bind(baseline)
            .bind(note)
            .bind(crate::now_ms())
            .bind(task.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx).await.map_err(q)
    }

    /// Deletes expired snapshot rows with one event each, in one transaction.
    /// Their data becomes garbage for `gc`.
    pub async fn expire_snapshots(&self, ids: &[SnapshotId], events: &[NewEvent]) -> Result<()> {
        let q = |e| Error::Query("expire snapshots", e);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(q)?;
        for id in ids {
            sqlx::query("DELETE FROM snapshots WHERE id = ?").bind(id.as_str()).execute(&mut *tx).await.map_err(q)?;
        }
        for ev in events {
            insert_event(&mut tx, ev).await.map_err(q)?;
        }
        self.commit(tx).await.map_err(q)
    }
}

fn snapshot_from_row(r: &SqliteRow) -> Result<Snapshot> {
    let id: String = r.get("id");
    let task: String = r.get("task_id");
    let parent: Option<String> = r.get("parent");
    let kind: String = r.get("kind");
    let config: String = r.get("config");
    Ok(Snapshot {
        id: id.parse().map_err(|_| Error::Corrupt("snapshot id", id.clone()))?,
        task: task.parse().map_err(|_| Error::Corrupt("snapshot task id", task.clone()))?,
        parent: parent.map(|p| p.parse().map_err(|_| Error::Corrupt("snapshot parent", p.clone()))).transpose()?,
        kind: SnapshotKind::from_str(&kind).map_err(|e| Error::Corrupt("snapshot kind", e.to_string()))?,
        note: r.get("note"),
        healthy: r.get("healthy"),
        step: r.get::<i64, _>("step") as u64,
        memory: r.get("memory"),
        config: serde_json::from_str::<TaskConfig>(&config).map_err(|e| Error::Corrupt("snapshot config", e.to_string()))?,
        manifest: r.get("manifest"),
        files: r.get::<i64, _>("files") as u64,
        bytes: r.get::<i64, _>("bytes") as u64,
        added_bytes: r.get::<i64, _>("added_bytes") as u64,
        freeze_ms: r.get("freeze_ms"),
        duration_ms: r.get("duration_ms"),
        created_ms: r.get("created_ms"),
    })
}


/// Inserts a snapshot row and makes `baseline` (and `memory`, when given)
/// the task's.
async fn insert_snapshot_row(conn: &mut sqlx::SqliteConnection, s: &Snapshot, baseline: &str, memory: Option<&str>) -> Result<()> {
    let q = |e| Error::Query("insert snapshot", e);
    let config = serde_json::to_string(&s.config).map_err(|e| Error::Corrupt("config", e.to_string()))?;
    sqlx::query(
        "INSERT INTO snapshots (id, task_id, parent, kind, note, healthy, step, memory, config, manifest,
                                files, bytes, added_bytes, freeze_ms, duration_ms, created_ms)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(s.id.as_str())
    .bind(s.task.as_str())
    .bind(s.parent.as_ref().map(|p| p.as_str()))
    .bind(s.kind.as_str())
    .bind(&s.note)
    .bind(s.healthy)
    .bind(s.step as i64)
    .bind(&s.memory)
    .bind(config)
    .bind(&s.manifest)
    .bind(s.files as i64)
    .bind(s.bytes as i64)
    .bind(s.added_bytes as i64)
    .bind(s.freeze_ms)
    .bind(s.duration_ms)
    .bind(s.created_ms)
    .execute(&mut *conn)
    .await
    .map_err(q)?;
    let res = sqlx::query("UPDATE tasks SET baseline = ?, memory = COALESCE(?, memory), last_activity_ms = ? WHERE id = ?")
        .bind(baseline)
        .bind(memory)
        .bind(crate::now_ms())
        .bind(s.task.as_str())
        .execute(&mut *conn)
        .await
        .map_err(q)?;
    if res.rows_affected() == 0 {
        return Err(Error::UnknownTask(s.task.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use cairn_core::{EventKind, Task};

    use super::*;

    fn snap(task: &TaskId, kind: SnapshotKind) -> Snapshot {
        Snapshot {
            id: SnapshotId::random(),
            task: task.clone(),
            parent: None,
            kind,
            note: "n".into(),
            healthy: true,
            step: 3,
            memory: "remember".into(),
            config: TaskConfig::default(),
            manifest: "ab".repeat(32),
            files: 1,
            bytes: 2,
            added_bytes: 3,
            freeze_ms: 1.5,
            duration_ms: 9.0,
            created_ms: crate::now_ms(),
        }
    }

    fn ev(task: &TaskId, kind: EventKind) -> NewEvent {
        NewEvent { task: task.clone(), kind, actor: "test".into(), args: serde_json::json!({}), exit_code: Some(0), duration_ms: None }
    }

    #[tokio::test]
    async fn snapshots_rollback_notes_and_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("cairn.db")).await.unwrap();
        let t = Task::new(TaskId::random(), None, TaskConfig::default(), crate::now_ms());
        store.insert_task(&t).await.unwrap();
        let a = snap(&t.id, SnapshotKind::Milestone);
        let b = Snapshot { parent: Some(a.id.clone()), ..snap(&t.id, SnapshotKind::PreRisk) };
        store.insert_snapshot(&a, "base-a", Some("mem a"), &ev(&t.id, EventKind::Snapshot)).await.unwrap();
        store.insert_snapshot(&b, "base-b", None, &ev(&t.id, EventKind::Snapshot)).await.unwrap();
        assert_eq!(store.snapshots(&t.id).await.unwrap(), [a.clone(), b.clone()]);
        assert_eq!(store.find_snapshot(b.id.as_str()).await.unwrap(), b);
        assert!(matches!(store.find_snapshot("s222222222").await, Err(Error::UnknownSnapshot(_))));
        assert_eq!(store.baseline(&t.id).await.unwrap().as_deref(), Some("base-b"));
        assert_eq!(store.find_task(t.id.as_str()).await.unwrap().memory, "mem a", "memory kept when not given");

        let note = RollbackNote { from: Some(b.id.clone()), to: a.id.clone(), from_step: 7, reason: "tests broke".into(), time_ms: 1 };
        store.record_rollback(&t.id, &a, &note, "base-r", &ev(&t.id, EventKind::Rollback)).await.unwrap();
        let back = store.find_task(t.id.as_str()).await.unwrap();
        assert_eq!((back.step, back.rollback_note), (3, Some(note)));

        store.expire_snapshots(std::slice::from_ref(&a.id), &[ev(&t.id, EventKind::SnapshotExpired)]).await.unwrap();
        assert_eq!(store.snapshots(&t.id).await.unwrap(), [b]);
        let kinds: Vec<EventKind> = store.events(&t.id).await.unwrap().iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventKind::Snapshot, EventKind::Snapshot, EventKind::Rollback, EventKind::SnapshotExpired]);
    }
}
