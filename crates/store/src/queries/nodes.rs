//! [`NodeStore`](crate::NodeStore): the node registry, one row per daemon
//! sharing the database (a SQLite file has one).

/// Writes the part for `$store` on `$db` (see [`super::store!`]).
macro_rules! nodes {
    ($store:ident, $db:ty, $conn:ty) => {
        mod nodes {
            use async_trait::async_trait;
            use cairn_core::TaskId;

            use super::$store;
            use $crate::{Error, NodeRow, NodeStore, Result};

            #[async_trait]
            impl NodeStore for $store {
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
                    sqlx::query_as("SELECT name, url, started_ms, heartbeat_ms, version FROM nodes ORDER BY name")
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("list nodes", e))
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
                    let rows: Vec<(String, String, String, i64)> =
                        sqlx::query_as("SELECT node, key_id, public_key, created_ms FROM node_keys ORDER BY node, created_ms DESC")
                            .fetch_all(&self.pool)
                            .await
                            .map_err(|e| Error::Query("read node keys", e))?;
                    Ok(rows
                        .into_iter()
                        .map(|(node, key_id, public_key, created_ms)| (node, cairn_ledger::KeyInfo { key_id, public_key, created_ms, current: false }))
                        .collect())
                }

                async fn node_tasks(&self) -> Result<Vec<(String, TaskId)>> {
                    let rows: Vec<(String, String)> =
                        sqlx::query_as("SELECT node, id FROM tasks WHERE node IS NOT NULL AND sandbox_state = 'ready' ORDER BY node, id")
                            .fetch_all(&self.pool)
                            .await
                            .map_err(|e| Error::Query("list the tasks of nodes", e))?;
                    rows.into_iter().map(|(node, id)| Ok((node, id.parse().map_err(|_| Error::Corrupt("task id", id.clone()))?))).collect()
                }
            }
        }
    };
}
pub(crate) use nodes;
