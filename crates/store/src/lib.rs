//! Cairn's durable task state: tasks, their sandbox slots and their
//! append-only, hash-chained event logs with signed checkpoints, in SQLite
//! (a file under `$CAIRN_HOME`).
//!
//! Every write is one statement or one transaction, so a crash at any point
//! leaves either the old or the new state. Transactions that write begin
//! `IMMEDIATE`: one that read first and then upgraded would fail at once
//! with "database is locked" under concurrent writers instead of waiting
//! its turn. The database runs in WAL mode with
//! `synchronous=FULL`: a call that returned has reached the disk.

mod error;
mod ledger;
mod snapshots;
mod sqlite;
mod waits;

pub use error::{Error, Result};
pub use sqlite::{now_ms, SandboxRow, Store};
pub use waits::Delivered;
