//! The wire model of Cairn's HTTP API, shared by the daemon (which
//! deserialises requests and serialises answers) and the CLI (the other
//! way round): one module per group of routes, the error body with its
//! stable machine-readable codes, and the exec protocol's frames. Serde
//! types and their OpenAPI schemas (`utoipa::ToSchema`, which the daemon's
//! `/v1/openapi.json` is built from) only: no HTTP, no I/O.

pub mod api_keys;
pub mod deliver;
pub mod egress;
pub mod error;
pub mod exec;
pub mod files;
pub mod health;
pub mod hooks;
pub mod images;
pub mod ledger;
pub mod nodes;
pub mod processes;
pub mod secrets;
pub mod snapshots;
pub mod tasks;
pub mod waits;

pub use error::{ErrorBody, ErrorCode, ErrorDetail};

/// What travels on the wire as core defines it (a task's events, its
/// snapshots, an inbox event, a command's exit) and how the wire writes a
/// duration: re-exported, so that the daemon's HTTP front end needs no
/// crate below the runtime but this one.
pub use cairn_core::{parse_duration, Event, EventKind, ExecExit, InboxEvent, Snapshot, TaskState, WaitFor};

/// Checks an answer type against the JSON the daemon sends: `value`
/// serialises to an object with exactly the top-level `fields`, and reads
/// back equal.
#[cfg(test)]
pub(crate) fn assert_wire_shape<T>(value: &T, fields: &[&str])
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let json = serde_json::to_value(value).unwrap_or_default();
    let mut keys: Vec<&str> = json.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
    let mut want = fields.to_vec();
    keys.sort_unstable();
    want.sort_unstable();
    assert_eq!(keys, want, "the fields of {}", std::any::type_name::<T>());
    assert_eq!(serde_json::from_value::<T>(json).ok().as_ref(), Some(value), "{} reads back as written", std::any::type_name::<T>());
}
