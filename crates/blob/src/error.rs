use std::path::PathBuf;

use crate::backend::Kind;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the blob store. Each names the object it is about.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0:?} {1} is missing")]
    Missing(Kind, String),
    #[error("{0:?} {1} is corrupted: {2}")]
    Corrupt(Kind, String, String),
    #[error("chunk {0} is not in the index")]
    UnknownChunk(String),
    #[error("backend {0}: {1}")]
    Backend(String, String),
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("no space left on the blob store ({0})")]
    NoSpace(String),
    /// Reading the data being chunked failed (the reader has no path; the
    /// caller adds it).
    #[error("reading input: {0}")]
    Input(std::io::Error),
    /// A chunk too large for the pack format (lengths are 32-bit).
    #[error("chunk of {0} bytes is larger than the {1}-byte limit")]
    ChunkTooLarge(usize, u64),
    /// The pack writer's background worker stopped (an earlier error, or a
    /// panic); later calls on the same writer return this.
    #[error("pack writer: {0}")]
    Writer(String),
    /// zstd could not compress (it only fails when out of memory).
    #[error("compressing {0}: {1}")]
    Compress(String, String),
}
