//! The store's side of the ledger: signed checkpoints of a task's chain
//! head (PostgreSQL). No PostgreSQL database predates the ledger, so there
//! is no backfill here (see `migrations/postgres/0004_ledger.sql`).

use async_trait::async_trait;
use cairn_core::TaskId;
use cairn_ledger::{Checkpoint, Envelope, SignedCheckpoint};
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::{lock_task, PostgresStore};
use crate::{CheckpointStore, Error, Result};

#[async_trait]
impl CheckpointStore for PostgresStore {
    async fn insert_checkpoint(&self, c: &SignedCheckpoint, actor: &str) -> Result<()> {
        let q = |e| Error::Query("insert checkpoint", e);
        let envelope = serde_json::to_string(&c.envelope).map_err(|e| Error::Corrupt("checkpoint envelope", e.to_string()))?;
        let cp = &c.checkpoint;
        let task: TaskId = cp.task.parse().map_err(|_| Error::UnknownTask(cp.task.clone()))?;
        let mut tx = self.begin().await.map_err(q)?;
        // With the task's row locked, a task's checkpoints are numbered in
        // the order they commit: the newest is the one with the highest id,
        // as with SQLite's single writer.
        if lock_task(&mut tx, &task).await.map_err(q)?.is_none() {
            return Err(Error::UnknownTask(cp.task.clone()));
        }
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
            .map_err(q)?;
        tx.commit().await.map_err(q)
    }

    async fn checkpoints(&self, task: &TaskId) -> Result<Vec<SignedCheckpoint>> {
        let rows = sqlx::query("SELECT * FROM checkpoints WHERE task_id = $1 ORDER BY id")
            .bind(task.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("read checkpoints", e))?;
        rows.iter().map(checkpoint_from_row).collect()
    }

    async fn latest_checkpoint(&self, task: &TaskId) -> Result<Option<SignedCheckpoint>> {
        let row = sqlx::query("SELECT * FROM checkpoints WHERE task_id = $1 ORDER BY id DESC LIMIT 1")
            .bind(task.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("read checkpoints", e))?;
        row.map(|r| checkpoint_from_row(&r)).transpose()
    }
}

fn checkpoint_from_row(r: &PgRow) -> Result<SignedCheckpoint> {
    let envelope: String = r.get("envelope");
    Ok(SignedCheckpoint {
        checkpoint: Checkpoint {
            task: r.get("task_id"),
            seq: r.get::<i64, _>("seq") as u64,
            head: r.get("head"),
            time_ms: r.get("time_ms"),
            key_id: r.get("key_id"),
        },
        envelope: serde_json::from_str::<Envelope>(&envelope).map_err(|e| Error::Corrupt("checkpoint envelope", e.to_string()))?,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use cairn_core::{EventKind, NewEvent, Task, TaskConfig};
    use cairn_ledger::NodeKeys;

    use super::*;
    use crate::conformance::{assert_chain, TestDatabase};
    use crate::testing::postgres::TempPostgres;
    use crate::{now_ms, EventStore, TaskStore};

    fn ev(task: &TaskId, kind: EventKind) -> NewEvent {
        NewEvent { task: task.clone(), kind, actor: "test".into(), args: serde_json::json!({}), exit_code: Some(0), duration_ms: Some(1) }
    }

    async fn store_with_task(db: &TempPostgres) -> (PostgresStore, Task) {
        let store = db.open_postgres().await;
        let t = Task::new(TaskId::random(), None, TaskConfig::default(), now_ms());
        store.insert_task(&t).await.unwrap();
        (store, t)
    }

    #[tokio::test]
    async fn the_log_stays_append_only() {
        let db = TempPostgres::create().await;
        let (store, t) = store_with_task(&db).await;
        store.append_event(&ev(&t.id, EventKind::Create)).await.unwrap();
        for sql in [
            "UPDATE events SET args = '{\"x\":1}'",
            "UPDATE events SET hash = 'ab'",
            "UPDATE events SET hash = NULL, prev_hash = NULL",
            "DELETE FROM events",
            // SQLite has no TRUNCATE; PostgreSQL's skips row triggers.
            "TRUNCATE events",
            "TRUNCATE tasks CASCADE",
        ] {
            let err = sqlx::query(sql).execute(&store.pool).await.unwrap_err().to_string();
            assert!(err.contains("append-only"), "{sql}: {err}");
        }
        let err = sqlx::query("INSERT INTO events (task_id, seq, time_ms, kind, actor, args) VALUES ($1, 9, 0, 'exec', 'x', '{}')")
            .bind(t.id.as_str())
            .execute(&store.pool)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("written with its hash"), "{err}");
        assert_chain(&store, &t.id, 1).await;
    }

    #[tokio::test]
    async fn checkpoints_are_append_only() {
        let db = TempPostgres::create().await;
        let (store, t) = store_with_task(&db).await;
        store.append_event(&ev(&t.id, EventKind::Create)).await.unwrap();
        let keys_dir = tempfile::tempdir().unwrap();
        let keys = NodeKeys::load_or_create(&keys_dir.path().join("keys")).unwrap();
        let head = store.events(&t.id).await.unwrap()[0].hash.clone().unwrap();
        let cp = Checkpoint { task: t.id.to_string(), seq: 1, head, time_ms: now_ms(), key_id: String::new() };
        let signed = SignedCheckpoint::sign(&keys, cp);
        store.insert_checkpoint(&signed, "cli:a").await.unwrap();
        for sql in ["UPDATE checkpoints SET seq = 2", "DELETE FROM checkpoints", "TRUNCATE checkpoints"] {
            let err = sqlx::query(sql).execute(&store.pool).await.unwrap_err().to_string();
            assert!(err.contains("append-only"), "{sql}: {err}");
        }
        assert_eq!(store.checkpoints(&t.id).await.unwrap(), [signed]);
    }
}
