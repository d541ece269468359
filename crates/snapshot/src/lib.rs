//! Snapshots of a task's writable layer.
//!
//! A sandbox's root is an overlay whose upper directories live on the task's
//! own disk. This crate owns turning those uppers into a content-addressed
//! [`Manifest`] (file contents as chunks in a `cairn-blob` repository),
//! incrementally against the last one ([`capture`], with a short freeze of
//! the sandbox; with a [`ChangeWatch`], only where the sandbox changed
//! something: [`capture_tracked`]), making the uppers a manifest's tree again ([`restore`]:
//! rollback, fork, wake) and comparing two manifests ([`diff`]).
//!
//! It reads and writes the uppers as host root while the sandbox is frozen
//! or stopped, and never follows a symlink found in them.

mod bytes;
mod capture;
mod diff;
mod error;
mod freeze;
mod manifest;
mod meta;
mod progress;
mod restore;
mod segments;
mod watch;
pub(crate) use cairn_fsat as sys;

pub use bytes::ByteBuf;
pub use capture::{capture, capture_tracked, CaptureStats, LayerSpec};
pub use diff::{diff, Diff};
pub use error::{Error, Result};
pub use freeze::{Freezer, NoFreeze};
pub use manifest::{encode, load, referenced_chunks, store, Entry, EntryKind, Extent, LayerTree, Manifest, Timestamp, VERSION};
// For the fuzz targets only.
#[doc(hidden)]
pub use manifest::{decode, decode_root, Root, RootLayer};
#[doc(hidden)]
pub use segments::decode_segment;
pub use segments::{Segments, AVERAGE as SEGMENT_AVERAGE};
pub use meta::{IdShift, NOBODY};
pub use progress::Progress;
pub use restore::{restore, RestoreStats};
pub use watch::{ChangeWatch, Changed, MAX_DIRS};
