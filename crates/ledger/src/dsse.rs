//! DSSE v1 envelopes (Dead Simple Signing Envelope, per
//! <https://github.com/secure-systems-lab/dsse/blob/master/protocol.md>).
//!
//! The signature is ed25519 over the pre-authentication encoding
//!
//! ```text
//! PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body
//! ```
//!
//! (`SP` one space, `LEN` the byte length in ASCII decimal without leading
//! zeros), so neither the payload nor its type can be swapped. The JSON is
//! `{"payload": base64(body), "payloadType": type, "signatures": [{"keyid",
//! "sig": base64(signature)}]}`; written with standard, padded base64, read
//! in standard or URL-safe, padded or not (the spec requires verifiers to
//! accept both). A key id is only a hint to pick the key: an empty one is
//! tried against every known key.

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use ed25519_dalek::{Signature, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::keys::NodeKeys;
use crate::{Error, Result};

/// The bytes a DSSE signature covers.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!("DSSEv1 {} {} {} ", payload_type.len(), payload_type, payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out
}

/// One signature of an envelope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeSignature {
    /// The signing key's id; unset is the same as empty.
    #[serde(default)]
    pub keyid: String,
    /// base64 of the 64-byte ed25519 signature.
    pub sig: String,
}

/// A DSSE JSON envelope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// base64 of the payload.
    pub payload: String,
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub signatures: Vec<EnvelopeSignature>,
}

fn decode(what: &'static str, text: &str) -> Result<Vec<u8>> {
    let mut first = None;
    for engine in [&STANDARD, &URL_SAFE, &STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
        match engine.decode(text) {
            Ok(bytes) => return Ok(bytes),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(Error::Base64 { what, source: first.unwrap_or(base64::DecodeError::InvalidPadding) })
}

impl Envelope {
    /// Signs `payload` as `payload_type` with the node's current key.
    pub fn sign(keys: &NodeKeys, payload_type: &str, payload: &[u8]) -> Envelope {
        let (keyid, sig) = keys.sign(&pae(payload_type, payload));
        Envelope {
            payload: STANDARD.encode(payload),
            payload_type: payload_type.to_owned(),
            signatures: vec![EnvelopeSignature { keyid, sig: STANDARD.encode(sig) }],
        }
    }

    /// The payload's bytes (not verified: see [`Envelope::verify`]).
    pub fn payload(&self) -> Result<Vec<u8>> {
        decode("payload", &self.payload)
    }

    /// The id of the first known key with a valid signature on this
    /// envelope. Refused when no signature is by a known key, when the
    /// signatures of known keys do not verify, or when base64 is malformed.
    pub fn verify(&self, keys: &[(String, VerifyingKey)]) -> Result<String> {
        let message = pae(&self.payload_type, &self.payload()?);
        let mut bad = None;
        for s in &self.signatures {
            let candidates: Vec<&(String, VerifyingKey)> =
                keys.iter().filter(|(id, _)| s.keyid.is_empty() || *id == s.keyid).collect();
            if candidates.is_empty() {
                continue;
            }
            let raw = decode("signature", &s.sig)?;
            let Ok(sig) = Signature::from_slice(&raw) else {
                bad.get_or_insert_with(|| s.keyid.clone());
                continue;
            };
            for (id, key) in candidates {
                if key.verify_strict(&message, &sig).is_ok() {
                    return Ok(id.clone());
                }
            }
            bad.get_or_insert_with(|| if s.keyid.is_empty() { "(none given)".to_owned() } else { s.keyid.clone() });
        }
        match bad {
            Some(key_id) => Err(Error::BadSignature { key_id }),
            None => {
                let ids: Vec<&str> = self.signatures.iter().map(|s| if s.keyid.is_empty() { "(no key id)" } else { s.keyid.as_str() }).collect();
                Err(Error::UnknownKey { signed_by: if ids.is_empty() { "nobody".to_owned() } else { ids.join(", ") } })
            }
        }
    }

    /// [`Envelope::verify`], then checks the payload type; returns the key
    /// id and the payload.
    pub fn verify_as(&self, keys: &[(String, VerifyingKey)], payload_type: &str) -> Result<(String, Vec<u8>)> {
        let key = self.verify(keys)?;
        if self.payload_type != payload_type {
            return Err(Error::PayloadType { found: self.payload_type.clone(), want: payload_type.to_owned() });
        }
        Ok((key, self.payload()?))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use ed25519_dalek::SigningKey;

    use super::*;

    /// The spec's example (protocol.md, "Test Vectors").
    const HELLO_TYPE: &str = "http://example.com/HelloWorld";

    #[test]
    fn pae_matches_the_spec_vector() {
        assert_eq!(pae(HELLO_TYPE, b"hello world"), b"DSSEv1 29 http://example.com/HelloWorld 11 hello world");
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ");
        assert_eq!(pae("t", "é".as_bytes()), "DSSEv1 1 t 2 é".as_bytes(), "lengths count bytes");
    }

    #[test]
    fn an_ed25519_envelope_matches_an_independent_signer() {
        // RFC 8032 TEST 1 key signing the spec's example; the signature was
        // computed independently (OpenSSL through Python's `cryptography`,
        // over the PAE bytes above). ed25519 is deterministic.
        let seed: [u8; 32] = hex::decode("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60").unwrap().try_into().unwrap();
        let key = SigningKey::from_bytes(&seed);
        let id = crate::key_id(&key.verifying_key());
        let env: Envelope = serde_json::from_value(serde_json::json!({
            "payload": "aGVsbG8gd29ybGQ=",
            "payloadType": HELLO_TYPE,
            "signatures": [{"keyid": id, "sig": VECTOR_SIG}],
        }))
        .unwrap();
        let known = vec![(id.clone(), key.verifying_key())];
        assert_eq!(env.verify(&known).unwrap(), id);
        assert_eq!(env.payload().unwrap(), b"hello world");
        let ours = ed25519_dalek::Signer::sign(&key, &pae(HELLO_TYPE, b"hello world"));
        assert_eq!(STANDARD.encode(ours.to_bytes()), VECTOR_SIG);
        // URL-safe and unpadded base64 are accepted too; an unset key id
        // is tried against every key.
        let mut loose = env.clone();
        loose.payload = "aGVsbG8gd29ybGQ".into();
        loose.signatures[0].sig = URL_SAFE_NO_PAD.encode(ours.to_bytes());
        loose.signatures[0].keyid = String::new();
        assert_eq!(loose.verify(&known).unwrap(), id);
    }

    const VECTOR_SIG: &str = "4DHX3Zn4qpBKvEj7maE8O9u9bjXEnPLLnyXVUJ2PXJR8DSLcL3QDpFvfJOj3pB/SPHsl6Jg4boxsMb6KvuYABw==";

    #[test]
    fn the_spec_example_is_not_signed_by_our_keys() {
        let env: Envelope = serde_json::from_str(
            r#"{"payload": "aGVsbG8gd29ybGQ=", "payloadType": "http://example.com/HelloWorld",
                "signatures": [{"sig": "A3JqsQGtVsJ2O2xqrI5IcnXip5GToJ3F+FnZ+O88SjtR6rDAajabZKciJTfUiHqJPcIAriEGAHTVeCUjW2JIZA=="}]}"#,
        )
        .unwrap();
        assert_eq!(env.payload().unwrap(), b"hello world");
        let d = tempfile::tempdir().unwrap();
        let keys = NodeKeys::load_or_create(d.path()).unwrap();
        // An ECDSA signature under an empty key id: tried with our key, refused.
        assert!(matches!(env.verify(&keys.verifying_keys()), Err(Error::BadSignature { .. })));
    }

    #[test]
    fn tampering_is_refused_with_a_reason() {
        let d = tempfile::tempdir().unwrap();
        let keys = NodeKeys::load_or_create(d.path()).unwrap();
        let known = keys.verifying_keys();
        let env = Envelope::sign(&keys, "application/vnd.test+json", br#"{"a":1}"#);
        assert_eq!(env.verify(&known).unwrap(), keys.current().key_id);
        let json = serde_json::to_value(&env).unwrap();
        assert_eq!(json["payload"], "eyJhIjoxfQ==", "standard, padded base64");
        assert!(json["signatures"][0]["keyid"].is_string() && json.get("payloadType").is_some());

        let mut changed = env.clone();
        changed.payload = STANDARD.encode(br#"{"a":2}"#);
        assert!(matches!(changed.verify(&known), Err(Error::BadSignature { key_id }) if key_id == keys.current().key_id));
        let mut retyped = env.clone();
        retyped.payload_type = "application/vnd.other+json".into();
        assert!(matches!(retyped.verify(&known), Err(Error::BadSignature { .. })), "the type is signed too");
        assert!(matches!(env.verify_as(&known, "application/vnd.other+json"), Err(Error::PayloadType { .. })));
        let mut garbled = env.clone();
        garbled.payload = "not base64!".into();
        assert!(matches!(garbled.verify(&known), Err(Error::Base64 { what: "payload", .. })));
        let mut short_sig = env.clone();
        short_sig.signatures[0].sig = STANDARD.encode([0u8; 10]);
        assert!(matches!(short_sig.verify(&known), Err(Error::BadSignature { .. })));

        let d2 = tempfile::tempdir().unwrap();
        let stranger = NodeKeys::load_or_create(d2.path()).unwrap();
        let err = env.verify(&stranger.verifying_keys()).unwrap_err();
        assert!(matches!(err, Error::UnknownKey { .. }), "{err}");
        assert!(err.to_string().contains(&keys.current().key_id));
        let unsigned = Envelope { signatures: vec![], ..env };
        assert!(matches!(unsigned.verify(&known), Err(Error::UnknownKey { .. })));
    }
}
