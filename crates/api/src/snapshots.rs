//! Snapshots, rollback, forks, gc and check.

use cairn_core::{RollbackNote, SnapshotId, SnapshotKind, TaskId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

// The engine's own reports are the wire's: one definition each, with its
// schema (their crates' `schema` feature).
pub use cairn_blob::{CheckReport, GcReport};
pub use cairn_snapshot::{Diff, RestoreStats};

/// Body of `POST /v1/tasks/{id}/snapshots`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    pub kind: Option<String>,
    pub note: Option<String>,
    /// Also becomes the task's memory summary.
    pub memory: Option<String>,
    pub healthy: Option<bool>,
    /// Also checkpoint the sandbox's processes and memory (gvisor tasks):
    /// a rollback to the snapshot or a fork from it continues them. The
    /// sandbox is restored from the checkpoint at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub with_memory: bool,
}

/// Body of `POST /v1/tasks/{id}/rollback`: exactly one of `to` and
/// `last_healthy`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    pub to: Option<String>,
    #[serde(default)]
    pub last_healthy: bool,
    pub reason: String,
}

/// Body of `POST /v1/tasks/{id}/fork`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    pub from: Option<String>,
    pub count: Option<u32>,
}

/// Body of `POST /v1/gc`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GcRequest {
    #[serde(default)]
    pub dry_run: bool,
    /// Overrides the configured grace period (e.g. `0s` in tests).
    pub grace: Option<String>,
}

/// Body of `POST /v1/check`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    /// Also read and hash every pack, not only list them.
    #[serde(default)]
    pub read_data: bool,
}

/// A long operation in progress on a task, for `GET /v1/tasks/{id}/progress`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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

/// The answer of a rollback in place.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RollbackAnswer {
    /// The task, with the same id as before.
    pub task: TaskId,
    /// What the agent is told from now on: from where, to where, why.
    pub rollback_note: RollbackNote,
    /// The task's step counter now: the target snapshot's.
    pub step: u64,
    /// From the request to the restored sandbox running, in milliseconds.
    pub duration_ms: f64,
    /// What restoring the writable layer wrote and kept.
    pub restore: Option<RestoreStats>,
}

/// The answer of `POST /v1/gc`: what retention expired, then what the
/// mark and sweep freed (with `dry_run`: what they would).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GcAnswer {
    pub dry_run: bool,
    /// Unreferenced objects younger than this were kept.
    pub grace_ms: u64,
    pub expired_snapshots: Vec<ExpiredSnapshot>,
    pub report: GcReport,
    /// Deliverables no record names (left by a delivery cut short), by
    /// SHA-256.
    pub orphan_deliverables: Vec<String>,
    /// The hidden bases of forks whose tasks are all destroyed (not
    /// looked for in a dry run).
    #[serde(default)]
    pub fork_bases_removed: Vec<String>,
    /// Image layers no image uses any more (not looked for in a dry run).
    #[serde(default)]
    pub layers_removed: Vec<String>,
}

/// A snapshot whose record retention removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExpiredSnapshot {
    pub id: SnapshotId,
    pub task: TaskId,
    pub kind: SnapshotKind,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assert_wire_shape;

    #[test]
    fn answers_keep_the_daemons_field_names() {
        let diff = Diff { added: vec!["/workspace/new".into()], changed: vec!["/etc/hosts".into()], deleted: Vec::new() };
        assert_wire_shape(&diff, &["added", "changed", "deleted"]);

        let restore = RestoreStats { files_written: 3, bytes_written: 4096, files_kept: 7, entries_removed: 1, duration_ms: 12.5 };
        assert_wire_shape(&restore, &["files_written", "bytes_written", "files_kept", "entries_removed", "duration_ms"]);
        let note = RollbackNote { from: Some(SnapshotId::random()), to: SnapshotId::random(), from_step: 9, reason: "tests went red".into(), time_ms: 1, chosen: None };
        let rollback = RollbackAnswer { task: TaskId::random(), rollback_note: note, step: 4, duration_ms: 310.2, restore: Some(restore) };
        assert_wire_shape(&rollback, &["task", "rollback_note", "step", "duration_ms", "restore"]);
        let text = serde_json::to_value(&rollback).unwrap_or_default();
        assert_eq!(text["rollback_note"]["reason"], "tests went red");

        let report = GcReport { packs_deleted: 2, manifests_deleted: 1, index_files_rewritten: 1, bytes_freed: 1 << 20, kept_young: 0, packs_partly_live: 3, dry_run: true };
        assert_wire_shape(&report, &["packs_deleted", "manifests_deleted", "index_files_rewritten", "bytes_freed", "kept_young", "packs_partly_live", "dry_run"]);
        let expired = ExpiredSnapshot { id: SnapshotId::random(), task: TaskId::random(), kind: SnapshotKind::PreRisk };
        assert_wire_shape(&expired, &["id", "task", "kind"]);
        let gc = GcAnswer { dry_run: true, grace_ms: 3_600_000, expired_snapshots: vec![expired], report, orphan_deliverables: vec!["ab".repeat(32)], fork_bases_removed: vec![".fork-s2".into()], layers_removed: vec!["sha256:12".into()] };
        assert_wire_shape(&gc, &["dry_run", "grace_ms", "expired_snapshots", "report", "orphan_deliverables", "fork_bases_removed", "layers_removed"]);
        assert_eq!(serde_json::to_value(&gc).unwrap_or_default()["expired_snapshots"][0]["kind"], "pre-risk");

        let check = CheckReport { packs: 4, chunks: 90, manifests: 3, bytes_read: 0, chunks_verified: 0, problems: vec!["manifest 12ab: missing".into()] };
        assert_wire_shape(&check, &["packs", "chunks", "manifests", "bytes_read", "chunks_verified", "problems"]);
    }
}

/// One path of a diff between two snapshots, side by side: what each
/// snapshot's writable layers hold there, and a unified diff when both
/// are text small enough to read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    pub path: String,
    /// The path in snapshot `a`; `None` when its writable layers do not
    /// hold it (absent, or the image's own file).
    pub before: Option<FileSide>,
    pub after: Option<FileSide>,
    /// `--- a` / `+++ b` hunks, when both sides are text (or absent).
    pub text_diff: Option<String>,
}

/// What a snapshot holds at a path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSide {
    /// `file`, `dir`, `symlink`, `whiteout` (deleted), or another node.
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    /// BLAKE3 of the content, for a file small enough to read.
    pub blake3: Option<String>,
    /// A symlink's target.
    pub target: Option<String>,
}
