//! [`HookStore`](crate::HookStore): outgoing hooks and their outbox. The
//! outbox is filled by the trigger `events_to_hooks` (migration 0011), in
//! the transaction that appends an event; these statements read it, claim
//! its rows for a sender and settle them.

/// Writes the part for `$store` on `$db` (see [`super::store!`]).
macro_rules! hooks {
    ($store:ident, $db:ty, $conn:ty) => {
        mod hooks {
            use async_trait::async_trait;

            use super::$store;
            use $crate::{Error, HookEntry, HookRow, HookStore, Notification, Result};

            /// The columns of a [`Notification`].
            const NOTIFICATION: &str = "id, hook_id, task_id, seq, created_ms, attempts, state, last_error";

            #[async_trait]
            impl HookStore for $store {
                async fn insert_hook(&self, hook: &HookRow, kinds: &[String]) -> Result<()> {
                    let q = |e| Error::Query("add a hook", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    sqlx::query("INSERT INTO hooks (id, url, task_id, format, sealed, created_ms, sent, last_sent_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
                        .bind(&hook.id)
                        .bind(&hook.url)
                        .bind(&hook.task_id)
                        .bind(&hook.format)
                        .bind(&hook.sealed)
                        .bind(hook.created_ms)
                        .bind(hook.sent)
                        .bind(hook.last_sent_ms)
                        .execute(&mut *tx)
                        .await
                        .map_err(q)?;
                    for kind in kinds {
                        sqlx::query("INSERT INTO hook_kinds (hook_id, kind) VALUES ($1, $2)").bind(&hook.id).bind(kind).execute(&mut *tx).await.map_err(q)?;
                    }
                    tx.commit().await.map_err(q)
                }

                async fn hooks(&self) -> Result<Vec<HookEntry>> {
                    let q = |e| Error::Query("list hooks", e);
                    let rows: Vec<HookRow> =
                        sqlx::query_as("SELECT id, url, task_id, format, sealed, created_ms, sent, last_sent_ms FROM hooks ORDER BY created_ms, id")
                            .fetch_all(&self.pool)
                            .await
                            .map_err(q)?;
                    let kinds: Vec<(String, String)> =
                        sqlx::query_as("SELECT hook_id, kind FROM hook_kinds ORDER BY hook_id, kind").fetch_all(&self.pool).await.map_err(q)?;
                    let counts: Vec<(String, String, i64)> =
                        sqlx::query_as("SELECT hook_id, state, COUNT(*) FROM hook_outbox GROUP BY hook_id, state").fetch_all(&self.pool).await.map_err(q)?;
                    let mut out = Vec::with_capacity(rows.len());
                    for hook in rows {
                        let last_error: Option<String> = sqlx::query_scalar(
                            "SELECT last_error FROM hook_outbox WHERE hook_id = $1 AND last_error IS NOT NULL ORDER BY id DESC LIMIT 1",
                        )
                        .bind(&hook.id)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(q)?;
                        let count = |state: &str| counts.iter().find(|(h, s, _)| *h == hook.id && s.as_str() == state).map_or(0, |c| c.2);
                        out.push(HookEntry {
                            kinds: kinds.iter().filter(|(h, _)| *h == hook.id).map(|(_, k)| k.clone()).collect(),
                            pending: count("pending"),
                            failed: count("failed"),
                            last_error,
                            hook,
                        });
                    }
                    Ok(out)
                }

                async fn remove_hook(&self, id: &str) -> Result<bool> {
                    let q = |e| Error::Query("remove a hook", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    sqlx::query("DELETE FROM hook_kinds WHERE hook_id = $1").bind(id).execute(&mut *tx).await.map_err(q)?;
                    sqlx::query("DELETE FROM hook_outbox WHERE hook_id = $1").bind(id).execute(&mut *tx).await.map_err(q)?;
                    let removed = sqlx::query("DELETE FROM hooks WHERE id = $1").bind(id).execute(&mut *tx).await.map_err(q)?.rows_affected() > 0;
                    tx.commit().await.map_err(q)?;
                    Ok(removed)
                }

                async fn claim_notifications(&self, node: &str, now_ms: i64, until_ms: i64, limit: i64) -> Result<Vec<Notification>> {
                    // A stream's head only, so that a task's notifications
                    // go out in order; the claim is checked again on the
                    // row itself (PostgreSQL re-reads a row another node
                    // claimed meanwhile, and skips it).
                    let sql = format!(
                        "UPDATE hook_outbox SET claimed_by = $1, claimed_until = $2, attempts = attempts + 1
                         WHERE id IN (
                             SELECT o.id FROM hook_outbox o
                             WHERE o.state = 'pending' AND o.next_ms <= $3 AND o.claimed_until < $3
                               AND o.id = (SELECT MIN(p.id) FROM hook_outbox p
                                           WHERE p.state = 'pending' AND p.hook_id = o.hook_id AND p.task_id = o.task_id)
                             ORDER BY o.id LIMIT $4)
                         AND claimed_until < $3
                         RETURNING {NOTIFICATION}"
                    );
                    let mut claimed: Vec<Notification> = sqlx::query_as(&sql)
                        .bind(node)
                        .bind(until_ms)
                        .bind(now_ms)
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("claim notifications", e))?;
                    claimed.sort_by_key(|n| n.id);
                    Ok(claimed)
                }

                async fn notification_sent(&self, id: i64, hook_id: &str, now_ms: i64) -> Result<()> {
                    let q = |e| Error::Query("settle a sent notification", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    sqlx::query("DELETE FROM hook_outbox WHERE id = $1").bind(id).execute(&mut *tx).await.map_err(q)?;
                    sqlx::query("UPDATE hooks SET sent = sent + 1, last_sent_ms = $1 WHERE id = $2").bind(now_ms).bind(hook_id).execute(&mut *tx).await.map_err(q)?;
                    tx.commit().await.map_err(q)
                }

                async fn notification_failed(&self, id: i64, error: &str, next_ms: Option<i64>) -> Result<()> {
                    let q = match next_ms {
                        Some(next) => sqlx::query("UPDATE hook_outbox SET last_error = $1, next_ms = $2, claimed_by = NULL, claimed_until = 0 WHERE id = $3")
                            .bind(error)
                            .bind(next)
                            .bind(id),
                        None => sqlx::query("UPDATE hook_outbox SET last_error = $1, state = 'failed', claimed_by = NULL, claimed_until = 0 WHERE id = $2")
                            .bind(error)
                            .bind(id),
                    };
                    q.execute(&self.pool).await.map_err(|e| Error::Query("settle a failed notification", e))?;
                    Ok(())
                }

                async fn notifications(&self, hook_id: &str, limit: i64) -> Result<Vec<Notification>> {
                    let sql = format!("SELECT {NOTIFICATION} FROM hook_outbox WHERE hook_id = $1 ORDER BY state DESC, id LIMIT $2");
                    sqlx::query_as(&sql).bind(hook_id).bind(limit).fetch_all(&self.pool).await.map_err(|e| Error::Query("list notifications", e))
                }
            }
        }
    };
}
pub(crate) use hooks;
