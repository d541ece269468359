//! The wire model of Cairn's HTTP API, shared by the daemon (which
//! deserialises requests and serialises answers) and the CLI (the other
//! way round): one module per group of routes, the error body with its
//! stable machine-readable codes, and the exec protocol's frames. Serde
//! types only: no HTTP, no I/O.

pub mod deliver;
pub mod egress;
pub mod error;
pub mod exec;
pub mod images;
pub mod snapshots;
pub mod tasks;
pub mod waits;

pub use error::{ErrorBody, ErrorCode, ErrorDetail};
