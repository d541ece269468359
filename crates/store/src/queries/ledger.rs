//! [`CheckpointStore`](crate::CheckpointStore): the store's side of the
//! ledger, signed checkpoints of a task's chain head.

/// Writes the part for `$store` on `$db` (see [`super::store!`]).
macro_rules! ledger {
    ($store:ident, $db:ty, $conn:ty) => {
        mod ledger {
            use async_trait::async_trait;
            use cairn_core::TaskId;
            use cairn_ledger::SignedCheckpoint;

            use super::$store;
            use $crate::queries::rows::CheckpointRow;
            use $crate::{CheckpointStore, Error, Result};

            #[async_trait]
            impl CheckpointStore for $store {
                async fn insert_checkpoint(&self, c: &SignedCheckpoint, actor: &str) -> Result<()> {
                    let q = |e| Error::Query("insert checkpoint", e);
                    let envelope = serde_json::to_string(&c.envelope).map_err(|e| Error::Corrupt("checkpoint envelope", e.to_string()))?;
                    let cp = &c.checkpoint;
                    let mut tx = self.begin().await.map_err(q)?;
                    // With the task's row locked, a task's checkpoints are
                    // numbered in the order they commit: the newest is the
                    // one with the highest id, as with SQLite's single writer.
                    Self::lock_task(&mut tx, &cp.task).await.map_err(q)?;
                    sqlx::query("INSERT INTO checkpoints (task_id, seq, head, time_ms, key_id, actor, envelope) VALUES ($1, $2, $3, $4, $5, $6, $7)")
                        .bind(&cp.task)
                        .bind(cp.seq as i64)
                        .bind(&cp.head)
                        .bind(cp.time_ms)
                        .bind(&cp.key_id)
                        .bind(actor)
                        .bind(envelope)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| match e {
                            sqlx::Error::Database(d) if d.is_foreign_key_violation() => Error::UnknownTask(cp.task.clone()),
                            e => q(e),
                        })?;
                    tx.commit().await.map_err(q)
                }

                async fn checkpoints(&self, task: &TaskId) -> Result<Vec<SignedCheckpoint>> {
                    let rows: Vec<CheckpointRow> = sqlx::query_as("SELECT * FROM checkpoints WHERE task_id = $1 ORDER BY id")
                        .bind(task.as_str())
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("read checkpoints", e))?;
                    rows.into_iter().map(CheckpointRow::parse).collect()
                }

                async fn latest_checkpoint(&self, task: &TaskId) -> Result<Option<SignedCheckpoint>> {
                    let row: Option<CheckpointRow> = sqlx::query_as("SELECT * FROM checkpoints WHERE task_id = $1 ORDER BY id DESC LIMIT 1")
                        .bind(task.as_str())
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(|e| Error::Query("read checkpoints", e))?;
                    row.map(CheckpointRow::parse).transpose()
                }
            }
        }
    };
}
pub(crate) use ledger;
