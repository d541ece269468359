//! What the tools answer about tasks and snapshots: compact views an agent
//! reads in its context window. They leave out what an agent has no use
//! for and should not see: the task's webhook secret, its environment's
//! values, the sandbox's host pid and uids, a snapshot's copy of the
//! task's configuration.

use std::collections::BTreeMap;

use cairn_api::tasks::{LimitsView, TaskView};
use cairn_api::waits::WaitView;
use cairn_core::{Isolation, RollbackNote, Snapshot, SnapshotId, SnapshotKind, TaskId, TaskState};
use serde::Serialize;

/// A task as the tools answer it.
#[derive(Debug, Serialize)]
pub struct TaskSummary {
    pub id: TaskId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub state: TaskState,
    pub step: u64,
    pub image: String,
    pub isolation: Isolation,
    /// Where commands run and relative paths start.
    pub workdir: String,
    pub limits: LimitsView,
    /// The names of the task's environment variables (values left out).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    pub created_ms: i64,
    pub last_activity_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollback_note: Option<RollbackNote>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_note: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_note: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_wait: Option<WaitView>,
}

impl From<TaskView> for TaskSummary {
    fn from(view: TaskView) -> TaskSummary {
        let task = view.task;
        TaskSummary {
            id: task.id,
            name: task.name,
            state: task.state,
            step: task.step,
            image: task.config.image,
            isolation: task.config.isolation,
            workdir: task.config.workdir,
            limits: view.limits,
            env: task.config.env.into_iter().map(|v| v.key).collect(),
            metadata: task.config.metadata,
            created_ms: task.created_ms,
            last_activity_ms: task.last_activity_ms,
            node: task.node,
            rollback_note: task.rollback_note,
            recovery_note: task.recovery_note,
            sandbox_note: task.sandbox_note,
            pending_wait: view.pending_wait,
        }
    }
}

/// A snapshot as the tools answer it.
#[derive(Debug, Serialize)]
pub struct SnapshotSummary {
    pub id: SnapshotId,
    pub kind: SnapshotKind,
    pub note: String,
    pub healthy: bool,
    pub step: u64,
    /// It holds the sandbox's running processes and their memory.
    pub with_memory: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<SnapshotId>,
    pub files: u64,
    pub bytes: u64,
    pub created_ms: i64,
}

impl From<Snapshot> for SnapshotSummary {
    fn from(s: Snapshot) -> SnapshotSummary {
        SnapshotSummary {
            id: s.id,
            kind: s.kind,
            note: s.note,
            healthy: s.healthy,
            step: s.step,
            with_memory: s.with_memory,
            parent: s.parent,
            files: s.files,
            bytes: s.bytes,
            created_ms: s.created_ms,
        }
    }
}
