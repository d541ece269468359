//! Cairn's content-addressed storage: everything a snapshot's data becomes
//! once it leaves the task's disk.
//!
//! - [`backend`]: objects keyed by ([`Kind`], id) behind the [`ReadBackend`] /
//!   [`WriteBackend`] traits, implemented on `object_store` (a local
//!   directory by default; S3-compatible storage plugs in the same way).
//! - [`chunker`]: content-defined chunking (FastCDC) with BLAKE3 chunk ids.
//! - [`pack`]: small zstd-compressed chunks grouped into packs, so a
//!   snapshot of many small files is a few objects, not thousands.
//! - [`index`]: which pack holds each chunk, so a known chunk is never
//!   stored twice.
//! - [`repo`]: the [`Repository`] tying these together, one file per
//!   concern: the repository itself, the pack writer, `check` and `gc`.
//!
//! Write order (crash safety): packs, then the index file naming them, then
//! the manifest; each object is durable (fsync'd) before the next is written,
//! and objects are never modified once written. The caller records the
//! snapshot row last.
//!
//! The API is synchronous: callers run it on blocking threads. The
//! `object_store` backend owns a small runtime for its async calls.
//!
//! Garbage collection and writers must not overlap (a writer deduplicates
//! against chunks gc may be deleting): callers hold
//! [`Repository::gc_lock`], the one gc lock, for reading during a snapshot
//! or a restore and for writing during `gc`.

pub mod backend;
pub mod chunker;
mod error;
pub mod id;
pub mod index;
pub mod pack;
pub mod repo;
#[cfg(test)]
mod testutil;

pub use backend::{Kind, ObjectInfo, ObjectStoreBackend, ReadBackend, WriteBackend};
pub use error::{Error, Result};
pub use id::ObjectId;
pub use repo::{prepare_manifest, PreparedManifest, CheckReport, GcReport, PackWriter, RepoOptions, RepoStats, Repository, WriteStats};
