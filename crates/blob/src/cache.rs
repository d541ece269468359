//! A local cache of a remote store's packs: [`CachedBackend`].
//!
//! Packs are content-addressed and never modified, so a cached copy is
//! never stale. The cache keeps whole packs, keyed by kind and id
//! (`<dir>/packs/ab/<id>`, the store's layout), in a directory of the
//! node's home:
//!
//! - a read of a chunk's range from a pack not cached downloads the whole
//!   pack once (concurrent readers of the same pack wait for that one
//!   download) and serves the range and every later one from the local copy;
//! - a pack this node writes is put in the cache as it is uploaded, so a
//!   suspend and a wake on the same node download nothing;
//! - [`ReadBackend::prefetch`] downloads the packs a restore will read,
//!   several at once;
//! - it holds at most `max_bytes`, dropping the least recently used packs
//!   (the order survives a restart through the files' modification times);
//! - a copy enters the cache only when its BLAKE3 hash is its id, written to
//!   a temporary file and renamed into place, so a crash leaves no torn copy
//!   under a pack's name (a copy cut short by a crash before the data
//!   reached the disk is caught by the chunk verification below);
//! - reads of ranges are verified by the repository's chunk verification
//!   (every chunk read is decompressed and hashed against its id); when a
//!   cached copy fails it, the repository evicts the copy and reads the
//!   store again ([`ReadBackend::evict`]).
//!
//! Whole reads (`check --read-data`) and everything but packs go to the
//! store itself, so `check` verifies what the store holds.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;

use crate::backend::{CacheStats, FetchStats};
use crate::parallel::map_bounded;
use crate::{Error, Kind, ObjectId, ObjectInfo, ReadBackend, Result, WriteBackend};

/// The cache's bound unless configured otherwise.
pub const DEFAULT_CACHE_BYTES: u64 = 2 << 30;
/// A prefetch fills at most this share of the cache, so that what it
/// fetches first is not evicted by what it fetches last before it is read.
const PREFETCH_SHARE: u64 = 2;
/// A cached copy's modification time (its place in the order of use after
/// a restart) is refreshed at most this often.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// A remote store with a local cache of its packs.
pub struct CachedBackend {
    inner: Arc<dyn WriteBackend>,
    dir: PathBuf,
    max_bytes: u64,
    state: Mutex<State>,
    /// One lock per pack being downloaded, so that concurrent readers of a
    /// pack wait for one download instead of each making their own.
    inflight: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Packs downloaded once that could not be kept (larger than the
    /// cache, or not matching their id): read by ranges from then on, not
    /// downloaded whole for every chunk.
    uncacheable: Mutex<HashSet<String>>,
    hits: AtomicU64,
    misses: AtomicU64,
    downloads: AtomicU64,
    downloaded_bytes: AtomicU64,
    evictions: AtomicU64,
    temp_seq: AtomicU64,
}

impl std::fmt::Debug for CachedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedBackend").field("inner", &self.inner).field("dir", &self.dir).field("max_bytes", &self.max_bytes).finish()
    }
}

#[derive(Debug, Default)]
struct State {
    /// Pack id → its cached copy.
    entries: HashMap<String, Entry>,
    bytes: u64,
    /// Advances on every use; an entry's `used` is the clock at its last use.
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    size: u64,
    used: u64,
    touched: Instant,
}

/// What a download left.
enum Fetched {
    /// The pack is in the cache now.
    Cached,
    /// Downloaded but not cached (larger than the cache, not matching its
    /// id, or the cache could not be written): these are its bytes.
    Uncached(Bytes),
    /// Known not to be cacheable: read it by ranges.
    Uncacheable,
}

impl CachedBackend {
    /// A cache of `inner`'s packs in `dir` (created if missing), bounded to
    /// `max_bytes`. Copies left by an earlier run are kept, least recently
    /// used first out; temporary files of an interrupted write are removed.
    pub fn open(inner: Arc<dyn WriteBackend>, dir: &Path, max_bytes: u64) -> Result<CachedBackend> {
        let io = |path: &Path, e: std::io::Error| Error::Io(path.to_path_buf(), e);
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
        for entry in std::fs::read_dir(&tmp).map_err(|e| io(&tmp, e))?.flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
        let mut found: Vec<(SystemTime, String, u64)> = Vec::new();
        let packs = dir.join(Kind::Pack.dir());
        if let Ok(fans) = std::fs::read_dir(&packs) {
            for fan in fans.flatten() {
                let Ok(files) = std::fs::read_dir(fan.path()) else { continue };
                for file in files.flatten() {
                    let name = file.file_name().to_string_lossy().into_owned();
                    let Ok(meta) = file.metadata() else { continue };
                    // Not a copy this cache wrote: leave it out of the count
                    // and out of the reads.
                    if name.parse::<ObjectId>().is_err() || !meta.is_file() || meta.len() == 0 {
                        let _ = std::fs::remove_file(file.path());
                        continue;
                    }
                    found.push((meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), name, meta.len()));
                }
            }
        }
        found.sort();
        let mut state = State::default();
        for (_, id, size) in found {
            state.clock += 1;
            state.bytes += size;
            state.entries.insert(id, Entry { size, used: state.clock, touched: Instant::now() });
        }
        let cache = CachedBackend {
            inner,
            dir: dir.to_path_buf(),
            max_bytes,
            state: Mutex::new(state),
            inflight: Mutex::default(),
            uncacheable: Mutex::default(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            downloads: AtomicU64::new(0),
            downloaded_bytes: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            temp_seq: AtomicU64::new(0),
        };
        cache.evict_over(cache.max_bytes, None);
        Ok(cache)
    }

    /// The store behind the cache.
    pub fn inner(&self) -> &Arc<dyn WriteBackend> {
        &self.inner
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the cached copy of a pack is (whether or not it is there).
    pub fn path_of(&self, id: &str) -> PathBuf {
        self.dir.join(Kind::Pack.dir()).join(id.get(..2).unwrap_or(id)).join(id)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every update of the state is a few map operations: a panic
        // elsewhere leaves it consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn cached(&self, kind: Kind) -> bool {
        kind == Kind::Pack && self.max_bytes > 0
    }

    /// The range from the cached copy, if there is one.
    fn read_cached(&self, id: &str, offset: u64, len: u64) -> Option<Bytes> {
        let touch = {
            let mut state = self.state();
            state.clock += 1;
            let clock = state.clock;
            let entry = state.entries.get_mut(id)?;
            entry.used = clock;
            let due = entry.touched.elapsed() >= TOUCH_EVERY;
            if due {
                entry.touched = Instant::now();
            }
            due
        };
        let path = self.path_of(id);
        let read = File::open(&path).and_then(|f| {
            if touch {
                let _ = f.set_modified(SystemTime::now());
            }
            let mut buf = vec![0u8; usize::try_from(len).map_err(|_| std::io::Error::from(ErrorKind::InvalidInput))?];
            f.read_exact_at(&mut buf, offset)?;
            Ok(buf)
        });
        match read {
            Ok(buf) => Some(Bytes::from(buf)),
            Err(e) => {
                // Removed under us, or shorter than the range (sizes are
                // checked on the way in, so only damage does that): forget
                // it, and the caller reads the store.
                if e.kind() != ErrorKind::NotFound {
                    tracing::warn!(pack = id, path = %path.display(), error = %e, "cached pack unreadable; dropping it");
                }
                self.forget(id);
                None
            }
        }
    }

    /// Downloads a pack into the cache, once for concurrent callers; says
    /// whether this call downloaded it.
    fn fetch(&self, id: &str) -> Result<(Fetched, bool)> {
        let gate = {
            let mut inflight = self.inflight.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(inflight.entry(id.to_string()).or_default())
        };
        let result = {
            let _one_at_a_time = gate.lock().unwrap_or_else(PoisonError::into_inner);
            if self.state().entries.contains_key(id) {
                Ok((Fetched::Cached, false))
            } else if self.is_uncacheable(id) {
                Ok((Fetched::Uncacheable, false))
            } else {
                self.inner.read(Kind::Pack, id).map(|data| {
                    self.downloads.fetch_add(1, Ordering::Relaxed);
                    self.downloaded_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                    let fetched = if self.insert(id, &data) {
                        Fetched::Cached
                    } else {
                        self.uncacheable.lock().unwrap_or_else(PoisonError::into_inner).insert(id.to_string());
                        Fetched::Uncached(data)
                    };
                    (fetched, true)
                })
            }
        };
        let mut inflight = self.inflight.lock().unwrap_or_else(PoisonError::into_inner);
        if inflight.get(id).is_some_and(|g| Arc::ptr_eq(g, &gate)) {
            inflight.remove(id);
        }
        result
    }

    fn is_uncacheable(&self, id: &str) -> bool {
        self.uncacheable.lock().unwrap_or_else(PoisonError::into_inner).contains(id)
    }

    /// Puts a pack's bytes in the cache when they hash to its id and fit;
    /// true when they are there now.
    fn insert(&self, id: &str, data: &[u8]) -> bool {
        let size = data.len() as u64;
        if size == 0 || size > self.max_bytes {
            return false;
        }
        let actual = ObjectId::of(data).to_hex();
        if actual != id {
            tracing::warn!(pack = id, hashes_to = %actual, "the store's copy of a pack does not match its id; not caching it");
            return false;
        }
        let path = self.path_of(id);
        let tmp = self.dir.join("tmp").join(format!("{id}.{}.{}", std::process::id(), self.temp_seq.fetch_add(1, Ordering::Relaxed)));
        let written = (|| {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let mut f = File::create(&tmp)?;
            f.write_all(data)?;
            drop(f);
            std::fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(pack = id, dir = %self.dir.display(), error = %e, "cannot write to the blob cache");
            return false;
        }
        {
            let mut state = self.state();
            state.clock += 1;
            let used = state.clock;
            if let Some(old) = state.entries.insert(id.to_string(), Entry { size, used, touched: Instant::now() }) {
                state.bytes -= old.size;
            }
            state.bytes += size;
        }
        self.evict_over(self.max_bytes, Some(id));
        true
    }

    /// Drops least recently used copies until the cache holds at most
    /// `limit` bytes, never `keep`.
    fn evict_over(&self, limit: u64, keep: Option<&str>) {
        let mut state = self.state();
        if state.bytes <= limit {
            return;
        }
        let mut order: Vec<(u64, String)> = state.entries.iter().filter(|(id, _)| Some(id.as_str()) != keep).map(|(id, e)| (e.used, id.clone())).collect();
        order.sort_unstable();
        for (_, id) in order {
            if state.bytes <= limit {
                break;
            }
            if let Some(e) = state.entries.remove(&id) {
                state.bytes -= e.size;
                let _ = std::fs::remove_file(self.path_of(&id));
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Removes a copy; true when there was one.
    fn forget(&self, id: &str) -> bool {
        let mut state = self.state();
        let known = state.entries.remove(id);
        if let Some(e) = &known {
            state.bytes -= e.size;
        }
        drop(state);
        let removed = std::fs::remove_file(self.path_of(id)).is_ok();
        known.is_some() || removed
    }
}

/// A range of bytes already read whole, or the truncation it reveals.
fn slice(kind: Kind, id: &str, data: &Bytes, offset: u64, len: u64) -> Result<Bytes> {
    let end = offset.checked_add(len).ok_or_else(|| Error::Corrupt(kind, id.to_string(), format!("range {offset}+{len} overflows")))?;
    if end > data.len() as u64 {
        let size = data.len();
        return Err(Error::Corrupt(kind, id.to_string(), format!("truncated: bytes {offset}..{end} wanted, the object has {size}")));
    }
    Ok(data.slice(offset as usize..end as usize))
}

impl ReadBackend for CachedBackend {
    fn location(&self) -> String {
        self.inner.location()
    }

    /// Whole objects come from the store itself (`check` verifies the
    /// store's copy, not ours).
    fn read(&self, kind: Kind, id: &str) -> Result<Bytes> {
        self.inner.read(kind, id)
    }

    fn read_range(&self, kind: Kind, id: &str, offset: u64, len: u64) -> Result<Bytes> {
        if !self.cached(kind) {
            return self.inner.read_range(kind, id, offset, len);
        }
        if let Some(b) = self.read_cached(id, offset, len) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(b);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        if self.is_uncacheable(id) {
            return self.inner.read_range(kind, id, offset, len);
        }
        match self.fetch(id)?.0 {
            Fetched::Uncached(data) => slice(kind, id, &data, offset, len),
            Fetched::Uncacheable => self.inner.read_range(kind, id, offset, len),
            // Read back from the copy (or, had it gone again meanwhile, from the store).
            Fetched::Cached => match self.read_cached(id, offset, len) {
                Some(b) => Ok(b),
                None => self.inner.read_range(kind, id, offset, len),
            },
        }
    }

    fn list(&self, kind: Kind) -> Result<Vec<ObjectInfo>> {
        self.inner.list(kind)
    }

    fn exists(&self, kind: Kind, id: &str) -> Result<bool> {
        self.inner.exists(kind, id)
    }

    fn concurrency(&self) -> usize {
        self.inner.concurrency()
    }

    fn prefetch(&self, kind: Kind, objects: &[(String, u64)]) -> FetchStats {
        let mut stats = FetchStats::default();
        if !self.cached(kind) {
            return stats;
        }
        let budget = self.max_bytes / PREFETCH_SHARE;
        let mut planned = 0u64;
        let mut todo = Vec::new();
        {
            let state = self.state();
            for (id, size) in objects {
                if state.entries.contains_key(id) {
                    stats.cached += 1;
                } else if planned + size <= budget {
                    planned += size;
                    todo.push((id.as_str(), *size));
                } else {
                    stats.skipped += 1;
                }
            }
        }
        let fetched = map_bounded(todo, self.concurrency(), |(id, size)| match self.fetch(id) {
            Ok((_, downloaded)) => Some((downloaded, size)),
            Err(e) => {
                tracing::debug!(pack = id, error = %e, "prefetch failed; the read that needs it will try again");
                None
            }
        });
        for f in fetched {
            match f {
                Some((true, size)) => {
                    stats.objects += 1;
                    stats.bytes += size;
                }
                // Fetched meanwhile by a reader.
                Some((false, _)) => stats.cached += 1,
                None => stats.skipped += 1,
            }
        }
        stats
    }

    fn evict(&self, kind: Kind, id: &str) -> bool {
        self.cached(kind) && self.forget(id)
    }

    fn cache_stats(&self) -> Option<CacheStats> {
        let state = self.state();
        Some(CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            downloads: self.downloads.load(Ordering::Relaxed),
            downloaded_bytes: self.downloaded_bytes.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            objects: state.entries.len() as u64,
            bytes: state.bytes,
            max_bytes: self.max_bytes,
        })
    }
}

impl WriteBackend for CachedBackend {
    /// Writes to the store, then keeps a copy of a pack: the node that
    /// wrote a snapshot restores it without downloading.
    fn write(&self, kind: Kind, id: &str, data: Bytes) -> Result<()> {
        self.inner.write(kind, id, data.clone())?;
        if self.cached(kind) {
            self.uncacheable.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
            self.insert(id, &data);
        }
        Ok(())
    }

    fn delete(&self, kind: Kind, id: &str) -> Result<()> {
        self.inner.delete(kind, id)?;
        if self.cached(kind) {
            self.forget(id);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{noise, Fixture, Store};
    use crate::{RepoOptions, Repository};

    /// Chunks of 60 KB in packs of about 128 KB: a few chunks per pack.
    fn fill(repo: &Arc<Repository>, n: u64) -> Vec<(ObjectId, Vec<u8>)> {
        let mut w = repo.writer();
        let chunks: Vec<_> = (0..n).map(|i| noise(500 + i, 60_000)).map(|c| (w.add_chunk(&c).unwrap().0, c)).collect();
        w.finish().unwrap();
        chunks
    }

    fn cached(f: &Fixture, max: u64) -> (Arc<CachedBackend>, Arc<Repository>) {
        let cache = Arc::new(CachedBackend::open(f.raw(), &f.cache_dir(), max).unwrap());
        let repo = Repository::open_with(cache.clone(), RepoOptions { pack_target: 128 * 1024 }).unwrap();
        (cache, repo)
    }

    fn stats(c: &CachedBackend) -> CacheStats {
        c.cache_stats().unwrap()
    }

    #[test]
    fn written_packs_are_cached_and_a_warm_cache_downloads_nothing() {
        let f = Fixture::with_own_server(Store::S3);
        let (cache, repo) = cached(&f, DEFAULT_CACHE_BYTES);
        let chunks = fill(&repo, 12);
        let packs = repo.stats().packs;
        assert!(packs >= 4, "{packs} packs");
        assert_eq!(stats(&cache).objects, packs, "every pack written is kept");
        drop((cache, repo));

        // As after a restart: the copies are found again and nothing is
        // fetched, which the server's own request log confirms.
        let (cache, repo) = cached(&f, DEFAULT_CACHE_BYTES);
        f.moto().start_recording();
        for (id, data) in &chunks {
            assert_eq!(&repo.read_chunk(id).unwrap(), data);
        }
        let requests = f.moto().stop_recording();
        assert!(!requests.iter().any(|r| r.path.contains("/packs/")), "{requests:?}");
        let s = stats(&cache);
        assert_eq!((s.downloads, s.misses, s.hits), (0, 0, chunks.len() as u64), "{s:?}");
    }

    #[test]
    fn a_cold_cache_downloads_each_pack_once_and_prefetch_does_it_at_once() {
        let f = Fixture::with_own_server(Store::S3);
        let chunks = fill(&Repository::open_with(f.raw(), RepoOptions { pack_target: 128 * 1024 }).unwrap(), 12);
        let (cache, repo) = cached(&f, DEFAULT_CACHE_BYTES);
        let packs = repo.stats().packs;
        // Concurrent readers of one pack share a download.
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for (id, data) in &chunks {
                        assert_eq!(&repo.read_chunk(id).unwrap(), data);
                    }
                });
            }
        });
        assert_eq!(stats(&cache).downloads, packs);

        std::fs::remove_dir_all(f.cache_dir()).unwrap();
        let (cache, repo) = cached(&f, DEFAULT_CACHE_BYTES);
        assert_eq!(stats(&cache).objects, 0);
        let got = repo.prefetch(chunks.iter().map(|(id, _)| id));
        assert_eq!((got.objects, got.cached, got.skipped), (packs, 0, 0), "{got:?}");
        assert_eq!(got.bytes, repo.stats().stored_bytes);
        f.moto().start_recording();
        for (id, data) in &chunks {
            assert_eq!(&repo.read_chunk(id).unwrap(), data);
        }
        assert!(!f.moto().stop_recording().iter().any(|r| r.path.contains("/packs/")));
        assert_eq!(repo.prefetch(chunks.iter().map(|(id, _)| id)).cached, packs);
    }

    #[test]
    fn the_cache_stays_within_its_bound_dropping_the_least_recently_used() {
        let f = Fixture::new(Store::S3);
        let chunks = fill(&Repository::open_with(f.raw(), RepoOptions { pack_target: 128 * 1024 }).unwrap(), 12);
        let (cache, repo) = cached(&f, 1);
        let packs: Vec<(ObjectId, u64)> = {
            let idx = repo.read_index();
            let mut p: Vec<_> = idx.packs.iter().map(|(id, s)| (*id, s.size)).collect();
            p.sort();
            p
        };
        drop((cache, repo));
        // Room for two packs and a bit.
        let max = packs.iter().map(|p| p.1).max().unwrap() * 2 + 1000;
        let (cache, repo) = cached(&f, max);
        let pack_of = |c: &ObjectId| repo.read_index().chunks[c].pack;
        for (id, data) in &chunks {
            assert_eq!(&repo.read_chunk(id).unwrap(), data);
            assert!(stats(&cache).bytes <= max);
        }
        let s = stats(&cache);
        assert!(s.evictions > 0 && s.objects <= 2, "{s:?}");
        // The last pack read is kept; reading it again downloads nothing.
        let last = pack_of(&chunks.last().unwrap().0);
        assert!(f.cached_path(&last).is_file());
        let before = stats(&cache).downloads;
        repo.read_chunk(&chunks.last().unwrap().0).unwrap();
        assert_eq!(stats(&cache).downloads, before);

        // A prefetch fills at most half the cache.
        let got = repo.prefetch(chunks.iter().map(|(id, _)| id));
        assert!(got.skipped > 0 && got.objects <= 1, "{got:?}");

        // Reopened smaller: trimmed to the bound; a stray temporary file is gone.
        drop((cache, repo));
        std::fs::write(f.cache_dir().join("tmp/leftover"), b"x").unwrap();
        let (cache, _repo) = cached(&f, max / 2);
        assert!(stats(&cache).bytes <= max / 2 && stats(&cache).objects <= 1);
        assert!(!f.cache_dir().join("tmp/leftover").exists());
        // A pack larger than the whole cache is served, not kept, and read
        // by ranges after that first download.
        let (cache, repo) = cached(&f, 10);
        for (id, data) in &chunks[..3] {
            assert_eq!(&repo.read_chunk(id).unwrap(), data);
        }
        assert_eq!((stats(&cache).objects, stats(&cache).downloads), (0, 1));
    }

    #[test]
    fn a_damaged_cached_copy_is_dropped_and_read_again_from_the_store() {
        let f = Fixture::new(Store::S3);
        let (cache, repo) = cached(&f, DEFAULT_CACHE_BYTES);
        let chunks = fill(&repo, 3);
        let pack = repo.read_index().chunks[&chunks[0].0].pack;
        let entry = repo.read_index().chunks[&chunks[0].0].entry;
        let path = f.cached_path(&pack);
        let mut data = std::fs::read(&path).unwrap();
        data[entry.offset as usize + 10] ^= 0xff;
        std::fs::write(&path, &data).unwrap();

        assert_eq!(repo.read_chunk(&chunks[0].0).unwrap(), chunks[0].1);
        assert_eq!(stats(&cache).downloads, 1, "read again from the store, and cached afresh");
        let fresh = std::fs::read(&path).unwrap();
        assert_eq!(ObjectId::of(&fresh), pack);

        // A copy cut short (as by a crash before it reached the disk).
        std::fs::write(&path, &fresh[..100]).unwrap();
        assert_eq!(repo.read_chunk(&chunks[0].0).unwrap(), chunks[0].1);
        // A store copy that does not match its id is served (each chunk is
        // still verified) but never cached.
        std::fs::remove_file(&path).unwrap();
        let mut bad = fresh.clone();
        let other = repo.read_index().chunks[&chunks[1].0].entry;
        bad[other.offset as usize] ^= 0xff;
        f.write_object(Kind::Pack, &pack, &bad);
        let (_cache, repo) = cached(&f, DEFAULT_CACHE_BYTES);
        assert_eq!(repo.read_chunk(&chunks[0].0).unwrap(), chunks[0].1);
        assert!(!path.exists());
        assert!(matches!(repo.read_chunk(&chunks[1].0), Err(Error::Corrupt(Kind::Pack, ..))));
    }

    #[test]
    fn gc_deletes_cached_copies_too() {
        let f = Fixture::new(Store::S3);
        let (cache, repo) = cached(&f, DEFAULT_CACHE_BYTES);
        let chunks = fill(&repo, 3);
        let pack = repo.read_index().chunks[&chunks[0].0].pack;
        assert!(f.cached_path(&pack).is_file());
        let none = std::collections::HashSet::new();
        let report = repo.gc(&none, &none, Duration::ZERO, false).unwrap();
        assert!(report.packs_deleted > 0);
        assert!(!f.cached_path(&pack).exists());
        assert_eq!(stats(&cache).objects, 0);
    }
}
