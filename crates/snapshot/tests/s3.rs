//! Snapshots on S3-compatible storage (a moto server on loopback): a tree
//! captured by one node is restored by another whose cache is cold, which
//! downloads each pack once, several at once, and nothing the next time.
#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;

use cairn_blob::moto::Moto;
use cairn_blob::{CachedBackend, ObjectStoreBackend, ReadBackend, Repository, DEFAULT_CACHE_BYTES};
use cairn_snapshot::{capture, diff, load, restore, Diff, NoFreeze};
use common::*;

/// A node's view of the shared store: the bucket behind its own cache.
fn node(moto: &Moto, cache: &Path) -> (Arc<CachedBackend>, Arc<Repository>) {
    let settings = moto.settings();
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let store = Arc::new(ObjectStoreBackend::s3("s3://snapshots/tenant-a", &settings).unwrap());
    let cached = Arc::new(CachedBackend::open(store, cache, DEFAULT_CACHE_BYTES).unwrap());
    (cached.clone(), Repository::open(cached).unwrap())
}

#[test]
fn a_snapshot_taken_on_one_node_restores_on_another_and_downloads_once() {
    let moto = Moto::start();
    moto.create_bucket("snapshots");
    let t = tempfile::tempdir().unwrap();
    let (disk_a, disk_b, disk_c) = (t.path().join("a"), t.path().join("b"), t.path().join("c"));
    let u = upper(&disk_a, "root", X);
    fs::create_dir_all(u.join("src/deep")).unwrap();
    for i in 0..40u64 {
        fs::write(u.join(format!("src/file{i}.txt")), format!("file {i}\n").repeat(200)).unwrap();
    }
    fs::write(u.join("src/deep/blob.bin"), noise(7, 3 << 20)).unwrap();
    fs::write(u.join("empty"), b"").unwrap();

    let (cache_a, repo_a) = node(&moto, &t.path().join("cache-a"));
    settle();
    let (id, m, _) = capture(&repo_a, &disk_a, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();
    assert_eq!(cache_a.cache_stats().unwrap().objects, repo_a.stats().packs, "the writer keeps what it uploads");
    assert!(moto.keys("snapshots", "tenant-a/packs/").len() as u64 == repo_a.stats().packs);

    // Node B has never seen the packs: loading the manifest (whose
    // segments are chunks too) and the restore fetch them first.
    let (cache_b, repo_b) = node(&moto, &t.path().join("cache-b"));
    moto.start_recording();
    let m_b = load(&repo_b, &id).unwrap();
    assert_eq!(m_b, m);
    fs::create_dir(&disk_b).unwrap();
    let (restored, stats) = restore(&repo_b, &m_b, &disk_b, None, Y, &mut |_| {}).unwrap();
    let requests = moto.stop_recording();
    assert_eq!(stats.files_written, m.file_count());
    assert_same(&listing(&u, X), &listing(&disk_b.join("root/upper"), Y));
    let s = cache_b.cache_stats().unwrap();
    assert_eq!(s.downloads, repo_b.stats().packs, "{s:?}");
    let pack_gets = requests.iter().filter(|r| r.method == "GET" && r.path.contains("/packs/")).count() as u64;
    assert_eq!(pack_gets, repo_b.stats().packs, "one GET per pack: {requests:?}");
    assert_eq!(s.misses, 0, "every pack was fetched before it was read: {s:?}");

    // Again into an empty disk: all from the cache.
    fs::create_dir(&disk_c).unwrap();
    moto.start_recording();
    restore(&repo_b, &m_b, &disk_c, None, Y, &mut |_| {}).unwrap();
    let requests = moto.stop_recording();
    assert!(!requests.iter().any(|r| r.path.contains("/packs/")), "{requests:?}");
    assert_same(&listing(&u, X), &listing(&disk_c.join("root/upper"), Y));

    // And a rollback of B's disk after a change downloads nothing either.
    fs::write(disk_b.join("root/upper/src/file3.txt"), b"changed").unwrap();
    fs::remove_file(disk_b.join("root/upper/src/file4.txt")).unwrap();
    moto.start_recording();
    restore(&repo_b, &m_b, &disk_b, Some(&restored), Y, &mut |_| {}).unwrap();
    assert!(!moto.stop_recording().iter().any(|r| r.path.contains("/packs/")));
    settle();
    let (_, again, _) = capture(&repo_b, &disk_b, &root_layer(), None, Y, &NoFreeze, &mut |_| {}).unwrap();
    assert_eq!(diff(&m, &again), Diff::default());
}
