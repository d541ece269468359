use std::path::PathBuf;

use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the ledger can refuse, each naming what it was about.
#[derive(Debug, Error)]
pub enum Error {
    #[error("key directory {path}: {source}")]
    KeyDir { path: PathBuf, source: std::io::Error },
    #[error("key file {path}: {source}")]
    KeyFile { path: PathBuf, source: std::io::Error },
    #[error("key file {path} is malformed: {why}")]
    MalformedKey { path: PathBuf, why: String },
    #[error("not a public key: {why} (want 64 hex characters, or the JSON of `cairn --json key show`)")]
    PublicKey { why: String },
    #[error("DSSE envelope: {what} is not valid base64: {source}")]
    Base64 { what: &'static str, source: base64::DecodeError },
    #[error("DSSE envelope is signed by no known key (signed by: {signed_by})")]
    UnknownKey { signed_by: String },
    #[error("DSSE envelope signature by key {key_id} does not verify: the payload or its type was changed, or the signature is forged")]
    BadSignature { key_id: String },
    #[error("DSSE envelope has payload type {found:?}, not {want:?}")]
    PayloadType { found: String, want: String },
    #[error("{what} is not valid JSON of its kind: {source}")]
    Json { what: &'static str, source: serde_json::Error },
    #[error("in-toto statement has _type {0:?}, not \"https://in-toto.io/Statement/v1\"")]
    StatementType(String),
    #[error("checkpoint of task {task} at seq {seq}: the signed payload says {field} is {signed}, the record says {recorded}")]
    CheckpointMismatch { task: String, seq: u64, field: &'static str, signed: String, recorded: String },
}
