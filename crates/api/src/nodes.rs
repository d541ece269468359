//! The daemons (nodes) sharing the task database.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Whether a node is alive, as its heartbeats tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Its latest heartbeat is younger than three heartbeat periods.
    Up,
    /// It has not heartbeat for three periods or more: stopped, killed,
    /// or cut off from the database.
    Down,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Down => "down",
        }
    }
}

/// One node of `GET /v1/nodes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Node {
    /// Its name (`cairn serve --node`, by default the host name).
    pub name: String,
    /// Its API's base URL.
    pub url: String,
    pub state: NodeState,
    /// How long ago its latest heartbeat was, in milliseconds, as the
    /// answering node's clock sees it.
    pub heartbeat_age_ms: i64,
    /// When it started (ms since the Unix epoch).
    pub started_ms: i64,
    /// Its Cairn version.
    pub version: String,
    /// How many tasks have their sandbox up on it.
    pub load: usize,
    /// Those tasks' ids.
    pub tasks: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_keeps_its_field_names() {
        let n = Node {
            name: "alpha".into(),
            url: "http://127.0.0.1:7878".into(),
            state: NodeState::Up,
            heartbeat_age_ms: 900,
            started_ms: 1,
            version: "0.1.0".into(),
            load: 1,
            tasks: vec!["t_x".into()],
        };
        crate::assert_wire_shape(&n, &["name", "url", "state", "heartbeat_age_ms", "started_ms", "version", "load", "tasks"]);
        assert_eq!(serde_json::to_value(NodeState::Down).unwrap(), "down");
    }
}
