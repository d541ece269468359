//! Waits and the events that satisfy them.

use cairn_core::{InboxEvent, TaskState, Wait, WaitId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Body of `POST /v1/tasks/{id}/waits`: exactly one of the three.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WaitRequest {
    pub approval: Option<String>,
    pub webhook: Option<String>,
    /// A duration such as `30s` or `2h`.
    pub timer: Option<String>,
}

/// Body of `POST /v1/tasks/{id}/approve`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ApproveRequest {
    #[serde(default = "yes")]
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
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EventRequest {
    pub name: String,
    #[serde(default)]
    pub data: Value,
}

/// A wait as the API returns it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WaitView {
    #[serde(flatten)]
    pub wait: Wait,
    /// `pending` or `satisfied`.
    pub state: String,
    pub task_state: TaskState,
    /// For approvals: the signed page to approve or reject at.
    pub approval_url: Option<String>,
    /// For webhooks: where the sender posts.
    pub webhook_url: Option<String>,
    /// The event that satisfied it.
    pub event: Option<InboxEvent>,
}

/// What delivering an event did (the answer to an event, an approval or a
/// webhook).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
