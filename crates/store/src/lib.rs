//! Cairn's durable task state: tasks, their sandbox slots, their
//! append-only, hash-chained event logs with signed checkpoints, snapshot
//! records, waits and the inbox, and the outbox of outgoing notifications.
//!
//! The runtime sees only the [`Store`] trait (held as a [`SharedStore`]),
//! so that the database behind it can change with the runtime changing
//! only the line that opens it.
//! `Store` joins one trait per concern ([`TaskStore`], [`EventStore`],
//! [`SandboxStore`], [`SnapshotStore`], [`WaitStore`], [`CheckpointStore`],
//! [`NodeStore`], [`LeaseStore`], [`ApiKeyStore`], [`SecretStore`],
//! [`HookStore`]);
//! `src/store.rs` states the contract every backend keeps: multi-part
//! writes are one transaction, state changes are a compare-and-set over
//! core's transition table, a task's log never forks.
//!
//! Two backends implement it, chosen by a [`StoreUrl`]:
//! [`SqliteStore`] (`src/sqlite/`, the default), a file under
//! `$CAIRN_HOME` for a single daemon, and [`PostgresStore`]
//! (`src/postgres/`), a database server several daemons can reach. Both
//! run the same queries, written once in `src/queries/` (statements with
//! `$N` parameters, row types derived once, the hash chain in
//! `src/chain.rs`); a backend brings its store type, its connection and
//! migrations, and a `Dialect` (`src/queries/mod.rs`) for what its SQL
//! does differently: how a write transaction begins, row locks or a
//! single writer, and a few statements. Whether an event wakes its task
//! is core's transition table's call, made in the delivering transaction.
//! Both run the same conformance suite (`src/conformance.rs`), the
//! PostgreSQL one against a private server the tests start
//! (`src/testing/`), which the `test-util` feature makes public for other
//! crates' tests.

mod chain;
mod error;
mod lease;
mod postgres;
mod queries;
mod sqlite;
mod store;
mod tx;
mod url;

#[cfg(test)]
mod conformance;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;

pub use error::{Error, Result};
pub use lease::Lease;
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;
pub use url::StoreUrl;
pub use store::{
    now_ms, ApiKeyRow, ApiKeyStore, HookEntry, HookRow, HookStore, Notification, SecretRow, SecretStore, ChangeListener, CheckpointStore, Delivered, EventStore, LeaseStore, NodeRow, NodeStore, SandboxRow, SandboxStore, SharedStore, SnapshotStore, Store,
    Unheld,
    TaskFilter, TaskStore, WaitStore,
};
