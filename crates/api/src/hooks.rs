//! Outgoing hooks: `/v1/outgoing-hooks`. The operator names a URL and the
//! events to send it; the daemon posts each event once it is in a task's
//! log, signed with the hook's secret, in order per task, retrying until
//! the receiver answers with a 2xx or the hook's time runs out. (Incoming
//! webhooks, which satisfy a task's wait, are `/v1/hooks/{task}/{name}`.)

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use cairn_core::EventKind;

/// How a notification is shaped and signed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HookFormat {
    /// Standard Webhooks: `{"type", "timestamp", "data"}`, signed with
    /// `webhook-id`, `webhook-timestamp` and `webhook-signature` (HMAC-SHA256
    /// under a `whsec_` secret).
    #[default]
    Standard,
    /// E2B's sandbox lifecycle webhooks: `{"version": "v2", "id", "type":
    /// "sandbox.lifecycle.*", "eventData", "sandboxId", ...}`, signed with
    /// `e2b-signature` (unpadded base64 of SHA-256 over the secret and the body).
    E2b,
}

impl HookFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            HookFormat::Standard => "standard",
            HookFormat::E2b => "e2b",
        }
    }

    pub fn parse(s: &str) -> Option<HookFormat> {
        match s {
            "standard" => Some(HookFormat::Standard),
            "e2b" => Some(HookFormat::E2b),
            _ => None,
        }
    }

    /// The event types of this format and the log entries each stands for.
    pub fn events(self) -> &'static [(&'static str, &'static [EventKind])] {
        match self {
            HookFormat::Standard => STANDARD_EVENTS,
            HookFormat::E2b => E2B_EVENTS,
        }
    }

    /// The event type a log entry of `kind` is sent as, if this format has one.
    pub fn event_type(self, kind: EventKind) -> Option<&'static str> {
        self.events().iter().find(|(_, kinds)| kinds.contains(&kind)).map(|(name, _)| *name)
    }

    /// The log entries the event types `names` stand for (every type of the
    /// format when `names` is empty), or the first name it does not have.
    pub fn kinds_of(self, names: &[String]) -> Result<Vec<EventKind>, String> {
        let mut kinds = Vec::new();
        let all: Vec<&str> = self.events().iter().map(|(n, _)| *n).collect();
        let wanted: Vec<&str> = if names.is_empty() { all } else { names.iter().map(String::as_str).collect() };
        for name in wanted {
            let (_, of) = self.events().iter().find(|(n, _)| *n == name).ok_or_else(|| name.to_owned())?;
            for kind in of.iter() {
                if !kinds.contains(kind) {
                    kinds.push(*kind);
                }
            }
        }
        Ok(kinds)
    }
}

/// Cairn's own event types (the `standard` format) and the log entries
/// they are sent for.
pub const STANDARD_EVENTS: &[(&str, &[EventKind])] = &[
    ("task.created", &[EventKind::Create]),
    ("task.waiting", &[EventKind::Wait]),
    ("task.woken", &[EventKind::Wake]),
    ("task.suspended", &[EventKind::Suspend]),
    ("task.rolled_back", &[EventKind::Rollback]),
    ("task.command_finished", &[EventKind::Exec]),
    ("task.snapshotted", &[EventKind::Snapshot]),
    ("task.delivered", &[EventKind::Delivery]),
    ("task.failed", &[EventKind::SandboxLost]),
    ("task.completed", &[EventKind::Complete]),
    ("task.destroyed", &[EventKind::Destroy]),
];

/// E2B's lifecycle event types (the `e2b` format) and the log entries
/// they are sent for.
pub const E2B_EVENTS: &[(&str, &[EventKind])] = &[
    ("sandbox.lifecycle.created", &[EventKind::Create]),
    ("sandbox.lifecycle.killed", &[EventKind::Destroy, EventKind::Complete]),
    ("sandbox.lifecycle.paused", &[EventKind::Suspend]),
    ("sandbox.lifecycle.resumed", &[EventKind::Wake]),
    ("sandbox.lifecycle.updated", &[EventKind::PolicyUpdate, EventKind::Deadline]),
    ("sandbox.lifecycle.checkpointed", &[EventKind::Snapshot]),
];

/// `POST /v1/outgoing-hooks`: a new hook.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewHook {
    /// Where notifications are posted (`http://` or `https://`).
    pub url: String,
    /// The event types to send (the format's names); none: every one.
    #[serde(default)]
    pub events: Vec<String>,
    /// Only this task's events (id or name); none: every task's.
    #[serde(default)]
    pub task: Option<String>,
    #[serde(default)]
    pub format: HookFormat,
    /// The signing secret; none: a new one (`whsec_...`), answered once.
    #[serde(default)]
    pub secret: Option<String>,
}

/// A hook as listed: never its secret.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct HookView {
    pub id: String,
    pub url: String,
    /// The event types it sends.
    pub events: Vec<String>,
    /// The task whose events it sends; none: every task's.
    pub task: Option<String>,
    pub format: HookFormat,
    /// Unix time in milliseconds.
    pub created_ms: i64,
    /// Notifications the receiver answered with a 2xx.
    pub sent: i64,
    pub last_sent_ms: Option<i64>,
    /// Notifications not yet answered with a 2xx (retried with backoff).
    pub pending: i64,
    /// Notifications given up on (kept until the hook is removed).
    pub failed: i64,
    /// The latest failed attempt's error.
    pub last_error: Option<String>,
}

/// The answer to a new hook: the hook and its secret, which no later
/// answer holds.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct CreatedHook {
    pub hook: HookView,
    pub secret: String,
}

/// A notification still in a hook's outbox.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct NotificationView {
    pub task: String,
    /// The event's number in the task's log.
    pub seq: u64,
    /// `pending` or `failed`.
    pub state: String,
    pub attempts: i64,
    pub created_ms: i64,
    pub last_error: Option<String>,
}

/// `POST /v1/outgoing-hooks/{id}/test`: what the receiver answered a
/// `hook.test` notification, sent now and not kept.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct HookTestAnswer {
    /// The receiver answered with a 2xx.
    pub ok: bool,
    /// Its HTTP status, when it answered at all.
    pub status: Option<u16>,
    /// Why it failed, when it did.
    pub error: Option<String>,
    pub duration_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_name_log_entries_and_back() {
        assert_eq!(HookFormat::Standard.kinds_of(&["task.waiting".into(), "task.woken".into()]), Ok(vec![EventKind::Wait, EventKind::Wake]));
        assert_eq!(HookFormat::E2b.kinds_of(&["sandbox.lifecycle.killed".into()]), Ok(vec![EventKind::Destroy, EventKind::Complete]));
        assert_eq!(HookFormat::Standard.kinds_of(&["sandbox.lifecycle.killed".into()]), Err("sandbox.lifecycle.killed".into()), "another format's name");
        assert_eq!(HookFormat::Standard.kinds_of(&[]).map(|k| k.len()), Ok(STANDARD_EVENTS.len()), "none named: every one");
        assert_eq!(HookFormat::E2b.event_type(EventKind::Complete), Some("sandbox.lifecycle.killed"));
        assert_eq!(HookFormat::E2b.event_type(EventKind::Exec), None);
        for (name, kinds) in STANDARD_EVENTS {
            assert_eq!(HookFormat::Standard.event_type(kinds[0]), Some(*name));
        }
    }

    #[test]
    fn a_new_hook_reads_with_defaults_and_refuses_unknown_fields() {
        let h: NewHook = serde_json::from_str(r#"{"url": "https://hooks.example.com/cairn"}"#).unwrap();
        assert_eq!(h, NewHook { url: "https://hooks.example.com/cairn".into(), ..NewHook::default() });
        let e2b: NewHook = serde_json::from_str(r#"{"url": "https://hooks.example.com/", "format": "e2b", "secret": "s"}"#).unwrap();
        assert_eq!(e2b.format, HookFormat::E2b);
        assert!(serde_json::from_str::<NewHook>(r#"{"url": "x", "evnets": []}"#).is_err());
    }
}
