//! [`ApiKeyStore`](crate::ApiKeyStore) and
//! [`SecretStore`](crate::SecretStore): keys of the E2B-compatible API
//! (hashes only) and secrets of the egress proxy (sealed values only),
//! shared by every node of the database. Each call is one statement, so
//! none needs a transaction or a lock.

/// Writes the part for `$store` on `$db` (see [`super::store!`]).
macro_rules! keys {
    ($store:ident, $db:ty, $conn:ty) => {
        mod keys {
            use async_trait::async_trait;

            use super::$store;
            use $crate::queries::Dialect;
            use $crate::{ApiKeyRow, ApiKeyStore, Error, Result, SecretRow, SecretStore};

            type Db = $db;

            #[async_trait]
            impl ApiKeyStore for $store {
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
                        // The name only: a hash taken by another key is no
                        // caller's doing (two keys alike), left a query error.
                        Err(sqlx::Error::Database(e)) if e.is_unique_violation() && Db::violates(&*e, Db::API_KEY_NAME_KEY) => {
                            Err(Error::KeyNameTaken(key.name.clone()))
                        }
                        Err(e) => Err(Error::Query("insert API key", e)),
                    }
                }

                async fn api_keys(&self) -> Result<Vec<ApiKeyRow>> {
                    sqlx::query_as("SELECT name, hash, created_ms, last_used_ms FROM api_keys ORDER BY created_ms, name")
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("list API keys", e))
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
                    sqlx::query_scalar("UPDATE api_keys SET last_used_ms = $1 WHERE hash = $2 RETURNING name")
                        .bind(now_ms)
                        .bind(hash)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(|e| Error::Query("use API key", e))
                }
            }

            #[async_trait]
            impl SecretStore for $store {
                async fn put_secret(&self, name: &str, sealed: &str, now_ms: i64) -> Result<()> {
                    sqlx::query(
                        "INSERT INTO secrets (name, sealed, created_ms, updated_ms) VALUES ($1, $2, $3, $3)
                         ON CONFLICT (name) DO UPDATE SET sealed = excluded.sealed, updated_ms = excluded.updated_ms",
                    )
                    .bind(name)
                    .bind(sealed)
                    .bind(now_ms)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| Error::Query("set secret", e))?;
                    Ok(())
                }

                async fn secrets(&self) -> Result<Vec<SecretRow>> {
                    sqlx::query_as("SELECT name, sealed, created_ms, updated_ms, last_used_ms, uses FROM secrets ORDER BY name")
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("list secrets", e))
                }

                async fn secret(&self, name: &str) -> Result<Option<SecretRow>> {
                    sqlx::query_as("SELECT name, sealed, created_ms, updated_ms, last_used_ms, uses FROM secrets WHERE name = $1")
                        .bind(name)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(|e| Error::Query("get secret", e))
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
        }
    };
}
pub(crate) use keys;
