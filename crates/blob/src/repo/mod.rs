//! The repository: chunks written through packs and the index, manifests,
//! and the maintenance operations, one file each: [`packer`] (the
//! [`PackWriter`] that turns chunks into packs), [`check`] and [`gc`].

mod check;
mod gc;
mod packer;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;
use serde::Serialize;

use crate::index::{self, Location, MemIndex};
use crate::pack::{self, COMPRESSION_LEVEL, TARGET_PACK_SIZE};
use crate::parallel::map_bounded;
use crate::{Error, FetchStats, Kind, ObjectId, Result, WriteBackend};

pub use check::CheckReport;
pub use gc::GcReport;
pub use packer::{PackWriter, WriteStats};

/// An error text on one line, for a report line.
fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// A content-addressed store of chunks and manifests on one backend.
/// Cheap to share (`Arc`); all methods take `&self` and are thread-safe.
pub struct Repository {
    backend: Arc<dyn WriteBackend>,
    index: RwLock<MemIndex>,
    gc_lock: tokio::sync::RwLock<()>,
    pack_target: usize,
}

impl std::fmt::Debug for Repository {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stats = self.stats();
        f.debug_struct("Repository")
            .field("location", &self.backend.location())
            .field("packs", &stats.packs)
            .field("chunks", &stats.chunks)
            .finish()
    }
}

/// Tuning for [`Repository::open_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepoOptions {
    /// A pack is written once its chunks reach this many bytes.
    pub pack_target: usize,
}

impl Default for RepoOptions {
    fn default() -> Self {
        RepoOptions { pack_target: TARGET_PACK_SIZE }
    }
}

/// What the repository holds, from its in-memory index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RepoStats {
    /// Indexed packs.
    pub packs: u64,
    /// Distinct chunks.
    pub chunks: u64,
    /// Bytes of the indexed packs (compressed chunks and trailers).
    pub stored_bytes: u64,
}

impl Repository {
    /// Opens the repository on `backend`, loading every index file.
    pub fn open(backend: Arc<dyn WriteBackend>) -> Result<Arc<Repository>> {
        Self::open_with(backend, RepoOptions::default())
    }

    /// [`Repository::open`] with non-default tuning.
    pub fn open_with(backend: Arc<dyn WriteBackend>, options: RepoOptions) -> Result<Arc<Repository>> {
        let repo = Repository {
            backend,
            index: RwLock::new(MemIndex::default()),
            gc_lock: tokio::sync::RwLock::new(()),
            pack_target: options.pack_target.max(1),
        };
        repo.refresh_index()?;
        Ok(Arc::new(repo))
    }

    /// The backend this repository stores its objects in.
    pub fn backend(&self) -> &Arc<dyn WriteBackend> {
        &self.backend
    }

    /// Coordinates `gc` with writers in this process. Hold `read()` for the
    /// whole of a snapshot (from its first `add_chunk` until its manifest is
    /// written and recorded by the caller) and `write()` around `gc`:
    /// otherwise gc could delete a pack whose chunk a writer has just
    /// deduplicated against, or a young snapshot's packs and manifest once
    /// they outlive the grace period. The repository does not take it
    /// itself (a writer's lifetime is the caller's to know).
    ///
    /// A tokio lock: the daemon holds it across the awaits of a snapshot,
    /// a restore or a gc.
    pub fn gc_lock(&self) -> &tokio::sync::RwLock<()> {
        &self.gc_lock
    }

    /// Loads index files that appeared since the last load (written by
    /// another process on the same backend). Returns how many were loaded.
    pub fn refresh_index(&self) -> Result<u64> {
        let listed = self.backend.list(Kind::Index)?;
        let known: HashSet<String> = {
            let idx = self.read_index();
            idx.files.keys().map(ObjectId::to_hex).chain(idx.unreadable.keys().cloned()).collect()
        };
        let mut todo = Vec::new();
        for info in listed {
            if known.contains(&info.id) {
                continue;
            }
            let Ok(id) = info.id.parse::<ObjectId>() else {
                tracing::warn!(name = %info.id, "ignoring a file in the index directory that is not named by an id");
                continue;
            };
            todo.push((id, info.id));
        }
        // Read and decoded several at once (a remote store answers each
        // read in milliseconds), merged in the listing's order.
        let read = map_bounded(todo, self.backend.concurrency(), |(id, name)| {
            let packs = self.backend.read(Kind::Index, &name).map(|stored| index::decode(&id, &stored));
            (id, name, packs)
        });
        let mut loaded = 0;
        for (id, name, packs) in read {
            let packs = match packs {
                Ok(packs) => packs,
                // Deleted by a concurrent gc after the listing.
                Err(Error::Missing(..)) => continue,
                Err(e) => return Err(e),
            };
            let mut idx = self.write_index();
            match packs {
                Ok(packs) => {
                    idx.insert_file(id, &packs);
                    loaded += 1;
                }
                Err(e) => {
                    // Keep going: the chunks it lists are merely re-stored by
                    // the next writer; check reports it and gc refuses to run.
                    tracing::warn!(index = %id, error = %e, "index file unreadable");
                    idx.unreadable.insert(name, one_line(&e.to_string()));
                }
            }
        }
        Ok(loaded)
    }

    /// True when the chunk is stored (in a durable, indexed pack).
    pub fn has_chunk(&self, id: &ObjectId) -> bool {
        self.read_index().chunks.contains_key(id)
    }

    /// Reads a chunk, decompressed; checks that it hashes to `id` and names
    /// the pack and chunk when it does not (never returns wrong data). A
    /// chunk that fails the check in a locally cached copy of its pack is
    /// read once more from the store, with the copy dropped.
    ///
    /// A chunk the in-memory index does not know makes it load the index
    /// files written since (by another process or node sharing the store)
    /// before it is reported unknown.
    pub fn read_chunk(&self, id: &ObjectId) -> Result<Vec<u8>> {
        let known = self.read_index().chunks.get(id).copied();
        let loc: Location = match known {
            Some(loc) => loc,
            None => {
                self.refresh_index()?;
                self.read_index().chunks.get(id).copied().ok_or_else(|| Error::UnknownChunk(id.to_hex()))?
            }
        };
        let pack = loc.pack.to_hex();
        match self.read_chunk_at(&loc, &pack) {
            Err(Error::Corrupt(..)) if self.backend.evict(Kind::Pack, &pack) => {
                tracing::warn!(%pack, chunk = %id, "a cached pack failed verification; read again from the store");
                self.read_chunk_at(&loc, &pack)
            }
            other => other,
        }
    }

    fn read_chunk_at(&self, loc: &Location, pack: &str) -> Result<Vec<u8>> {
        // Some stores refuse an empty range; an empty chunk needs no read.
        let stored = match loc.entry.length {
            0 => Bytes::new(),
            len => self.backend.read_range(Kind::Pack, pack, loc.entry.offset, len.into())?,
        };
        pack::decode_chunk(&loc.entry, &stored).map_err(|why| Error::Corrupt(Kind::Pack, pack.to_string(), why))
    }

    /// Gets the packs holding `chunks` ready to read, in the order the
    /// chunks will be read: a backend with a local cache of a remote store
    /// downloads the ones it lacks, several at once (a restore calls this
    /// before reading its chunks one by one). Does nothing for a local
    /// store. Unknown chunks are skipped (their read reports them).
    pub fn prefetch<'a>(&self, chunks: impl IntoIterator<Item = &'a ObjectId>) -> FetchStats {
        let chunks: Vec<&ObjectId> = chunks.into_iter().collect();
        // Chunks written by another node since the index was loaded.
        if chunks.iter().any(|c| !self.has_chunk(c)) {
            if let Err(e) = self.refresh_index() {
                tracing::warn!(error = %e, "cannot load new index files before a restore");
            }
        }
        let mut seen = HashSet::new();
        let packs: Vec<(String, u64)> = {
            let idx = self.read_index();
            chunks
                .into_iter()
                .filter_map(|c| idx.chunks.get(c).map(|loc| loc.pack))
                .filter(|p| seen.insert(*p))
                .filter_map(|p| idx.packs.get(&p).map(|summary| (p.to_hex(), summary.size)))
                .collect()
        };
        if packs.is_empty() {
            return FetchStats::default();
        }
        let stats = self.backend.prefetch(Kind::Pack, &packs);
        if stats.objects > 0 {
            tracing::debug!(packs = stats.objects, bytes = stats.bytes, cached = stats.cached, "prefetched packs");
        }
        stats
    }

    /// Stores a manifest (any bytes; compressed here) under the hash of its
    /// content, durably. Writing the same manifest twice is a no-op.
    pub fn put_manifest(&self, data: &[u8]) -> Result<ObjectId> {
        self.put_prepared_manifest(prepare_manifest(data)?)
    }

    /// Stores a manifest made ready by [`prepare_manifest`] (which may run
    /// on another thread, e.g. while packs are being flushed).
    pub fn put_prepared_manifest(&self, m: PreparedManifest) -> Result<ObjectId> {
        let hex = m.id.to_hex();
        if !self.backend.exists(Kind::Manifest, &hex)? {
            self.backend.write(Kind::Manifest, &hex, Bytes::from(m.stored))?;
        }
        Ok(m.id)
    }

    /// Reads a manifest back, verifying its hash.
    pub fn get_manifest(&self, id: &ObjectId) -> Result<Vec<u8>> {
        let hex = id.to_hex();
        let stored = self.backend.read(Kind::Manifest, &hex)?;
        let data = zstd::stream::decode_all(&stored[..])
            .map_err(|e| Error::Corrupt(Kind::Manifest, hex.clone(), format!("does not decompress: {e}")))?;
        let actual = ObjectId::of(&data);
        if actual != *id {
            return Err(Error::Corrupt(Kind::Manifest, hex, format!("content hashes to {actual}")));
        }
        Ok(data)
    }

    /// What the repository holds (from the in-memory index; no I/O).
    pub fn stats(&self) -> RepoStats {
        let idx = self.read_index();
        RepoStats {
            packs: idx.packs.len() as u64,
            chunks: idx.chunks.len() as u64,
            stored_bytes: idx.packs.values().map(|p| p.size).sum(),
        }
    }

    // A panic while holding the lock cannot leave the index half-updated in
    // a harmful way (each update is a few map operations), so poisoning is
    // ignored.
    pub(crate) fn read_index(&self) -> RwLockReadGuard<'_, MemIndex> {
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_index(&self) -> RwLockWriteGuard<'_, MemIndex> {
        self.index.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A manifest hashed and compressed, ready to store.
#[derive(Debug)]
pub struct PreparedManifest {
    pub id: ObjectId,
    stored: Vec<u8>,
}

/// Hashes and compresses a manifest (CPU only, no I/O).
pub fn prepare_manifest(data: &[u8]) -> Result<PreparedManifest> {
    let id = ObjectId::of(data);
    let stored = zstd::bulk::compress(data, COMPRESSION_LEVEL).map_err(|e| Error::Compress(format!("manifest {id}"), e.to_string()))?;
    Ok(PreparedManifest { id, stored })
}
