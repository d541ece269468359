use std::io;
use std::path::PathBuf;

use cairn_blob::ObjectId;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while capturing, restoring or loading a
/// snapshot. Variants name the path or object they concern.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, io::Error),
    #[error("cannot write {0}: {1}")]
    Write(PathBuf, io::Error),
    #[error("cannot remove {0}: {1}")]
    Remove(PathBuf, io::Error),
    /// The cause is in the message only (no `source`): an error chain
    /// (`{:#}`) prints it once.
    #[error("blob store: {0}")]
    Blob(cairn_blob::Error),
    #[error("chunk {0} of {1}: {2}")]
    Chunk(ObjectId, PathBuf, cairn_blob::Error),
    #[error("manifest {0}: {1}")]
    Decode(ObjectId, String),
    #[error("cannot encode manifest: {0}")]
    Encode(String),
    #[error("manifest version {0} is not supported (expected {1})")]
    Version(u32, u32),
    #[error("invalid manifest: layer {0:?}, entry {1}: {2}")]
    Invalid(String, PathBuf, &'static str),
    #[error("cannot freeze the sandbox: {0}")]
    Freeze(String),
    #[error("cannot thaw the sandbox: {0}")]
    Thaw(String),
}

impl From<cairn_blob::Error> for Error {
    fn from(e: cairn_blob::Error) -> Self {
        Error::Blob(e)
    }
}
