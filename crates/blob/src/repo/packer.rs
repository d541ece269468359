//! The [`PackWriter`]: new chunks compressed into packs on a worker
//! thread, written by two uploaders, and indexed only once durable.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use bytes::Bytes;
use serde::Serialize;

use super::Repository;
use crate::index::{self, IndexedPack};
use crate::pack::{FinishedPack, PackBuilder};
use crate::{Error, Kind, ObjectId, Result, WriteBackend};

/// New chunks waiting for the pack worker; bounds the memory a fast reader
/// can pile up (chunks are at most a MiB each from the chunker).
const WORKER_QUEUE: usize = 32;

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

impl Repository {
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
/// thread and hands each full pack (and the last one, on `Finish`) to the
/// backend's [`concurrency`](crate::ReadBackend::concurrency) of threads
/// that write them (two on a local disk, whose fsyncs a second write in
/// flight hides; more on remote storage, whose requests take long), so
/// compressing the next pack overlaps with writing the previous ones.
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
    let writers = backend.concurrency().max(1);
    let mut uploaders = Vec::with_capacity(writers);
    for _ in 0..writers {
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
    // Only the write threads hold the receiving end: once they have all
    // stopped (on errors), a pack sent to them fails instead of waiting
    // forever for a reader.
    drop(to_write);
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
