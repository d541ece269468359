//! The CLI reads every answer through the wire model (`cairn_api`), but the
//! daemon still builds one answer from its own crates' types (the ledger's
//! checkpoint). (Images, the proxy's decision log, the ledger's keys and
//! problem kinds, the blob store's check and gc reports,
//! snapshot diffs and restore stats are the wire's own types, re-exported
//! by `cairn_api`.) The test here serialises it as the daemon does and
//! checks that the wire model reads it back whole: no field missing,
//! renamed or typed differently.

use cairn_api as api;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// `sent` reads as `Wire` and writes back to the same JSON.
fn reads_back_whole<Wire: Serialize + DeserializeOwned>(sent: &impl Serialize) {
    let json = serde_json::to_value(sent).unwrap();
    let read: Wire = serde_json::from_value(json.clone()).unwrap_or_else(|e| panic!("{} does not read {json}: {e}", std::any::type_name::<Wire>()));
    assert_eq!(serde_json::to_value(&read).unwrap(), json, "{} loses or changes a field", std::any::type_name::<Wire>());
}

#[test]
fn the_ledger_checkpoint() {
    use cairn_ledger::{Envelope, EnvelopeSignature, ProblemKind, SignedCheckpoint};
    // The runtime builds the checkpoint view itself (the wire model does no
    // cryptography): the envelope must stay readable by the ledger crate.
    let envelope = Envelope {
        payload: "e30=".into(),
        payload_type: cairn_ledger::CHECKPOINT_PAYLOAD_TYPE.into(),
        signatures: vec![EnvelopeSignature { keyid: "k1".into(), sig: "c2ln".into() }],
    };
    let checkpoint = cairn_ledger::Checkpoint { task: "t1".into(), seq: 3, head: "ab".repeat(32), time_ms: 9, key_id: "k1".into() };
    let view = cairn_runtime::ledger::checkpoint_view(&SignedCheckpoint { checkpoint, envelope: envelope.clone() });
    assert_eq!(serde_json::from_value::<Envelope>(view.envelope.clone()).unwrap(), envelope);
    reads_back_whole::<api::ledger::CheckpointView>(&view);
    // A problem's wire name is the one the ledger's messages use.
    for kind in [ProblemKind::Changed, ProblemKind::Removed, ProblemKind::Reordered, ProblemKind::Rewritten, ProblemKind::BadCheckpoint] {
        assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::json!(kind.as_str()), "{kind:?}");
    }
}
