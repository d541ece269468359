//! Cairn's content-addressed storage: everything a snapshot's data becomes
//! once it leaves the task's disk.
//!
//! - [`backend`]: objects keyed by ([`Kind`], id) behind the [`ReadBackend`] /
//!   [`WriteBackend`] traits, implemented on `object_store`: a local
//!   directory by default, or S3-compatible storage.
//! - [`cache`]: a local cache of a remote store's packs, so that a node
//!   downloads a pack once.
//! - [`url`]: the store a node uses (`--blob URL`), opened with its cache.
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
//! `object_store` backend owns a small runtime for its async calls. Work on
//! many objects (pack uploads, index loads, a restore's downloads, gc's
//! deletes, check's reads) runs [`ReadBackend::concurrency`] transfers at
//! once.
//!
//! Garbage collection and writers must not overlap (a writer deduplicates
//! against chunks gc may be deleting): callers hold
//! [`Repository::gc_lock`], the one gc lock, for reading during a snapshot
//! or a restore and for writing during `gc`.

pub mod backend;
pub mod cache;
pub mod chunker;
mod error;
pub mod id;
pub mod index;
#[cfg(any(test, feature = "test-util"))]
pub mod moto;
pub mod pack;
pub mod parallel;
pub mod repo;
#[cfg(test)]
mod testutil;
pub mod url;

pub use backend::{CacheStats, FetchStats, Kind, ObjectInfo, ObjectStoreBackend, ReadBackend, WriteBackend};
pub use cache::{CachedBackend, DEFAULT_CACHE_BYTES};
pub use url::BlobUrl;
pub use error::{Error, Result};
pub use id::ObjectId;
pub use repo::{prepare_manifest, PreparedManifest, CheckReport, GcReport, PackWriter, RepoOptions, RepoStats, Repository, WriteStats};
