//! Cairn's engine: the task lifecycle over a sandbox driver and a store. It
//! knows nothing of HTTP; the daemon's front end (`cairn-server`) parses a
//! request, calls one [`Runtime`] method and maps its [`Error`] to a status.
//!
//! The engine and what every operation shares:
//! - [`runtime`]: the [`Runtime`] (store, driver, blob store, keys) and the
//!   per-task cells (`cell.rs`: lock, live sandbox, busy count, progress,
//!   baseline, egress proxy, change channel).
//! - `materialise.rs`: restore a snapshot into a fresh sandbox and start it,
//!   with a named policy for a failed restore (wake, recovery, rollback, fork).
//! - `slots.rs`: uid slots, claimed in the store and reserved on the host.
//! - `driver.rs`: the sandbox driver as the async engine calls it (the
//!   one place its blocking calls go to the blocking pool).
//! - `images.rs`: the images part (the image store, pulls, the fork bases'
//!   lock), with its own state and `impl`.
//! - `wakes.rs`: the wake scheduler (deduplicated, a bounded number at once).
//! - [`admission`]: the bounds on commands and event streams held open at
//!   once, per task and per daemon (past one: 429), and the descriptor
//!   limit they must fit in.
//! - [`home`] and [`config`]: the data directory and the daemon's settings.
//! - [`api_keys`]: keys of the E2B-compatible API, and sandbox access tokens.
//!
//! One module per operation:
//! - [`lifecycle`]: create, start, destroy, reconcile after a restart.
//! - [`exec`] and [`files`]: commands and tar streams in a live sandbox;
//!   [`processes`]: commands in the background, with handles; [`ports`]:
//!   a task's listening ports reached through the daemon; [`watchers`]:
//!   directory watches by the sandbox's own inotify.
//! - [`snapshot`], [`rollback`], [`fork`], [`gc`]: snapshots and what is
//!   made from them; retention, mark and sweep, check.
//! - [`backup`]: the node's store, blob store and keys as one tar stream
//!   made while it runs, and that stream restored into a new home.
//! - [`template`]: images committed from a task's writable layer, and the
//!   hidden base a fork's tasks share.
//! - [`suspend`], [`wake`]: compute goes away and comes back; recovery.
//! - [`deadline`]: tasks that end by themselves at a time (E2B's timeout).
//! - [`waits`] and [`intake`]: waits, and the events that satisfy them
//!   (webhooks verified on plain bytes, approvals, operator events, timers).
//! - [`egress`]: each live sandbox's allowlist proxy and its decision log;
//!   [`secrets`]: credentials it may inject, sealed at rest.
//! - [`deliver`] and [`ledger`]: deliverables, signed delivery records, the
//!   hash-chained event log and the node's signing keys.
//! - [`gateway`]: webhook signatures and signed approval links.
//! - [`notify`]: hooks the operator configures and the sender that posts
//!   each event they take, from the store's durable outbox.
//! - `queries.rs`: reads for the front end, one per request.
//! - [`metrics`]: Prometheus metrics, counted as the runtime works.

pub mod admission;
pub mod api_keys;
pub mod backup;
mod blob_hold;
mod cell;
pub mod config;
#[cfg(feature = "failpoints")]
mod crash_points;
pub mod deadline;
mod defaults;
pub mod deliver;
mod driver;
pub mod egress;
mod error;
pub mod exec;
pub mod files;
pub mod fork;
pub mod gateway;
pub mod gc;
pub mod intercept;
pub mod home;
mod images;
pub mod intake;
pub mod lease;
pub mod ledger;
pub mod lifecycle;
mod materialise;
pub mod metrics;
pub mod nodes;
pub mod notify;
pub mod ports;
pub mod processes;
pub mod pull;
mod queries;
mod reaper;
pub mod rollback;
pub mod run;
pub mod secrets;
pub mod runtime;
mod services;
mod slots;
pub mod snapshot;
pub mod suspend;
pub mod template;
pub mod waits;
pub mod wake;
mod wakes;
pub mod watchers;

pub use config::Config;
pub use error::{Error, Result};
pub use home::Home;
pub use queries::{Health, LinkedWait, LiveOutput, LiveOutputItem};
pub use runtime::Runtime;

/// Errors that stop the runtime from opening.
///
/// Each message names its cause once, also in an error chain (`{:#}`):
/// wrapped errors are `transparent`, and those with a prefix keep the cause
/// in the message only (no `source`), so that it is not printed twice.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Home(#[from] home::HomeError),
    #[error(transparent)]
    Store(#[from] cairn_store::Error),
    #[error(transparent)]
    Sandbox(#[from] cairn_sandbox::Error),
    #[error("blob store: {0}")]
    Blob(cairn_blob::Error),
    #[error("signing keys: {0}")]
    Keys(cairn_ledger::Error),
    #[error("config: {0}")]
    Config(String),
}

impl From<cairn_blob::Error> for OpenError {
    fn from(e: cairn_blob::Error) -> Self {
        OpenError::Blob(e)
    }
}

impl From<cairn_ledger::Error> for OpenError {
    fn from(e: cairn_ledger::Error) -> Self {
        OpenError::Keys(e)
    }
}

/// Arms the crash point named by `CAIRN_CRASH_AT` (test builds only).
pub fn arm_crash_points_from_env() {
    #[cfg(feature = "failpoints")]
    crash_points::arm_from_env();
}
