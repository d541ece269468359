//! Cairn's ledger: what makes a task's records evidence rather than rows.
//!
//! - [`chain`]: the hash chain over a task's event log, its canonical
//!   encoding, and the walk that names the first entry changed, removed or
//!   reordered.
//! - [`keys`]: the node's ed25519 signing keys, kept in a directory; every
//!   public key ever used stays, so records signed before a rotation still
//!   verify.
//! - [`dsse`]: DSSE v1 envelopes (signed payloads with a type).
//! - [`statement`]: in-toto Statement v1, the payload of signed records.
//! - [`checkpoint`]: a signed statement of a chain's head at a sequence
//!   number.
//! - [`record`]: opening a delivery record (signature, statement, its
//!   signed checkpoint) for `cairn verify` and the console.
//!
//! Everything here is pure but the key directory: no database, no network.

pub mod chain;
pub mod checkpoint;
pub mod dsse;
mod error;
pub mod keys;
pub mod record;
pub mod statement;

pub use chain::{check_against_checkpoint, entry_hash, verify_chain, ChainProblem, ChainReport, ProblemKind, GENESIS};
pub use checkpoint::{Checkpoint, SignedCheckpoint, CHECKPOINT_PAYLOAD_TYPE};
pub use dsse::{pae, Envelope, EnvelopeSignature};
pub use ed25519_dalek::VerifyingKey;
pub use error::{Error, Result};
pub use keys::{key_id, parse_public_key, KeyInfo, NodeKeys};
pub use statement::{sha256_hex, Statement, Subject, PAYLOAD_TYPE, STATEMENT_TYPE};
