//! [`EventStore`](crate::EventStore): each task's append-only,
//! hash-chained log (the chain itself is worked out in `chain.rs`).

/// Writes the part for `$store` on `$db` (see [`super::store!`]).
macro_rules! events {
    ($store:ident, $db:ty, $conn:ty) => {
        mod events {
            use async_trait::async_trait;
            use cairn_core::{Event, NewEvent, TaskId};

            use super::$store;
            use $crate::chain::{self, EventRows, Head};
            use $crate::lease::Fence;
            use $crate::queries::rows::EventRow;
            use $crate::{Error, EventStore, Result};

            type Conn = $conn;

            #[async_trait]
            impl EventStore for $store {
                async fn append_event(&self, ev: &NewEvent) -> Result<u64> {
                    let q = |e| Error::Query("append event", e);
                    // The chain's head is read and extended under the task's lock.
                    let mut tx = self.begin().await.map_err(q)?;
                    self.fence(&mut tx, &ev.task, Fence::Writer).await?;
                    let seq = Self::insert_event(&mut tx, ev).await.map_err(q)?;
                    self.commit(tx, [&ev.task]).await.map_err(q)?;
                    Ok(seq)
                }

                async fn append_events(&self, events: &[NewEvent]) -> Result<()> {
                    let q = |e| Error::Query("append events", e);
                    let mut tx = self.begin().await.map_err(q)?;
                    Self::lock_tasks(&mut tx, events.iter().map(|e| &e.task)).await.map_err(q)?;
                    for task in chain::distinct_tasks(events) {
                        self.fence(&mut tx, task, Fence::Writer).await?;
                    }
                    chain::append(&mut *tx, events).await.map_err(q)?;
                    self.commit(tx, events.iter().map(|e| &e.task)).await.map_err(q)
                }

                async fn events(&self, id: &TaskId) -> Result<Vec<Event>> {
                    let rows: Vec<EventRow> = sqlx::query_as("SELECT * FROM events WHERE task_id = $1 ORDER BY seq")
                        .bind(id.as_str())
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("read events", e))?;
                    rows.into_iter().map(EventRow::parse).collect()
                }

                async fn events_after(&self, id: &TaskId, after: u64) -> Result<Vec<Event>> {
                    let rows: Vec<EventRow> = sqlx::query_as("SELECT * FROM events WHERE task_id = $1 AND seq > $2 ORDER BY seq")
                        .bind(id.as_str())
                        .bind(after as i64)
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("read events", e))?;
                    rows.into_iter().map(EventRow::parse).collect()
                }

                async fn events_before(&self, id: &TaskId, before: Option<u64>, limit: u64) -> Result<Vec<Event>> {
                    let before = before.map_or(i64::MAX, |b| b.min(i64::MAX as u64) as i64);
                    let mut rows: Vec<EventRow> = sqlx::query_as("SELECT * FROM events WHERE task_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3")
                        .bind(id.as_str())
                        .bind(before)
                        .bind(limit.min(i64::MAX as u64) as i64)
                        .fetch_all(&self.pool)
                        .await
                        .map_err(|e| Error::Query("read events", e))?;
                    rows.reverse();
                    rows.into_iter().map(EventRow::parse).collect()
                }
            }

            impl EventRows for Conn {
                async fn head(&mut self, task: &str) -> sqlx::Result<Head> {
                    let last: Option<(i64, Option<String>)> = sqlx::query_as("SELECT seq, hash FROM events WHERE task_id = $1 ORDER BY seq DESC LIMIT 1")
                        .bind(task)
                        .fetch_optional(&mut *self)
                        .await?;
                    Ok(Head::from_last(task, last))
                }

                async fn insert(&mut self, rows: &[chain::Row]) -> sqlx::Result<()> {
                    chain::insert::<$db>(rows).build().execute(&mut *self).await.map(|_| ())
                }
            }
        }
    };
}
pub(crate) use events;
