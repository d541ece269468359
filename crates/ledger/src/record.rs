//! Opening a delivery record: its signature, its statement, and the signed
//! ledger checkpoint inside it. What the record names is then the
//! caller's to check: each deliverable's bytes against its digest (from
//! wherever the caller finds them) and the task's live ledger at the
//! record's entry (the daemon's). `cairn verify` and the console both
//! start here.

use crate::{Checkpoint, Envelope, Statement, VerifyingKey};

/// A record whose signature and checkpoint verify, and what it names.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenedRecord {
    /// The node key that signed it.
    pub key_id: String,
    pub task: String,
    /// Each deliverable: its plain file name and SHA-256 (hex).
    pub deliverables: Vec<(String, String)>,
    /// The ledger entry the record's checkpoint signs, and its hash.
    pub seq: u64,
    pub head: String,
    /// The record's signed predicate, as written.
    pub predicate: serde_json::Value,
}

/// A deliverable's name as a record may give it: a plain file name.
pub fn plain_name(name: &str) -> Result<&str, String> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(format!("the record names a deliverable {name:?}, which is not a plain file name"));
    }
    Ok(name)
}

/// Checks a record's signature against `keys`, reads its statement, and
/// checks the signed ledger checkpoint it carries; one line naming the
/// first check that failed.
pub fn open_record(text: &[u8], what: &str, keys: &[(String, VerifyingKey)]) -> Result<OpenedRecord, String> {
    let envelope: Envelope = serde_json::from_slice(text).map_err(|e| format!("{what} is not a delivery record (a DSSE envelope): {e}"))?;
    let key_id = envelope.verify(keys).map_err(|e| format!("record signature: {e}"))?;
    let payload = envelope.payload().map_err(|e| format!("record payload: {e}"))?;
    let statement = Statement::from_payload(&payload).map_err(|e| format!("record payload: {e}"))?;
    // The predicate is the record's own signed JSON, read field by field so
    // that a record missing one is named for it.
    let pred = statement.predicate;
    let task = pred["task"]["id"].as_str().ok_or("record names no task")?.to_owned();
    let mut deliverables = Vec::new();
    for s in &statement.subject {
        let name = plain_name(&s.name)?;
        let want = s.digest.get("sha256").ok_or_else(|| format!("deliverable {name}: the record gives no sha256"))?;
        deliverables.push((name.to_owned(), want.clone()));
    }
    let seq = pred["ledger"]["seq"].as_u64().ok_or("record names no ledger entry")?;
    let head = pred["ledger"]["head"].as_str().ok_or("record names no ledger head")?.to_owned();
    let checkpoint: Envelope =
        serde_json::from_value(pred["ledger"]["checkpoint"].clone()).map_err(|e| format!("record's ledger checkpoint: {e}"))?;
    checkpoint.verify(keys).map_err(|e| format!("record's ledger checkpoint signature: {e}"))?;
    let cp: Checkpoint = serde_json::from_slice(&checkpoint.payload().map_err(|e| format!("record's ledger checkpoint: {e}"))?)
        .map_err(|e| format!("record's ledger checkpoint: {e}"))?;
    if cp.head != head || cp.seq != seq || cp.task != task {
        return Err(format!("record's ledger checkpoint names entry {} head {:?}, the record entry {seq} head {head}", cp.seq, cp.head));
    }
    Ok(OpenedRecord { key_id, task, deliverables, seq, head, predicate: pred })
}

/// Whether `data` is the deliverable the record names (`from` says where
/// it was found, for the message).
pub fn check_deliverable(name: &str, want: &str, data: &[u8], from: &str) -> Result<(), String> {
    let got = crate::sha256_hex(data);
    if got != want {
        return Err(format!("deliverable {name} ({from}) does not match the record: its sha256 is {got}, the record says {want}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_plain() {
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert!(plain_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(plain_name("report.md"), Ok("report.md"));
    }

    #[test]
    fn a_deliverable_matches_its_digest_or_is_named() {
        let want = crate::sha256_hex(b"patch");
        assert!(check_deliverable("p.diff", &want, b"patch", "from the store").is_ok());
        let e = check_deliverable("p.diff", &want, b"other", "from the store").unwrap_err();
        assert!(e.starts_with("deliverable p.diff (from the store) does not match the record: its sha256 is "), "{e}");
    }

    #[test]
    fn garbage_is_not_a_record() {
        let e = open_record(b"{}", "r.json", &[]).unwrap_err();
        assert!(e.starts_with("r.json is not a delivery record"), "{e}");
    }
}
