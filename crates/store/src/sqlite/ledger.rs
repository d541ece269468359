//! The store's side of the ledger: signed checkpoints of a task's chain
//! head, and the one-time hashing of entries written before the ledger
//! (SQLite).

use async_trait::async_trait;
use cairn_core::TaskId;
use cairn_ledger::{Checkpoint, Envelope, SignedCheckpoint, GENESIS};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqlitePool};

use super::{event_from_row, SqliteStore};
use crate::tx::WriteTx;
use crate::{CheckpointStore, Error, Result};

#[async_trait]
impl CheckpointStore for SqliteStore {
    async fn insert_checkpoint(&self, c: &SignedCheckpoint, actor: &str) -> Result<()> {
        let envelope = serde_json::to_string(&c.envelope).map_err(|e| Error::Corrupt("checkpoint envelope", e.to_string()))?;
        let cp = &c.checkpoint;
        sqlx::query("INSERT INTO checkpoints (task_id, seq, head, time_ms, key_id, actor, envelope) VALUES (?, ?, ?, ?, ?, ?, ?)")
            .bind(&cp.task)
            .bind(cp.seq as i64)
            .bind(&cp.head)
            .bind(cp.time_ms)
            .bind(&cp.key_id)
            .bind(actor)
            .bind(envelope)
            .execute(&self.pool)
            .await
            .map_err(|e| match e {
                sqlx::Error::Database(d) if d.is_foreign_key_violation() => Error::UnknownTask(cp.task.clone()),
                e => Error::Query("insert checkpoint", e),
            })?;
        Ok(())
    }

    async fn checkpoints(&self, task: &TaskId) -> Result<Vec<SignedCheckpoint>> {
        let rows = sqlx::query("SELECT * FROM checkpoints WHERE task_id = ? ORDER BY id")
            .bind(task.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("read checkpoints", e))?;
        rows.iter().map(checkpoint_from_row).collect()
    }

    async fn latest_checkpoint(&self, task: &TaskId) -> Result<Option<SignedCheckpoint>> {
        let row = sqlx::query("SELECT * FROM checkpoints WHERE task_id = ? ORDER BY id DESC LIMIT 1")
            .bind(task.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("read checkpoints", e))?;
        row.map(|r| checkpoint_from_row(&r)).transpose()
    }
}

fn checkpoint_from_row(r: &SqliteRow) -> Result<SignedCheckpoint> {
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

/// Hashes, once, the entries written before the ledger existed: for each
/// task the migration listed in `ledger_backfill`, its entries up to the
/// listed seq that have no hash yet, in chain order, in one transaction.
/// The task then leaves the list, so a hash removed later is never filled
/// in again (that would launder an edit): `verify` reports it instead.
pub(crate) async fn backfill(pool: &SqlitePool) -> Result<()> {
    let q = |e| Error::Query("hash the event log written before the ledger", e);
    let pending: i64 = sqlx::query("SELECT COUNT(*) FROM ledger_backfill").fetch_one(pool).await.map_err(q)?.get(0);
    if pending == 0 {
        return Ok(());
    }
    let mut tx = WriteTx::begin(pool, "BEGIN IMMEDIATE").await.map_err(q)?;
    let todo = sqlx::query("SELECT task_id, upto FROM ledger_backfill ORDER BY task_id").fetch_all(&mut *tx).await.map_err(q)?;
    let mut hashed = 0usize;
    for t in &todo {
        let task: String = t.get(0);
        let upto = t.get::<i64, _>(1) as u64;
        let rows = sqlx::query("SELECT * FROM events WHERE task_id = ? AND seq <= ? ORDER BY seq")
            .bind(&task)
            .bind(upto as i64)
            .fetch_all(&mut *tx)
            .await
            .map_err(q)?;
        let mut prev = GENESIS.to_owned();
        for r in &rows {
            let e = event_from_row(r)?;
            if let Some(h) = &e.hash {
                prev = h.clone();
                continue;
            }
            let hash = cairn_ledger::entry_hash(&prev, &e);
            sqlx::query("UPDATE events SET prev_hash = ?, hash = ? WHERE task_id = ? AND seq = ? AND hash IS NULL")
                .bind(&prev)
                .bind(&hash)
                .bind(&task)
                .bind(e.seq as i64)
                .execute(&mut *tx)
                .await
                .map_err(q)?;
            prev = hash;
            hashed += 1;
        }
        sqlx::query("DELETE FROM ledger_backfill WHERE task_id = ?").bind(&task).execute(&mut *tx).await.map_err(q)?;
    }
    tx.commit().await.map_err(q)?;
    tracing::info!(tasks = todo.len(), entries = hashed, "hashed the event log written before the ledger");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use cairn_core::{EventKind, NewEvent, Task, TaskConfig};
    use cairn_ledger::{verify_chain, NodeKeys, ProblemKind};

    use super::*;
    use crate::conformance::{assert_chain, TestDatabase};
    use crate::sqlite::TempSqlite;
    use crate::{now_ms, EventStore, Store, TaskStore};

    fn ev(task: &TaskId, kind: EventKind) -> NewEvent {
        NewEvent { task: task.clone(), kind, actor: "test".into(), args: serde_json::json!({}), exit_code: Some(0), duration_ms: Some(1) }
    }

    async fn store_with_task(db: &TempSqlite) -> (SqliteStore, Task) {
        let store = db.open_sqlite().await;
        let t = Task::new(TaskId::random(), None, TaskConfig::default(), now_ms());
        store.insert_task(&t).await.unwrap();
        (store, t)
    }

    #[tokio::test]
    async fn the_log_stays_append_only() {
        let db = TempSqlite::create().await;
        let (store, t) = store_with_task(&db).await;
        store.append_event(&ev(&t.id, EventKind::Create)).await.unwrap();
        for sql in [
            "UPDATE events SET args = '{\"x\":1}'",
            "UPDATE events SET hash = 'ab'",
            "UPDATE events SET hash = NULL, prev_hash = NULL",
            "DELETE FROM events",
        ] {
            let err = sqlx::query(sql).execute(&store.pool).await.unwrap_err().to_string();
            assert!(err.contains("append-only"), "{sql}: {err}");
        }
        let err = sqlx::query("INSERT INTO events (task_id, seq, time_ms, kind, actor, args) VALUES (?, 9, 0, 'exec', 'x', '{}')")
            .bind(t.id.as_str())
            .execute(&store.pool)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("written with its hash"), "{err}");
        assert_chain(&store, &t.id, 1).await;
    }

    /// A database written by the daemon before the ledger (two tasks, nested
    /// and unsorted args, a float, non-ASCII and escaped text, events
    /// interleaved across tasks, a batch) is hashed once at open.
    #[tokio::test]
    async fn a_pre_ledger_database_is_hashed_once_in_chain_order() {
        let db = TempSqlite::create().await;
        std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pre-ledger.db"), db.file()).unwrap();
        let store = db.open_sqlite().await;
        let a: TaskId = "tfixtureaaaa".parse().unwrap();
        let b: TaskId = "tfixturebbbb".parse().unwrap();
        assert_chain(&store, &a, 5).await;
        assert_chain(&store, &b, 2).await;
        let before = store.events(&a).await.unwrap();
        assert_eq!(before[2].args["z"]["a"], serde_json::json!([true, null]), "the rows themselves are as they were");
        let left: i64 = sqlx::query("SELECT COUNT(*) FROM ledger_backfill").fetch_one(&store.pool).await.unwrap().get(0);
        assert_eq!(left, 0);
        // New entries chain on.
        store.append_event(&ev(&a, EventKind::Exec)).await.unwrap();
        assert_chain(&store, &a, 6).await;
        assert_eq!(store.events(&a).await.unwrap()[5].prev_hash, before[4].hash);

        // An attacker drops the triggers, edits a row and removes its hash
        // hoping the next start hashes it again: it does not.
        sqlx::query("DROP TRIGGER events_no_update").execute(&store.pool).await.unwrap();
        sqlx::query("UPDATE events SET args = '{\"argv\":[\"true\"]}', hash = NULL WHERE task_id = ? AND seq = 3").bind(a.as_str()).execute(&store.pool).await.unwrap();
        store.close().await;
        let store = db.open_sqlite().await;
        let events = store.events(&a).await.unwrap();
        assert_eq!(events[2].hash, None, "not filled in again");
        let p = verify_chain(&a, &events).problem.unwrap();
        assert_eq!((p.seq, p.what), (3, ProblemKind::Changed), "{p}");
        assert_chain(&store, &b, 2).await;
    }

    #[tokio::test]
    async fn checkpoints_are_append_only() {
        let db = TempSqlite::create().await;
        let (store, t) = store_with_task(&db).await;
        store.append_event(&ev(&t.id, EventKind::Create)).await.unwrap();
        let keys = NodeKeys::load_or_create(&db.file().with_file_name("keys")).unwrap();
        let head = store.events(&t.id).await.unwrap()[0].hash.clone().unwrap();
        let cp = Checkpoint { task: t.id.to_string(), seq: 1, head, time_ms: now_ms(), key_id: String::new() };
        let signed = SignedCheckpoint::sign(&keys, cp);
        store.insert_checkpoint(&signed, "cli:a").await.unwrap();
        for sql in ["UPDATE checkpoints SET seq = 2", "DELETE FROM checkpoints"] {
            assert!(sqlx::query(sql).execute(&store.pool).await.unwrap_err().to_string().contains("append-only"), "{sql}");
        }
        assert_eq!(store.checkpoints(&t.id).await.unwrap(), [signed]);
    }
}
