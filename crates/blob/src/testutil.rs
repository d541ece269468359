//! Helpers shared by the unit tests.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::moto::Moto;
use crate::{CachedBackend, Kind, ObjectId, ObjectStoreBackend, RepoOptions, Repository, WriteBackend, DEFAULT_CACHE_BYTES};

/// Deterministic pseudo-random bytes (xorshift): incompressible, and
/// varied enough for FastCDC to find natural boundaries.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A repository in `dir/repo` whose packs are flushed at `pack_target`.
pub fn open_repo(dir: &Path, pack_target: usize) -> Arc<Repository> {
    let backend = Arc::new(ObjectStoreBackend::local(&dir.join("repo")).unwrap());
    Repository::open_with(backend, RepoOptions { pack_target }).unwrap()
}

/// The kinds of store the repository tests run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// A local directory.
    Local,
    /// S3-compatible storage (a moto server on loopback).
    S3,
    /// The same with a local cache of its packs in front, as a daemon uses it.
    S3Cached,
}

const PREFIX: &str = "nodes/shared";

/// A store for one test, with ways to reach behind the repository's back
/// (to damage an object as a failing disk or another writer would).
pub struct Fixture {
    pub store: Store,
    pub dir: tempfile::TempDir,
    /// Its own bucket on the server the tests running now share.
    bucket: String,
    moto: Option<Arc<Moto>>,
}

impl Fixture {
    /// On the server the tests running now share.
    pub fn new(store: Store) -> Fixture {
        Self::on((store != Store::Local).then(Moto::shared), store)
    }

    /// On a server of its own, for a test that reads the server's request
    /// log (the recorder is the server's, not a bucket's).
    pub fn with_own_server(store: Store) -> Fixture {
        Self::on(Some(Arc::new(Moto::start())), store)
    }

    fn on(moto: Option<Arc<Moto>>, store: Store) -> Fixture {
        static BUCKETS: AtomicU64 = AtomicU64::new(0);
        let dir = tempfile::tempdir().unwrap();
        let bucket = format!("cairn-test-{}", BUCKETS.fetch_add(1, Ordering::Relaxed));
        if let Some(m) = &moto {
            m.create_bucket(&bucket);
        }
        Fixture { store, dir, bucket, moto }
    }

    /// The store itself, without a cache: a new connection each call.
    pub fn raw(&self) -> Arc<dyn WriteBackend> {
        match &self.moto {
            None => Arc::new(ObjectStoreBackend::local(&self.dir.path().join("repo")).unwrap()),
            Some(m) => {
                let settings = m.settings();
                let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
                Arc::new(ObjectStoreBackend::s3(&format!("s3://{}/{PREFIX}", self.bucket), &settings).unwrap())
            }
        }
    }

    /// The backend repositories open on: the store, behind the cache for
    /// [`Store::S3Cached`] (whose copies outlive each opening, as a node's
    /// do across restarts).
    pub fn backend(&self) -> Arc<dyn WriteBackend> {
        match self.store {
            Store::S3Cached => Arc::new(CachedBackend::open(self.raw(), &self.cache_dir(), DEFAULT_CACHE_BYTES).unwrap()),
            _ => self.raw(),
        }
    }

    pub fn cache_dir(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// Opens (or opens again) the repository, its packs flushed at `pack_target`.
    pub fn open(&self, pack_target: usize) -> Arc<Repository> {
        Repository::open_with(self.backend(), RepoOptions { pack_target }).unwrap()
    }

    /// An object's bytes as the store holds them.
    pub fn read_object(&self, kind: Kind, id: &ObjectId) -> Vec<u8> {
        self.raw().read(kind, &id.to_hex()).unwrap().to_vec()
    }

    /// Replaces an object in the store (and drops any cached copy, as if
    /// this node had never seen it).
    pub fn write_object(&self, kind: Kind, id: &ObjectId, data: &[u8]) {
        self.raw().write(kind, &id.to_hex(), data.to_vec().into()).unwrap();
        self.drop_cached(kind, id);
    }

    pub fn delete_object(&self, kind: Kind, id: &ObjectId) {
        self.raw().delete(kind, &id.to_hex()).unwrap();
        self.drop_cached(kind, id);
    }

    pub fn exists(&self, kind: Kind, id: &ObjectId) -> bool {
        self.raw().exists(kind, &id.to_hex()).unwrap()
    }

    /// Flips one byte of an object in the store.
    pub fn flip_byte(&self, kind: Kind, id: &ObjectId, at: u64) {
        let mut data = self.read_object(kind, id);
        data[at as usize] ^= 0xff;
        self.write_object(kind, id, &data);
    }

    /// Where the cache keeps its copy of a pack.
    pub fn cached_path(&self, pack: &ObjectId) -> PathBuf {
        let hex = pack.to_hex();
        self.cache_dir().join("packs").join(&hex[..2]).join(hex)
    }

    fn drop_cached(&self, kind: Kind, id: &ObjectId) {
        if kind == Kind::Pack {
            let _ = std::fs::remove_file(self.cached_path(id));
        }
    }

    /// The S3 server (panics for a local store).
    pub fn moto(&self) -> &Moto {
        self.moto.as_deref().unwrap()
    }

    /// The keys the S3 store holds under the test prefix (None for a local store).
    pub fn s3_keys(&self) -> Option<Vec<String>> {
        self.moto.as_ref().map(|m| m.keys(&self.bucket, PREFIX))
    }
}
