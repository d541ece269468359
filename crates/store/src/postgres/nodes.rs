//! The node registry ([`NodeStore`]) in PostgreSQL, where several daemons
//! share one database, each its own row.

use async_trait::async_trait;
use cairn_core::TaskId;
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::PostgresStore;
use crate::{Error, NodeRow, NodeStore, Result};

#[async_trait]
impl NodeStore for PostgresStore {
    async fn register_node(&self, node: &NodeRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO nodes (name, url, started_ms, heartbeat_ms, version) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (name) DO UPDATE SET url = excluded.url, started_ms = excluded.started_ms,
                 heartbeat_ms = excluded.heartbeat_ms, version = excluded.version",
        )
        .bind(&node.name)
        .bind(&node.url)
        .bind(node.started_ms)
        .bind(node.heartbeat_ms)
        .bind(&node.version)
        .execute(&self.pool)
        .await
        .map_err(|e| Error::Query("register node", e))?;
        Ok(())
    }

    async fn heartbeat_node(&self, node: &NodeRow, now_ms: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO nodes (name, url, started_ms, heartbeat_ms, version) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (name) DO UPDATE SET heartbeat_ms = excluded.heartbeat_ms",
        )
        .bind(&node.name)
        .bind(&node.url)
        .bind(node.started_ms)
        .bind(now_ms)
        .bind(&node.version)
        .execute(&self.pool)
        .await
        .map_err(|e| Error::Query("record node heartbeat", e))?;
        Ok(())
    }

    async fn list_nodes(&self) -> Result<Vec<NodeRow>> {
        let rows = sqlx::query("SELECT * FROM nodes ORDER BY name")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("list nodes", e))?;
        Ok(rows.iter().map(node_from_row).collect())
    }

    async fn publish_keys(&self, node: &str, keys: &[cairn_ledger::KeyInfo]) -> Result<()> {
        for k in keys {
            sqlx::query("INSERT INTO node_keys (key_id, node, public_key, created_ms) VALUES ($1, $2, $3, $4) ON CONFLICT (key_id) DO NOTHING")
                .bind(&k.key_id)
                .bind(node)
                .bind(&k.public_key)
                .bind(k.created_ms)
                .execute(&self.pool)
                .await
                .map_err(|e| Error::Query("publish node keys", e))?;
        }
        Ok(())
    }

    async fn cluster_keys(&self) -> Result<Vec<(String, cairn_ledger::KeyInfo)>> {
        let rows = sqlx::query("SELECT node, key_id, public_key, created_ms FROM node_keys ORDER BY node, created_ms DESC")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("read node keys", e))?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), cairn_ledger::KeyInfo { key_id: r.get(1), public_key: r.get(2), created_ms: r.get(3), current: false }))
            .collect())
    }

    async fn node_tasks(&self) -> Result<Vec<(String, TaskId)>> {
        let rows = sqlx::query("SELECT node, id FROM tasks WHERE node IS NOT NULL AND sandbox_state = 'ready' ORDER BY node, id")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("list the tasks of nodes", e))?;
        rows.iter()
            .map(|r| {
                let id: String = r.get(1);
                Ok((r.get(0), id.parse().map_err(|_| Error::Corrupt("task id", id.clone()))?))
            })
            .collect()
    }
}

fn node_from_row(r: &PgRow) -> NodeRow {
    NodeRow {
        name: r.get("name"),
        url: r.get("url"),
        started_ms: r.get("started_ms"),
        heartbeat_ms: r.get("heartbeat_ms"),
        version: r.get("version"),
    }
}
