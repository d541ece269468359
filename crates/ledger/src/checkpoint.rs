//! Checkpoints: the node's signature over a task's chain head at some
//! sequence number. The JSON of a [`Checkpoint`] is the payload of a DSSE
//! envelope of type [`CHECKPOINT_PAYLOAD_TYPE`]; the record kept beside it
//! must say the same. A log rewritten or cut after a checkpoint no longer
//! has the signed head at the signed seq ([`crate::check_against_checkpoint`]).

use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};

use crate::dsse::Envelope;
use crate::keys::NodeKeys;
use crate::{Error, Result};

/// The DSSE payload type of a checkpoint.
pub const CHECKPOINT_PAYLOAD_TYPE: &str = "application/vnd.cairn.checkpoint+json";

/// What a checkpoint states: task `task`'s log had entry `seq` hashing to
/// `head` at `time_ms`, signed by key `key_id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub task: String,
    pub seq: u64,
    pub head: String,
    pub time_ms: i64,
    pub key_id: String,
}

/// A checkpoint and its envelope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedCheckpoint {
    pub checkpoint: Checkpoint,
    pub envelope: Envelope,
}

impl SignedCheckpoint {
    /// Signs `checkpoint` with the node's current key (its `key_id` is set
    /// to that key's).
    pub fn sign(keys: &NodeKeys, mut checkpoint: Checkpoint) -> SignedCheckpoint {
        checkpoint.key_id = keys.current().key_id;
        let payload = serde_json::to_vec(&checkpoint).unwrap_or_default();
        let envelope = Envelope::sign(keys, CHECKPOINT_PAYLOAD_TYPE, &payload);
        SignedCheckpoint { checkpoint, envelope }
    }

    /// The envelope verifies with one of `keys`, is a checkpoint, was signed
    /// by the key it names, and says exactly what the record says.
    pub fn verify(&self, keys: &[(String, VerifyingKey)]) -> Result<()> {
        let (signer, payload) = self.envelope.verify_as(keys, CHECKPOINT_PAYLOAD_TYPE)?;
        let signed: Checkpoint = serde_json::from_slice(&payload).map_err(|source| Error::Json { what: "checkpoint payload", source })?;
        let r = &self.checkpoint;
        let mismatch = |field, signed: String, recorded: String| Error::CheckpointMismatch { task: r.task.clone(), seq: r.seq, field, signed, recorded };
        if signed.task != r.task {
            return Err(mismatch("task", signed.task, r.task.clone()));
        }
        if signed.seq != r.seq {
            return Err(mismatch("seq", signed.seq.to_string(), r.seq.to_string()));
        }
        if signed.head != r.head {
            return Err(mismatch("head", signed.head, r.head.clone()));
        }
        if signed.time_ms != r.time_ms {
            return Err(mismatch("time_ms", signed.time_ms.to_string(), r.time_ms.to_string()));
        }
        if signed.key_id != r.key_id || signer != r.key_id {
            return Err(mismatch("key_id", format!("{} (signed by {signer})", signed.key_id), r.key_id.clone()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn cp() -> Checkpoint {
        Checkpoint { task: "tcheckpoint2".into(), seq: 7, head: "ab".repeat(32), time_ms: 1_700_000_000_000, key_id: String::new() }
    }

    #[test]
    fn a_checkpoint_verifies_after_rotation_and_not_after_tampering() {
        let d = tempfile::tempdir().unwrap();
        let mut keys = NodeKeys::load_or_create(d.path()).unwrap();
        let first = SignedCheckpoint::sign(&keys, cp());
        assert_eq!(first.checkpoint.key_id, keys.current().key_id);
        assert_eq!(first.envelope.payload_type, CHECKPOINT_PAYLOAD_TYPE);
        first.verify(&keys.verifying_keys()).unwrap();

        keys.rotate().unwrap();
        let reopened = NodeKeys::load_or_create(d.path()).unwrap();
        first.verify(&reopened.verifying_keys()).expect("signed before the rotation, verified with the old public key");
        let second = SignedCheckpoint::sign(&reopened, cp());
        assert_eq!(second.checkpoint.key_id, reopened.current().key_id);
        assert_ne!(second.checkpoint.key_id, first.checkpoint.key_id);
        second.verify(&reopened.verifying_keys()).unwrap();
        let only_old: Vec<_> = reopened.verifying_keys().into_iter().filter(|(id, _)| *id == first.checkpoint.key_id).collect();
        assert!(matches!(second.verify(&only_old), Err(Error::UnknownKey { .. })));

        let mut moved = first.clone();
        moved.checkpoint.head = "cd".repeat(32);
        let err = moved.verify(&reopened.verifying_keys()).unwrap_err().to_string();
        assert!(err.contains("the signed payload says head is abab"), "{err}");
        let mut later = first.clone();
        later.checkpoint.seq = 9;
        assert!(matches!(later.verify(&reopened.verifying_keys()), Err(Error::CheckpointMismatch { field: "seq", .. })));
        let mut other_type = first.clone();
        other_type.envelope = Envelope::sign(&reopened, crate::PAYLOAD_TYPE, &serde_json::to_vec(&first.checkpoint).unwrap());
        assert!(matches!(other_type.verify(&reopened.verifying_keys()), Err(Error::PayloadType { .. })));
    }

    #[test]
    fn a_checkpoint_must_be_signed_by_the_key_it_names() {
        let d = tempfile::tempdir().unwrap();
        let mut keys = NodeKeys::load_or_create(d.path()).unwrap();
        let old = keys.current().key_id;
        keys.rotate().unwrap();
        let new = keys.current().key_id;
        let known = keys.verifying_keys();
        // Payload and record both name the old key; the new key signed it.
        let named_old = Checkpoint { key_id: old.clone(), ..cp() };
        let forged = SignedCheckpoint {
            checkpoint: named_old.clone(),
            envelope: Envelope::sign(&keys, CHECKPOINT_PAYLOAD_TYPE, &serde_json::to_vec(&named_old).unwrap()),
        };
        match forged.verify(&known) {
            Err(Error::CheckpointMismatch { field: "key_id", signed, recorded, .. }) => {
                assert_eq!((signed, recorded), (format!("{old} (signed by {new})"), old.clone()));
            }
            other => panic!("{other:?}"),
        }
        // The record names the signer, the signed payload another key.
        let relabelled = SignedCheckpoint { checkpoint: Checkpoint { key_id: new.clone(), ..cp() }, envelope: forged.envelope.clone() };
        match relabelled.verify(&known) {
            Err(Error::CheckpointMismatch { field: "key_id", signed, recorded, .. }) => {
                assert_eq!((signed, recorded), (format!("{old} (signed by {new})"), new.clone()));
            }
            other => panic!("{other:?}"),
        }
        SignedCheckpoint::sign(&keys, cp()).verify(&known).unwrap();
    }
}
