use std::path::PathBuf;

use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum Error {
    #[error("cannot open task database {0}: {1}")]
    Open(PathBuf, sqlx::Error),
    #[error("cannot migrate task database {0}: {1}")]
    Migrate(PathBuf, sqlx::migrate::MigrateError),
    /// A store URL that names no backend Cairn has, or is malformed.
    #[error("invalid store URL {0:?}: {1}")]
    Url(String, String),
    /// A database server that could not be reached or refused the
    /// connection; the URL is shown without its password.
    #[error("cannot connect to task database {0}: {1}")]
    Connect(String, sqlx::Error),
    #[error("cannot migrate task database {0}: {1}")]
    MigrateServer(String, sqlx::migrate::MigrateError),
    #[error("task database, {0}: {1}")]
    Query(&'static str, sqlx::Error),
    #[error("unknown task {0:?} (see `cairn task list`)")]
    UnknownTask(String),
    #[error("unknown snapshot {0:?} (see `cairn snapshot list TASK`)")]
    UnknownSnapshot(String),
    #[error("unknown wait {0:?}")]
    UnknownWait(String),
    #[error("task {0} is already waiting; one wait at a time (see `cairn task show`)")]
    WaitPending(String),
    #[error("a task named {0:?} already exists")]
    NameTaken(String),
    /// An API key of that name exists already (names are how people pick
    /// a key out, to revoke it).
    #[error("an API key named {0:?} exists already")]
    KeyNameTaken(String),
    /// A compare-and-set found the task in another state than the caller
    /// read: someone else moved it meanwhile.
    #[error("task {task} is {found}, no longer {expected}; it cannot {action}")]
    StateChanged { task: String, expected: cairn_core::TaskState, found: cairn_core::TaskState, action: &'static str },
    /// Not a transition of the table (`TaskState::apply`).
    #[error("task {task} is {from}; it cannot {action}")]
    Transition { task: String, from: cairn_core::TaskState, action: &'static str },
    /// A write by a node whose lease on the task was taken over by another
    /// node (it stalled past its expiry): fenced off.
    #[error("node {node} no longer holds the lease of task {task}{}; its write was refused", holder.as_deref().map(|h| format!(" (held by {h})")).unwrap_or_default())]
    LeaseLost { task: String, node: String, holder: Option<String> },
    /// A state change or sandbox record for a task whose lease another
    /// node holds.
    #[error("task {task} runs on node {node}")]
    Leased { task: String, node: String },
    #[error("task database holds a malformed {0}: {1}")]
    Corrupt(&'static str, String),
    /// Asked of a backend that does not do it; the message says what to
    /// use instead.
    #[error("{0}")]
    Unsupported(&'static str),
}
