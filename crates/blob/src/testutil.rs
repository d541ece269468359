//! Helpers shared by the unit tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{ObjectId, ObjectStoreBackend, RepoOptions, Repository};

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

pub fn pack_path(dir: &Path, pack: &ObjectId) -> PathBuf {
    let hex = pack.to_hex();
    dir.join("repo/packs").join(&hex[..2]).join(hex)
}

pub fn manifest_path(dir: &Path, manifest: &ObjectId) -> PathBuf {
    let hex = manifest.to_hex();
    dir.join("repo/manifests").join(&hex[..2]).join(hex)
}
