//! Cairn's engine: the task lifecycle over a sandbox driver and a store. It
//! knows nothing of HTTP; the daemon's front end (`cairn-server`) parses a
//! request, calls one [`Runtime`] method and maps its [`Error`] to a status.
//!
//! - [`home`] and [`config`]: the data directory and the daemon's settings.
//! - [`tasks`]: the [`Runtime`] itself; create, start, destroy, reconcile.
//! - [`exec`] and [`files`]: commands and tar streams in a live sandbox.
//! - [`snapshots`]: snapshots, rollback in place, forks, retention, check, gc.
//! - [`suspend`] and [`waits`]: waits, suspend, wake, recovery, timers,
//!   event intake (webhooks verified on plain bytes, approvals, operator events).
//! - [`egress`]: each live sandbox's allowlist proxy and its decision log.
//! - [`deliver`] and [`ledger`]: deliverables, signed delivery records, the
//!   hash-chained event log and the node's signing keys.
//! - [`gateway`]: webhook signatures and signed approval links.

mod cell;
pub mod config;
#[cfg(feature = "failpoints")]
mod crash_points;
pub mod deliver;
pub mod egress;
mod error;
pub mod exec;
pub mod files;
pub mod gateway;
pub mod home;
pub mod ledger;
mod reaper;
mod materialise;
mod queries;
mod services;
mod slots;
pub mod snapshots;
mod suspend;
pub mod tasks;
pub mod waits;
mod wakes;

pub use config::Config;
pub use error::{Error, Result};
pub use home::Home;
pub use queries::{Health, LinkedWait};
pub use tasks::Runtime;

/// Errors that stop the runtime from opening.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Home(#[from] home::HomeError),
    #[error("{0}")]
    Store(#[from] cairn_store::Error),
    #[error("{0}")]
    Sandbox(#[from] cairn_sandbox::Error),
    #[error("blob store: {0}")]
    Blob(#[from] cairn_blob::Error),
    #[error("signing keys: {0}")]
    Keys(#[from] cairn_ledger::Error),
    #[error("config: {0}")]
    Config(String),
}

/// Arms the crash point named by `CAIRN_CRASH_AT` (test builds only).
pub fn arm_crash_points_from_env() {
    #[cfg(feature = "failpoints")]
    crash_points::arm_from_env();
}
