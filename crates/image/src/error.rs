use std::io;
use std::path::PathBuf;

use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while importing, pulling, committing,
/// reading or removing an image. Variants carry the image, the source or
/// the entry they concern.
#[derive(Debug, Error)]
pub enum Error {
    #[error("unknown image {0:?} (see `cairn image list`)")]
    UnknownImage(String),
    #[error("image {0:?} already exists")]
    ImageExists(String),
    #[error("image {0:?} is in use: {1}")]
    ImageInUse(String, String),
    #[error("image {0:?} is built in and cannot be removed")]
    ImageBuiltIn(String),
    #[error("cannot import image from {0}: {1}")]
    ImageSource(PathBuf, String),
    #[error("unsafe image archive entry {}: {reason}", crate::quoted(.entry))]
    UnsafeEntry { entry: String, reason: &'static str },
    #[error("unsafe entry {} in layer {}: {reason}", crate::quoted(.entry), crate::short(.layer))]
    UnsafeLayerEntry { layer: String, entry: String, reason: &'static str },
    #[error("image I/O on {0}: {1}")]
    ImageIo(PathBuf, io::Error),
    #[error("{0}")]
    InvalidImageName(cairn_core::Error),
    #[error("cannot write image entry {}: {err}", crate::quoted(.entry))]
    ImageEntry { entry: String, err: io::Error },
    #[error(
        "cannot import image from {}: entry {} {}",
        .src.display(),
        crate::quoted(.entry),
        crate::too_large_reason(*.need, *.limit, *.bound)
    )]
    ImageTooLarge { src: PathBuf, entry: String, need: u64, limit: u64, bound: crate::SizeBound },
}
