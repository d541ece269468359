//! Each task's ledger: its hash-chained event log, walked and checked
//! against the signed checkpoints of its head; and the node's signing keys
//! (`$CAIRN_HOME/keys/`).
//!
//! A checkpoint signs the head as it is and is stored beside the log; it is
//! not itself an entry of the log (an entry would move the head it signs).
//! The daemon refuses to sign a log that does not verify.

use cairn_core::TaskId;
use cairn_ledger::{check_against_checkpoint, verify_chain, Checkpoint, ChainProblem, Envelope, KeyInfo, NodeKeys, ProblemKind, SignedCheckpoint, VerifyingKey};
use cairn_store::now_ms;

use crate::runtime::Runtime;
use crate::Error;

pub use cairn_api::ledger::{CheckpointView, LedgerView};

/// A signed checkpoint as the API returns it (the envelope as stored).
pub fn checkpoint_view(c: &SignedCheckpoint) -> CheckpointView {
    let cp = &c.checkpoint;
    CheckpointView {
        task: cp.task.clone(),
        seq: cp.seq,
        head: cp.head.clone(),
        time_ms: cp.time_ms,
        key_id: cp.key_id.clone(),
        envelope: serde_json::to_value(&c.envelope).unwrap_or_default(),
    }
}

impl Runtime {
    fn node_keys(&self) -> std::sync::MutexGuard<'_, NodeKeys> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Walks the task's chain, then checks it against each of its
    /// checkpoints, oldest first, with every public key the node has used.
    pub async fn ledger_report(&self, id_or_name: &str) -> Result<LedgerView, Error> {
        let task = self.find(id_or_name).await?;
        let events = self.store.events(&task.id).await?;
        let report = verify_chain(&task.id, &events);
        let checkpoints = self.store.checkpoints(&task.id).await?;
        let keys = self.verifying_keys().await?;
        let mut problem = report.problem.clone();
        if problem.is_none() {
            problem = checkpoints.iter().find_map(|c| match c.verify(&keys) {
                Err(e) => Some(ChainProblem {
                    seq: c.checkpoint.seq,
                    what: ProblemKind::BadCheckpoint,
                    message: format!("the checkpoint at entry {} does not verify: {e}", c.checkpoint.seq),
                }),
                Ok(()) => check_against_checkpoint(&report, &c.checkpoint),
            });
        }
        Ok(LedgerView {
            task: task.id.to_string(),
            entries: report.entries as u64,
            head_seq: report.head.as_ref().map(|h| h.0),
            head: report.head.as_ref().map(|h| h.1.clone()),
            ok: problem.is_none(),
            problem_seq: problem.as_ref().map(|p| p.seq),
            problem_kind: problem.as_ref().map(|p| p.what),
            problem: problem.map(|p| p.message),
            checkpoint: checkpoints.last().map(checkpoint_view),
            checkpoints: checkpoints.len() as u64,
            hashes: report.hashes,
        })
    }

    /// Signs the task's chain head now with the node's current key and
    /// stores the checkpoint. Refused when the ledger does not verify.
    pub async fn checkpoint(&self, task: &TaskId, actor: &str) -> Result<CheckpointView, Error> {
        let report = self.ledger_report(task.as_str()).await?;
        if let Some(p) = &report.problem {
            return Err(Error::conflict(format!("will not sign the ledger of {}: {p}", report.task)));
        }
        let (Some(seq), Some(head)) = (report.head_seq, report.head.clone()) else {
            return Err(Error::conflict(format!("the ledger of {} is empty: nothing to sign", report.task)));
        };
        let signed = SignedCheckpoint::sign(&self.node_keys(), Checkpoint { task: report.task.clone(), seq, head, time_ms: now_ms(), key_id: String::new() });
        self.store.insert_checkpoint(&signed, actor).await?;
        tracing::info!(task = %report.task, seq, key = %signed.checkpoint.key_id, %actor, "checkpoint signed");
        Ok(checkpoint_view(&signed))
    }

    /// Signs `payload` as a DSSE envelope with the node's current key.
    pub fn sign_envelope(&self, payload_type: &str, payload: &[u8]) -> Envelope {
        Envelope::sign(&self.node_keys(), payload_type, payload)
    }

    /// Every public key this node has used, the current one first, then
    /// those the other nodes sharing the store published (what a verifier
    /// trusts: any node may have signed a task's records).
    pub async fn public_keys(&self) -> Result<Vec<KeyInfo>, Error> {
        let mut keys = self.node_keys().all();
        for (_, k) in self.store.cluster_keys().await? {
            if !keys.iter().any(|o| o.key_id == k.key_id) {
                keys.push(k);
            }
        }
        Ok(keys)
    }

    /// [`Runtime::public_keys`] with their ids, to verify against.
    pub async fn verifying_keys(&self) -> Result<Vec<(String, VerifyingKey)>, Error> {
        let mut keys = self.node_keys().verifying_keys();
        for (node, k) in self.store.cluster_keys().await? {
            if keys.iter().any(|(id, _)| *id == k.key_id) {
                continue;
            }
            match cairn_ledger::parse_public_key(&k.public_key) {
                Ok(parsed) => keys.extend(parsed),
                Err(e) => tracing::warn!(%node, key = %k.key_id, "a published key does not parse: {e}"),
            }
        }
        Ok(keys)
    }

    /// Publishes this node's public keys in the store, for the other nodes.
    pub(crate) async fn publish_keys(&self) -> Result<(), Error> {
        let keys = self.node_keys().all();
        Ok(self.store.publish_keys(&self.cluster.name, &keys).await?)
    }

    /// Replaces the signing key; the old public key stays for verifying what
    /// it signed. Returns the new key (published for the other nodes).
    pub async fn rotate_key(&self, actor: &str) -> Result<KeyInfo, Error> {
        let (old, new) = {
            let mut keys = self.node_keys();
            let old = keys.current().key_id;
            (old, keys.rotate().map_err(Error::internal_from)?)
        };
        tracing::warn!(%old, new = %new.key_id, %actor, "signing key rotated");
        self.publish_keys().await?;
        Ok(new)
    }
}
