//! Cairn's durable task state: tasks, their sandbox slots, their
//! append-only, hash-chained event logs with signed checkpoints, snapshot
//! records, waits and the inbox.
//!
//! The runtime sees only the [`Store`] trait (held as a [`SharedStore`]),
//! so that the database behind it can change with the runtime changing
//! only the line that opens it.
//! `Store` joins one trait per concern ([`TaskStore`], [`EventStore`],
//! [`SandboxStore`], [`SnapshotStore`], [`WaitStore`], [`CheckpointStore`]);
//! `src/store.rs` states the contract every backend keeps: multi-part
//! writes are one transaction, state changes are a compare-and-set over
//! core's transition table, a task's log never forks.
//!
//! [`SqliteStore`] (`src/sqlite/`) is the one backend today: a file under
//! `$CAIRN_HOME`, for a single daemon. A server-backed one (PostgreSQL,
//! for several daemons sharing their tasks) goes next to it as
//! `src/postgres/`, implementing the same traits, and runs the same
//! conformance suite (`src/conformance.rs`) by adding one line there.

mod error;
mod sqlite;
mod store;

#[cfg(test)]
mod conformance;

pub use error::{Error, Result};
pub use sqlite::SqliteStore;
pub use store::{
    now_ms, ChangeListener, CheckpointStore, Delivered, EventStore, SandboxRow, SandboxStore, SharedStore, SnapshotStore, Store,
    TaskStore, WaitStore,
};
