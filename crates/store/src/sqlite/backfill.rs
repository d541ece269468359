//! The one-time hashing of event logs written before the ledger existed
//! (SQLite only: no PostgreSQL database predates the ledger, see
//! `migrations/postgres/0004_ledger.sql`).

use cairn_ledger::GENESIS;
use sqlx::SqlitePool;

use crate::queries::rows::EventRow;
use crate::queries::Dialect;
use crate::tx::WriteTx;
use crate::{Error, Result};

/// Hashes, once, the entries written before the ledger existed: for each
/// task the migration listed in `ledger_backfill`, its entries up to the
/// listed seq that have no hash yet, in chain order, in one transaction.
/// The task then leaves the list, so a hash removed later is never filled
/// in again (that would launder an edit): `verify` reports it instead.
pub(crate) async fn backfill(pool: &SqlitePool) -> Result<()> {
    let q = |e| Error::Query("hash the event log written before the ledger", e);
    let pending: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger_backfill").fetch_one(pool).await.map_err(q)?;
    if pending == 0 {
        return Ok(());
    }
    let mut tx = WriteTx::begin(pool, sqlx::Sqlite::BEGIN).await.map_err(q)?;
    let todo: Vec<(String, i64)> = sqlx::query_as("SELECT task_id, upto FROM ledger_backfill ORDER BY task_id").fetch_all(&mut *tx).await.map_err(q)?;
    let mut hashed = 0usize;
    for (task, upto) in &todo {
        let rows: Vec<EventRow> = sqlx::query_as("SELECT * FROM events WHERE task_id = $1 AND seq <= $2 ORDER BY seq")
            .bind(task)
            .bind(upto)
            .fetch_all(&mut *tx)
            .await
            .map_err(q)?;
        let mut prev = GENESIS.to_owned();
        for r in rows {
            let e = r.parse()?;
            if let Some(h) = &e.hash {
                prev = h.clone();
                continue;
            }
            let hash = cairn_ledger::entry_hash(&prev, &e);
            sqlx::query("UPDATE events SET prev_hash = $1, hash = $2 WHERE task_id = $3 AND seq = $4 AND hash IS NULL")
                .bind(&prev)
                .bind(&hash)
                .bind(task)
                .bind(e.seq as i64)
                .execute(&mut *tx)
                .await
                .map_err(q)?;
            prev = hash;
            hashed += 1;
        }
        sqlx::query("DELETE FROM ledger_backfill WHERE task_id = $1").bind(task).execute(&mut *tx).await.map_err(q)?;
    }
    tx.commit().await.map_err(q)?;
    tracing::info!(tasks = todo.len(), entries = hashed, "hashed the event log written before the ledger");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use cairn_core::{EventKind, NewEvent, TaskId};
    use cairn_ledger::{verify_chain, ProblemKind};

    use crate::conformance::{assert_chain, TestDatabase};
    use crate::sqlite::TempSqlite;
    use crate::{EventStore, Store};

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
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger_backfill").fetch_one(&store.pool).await.unwrap();
        assert_eq!(left, 0);
        // New entries chain on.
        store.append_event(&NewEvent { task: a.clone(), kind: EventKind::Exec, actor: "test".into(), args: serde_json::json!({}), exit_code: Some(0), duration_ms: Some(1) }).await.unwrap();
        assert_chain(&store, &a, 6).await;
        assert_eq!(store.events(&a).await.unwrap()[5].prev_hash, before[4].hash);

        // An attacker drops the triggers, edits a row and removes its hash
        // hoping the next start hashes it again: it does not.
        sqlx::query("DROP TRIGGER events_no_update").execute(&store.pool).await.unwrap();
        sqlx::query("UPDATE events SET args = '{\"argv\":[\"true\"]}', hash = NULL WHERE task_id = $1 AND seq = 3").bind(a.as_str()).execute(&store.pool).await.unwrap();
        store.close().await;
        let store = db.open_sqlite().await;
        let events = store.events(&a).await.unwrap();
        assert_eq!(events[2].hash, None, "not filled in again");
        let p = verify_chain(&a, &events).problem.unwrap();
        assert_eq!((p.seq, p.what), (3, ProblemKind::Changed), "{p}");
        assert_chain(&store, &b, 2).await;
    }
}
