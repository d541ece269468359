//! Cairn's domain: what a task is, which states it moves through, the limits
//! and configuration it carries, and the events its log records.
//!
//! This crate does no I/O. Every other crate speaks in these types, so the
//! rules that must hold everywhere (valid ids, legal state transitions,
//! well-formed limits) are written once, here.

mod error;
mod event;
mod id;
mod limits;
pub mod name;
mod risk;
mod snapshot;
mod state;
mod task;
mod wait;

pub use error::Error;
pub use event::{Event, EventKind, NewEvent};
pub use id::TaskId;
pub use limits::{parse_bytes, parse_duration, Bytes, Limits};
pub use risk::{RiskPolicy, DEFAULT_RISK_PATTERNS};
pub use snapshot::{Retention, RollbackNote, Snapshot, SnapshotId, SnapshotKind, MEMORY_LAYER, MEMORY_LAYER_AT};
pub use wait::{check_event_name, EventSource, InboxEvent, InboxId, Wait, WaitFor, WaitId};
pub use state::{SandboxState, TaskState, Transition};
pub use task::{
    check_image_name, check_name, check_user, check_workdir, EgressRules, EnvVar, ExecExit, ImageDefaults, Isolation, Task,
    TaskConfig, DEFAULT_IMAGE, DEFAULT_WORKDIR,
};
