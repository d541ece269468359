//! A task's egress policy and its decision log.

use cairn_core::TaskId;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

// The proxy's log entries are the wire's (the egress crate's `schema`
// feature).
pub use cairn_egress::{Attempt, AttemptKind};

/// Body of `POST /v1/tasks/{id}/egress`: rules to add (each moves out of
/// the other list if it was there), after clearing both lists if asked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyUpdate {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
    /// Request rules to add (`HOST=METHODS PATH_PREFIX`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    /// Injections to add (`HOST=HEADER: VALUE`, `HOST=$NAME`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inject: Vec<String>,
    #[serde(default)]
    pub clear: bool,
}

/// `GET /v1/tasks/{id}/egress`: the policy and every decision so far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EgressView {
    pub task: TaskId,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inject: Vec<String>,
    pub decisions: Vec<Decision>,
}

/// One decision-log entry: when, and the attempt (host, port, address,
/// allowed, rule, reason, status, bytes, duration), as the proxy
/// recorded it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Decision {
    pub seq: u64,
    pub time_ms: i64,
    // Kept as a map (see `Decision::attempt`); documented as the typed
    // attempt.
    #[serde(flatten)]
    #[schema(value_type = Attempt)]
    pub attempt: serde_json::Map<String, Value>,
}

impl Decision {
    /// The attempt's fields, typed. The entry keeps them as the log stored
    /// them, so that every recorded field reaches a client, read or not.
    pub fn attempt(&self) -> Result<Attempt, serde_json::Error> {
        Attempt::deserialize(&self.attempt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_reads_as_a_typed_attempt() {
        let attempt = Attempt {
            kind: AttemptKind::Connect,
            host: "docs.example.com".into(),
            port: 443,
            address: Some("93.184.215.14:443".parse().unwrap_or_else(|e| panic!("{e}"))),
            allowed: true,
            rule: Some("docs.example.com".into()),
            reason: "allowed by docs.example.com".into(),
            status: Some(200),
            bytes_up: 10,
            bytes_down: 20,
            duration_ms: 30,
            open: false,
            method: None,
            path: None,
            secrets: Vec::new(),
            scrubbed: 0,
        };
        crate::assert_wire_shape(
            &attempt,
            &["kind", "host", "port", "address", "allowed", "rule", "reason", "status", "bytes_up", "bytes_down", "duration_ms"],
        );
        let fields = serde_json::to_value(&attempt).unwrap_or_default().as_object().cloned().unwrap_or_default();
        let decision = Decision { seq: 4, time_ms: 9, attempt: fields };
        let text = serde_json::to_string(&decision).unwrap_or_default();
        let read: Decision = serde_json::from_str(&text).unwrap_or(Decision { seq: 0, time_ms: 0, attempt: Default::default() });
        assert_eq!(read.attempt().ok(), Some(attempt));
        let open: Attempt = serde_json::from_value(serde_json::json!({
            "kind": "http", "host": "", "port": 0, "address": null, "allowed": false, "rule": null, "reason": "malformed",
            "status": 400, "bytes_up": 0, "bytes_down": 0, "duration_ms": 1, "open": true
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(open.open && open.kind == AttemptKind::Http);
        for kind in [AttemptKind::Connect, AttemptKind::Http, AttemptKind::Intercepted] {
            assert_eq!(serde_json::to_value(kind).ok(), Some(serde_json::json!(kind.as_str())));
        }
    }
}
