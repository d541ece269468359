//! [`SandboxStore`](crate::SandboxStore): live sandboxes and the uid slots
//! they hold.

/// Writes the part for `$store` on `$db` (see [`super::store!`]).
macro_rules! sandboxes {
    ($store:ident, $db:ty, $conn:ty) => {
        mod sandboxes {
            use async_trait::async_trait;
            use cairn_core::{NewEvent, SandboxState, TaskId, TaskState, Transition};

            use super::$store;
            use $crate::lease::Fence;
            use $crate::queries::rows::SandboxDbRow;
            use $crate::queries::Dialect;
            use $crate::{now_ms, Error, Result, SandboxRow, SandboxStore};

            type Db = $db;
            type Conn = $conn;

            /// Inserts a sandbox for `id` on the lowest free uid slot `>= min`
            /// and returns the slot.
            async fn claim_slot(conn: &mut Conn, id: &TaskId, min: u32) -> sqlx::Result<u32> {
                let slot: i64 = sqlx::query_scalar(
                    "INSERT INTO sandboxes (task_id, uid_slot, started_ms)
                     VALUES ($1, (SELECT MIN(s.slot) FROM
                                  (SELECT CAST($2 AS BIGINT) AS slot UNION SELECT uid_slot + 1 FROM sandboxes WHERE uid_slot >= $2) s
                                  WHERE s.slot NOT IN (SELECT uid_slot FROM sandboxes)), $3)
                     RETURNING uid_slot",
                )
                .bind(id.as_str())
                .bind(i64::from(min))
                .bind(now_ms())
                .fetch_one(&mut *conn)
                .await?;
                Ok(slot as u32)
            }

            #[async_trait]
            impl SandboxStore for $store {
                async fn claim_sandbox_slot_from(&self, id: &TaskId, min: u32) -> Result<u32> {
                    let q = |e| Error::Query("claim sandbox slot", e);
                    match Db::LOCK_SLOTS {
                        // Two claims would both pick the same lowest free slot
                        // and one would fail on the unique slot: the table
                        // lock makes them take turns.
                        Some(lock) => {
                            let mut tx = self.begin().await.map_err(q)?;
                            sqlx::query(lock).execute(&mut *tx).await.map_err(q)?;
                            let slot = claim_slot(&mut tx, id, min).await.map_err(q)?;
                            tx.commit().await.map_err(q)?;
                            Ok(slot)
                        }
                        // One statement, so two concurrent starts never share a slot.
                        None => claim_slot(&mut *self.pool.acquire().await.map_err(q)?, id, min).await.map_err(q),
                    }
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
                    let state = Self::locked_state(&mut tx, id, "record sandbox start").await?;
                    sqlx::query("UPDATE sandboxes SET init_pid = $1, init_start_time = $2 WHERE task_id = $3")
                        .bind(pid)
                        .bind(start_time as i64)
                        .bind(id.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(q)?;
                    if state == Some(TaskState::Created) {
                        Self::transition_in(&mut tx, id, TaskState::Created, Transition::Start).await?;
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
                    let seq = Self::insert_event(&mut tx, ev).await.map_err(q)?;
                    self.commit(tx, [id]).await.map_err(q)?;
                    Ok(seq)
                }

                async fn sandbox(&self, id: &TaskId) -> Result<Option<SandboxRow>> {
                    let row: Option<SandboxDbRow> = sqlx::query_as("SELECT * FROM sandboxes WHERE task_id = $1")
                        .bind(id.as_str())
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(|e| Error::Query("read sandbox", e))?;
                    row.map(SandboxDbRow::parse).transpose()
                }

                async fn sandboxes(&self) -> Result<Vec<SandboxRow>> {
                    let rows: Vec<SandboxDbRow> = sqlx::query_as("SELECT * FROM sandboxes ORDER BY uid_slot")
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("list sandboxes", e))?;
                    rows.into_iter().map(SandboxDbRow::parse).collect()
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
                    let slot: Option<Option<i64>> = sqlx::query_scalar("SELECT last_uid_slot FROM tasks WHERE id = $1")
                        .bind(task.as_str())
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(|e| Error::Query("read last uid slot", e))?;
                    Ok(slot.flatten().map(|s| s as u32))
                }
            }
        }
    };
}
pub(crate) use sandboxes;
