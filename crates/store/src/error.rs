use std::path::PathBuf;

use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum Error {
    #[error("cannot open task database {0}: {1}")]
    Open(PathBuf, sqlx::Error),
    #[error("cannot migrate task database {0}: {1}")]
    Migrate(PathBuf, sqlx::migrate::MigrateError),
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
    #[error("task database holds a malformed {0}: {1}")]
    Corrupt(&'static str, String),
}
