//! The store's queries, written once for every backend.
//!
//! Every statement is written here with `$N` parameters, which SQLite and
//! PostgreSQL both take (a number used twice binds one value), and every
//! row is read into a type of `rows.rs` (`sqlx::FromRow`, declared once).
//! Each file holds one concern of the contract as a macro that writes its
//! `impl` for one backend's store type and database ([`store!`] writes them
//! all); a backend's `mod.rs` invokes [`store!`] once, so the code is
//! compiled against its concrete types and needs no bounds over sqlx's
//! generic traits.
//!
//! What truly differs between backends is a [`Dialect`], implemented for
//! the backend's `sqlx::Database`: how a write transaction begins, whether
//! writers lock a task's row (PostgreSQL) or hold the whole database from
//! `BEGIN` (SQLite), the table locks some writes take, and the few
//! statements the two SQL dialects write differently. Opening the database
//! and its migrations are the backend's own (`src/sqlite/`,
//! `src/postgres/`).
//!
//! The shared code keeps the contract's rules: a multi-part write is one
//! [`WriteTx`](crate::tx::WriteTx); a transaction that reads a task before
//! it writes locks the task's row first ([`Dialect::ROW_LOCKS`]), several
//! tasks in id order; a task's state moves only through core's transition
//! table, which also decides whether an event, or a cancelled wait, wakes
//! the task (in the transaction that delivers it).

pub(crate) mod rows;

pub(crate) mod events;
pub(crate) mod ledger;
pub(crate) mod leases;
pub(crate) mod nodes;
pub(crate) mod sandboxes;
pub(crate) mod snapshots;
pub(crate) mod tasks;
pub(crate) mod waits;
pub(crate) mod keys;
pub(crate) mod hooks;

use sqlx::error::DatabaseError;

use crate::ChangeListener;

/// What differs between the SQL of two backends. Every statement here
/// takes the same parameters, in the same order, in every backend.
pub(crate) trait Dialect {
    /// Begins a write transaction.
    const BEGIN: &'static str;
    /// True for a database several daemons can share (see `Store::shared`).
    const SHARED: bool;
    /// True when a transaction's writers take turns on the rows of the
    /// tasks it reads (`SELECT ... FOR UPDATE`), false when a write
    /// transaction holds the whole database from `BEGIN` (then the task
    /// locks below are never sent).
    const ROW_LOCKS: bool;
    /// The state of task `$1`, its row locked until the transaction ends
    /// where rows are locked.
    const LOCK_TASK: &'static str;
    /// The lease of task `$1` (`id, lease_node, lease_token,
    /// lease_expires_ms, last_node`), read as [`Self::LOCK_TASK`] locks.
    const LOCK_LEASE: &'static str;
    /// Sent first in a transaction that claims a uid slot (`None`: the
    /// claim is one statement, outside a transaction).
    const LOCK_SLOTS: Option<&'static str>;
    /// Sent first in a transaction that takes a hold on the blob store.
    const LOCK_BLOB_HOLDS: Option<&'static str>;
    /// Running tasks (`$1`) idle for longer than their config's
    /// `idle_suspend_ms` at `$2`.
    const IDLE_TASKS: &'static str;
    /// A task's (`$1`) inbox events that satisfied no wait, oldest first.
    const UNMATCHED_INBOX: &'static str;
    /// A task's (`$1`) inbox, oldest first.
    const INBOX: &'static str;
    /// A task's (`$1`) snapshots, oldest first.
    const TASK_SNAPSHOTS: &'static str;
    /// Every snapshot, oldest first.
    const ALL_SNAPSHOTS: &'static str;
    /// The unique key on `tasks.name`, as [`Self::violates`] names it.
    const TASK_NAME_KEY: &'static str;
    /// The unique key on `api_keys.name`.
    const API_KEY_NAME_KEY: &'static str;

    /// Whether `e` is a unique violation of `key`.
    fn violates(e: &dyn DatabaseError, key: &str) -> bool;
}

/// The change listener, shared by every clone of a store.
#[derive(Clone, Default)]
pub(crate) struct Listener(std::sync::Arc<std::sync::RwLock<Option<ChangeListener>>>);

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Listener")
    }
}

impl Listener {
    pub(crate) fn set(&self, listener: ChangeListener) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(listener);
    }

    /// Tells the listener, if any, that `task` changed.
    pub(crate) fn tell(&self, task: &cairn_core::TaskId) {
        if let Some(listener) = self.0.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            listener(task);
        }
    }
}

/// Writes the whole contract for the store type `$store` (a struct of the
/// invoking module with fields `pool: Pool<$db>`, `listener: Listener` and
/// `fences: Arc<Fences>`, and a method `location_url`) on the database
/// `$db`, which implements [`Dialect`], whose connection type is `$conn`:
/// `crate::queries::store!(SqliteStore, sqlx::Sqlite, sqlx::SqliteConnection);`.
macro_rules! store {
    ($store:ident, $db:ty, $conn:ty) => {
        $crate::queries::tasks::tasks!($store, $db, $conn);
        $crate::queries::events::events!($store, $db, $conn);
        $crate::queries::sandboxes::sandboxes!($store, $db, $conn);
        $crate::queries::snapshots::snapshots!($store, $db, $conn);
        $crate::queries::waits::waits!($store, $db, $conn);
        $crate::queries::ledger::ledger!($store, $db, $conn);
        $crate::queries::nodes::nodes!($store, $db, $conn);
        $crate::queries::leases::leases!($store, $db, $conn);
        $crate::queries::keys::keys!($store, $db, $conn);
        $crate::queries::hooks::hooks!($store, $db, $conn);
    };
}
pub(crate) use store;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    /// The non-blank lines of every `.rs` file under `dir`, trimmed, with
    /// `$N` and `?N` placeholders read as `?`, by file.
    fn lines(dir: &Path) -> Vec<(String, Vec<String>)> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let lines = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(placeholders).collect();
                files.push((path.display().to_string(), lines));
            }
        }
        files
    }

    fn placeholders(line: &str) -> String {
        let mut out = String::with_capacity(line.len());
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if (c == '$' || c == '?') && chars.peek().is_some_and(char::is_ascii_digit) {
                while chars.peek().is_some_and(char::is_ascii_digit) {
                    chars.next();
                }
                out.push('?');
            } else {
                out.push(c);
            }
        }
        out
    }

    /// The backends hold what differs and nothing else: no run of six
    /// lines (or more) is in both, as a query written twice would be.
    #[test]
    fn no_run_of_six_lines_repeats_between_the_backends() {
        const RUN: usize = 6;
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut seen = HashMap::new();
        for (file, lines) in lines(&src.join("sqlite")) {
            for (n, run) in lines.windows(RUN).enumerate() {
                seen.entry(run.join("\n")).or_insert(format!("{file}, line {} of its non-blank lines", n + 1));
            }
        }
        let mut found = Vec::new();
        for (file, lines) in lines(&src.join("postgres")) {
            for (n, run) in lines.windows(RUN).enumerate() {
                if let Some(there) = seen.get(&run.join("\n")) {
                    found.push(format!("{file}, line {} of its non-blank lines, as in {there}:\n{}", n + 1, run.join("\n")));
                }
            }
        }
        assert!(found.is_empty(), "written in both backends (write it once in src/queries/):\n{}", found.join("\n\n"));
        assert_eq!(placeholders("a = $12 AND b = ?3 OR c = ?"), "a = ? AND b = ? OR c = ?");
    }
}
