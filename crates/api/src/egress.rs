//! A task's egress policy and its decision log.

use cairn_core::TaskId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Body of `POST /v1/tasks/{id}/egress`: rules to add (each moves out of
/// the other list if it was there), after clearing both lists if asked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyUpdate {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
    #[serde(default)]
    pub clear: bool,
}

/// `GET /v1/tasks/{id}/egress`: the policy and every decision so far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EgressView {
    pub task: TaskId,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub decisions: Vec<Decision>,
}

/// One decision-log entry: when, and the attempt (host, port, address,
/// allowed, rule, reason, status, bytes, duration), as the proxy
/// recorded it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub seq: u64,
    pub time_ms: i64,
    #[serde(flatten)]
    pub attempt: serde_json::Map<String, Value>,
}
