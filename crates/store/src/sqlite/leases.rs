//! Task leases ([`LeaseStore`]) and cluster secrets in SQLite, with the
//! fence every write for a task passes (`lease.rs` says what it checks).
//! Writes begin `IMMEDIATE`, so the lease read by the fence cannot change
//! before the write commits.

use async_trait::async_trait;
use cairn_core::{TaskId, TaskState};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use super::SqliteStore;
use crate::lease::Fence;
use crate::{now_ms, Error, Lease, LeaseStore, Result, Unheld};

impl SqliteStore {
    /// Refuses a write for `task` that its lease does not allow, inside the
    /// writer's transaction. An unknown task passes (the write itself then
    /// says so).
    pub(crate) async fn fence(&self, conn: &mut SqliteConnection, task: &TaskId, fence: Fence) -> Result<()> {
        match lease_in(conn, task).await? {
            Some(stored) => self.fences.check(&stored, fence, now_ms()),
            None => Ok(()),
        }
    }
}

async fn lease_in(conn: &mut SqliteConnection, task: &TaskId) -> Result<Option<Lease>> {
    let row = sqlx::query("SELECT id, lease_node, lease_token, lease_expires_ms, last_node FROM tasks WHERE id = ?")
        .bind(task.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| Error::Query("read task lease", e))?;
    row.map(|r| lease_from_row(&r)).transpose()
}

fn lease_from_row(r: &SqliteRow) -> Result<Lease> {
    let id: String = r.get("id");
    Ok(Lease {
        task: id.parse().map_err(|_| Error::Corrupt("task id", id.clone()))?,
        node: r.get("lease_node"),
        token: r.get::<i64, _>("lease_token") as u64,
        expires_ms: r.get("lease_expires_ms"),
        last_node: r.get("last_node"),
    })
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn acquire_lease(&self, task: &TaskId, node: &str, ttl_ms: i64) -> Result<Option<Lease>> {
        let q = |e| Error::Query("acquire task lease", e);
        let now = now_ms();
        let mut tx = self.begin().await.map_err(q)?;
        let stored = lease_in(&mut tx, task).await?.ok_or_else(|| Error::UnknownTask(task.to_string()))?;
        let Some(token) = stored.token_for(node, now) else { return Ok(None) };
        sqlx::query("UPDATE tasks SET lease_node = ?, lease_token = ?, lease_expires_ms = ?, last_node = ? WHERE id = ?")
            .bind(node)
            .bind(token as i64)
            .bind(now + ttl_ms)
            .bind(node)
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
            let done = sqlx::query("UPDATE tasks SET lease_expires_ms = ? WHERE id = ? AND lease_node = ? AND lease_token = ?")
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
        sqlx::query("UPDATE tasks SET lease_node = NULL, lease_expires_ms = NULL WHERE id = ? AND lease_node = ? AND lease_token = ?")
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
        let mut conn = self.pool.acquire().await.map_err(|e| Error::Query("read task lease", e))?;
        lease_in(&mut conn, task).await?.ok_or_else(|| Error::UnknownTask(task.to_string()))
    }

    async fn unheld_tasks(&self, now_ms: i64) -> Result<Vec<Unheld>> {
        let rows = sqlx::query(
            "SELECT id, state, lease_node FROM tasks
             WHERE state IN ('running', 'suspending', 'waking') AND (lease_node IS NULL OR lease_expires_ms < ?)
             ORDER BY created_ms, id",
        )
        .bind(now_ms)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| Error::Query("list tasks without a node", e))?;
        rows.iter()
            .map(|r| {
                let id: String = r.get(0);
                let state: String = r.get(1);
                Ok(Unheld {
                    task: id.parse().map_err(|_| Error::Corrupt("task id", id.clone()))?,
                    state: state.parse::<TaskState>().map_err(|e| Error::Corrupt("task state", e))?,
                    last_node: r.get(2),
                })
            })
            .collect()
    }

    async fn lock_blobs(&self, id: &str, node: &str, exclusive: bool, ttl_ms: i64) -> Result<bool> {
        let q = |e| Error::Query("hold the blob store", e);
        let now = now_ms();
        let mut tx = self.begin().await.map_err(q)?;
        // For a shared hold, only exclusive ones of other nodes are in the way.
        let blocking: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM blob_locks WHERE node <> ? AND expires_ms >= ? AND (exclusive OR ?)",
        )
        .bind(node)
        .bind(now)
        .bind(exclusive)
        .fetch_one(&mut *tx)
        .await
        .map_err(q)?;
        if blocking > 0 {
            return Ok(false);
        }
        sqlx::query("INSERT INTO blob_locks (id, node, exclusive, expires_ms) VALUES (?, ?, ?, ?)")
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
        sqlx::query("DELETE FROM blob_locks WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(|e| Error::Query("let go of the blob store", e))?;
        Ok(())
    }

    async fn renew_blob_locks(&self, node: &str, ttl_ms: i64) -> Result<()> {
        sqlx::query("UPDATE blob_locks SET expires_ms = ? WHERE node = ?")
            .bind(now_ms() + ttl_ms)
            .bind(node)
            .execute(&self.pool)
            .await
            .map_err(|e| Error::Query("renew blob store holds", e))?;
        Ok(())
    }

    async fn cluster_secret(&self, name: &str, proposed: &str) -> Result<String> {
        let q = |e| Error::Query("read cluster secret", e);
        sqlx::query("INSERT INTO cluster_secrets (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING")
            .bind(name)
            .bind(proposed)
            .execute(&self.pool)
            .await
            .map_err(q)?;
        let row = sqlx::query("SELECT value FROM cluster_secrets WHERE name = ?").bind(name).fetch_one(&self.pool).await.map_err(q)?;
        Ok(row.get(0))
    }
}
