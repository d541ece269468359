//! Deliveries: deliverables out of a task, and the signed record.

use cairn_core::TaskId;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// Body of `POST /v1/tasks/{id}/deliveries`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliverRequest {
    #[serde(default)]
    pub files: Vec<String>,
    /// A directory, delivered as `NAME.tar.zst`.
    pub archive: Option<String>,
    /// A unified diff of the workspace.
    #[serde(default)]
    pub patch: bool,
    pub report: Option<String>,
    /// Then complete the task: sandbox and scratch space go.
    #[serde(default)]
    pub complete: bool,
}

/// One deliverable as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Deliverable {
    /// Its file name in the record and in `--out`.
    pub name: String,
    /// `file`, `archive`, `patch` or `report`.
    pub kind: String,
    /// Where it came from in the sandbox.
    pub source: String,
    pub sha256: String,
    pub size: u64,
}

/// The answer of a delivery.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryView {
    pub task: TaskId,
    /// SHA-256 of the record's bytes, its key in the blob store.
    pub record_id: String,
    /// The DSSE envelope, as stored.
    pub record: Value,
    pub deliverables: Vec<Deliverable>,
    pub ledger_seq: u64,
    pub ledger_head: String,
    pub completed: bool,
}

/// A stored delivery record checked by the daemon, as `cairn verify`
/// checks one: its signature with the cluster's keys, each deliverable's
/// bytes in the store against its digest, the signed checkpoint inside
/// it, and the task's live ledger at that entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordVerdict {
    pub record: String,
    /// Every check passed.
    pub verified: bool,
    /// The first check that failed, in one line.
    pub problem: Option<String>,
    /// What the record names (`None` when it could not be opened).
    pub task: Option<String>,
    pub key_id: Option<String>,
    /// Each deliverable's name and SHA-256.
    pub deliverables: Vec<(String, String)>,
    pub ledger_seq: Option<u64>,
    pub ledger_head: Option<String>,
    /// The record's signed predicate.
    pub predicate: Option<Value>,
}
