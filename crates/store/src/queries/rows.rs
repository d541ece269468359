//! The rows of the store's tables as the queries read them, declared once
//! for every backend (`sqlx::FromRow` reads them by column name from any
//! database's rows), and the values they stand for. A row that does not
//! parse is [`Error::Corrupt`], naming what.

use std::str::FromStr;

use cairn_core::{Event, EventKind, EventSource, InboxEvent, SandboxState, Snapshot, SnapshotKind, Task, TaskState, Wait};
use cairn_ledger::{Checkpoint, SignedCheckpoint};

use crate::{Error, Lease, Result, SandboxRow};

fn parse<T: FromStr>(what: &'static str, text: String) -> Result<T> {
    text.parse().map_err(|_| Error::Corrupt(what, text))
}

/// Parses the JSON text of a column (`json!("what", text)`).
macro_rules! json {
    ($what:literal, $text:expr) => {
        serde_json::from_str($text).map_err(|e| Error::Corrupt($what, e.to_string()))
    };
}

/// A row of `tasks` (`SELECT *`).
#[derive(sqlx::FromRow)]
pub(crate) struct TaskRow {
    id: String,
    name: Option<String>,
    state: String,
    config: String,
    step: i64,
    memory: String,
    created_ms: i64,
    last_activity_ms: i64,
    sandbox_state: String,
    sandbox_note: Option<String>,
    recovery_note: Option<String>,
    webhook_secret: Option<String>,
    node: Option<String>,
    rollback_note: Option<String>,
}

impl TaskRow {
    pub(crate) fn parse(self) -> Result<Task> {
        Ok(Task {
            id: parse("task id", self.id)?,
            name: self.name,
            state: TaskState::from_str(&self.state).map_err(|e| Error::Corrupt("task state", e))?,
            config: json!("task config", &self.config)?,
            step: self.step as u64,
            memory: self.memory,
            created_ms: self.created_ms,
            last_activity_ms: self.last_activity_ms,
            sandbox: SandboxState::from_str(&self.sandbox_state).map_err(|e| Error::Corrupt("sandbox state", e))?,
            sandbox_note: self.sandbox_note,
            recovery_note: self.recovery_note,
            webhook_secret: self.webhook_secret,
            node: self.node,
            rollback_note: self.rollback_note.map(|n| json!("rollback note", &n)).transpose()?,
        })
    }
}

/// A task's state as stored (`SELECT state`).
pub(crate) fn task_state(state: String) -> Result<TaskState> {
    state.parse().map_err(|e| Error::Corrupt("task state", e))
}

/// A row of `events` (`SELECT *`).
#[derive(sqlx::FromRow)]
pub(crate) struct EventRow {
    task_id: String,
    seq: i64,
    time_ms: i64,
    kind: String,
    actor: String,
    args: String,
    exit_code: Option<i32>,
    duration_ms: Option<i64>,
    prev_hash: Option<String>,
    hash: Option<String>,
}

impl EventRow {
    pub(crate) fn parse(self) -> Result<Event> {
        Ok(Event {
            seq: self.seq as u64,
            task: parse("event task id", self.task_id)?,
            time_ms: self.time_ms,
            kind: EventKind::from_str(&self.kind).map_err(|e| Error::Corrupt("event kind", e))?,
            actor: self.actor,
            args: json!("event args", &self.args)?,
            exit_code: self.exit_code,
            duration_ms: self.duration_ms.map(|d| d as u64),
            prev_hash: self.prev_hash,
            hash: self.hash,
        })
    }
}

/// A row of `sandboxes` (`SELECT *`).
#[derive(sqlx::FromRow)]
pub(crate) struct SandboxDbRow {
    task_id: String,
    uid_slot: i64,
    init_pid: Option<i32>,
    init_start_time: Option<i64>,
    started_ms: i64,
}

impl SandboxDbRow {
    pub(crate) fn parse(self) -> Result<SandboxRow> {
        Ok(SandboxRow {
            task: parse("sandbox task id", self.task_id)?,
            uid_slot: self.uid_slot as u32,
            init_pid: self.init_pid,
            init_start_time: self.init_start_time.map(|v| v as u64),
            started_ms: self.started_ms,
        })
    }
}

/// A row of `snapshots` (`SELECT *`).
#[derive(sqlx::FromRow)]
pub(crate) struct SnapshotRow {
    id: String,
    task_id: String,
    parent: Option<String>,
    kind: String,
    note: String,
    healthy: bool,
    step: i64,
    memory: String,
    with_memory: bool,
    config: String,
    manifest: String,
    files: i64,
    bytes: i64,
    added_bytes: i64,
    freeze_ms: f64,
    duration_ms: f64,
    created_ms: i64,
}

impl SnapshotRow {
    pub(crate) fn parse(self) -> Result<Snapshot> {
        Ok(Snapshot {
            id: parse("snapshot id", self.id)?,
            task: parse("snapshot task id", self.task_id)?,
            parent: self.parent.map(|p| parse("snapshot parent", p)).transpose()?,
            kind: SnapshotKind::from_str(&self.kind).map_err(|e| Error::Corrupt("snapshot kind", e.to_string()))?,
            note: self.note,
            healthy: self.healthy,
            step: self.step as u64,
            memory: self.memory,
            with_memory: self.with_memory,
            config: json!("snapshot config", &self.config)?,
            manifest: self.manifest,
            files: self.files as u64,
            bytes: self.bytes as u64,
            added_bytes: self.added_bytes as u64,
            freeze_ms: self.freeze_ms,
            duration_ms: self.duration_ms,
            created_ms: self.created_ms,
        })
    }
}

/// A row of `waits` (`SELECT *`).
#[derive(sqlx::FromRow)]
pub(crate) struct WaitRow {
    id: String,
    task_id: String,
    what: String,
    created_ms: i64,
    satisfied_ms: Option<i64>,
    event_id: Option<String>,
    cancelled_ms: Option<i64>,
}

impl WaitRow {
    pub(crate) fn parse(self) -> Result<Wait> {
        Ok(Wait {
            id: parse("wait id", self.id)?,
            task: parse("wait task id", self.task_id)?,
            what: json!("wait", &self.what)?,
            created_ms: self.created_ms,
            satisfied_ms: self.satisfied_ms,
            event: self.event_id.map(|e| parse("wait event id", e)).transpose()?,
            cancelled_ms: self.cancelled_ms,
        })
    }
}

/// A row of `inbox` (`SELECT *`).
#[derive(sqlx::FromRow)]
pub(crate) struct InboxRow {
    id: String,
    task_id: String,
    source: String,
    name: String,
    delivery: Option<String>,
    data: String,
    received_ms: i64,
    wait_id: Option<String>,
}

impl InboxRow {
    pub(crate) fn parse(self) -> Result<InboxEvent> {
        Ok(InboxEvent {
            id: parse("event id", self.id)?,
            task: parse("event task id", self.task_id)?,
            source: EventSource::from_str(&self.source).map_err(|e| Error::Corrupt("event source", e))?,
            name: self.name,
            delivery: self.delivery,
            data: json!("event data", &self.data)?,
            received_ms: self.received_ms,
            wait: self.wait_id.map(|w| parse("event wait id", w)).transpose()?,
        })
    }
}

/// A row of `checkpoints` (`SELECT *`).
#[derive(sqlx::FromRow)]
pub(crate) struct CheckpointRow {
    task_id: String,
    seq: i64,
    head: String,
    time_ms: i64,
    key_id: String,
    envelope: String,
}

impl CheckpointRow {
    pub(crate) fn parse(self) -> Result<SignedCheckpoint> {
        Ok(SignedCheckpoint {
            checkpoint: Checkpoint { task: self.task_id, seq: self.seq as u64, head: self.head, time_ms: self.time_ms, key_id: self.key_id },
            envelope: json!("checkpoint envelope", &self.envelope)?,
        })
    }
}

/// A task's lease columns (`Dialect::LOCK_LEASE`).
#[derive(sqlx::FromRow)]
pub(crate) struct LeaseRow {
    id: String,
    lease_node: Option<String>,
    lease_token: i64,
    lease_expires_ms: Option<i64>,
    last_node: Option<String>,
}

impl LeaseRow {
    pub(crate) fn parse(self) -> Result<Lease> {
        Ok(Lease {
            task: parse("task id", self.id)?,
            node: self.lease_node,
            token: self.lease_token as u64,
            expires_ms: self.lease_expires_ms,
            last_node: self.last_node,
        })
    }
}
