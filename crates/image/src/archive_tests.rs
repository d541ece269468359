//! Archive imports against hostile or unusual archives: sparse files in
//! every format GNU tar writes (holes stay holes), decompression and
//! sparse bombs (stopped at the limit, nothing left behind), set-id bits
//! and file capabilities (kept), and very long entry names (short errors).
//! They run as root.

#![allow(clippy::unwrap_used)]

use std::fs::{self, File};
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use tar::{Builder, EntryType, GnuExtSparseHeader, Header};
use tempfile::TempDir;

use super::limits::Budget;
use super::oci_tests::assert_left;
use super::path::RelPath;
use super::testing::{LayerBlob, OciLayout};
use super::writer::{Content, Meta, TreeWriter};
use super::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// The file capabilities `cap_dac_override,cap_fowner,cap_net_raw+ep`
/// (VFS_CAP_REVISION_2): the permitted mask's first byte is a newline.
const CAPS: [u8; 20] = [1, 0, 0, 2, 0x0a, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

fn store_with(limits: Option<ImportLimits>) -> (TempDir, ImageStore) {
    let tmp = TempDir::new().unwrap();
    let store = ImageStore::new(tmp.path().join("images"));
    let store = match limits {
        Some(l) => store.with_limits(l),
        None => store,
    };
    (tmp, store)
}

fn gnu_header(kind: EntryType, size: u64, mode: u32) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mode(mode);
    h.set_mtime(1_600_000_000);
    h
}

fn write_tmp(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, bytes).unwrap();
    path
}

/// No image `name` and no temporary directory in the store.
fn assert_gone(store: &ImageStore, name: &str) {
    assert!(matches!(store.get(name), Err(Error::UnknownImage(_))), "{name} visible");
    if let Ok(entries) = fs::read_dir(store.root()) {
        for e in entries {
            let n = e.unwrap().file_name();
            assert!(!n.to_string_lossy().starts_with(".tmp-"), "temporary {n:?} left behind");
        }
    }
}

/// The one-line message of an import that must fail, checked short.
fn short_error(e: &Error) -> String {
    let msg = e.to_string();
    assert!(
        !msg.contains('\n') && msg.chars().count() < 300,
        "not one short line ({} chars): {msg}",
        msg.chars().count()
    );
    msg
}

/// Runs GNU tar, which these tests need: it writes the sparse formats as
/// real archives have them.
fn gnu_tar(args: &[&str]) {
    let out = Command::new("tar")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("GNU tar is needed by this test and cannot run: {e}"));
    assert!(out.status.success(), "tar {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let version = Command::new("tar").arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).contains("GNU tar"), "tar is not GNU tar");
}

/// Makes a sparse file of `size` bytes holding `chunks` at their offsets.
fn sparse_source(path: &Path, size: u64, chunks: &[(u64, &[u8])]) {
    let f = File::create(path).unwrap();
    f.set_len(size).unwrap();
    for (offset, data) in chunks {
        f.write_all_at(data, *offset).unwrap();
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

/// Bytes `len` at `offset` of `path`.
fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    File::open(path).unwrap().read_exact_at(&mut buf, offset).unwrap();
    buf
}

/// Where the data of `path` is, as the filesystem says (SEEK_DATA and
/// SEEK_HOLE), as (offset, end) pairs.
fn data_regions(path: &Path) -> Vec<(u64, u64)> {
    let f = File::open(path).unwrap();
    let size = f.metadata().unwrap().len();
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < size {
        let Ok(start) = rustix::fs::seek(f.as_fd(), rustix::fs::SeekFrom::Data(at)) else { break };
        let end = rustix::fs::seek(f.as_fd(), rustix::fs::SeekFrom::Hole(start)).unwrap();
        out.push((start, end));
        at = end;
    }
    out
}

// --- sparse files ---

/// The files every sparse archive of these tests holds, and their sources.
struct SparseFixture {
    src: PathBuf,
    /// A 64 MiB file with data at 3 places, compared byte for byte.
    small: &'static str,
    /// A 10 GiB file with data at its start, middle and end.
    big: &'static str,
    /// A file of 6 data chunks ending in a hole (more chunks than an old
    /// GNU header holds).
    many: String,
}

impl SparseFixture {
    fn new(dir: &Path) -> SparseFixture {
        let src = dir.join("src");
        let long_dir = format!("deep/{}", "d".repeat(120));
        fs::create_dir_all(src.join(&long_dir)).unwrap();
        let fixture = SparseFixture { src, small: "small.bin", big: "big.img", many: format!("{long_dir}/many.db") };
        sparse_source(
            &fixture.src.join(fixture.small),
            64 * MIB,
            &[(0, &pattern(5000, 1)), (9 * MIB + 77, &pattern(70_000, 2)), (64 * MIB - 300, &pattern(300, 3))],
        );
        sparse_source(
            &fixture.src.join(fixture.big),
            10 * GIB,
            &[(0, b"head"), (5 * GIB, &pattern(8192, 4)), (10 * GIB - 4, b"tail")],
        );
        let chunks: Vec<(u64, Vec<u8>)> = (0..6).map(|i| (i * 4 * MIB, pattern(4096, 10 + i as u8))).collect();
        let chunks: Vec<(u64, &[u8])> = chunks.iter().map(|(o, d)| (*o, d.as_slice())).collect();
        sparse_source(&fixture.src.join(&fixture.many), 30 * MIB, &chunks);
        fs::write(fixture.src.join("plain.txt"), "plain\n").unwrap();
        fixture
    }

    /// Checks the imported image: names exact, sizes, content, holes.
    fn check(&self, image: &Image, format: &str) {
        let small = image.rootfs.join(self.small);
        assert_eq!(
            fs::read(&small).unwrap(),
            fs::read(self.src.join(self.small)).unwrap(),
            "{format}: small.bin differs"
        );
        let big = image.rootfs.join(self.big);
        let meta = fs::metadata(&big).unwrap_or_else(|e| {
            panic!(
                "{format}: big.img: {e} (entries: {:?})",
                fs::read_dir(&image.rootfs).unwrap().map(|e| e.unwrap().file_name()).collect::<Vec<_>>()
            )
        });
        assert_eq!(meta.len(), 10 * GIB, "{format}: real size");
        assert!(meta.blocks() * 512 < 4 * MIB, "{format}: big.img takes {} bytes on disk", meta.blocks() * 512);
        assert_eq!(read_at(&big, 0, 4), b"head");
        assert_eq!(read_at(&big, 5 * GIB, 8192), pattern(8192, 4), "{format}");
        assert_eq!(read_at(&big, 10 * GIB - 4, 4), b"tail");
        assert_eq!(read_at(&big, 3 * GIB, 4096), vec![0; 4096]);
        // The data sits where the source's does; the rest is holes.
        assert_eq!(data_regions(&big), data_regions(&self.src.join(self.big)), "{format}: holes");
        let many = image.rootfs.join(&self.many);
        assert_eq!(fs::read(&many).unwrap(), fs::read(self.src.join(&self.many)).unwrap(), "{format}: many.db differs");
        assert_eq!(data_regions(&many), data_regions(&self.src.join(&self.many)), "{format}: holes of many.db");
        assert_eq!(fs::read(image.rootfs.join("plain.txt")).unwrap(), b"plain\n");
        let mut names = Vec::new();
        collect_names(&image.rootfs, &mut names);
        assert!(names.iter().all(|n| !n.contains("GNUSparseFile")), "{format}: {names:?}");
    }
}

fn collect_names(dir: &Path, out: &mut Vec<String>) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        out.push(e.file_name().to_string_lossy().into_owned());
        if e.file_type().unwrap().is_dir() {
            collect_names(&e.path(), out);
        }
    }
}

#[test]
fn sparse_files_from_gnu_tar_keep_names_content_and_holes_in_every_format() {
    let (tmp, store) = store_with(None);
    let fixture = SparseFixture::new(tmp.path());
    let src = fixture.src.to_str().unwrap();
    let formats: [(&str, &[&str]); 4] = [
        ("gnu", &["--format=gnu"]),
        ("pax-0.0", &["--format=posix", "--sparse-version=0.0"]),
        ("pax-0.1", &["--format=posix", "--sparse-version=0.1"]),
        ("pax-1.0", &["--format=posix", "--sparse-version=1.0"]),
    ];
    for (name, args) in formats {
        let out = tmp.path().join(format!("{name}.tar"));
        let mut all = vec!["--sparse", "-cf", out.to_str().unwrap(), "-C", src];
        all.splice(1..1, args.iter().copied());
        all.extend([fixture.small, fixture.big, fixture.many.as_str(), "plain.txt"]);
        gnu_tar(&all);
        assert!(fs::metadata(&out).unwrap().len() < 2 * MIB, "{name}: the archive itself is small");
        let image = store.import(name, &out).unwrap_or_else(|e| panic!("{name}: {e}"));
        fixture.check(&image, name);
    }
}

/// A PAX 1.0 sparse entry written by hand: the real name and size in
/// records, the map at the start of the data.
fn pax_sparse_1_0(name: &str, real_size: u64, chunks: &[(u64, &[u8])]) -> Vec<u8> {
    let mut b = Builder::new(Vec::new());
    let real = real_size.to_string();
    b.append_pax_extensions([
        ("GNU.sparse.major", &b"1"[..]),
        ("GNU.sparse.minor", b"0"),
        ("GNU.sparse.name", name.as_bytes()),
        ("GNU.sparse.realsize", real.as_bytes()),
    ])
    .unwrap();
    let mut map = format!("{}\n", chunks.len());
    for (offset, data) in chunks {
        map.push_str(&format!("{offset}\n{}\n", data.len()));
    }
    let mut data = map.into_bytes();
    data.resize(data.len().div_ceil(512) * 512, 0);
    for (_, chunk) in chunks {
        data.extend_from_slice(chunk);
    }
    let mut h = Header::new_ustar();
    h.set_path("GNUSparseFile.0/placeholder").unwrap();
    h.set_entry_type(EntryType::Regular);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_600_000_000);
    h.set_cksum();
    b.append(&h, &data[..]).unwrap();
    b.into_inner().unwrap()
}

/// An old GNU sparse entry written by hand, its map in the header and as
/// many extension blocks as it needs.
fn gnu_sparse(name: &str, real_size: u64, chunks: &[(u64, &[u8])]) -> Vec<u8> {
    let data_len: u64 = chunks.iter().map(|(_, d)| d.len() as u64).sum();
    let mut h = gnu_header(EntryType::GNUSparse, data_len, 0o644);
    h.set_path(name).unwrap();
    let gnu = h.as_gnu_mut().unwrap();
    gnu.set_real_size(real_size);
    let (first, rest) = chunks.split_at(chunks.len().min(4));
    for (slot, (offset, data)) in gnu.sparse.iter_mut().zip(first) {
        slot.set_offset(*offset);
        slot.set_length(data.len() as u64);
    }
    gnu.set_is_extended(!rest.is_empty());
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    let blocks: Vec<&[(u64, &[u8])]> = rest.chunks(21).collect();
    for (i, block) in blocks.iter().enumerate() {
        let mut ext = GnuExtSparseHeader::new();
        for (slot, (offset, data)) in ext.sparse_mut().iter_mut().zip(block.iter()) {
            slot.set_offset(*offset);
            slot.set_length(data.len() as u64);
        }
        ext.set_is_extended(i + 1 < blocks.len());
        out.extend_from_slice(ext.as_bytes());
    }
    for (_, data) in chunks {
        out.extend_from_slice(data);
    }
    out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
    out
}

#[test]
fn hand_written_sparse_entries_are_decoded_exactly() {
    let (tmp, store) = store_with(None);
    let name = format!("opt/{}/sparse data.bin", "n".repeat(150));
    let pax = pax_sparse_1_0(&name, 3 * GIB, &[(4096, b"first"), (2 * GIB, b"second"), (3 * GIB - 1, b"!")]);
    let image = store.import("pax", &write_tmp(tmp.path(), "pax.tar", &pax)).unwrap();
    let file = image.rootfs.join(&name);
    assert_eq!(fs::metadata(&file).unwrap().len(), 3 * GIB);
    assert!(fs::metadata(&file).unwrap().blocks() < 256, "written sparse");
    assert_eq!(read_at(&file, 4090, 12), b"\0\0\0\0\0\0first\0");
    assert_eq!(read_at(&file, 2 * GIB, 6), b"second");
    assert_eq!(read_at(&file, 3 * GIB - 1, 1), b"!");
    assert!(!image.rootfs.join("GNUSparseFile.0").exists());
    assert_eq!(image.size_bytes, 3 * GIB, "the apparent size");

    // 30 chunks: the header's 4 and two extension blocks.
    let chunks: Vec<(u64, Vec<u8>)> = (0..30).map(|i| (i * MIB + i, pattern(100 + i as usize, i as u8))).collect();
    let refs: Vec<(u64, &[u8])> = chunks.iter().map(|(o, d)| (*o, d.as_slice())).collect();
    let image = store.import("gnu", &write_tmp(tmp.path(), "gnu.tar", &gnu_sparse("var/db", 40 * MIB, &refs))).unwrap();
    let file = image.rootfs.join("var/db");
    let mut want = vec![0u8; 40 * MIB as usize];
    for (offset, data) in &chunks {
        want[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
    }
    assert!(fs::read(&file).unwrap() == want, "content byte for byte");
    assert!(fs::metadata(&file).unwrap().blocks() * 512 < 2 * MIB, "written sparse");

    // A map that does not match the data refuses the archive.
    let mut bad = gnu_sparse("var/bad", MIB, &[(0, b"abc"), (10, b"def")]);
    let slot = &mut Header::from_byte_slice(&bad[..512]).clone();
    slot.as_gnu_mut().unwrap().sparse[1].set_offset(1);
    slot.set_cksum();
    bad[..512].copy_from_slice(slot.as_bytes());
    let e = store.import("bad", &write_tmp(tmp.path(), "bad.tar", &bad)).unwrap_err();
    assert!(short_error(&e).contains("overlap"), "{e}");
    assert_gone(&store, "bad");
}

// --- bombs ---

/// A zstd frame of raw and run-length blocks written by hand, as a
/// compressor makes of long runs of one byte: 10 GiB of zeros take about
/// 330 KB.
#[derive(Default)]
struct ZstdRle(Vec<u8>);

impl ZstdRle {
    const BLOCK: u64 = 128 << 10;

    fn new() -> Self {
        // Magic, no content size or checksum, a 128 KiB window.
        ZstdRle(vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x38])
    }

    fn block(&mut self, kind: u32, size: u64, last: bool) {
        let h = (size as u32) << 3 | kind << 1 | u32::from(last);
        self.0.extend_from_slice(&h.to_le_bytes()[..3]);
    }

    fn raw(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(Self::BLOCK as usize) {
            self.block(0, chunk.len() as u64, false);
            self.0.extend_from_slice(chunk);
        }
    }

    fn zeros(&mut self, mut n: u64, last: bool) {
        while n > 0 {
            let size = n.min(Self::BLOCK);
            n -= size;
            self.block(1, size, last && n == 0);
            self.0.push(0);
        }
    }

    /// A tar of `files` (name, size) of zeros, compressed.
    fn tar_of_zeros(files: &[(&str, u64)]) -> Vec<u8> {
        let mut z = ZstdRle::new();
        for (name, size) in files {
            // The builder writes the headers (a long name's too); the
            // zeros are run-length blocks.
            let mut b = Builder::new(Vec::new());
            let mut h = gnu_header(EntryType::Regular, *size, 0o644);
            b.append_data(&mut h, name, std::io::empty()).unwrap();
            z.raw(b.get_ref());
            z.zeros(size.div_ceil(512) * 512, false);
        }
        z.zeros(1024, true);
        z.0
    }
}

#[test]
fn a_zstd_bomb_stops_at_the_limit_with_one_line_and_leaves_nothing() {
    let limits = ImportLimits { max_expanded_size: 10 * MIB, ..ImportLimits::default() };
    let (tmp, store) = store_with(Some(limits));
    // One file of 10 GiB: refused at its header, before a byte is written.
    let bomb = ZstdRle::tar_of_zeros(&[("etc/os-release", 10), ("zeros", 10 * GIB)]);
    assert!(bomb.len() < 400_000, "{} bytes", bomb.len());
    let src = write_tmp(tmp.path(), "bomb.tar.zst", &bomb);
    let started = std::time::Instant::now();
    let e = store.import("bomb", &src).unwrap_err();
    assert!(started.elapsed().as_secs() < 10, "refused at once, not after unpacking");
    assert!(
        matches!(e, Error::ImageTooLarge { need, limit, bound: SizeBound::Expanded, .. } if need == 10 * GIB + 10 && limit == 10 * MIB),
        "{e:?}"
    );
    let msg = short_error(&e);
    assert!(
        msg.contains("\"/zeros\"")
            && msg.contains("10.0 GiB")
            && msg.contains("10.0 MiB")
            && msg.contains("[images] max_size"),
        "{msg}"
    );
    assert_gone(&store, "bomb");

    // Files each under the limit, together over it: stopped at the one
    // that crosses it, the ones before written and then removed.
    let files: Vec<(String, u64)> = (0..8).map(|i| (format!("z/{i}"), 3 * MIB)).collect();
    let refs: Vec<(&str, u64)> = files.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let src = write_tmp(tmp.path(), "many.tar.zst", &ZstdRle::tar_of_zeros(&refs));
    let e = store.import("many", &src).unwrap_err();
    match &e {
        Error::ImageTooLarge { entry, need, .. } => assert_eq!((entry.as_str(), *need), ("/z/3", 12 * MIB)),
        other => panic!("{other:?}"),
    }
    assert_gone(&store, "many");

    // Positive control: under the limit, the same stream imports.
    let src = write_tmp(tmp.path(), "fine.tar.zst", &ZstdRle::tar_of_zeros(&refs[..3]));
    let image = store.import("fine", &src).unwrap();
    assert_eq!(fs::read(image.rootfs.join("z/2")).unwrap(), vec![0u8; 3 * MIB as usize]);
}

#[test]
fn a_sparse_bomb_writes_no_blocks_and_its_apparent_size_is_bounded() {
    let (tmp, store) = store_with(None);
    // Over the default bound of apparent size, in a 3 KB archive.
    let bomb = pax_sparse_1_0("huge", 2 << 40, &[(0, b"x")]);
    let e = store.import("huge", &write_tmp(tmp.path(), "huge.tar", &bomb)).unwrap_err();
    assert!(
        matches!(e, Error::ImageTooLarge { bound: SizeBound::Logical, limit: DEFAULT_MAX_LOGICAL_SIZE, .. }),
        "{e:?}"
    );
    assert!(short_error(&e).contains("[images] max_apparent_size"), "{e}");
    assert_gone(&store, "huge");

    // The finding: a 10 GiB sparse file in a 10 KB tar. It imports, and
    // takes a few blocks.
    let ten = gnu_sparse("ten", 10 * GIB, &[(0, b"a"), (10 * GIB - 1, b"z")]);
    assert!(ten.len() < 10_000);
    let image = store.import("ten", &write_tmp(tmp.path(), "ten.tar", &ten)).unwrap();
    let meta = fs::metadata(image.rootfs.join("ten")).unwrap();
    assert_eq!(meta.len(), 10 * GIB);
    assert!(meta.blocks() < 64, "{} blocks", meta.blocks());

    // With a tighter bound, the same archive is refused, and with a tight
    // data limit, a sparse file's data counts but its holes do not.
    let tight = ImportLimits { max_expanded_size: 1000, max_logical_size: GIB };
    let (_t, small) = store_with(Some(tight));
    let e = small.import("ten", &write_tmp(tmp.path(), "ten2.tar", &ten)).unwrap_err();
    assert!(matches!(e, Error::ImageTooLarge { bound: SizeBound::Logical, need, .. } if need == 10 * GIB), "{e:?}");
    let holes = gnu_sparse("holes", GIB / 2, &[(0, &[7u8; 600]), (GIB / 4, &[8u8; 400])]);
    small.import("holes", &write_tmp(tmp.path(), "holes.tar", &holes)).unwrap();
    let data = gnu_sparse("data", GIB / 2, &[(0, &[7u8; 600]), (GIB / 4, &[8u8; 401])]);
    let e = small.import("data", &write_tmp(tmp.path(), "data.tar", &data)).unwrap_err();
    assert!(matches!(e, Error::ImageTooLarge { bound: SizeBound::Expanded, need: 1001, .. }), "{e:?}");
    assert_gone(&small, "data");
}

#[test]
fn the_writer_counts_what_it_writes_not_only_what_was_announced() {
    let tmp = TempDir::new().unwrap();
    let limits = ImportLimits { max_expanded_size: 100_000, max_logical_size: GIB };
    let mut w = TreeWriter::new(tmp.path(), Path::new("/source"), Budget::new(limits, None)).unwrap();
    let path = RelPath::parse(b"grows").unwrap();
    // Announced as empty (a source file that grew while it was copied).
    let mut data = std::io::repeat(1).take(MIB);
    let e = w.file(&path, Meta::root(0o644, 0), Content::dense(0), &mut data).unwrap_err();
    assert!(matches!(e, Error::ImageTooLarge { bound: SizeBound::Expanded, .. }), "{e:?}");
    assert!(fs::metadata(tmp.path().join("grows")).unwrap().len() <= 100_000, "stopped at the limit");
}

#[test]
fn layers_of_an_oci_import_or_a_pull_share_one_limit() {
    let limits = ImportLimits { max_expanded_size: 3 * MIB, ..ImportLimits::default() };
    let (tmp, store) = store_with(Some(limits));
    let layer = |name: &str| {
        let mut b = Builder::new(Vec::new());
        let mut h = gnu_header(EntryType::Regular, 2 * MIB, 0o644);
        b.append_data(&mut h, name, std::io::repeat(0).take(2 * MIB)).unwrap();
        LayerBlob::zstd(&b.into_inner().unwrap())
    };
    let layout = OciLayout::single(&tmp.path().join("oci"), &[layer("a"), layer("b")]);
    let e = store.import("two", &layout.dir).unwrap_err();
    assert!(matches!(&e, Error::ImageTooLarge { entry, need, .. } if entry == "/b" && *need == 4 * MIB), "{e:?}");
    short_error(&e);
    assert_left(&store, "two", 0);

    // A pull unpacks its layers through the same writer and budget.
    let chosen = oci::Layout::open(&layout.dir).unwrap().image(None).unwrap();
    let blobs: std::collections::HashMap<String, PathBuf> =
        chosen.layers.iter().map(|l| (l.blob_digest.clone(), layout.blob_path(&l.blob_digest))).collect();
    let e = store.import_pulled("pulled", "registry.example.com/two:1", chosen, &blobs).unwrap_err();
    assert!(matches!(e, Error::ImageTooLarge { need, .. } if need == 4 * MIB), "{e:?}");
    assert_left(&store, "pulled", 0);

    // Positive control: one layer fits.
    let layout = OciLayout::single(&tmp.path().join("one"), &[layer("a")]);
    store.import("one", &layout.dir).unwrap();
}

// --- set-id bits and file capabilities ---

#[test]
fn set_id_bits_and_file_capabilities_survive_import() {
    let (tmp, store) = store_with(None);
    let mut b = Builder::new(Vec::new());
    b.append_pax_extensions([("SCHILY.xattr.security.capability", &CAPS[..])]).unwrap();
    let mut h = gnu_header(EntryType::Regular, 4, 0o4755);
    b.append_data(&mut h, "usr/bin/ping", &b"ping"[..]).unwrap();
    let mut h = gnu_header(EntryType::Regular, 4, 0o4711);
    b.append_data(&mut h, "usr/bin/sudo", &b"sudo"[..]).unwrap();
    let mut h = gnu_header(EntryType::Regular, 4, 0o2755);
    h.set_gid(42);
    b.append_data(&mut h, "usr/bin/wall", &b"wall"[..]).unwrap();
    let mut h = gnu_header(EntryType::Directory, 0, 0o3775);
    b.append_data(&mut h, "srv/shared", std::io::empty()).unwrap();
    // An attribute other than capabilities is not applied.
    b.append_pax_extensions([("SCHILY.xattr.trusted.overlay.redirect", &b"/etc"[..])]).unwrap();
    let mut h = gnu_header(EntryType::Regular, 1, 0o644);
    b.append_data(&mut h, "plain", &b"x"[..]).unwrap();
    let tar = b.into_inner().unwrap();

    let check = |rootfs: &Path, what: &str| {
        let mode = |p: &str| fs::metadata(rootfs.join(p)).unwrap().mode() & 0o7777;
        assert_eq!(
            (mode("usr/bin/ping"), mode("usr/bin/sudo"), mode("usr/bin/wall"), mode("srv/shared")),
            (0o4755, 0o4711, 0o2755, 0o3775),
            "{what}"
        );
        assert_eq!(fs::metadata(rootfs.join("usr/bin/wall")).unwrap().gid(), 42, "{what}");
        let ping = File::open(rootfs.join("usr/bin/ping")).unwrap();
        assert_eq!(cairn_fsat::XattrAt::Fd(ping.as_fd()).get(b"security.capability").unwrap(), CAPS, "{what}");
        let plain = File::open(rootfs.join("plain")).unwrap();
        assert!(
            cairn_fsat::XattrAt::Fd(plain.as_fd()).list().unwrap().iter().all(|n| !n.starts_with(b"trusted.")),
            "{what}"
        );
    };
    let image = store.import("caps", &write_tmp(tmp.path(), "caps.tar", &tar)).unwrap();
    check(&image.rootfs, "archive");
    assert_eq!(image.dropped, Dropped::default());

    // A layer keeps them too.
    let layout = OciLayout::single(&tmp.path().join("oci"), &[LayerBlob::gzip(&tar)]);
    let image = store.import("layer", &layout.dir).unwrap();
    check(&image.lowers[0], "layer");

    // And a directory import, from the source's own attribute.
    let dir = tmp.path().join("tree");
    fs::create_dir_all(dir.join("bin")).unwrap();
    fs::write(dir.join("bin/ping"), "ping").unwrap();
    fs::set_permissions(dir.join("bin/ping"), fs::Permissions::from_mode(0o4755)).unwrap();
    let f = File::open(dir.join("bin/ping")).unwrap();
    cairn_fsat::XattrAt::Fd(f.as_fd()).set(b"security.capability", &CAPS).unwrap();
    let image = store.import("tree", &dir).unwrap();
    let ping = image.rootfs.join("bin/ping");
    assert_eq!(fs::metadata(&ping).unwrap().mode() & 0o7777, 0o4755);
    let f = File::open(&ping).unwrap();
    assert_eq!(cairn_fsat::XattrAt::Fd(f.as_fd()).get(b"security.capability").unwrap(), CAPS);
}

// --- long names ---

#[test]
fn errors_show_long_entry_names_cut_short() {
    let (tmp, store) = store_with(None);
    // One component of 5000 bytes: no filesystem takes it.
    let long = "a".repeat(5000);
    let mut b = Builder::new(Vec::new());
    b.append_pax_extensions([("path", long.as_bytes())]).unwrap();
    let mut h = gnu_header(EntryType::Regular, 1, 0o644);
    b.append_data(&mut h, "placeholder", &b"x"[..]).unwrap();
    let e = store.import("long", &write_tmp(tmp.path(), "long.tar", &b.into_inner().unwrap())).unwrap_err();
    let msg = short_error(&e);
    assert!(msg.contains(&format!("\"/{}…{}\" (5001 bytes)", "a".repeat(47), "a".repeat(48))), "{msg}");
    assert_gone(&store, "long");

    // An unsafe one, in a layer.
    let evil = format!("{}/../../etc/passwd", "b".repeat(5000));
    let mut b = Builder::new(Vec::new());
    b.append_pax_extensions([("path", evil.as_bytes())]).unwrap();
    let mut h = gnu_header(EntryType::Regular, 1, 0o644);
    b.append_data(&mut h, "placeholder", &b"x"[..]).unwrap();
    let layout = OciLayout::single(&tmp.path().join("oci"), &[LayerBlob::tar(&b.into_inner().unwrap())]);
    let e = store.import("evil", &layout.dir).unwrap_err();
    let msg = short_error(&e);
    assert!(msg.contains("(5017 bytes)") && msg.contains("'..'") && msg.contains("…"), "{msg}");

    // A bomb whose entry has a long name.
    let limits = ImportLimits { max_expanded_size: 10, ..ImportLimits::default() };
    let (_t, small) = store_with(Some(limits));
    let name = format!("{}/f", "c".repeat(200));
    let bomb = ZstdRle::tar_of_zeros(&[(name.as_str(), 100)]);
    let e = small.import("bomb", &write_tmp(tmp.path(), "b.tar.zst", &bomb)).unwrap_err();
    assert!(matches!(e, Error::ImageTooLarge { .. }), "{e:?}");
    assert!(short_error(&e).contains("(203 bytes)"), "{e}");
}

/// A root filesystem archived inside one directory (`tar -cf x.tar top`)
/// is refused with the reason and the fix, and leaves no image; the same
/// tree archived from inside imports (the positive control).
#[test]
fn a_root_filesystem_inside_one_top_directory_is_refused_with_the_fix() {
    let (tmp, store) = store_with(None);
    let tree = |prefix: &str| {
        let mut b = Builder::new(Vec::new());
        for dir in ["", "usr/", "usr/bin/", "etc/"] {
            let path = format!("{prefix}{dir}");
            if path.is_empty() {
                continue;
            }
            let mut h = gnu_header(EntryType::Directory, 0, 0o755);
            b.append_data(&mut h, &path, std::io::empty()).unwrap();
        }
        let mut h = gnu_header(EntryType::Regular, 3, 0o644);
        b.append_data(&mut h, format!("{prefix}etc/hostname"), &b"box"[..]).unwrap();
        b.into_inner().unwrap()
    };
    let wrapped = write_tmp(tmp.path(), "wrapped.tar", &tree("rootfs/"));
    let err = store.import("wrapped", &wrapped).unwrap_err().to_string();
    assert!(err.contains("one top-level directory, rootfs/") && err.contains("tar -C rootfs -cf FILE ."), "{err}");
    assert_gone(&store, "wrapped");
    let plain = write_tmp(tmp.path(), "plain.tar", &tree(""));
    let image = store.import("plain", &plain).unwrap();
    assert!(image.files >= 1, "{image:?}");
}
