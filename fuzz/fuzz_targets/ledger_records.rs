#![no_main]

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use cairn_ledger::{key_id, pae, parse_public_key, Envelope, EnvelopeSignature, SignedCheckpoint, Statement, VerifyingKey, CHECKPOINT_PAYLOAD_TYPE};
use ed25519_dalek::{Signer, SigningKey};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The node key the records are checked against (a fixed test key).
fn node() -> (SigningKey, Vec<(String, VerifyingKey)>) {
    let signing = SigningKey::from_bytes(&[7u8; 32]);
    let public = signing.verifying_key();
    (signing, vec![(key_id(&public), public)])
}

fn sign(signing: &SigningKey, keyid: &str, payload_type: &str, payload: &[u8]) -> Envelope {
    let sig = signing.sign(&pae(payload_type, payload));
    Envelope {
        payload: STANDARD.encode(payload),
        payload_type: payload_type.to_owned(),
        signatures: vec![EnvelopeSignature { keyid: keyid.to_owned(), sig: STANDARD.encode(sig.to_bytes()) }],
    }
}

fuzz_target!(|data: &[u8]| {
    // The first byte says which record the rest is.
    let Some((&kind, doc)) = data.split_first() else { return };
    match kind % 4 {
        0 => envelope(doc),
        1 => checkpoint(doc),
        2 => statement(doc),
        _ => public_key(doc),
    }
});

/// A delivery record: a DSSE envelope around an in-toto statement.
fn envelope(doc: &[u8]) {
    let Ok(env) = serde_json::from_slice::<Envelope>(doc) else { return };
    round_trip(&env);
    let (signing, keys) = node();
    if let Ok(id) = env.verify(&keys) {
        assert_eq!(id, keys[0].0);
    }
    let Ok(payload) = env.payload() else { return };
    if let Ok(s) = Statement::from_payload(&payload) {
        round_trip(&s);
    }
    // Signed by the node, it verifies as what it says; under another
    // payload type it does not.
    let signed = sign(&signing, &keys[0].0, &env.payload_type, &payload);
    let (id, back) = signed.verify_as(&keys, &env.payload_type).expect("a signed envelope verifies");
    assert_eq!((id, back), (keys[0].0.clone(), payload.clone()));
    let retyped = Envelope { payload_type: format!("{}!", env.payload_type), ..signed };
    assert!(retyped.verify(&keys).is_err(), "a signature held for another payload type");
}

/// A checkpoint record and its envelope.
fn checkpoint(doc: &[u8]) {
    let Ok(c) = serde_json::from_slice::<SignedCheckpoint>(doc) else { return };
    round_trip(&c);
    let (signing, keys) = node();
    let _ = c.verify(&keys);
    // Signed by the node with its key id, the record verifies; a record
    // that says another seq does not.
    let mut record = c.checkpoint.clone();
    record.key_id = keys[0].0.clone();
    let payload = serde_json::to_vec(&record).expect("a checkpoint serialises");
    let signed = SignedCheckpoint { checkpoint: record.clone(), envelope: sign(&signing, &keys[0].0, CHECKPOINT_PAYLOAD_TYPE, &payload) };
    signed.verify(&keys).expect("a signed checkpoint verifies");
    let mut moved = signed.clone();
    moved.checkpoint.seq = record.seq.wrapping_add(1);
    assert!(moved.verify(&keys).is_err(), "a checkpoint verified for another seq");
}

fn statement(doc: &[u8]) {
    if let Ok(s) = Statement::from_payload(doc) {
        round_trip(&s);
        let again = Statement::from_payload(&s.to_payload()).expect("a statement's payload parses back");
        assert_eq!(again, s);
    }
}

/// A public key given to verify with (hex, or JSON key records).
fn public_key(doc: &[u8]) {
    let Ok(text) = std::str::from_utf8(doc) else { return };
    if let Ok(keys) = parse_public_key(text) {
        for (id, key) in &keys {
            assert_eq!(id, &key_id(key), "a key listed under another key's id");
        }
    }
}

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(v: &T) {
    let json = serde_json::to_vec(v).expect("serialises");
    let back: T = serde_json::from_slice(&json).expect("parses back");
    assert_eq!(&back, v);
}
