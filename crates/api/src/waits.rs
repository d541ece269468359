//! Waits and the events that satisfy them.

use cairn_core::{InboxEvent, TaskId, TaskState, Wait, WaitFor, WaitId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// Body of `POST /v1/tasks/{id}/waits`: exactly one of the three.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitRequest {
    pub approval: Option<String>,
    pub webhook: Option<String>,
    /// A duration such as `30s` or `2h`.
    pub timer: Option<String>,
}

/// Body of `POST /v1/tasks/{id}/approve`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveRequest {
    #[serde(default = "yes")]
    #[schema(default = true)]
    pub approve: bool,
    pub comment: Option<String>,
}

impl Default for ApproveRequest {
    fn default() -> Self {
        ApproveRequest { approve: true, comment: None }
    }
}

fn yes() -> bool {
    true
}

/// Body of `POST /v1/tasks/{id}/inbox`: an operator's event.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventRequest {
    pub name: String,
    #[serde(default)]
    pub data: Value,
}

/// A wait as the API returns it: the wait's own fields, with the event that
/// satisfied it in full (not its id).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WaitView {
    pub id: WaitId,
    pub task: TaskId,
    #[serde(flatten)]
    pub what: WaitFor,
    pub created_ms: i64,
    /// When it ended: satisfied, or cancelled.
    pub satisfied_ms: Option<i64>,
    /// When it was cancelled (`DELETE /v1/tasks/{id}/waits`).
    #[serde(default)]
    pub cancelled_ms: Option<i64>,
    /// `pending`, `satisfied` or `cancelled`.
    pub state: String,
    pub task_state: TaskState,
    /// For approvals: the signed page to approve or reject at.
    pub approval_url: Option<String>,
    /// For webhooks: where the sender posts.
    pub webhook_url: Option<String>,
    /// The event that satisfied it.
    pub event: Option<InboxEvent>,
}

impl WaitView {
    /// The view of `wait`; `event` is the inbox event its `event` id names.
    pub fn new(wait: Wait, task_state: TaskState, approval_url: Option<String>, webhook_url: Option<String>, event: Option<InboxEvent>) -> WaitView {
        let state = match (wait.cancelled_ms, wait.satisfied_ms) {
            (Some(_), _) => "cancelled",
            (None, Some(_)) => "satisfied",
            (None, None) => "pending",
        };
        WaitView {
            id: wait.id,
            task: wait.task,
            what: wait.what,
            created_ms: wait.created_ms,
            satisfied_ms: wait.satisfied_ms,
            cancelled_ms: wait.cancelled_ms,
            state: state.to_owned(),
            task_state,
            approval_url,
            webhook_url,
            event,
        }
    }
}

/// What delivering an event did (the answer to an event, an approval or a
/// webhook).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Delivered {
    /// The stored event (for a repeated delivery: the first one).
    pub event: InboxEvent,
    /// The same delivery id was seen before: nothing changed.
    pub duplicate: bool,
    /// The wait it satisfied, if any.
    pub satisfied: Option<WaitId>,
    /// The task was suspended and is now waking.
    pub wakes: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::{EventSource, InboxId};

    /// A satisfied wait carries its event in full, under one `event` key,
    /// and reads back as it was written.
    #[test]
    fn a_satisfied_wait_round_trips_with_one_event_key() {
        let task = TaskId::random();
        let event = InboxEvent {
            id: InboxId::random(),
            task: task.clone(),
            source: EventSource::Approval,
            name: "approval".into(),
            delivery: None,
            data: serde_json::json!({"approve": true}),
            received_ms: 2,
            wait: None,
        };
        let wait = Wait {
            id: WaitId::random(),
            task,
            what: WaitFor::Approval { prompt: "ship it?".into() },
            created_ms: 1,
            satisfied_ms: Some(2),
            event: Some(event.id.clone()),
            cancelled_ms: None,
        };
        let view = WaitView::new(wait, TaskState::Running, None, None, Some(event));
        let text = serde_json::to_string(&view).unwrap();
        assert_eq!(text.matches("\"event\":").count(), 1, "{text}");
        assert_eq!(serde_json::from_str::<WaitView>(&text).unwrap(), view);
        assert_eq!(view.state, "satisfied");
        let cancelled = Wait { satisfied_ms: Some(3), event: None, cancelled_ms: Some(3), ..wait_of(&view) };
        assert_eq!(WaitView::new(cancelled.clone(), TaskState::Waking, None, None, None).state, "cancelled");
        let pending = Wait { satisfied_ms: None, cancelled_ms: None, ..cancelled };
        assert_eq!(WaitView::new(pending, TaskState::Suspended, None, None, None).state, "pending");
    }

    fn wait_of(v: &WaitView) -> Wait {
        Wait { id: v.id.clone(), task: v.task.clone(), what: v.what.clone(), created_ms: v.created_ms, satisfied_ms: v.satisfied_ms, event: None, cancelled_ms: v.cancelled_ms }
    }
}

/// A pending approval with what an approver needs to decide it: the
/// task, its step, the prompt, what changed since its last milestone and
/// the commands it ran last.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalContext {
    pub wait: WaitView,
    pub task_name: Option<String>,
    pub step: u64,
    pub prompt: String,
    /// The files changed from the task's last milestone snapshot to its
    /// newest snapshot; `None` without a milestone.
    pub since_milestone: Option<SinceMilestone>,
    /// The task's last commands (exec events), oldest first.
    pub last_commands: Vec<crate::Event>,
}

/// A diff from a task's last milestone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SinceMilestone {
    pub milestone: String,
    pub note: String,
    pub to: String,
    pub diff: cairn_snapshot::Diff,
}
