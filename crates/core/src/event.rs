use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::TaskId;

/// What an event-log entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Create,
    SandboxStart,
    Exec,
    Cp,
    Destroy,
    SandboxLost,
    Snapshot,
    Rollback,
    Fork,
    SnapshotExpired,
    ServiceStart,
    Wait,
    EventReceived,
    Suspend,
    Wake,
    Recovered,
    /// One egress connection attempt through the proxy, allowed or not.
    Egress,
    /// The task's egress policy changed.
    PolicyUpdate,
    /// Deliverables stored with a signed record.
    Delivery,
    /// The task completed: its sandbox is gone, its records stay.
    Complete,
    /// When the task ends by itself was set or changed.
    Deadline,
    /// A request to one of the task's ports through the daemon.
    Port,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Create => "create",
            EventKind::SandboxStart => "sandbox_start",
            EventKind::Exec => "exec",
            EventKind::Cp => "cp",
            EventKind::Destroy => "destroy",
            EventKind::SandboxLost => "sandbox_lost",
            EventKind::Snapshot => "snapshot",
            EventKind::Rollback => "rollback",
            EventKind::Fork => "fork",
            EventKind::SnapshotExpired => "snapshot_expired",
            EventKind::ServiceStart => "service_start",
            EventKind::Wait => "wait",
            EventKind::EventReceived => "event_received",
            EventKind::Suspend => "suspend",
            EventKind::Wake => "wake",
            EventKind::Recovered => "recovered",
            EventKind::Egress => "egress",
            EventKind::PolicyUpdate => "policy_update",
            EventKind::Delivery => "delivery",
            EventKind::Complete => "complete",
            EventKind::Deadline => "deadline",
            EventKind::Port => "port",
        }
    }
}

impl FromStr for EventKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        use EventKind::*;
        [Create, SandboxStart, Exec, Cp, Destroy, SandboxLost, Snapshot, Rollback, Fork, SnapshotExpired, ServiceStart, Wait, EventReceived, Suspend, Wake, Recovered, Egress, PolicyUpdate, Delivery, Complete, Deadline, Port]
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown event kind {s:?}"))
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An entry to append to a task's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewEvent {
    pub task: TaskId,
    pub kind: EventKind,
    /// Who asked for it (`cli:alice`, `api`, `daemon`).
    pub actor: String,
    /// The arguments of the request, as given.
    pub args: serde_json::Value,
    pub exit_code: Option<i32>,
    pub duration_ms: Option<u64>,
}

/// A stored event-log entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    /// Position in the task's log, from 1, without gaps.
    pub seq: u64,
    pub task: TaskId,
    pub time_ms: i64,
    pub kind: EventKind,
    pub actor: String,
    pub args: serde_json::Value,
    pub exit_code: Option<i32>,
    pub duration_ms: Option<u64>,
    /// The hash of the entry before it in the task's ledger (64 zeros for
    /// the first); absent in logs written before the ledger.
    #[serde(default)]
    pub prev_hash: Option<String>,
    /// This entry's hash, chaining it to `prev_hash` (see `cairn-ledger`).
    #[serde(default)]
    pub hash: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [(EventKind, &str); 22] = [
        (EventKind::Create, "create"),
        (EventKind::SandboxStart, "sandbox_start"),
        (EventKind::Exec, "exec"),
        (EventKind::Cp, "cp"),
        (EventKind::Destroy, "destroy"),
        (EventKind::SandboxLost, "sandbox_lost"),
        (EventKind::Snapshot, "snapshot"),
        (EventKind::Rollback, "rollback"),
        (EventKind::Fork, "fork"),
        (EventKind::SnapshotExpired, "snapshot_expired"),
        (EventKind::ServiceStart, "service_start"),
        (EventKind::Wait, "wait"),
        (EventKind::EventReceived, "event_received"),
        (EventKind::Suspend, "suspend"),
        (EventKind::Wake, "wake"),
        (EventKind::Recovered, "recovered"),
        (EventKind::Egress, "egress"),
        (EventKind::PolicyUpdate, "policy_update"),
        (EventKind::Delivery, "delivery"),
        (EventKind::Complete, "complete"),
        (EventKind::Deadline, "deadline"),
        (EventKind::Port, "port"),
    ];

    #[test]
    fn event_kinds_have_one_name_in_text_and_json() {
        for (kind, name) in ALL {
            assert_eq!((kind.as_str(), kind.to_string()), (name, name.to_owned()));
            assert_eq!(name.parse::<EventKind>(), Ok(kind));
            assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::json!(name), "the stored name is the JSON name");
        }
        assert_eq!("Exec".parse::<EventKind>(), Err("unknown event kind \"Exec\"".to_owned()));
        assert_eq!("".parse::<EventKind>(), Err("unknown event kind \"\"".to_owned()));
    }
}
