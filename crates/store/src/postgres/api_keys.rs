//! Keys of the E2B-compatible API ([`ApiKeyStore`]) in PostgreSQL, shared
//! by every node of the database: hashes only. Each call is one
//! statement, so none needs a transaction or a lock.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::PostgresStore;
use crate::{ApiKeyRow, ApiKeyStore, Error, Result};

#[async_trait]
impl ApiKeyStore for PostgresStore {
    async fn insert_api_key(&self, key: &ApiKeyRow) -> Result<()> {
        let res = sqlx::query("INSERT INTO api_keys (name, hash, created_ms, last_used_ms) VALUES ($1, $2, $3, $4)")
            .bind(&key.name)
            .bind(&key.hash)
            .bind(key.created_ms)
            .bind(key.last_used_ms)
            .execute(&self.pool)
            .await;
        match res {
            Ok(_) => Ok(()),
            // The name only: a hash taken by another key is no caller's
            // doing (two keys alike), left a query error.
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() && e.constraint() == Some("api_keys_pkey") => Err(Error::KeyNameTaken(key.name.clone())),
            Err(e) => Err(Error::Query("insert API key", e)),
        }
    }

    async fn api_keys(&self) -> Result<Vec<ApiKeyRow>> {
        let rows = sqlx::query("SELECT name, hash, created_ms, last_used_ms FROM api_keys ORDER BY created_ms, name")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("list API keys", e))?;
        Ok(rows.iter().map(api_key_from_row).collect())
    }

    async fn revoke_api_key(&self, name: &str) -> Result<bool> {
        let res = sqlx::query("DELETE FROM api_keys WHERE name = $1")
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(|e| Error::Query("revoke API key", e))?;
        Ok(res.rows_affected() > 0)
    }

    async fn use_api_key(&self, hash: &str, now_ms: i64) -> Result<Option<String>> {
        let row = sqlx::query("UPDATE api_keys SET last_used_ms = $1 WHERE hash = $2 RETURNING name")
            .bind(now_ms)
            .bind(hash)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("use API key", e))?;
        Ok(row.map(|r| r.get(0)))
    }
}

fn api_key_from_row(r: &PgRow) -> ApiKeyRow {
    ApiKeyRow { name: r.get("name"), hash: r.get("hash"), created_ms: r.get("created_ms"), last_used_ms: r.get("last_used_ms") }
}
