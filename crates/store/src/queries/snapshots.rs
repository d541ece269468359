//! [`SnapshotStore`](crate::SnapshotStore): snapshot rows, rollback notes
//! and each task's baseline manifest.

/// Writes the part for `$store` on `$db` (see [`super::store!`]).
macro_rules! snapshots {
    ($store:ident, $db:ty, $conn:ty) => {
        mod snapshots {
            use async_trait::async_trait;
            use cairn_core::{NewEvent, RollbackNote, Snapshot, SnapshotId, Task, TaskId};

            use super::$store;
            use $crate::lease::Fence;
            use $crate::queries::rows::SnapshotRow;
            use $crate::queries::Dialect;
            use $crate::{now_ms, Error, Result, SnapshotStore};

            type Db = $db;
            type Conn = $conn;

            #[async_trait]
            impl SnapshotStore for $store {
                async fn insert_snapshot(&self, s: &Snapshot, baseline: &str, memory: Option<&str>, ev: &NewEvent) -> Result<()> {
                    let q = |e| Error::Query("insert snapshot", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    Self::lock_tasks(&mut tx, [&s.task, &ev.task]).await.map_err(q)?;
                    self.fence(&mut tx, &s.task, Fence::Owner).await?;
                    insert_snapshot_row(&mut tx, s, baseline, memory).await?;
                    Self::insert_event(&mut tx, ev).await.map_err(q)?;
                    self.commit(tx, [&s.task]).await.map_err(q)
                }

                async fn insert_fork(&self, task: &Task, created: &NewEvent, branch: &Snapshot, snapshotted: &NewEvent) -> Result<()> {
                    let q = |e| Error::Query("insert fork", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    // The new task's row is this transaction's until it
                    // commits: no one else can lock it, write its log or see
                    // it meanwhile.
                    Self::insert_task_row(&mut tx, task).await?;
                    Self::insert_event(&mut tx, created).await.map_err(q)?;
                    insert_snapshot_row(&mut tx, branch, &branch.manifest, None).await?;
                    Self::insert_event(&mut tx, snapshotted).await.map_err(q)?;
                    self.commit(tx, [&task.id]).await.map_err(q)
                }

                async fn snapshots(&self, task: &TaskId) -> Result<Vec<Snapshot>> {
                    let rows: Vec<SnapshotRow> = sqlx::query_as(Db::TASK_SNAPSHOTS)
                        .bind(task.as_str())
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("list snapshots", e))?;
                    rows.into_iter().map(SnapshotRow::parse).collect()
                }

                async fn all_snapshots(&self) -> Result<Vec<Snapshot>> {
                    let rows: Vec<SnapshotRow> =
                        sqlx::query_as(Db::ALL_SNAPSHOTS).fetch_all(&self.pool).await.map_err(|e| Error::Query("list snapshots", e))?;
                    rows.into_iter().map(SnapshotRow::parse).collect()
                }

                async fn find_snapshot(&self, id: &str) -> Result<Snapshot> {
                    let row: Option<SnapshotRow> = sqlx::query_as("SELECT * FROM snapshots WHERE id = $1")
                        .bind(id)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(|e| Error::Query("find snapshot", e))?;
                    row.map(SnapshotRow::parse).transpose()?.ok_or_else(|| Error::UnknownSnapshot(id.to_owned()))
                }

                async fn baselines(&self) -> Result<Vec<String>> {
                    sqlx::query_scalar("SELECT baseline FROM tasks WHERE baseline IS NOT NULL")
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("list baselines", e))
                }

                async fn baseline(&self, task: &TaskId) -> Result<Option<String>> {
                    sqlx::query_scalar("SELECT baseline FROM tasks WHERE id = $1")
                        .bind(task.as_str())
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(|e| Error::Query("read baseline", e))?
                        .ok_or_else(|| Error::UnknownTask(task.to_string()))
                }

                async fn set_baseline(&self, task: &TaskId, baseline: Option<&str>) -> Result<()> {
                    let q = |e| Error::Query("set baseline", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    self.fence(&mut tx, task, Fence::Owner).await?;
                    sqlx::query("UPDATE tasks SET baseline = $1 WHERE id = $2")
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
                    Self::lock_tasks(&mut tx, [task, &ev.task]).await.map_err(q)?;
                    self.fence(&mut tx, task, Fence::Owner).await?;
                    sqlx::query("UPDATE tasks SET step = $1, memory = $2, baseline = $3, rollback_note = $4, last_activity_ms = $5 WHERE id = $6")
                        .bind(to.step as i64)
                        .bind(&to.memory)
                        .bind(baseline)
                        .bind(note)
                        .bind(now_ms())
                        .bind(task.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(q)?;
                    Self::insert_event(&mut tx, ev).await.map_err(q)?;
                    self.commit(tx, [task]).await.map_err(q)
                }

                async fn expire_snapshots(&self, ids: &[SnapshotId], events: &[NewEvent]) -> Result<()> {
                    let q = |e| Error::Query("expire snapshots", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    Self::lock_tasks(&mut tx, events.iter().map(|e| &e.task)).await.map_err(q)?;
                    for id in ids {
                        sqlx::query("DELETE FROM snapshots WHERE id = $1").bind(id.as_str()).execute(&mut *tx).await.map_err(q)?;
                    }
                    for ev in events {
                        self.fence(&mut tx, &ev.task, Fence::Writer).await?;
                        Self::insert_event(&mut tx, ev).await.map_err(q)?;
                    }
                    self.commit(tx, events.iter().map(|e| &e.task)).await.map_err(q)
                }
            }

            /// Inserts a snapshot row and makes `baseline` (and `memory`,
            /// when given) the task's.
            async fn insert_snapshot_row(conn: &mut Conn, s: &Snapshot, baseline: &str, memory: Option<&str>) -> Result<()> {
                let q = |e| Error::Query("insert snapshot", e);
                let config = serde_json::to_string(&s.config).map_err(|e| Error::Corrupt("config", e.to_string()))?;
                sqlx::query(
                    "INSERT INTO snapshots (id, task_id, parent, kind, note, healthy, step, memory, config, manifest,
                                            files, bytes, added_bytes, freeze_ms, duration_ms, created_ms, with_memory)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
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
                let res = sqlx::query("UPDATE tasks SET baseline = $1, memory = COALESCE($2, memory), last_activity_ms = $3 WHERE id = $4")
                    .bind(baseline)
                    .bind(memory)
                    .bind(now_ms())
                    .bind(s.task.as_str())
                    .execute(&mut *conn)
                    .await
                    .map_err(q)?;
                if res.rows_affected() == 0 {
                    return Err(Error::UnknownTask(s.task.to_string()));
                }
                Ok(())
            }
        }
    };
}
pub(crate) use snapshots;
