//! A task's ledger (its hash-chained event log), its signed checkpoints,
//! and the node's signing keys.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

// The ledger's own types are the wire's (its `schema` feature).
pub use cairn_ledger::{KeyInfo, ProblemKind};

/// `GET /v1/tasks/{id}/ledger`: the chain walked and checked against every
/// signed checkpoint of the task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LedgerView {
    pub task: String,
    pub entries: u64,
    /// The last entry and its hash; `None` for an empty log.
    pub head_seq: Option<u64>,
    pub head: Option<String>,
    /// The chain and every checkpoint verify.
    pub ok: bool,
    /// One line naming the first changed, removed or reordered entry.
    pub problem: Option<String>,
    /// The entry the problem names, and what happened to it.
    pub problem_seq: Option<u64>,
    pub problem_kind: Option<ProblemKind>,
    /// The newest checkpoint.
    pub checkpoint: Option<CheckpointView>,
    /// How many checkpoints the log was checked against.
    pub checkpoints: u64,
    /// Every entry's seq and hash, in order: what a delivery record's
    /// ledger head is checked against.
    pub hashes: Vec<(u64, String)>,
}

/// A signed checkpoint of a task's chain head: in a [`LedgerView`], and
/// the answer of `POST /v1/tasks/{id}/checkpoint`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointView {
    pub task: String,
    pub seq: u64,
    pub head: String,
    pub time_ms: i64,
    /// The node key that signed it.
    pub key_id: String,
    /// The DSSE envelope whose payload is the checkpoint, as stored; the
    /// ledger crate's `Envelope` reads and verifies it (the wire model does
    /// no cryptography).
    pub envelope: Value,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assert_wire_shape;

    #[test]
    fn answers_keep_the_daemons_field_names() {
        let envelope = serde_json::json!({ "payload": "e30=", "payloadType": "application/vnd.cairn.checkpoint+json", "signatures": [{ "keyid": "k1", "sig": "c2ln" }] });
        let checkpoint = CheckpointView { task: "t1".into(), seq: 7, head: "ab".repeat(32), time_ms: 5, key_id: "k1".into(), envelope };
        assert_wire_shape(&checkpoint, &["task", "seq", "head", "time_ms", "key_id", "envelope"]);
        let ledger = LedgerView {
            task: "t1".into(),
            entries: 7,
            head_seq: Some(7),
            head: Some("ab".repeat(32)),
            ok: false,
            problem: Some("entry 3 was changed".into()),
            problem_seq: Some(3),
            problem_kind: Some(ProblemKind::BadCheckpoint),
            checkpoint: Some(checkpoint),
            checkpoints: 2,
            hashes: vec![(1, "cd".repeat(32))],
        };
        assert_wire_shape(
            &ledger,
            &["task", "entries", "head_seq", "head", "ok", "problem", "problem_seq", "problem_kind", "checkpoint", "checkpoints", "hashes"],
        );
        let text = serde_json::to_value(&ledger).unwrap_or_default();
        assert_eq!((&text["problem_kind"], &text["hashes"][0][0]), (&serde_json::json!("bad_checkpoint"), &serde_json::json!(1)));
        let key = KeyInfo { key_id: "k1".into(), public_key: "ef".repeat(32), created_ms: 2, current: true };
        assert_wire_shape(&key, &["key_id", "public_key", "created_ms", "current"]);
    }
}
