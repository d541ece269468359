//! Snapshots, rollback, forks, gc and check.

use serde::{Deserialize, Serialize};

/// Body of `POST /v1/tasks/{id}/snapshots`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    pub kind: Option<String>,
    pub note: Option<String>,
    /// Also becomes the task's memory summary.
    pub memory: Option<String>,
    pub healthy: Option<bool>,
}

/// Body of `POST /v1/tasks/{id}/rollback`: exactly one of `to` and
/// `last_healthy`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    pub to: Option<String>,
    #[serde(default)]
    pub last_healthy: bool,
    pub reason: String,
}

/// Body of `POST /v1/tasks/{id}/fork`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    pub from: Option<String>,
    pub count: Option<u32>,
}

/// Body of `POST /v1/gc`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GcRequest {
    #[serde(default)]
    pub dry_run: bool,
    /// Overrides the configured grace period (e.g. `0s` in tests).
    pub grace: Option<String>,
}

/// Body of `POST /v1/check`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    /// Also read and hash every pack, not only list them.
    #[serde(default)]
    pub read_data: bool,
}

/// A long operation in progress on a task, for `GET /v1/tasks/{id}/progress`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpProgress {
    /// `snapshot`, `restore`, `rollback` or `fork`.
    pub op: String,
    pub phase: String,
    pub files_done: u64,
    pub files_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub elapsed_ms: u64,
}
