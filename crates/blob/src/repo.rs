//! The repository: chunks written through packs and the index, manifests,
//! and the maintenance operations `check` and `gc`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use serde::Serialize;

use crate::index::{self, IndexedPack, Location, MemIndex};
use crate::pack::{self, FinishedPack, PackBuilder, COMPRESSION_LEVEL, TARGET_PACK_SIZE};
use crate::{Error, Kind, ObjectId, ObjectInfo, Result, WriteBackend};

/// New chunks waiting for the pack worker; bounds the memory a fast reader
/// can pile up (chunks are at most a MiB each from the chunker).
const WORKER_QUEUE: usize = 32;
/// Packs written at once: each write ends in fsyncs whose latency a second
/// write in flight hides.
const PACK_WRITERS: usize = 2;

/// A content-addressed store of chunks and manifests on one backend.
/// Cheap to share (`Arc`); all methods take `&self` and are thread-safe.
pub struct Repository {
    backend: Arc<dyn WriteBackend>,
    index: RwLock<MemIndex>,
    gc_lock: RwLock<()>,
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

/// What one writer added.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WriteStats {
    /// Chunks offered to the writer.
    pub chunks: u64,
    /// Chunks that were new and got stored.
    pub new_chunks: u64,
    /// Uncompressed bytes offered.
    pub bytes: u64,
    /// Bytes written to the backend (compressed packs, index, manifest).
    pub stored_bytes: u64,
    /// Pack objects written.
    pub packs: u64,
}

/// Buffers new chunks into packs; dropping it without [`PackWriter::finish`]
/// leaves only unreferenced packs (garbage for `gc`), never a visible index
/// entry for a pack that is not durable.
///
/// Chunks are hashed on the caller's thread; compression, pack assembly and
/// writes happen on a background thread, so reading, hashing and writing
/// overlap.
pub struct PackWriter {
    repo: Arc<Repository>,
    /// New chunks handed to the worker, so a repeat within one snapshot is
    /// not stored twice before the index knows it.
    seen: HashSet<ObjectId>,
    stats: WriteStats,
    progress: Arc<Progress>,
    worker: Option<Worker>,
    /// Why the worker stopped, once it has: every later call fails too.
    failed: Option<String>,
}

impl std::fmt::Debug for PackWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackWriter").field("stats", &self.stats()).field("failed", &self.failed).finish()
    }
}

/// Counters the worker updates and [`PackWriter::stats`] reads.
#[derive(Debug, Default)]
struct Progress {
    stored_bytes: AtomicU64,
    packs: AtomicU64,
}

#[derive(Debug)]
struct Worker {
    jobs: SyncSender<Job>,
    handle: JoinHandle<Result<Vec<IndexedPack>>>,
    /// Set when the writer is dropped: the worker stops without writing
    /// anything more.
    abort: Arc<AtomicBool>,
}

enum Job {
    Chunk(ObjectId, Vec<u8>),
    /// Answer once every chunk sent before has been compressed.
    Settle(SyncSender<()>),
    Finish,
}

/// The outcome of `check`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CheckReport {
    pub packs: u64,
    pub chunks: u64,
    pub manifests: u64,
    /// Bytes read and verified (with `read_data`).
    pub bytes_read: u64,
    /// Chunks read back from their packs, decompressed and hashed (with
    /// `read_data`).
    pub chunks_verified: u64,
    /// One line per problem, naming the object: e.g.
    /// `pack 3fa2…: chunk 91bc… hashes to 77de… (corrupted)`,
    /// `manifest 12ab…: missing`, `chunk 55ef… (in manifest 12ab…): not in the index`.
    pub problems: Vec<String>,
}

impl CheckReport {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// The outcome of `gc` (or what it would do, with `dry_run`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct GcReport {
    pub packs_deleted: u64,
    pub manifests_deleted: u64,
    /// Index files replaced by one without the deleted packs (or deleted,
    /// when they listed nothing else).
    pub index_files_rewritten: u64,
    /// Bytes of the deleted packs and manifests.
    pub bytes_freed: u64,
    /// Unreferenced objects kept because they are younger than the grace period.
    pub kept_young: u64,
    /// Packs kept whole because some of their chunks are still referenced.
    pub packs_partly_live: u64,
    pub dry_run: bool,
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
            gc_lock: RwLock::new(()),
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
    pub fn gc_lock(&self) -> &RwLock<()> {
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
        let mut loaded = 0;
        for info in listed {
            if known.contains(&info.id) {
                continue;
            }
            let Ok(id) = info.id.parse::<ObjectId>() else {
                tracing::warn!(name = %info.id, "ignoring a file in the index directory that is not named by an id");
                continue;
            };
            let packs = match self.backend.read(Kind::Index, &info.id) {
                Ok(stored) => index::decode(&id, &stored),
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
                    idx.unreadable.insert(info.id.clone(), one_line(&e.to_string()));
                }
            }
        }
        Ok(loaded)
    }

    /// A writer for new chunks (one per snapshot).
    pub fn writer(self: &Arc<Self>) -> PackWriter {
        PackWriter {
            repo: Arc::clone(self),
            seen: HashSet::new(),
            stats: WriteStats::default(),
            progress: Arc::new(Progress::default()),
            worker: None,
            failed: None,
        }
    }

    /// True when the chunk is stored (in a durable, indexed pack).
    pub fn has_chunk(&self, id: &ObjectId) -> bool {
        self.read_index().chunks.contains_key(id)
    }

    /// Reads a chunk, decompressed; checks that it hashes to `id` and names
    /// the pack and chunk when it does not (never returns wrong data).
    pub fn read_chunk(&self, id: &ObjectId) -> Result<Vec<u8>> {
        let loc: Location = self.read_index().chunks.get(id).copied().ok_or_else(|| Error::UnknownChunk(id.to_hex()))?;
        let pack = loc.pack.to_hex();
        // Some stores refuse an empty range; an empty chunk needs no read.
        let stored = match loc.entry.length {
            0 => Bytes::new(),
            len => self.backend.read_range(Kind::Pack, &pack, loc.entry.offset, len.into())?,
        };
        pack::decode_chunk(&loc.entry, &stored).map_err(|why| Error::Corrupt(Kind::Pack, pack, why))
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

    /// Checks that every manifest in `manifests` and every chunk in
    /// `chunks` (the ones the caller's snapshots reference, with the manifest
    /// that names each) exists and is indexed in an existing pack; with
    /// `read_data`, also reads every pack and manifest and checks every
    /// chunk's hash.
    ///
    /// Problems with single objects are lines in the report; only failing
    /// to list the backend (or to read a new index file) is an error.
    pub fn check(&self, manifests: &[ObjectId], chunks: &[(ObjectId, ObjectId)], read_data: bool) -> Result<CheckReport> {
        self.refresh_index()?;
        let mut report = CheckReport::default();
        let stored_packs: HashMap<String, ObjectInfo> = self.backend.list(Kind::Pack)?.into_iter().map(|o| (o.id.clone(), o)).collect();
        let stored_manifests: HashMap<String, ObjectInfo> = self.backend.list(Kind::Manifest)?.into_iter().map(|o| (o.id.clone(), o)).collect();

        let idx = self.read_index();
        let mut unreadable: Vec<_> = idx.unreadable.iter().map(|(id, why)| format!("index {id}: unreadable: {why}")).collect();
        unreadable.sort();
        report.problems.extend(unreadable);

        // Referenced chunks, and how many of them each missing pack takes
        // along (one line per pack rather than one per chunk).
        let mut chunk_problems = Vec::new();
        let mut referenced_in: HashMap<ObjectId, u64> = HashMap::new();
        let mut seen = HashSet::new();
        for (chunk, manifest) in chunks {
            if !seen.insert(*chunk) {
                continue;
            }
            match idx.chunks.get(chunk) {
                None => chunk_problems.push(format!("chunk {chunk} (in manifest {manifest}): not in the index")),
                Some(loc) => *referenced_in.entry(loc.pack).or_default() += 1,
            }
        }
        report.chunks = seen.len() as u64;

        let mut packs: Vec<_> = idx.packs.iter().map(|(id, summary)| (*id, *summary)).collect();
        packs.sort_by_key(|(id, _)| *id);
        report.packs = packs.len() as u64;
        let mut present = Vec::new();
        for (pack, summary) in &packs {
            match stored_packs.get(&pack.to_hex()) {
                None => {
                    let refs = referenced_in.get(pack).copied().unwrap_or(0);
                    report.problems.push(format!("pack {pack}: missing ({} chunks indexed in it, {refs} of them referenced)", summary.chunks));
                }
                Some(info) if info.size != summary.size => {
                    report.problems.push(format!("pack {pack}: {} bytes, the index says {} (truncated or replaced)", info.size, summary.size));
                    present.push(*pack);
                }
                Some(_) => present.push(*pack),
            }
        }

        let mut distinct = HashSet::new();
        let manifests: Vec<ObjectId> = manifests.iter().copied().filter(|m| distinct.insert(*m)).collect();
        report.manifests = manifests.len() as u64;
        for m in &manifests {
            if !stored_manifests.contains_key(&m.to_hex()) {
                report.problems.push(format!("manifest {m}: missing"));
            }
        }
        report.problems.extend(chunk_problems);

        if !read_data {
            return Ok(report);
        }
        let mut indexed_in: HashMap<ObjectId, Vec<Location>> = HashMap::new();
        for loc in idx.chunks.values() {
            indexed_in.entry(loc.pack).or_default().push(*loc);
        }
        // Reading takes long: do not hold the index meanwhile.
        drop(idx);
        for pack in present {
            match self.backend.read(Kind::Pack, &pack.to_hex()) {
                Ok(data) => {
                    report.bytes_read += data.len() as u64;
                    let expected = indexed_in.remove(&pack).unwrap_or_default();
                    verify_pack(&pack, &data, &expected, &mut report);
                }
                Err(Error::Missing(..)) => report.problems.push(format!("pack {pack}: missing")),
                Err(e) => report.problems.push(format!("pack {pack}: unreadable: {}", one_line(&e.to_string()))),
            }
        }
        for m in &manifests {
            let Some(info) = stored_manifests.get(&m.to_hex()) else { continue };
            match self.get_manifest(m) {
                Ok(_) => report.bytes_read += info.size,
                Err(Error::Corrupt(_, _, why)) => report.problems.push(format!("manifest {m}: {} (corrupted)", one_line(&why))),
                Err(Error::Missing(..)) => report.problems.push(format!("manifest {m}: missing")),
                Err(e) => report.problems.push(format!("manifest {m}: unreadable: {}", one_line(&e.to_string()))),
            }
        }
        Ok(report)
    }

    /// Mark and sweep: deletes packs none of whose chunks are in `live_chunks`
    /// and manifests not in `live_manifests`, except objects younger than
    /// `grace`; rewrites index files to drop entries of deleted packs.
    ///
    /// Packs no index file mentions (left by a writer that crashed or was
    /// dropped) are deleted once older than `grace`. Order, for crash
    /// safety: index files are rewritten (new file durable, then the old one
    /// deleted) before any pack goes, so an index never names a deleted
    /// pack. Refuses to run while an index file is unreadable, since the
    /// packs it lists would look unreferenced. Take [`Repository::gc_lock`]
    /// for writing around it.
    pub fn gc(&self, live_manifests: &HashSet<ObjectId>, live_chunks: &HashSet<ObjectId>, grace: Duration, dry_run: bool) -> Result<GcReport> {
        self.refresh_index()?;
        if let Some((id, why)) = self.read_index().unreadable.iter().next() {
            return Err(Error::Corrupt(Kind::Index, id.clone(), format!("{why}; gc will not run until it is repaired or removed")));
        }
        let mut report = GcReport { dry_run, ..GcReport::default() };
        let now = SystemTime::now();
        // A clock step backwards makes objects look young: keep them.
        let young = |info: &ObjectInfo| now.duration_since(info.modified).map_or(true, |age| age < grace);

        // What each index file lists is the truth (the in-memory index keeps
        // one location per chunk, and other processes may have added files).
        let mut files: Vec<(ObjectId, Vec<IndexedPack>)> = Vec::new();
        for info in self.backend.list(Kind::Index)? {
            let Ok(id) = info.id.parse::<ObjectId>() else { continue };
            match self.backend.read(Kind::Index, &info.id) {
                Ok(stored) => files.push((id, index::decode(&id, &stored)?)),
                Err(Error::Missing(..)) => continue,
                Err(e) => return Err(e),
            }
        }
        let mut pack_chunks: HashMap<ObjectId, HashSet<ObjectId>> = HashMap::new();
        for (_, packs) in &files {
            for p in packs {
                pack_chunks.entry(p.id).or_default().extend(p.chunks.iter().map(|c| c.id));
            }
        }

        let stored_packs: HashMap<ObjectId, ObjectInfo> = self
            .backend
            .list(Kind::Pack)?
            .into_iter()
            .filter_map(|info| Some((info.id.parse::<ObjectId>().ok()?, info)))
            .collect();
        // Packs to drop from the index (deleted, or already gone) and packs
        // to delete from the store.
        let mut dropped: HashSet<ObjectId> = HashSet::new();
        let mut delete_packs: Vec<(ObjectId, u64)> = Vec::new();
        for (pack, chunks) in &pack_chunks {
            let live = chunks.iter().filter(|c| live_chunks.contains(c)).count();
            if live > 0 {
                if live < chunks.len() {
                    report.packs_partly_live += 1;
                }
                continue;
            }
            match stored_packs.get(pack) {
                None => {
                    dropped.insert(*pack);
                }
                Some(info) if young(info) => report.kept_young += 1,
                Some(info) => {
                    dropped.insert(*pack);
                    delete_packs.push((*pack, info.size));
                }
            }
        }
        for (pack, info) in &stored_packs {
            if pack_chunks.contains_key(pack) {
                continue;
            }
            if young(info) {
                report.kept_young += 1;
            } else {
                delete_packs.push((*pack, info.size));
            }
        }

        let mut delete_manifests: Vec<(ObjectId, u64)> = Vec::new();
        for info in self.backend.list(Kind::Manifest)? {
            let Ok(id) = info.id.parse::<ObjectId>() else { continue };
            if live_manifests.contains(&id) {
                continue;
            }
            if young(&info) {
                report.kept_young += 1;
            } else {
                delete_manifests.push((id, info.size));
            }
        }

        let rewrites: Vec<(ObjectId, Vec<IndexedPack>)> = files
            .into_iter()
            .filter(|(_, packs)| packs.iter().any(|p| dropped.contains(&p.id)))
            .map(|(id, packs)| (id, packs.into_iter().filter(|p| !dropped.contains(&p.id)).collect()))
            .collect();

        report.packs_deleted = delete_packs.len() as u64;
        report.manifests_deleted = delete_manifests.len() as u64;
        report.index_files_rewritten = rewrites.len() as u64;
        report.bytes_freed = delete_packs.iter().chain(&delete_manifests).map(|(_, size)| size).sum();
        if dry_run {
            return Ok(report);
        }

        // Forget the packs first, so nothing in this process deduplicates
        // against or reads from them any more.
        self.write_index().remove_packs(&dropped);
        for (old, remaining) in rewrites {
            let new = if remaining.is_empty() {
                None
            } else {
                let (new_id, stored) = index::encode(&remaining)?;
                self.backend.write(Kind::Index, &new_id.to_hex(), Bytes::from(stored))?;
                Some(new_id)
            };
            self.backend.delete(Kind::Index, &old.to_hex())?;
            let mut idx = self.write_index();
            idx.files.remove(&old);
            if let Some(new_id) = new {
                idx.files.insert(new_id, remaining.iter().map(|p| p.id).collect());
            }
        }
        fail::fail_point!("gc.index_rewritten");
        for (pack, _) in &delete_packs {
            self.backend.delete(Kind::Pack, &pack.to_hex())?;
        }
        fail::fail_point!("gc.packs_deleted");
        for (manifest, _) in &delete_manifests {
            self.backend.delete(Kind::Manifest, &manifest.to_hex())?;
        }
        tracing::info!(
            packs = report.packs_deleted,
            manifests = report.manifests_deleted,
            index_files = report.index_files_rewritten,
            bytes = report.bytes_freed,
            "gc done"
        );
        Ok(report)
    }

    // A panic while holding the lock cannot leave the index half-updated in
    // a harmful way (each update is a few map operations), so poisoning is
    // ignored.
    fn read_index(&self) -> RwLockReadGuard<'_, MemIndex> {
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_index(&self) -> RwLockWriteGuard<'_, MemIndex> {
        self.index.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Verifies one pack read whole: its hash, its trailer, every chunk in it,
/// and that the index's entries for it match the trailer.
fn verify_pack(pack: &ObjectId, data: &[u8], indexed: &[Location], report: &mut CheckReport) {
    let problems_before = report.problems.len();
    let entries = match pack::parse_trailer(data) {
        Ok(entries) => entries,
        Err(why) => {
            report.problems.push(format!("pack {pack}: {why}"));
            return;
        }
    };
    for entry in &entries {
        // parse_trailer checked that every entry lies inside the pack.
        let start = entry.offset as usize;
        let stored = &data[start..start + entry.length as usize];
        match pack::decode_chunk(entry, stored) {
            Ok(_) => report.chunks_verified += 1,
            Err(why) => report.problems.push(format!("pack {pack}: {} (corrupted)", one_line(&why))),
        }
    }
    let in_trailer: HashSet<_> = entries.iter().collect();
    for loc in indexed {
        if !in_trailer.contains(&loc.entry) {
            let (id, offset, length) = (loc.entry.id, loc.entry.offset, loc.entry.length);
            report.problems.push(format!("pack {pack}: chunk {id} is indexed at {offset}+{length} but the pack does not hold it there"));
        }
    }
    let actual = ObjectId::of(data);
    if actual != *pack && report.problems.len() == problems_before {
        report.problems.push(format!("pack {pack}: content hashes to {actual} (corrupted)"));
    }
}

fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

impl PackWriter {
    /// Adds one chunk (uncompressed data); returns its id and whether it was
    /// new. Known chunks (in the index or already added by this writer) are
    /// not stored again. Full packs are written to the backend as they fill.
    ///
    /// Errors of the background worker (a failed pack write) surface here,
    /// from a later call, or from `finish`.
    pub fn add_chunk(&mut self, data: &[u8]) -> Result<(ObjectId, bool)> {
        if let Some(why) = &self.failed {
            return Err(Error::Writer(format!("an earlier write failed: {why}")));
        }
        if u32::try_from(data.len()).is_err() {
            return Err(Error::ChunkTooLarge(data.len(), u32::MAX.into()));
        }
        let id = ObjectId::of(data);
        self.stats.chunks += 1;
        self.stats.bytes += data.len() as u64;
        if self.seen.contains(&id) || self.repo.has_chunk(&id) {
            return Ok((id, false));
        }
        let sent = self.worker()?.jobs.send(Job::Chunk(id, data.to_vec())).is_ok();
        if !sent {
            // The worker hung up: it stopped on an error; collect it.
            let err = match self.stop_worker(false) {
                Err(e) => e,
                Ok(_) => Error::Writer("the pack worker stopped".into()),
            };
            self.failed = Some(err.to_string());
            return Err(err);
        }
        self.seen.insert(id);
        self.stats.new_chunks += 1;
        Ok((id, true))
    }

    /// Writes the last pack, then one index file for every pack this writer
    /// wrote; returns what was added. After it returns, every chunk added is
    /// durable and readable.
    pub fn finish(mut self) -> Result<WriteStats> {
        if let Some(why) = self.failed.take() {
            return Err(Error::Writer(format!("an earlier write failed: {why}")));
        }
        let packs = self.stop_worker(true)?;
        if !packs.is_empty() {
            let (file, stored) = index::encode(&packs)?;
            let len = stored.len() as u64;
            self.repo.backend.write(Kind::Index, &file.to_hex(), Bytes::from(stored))?;
            self.progress.stored_bytes.fetch_add(len, Ordering::Relaxed);
            self.repo.write_index().insert_file(file, &packs);
        }
        Ok(self.stats())
    }

    /// True when the chunk is stored, or added by this writer and on its
    /// way to a pack.
    pub fn knows(&self, id: &ObjectId) -> bool {
        self.seen.contains(id) || self.repo.has_chunk(id)
    }

    /// Waits until every chunk added so far has been compressed, so the
    /// background work does not compete for the CPU with what comes next
    /// (a snapshot settles before it freezes the sandbox). Writes of full
    /// packs may still be in flight.
    pub fn settle(&mut self) -> Result<()> {
        let Some(worker) = &self.worker else { return Ok(()) };
        let (done, wait) = sync_channel(1);
        if worker.jobs.send(Job::Settle(done)).is_ok() && wait.recv().is_ok() {
            return Ok(());
        }
        // The worker stopped: on an error, which finish reports.
        Ok(())
    }

    /// Statistics so far.
    pub fn stats(&self) -> WriteStats {
        WriteStats {
            stored_bytes: self.progress.stored_bytes.load(Ordering::Relaxed),
            packs: self.progress.packs.load(Ordering::Relaxed),
            ..self.stats
        }
    }

    /// The background worker, started on the first new chunk (a snapshot
    /// with nothing new never starts one).
    fn worker(&mut self) -> Result<&Worker> {
        if self.worker.is_none() {
            let (jobs, queue) = sync_channel(WORKER_QUEUE);
            let abort = Arc::new(AtomicBool::new(false));
            let backend = Arc::clone(&self.repo.backend);
            let (progress, stop, target) = (Arc::clone(&self.progress), Arc::clone(&abort), self.repo.pack_target);
            let handle = std::thread::Builder::new()
                .name("cairn-blob-pack".into())
                .spawn(move || pack_worker(backend, queue, target, progress, stop))
                .map_err(|e| Error::Writer(format!("cannot start the pack worker: {e}")))?;
            self.worker = Some(Worker { jobs, handle, abort });
        }
        self.worker.as_ref().ok_or_else(|| Error::Writer("no pack worker".into()))
    }

    /// Stops the worker (after it writes its last pack, with `finish`) and
    /// returns the packs it wrote, or its first error.
    fn stop_worker(&mut self, finish: bool) -> Result<Vec<IndexedPack>> {
        let Some(worker) = self.worker.take() else { return Ok(Vec::new()) };
        if finish {
            // A send fails only when the worker already stopped; joining
            // tells why.
            let _ = worker.jobs.send(Job::Finish);
        }
        drop(worker.jobs);
        worker.handle.join().unwrap_or_else(|_| Err(Error::Writer("the pack worker panicked".into())))
    }
}

impl Drop for PackWriter {
    fn drop(&mut self) {
        if let Some(worker) = &self.worker {
            worker.abort.store(true, Ordering::Relaxed);
        }
        // Waits at most for a pack write in progress; what was written is
        // unindexed, so gc removes it after the grace period.
        let _ = self.stop_worker(false);
    }
}

/// The background half of a writer: compresses chunks into packs on this
/// thread and hands each full pack (and the last one, on `Finish`) to
/// [`PACK_WRITERS`] threads that write them, so compressing the next pack
/// overlaps with writing and syncing the previous ones.
fn pack_worker(
    backend: Arc<dyn WriteBackend>,
    jobs: Receiver<Job>,
    target: usize,
    progress: Arc<Progress>,
    abort: Arc<AtomicBool>,
) -> Result<Vec<IndexedPack>> {
    // One pack waits while others are written: bounded memory, and a slow
    // store slows the compressor, which slows `add_chunk`.
    let (full, to_write) = sync_channel::<FinishedPack>(1);
    let to_write = Arc::new(Mutex::new(to_write));
    let upload_failed = Arc::new(AtomicBool::new(false));
    let mut uploaders = Vec::with_capacity(PACK_WRITERS);
    for _ in 0..PACK_WRITERS {
        let (backend, to_write, progress) = (Arc::clone(&backend), Arc::clone(&to_write), Arc::clone(&progress));
        let (abort, failed) = (Arc::clone(&abort), Arc::clone(&upload_failed));
        let uploader = std::thread::Builder::new()
            .name("cairn-blob-write".into())
            .spawn(move || {
                let written = write_packs(&*backend, &to_write, &progress, &abort);
                if written.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                written
            })
            .map_err(|e| Error::Writer(format!("cannot start a pack write thread: {e}")))?;
        uploaders.push(uploader);
    }
    let built = build_packs(jobs, target, &full, &abort, &upload_failed);
    drop(full);
    let mut written = Vec::new();
    let mut upload_error = None;
    for uploader in uploaders {
        match uploader.join().unwrap_or_else(|_| Err(Error::Writer("a pack write thread panicked".into()))) {
            Ok(packs) => written.extend(packs),
            Err(e) => {
                upload_error.get_or_insert(e);
            }
        }
    }
    match (built, upload_error) {
        (Err(e), _) | (Ok(_), Some(e)) => Err(e),
        (Ok(true), None) => Ok(written),
        // The writer went away without `finish`: the partial pack is
        // dropped, and the packs already written stay unindexed.
        (Ok(false), None) => Ok(Vec::new()),
    }
}

/// Compresses chunks into packs until `Finish` (true) or until the writer
/// goes away or the write thread stops (false).
fn build_packs(
    jobs: Receiver<Job>,
    target: usize,
    full: &SyncSender<FinishedPack>,
    abort: &AtomicBool,
    upload_failed: &AtomicBool,
) -> Result<bool> {
    let mut builder = PackBuilder::new()?;
    while let Ok(job) = jobs.recv() {
        if abort.load(Ordering::Relaxed) || upload_failed.load(Ordering::Relaxed) {
            break;
        }
        let finishing = match job {
            Job::Chunk(id, data) => {
                builder.add(id, &data)?;
                false
            }
            Job::Settle(done) => {
                let _ = done.send(());
                false
            }
            Job::Finish => true,
        };
        if finishing || builder.len() >= target {
            if let Some(pack) = builder.finish() {
                if full.send(pack).is_err() {
                    break;
                }
            }
        }
        if finishing {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Writes packs as they come; stops at the first error.
fn write_packs(
    backend: &dyn WriteBackend,
    packs: &Mutex<Receiver<FinishedPack>>,
    progress: &Progress,
    abort: &AtomicBool,
) -> Result<Vec<IndexedPack>> {
    let mut written = Vec::new();
    // The lock is held while waiting, which only makes the other writer
    // wait on it rather than on the channel.
    while let Ok(pack) = packs.lock().unwrap_or_else(PoisonError::into_inner).recv() {
        if abort.load(Ordering::Relaxed) {
            break;
        }
        let size = pack.data.len() as u64;
        backend.write(Kind::Pack, &pack.id.to_hex(), Bytes::from(pack.data))?;
        progress.stored_bytes.fetch_add(size, Ordering::Relaxed);
        progress.packs.fetch_add(1, Ordering::Relaxed);
        fail::fail_point!("blob.pack_written");
        written.push(IndexedPack { id: pack.id, size, chunks: pack.entries });
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use proptest::prelude::*;

    use super::*;
    use crate::testutil::{manifest_path, noise, open_repo, pack_path};
    use crate::{chunker, ObjectStoreBackend, ReadBackend};

    const SMALL_PACKS: usize = 256 * 1024;

    /// A mix of incompressible and compressible chunks of varied sizes.
    fn sample_chunks(seed: u64, n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let len = 1 + (i * 7919) % 40_000;
                if i % 3 == 0 {
                    format!("chunk {seed}/{i} ").repeat(len / 12 + 1).into_bytes()
                } else {
                    noise(seed * 1000 + i as u64, len)
                }
            })
            .collect()
    }

    fn store(repo: &Arc<Repository>, chunks: &[Vec<u8>]) -> (Vec<ObjectId>, WriteStats) {
        let mut w = repo.writer();
        let ids = chunks.iter().map(|c| w.add_chunk(c).unwrap().0).collect();
        (ids, w.finish().unwrap())
    }

    fn index_files(repo: &Repository) -> usize {
        repo.backend().list(Kind::Index).unwrap().len()
    }

    #[test]
    fn many_chunks_round_trip_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let chunks = sample_chunks(1, 300);
        let repo = open_repo(dir.path(), SMALL_PACKS);
        let (ids, stats) = store(&repo, &chunks);
        assert_eq!((stats.chunks, stats.new_chunks), (300, 300));
        assert!(stats.packs > 3, "{stats:?}");
        assert!(stats.stored_bytes < stats.bytes, "compressible chunks shrink: {stats:?}");
        assert_eq!(index_files(&repo), 1);
        drop(repo);

        let repo = open_repo(dir.path(), SMALL_PACKS);
        assert_eq!(repo.stats().chunks, 300);
        assert_eq!(repo.stats().packs, stats.packs);
        for (id, chunk) in ids.iter().zip(&chunks) {
            assert!(repo.has_chunk(id));
            assert_eq!(&repo.read_chunk(id).unwrap(), chunk);
        }
        let mut w = repo.writer();
        let (empty, _) = w.add_chunk(b"").unwrap();
        w.finish().unwrap();
        assert_eq!(repo.read_chunk(&empty).unwrap(), b"");
        let unknown = ObjectId::of(b"never stored");
        assert!(matches!(repo.read_chunk(&unknown), Err(Error::UnknownChunk(_))));
        assert!(repo.check(&[], &ids.iter().map(|c| (*c, unknown)).collect::<Vec<_>>(), true).unwrap().is_ok());
    }

    #[test]
    fn known_chunks_are_stored_once() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), SMALL_PACKS);
        let chunks = sample_chunks(2, 40);
        let mut w = repo.writer();
        for c in &chunks {
            assert!(w.add_chunk(c).unwrap().1);
        }
        for c in &chunks {
            assert!(!w.add_chunk(c).unwrap().1, "repeat within one writer");
        }
        let first = w.finish().unwrap();
        assert_eq!((first.chunks, first.new_chunks), (80, 40));
        let before = repo.stats();

        let (_, second) = store(&repo, &chunks);
        assert_eq!((second.chunks, second.new_chunks, second.packs, second.stored_bytes), (40, 0, 0, 0));
        assert_eq!(repo.stats(), before);
        assert_eq!(index_files(&repo), 1, "a writer with nothing new writes no index file");
        assert_eq!(repo.backend().list(Kind::Pack).unwrap().len() as u64, before.packs);

        // Another process (a second open) sees the same.
        let other = open_repo(dir.path(), SMALL_PACKS);
        assert_eq!(store(&other, &chunks).1.new_chunks, 0);
    }

    #[test]
    fn settle_waits_for_compression_and_the_writer_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), SMALL_PACKS);
        let mut w = repo.writer();
        w.settle().unwrap();
        let a = noise(21, 300_000);
        let (ida, _) = w.add_chunk(&a).unwrap();
        w.settle().unwrap();
        assert!(w.knows(&ida) && !repo.has_chunk(&ida), "known to the writer, not yet indexed");
        let b = noise(22, 1000);
        let (idb, _) = w.add_chunk(&b).unwrap();
        w.finish().unwrap();
        assert_eq!((repo.read_chunk(&ida).unwrap(), repo.read_chunk(&idb).unwrap()), (a, b));
    }

    #[test]
    fn concurrent_writers_storing_the_same_chunk_is_harmless() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), SMALL_PACKS);
        let chunk = noise(9, 5000);
        let (mut a, mut b) = (repo.writer(), repo.writer());
        assert!(a.add_chunk(&chunk).unwrap().1);
        assert!(b.add_chunk(&chunk).unwrap().1);
        a.finish().unwrap();
        b.finish().unwrap();
        let id = ObjectId::of(&chunk);
        assert_eq!(repo.read_chunk(&id).unwrap(), chunk);
        assert_eq!(repo.stats().chunks, 1);
        assert!(repo.check(&[], &[(id, id)], true).unwrap().is_ok());
    }

    #[test]
    fn streamed_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), SMALL_PACKS);
        let data = noise(4, 3 * chunker::MAX_CHUNK + 17);
        let mut w = repo.writer();
        let mut ids = Vec::new();
        chunker::for_each_chunk(&mut &data[..], &mut |c| {
            ids.push(w.add_chunk(c)?.0);
            Ok(())
        })
        .unwrap();
        w.finish().unwrap();
        let back: Vec<u8> = ids.iter().flat_map(|id| repo.read_chunk(id).unwrap()).collect();
        assert_eq!(back, data);
    }

    /// The first entry of `pack` whose blob is stored raw (so a flipped byte
    /// is a clean hash mismatch).
    fn raw_entry(dir: &Path, pack: &ObjectId) -> crate::pack::PackEntry {
        let data = std::fs::read(pack_path(dir, pack)).unwrap();
        crate::pack::parse_trailer(&data).unwrap().into_iter().find(|e| !e.compressed).unwrap()
    }

    fn flip_byte(path: &Path, at: u64) {
        let mut data = std::fs::read(path).unwrap();
        data[at as usize] ^= 0xff;
        std::fs::write(path, data).unwrap();
    }

    fn pack_of(repo: &Repository, chunk: &ObjectId) -> ObjectId {
        repo.read_index().chunks[chunk].pack
    }

    #[test]
    fn a_corrupted_byte_is_detected_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), SMALL_PACKS);
        let (ids, _) = store(&repo, &sample_chunks(3, 30));
        let pack = pack_of(&repo, &ids[1]);
        let victim = raw_entry(dir.path(), &pack);
        flip_byte(&pack_path(dir.path(), &pack), victim.offset + u64::from(victim.length) / 2);

        let err = repo.read_chunk(&victim.id).unwrap_err();
        match &err {
            Error::Corrupt(Kind::Pack, p, why) => {
                assert_eq!(*p, pack.to_hex());
                assert!(why.contains(&victim.id.to_hex()) && why.contains("hashes to"), "{why}");
            }
            other => panic!("{other}"),
        }
        let refs: Vec<_> = ids.iter().map(|c| (*c, *c)).collect();
        assert!(repo.check(&[], &refs, false).unwrap().is_ok(), "sizes are unchanged");
        let report = repo.check(&[], &refs, true).unwrap();
        assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
        let line = &report.problems[0];
        assert!(line.starts_with(&format!("pack {pack}: chunk {} hashes to", victim.id)) && line.ends_with("(corrupted)"), "{line}");
        assert!(report.bytes_read > 0);
        assert_eq!(report.chunks_verified, repo.stats().chunks - 1);
    }

    #[test]
    fn a_corrupted_compressed_chunk_or_trailer_is_a_problem_line() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), 1 << 30);
        let (ids, _) = store(&repo, &[b"compressible ".repeat(2000), noise(1, 3000)]);
        let pack = pack_of(&repo, &ids[0]);
        let path = pack_path(dir.path(), &pack);
        let clean = std::fs::read(&path).unwrap();
        flip_byte(&path, 20);
        assert!(matches!(repo.read_chunk(&ids[0]), Err(Error::Corrupt(Kind::Pack, p, _)) if p == pack.to_hex()));
        let report = repo.check(&[], &[], true).unwrap();
        assert!(report.problems.iter().any(|l| l.starts_with(&format!("pack {pack}: chunk {}", ids[0]))), "{:?}", report.problems);

        // Damage in the trailer: the chunks may still verify, the pack's
        // hash does not.
        std::fs::write(&path, &clean).unwrap();
        flip_byte(&path, clean.len() as u64 - 20);
        let report = repo.check(&[], &[], true).unwrap();
        assert!(!report.is_ok());
        assert!(report.problems.iter().all(|l| l.starts_with(&format!("pack {pack}: "))), "{:?}", report.problems);
    }

    #[test]
    fn a_truncated_pack_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), 1 << 30);
        let chunks: Vec<Vec<u8>> = (0..10).map(|i| noise(i, 20_000)).collect();
        let (ids, _) = store(&repo, &chunks);
        let pack = pack_of(&repo, &ids[0]);
        let path = pack_path(dir.path(), &pack);
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len / 2).unwrap();

        assert_eq!(repo.read_chunk(&ids[0]).unwrap(), chunks[0], "the intact front still reads");
        let err = repo.read_chunk(&ids[9]).unwrap_err();
        assert!(matches!(&err, Error::Corrupt(Kind::Pack, p, why) if *p == pack.to_hex() && why.contains("truncated")), "{err}");

        let report = repo.check(&[], &[], false).unwrap();
        assert_eq!(report.problems.len(), 1);
        assert!(report.problems[0].starts_with(&format!("pack {pack}: {} bytes, the index says {len}", len / 2)), "{:?}", report.problems);
        let report = repo.check(&[], &[], true).unwrap();
        assert!(report.problems.iter().any(|l| l.starts_with(&format!("pack {pack}: no pack magic"))), "{:?}", report.problems);

        std::fs::write(&path, b"").unwrap();
        assert!(!repo.check(&[], &[], true).unwrap().is_ok());
    }

    #[test]
    fn a_missing_pack_is_reported_without_reading_data() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), SMALL_PACKS);
        let (ids, _) = store(&repo, &sample_chunks(5, 20));
        let pack = pack_of(&repo, &ids[0]);
        std::fs::remove_file(pack_path(dir.path(), &pack)).unwrap();
        let manifest = ObjectId::of(b"a manifest");

        let report = repo.check(&[], &[(ids[0], manifest)], false).unwrap();
        assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
        assert!(report.problems[0].starts_with(&format!("pack {pack}: missing (")), "{}", report.problems[0]);
        assert!(report.problems[0].contains("1 of them referenced"), "{}", report.problems[0]);
        assert!(matches!(repo.read_chunk(&ids[0]), Err(Error::Missing(Kind::Pack, p)) if p == pack.to_hex()));
    }

    #[test]
    fn manifests_round_trip_and_are_verified() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), SMALL_PACKS);
        let body = b"{\"files\": []}".repeat(100);
        let id = repo.put_manifest(&body).unwrap();
        assert_eq!(id, ObjectId::of(&body));
        assert_eq!(repo.put_manifest(&body).unwrap(), id);
        assert_eq!(repo.get_manifest(&id).unwrap(), body);
        let path = manifest_path(dir.path(), &id);
        assert!(std::fs::metadata(&path).unwrap().len() < body.len() as u64, "stored compressed");

        let absent = ObjectId::of(b"absent");
        assert!(matches!(repo.get_manifest(&absent), Err(Error::Missing(Kind::Manifest, _))));
        let chunk = ObjectId::of(b"unknown chunk");
        let report = repo.check(&[id, absent], &[(chunk, id)], false).unwrap();
        assert_eq!(
            report.problems,
            vec![format!("manifest {absent}: missing"), format!("chunk {chunk} (in manifest {id}): not in the index")]
        );

        std::fs::write(&path, zstd::bulk::compress(b"something else", 3).unwrap()).unwrap();
        assert!(matches!(repo.get_manifest(&id), Err(Error::Corrupt(Kind::Manifest, m, why)) if m == id.to_hex() && why.contains("hashes to")));
        let report = repo.check(&[id], &[], true).unwrap();
        assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
        assert!(report.problems[0].starts_with(&format!("manifest {id}: content hashes to")), "{}", report.problems[0]);
        std::fs::write(&path, b"not zstd").unwrap();
        assert!(matches!(repo.get_manifest(&id), Err(Error::Corrupt(Kind::Manifest, ..))));
    }

    #[test]
    fn a_writer_dropped_without_finish_leaves_nothing_indexed() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), 64 * 1024);
        let chunks: Vec<Vec<u8>> = (0..20).map(|i| noise(100 + i, 30_000)).collect();
        let mut w = repo.writer();
        let ids: Vec<_> = chunks.iter().map(|c| w.add_chunk(c).unwrap().0).collect();
        // Wait for the worker to have written some full packs.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while w.stats().packs < 2 {
            assert!(std::time::Instant::now() < deadline, "the pack writer wrote {} packs in 60 s", w.stats().packs);
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(w);
        assert!(ids.iter().all(|id| !repo.has_chunk(id)));
        assert_eq!(index_files(&repo), 0);
        let reopened = open_repo(dir.path(), 64 * 1024);
        assert!(ids.iter().all(|id| !reopened.has_chunk(id)));
        assert_eq!(reopened.stats(), RepoStats::default());

        // The orphan packs are garbage, kept while young.
        let orphans = repo.backend().list(Kind::Pack).unwrap().len() as u64;
        assert!(orphans >= 2);
        let none = HashSet::new();
        let kept = repo.gc(&none, &none, Duration::from_secs(3600), false).unwrap();
        assert_eq!((kept.packs_deleted, kept.kept_young), (0, orphans));
        let swept = repo.gc(&none, &none, Duration::ZERO, false).unwrap();
        assert_eq!(swept.packs_deleted, orphans);
        assert!(repo.backend().list(Kind::Pack).unwrap().is_empty());
    }

    #[test]
    fn gc_deletes_garbage_and_keeps_young_and_partly_live() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), 1 << 30);
        let live_chunk = noise(1, 10_000);
        let dead_neighbour = noise(2, 10_000);
        let dead_alone = noise(3, 10_000);
        let (mixed, _) = store(&repo, &[live_chunk.clone(), dead_neighbour.clone()]);
        let (alone, _) = store(&repo, &[dead_alone]);
        let mixed_pack = pack_of(&repo, &mixed[0]);
        let dead_pack = pack_of(&repo, &alone[0]);
        let live_manifest = repo.put_manifest(b"live").unwrap();
        let dead_manifest = repo.put_manifest(b"dead").unwrap();
        let live_manifests = HashSet::from([live_manifest]);
        let live_chunks = HashSet::from([mixed[0]]);

        let young = repo.gc(&live_manifests, &live_chunks, Duration::from_secs(3600), false).unwrap();
        assert_eq!((young.packs_deleted, young.manifests_deleted, young.kept_young, young.packs_partly_live), (0, 0, 2, 1));
        assert!(pack_path(dir.path(), &dead_pack).exists());

        let dry = repo.gc(&live_manifests, &live_chunks, Duration::ZERO, true).unwrap();
        assert!(dry.dry_run);
        assert_eq!((dry.packs_deleted, dry.manifests_deleted, dry.index_files_rewritten), (1, 1, 1));
        assert!(dry.bytes_freed > 0);
        assert!(pack_path(dir.path(), &dead_pack).exists() && manifest_path(dir.path(), &dead_manifest).exists());
        assert!(repo.has_chunk(&alone[0]));
        assert_eq!(index_files(&repo), 2);

        let done = repo.gc(&live_manifests, &live_chunks, Duration::ZERO, false).unwrap();
        assert_eq!((done.packs_deleted, done.manifests_deleted, done.index_files_rewritten, done.packs_partly_live), (1, 1, 1, 1));
        assert_eq!(done.bytes_freed, dry.bytes_freed);
        assert!(!pack_path(dir.path(), &dead_pack).exists() && !manifest_path(dir.path(), &dead_manifest).exists());
        assert!(pack_path(dir.path(), &mixed_pack).exists() && manifest_path(dir.path(), &live_manifest).exists());
        assert!(!repo.has_chunk(&alone[0]));
        assert_eq!(repo.read_chunk(&mixed[1]).unwrap(), dead_neighbour, "a partly live pack is kept whole");
        assert_eq!(index_files(&repo), 1);

        // The store agrees after reopening, and a second gc has nothing to do.
        let reopened = open_repo(dir.path(), 1 << 30);
        assert!(!reopened.has_chunk(&alone[0]));
        assert_eq!(reopened.read_chunk(&mixed[0]).unwrap(), live_chunk);
        assert!(reopened.check(&[live_manifest], &[(mixed[0], live_manifest)], true).unwrap().is_ok());
        let again = reopened.gc(&live_manifests, &live_chunks, Duration::ZERO, false).unwrap();
        assert_eq!((again.packs_deleted, again.manifests_deleted, again.index_files_rewritten), (0, 0, 0));
    }

    #[test]
    fn gc_rewrites_an_index_file_that_keeps_some_packs() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), 1);
        // Pack target 1 byte: each chunk is its own pack, all in one index file.
        let (ids, stats) = store(&repo, &[noise(1, 1000), noise(2, 1000), noise(3, 1000)]);
        assert_eq!(stats.packs, 3);
        let live = HashSet::from([ids[0], ids[2]]);
        let report = repo.gc(&HashSet::new(), &live, Duration::ZERO, false).unwrap();
        assert_eq!((report.packs_deleted, report.index_files_rewritten), (1, 1));
        assert_eq!(index_files(&repo), 1);
        let reopened = open_repo(dir.path(), 1);
        assert_eq!(reopened.stats().packs, 2);
        assert!(reopened.has_chunk(&ids[0]) && !reopened.has_chunk(&ids[1]) && reopened.has_chunk(&ids[2]));
    }

    #[test]
    fn an_unreadable_index_file_is_reported_and_stops_gc() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_repo(dir.path(), SMALL_PACKS);
        store(&repo, &sample_chunks(6, 5));
        let file = repo.backend().list(Kind::Index).unwrap().remove(0).id;
        std::fs::write(dir.path().join("repo/index").join(&file), b"garbage").unwrap();

        let reopened = open_repo(dir.path(), SMALL_PACKS);
        assert_eq!(reopened.stats().chunks, 0);
        let report = reopened.check(&[], &[], false).unwrap();
        assert!(report.problems.len() == 1 && report.problems[0].starts_with(&format!("index {file}: unreadable")), "{:?}", report.problems);
        let err = reopened.gc(&HashSet::new(), &HashSet::new(), Duration::ZERO, false).unwrap_err();
        assert!(matches!(err, Error::Corrupt(Kind::Index, f, _) if f == file));
        assert_eq!(reopened.backend().list(Kind::Pack).unwrap().len(), 1, "nothing deleted");
    }

    /// The real backend, except that pack writes fail as on a full disk.
    #[derive(Debug)]
    struct FullForPacks(ObjectStoreBackend);

    impl ReadBackend for FullForPacks {
        fn location(&self) -> String {
            self.0.location()
        }
        fn read(&self, kind: Kind, id: &str) -> Result<Bytes> {
            self.0.read(kind, id)
        }
        fn read_range(&self, kind: Kind, id: &str, offset: u64, len: u64) -> Result<Bytes> {
            self.0.read_range(kind, id, offset, len)
        }
        fn list(&self, kind: Kind) -> Result<Vec<ObjectInfo>> {
            self.0.list(kind)
        }
        fn exists(&self, kind: Kind, id: &str) -> Result<bool> {
            self.0.exists(kind, id)
        }
    }

    impl WriteBackend for FullForPacks {
        fn write(&self, kind: Kind, id: &str, data: Bytes) -> Result<()> {
            if kind == Kind::Pack {
                return Err(Error::NoSpace(self.location()));
            }
            self.0.write(kind, id, data)
        }
        fn delete(&self, kind: Kind, id: &str) -> Result<()> {
            self.0.delete(kind, id)
        }
    }

    #[test]
    fn a_failed_pack_write_surfaces_and_indexes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(FullForPacks(ObjectStoreBackend::local(dir.path()).unwrap()));
        let repo = Repository::open_with(backend, RepoOptions { pack_target: 1 }).unwrap();
        let mut w = repo.writer();
        let mut surfaced = None;
        for i in 0..10_000 {
            if let Err(e) = w.add_chunk(&noise(i, 100)) {
                surfaced = Some(e);
                break;
            }
        }
        assert!(matches!(surfaced, Some(Error::NoSpace(_))), "{surfaced:?}");
        assert!(matches!(w.add_chunk(b"more"), Err(Error::Writer(_))));
        assert!(w.finish().is_err());
        assert_eq!(repo.stats(), RepoStats::default());

        // An error on the last pack surfaces from finish.
        let mut w = repo.writer();
        w.add_chunk(b"one small chunk").unwrap();
        assert!(matches!(w.finish(), Err(Error::NoSpace(_))));
        assert_eq!(repo.backend().list(Kind::Index).unwrap().len(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn random_buffers_round_trip(data in proptest::collection::vec(any::<u8>(), 0..150_000), repeat in 1usize..4) {
            let dir = tempfile::tempdir().unwrap();
            let repo = open_repo(dir.path(), SMALL_PACKS);
            // Repeating the buffer gives the dedup and compression paths work too.
            let input: Vec<u8> = std::iter::repeat_n(&data[..], repeat).flatten().copied().collect();
            let mut w = repo.writer();
            let mut ids = Vec::new();
            chunker::for_each_chunk(&mut &input[..], &mut |c| { ids.push(w.add_chunk(c)?.0); Ok(()) }).unwrap();
            w.finish().unwrap();
            let reopened = open_repo(dir.path(), SMALL_PACKS);
            let back: Vec<u8> = ids.iter().flat_map(|id| reopened.read_chunk(id).unwrap()).collect();
            prop_assert_eq!(back, input);
        }
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
