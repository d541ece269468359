//! Write transactions that end, on every path, in a commit or a rollback.
//!
//! sqlx's own `Transaction` counts the transactions open on a connection
//! and leaves the count up when a COMMIT or ROLLBACK fails. SQLite rolls a
//! transaction back by itself on "database or disk is full", so after such
//! a failed commit the rollback on drop fails too and the connection goes
//! back to the pool counted as inside a transaction: every later `BEGIN` on
//! it is refused ("attempted to call begin_with at non-zero transaction
//! depth") until the process restarts. The store therefore never uses it
//! (neither `begin` nor `begin_with`): [`WriteTx`] sends BEGIN, COMMIT and
//! ROLLBACK itself, and a connection on which one of them failed is closed
//! instead of pooled, because whether the database still holds a
//! transaction open on it is then unknown; closing ends it either way.

use std::ops::{Deref, DerefMut};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Executor, Pool};

/// A transaction on a pooled connection of its own. [`WriteTx::commit`]
/// ends it; dropped without a commit (an error, an early return, a
/// cancelled call) it is rolled back. Derefs to the connection, for the
/// statements inside it.
pub(crate) struct WriteTx<DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// `None` once the transaction has ended.
    conn: Option<PoolConnection<DB>>,
}

impl<DB> WriteTx<DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// Takes a connection from `pool` and runs `begin` on it (`BEGIN`,
    /// `BEGIN IMMEDIATE`).
    pub(crate) async fn begin(pool: &Pool<DB>, begin: &'static str) -> sqlx::Result<Self> {
        // Held before BEGIN is sent: a call cancelled meanwhile rolls back.
        let mut tx = WriteTx { conn: Some(pool.acquire().await?) };
        if let Err(e) = tx.run(begin).await {
            discard(tx.conn.take()).await;
            return Err(e);
        }
        Ok(tx)
    }

    /// Commits. A failed commit closes the connection (the database may
    /// or may not have rolled back already), so the transaction has ended
    /// either way when this returns.
    pub(crate) async fn commit(mut self) -> sqlx::Result<()> {
        match self.run("COMMIT").await {
            Ok(()) => {
                drop(self.conn.take());
                Ok(())
            }
            Err(e) => {
                discard(self.conn.take()).await;
                Err(e)
            }
        }
    }

    async fn run(&mut self, sql: &'static str) -> sqlx::Result<()> {
        Executor::execute(&mut **self, sqlx::raw_sql(sql)).await.map(drop)
    }
}

/// Closes a connection whose transaction did not end cleanly.
async fn discard<DB: Database>(conn: Option<PoolConnection<DB>>) {
    if let Some(conn) = conn {
        if let Err(e) = conn.close().await {
            tracing::debug!("closing a task database connection after a failed transaction: {e}");
        }
    }
}

impl<DB> Drop for WriteTx<DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        // Drop cannot wait: the rollback runs on its own, the connection
        // held until it is done (as sqlx's own return to the pool does).
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let mut conn = conn;
                    if let Err(e) = Executor::execute(&mut *conn, sqlx::raw_sql("ROLLBACK")).await {
                        tracing::debug!("rolling back a task database transaction failed, closing its connection: {e}");
                        discard(Some(conn)).await;
                    }
                });
            }
            // No runtime to run it on: out of the pool, dropping the
            // connection closes it, which rolls back.
            Err(_) => drop(conn.detach()),
        }
    }
}

impl<DB> Deref for WriteTx<DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.conn.as_ref().expect("a transaction that has not ended")
    }
}

impl<DB> DerefMut for WriteTx<DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.conn.as_mut().expect("a transaction that has not ended")
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every transaction of the store is a [`super::WriteTx`]: none begins
    /// through sqlx's own `Transaction`, which a failed commit can leave
    /// counted as open on a pooled connection.
    #[test]
    fn no_transaction_begins_past_write_tx() {
        fn walk(dir: &Path, found: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("src/tx.rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for (n, line) in text.lines().enumerate() {
                        if ["begin_with(", "pool.begin(", "Transaction<", ".transaction("].iter().any(|p| line.contains(p)) {
                            found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                        }
                    }
                }
            }
        }
        let mut found = Vec::new();
        walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut found);
        assert!(found.is_empty(), "transactions begun past WriteTx:\n{}", found.join("\n"));
    }
}
