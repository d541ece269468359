//! Snapshot rows, rollback notes and the per-task baseline manifest (SQLite).

use std::str::FromStr;

use async_trait::async_trait;
use cairn_core::{NewEvent, RollbackNote, Snapshot, SnapshotId, SnapshotKind, Task, TaskConfig, TaskId};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use super::{insert_event, insert_task_row, SqliteStore};
use crate::lease::Fence;
use crate::{Error, Result, SnapshotStore};

#[async_trait]
impl SnapshotStore for SqliteStore {
    async fn insert_snapshot(&self, s: &Snapshot, baseline: &str, memory: Option<&str>, ev: &NewEvent) -> Result<()> {
        let q = |e| Error::Query("insert snapshot", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, &s.task, Fence::Owner).await?;
        insert_snapshot_row(&mut tx, s, baseline, memory).await?;
        insert_event(&mut tx, ev).await.map_err(q)?;
        self.commit(tx, [&s.task]).await.map_err(q)
    }

    async fn insert_fork(&self, task: &Task, created: &NewEvent, branch: &Snapshot, snapshotted: &NewEvent) -> Result<()> {
        let q = |e| Error::Query("insert fork", e);
        let mut tx = self.begin().await.map_err(q)?;
        insert_task_row(&mut tx, task).await?;
        insert_event(&mut tx, created).await.map_err(q)?;
        insert_snapshot_row(&mut tx, branch, &branch.manifest, None).await?;
        insert_event(&mut tx, snapshotted).await.map_err(q)?;
        self.commit(tx, [&task.id]).await.map_err(q)
    }

    async fn snapshots(&self, task: &TaskId) -> Result<Vec<Snapshot>> {
        let rows = sqlx::query("SELECT * FROM snapshots WHERE task_id = ? ORDER BY created_ms, rowid")
            .bind(task.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("list snapshots", e))?;
        rows.iter().map(snapshot_from_row).collect()
    }

    async fn all_snapshots(&self) -> Result<Vec<Snapshot>> {
        let rows = sqlx::query("SELECT * FROM snapshots ORDER BY created_ms, rowid")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("list snapshots", e))?;
        rows.iter().map(snapshot_from_row).collect()
    }

    async fn find_snapshot(&self, id: &str) -> Result<Snapshot> {
        let row = sqlx::query("SELECT * FROM snapshots WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("find snapshot", e))?;
        row.map(|r| snapshot_from_row(&r)).transpose()?.ok_or_else(|| Error::UnknownSnapshot(id.to_owned()))
    }

    async fn baselines(&self) -> Result<Vec<String>> {
        let rows = sqlx::query("SELECT baseline FROM tasks WHERE baseline IS NOT NULL")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("list baselines", e))?;
        Ok(rows.iter().map(|r| r.get::<String, _>(0)).collect())
    }

    async fn baseline(&self, task: &TaskId) -> Result<Option<String>> {
        let row = sqlx::query("SELECT baseline FROM tasks WHERE id = ?")
            .bind(task.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("read baseline", e))?
            .ok_or_else(|| Error::UnknownTask(task.to_string()))?;
        Ok(row.get(0))
    }

    async fn set_baseline(&self, task: &TaskId, baseline: Option<&str>) -> Result<()> {
        let q = |e| Error::Query("set baseline", e);
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, task, Fence::Owner).await?;
        sqlx::query("UPDATE tasks SET baseline = ? WHERE id = ?")
            .bind(baseline)
            .bind(task.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q)?;
        tx.commit().await.map_err(q)
    }

    async fn record_rollback(&self, task: &TaskId, to: &Snapshot, note: &RollbackNote, baseline: &str, ev: &NewEvent) -> Result<()> {
        let q = |e| Error::Query("record rollback", e);
        let note = serde_json::to_string(note).map_err(|e| Error::Corrupt("rollback note", e.to_string()))?;
        let mut tx = self.begin().await.map_err(q)?;
        self.fence(&mut tx, task, Fence::Owner).await?;
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
        self.commit(tx, [task]).await.map_err(q)
    }

    async fn expire_snapshots(&self, ids: &[SnapshotId], events: &[NewEvent]) -> Result<()> {
        let q = |e| Error::Query("expire snapshots", e);
        let mut tx = self.begin().await.map_err(q)?;
        for id in ids {
            sqlx::query("DELETE FROM snapshots WHERE id = ?").bind(id.as_str()).execute(&mut *tx).await.map_err(q)?;
        }
        for ev in events {
            self.fence(&mut tx, &ev.task, Fence::Writer).await?;
            insert_event(&mut tx, ev).await.map_err(q)?;
        }
        self.commit(tx, events.iter().map(|e| &e.task)).await.map_err(q)
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
        with_memory: r.get("with_memory"),
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
                                files, bytes, added_bytes, freeze_ms, duration_ms, created_ms, with_memory)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
    .bind(s.with_memory)
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
