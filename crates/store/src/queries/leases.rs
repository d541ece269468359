//! [`LeaseStore`](crate::LeaseStore): task leases, holds on the blob store
//! and cluster secrets. The fence every write for a task passes is the
//! handle's (`tasks.rs`); `lease.rs` says what it checks.

/// Writes the part for `$store` on `$db` (see [`super::store!`]).
macro_rules! leases {
    ($store:ident, $db:ty, $conn:ty) => {
        mod leases {
            use async_trait::async_trait;
            use cairn_core::TaskId;

            use super::$store;
            use $crate::queries::{rows, Dialect};
            use $crate::{now_ms, Error, Lease, LeaseStore, Result, Unheld};

            type Db = $db;

            #[async_trait]
            impl LeaseStore for $store {
                async fn acquire_lease(&self, task: &TaskId, node: &str, ttl_ms: i64) -> Result<Option<Lease>> {
                    let q = |e| Error::Query("acquire task lease", e);
                    let now = now_ms();
                    let mut tx = self.begin().await.map_err(q)?;
                    let stored = Self::lease_in(&mut tx, task).await?.ok_or_else(|| Error::UnknownTask(task.to_string()))?;
                    let Some(token) = stored.token_for(node, now) else { return Ok(None) };
                    sqlx::query("UPDATE tasks SET lease_node = $1, lease_token = $2, lease_expires_ms = $3, last_node = $1 WHERE id = $4")
                        .bind(node)
                        .bind(token as i64)
                        .bind(now + ttl_ms)
                        .bind(task.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(q)?;
                    tx.commit().await.map_err(q)?;
                    self.fences.hold(task, node, token);
                    Ok(Some(Lease { task: task.clone(), node: Some(node.to_owned()), token, expires_ms: Some(now + ttl_ms), last_node: stored.last_node }))
                }

                async fn renew_leases(&self, node: &str, ttl_ms: i64) -> Result<Vec<TaskId>> {
                    let q = |e| Error::Query("renew task leases", e);
                    let mut gone = Vec::new();
                    let mut tx = self.begin().await.map_err(q)?;
                    for (task, token) in self.fences.of_node(node) {
                        let done = sqlx::query("UPDATE tasks SET lease_expires_ms = $1 WHERE id = $2 AND lease_node = $3 AND lease_token = $4")
                            .bind(now_ms() + ttl_ms)
                            .bind(task.as_str())
                            .bind(node)
                            .bind(token as i64)
                            .execute(&mut *tx)
                            .await
                            .map_err(q)?;
                        if done.rows_affected() == 0 {
                            gone.push((task, token));
                        }
                    }
                    tx.commit().await.map_err(q)?;
                    Ok(self.fences.settle_unrenewed(self, gone).await)
                }

                async fn release_lease(&self, task: &TaskId) -> Result<()> {
                    let Some((node, token)) = self.fences.of_task(task) else { return Ok(()) };
                    sqlx::query("UPDATE tasks SET lease_node = NULL, lease_expires_ms = NULL WHERE id = $1 AND lease_node = $2 AND lease_token = $3")
                        .bind(task.as_str())
                        .bind(node)
                        .bind(token as i64)
                        .execute(&self.pool)
                        .await
                        .map_err(|e| Error::Query("release task lease", e))?;
                    self.fences.forget(task);
                    Ok(())
                }

                async fn lease(&self, task: &TaskId) -> Result<Lease> {
                    // Outside a transaction a row lock ends with the statement.
                    let mut conn = self.pool.acquire().await.map_err(|e| Error::Query("read task lease", e))?;
                    Self::lease_in(&mut conn, task).await?.ok_or_else(|| Error::UnknownTask(task.to_string()))
                }

                async fn unheld_tasks(&self, now_ms: i64) -> Result<Vec<Unheld>> {
                    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
                        "SELECT id, state, lease_node FROM tasks
                         WHERE state IN ('running', 'suspending', 'waking') AND (lease_node IS NULL OR lease_expires_ms < $1)
                         ORDER BY created_ms, id",
                    )
                    .bind(now_ms)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| Error::Query("list tasks without a node", e))?;
                    rows.into_iter()
                        .map(|(id, state, last_node)| {
                            Ok(Unheld { task: id.parse().map_err(|_| Error::Corrupt("task id", id.clone()))?, state: rows::task_state(state)?, last_node })
                        })
                        .collect()
                }

                async fn lock_blobs(&self, id: &str, node: &str, exclusive: bool, ttl_ms: i64) -> Result<bool> {
                    let q = |e| Error::Query("hold the blob store", e);
                    let now = now_ms();
                    let mut tx = self.begin().await.map_err(q)?;
                    // Holds are taken one at a time, cluster-wide: each sees the other.
                    if let Some(lock) = Db::LOCK_BLOB_HOLDS {
                        sqlx::query(lock).execute(&mut *tx).await.map_err(q)?;
                    }
                    // For a shared hold, only exclusive ones of other nodes are in the way.
                    let blocking: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM blob_locks WHERE node <> $1 AND expires_ms >= $2 AND (exclusive OR $3)")
                        .bind(node)
                        .bind(now)
                        .bind(exclusive)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(q)?;
                    if blocking > 0 {
                        return Ok(false);
                    }
                    sqlx::query("INSERT INTO blob_locks (id, node, exclusive, expires_ms) VALUES ($1, $2, $3, $4)")
                        .bind(id)
                        .bind(node)
                        .bind(exclusive)
                        .bind(now + ttl_ms)
                        .execute(&mut *tx)
                        .await
                        .map_err(q)?;
                    tx.commit().await.map_err(q)?;
                    Ok(true)
                }

                async fn unlock_blobs(&self, id: &str) -> Result<()> {
                    sqlx::query("DELETE FROM blob_locks WHERE id = $1")
                        .bind(id)
                        .execute(&self.pool)
                        .await
                        .map_err(|e| Error::Query("let go of the blob store", e))?;
                    Ok(())
                }

                async fn renew_blob_locks(&self, node: &str, ttl_ms: i64) -> Result<()> {
                    sqlx::query("UPDATE blob_locks SET expires_ms = $1 WHERE node = $2")
                        .bind(now_ms() + ttl_ms)
                        .bind(node)
                        .execute(&self.pool)
                        .await
                        .map_err(|e| Error::Query("renew blob store holds", e))?;
                    Ok(())
                }

                async fn cluster_secret(&self, name: &str, proposed: &str) -> Result<String> {
                    let q = |e| Error::Query("read cluster secret", e);
                    sqlx::query("INSERT INTO cluster_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
                        .bind(name)
                        .bind(proposed)
                        .execute(&self.pool)
                        .await
                        .map_err(q)?;
                    sqlx::query_scalar("SELECT value FROM cluster_secrets WHERE name = $1").bind(name).fetch_one(&self.pool).await.map_err(q)
                }
            }
        }
    };
}
pub(crate) use leases;
