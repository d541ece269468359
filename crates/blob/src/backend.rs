//! Objects keyed by (kind, id) behind read/write traits.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use serde::Serialize;

use crate::{Error, Result};

/// What an object is; each kind has its own prefix in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Pack,
    Index,
    Manifest,
    /// A delivered file, archive, patch or report, whole, keyed by its
    /// SHA-256 (the digest its delivery record names). `gc` never
    /// touches deliverables or records.
    Deliverable,
    /// A signed delivery record (DSSE envelope), keyed by the SHA-256 of its bytes.
    Record,
}

impl Kind {
    /// The top-level directory (key prefix) of this kind.
    pub fn dir(self) -> &'static str {
        match self {
            Kind::Pack => "packs",
            Kind::Index => "index",
            Kind::Manifest => "manifests",
            Kind::Deliverable => "deliverables",
            Kind::Record => "records",
        }
    }

    /// Packs and manifests are many, so they are fanned out over 256
    /// sub-directories by their first two hex digits; index files are few.
    fn fanned_out(self) -> bool {
        matches!(self, Kind::Pack | Kind::Manifest | Kind::Deliverable)
    }
}

/// An object as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub id: String,
    pub size: u64,
    pub modified: SystemTime,
}

/// What a [`ReadBackend::prefetch`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FetchStats {
    /// Objects downloaded into the local cache.
    pub objects: u64,
    pub bytes: u64,
    /// Objects already there.
    pub cached: u64,
    /// Objects left to be read when needed: beyond the share of the cache
    /// a prefetch may fill, or failed (the read that needs them reports why).
    pub skipped: u64,
}

/// Counters of a local cache in front of a remote store, since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Ranges read from a cached copy.
    pub hits: u64,
    /// Ranges whose object was not cached.
    pub misses: u64,
    /// Whole objects downloaded, and their bytes.
    pub downloads: u64,
    pub downloaded_bytes: u64,
    pub evictions: u64,
    /// What the cache holds now, and its bound.
    pub objects: u64,
    pub bytes: u64,
    pub max_bytes: u64,
}

pub trait ReadBackend: Send + Sync + std::fmt::Debug {
    /// A short description for messages (`local /path`, `s3://bucket/prefix`).
    fn location(&self) -> String;
    fn read(&self, kind: Kind, id: &str) -> Result<Bytes>;
    fn read_range(&self, kind: Kind, id: &str, offset: u64, len: u64) -> Result<Bytes>;
    fn list(&self, kind: Kind) -> Result<Vec<ObjectInfo>>;
    fn exists(&self, kind: Kind, id: &str) -> Result<bool>;

    /// How many transfers to run at once against this backend: pack
    /// uploads of one writer, and reads or deletes of many objects.
    fn concurrency(&self) -> usize {
        LOCAL_CONCURRENCY
    }

    /// Makes `objects` (id, size) quick to read: a backend that keeps a
    /// local cache of a remote store downloads the ones it lacks,
    /// [`ReadBackend::concurrency`] at a time. Others do nothing. Never
    /// fails: an object that could not be fetched is read (and its error
    /// reported) when it is needed.
    fn prefetch(&self, kind: Kind, objects: &[(String, u64)]) -> FetchStats {
        let _ = (kind, objects);
        FetchStats::default()
    }

    /// Drops the local copy of an object (one whose content was found not to
    /// match its id); true when there was one, so that reading again goes to
    /// the store itself.
    fn evict(&self, kind: Kind, id: &str) -> bool {
        let _ = (kind, id);
        false
    }

    /// The local cache's counters, for a backend that has one.
    fn cache_stats(&self) -> Option<CacheStats> {
        None
    }

    /// The directory holding every object, for a store that is a local
    /// directory (its size can then be measured on disk).
    fn local_dir(&self) -> Option<PathBuf> {
        None
    }
}

pub trait WriteBackend: ReadBackend {
    /// Writes an object atomically and durably: after it returns, a crash
    /// leaves either no object or the whole object.
    fn write(&self, kind: Kind, id: &str, data: Bytes) -> Result<()>;
    fn delete(&self, kind: Kind, id: &str) -> Result<()>;
}

/// Transfers at once on a local directory: two pack writes in flight hide
/// each other's fsync latency.
pub const LOCAL_CONCURRENCY: usize = 2;
/// Transfers at once on S3-compatible storage, whose requests take
/// milliseconds each: enough to hide that latency, few enough to bound the
/// memory of packs in flight (a writer holds up to this many 16 MiB packs).
pub const S3_CONCURRENCY: usize = 8;

/// The `object_store` backend.
///
/// Synchronous on top of an async store: it owns a small tokio runtime and
/// blocks on each call, so call it from blocking threads.
#[derive(Debug)]
pub struct ObjectStoreBackend {
    store: Arc<dyn ObjectStore>,
    location: String,
    /// Key prefix under which every object lives (empty: the store's root).
    prefix: String,
    concurrency: usize,
    /// For a store that is a local directory without its own fsync: the
    /// directory, so that written objects are fsync'd here.
    sync_root: Option<PathBuf>,
    /// For [`ObjectStoreBackend::local`]: its directory.
    local_dir: Option<PathBuf>,
    /// An `Option` only so that `Drop` can take it out and shut it down
    /// without blocking.
    runtime: Option<tokio::runtime::Runtime>,
}

impl ObjectStoreBackend {
    /// A local directory (created if missing).
    pub fn local(root: &Path) -> Result<ObjectStoreBackend> {
        std::fs::create_dir_all(root).map_err(|e| Error::Io(root.to_path_buf(), e))?;
        let location = format!("local {}", root.display());
        // The store fsyncs the staged file before renaming it into place and
        // then the directories it changed, so a put is atomic and durable:
        // syncing after the rename would leave a window in which a crash
        // shows a torn object under its final name.
        let store = LocalFileSystem::new_with_prefix(root)
            .map_err(|e| Error::Backend(location.clone(), e.to_string()))?
            .with_fsync(true);
        let mut backend = Self::build(Arc::new(store), location, None)?;
        backend.local_dir = Some(root.to_path_buf());
        Ok(backend)
    }

    /// Any `object_store` store. `location` describes it in messages
    /// (`s3://bucket/prefix`). `local_root`: when the store is a local
    /// directory that does not fsync by itself, that directory; each written
    /// object, its directory and (when new) the directory above are then
    /// fsync'd after the write.
    pub fn from_store(store: Arc<dyn ObjectStore>, location: String, local_root: Option<PathBuf>) -> Result<ObjectStoreBackend> {
        Self::build(store, location, local_root)
    }

    /// Puts every object under `prefix` (`a/b`) inside the store.
    pub fn with_prefix(mut self, prefix: &str) -> ObjectStoreBackend {
        self.prefix = prefix.trim_matches('/').to_string();
        self.local_dir = self.local_dir.take().map(|d| d.join(&self.prefix));
        self
    }

    fn build(store: Arc<dyn ObjectStore>, location: String, sync_root: Option<PathBuf>) -> Result<ObjectStoreBackend> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cairn-blob-io")
            .enable_all()
            .build()
            .map_err(|e| Error::Backend(location.clone(), format!("cannot start its runtime: {e}")))?;
        Ok(ObjectStoreBackend { store, location, prefix: String::new(), concurrency: LOCAL_CONCURRENCY, sync_root, local_dir: None, runtime: Some(runtime) })
    }

    /// Runs up to `n` transfers at once (see [`ReadBackend::concurrency`]).
    pub fn with_concurrency(mut self, n: usize) -> ObjectStoreBackend {
        self.concurrency = n.max(1);
        self
    }

    /// S3-compatible storage at `url`, `s3://BUCKET/PREFIX` (the prefix may
    /// be empty). Configured from the standard environment (`AWS_ENDPOINT_URL`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
    /// `AWS_REGION`, `AWS_ALLOW_HTTP=true` for a plain-HTTP endpoint, ...),
    /// then from `settings`, `object_store` configuration keys such as
    /// `aws_endpoint_url` that win over the environment. Transient errors
    /// (connection failures, timeouts, 5xx, 429) are retried with
    /// exponential backoff for up to a minute.
    ///
    /// Lists the prefix once before returning, so a bad URL, an unreachable
    /// endpoint, a missing bucket or refused credentials fail here, in one
    /// line naming the URL.
    pub fn s3(url: &str, settings: &[(&str, &str)]) -> Result<ObjectStoreBackend> {
        let fail = |why: String| Error::Backend(url.to_string(), why);
        let (bucket, prefix) = parse_s3_url(url).map_err(fail)?;
        // reqwest's rustls comes without a crypto provider; the workspace's
        // is ring. Installing fails harmlessly when one already is.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let builder = |retry: RetryConfig| -> Result<(AmazonS3, String)> {
            let mut b = AmazonS3Builder::from_env();
            for (key, value) in settings {
                let key: AmazonS3ConfigKey = key.parse().map_err(|_| fail(format!("unknown S3 setting {key:?}")))?;
                b = b.with_config(key, *value);
            }
            // A 16 MiB pack over a slow link takes longer than the default 30 s.
            let b = b.with_bucket_name(bucket.clone()).with_retry(retry).with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "300s");
            let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint).unwrap_or_else(|| "AWS S3".to_string());
            let store = b.build().map_err(|e| fail(format!("{} (endpoint {endpoint})", error_chain(&e))))?;
            Ok((store, endpoint))
        };
        let (store, _) = builder(RetryConfig {
            backoff: BackoffConfig { init_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(5), base: 2.0 },
            max_retries: 8,
            retry_timeout: Duration::from_secs(60),
        })?;
        // The first contact retries little: a daemon pointed at the wrong
        // place should say so in seconds, not after a minute.
        let (probe, endpoint) = builder(RetryConfig {
            backoff: BackoffConfig { init_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(1), base: 2.0 },
            max_retries: 2,
            retry_timeout: Duration::from_secs(10),
        })?;
        let backend = Self::build(Arc::new(store), url.to_string(), None)?.with_prefix(&prefix).with_concurrency(S3_CONCURRENCY);
        let root = (!prefix.is_empty()).then(|| StorePath::from(prefix.as_str()));
        let listed = backend.run(async move { probe.list_with_delimiter(root.as_ref()).await })?;
        if let Err(e) = listed {
            let why = match &e {
                object_store::Error::NotFound { .. } => format!("bucket {bucket} not found (NoSuchBucket)"),
                // An answer from the server says what it refused; a failure
                // to get one is best told by its innermost cause (connection
                // refused, no such host, a certificate not trusted).
                e => s3_error_summary(&raw_chain(e)).unwrap_or_else(|| root_cause(e)),
            };
            return Err(fail(format!("cannot list the bucket at endpoint {endpoint}: {why}")));
        }
        Ok(backend)
    }

    /// The key of an object, relative to the store's root.
    fn key(&self, kind: Kind, id: &str) -> Result<String> {
        // Ids become path segments: refuse anything that could escape them.
        if id.len() < 2 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(Error::Backend(self.location.clone(), format!("{id:?} is not a valid object id")));
        }
        let rel = if kind.fanned_out() { format!("{}/{}/{id}", kind.dir(), &id[..2]) } else { format!("{}/{id}", kind.dir()) };
        Ok(if self.prefix.is_empty() { rel } else { format!("{}/{rel}", self.prefix) })
    }

    fn kind_prefix(&self, kind: Kind) -> StorePath {
        if self.prefix.is_empty() {
            StorePath::from(kind.dir())
        } else {
            StorePath::from(format!("{}/{}", self.prefix, kind.dir()).as_str())
        }
    }

    /// Runs a future of the store to completion on the backend's runtime.
    fn run<T: Send + 'static>(&self, fut: impl Future<Output = T> + Send + 'static) -> Result<T> {
        let runtime = self.runtime.as_ref().ok_or_else(|| Error::Backend(self.location.clone(), "shut down".into()))?;
        if tokio::runtime::Handle::try_current().is_ok() {
            // Called from inside an async context, where `block_on` would
            // panic: run it on our workers and wait here instead.
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            runtime.spawn(async move {
                let _ = tx.send(fut.await);
            });
            rx.recv().map_err(|_| Error::Backend(self.location.clone(), "a store call was cancelled".into()))
        } else {
            Ok(runtime.block_on(fut))
        }
    }

    /// Maps a store error about one object to ours.
    fn error(&self, op: &str, kind: Kind, id: &str, err: object_store::Error) -> Error {
        match err {
            object_store::Error::NotFound { .. } => Error::Missing(kind, id.to_string()),
            err if is_no_space(&err) => Error::NoSpace(self.location.clone()),
            err => Error::Backend(self.location.clone(), format!("{op} {} {id}: {}", kind.dir(), error_chain(&err))),
        }
    }

    /// fsyncs a just-written object, its directory, and the directory above
    /// when the object's directory was created by this write.
    fn sync_written(&self, root: &Path, key: &str, dir_was_new: bool) -> Result<()> {
        let path = root.join(key);
        sync_path(&path)?;
        let mut dir = path.parent();
        let levels = if dir_was_new { 2 } else { 1 };
        for _ in 0..levels {
            if let Some(d) = dir {
                sync_path(d)?;
                dir = d.parent();
            }
        }
        Ok(())
    }
}

fn sync_path(path: &Path) -> Result<()> {
    let res = std::fs::File::open(path).and_then(|f| f.sync_all());
    res.map_err(|e| match e.raw_os_error() {
        Some(libc::ENOSPC) => Error::NoSpace(path.display().to_string()),
        _ => Error::Io(path.to_path_buf(), e),
    })
}

/// True when `err` or any error in its source chain says the disk is full.
fn is_no_space(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.raw_os_error() == Some(libc::ENOSPC) || io.kind() == std::io::ErrorKind::StorageFull {
                return true;
            }
        }
        if e.to_string().contains("No space left") {
            return true;
        }
        cur = e.source();
    }
    false
}

fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// `s3://BUCKET/PREFIX` → (bucket, prefix without surrounding slashes).
pub(crate) fn parse_s3_url(url: &str) -> std::result::Result<(String, String), String> {
    let rest = url.strip_prefix("s3://").ok_or_else(|| "not an S3 URL: expected s3://BUCKET/PREFIX".to_string())?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let valid_bucket = (3..=63).contains(&bucket.len())
        && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
        && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !valid_bucket {
        return Err(format!("{bucket:?} is not a bucket name (3 to 63 lowercase letters, digits, dots and hyphens)"));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|seg| seg == "." || seg == "..") || prefix.contains("//") || prefix.contains(['?', '#', '\\']) {
        return Err(format!("{prefix:?} is not a usable key prefix"));
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

/// An error and its sources on one line, without repeating a source whose
/// text its parent already includes (object_store's errors often do).
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let line = raw_chain(err);
    s3_error_summary(&line).unwrap_or(line)
}

/// An error and its sources on one line, an S3 error response included whole.
fn raw_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let text = e.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cur = e.source();
    }
    one_line(&line)
}

/// The innermost error of a chain, on one line.
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = err;
    while let Some(next) = cur.source() {
        cur = next;
    }
    one_line(&cur.to_string())
}

/// An S3 error response quoted in `line` (its XML body), as its status,
/// code and message: `404 Not Found: NoSuchBucket: The specified bucket does
/// not exist`.
fn s3_error_summary(line: &str) -> Option<String> {
    let tag = |name: &str| -> Option<String> {
        let start = line.find(&format!("<{name}>"))? + name.len() + 2;
        let len = line[start..].find(&format!("</{name}>"))?;
        Some(line[start..start + len].to_string())
    };
    let code = tag("Code")?;
    let status = line.find("status code: ").map(|i| &line[i + 13..]).and_then(|rest| rest.split(':').next()).unwrap_or("error");
    Some(match tag("Message") {
        Some(message) => format!("{status}: {code}: {message}"),
        None => format!("{status}: {code}"),
    })
}

impl Drop for ObjectStoreBackend {
    fn drop(&mut self) {
        // Dropping a runtime blocks and panics inside another runtime's
        // async context (the daemon's); shutting it down in the background
        // does neither.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl ReadBackend for ObjectStoreBackend {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn local_dir(&self) -> Option<PathBuf> {
        self.local_dir.clone()
    }

    fn concurrency(&self) -> usize {
        self.concurrency
    }

    fn read(&self, kind: Kind, id: &str) -> Result<Bytes> {
        let path = StorePath::from(self.key(kind, id)?.as_str());
        let store = Arc::clone(&self.store);
        self.run(async move { store.get(&path).await?.bytes().await })?.map_err(|e| self.error("read", kind, id, e))
    }

    fn read_range(&self, kind: Kind, id: &str, offset: u64, len: u64) -> Result<Bytes> {
        let end = offset.checked_add(len).ok_or_else(|| Error::Corrupt(kind, id.to_string(), format!("range {offset}+{len} overflows")))?;
        let path = StorePath::from(self.key(kind, id)?.as_str());
        let store = Arc::clone(&self.store);
        let got = self.run(async move { store.get_range(&path, offset..end).await })?;
        let truncated = |size: u64| {
            Error::Corrupt(kind, id.to_string(), format!("truncated: bytes {offset}..{end} wanted, the object has {size}"))
        };
        match got {
            Ok(bytes) if bytes.len() as u64 == len => Ok(bytes),
            Ok(bytes) => Err(truncated(offset + bytes.len() as u64)),
            Err(object_store::Error::NotFound { .. }) => Err(Error::Missing(kind, id.to_string())),
            Err(e) => {
                // Stores report a range past the end in their own words;
                // when that is what happened, say so (the object is short).
                let path = StorePath::from(self.key(kind, id)?.as_str());
                let store = Arc::clone(&self.store);
                match self.run(async move { store.head(&path).await })? {
                    Ok(meta) if meta.size < end => Err(truncated(meta.size)),
                    Err(object_store::Error::NotFound { .. }) => Err(Error::Missing(kind, id.to_string())),
                    _ => Err(self.error("read", kind, id, e)),
                }
            }
        }
    }

    fn list(&self, kind: Kind) -> Result<Vec<ObjectInfo>> {
        let prefix = self.kind_prefix(kind);
        let store = Arc::clone(&self.store);
        let metas = self
            .run(async move { store.list(Some(&prefix)).try_collect::<Vec<_>>().await })?
            .map_err(|e| Error::Backend(self.location.clone(), format!("list {}: {}", kind.dir(), error_chain(&e))))?;
        Ok(metas
            .into_iter()
            .filter_map(|meta| {
                let id = meta.location.filename()?.to_string();
                Some(ObjectInfo { id, size: meta.size, modified: meta.last_modified.into() })
            })
            .collect())
    }

    fn exists(&self, kind: Kind, id: &str) -> Result<bool> {
        let path = StorePath::from(self.key(kind, id)?.as_str());
        let store = Arc::clone(&self.store);
        match self.run(async move { store.head(&path).await })? {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.error("stat", kind, id, e)),
        }
    }
}

impl WriteBackend for ObjectStoreBackend {
    fn write(&self, kind: Kind, id: &str, data: Bytes) -> Result<()> {
        let key = self.key(kind, id)?;
        let dir_was_new = match (&self.sync_root, Path::new(&key).parent()) {
            (Some(root), Some(dir)) => !root.join(dir).exists(),
            _ => false,
        };
        let path = StorePath::from(key.as_str());
        let store = Arc::clone(&self.store);
        self.run(async move { store.put(&path, PutPayload::from(data)).await })?.map_err(|e| self.error("write", kind, id, e))?;
        if let Some(root) = &self.sync_root {
            self.sync_written(root, &key, dir_was_new)?;
        }
        Ok(())
    }

    /// Deleting an object that is already gone succeeds (gc may race with
    /// itself after a crash).
    fn delete(&self, kind: Kind, id: &str) -> Result<()> {
        let path = StorePath::from(self.key(kind, id)?.as_str());
        let store = Arc::clone(&self.store);
        match self.run(async move { store.delete(&path).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error("delete", kind, id, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend() -> (tempfile::TempDir, ObjectStoreBackend) {
        let dir = tempfile::tempdir().unwrap();
        let b = ObjectStoreBackend::local(&dir.path().join("repo")).unwrap();
        (dir, b)
    }

    #[test]
    fn write_read_list_delete() {
        let (dir, b) = backend();
        let id = "ab".repeat(32);
        assert!(b.list(Kind::Pack).unwrap().is_empty());
        assert!(!b.exists(Kind::Pack, &id).unwrap());
        b.write(Kind::Pack, &id, Bytes::from_static(b"hello world")).unwrap();
        assert!(dir.path().join("repo/packs/ab").join(&id).is_file());
        assert!(b.exists(Kind::Pack, &id).unwrap());
        assert_eq!(&b.read(Kind::Pack, &id).unwrap()[..], b"hello world");
        assert_eq!(&b.read_range(Kind::Pack, &id, 6, 5).unwrap()[..], b"world");
        let listed = b.list(Kind::Pack).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].id.as_str(), listed[0].size), (id.as_str(), 11));
        assert!(b.list(Kind::Manifest).unwrap().is_empty());

        b.write(Kind::Index, &id, Bytes::from_static(b"i")).unwrap();
        assert!(dir.path().join("repo/index").join(&id).is_file());

        b.delete(Kind::Pack, &id).unwrap();
        b.delete(Kind::Pack, &id).unwrap();
        assert!(matches!(b.read(Kind::Pack, &id), Err(Error::Missing(Kind::Pack, _))));
        assert!(matches!(b.read_range(Kind::Pack, &id, 0, 1), Err(Error::Missing(Kind::Pack, _))));
    }

    #[test]
    fn short_range_is_named_truncation() {
        let (_dir, b) = backend();
        let id = "cd".repeat(32);
        b.write(Kind::Pack, &id, Bytes::from_static(b"0123456789")).unwrap();
        let err = b.read_range(Kind::Pack, &id, 5, 10).unwrap_err();
        assert!(matches!(&err, Error::Corrupt(Kind::Pack, got, why) if *got == id && why.contains("truncated")), "{err}");
    }

    #[test]
    fn refuses_ids_that_are_not_names() {
        let (_dir, b) = backend();
        assert!(b.write(Kind::Pack, "../../etc", Bytes::new()).is_err());
        assert!(b.read(Kind::Manifest, "a/b").is_err());
    }

    #[test]
    fn from_store_with_local_root_and_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let b = ObjectStoreBackend::from_store(store, "test".into(), Some(dir.path().to_path_buf())).unwrap().with_prefix("repos/one");
        let id = "ef".repeat(32);
        b.write(Kind::Manifest, &id, Bytes::from_static(b"m")).unwrap();
        assert!(dir.path().join("repos/one/manifests/ef").join(&id).is_file());
        assert_eq!(b.list(Kind::Manifest).unwrap().len(), 1);
    }

    #[test]
    fn only_a_local_directory_names_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let local = ObjectStoreBackend::local(dir.path()).unwrap().with_prefix("repo");
        assert_eq!(local.local_dir(), Some(dir.path().join("repo")));
        let store = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        assert_eq!(ObjectStoreBackend::from_store(store, "test".into(), None).unwrap().local_dir(), None);
    }

    #[test]
    fn usable_and_droppable_inside_an_async_context() {
        let (_dir, b) = backend();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async move {
            let id = "01".repeat(32);
            b.write(Kind::Index, &id, Bytes::from_static(b"x")).unwrap();
            assert!(b.exists(Kind::Index, &id).unwrap());
            drop(b);
        });
    }

    #[test]
    fn no_space_is_recognised_through_sources() {
        let io = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let err = object_store::Error::Generic { store: "x", source: Box::new(io) };
        assert!(is_no_space(&err));
        let other = object_store::Error::Generic { store: "x", source: "permission denied".into() };
        assert!(!is_no_space(&other));
    }

    #[test]
    fn s3_objects_are_keyed_under_the_prefix_as_locally() {
        let moto = crate::moto::Moto::shared();
        moto.create_bucket("cairn-keys");
        let settings = moto.settings();
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let b = ObjectStoreBackend::s3("s3://cairn-keys/a/b/", &settings).unwrap();
        assert_eq!((b.location(), b.concurrency()), ("s3://cairn-keys/a/b/".to_string(), S3_CONCURRENCY));
        let id = "ab".repeat(32);
        b.write(Kind::Pack, &id, Bytes::from_static(b"hello world")).unwrap();
        b.write(Kind::Index, &id, Bytes::from_static(b"i")).unwrap();
        let mut keys = moto.keys("cairn-keys", "");
        keys.sort();
        assert_eq!(keys, vec![format!("a/b/index/{id}"), format!("a/b/packs/ab/{id}")]);
        assert_eq!(&b.read_range(Kind::Pack, &id, 6, 5).unwrap()[..], b"world");
        let err = b.read_range(Kind::Pack, &id, 5, 10).unwrap_err();
        assert!(matches!(&err, Error::Corrupt(Kind::Pack, _, why) if why.contains("truncated")), "{err}");
        let listed = b.list(Kind::Pack).unwrap();
        assert_eq!((listed.len(), listed[0].size), (1, 11));
        b.delete(Kind::Pack, &id).unwrap();
        b.delete(Kind::Pack, &id).unwrap();
        assert!(matches!(b.read(Kind::Pack, &id), Err(Error::Missing(Kind::Pack, _))));
        assert!(!b.exists(Kind::Pack, &id).unwrap());
    }

    #[test]
    fn s3_failures_are_one_line_naming_the_url() {
        let moto = crate::moto::Moto::shared();
        let settings = moto.settings();
        let mut settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();

        let err = ObjectStoreBackend::s3("s3://no-such-bucket/x", &settings).unwrap_err().to_string();
        assert!(err.starts_with("backend s3://no-such-bucket/x: cannot list the bucket at endpoint http://127.0.0.1:"), "{err}");
        assert!(err.ends_with("404 Not Found: NoSuchBucket: The specified bucket does not exist") || err.ends_with("(NoSuchBucket)"), "{err}");

        for bad in ["s3://Bad_Bucket/x", "http://example.com/x", "s3://ok-bucket/../x"] {
            let err = ObjectStoreBackend::s3(bad, &settings).unwrap_err().to_string();
            assert!(err.starts_with(&format!("backend {bad}: ")), "{err}");
        }
        let err = ObjectStoreBackend::s3("s3://ok-bucket", &[("aws_no_such_thing", "1")]).unwrap_err().to_string();
        assert!(err.contains("aws_no_such_thing"), "{err}");

        // Nothing listens on the port: a quick, clear failure.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let endpoint = format!("http://{closed}");
        settings.retain(|(k, _)| *k != "aws_endpoint_url");
        settings.push(("aws_endpoint_url", &endpoint));
        let started = std::time::Instant::now();
        let err = ObjectStoreBackend::s3("s3://ok-bucket/p", &settings).unwrap_err().to_string();
        assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
        assert!(err.starts_with("backend s3://ok-bucket/p: cannot list the bucket at endpoint http://127.0.0.1:") && !err.contains('\n'), "{err}");
        assert!(err.ends_with("Connection refused (os error 111)"), "{err}");
    }
}
