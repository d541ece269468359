//! Unit tests of the repository, its writer, check and gc.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use proptest::prelude::*;

use super::*;
use crate::testutil::{noise, open_repo, Fixture, Store};
use crate::{chunker, Error, Kind, ObjectId, ObjectInfo, ReadBackend, Result, WriteBackend};

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

fn many_chunks_round_trip_after_reopening(f: &Fixture) {
    let chunks = sample_chunks(1, 300);
    let repo = f.open(SMALL_PACKS);
    let (ids, stats) = store(&repo, &chunks);
    assert_eq!((stats.chunks, stats.new_chunks), (300, 300));
    assert!(stats.packs > 3, "{stats:?}");
    assert!(stats.stored_bytes < stats.bytes, "compressible chunks shrink: {stats:?}");
    assert_eq!(index_files(&repo), 1);
    drop(repo);

    let repo = f.open(SMALL_PACKS);
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

fn known_chunks_are_stored_once(f: &Fixture) {
    let repo = f.open(SMALL_PACKS);
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
    let other = f.open(SMALL_PACKS);
    assert_eq!(store(&other, &chunks).1.new_chunks, 0);
}

fn settle_waits_for_compression_and_the_writer_goes_on(f: &Fixture) {
    let repo = f.open(SMALL_PACKS);
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

fn concurrent_writers_storing_the_same_chunk_is_harmless(f: &Fixture) {
    let repo = f.open(SMALL_PACKS);
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

fn streamed_file_round_trips(f: &Fixture) {
    let repo = f.open(SMALL_PACKS);
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
fn raw_entry(f: &Fixture, pack: &ObjectId) -> crate::pack::PackEntry {
    let data = f.read_object(Kind::Pack, pack);
    crate::pack::parse_trailer(&data).unwrap().into_iter().find(|e| !e.compressed).unwrap()
}

fn pack_of(repo: &Repository, chunk: &ObjectId) -> ObjectId {
    repo.read_index().chunks[chunk].pack
}

fn a_corrupted_byte_is_detected_and_named(f: &Fixture) {
    let repo = f.open(SMALL_PACKS);
    let (ids, _) = store(&repo, &sample_chunks(3, 30));
    let pack = pack_of(&repo, &ids[1]);
    let victim = raw_entry(f, &pack);
    f.flip_byte(Kind::Pack, &pack, victim.offset + u64::from(victim.length) / 2);

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

fn a_corrupted_compressed_chunk_or_trailer_is_a_problem_line(f: &Fixture) {
    let repo = f.open(1 << 30);
    let (ids, _) = store(&repo, &[b"compressible ".repeat(2000), noise(1, 3000)]);
    let pack = pack_of(&repo, &ids[0]);
    let clean = f.read_object(Kind::Pack, &pack);
    f.flip_byte(Kind::Pack, &pack, 20);
    assert!(matches!(repo.read_chunk(&ids[0]), Err(Error::Corrupt(Kind::Pack, p, _)) if p == pack.to_hex()));
    let report = repo.check(&[], &[], true).unwrap();
    assert!(report.problems.iter().any(|l| l.starts_with(&format!("pack {pack}: chunk {}", ids[0]))), "{:?}", report.problems);

    // Damage in the trailer: the chunks may still verify, the pack's
    // hash does not.
    f.write_object(Kind::Pack, &pack, &clean);
    f.flip_byte(Kind::Pack, &pack, clean.len() as u64 - 20);
    let report = repo.check(&[], &[], true).unwrap();
    assert!(!report.is_ok());
    assert!(report.problems.iter().all(|l| l.starts_with(&format!("pack {pack}: "))), "{:?}", report.problems);
}

fn a_truncated_pack_is_detected(f: &Fixture) {
    let repo = f.open(1 << 30);
    let chunks: Vec<Vec<u8>> = (0..10).map(|i| noise(i, 20_000)).collect();
    let (ids, _) = store(&repo, &chunks);
    let pack = pack_of(&repo, &ids[0]);
    let clean = f.read_object(Kind::Pack, &pack);
    let len = clean.len() as u64;
    f.write_object(Kind::Pack, &pack, &clean[..clean.len() / 2]);

    assert_eq!(repo.read_chunk(&ids[0]).unwrap(), chunks[0], "the intact front still reads");
    let err = repo.read_chunk(&ids[9]).unwrap_err();
    assert!(matches!(&err, Error::Corrupt(Kind::Pack, p, why) if *p == pack.to_hex() && why.contains("truncated")), "{err}");

    let report = repo.check(&[], &[], false).unwrap();
    assert_eq!(report.problems.len(), 1);
    assert!(report.problems[0].starts_with(&format!("pack {pack}: {} bytes, the index says {len}", len / 2)), "{:?}", report.problems);
    let report = repo.check(&[], &[], true).unwrap();
    assert!(report.problems.iter().any(|l| l.starts_with(&format!("pack {pack}: no pack magic"))), "{:?}", report.problems);

    f.write_object(Kind::Pack, &pack, b"");
    assert!(!repo.check(&[], &[], true).unwrap().is_ok());
}

fn a_missing_pack_is_reported_without_reading_data(f: &Fixture) {
    let repo = f.open(SMALL_PACKS);
    let (ids, _) = store(&repo, &sample_chunks(5, 20));
    let pack = pack_of(&repo, &ids[0]);
    f.delete_object(Kind::Pack, &pack);
    let manifest = ObjectId::of(b"a manifest");

    let report = repo.check(&[], &[(ids[0], manifest)], false).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(report.problems[0].starts_with(&format!("pack {pack}: missing (")), "{}", report.problems[0]);
    assert!(report.problems[0].contains("1 of them referenced"), "{}", report.problems[0]);
    assert!(matches!(repo.read_chunk(&ids[0]), Err(Error::Missing(Kind::Pack, p)) if p == pack.to_hex()));
}

fn manifests_round_trip_and_are_verified(f: &Fixture) {
    let repo = f.open(SMALL_PACKS);
    let body = b"{\"files\": []}".repeat(100);
    let id = repo.put_manifest(&body).unwrap();
    assert_eq!(id, ObjectId::of(&body));
    assert_eq!(repo.put_manifest(&body).unwrap(), id);
    assert_eq!(repo.get_manifest(&id).unwrap(), body);
    assert!(f.read_object(Kind::Manifest, &id).len() < body.len(), "stored compressed");

    let absent = ObjectId::of(b"absent");
    assert!(matches!(repo.get_manifest(&absent), Err(Error::Missing(Kind::Manifest, _))));
    let chunk = ObjectId::of(b"unknown chunk");
    let report = repo.check(&[id, absent], &[(chunk, id)], false).unwrap();
    assert_eq!(
        report.problems,
        vec![format!("manifest {absent}: missing"), format!("chunk {chunk} (in manifest {id}): not in the index")]
    );

    f.write_object(Kind::Manifest, &id, &zstd::bulk::compress(b"something else", 3).unwrap());
    assert!(matches!(repo.get_manifest(&id), Err(Error::Corrupt(Kind::Manifest, m, why)) if m == id.to_hex() && why.contains("hashes to")));
    let report = repo.check(&[id], &[], true).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(report.problems[0].starts_with(&format!("manifest {id}: content hashes to")), "{}", report.problems[0]);
    f.write_object(Kind::Manifest, &id, b"not zstd");
    assert!(matches!(repo.get_manifest(&id), Err(Error::Corrupt(Kind::Manifest, ..))));
}

fn a_writer_dropped_without_finish_leaves_nothing_indexed(f: &Fixture) {
    let repo = f.open(64 * 1024);
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
    let reopened = f.open(64 * 1024);
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

fn gc_deletes_garbage_and_keeps_young_and_partly_live(f: &Fixture) {
    let repo = f.open(1 << 30);
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
    assert!(f.exists(Kind::Pack, &dead_pack));

    let dry = repo.gc(&live_manifests, &live_chunks, Duration::ZERO, true).unwrap();
    assert!(dry.dry_run);
    assert_eq!((dry.packs_deleted, dry.manifests_deleted, dry.index_files_rewritten), (1, 1, 1));
    assert!(dry.bytes_freed > 0);
    assert!(f.exists(Kind::Pack, &dead_pack) && f.exists(Kind::Manifest, &dead_manifest));
    assert!(repo.has_chunk(&alone[0]));
    assert_eq!(index_files(&repo), 2);

    let done = repo.gc(&live_manifests, &live_chunks, Duration::ZERO, false).unwrap();
    assert_eq!((done.packs_deleted, done.manifests_deleted, done.index_files_rewritten, done.packs_partly_live), (1, 1, 1, 1));
    assert_eq!(done.bytes_freed, dry.bytes_freed);
    assert!(!f.exists(Kind::Pack, &dead_pack) && !f.exists(Kind::Manifest, &dead_manifest));
    assert!(f.exists(Kind::Pack, &mixed_pack) && f.exists(Kind::Manifest, &live_manifest));
    assert!(!repo.has_chunk(&alone[0]));
    assert_eq!(repo.read_chunk(&mixed[1]).unwrap(), dead_neighbour, "a partly live pack is kept whole");
    assert_eq!(index_files(&repo), 1);

    // The store agrees after reopening, and a second gc has nothing to do.
    let reopened = f.open(1 << 30);
    assert!(!reopened.has_chunk(&alone[0]));
    assert_eq!(reopened.read_chunk(&mixed[0]).unwrap(), live_chunk);
    assert!(reopened.check(&[live_manifest], &[(mixed[0], live_manifest)], true).unwrap().is_ok());
    let again = reopened.gc(&live_manifests, &live_chunks, Duration::ZERO, false).unwrap();
    assert_eq!((again.packs_deleted, again.manifests_deleted, again.index_files_rewritten), (0, 0, 0));
}

fn gc_rewrites_an_index_file_that_keeps_some_packs(f: &Fixture) {
    let repo = f.open(1);
    // Pack target 1 byte: each chunk is its own pack, all in one index file.
    let (ids, stats) = store(&repo, &[noise(1, 1000), noise(2, 1000), noise(3, 1000)]);
    assert_eq!(stats.packs, 3);
    let live = HashSet::from([ids[0], ids[2]]);
    let report = repo.gc(&HashSet::new(), &live, Duration::ZERO, false).unwrap();
    assert_eq!((report.packs_deleted, report.index_files_rewritten), (1, 1));
    assert_eq!(index_files(&repo), 1);
    let reopened = f.open(1);
    assert_eq!(reopened.stats().packs, 2);
    assert!(reopened.has_chunk(&ids[0]) && !reopened.has_chunk(&ids[1]) && reopened.has_chunk(&ids[2]));
}

fn an_unreadable_index_file_is_reported_and_stops_gc(f: &Fixture) {
    let repo = f.open(SMALL_PACKS);
    store(&repo, &sample_chunks(6, 5));
    let file = repo.backend().list(Kind::Index).unwrap().remove(0).id;
    f.write_object(Kind::Index, &file.parse().unwrap(), b"garbage");

    let reopened = f.open(SMALL_PACKS);
    assert_eq!(reopened.stats().chunks, 0);
    let report = reopened.check(&[], &[], false).unwrap();
    assert!(report.problems.len() == 1 && report.problems[0].starts_with(&format!("index {file}: unreadable")), "{:?}", report.problems);
    let err = reopened.gc(&HashSet::new(), &HashSet::new(), Duration::ZERO, false).unwrap_err();
    assert!(matches!(err, Error::Corrupt(Kind::Index, f, _) if f == file));
    assert_eq!(reopened.backend().list(Kind::Pack).unwrap().len(), 1, "nothing deleted");
}

/// The real backend, except that pack writes fail as on a full disk.
#[derive(Debug)]
struct FullForPacks(Arc<dyn WriteBackend>);

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

fn a_failed_pack_write_surfaces_and_indexes_nothing(f: &Fixture) {
    let backend = Arc::new(FullForPacks(f.backend()));
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

/// Every test above, on each kind of store: a local directory, S3 (a moto
/// server on loopback), and S3 behind the local pack cache.
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod local {
            $( #[test] fn $name() { super::$name(&super::Fixture::new(super::Store::Local)) } )*
        }
        mod s3 {
            $( #[test] fn $name() { super::$name(&super::Fixture::new(super::Store::S3)) } )*
        }
        mod s3_cached {
            $( #[test] fn $name() { super::$name(&super::Fixture::new(super::Store::S3Cached)) } )*
        }
    };
}

on_every_store!(
    many_chunks_round_trip_after_reopening,
    known_chunks_are_stored_once,
    settle_waits_for_compression_and_the_writer_goes_on,
    concurrent_writers_storing_the_same_chunk_is_harmless,
    streamed_file_round_trips,
    a_corrupted_byte_is_detected_and_named,
    a_corrupted_compressed_chunk_or_trailer_is_a_problem_line,
    a_truncated_pack_is_detected,
    a_missing_pack_is_reported_without_reading_data,
    manifests_round_trip_and_are_verified,
    a_writer_dropped_without_finish_leaves_nothing_indexed,
    gc_deletes_garbage_and_keeps_young_and_partly_live,
    gc_rewrites_an_index_file_that_keeps_some_packs,
    an_unreadable_index_file_is_reported_and_stops_gc,
    a_failed_pack_write_surfaces_and_indexes_nothing,
);

#[test]
fn on_s3_the_objects_land_under_the_prefix_in_the_local_layout() {
    let f = Fixture::new(Store::S3Cached);
    let repo = f.open(SMALL_PACKS);
    let (ids, _) = store(&repo, &sample_chunks(8, 30));
    let manifest = repo.put_manifest(b"a manifest").unwrap();
    let pack = pack_of(&repo, &ids[0]).to_hex();
    let index = repo.backend().list(Kind::Index).unwrap().remove(0).id;
    let keys = f.s3_keys().unwrap();
    let m = manifest.to_hex();
    for want in [format!("nodes/shared/packs/{}/{pack}", &pack[..2]), format!("nodes/shared/index/{index}"), format!("nodes/shared/manifests/{}/{m}", &m[..2])] {
        assert!(keys.contains(&want), "{want} not in {keys:?}");
    }
    assert!(keys.iter().all(|k| k.starts_with("nodes/shared/")), "{keys:?}");
    assert_eq!(keys.iter().filter(|k| k.contains("/packs/")).count() as u64, repo.stats().packs);
}

#[test]
fn a_node_reads_chunks_another_node_wrote_after_it_opened_the_store() {
    let f = Fixture::new(Store::S3Cached);
    let (a, b) = (f.open(SMALL_PACKS), Repository::open_with(f.raw(), RepoOptions { pack_target: SMALL_PACKS }).unwrap());
    let chunks = sample_chunks(11, 20);
    let (ids, _) = store(&a, &chunks);
    assert!(!b.has_chunk(&ids[0]), "not loaded yet");
    assert_eq!(b.prefetch(&ids).objects, 0, "no cache on this one, nothing to fetch");
    assert!(b.has_chunk(&ids[0]), "the prefetch loaded the new index file");
    let c = Repository::open_with(f.raw(), RepoOptions { pack_target: SMALL_PACKS }).unwrap();
    let (more, _) = store(&a, &sample_chunks(12, 5));
    for (id, chunk) in ids.iter().zip(&chunks) {
        assert_eq!(&b.read_chunk(id).unwrap(), chunk);
    }
    assert_eq!(c.read_chunk(&more[0]).unwrap(), sample_chunks(12, 5)[0], "an unknown chunk loads the index first");
    assert!(matches!(c.read_chunk(&ObjectId::of(b"nowhere")), Err(Error::UnknownChunk(_))));
}
