//! in-toto Statement v1 (<https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md>):
//! what a signed record is about (subjects, by digest) and what it says
//! (a typed predicate). Signed as the payload of a DSSE envelope with type
//! [`PAYLOAD_TYPE`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The lowercase hex SHA-256 of `data`: the digest subjects carry.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// The `_type` of every v1 statement.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";

/// The DSSE payload type of an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// An artifact a statement is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subject {
    pub name: String,
    /// Algorithm name (`sha256`) to lowercase hex digest.
    pub digest: BTreeMap<String, String>,
}

impl Subject {
    /// A subject named by its SHA-256 (hex).
    pub fn sha256(name: impl Into<String>, hex_digest: impl Into<String>) -> Subject {
        Subject { name: name.into(), digest: BTreeMap::from([("sha256".to_owned(), hex_digest.into())]) }
    }
}

/// An in-toto v1 statement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub type_: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: serde_json::Value,
}

impl Statement {
    pub fn new(subject: Vec<Subject>, predicate_type: impl Into<String>, predicate: serde_json::Value) -> Statement {
        Statement { type_: STATEMENT_TYPE.to_owned(), subject, predicate_type: predicate_type.into(), predicate }
    }

    /// The JSON bytes to sign.
    pub fn to_payload(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses a payload, refusing another `_type`.
    pub fn from_payload(bytes: &[u8]) -> Result<Statement> {
        let s: Statement = serde_json::from_slice(bytes).map_err(|source| Error::Json { what: "in-toto statement", source })?;
        if s.type_ != STATEMENT_TYPE {
            return Err(Error::StatementType(s.type_));
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn statements_have_the_v1_shape_and_round_trip() {
        let s = Statement::new(vec![Subject::sha256("out/report.pdf", "ab".repeat(32))], "https://example.com/p/v1", serde_json::json!({"k": 1}));
        let v: serde_json::Value = serde_json::from_slice(&s.to_payload()).unwrap();
        assert_eq!(v["_type"], STATEMENT_TYPE);
        assert_eq!(v["subject"][0]["digest"]["sha256"], "ab".repeat(32));
        assert_eq!(v["predicateType"], "https://example.com/p/v1");
        assert_eq!(Statement::from_payload(&s.to_payload()).unwrap(), s);
        let old = br#"{"_type": "https://in-toto.io/Statement/v0.1", "subject": [], "predicateType": "x", "predicate": {}}"#;
        assert!(matches!(Statement::from_payload(old), Err(Error::StatementType(_))));
        assert!(matches!(Statement::from_payload(b"{"), Err(Error::Json { .. })));
    }

    #[test]
    fn sha256_hex_is_lowercase_hex_of_the_digest() {
        // FIPS 180-2 test vectors.
        assert_eq!(sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
