//! Secrets of the egress proxy ([`SecretStore`]) in PostgreSQL, shared by every node of the database: sealed
//! values only. Each call is one statement, so none needs a transaction.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::PostgresStore;
use crate::{Error, Result, SecretRow, SecretStore};

const COLUMNS: &str = "name, sealed, created_ms, updated_ms, last_used_ms, uses";

#[async_trait]
impl SecretStore for PostgresStore {
    async fn put_secret(&self, name: &str, sealed: &str, now_ms: i64) -> Result<()> {
        sqlx::query("INSERT INTO secrets (name, sealed, created_ms, updated_ms) VALUES ($1, $2, $3, $3) ON CONFLICT (name) DO UPDATE SET sealed = excluded.sealed, updated_ms = excluded.updated_ms")
            .bind(name)
            .bind(sealed)
            .bind(now_ms)
            .execute(&self.pool)
            .await
            .map_err(|e| Error::Query("set secret", e))?;
        Ok(())
    }

    async fn secrets(&self) -> Result<Vec<SecretRow>> {
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM secrets ORDER BY name"))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| Error::Query("list secrets", e))?;
        Ok(rows.iter().map(secret_from_row).collect())
    }

    async fn secret(&self, name: &str) -> Result<Option<SecretRow>> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM secrets WHERE name = $1"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| Error::Query("get secret", e))?;
        Ok(row.as_ref().map(secret_from_row))
    }

    async fn remove_secret(&self, name: &str) -> Result<bool> {
        let res = sqlx::query("DELETE FROM secrets WHERE name = $1")
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(|e| Error::Query("remove secret", e))?;
        Ok(res.rows_affected() > 0)
    }

    async fn use_secret(&self, name: &str, uses: i64, now_ms: i64) -> Result<()> {
        sqlx::query("UPDATE secrets SET uses = uses + $1, last_used_ms = $2 WHERE name = $3")
            .bind(uses)
            .bind(now_ms)
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(|e| Error::Query("count a secret's use", e))?;
        Ok(())
    }
}

fn secret_from_row(r: &PgRow) -> SecretRow {
    SecretRow {
        name: r.get("name"),
        sealed: r.get("sealed"),
        created_ms: r.get("created_ms"),
        updated_ms: r.get("updated_ms"),
        last_used_ms: r.get("last_used_ms"),
        uses: r.get("uses"),
    }
}
