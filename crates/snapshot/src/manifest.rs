//! The manifest: one tree of entries per overlay layer, naming file contents
//! by chunk ids. Stored in the blob repository as JSON (fields in a fixed
//! order, entries sorted), so identical trees give identical ids: format 2
//! stores each layer's entries in segments (see [`crate::segments`]) and the
//! manifest object lists them; format 1, which older daemons wrote, holds
//! every entry in the one object and is still read.

use std::collections::{HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use cairn_blob::{ObjectId, Repository};
use serde::{Deserialize, Serialize};

use crate::bytes::ByteBuf;
use crate::segments::{self, Segments};
use crate::{Error, Result};

/// The manifest format this crate writes (it reads 1 too).
pub const VERSION: u32 = 2;

/// The format with every entry in the manifest object ([`encode`]).
const FLAT: u32 = 1;

/// A snapshot of every writable layer of a task's sandbox.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub version: u32,
    pub layers: Vec<LayerTree>,
}

/// One layer's upper directory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LayerTree {
    /// Its directory on the task disk (`root`, `at_usr`).
    pub name: String,
    /// Where it appears in the sandbox (`/`, `/usr`).
    #[serde(with = "crate::bytes::path")]
    pub at: PathBuf,
    /// Sorted by path (component-wise, so parents come before children); the
    /// upper directory itself is the entry with the empty path.
    pub entries: Vec<Entry>,
    /// How `entries` were cut when stored, so that storing them again
    /// encodes only what changed. Code that changes `entries` in place
    /// calls [`Segments::forget`].
    #[serde(skip)]
    pub segments: Segments,
}

impl LayerTree {
    pub fn new(name: String, at: PathBuf, entries: Vec<Entry>) -> LayerTree {
        LayerTree { name, at, entries, segments: Segments::default() }
    }
}

/// One file, directory or other node of an upper directory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the upper directory; any bytes but `/` and NUL per name.
    #[serde(with = "crate::bytes::path")]
    pub path: PathBuf,
    pub kind: EntryKind,
    /// Permission bits with setuid, setgid and sticky (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner relative to the sandbox's id range (0 = the sandbox's root).
    pub uid: u32,
    pub gid: u32,
    pub mtime: Timestamp,
    /// Every extended attribute (`trusted.overlay.*` included: opaque
    /// directories and redirects), sorted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xattrs: Vec<(ByteBuf, ByteBuf)>,
    /// Change detection only: the inode and ctime the entry had when it was
    /// read, so the next capture or restore can skip it when both are
    /// unchanged. A ctime of [`Timestamp::UNKNOWN`] means "re-read next time".
    pub ino: u64,
    pub ctime: Timestamp,
}

/// Seconds and nanoseconds since the epoch.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp {
    pub sec: i64,
    pub nsec: u32,
}

impl Timestamp {
    /// A ctime that matches no file: the entry was changing while it was read.
    pub const UNKNOWN: Timestamp = Timestamp { sec: 0, nsec: 0 };
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Dir,
    /// A regular file of `size` bytes; bytes outside `extents` are holes.
    File { size: u64, extents: Vec<Extent> },
    Symlink {
        #[serde(with = "crate::bytes::path")]
        target: PathBuf,
    },
    /// Another name of an earlier entry's inode (same layer).
    HardLink {
        #[serde(with = "crate::bytes::path")]
        to: PathBuf,
    },
    /// overlayfs's mark for a lower file deleted in the sandbox (on disk a
    /// character device 0/0).
    Whiteout,
    Fifo,
    Socket,
    CharDev { rdev: u64 },
    BlockDev { rdev: u64 },
}

impl EntryKind {
    /// The file type bits this kind has on disk.
    pub fn file_type(&self) -> u32 {
        match self {
            EntryKind::Dir => libc::S_IFDIR,
            EntryKind::File { .. } => libc::S_IFREG,
            EntryKind::Symlink { .. } => libc::S_IFLNK,
            EntryKind::HardLink { .. } => 0,
            EntryKind::Whiteout | EntryKind::CharDev { .. } => libc::S_IFCHR,
            EntryKind::Fifo => libc::S_IFIFO,
            EntryKind::Socket => libc::S_IFSOCK,
            EntryKind::BlockDev { .. } => libc::S_IFBLK,
        }
    }
}

/// One data region of a file: `len` bytes at `offset`, split into chunks. A
/// dense file has one extent, a sparse file one per data region, a file of
/// zeros only (or of 0 bytes) none.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub chunks: Vec<ObjectId>,
}

impl Manifest {
    pub fn new(layers: Vec<LayerTree>) -> Manifest {
        Manifest { version: VERSION, layers }
    }

    /// Logical bytes of all regular files (holes included, hard links once).
    pub fn total_bytes(&self) -> u64 {
        // Saturating: a manifest read back from the store may be crafted.
        self.entries()
            .filter_map(|e| if let EntryKind::File { size, .. } = e.kind { Some(size) } else { None })
            .fold(0u64, u64::saturating_add)
    }

    /// Regular files (a hard-linked inode counts once).
    pub fn file_count(&self) -> u64 {
        self.entries().filter(|e| matches!(e.kind, EntryKind::File { .. })).count() as u64
    }

    /// Whether an entry is another name of an earlier one.
    pub fn has_hard_links(&self) -> bool {
        self.entries().any(|e| matches!(e.kind, EntryKind::HardLink { .. }))
    }

    pub fn layer(&self, name: &str) -> Option<&LayerTree> {
        self.layers.iter().find(|l| l.name == name)
    }

    fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.layers.iter().flat_map(|l| l.entries.iter())
    }

    /// Checks what restore relies on: supported version, layer names that are
    /// one path component, entry paths that are plain relative paths, sorted
    /// and unique, each under a directory entry (or the upper itself), hard
    /// links to an earlier non-directory, extents in order within the file.
    pub fn validate(&self) -> Result<()> {
        if self.version != VERSION {
            return Err(Error::Version(self.version, VERSION));
        }
        let mut names = HashSet::new();
        for layer in &self.layers {
            let bad = |p: &Path, why| Error::Invalid(layer.name.clone(), p.to_owned(), why);
            if !is_relative_clean(layer.name.as_bytes()) || layer.name.contains('/') {
                return Err(bad(Path::new(""), "layer name is not a single file name"));
            }
            if !names.insert(layer.name.as_str()) {
                return Err(bad(Path::new(""), "layer appears twice"));
            }
            if !layer.at.is_absolute() {
                return Err(bad(&layer.at, "layer mount point is not absolute"));
            }
            let mut kinds: HashMap<&Path, &EntryKind> = HashMap::with_capacity(layer.entries.len());
            let mut prev: Option<&Path> = None;
            for e in &layer.entries {
                let p = e.path.as_path();
                if p.as_os_str().is_empty() {
                    if prev.is_some() || e.kind != EntryKind::Dir {
                        return Err(bad(p, "the upper directory must be the first entry and a directory"));
                    }
                } else {
                    if !is_relative_clean(p.as_os_str().as_bytes()) {
                        return Err(bad(p, "path is not a plain relative path"));
                    }
                    let parent = p.parent().unwrap_or(Path::new(""));
                    if !parent.as_os_str().is_empty() && kinds.get(parent) != Some(&&EntryKind::Dir) {
                        return Err(bad(p, "parent is not a directory entry"));
                    }
                }
                if prev.is_some_and(|q| q >= p) {
                    return Err(bad(p, "entries are not sorted or not unique"));
                }
                match &e.kind {
                    EntryKind::HardLink { to } => match kinds.get(to.as_path()) {
                        Some(EntryKind::Dir | EntryKind::HardLink { .. } | EntryKind::Whiteout) | None => {
                            return Err(bad(p, "hard link to a missing, later or unlinkable entry"))
                        }
                        Some(_) => {}
                    },
                    EntryKind::File { size, extents } => {
                        let mut end = 0;
                        for x in extents {
                            let x_end = x.offset.checked_add(x.len);
                            if x.offset < end || x_end.is_none_or(|v| v > *size) || x.len == 0 || x.chunks.is_empty() {
                                return Err(bad(p, "extents overlap, are empty or exceed the size"));
                            }
                            end = x_end.unwrap_or(u64::MAX);
                        }
                    }
                    _ => {}
                }
                kinds.insert(p, &e.kind);
                prev = Some(p);
            }
        }
        Ok(())
    }
}

/// A manifest's entries by layer and path.
#[derive(Debug)]
pub(crate) struct Index<'m> {
    layers: HashMap<&'m str, HashMap<&'m Path, &'m Entry>>,
}

impl<'m> Index<'m> {
    pub fn new(m: &'m Manifest) -> Index<'m> {
        let layers = m
            .layers
            .iter()
            .map(|l| (l.name.as_str(), l.entries.iter().map(|e| (e.path.as_path(), e)).collect()))
            .collect();
        Index { layers }
    }

    pub fn layer(&self, name: &str) -> Option<&HashMap<&'m Path, &'m Entry>> {
        self.layers.get(name)
    }
}

/// `a/b/c`: no leading or trailing `/`, no empty, `.` or `..` names, no NUL.
fn is_relative_clean(p: &[u8]) -> bool {
    !p.is_empty() && !p.contains(&0) && p.split(|&b| b == b'/').all(|c| !c.is_empty() && c != b"." && c != b"..")
}

/// Reads and decodes a stored manifest (its segments too).
pub fn load(repo: &Repository, id: &ObjectId) -> Result<Manifest> {
    let data = repo.get_manifest(id)?;
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let v: Version = serde_json::from_slice(&data).map_err(|e| Error::Decode(*id, e.to_string()))?;
    match v.version {
        FLAT => decode(id, &data),
        VERSION => load_segments(repo, id, decode_root(id, &data)?),
        n => Err(Error::Version(n, VERSION)),
    }
}

/// The manifest object of format 2: each layer's segments.
#[derive(Serialize, Deserialize, Debug)]
pub struct Root {
    pub version: u32,
    pub layers: Vec<RootLayer>,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct RootLayer {
    pub name: String,
    #[serde(with = "crate::bytes::path")]
    pub at: PathBuf,
    /// Entry count and chunk id of each segment, in order.
    pub segments: Vec<(u64, ObjectId)>,
}

/// Decodes the object of a format-2 manifest; public (hidden) only for
/// the fuzz targets.
#[doc(hidden)]
pub fn decode_root(id: &ObjectId, data: &[u8]) -> Result<Root> {
    let root: Root = serde_json::from_slice(data).map_err(|e| Error::Decode(*id, e.to_string()))?;
    if root.version != VERSION {
        return Err(Error::Version(root.version, VERSION));
    }
    Ok(root)
}

fn load_segments(repo: &Repository, id: &ObjectId, root: Root) -> Result<Manifest> {
    repo.prefetch(root.layers.iter().flat_map(|l| l.segments.iter().map(|(_, s)| s)));
    let mut layers = Vec::with_capacity(root.layers.len());
    for l in root.layers {
        let total = l.segments.iter().map(|(n, _)| *n).fold(0u64, u64::saturating_add);
        let mut entries = Vec::with_capacity(usize::try_from(total).unwrap_or(0).min(1 << 24));
        let mut cut = Vec::with_capacity(l.segments.len());
        for (n, seg) in l.segments {
            let data = repo.read_chunk(&seg).map_err(|e| Error::Chunk(seg, PathBuf::from(format!("manifest {id}")), e))?;
            let part = segments::decode_segment(&seg, &data)?;
            if part.len() as u64 != n || n == 0 {
                return Err(Error::Decode(*id, format!("segment {seg} holds {} entries, the manifest says {n}", part.len())));
            }
            cut.push((part.len(), seg));
            entries.extend(part);
        }
        layers.push(LayerTree { name: l.name, at: l.at, entries, segments: Segments::stored(cut) });
    }
    Ok(Manifest::new(layers))
}

/// Decodes a manifest of format 1 (every entry in one object) from the
/// bytes the repository gave back; public (hidden) only for the fuzz targets.
#[doc(hidden)]
pub fn decode(id: &ObjectId, data: &[u8]) -> Result<Manifest> {
    let mut m: Manifest = serde_json::from_slice(data).map_err(|e| Error::Decode(*id, e.to_string()))?;
    if m.version != FLAT {
        return Err(Error::Version(m.version, VERSION));
    }
    m.version = VERSION;
    Ok(m)
}

/// Stores a manifest: the segments not stored yet, then the manifest
/// object; returns its id. Every chunk it names is durable before it is
/// written.
pub fn store(repo: &std::sync::Arc<Repository>, m: &mut Manifest) -> Result<ObjectId> {
    let mut writer = repo.writer();
    let root = encode_root(m, &mut |data| Ok(writer.add_chunk(data)?.0))?;
    writer.finish()?;
    Ok(repo.put_manifest(&root)?)
}

/// Stores the segments not stored yet with `put` and encodes the manifest
/// object that lists them.
pub(crate) fn encode_root(m: &mut Manifest, put: &mut dyn FnMut(&[u8]) -> Result<ObjectId>) -> Result<Vec<u8>> {
    let mut layers = Vec::with_capacity(m.layers.len());
    for l in &mut m.layers {
        let cut = l.segments.store(&l.entries, put)?;
        layers.push(RootLayer { name: l.name.clone(), at: l.at.clone(), segments: cut.into_iter().map(|(n, id)| (n as u64, id)).collect() });
    }
    serde_json::to_vec(&Root { version: VERSION, layers }).map_err(|e| Error::Encode(e.to_string()))
}

/// The whole manifest as one JSON document, as format 1 stored it (the
/// fuzz targets' round trip, and a readable dump).
pub fn encode(m: &Manifest) -> Result<Vec<u8>> {
    #[derive(Serialize)]
    struct Flat<'a> {
        version: u32,
        layers: &'a [LayerTree],
    }
    serde_json::to_vec(&Flat { version: FLAT, layers: &m.layers }).map_err(|e| Error::Encode(e.to_string()))
}

/// Every chunk the manifest needs (what `gc` must keep, `check` must find):
/// file contents, and the segments it was stored in.
pub fn referenced_chunks(m: &Manifest) -> HashSet<ObjectId> {
    m.entries()
        .filter_map(|e| if let EntryKind::File { extents, .. } = &e.kind { Some(extents) } else { None })
        .flat_map(|xs| xs.iter().flat_map(|x| x.chunks.iter().copied()))
        .chain(m.layers.iter().flat_map(|l| l.segments.ids()))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An entry with fixed metadata (the segment tests use it too).
    pub(crate) fn entry(path: &str, kind: EntryKind) -> Entry {
        Entry {
            path: path.into(),
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: Timestamp { sec: 1, nsec: 2 },
            xattrs: vec![],
            ino: 3,
            ctime: Timestamp { sec: 4, nsec: 5 },
        }
    }

    fn file(size: u64, extents: &[(u64, u64)]) -> EntryKind {
        let extents = extents
            .iter()
            .map(|&(offset, len)| Extent { offset, len, chunks: vec![ObjectId::of(&offset.to_le_bytes())] })
            .collect();
        EntryKind::File { size, extents }
    }

    fn manifest(entries: Vec<Entry>) -> Manifest {
        Manifest::new(vec![LayerTree::new("root".into(), "/".into(), entries)])
    }

    #[test]
    fn counts_and_chunks() {
        let m = manifest(vec![
            entry("", EntryKind::Dir),
            entry("a", file(10, &[(0, 10)])),
            entry("b", file(100, &[(0, 5), (50, 5)])),
            entry("c", EntryKind::HardLink { to: "a".into() }),
        ]);
        m.validate().unwrap();
        assert_eq!(m.file_count(), 2);
        assert_eq!(m.total_bytes(), 110);
        assert_eq!(referenced_chunks(&m).len(), 2, "offset 0 appears twice");
    }

    #[test]
    fn a_crafted_manifest_saturates_its_total() {
        let m = manifest(vec![entry("a", file(u64::MAX, &[])), entry("b", file(u64::MAX, &[]))]);
        assert_eq!(m.total_bytes(), u64::MAX);
    }

    #[test]
    fn kinds_have_their_file_type_bits() {
        let kinds = [
            (EntryKind::Dir, libc::S_IFDIR),
            (file(0, &[]), libc::S_IFREG),
            (EntryKind::Symlink { target: "t".into() }, libc::S_IFLNK),
            (EntryKind::HardLink { to: "a".into() }, 0),
            (EntryKind::Whiteout, libc::S_IFCHR),
            (EntryKind::Fifo, libc::S_IFIFO),
            (EntryKind::Socket, libc::S_IFSOCK),
            (EntryKind::CharDev { rdev: 0x0103 }, libc::S_IFCHR),
            (EntryKind::BlockDev { rdev: 0x0801 }, libc::S_IFBLK),
        ];
        for (kind, bits) in kinds {
            assert_eq!(kind.file_type(), bits, "{kind:?}");
        }
    }

    #[test]
    fn layers_are_found_by_name() {
        let mut m = manifest(vec![entry("", EntryKind::Dir)]);
        m.layers.push(LayerTree::new("at_usr".into(), "/usr".into(), vec![entry("", EntryKind::Dir)]));
        assert_eq!(m.layer("root").map(|l| l.at.as_path()), Some(Path::new("/")));
        assert_eq!(m.layer("at_usr").map(|l| l.at.as_path()), Some(Path::new("/usr")));
        assert_eq!(m.layer("at_opt"), None);
    }

    #[test]
    fn json_is_stable_and_round_trips() {
        let m = manifest(vec![entry("", EntryKind::Dir), entry("f", file(3, &[(0, 3)]))]);
        let a = encode(&m).unwrap();
        assert_eq!(a, encode(&m.clone()).unwrap());
        assert_eq!(serde_json::from_slice::<Manifest>(&a).unwrap().layers, m.layers);
        let text = String::from_utf8(a).unwrap();
        assert!(text.starts_with(r#"{"version":1,"layers":[{"name":"root","at":"/","entries":[{"path":"","kind":"dir""#), "{text}");
        assert_eq!(decode(&ObjectId::of(b""), text.as_bytes()).unwrap(), m, "format 1 decodes into the current model");
    }

    /// The reason `validate` gives for `entries`, if it refuses them.
    fn refusal(entries: Vec<Entry>) -> Option<(PathBuf, &'static str)> {
        match manifest(entries).validate() {
            Ok(()) => None,
            Err(Error::Invalid(layer, path, why)) if layer == "root" => Some((path, why)),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn the_upper_directory_is_first_and_a_directory() {
        let upper = "the upper directory must be the first entry and a directory";
        assert_eq!(refusal(vec![entry("", EntryKind::Fifo)]), Some(("".into(), upper)));
        assert_eq!(refusal(vec![entry("", file(0, &[]))]), Some(("".into(), upper)));
        assert_eq!(refusal(vec![entry("a", EntryKind::Fifo), entry("", EntryKind::Dir)]), Some(("".into(), upper)));
        assert_eq!(refusal(vec![entry("", EntryKind::Dir), entry("a", EntryKind::Fifo)]), None);
    }

    #[test]
    fn paths_and_layer_names_are_plain() {
        let plain = "path is not a plain relative path";
        for p in ["..", ".", "a/", "a//b", "a\0b", "\0"] {
            assert_eq!(refusal(vec![entry("", EntryKind::Dir), entry(p, EntryKind::Fifo)]), Some((p.into(), plain)), "{p:?}");
        }
        let mut m = manifest(vec![entry("", EntryKind::Dir), entry("a", EntryKind::Dir), entry("a/b.c", EntryKind::Fifo)]);
        m.validate().unwrap();
        for name in ["", ".", "..", "ro\0ot", "a/b"] {
            m.layers[0].name = name.into();
            match m.validate() {
                Err(Error::Invalid(layer, path, why)) => {
                    assert_eq!((layer.as_str(), path, why), (name, PathBuf::new(), "layer name is not a single file name"));
                }
                other => panic!("{name:?}: {other:?}"),
            }
        }
    }

    fn local_repo(dir: &Path) -> std::sync::Arc<Repository> {
        let backend = cairn_blob::ObjectStoreBackend::local(&dir.join("repo")).unwrap();
        Repository::open(std::sync::Arc::new(backend)).unwrap()
    }

    #[test]
    fn a_stored_manifest_loads_back_and_another_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let repo = local_repo(dir.path());
        let mut m = manifest(vec![entry("", EntryKind::Dir), entry("f", file(3, &[(0, 3)]))]);
        let id = store(&repo, &mut m).unwrap();
        let object = repo.get_manifest(&id).unwrap();
        assert_eq!(id, ObjectId::of(&object), "named by the hash of its encoding");
        let root = decode_root(&id, &object).unwrap();
        assert_eq!(root.layers[0].segments.iter().map(|(n, _)| n).sum::<u64>(), 2);
        let loaded = load(&repo, &id).unwrap();
        assert_eq!(loaded, m);
        assert!(loaded.layers[0].segments.ids().all(|s| repo.has_chunk(&s)), "segments are chunks");
        assert!(referenced_chunks(&loaded).is_superset(&loaded.layers[0].segments.ids().collect()), "gc keeps the segments");

        // Format 1 (one object) still loads.
        let flat = repo.put_manifest(&encode(&m).unwrap()).unwrap();
        assert_eq!(load(&repo, &flat).unwrap(), m);

        let newer = repo.put_manifest(br#"{"version":3,"layers":[]}"#).unwrap();
        assert!(matches!(load(&repo, &newer), Err(Error::Version(3, 2))));
        let not_json = repo.put_manifest(b"[1, 2]").unwrap();
        assert!(matches!(load(&repo, &not_json), Err(Error::Decode(id, _)) if id == not_json));
    }

    #[test]
    fn a_segment_that_does_not_match_its_count_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let repo = local_repo(dir.path());
        let mut m = manifest(vec![entry("", EntryKind::Dir), entry("f", file(3, &[(0, 3)]))]);
        let id = store(&repo, &mut m).unwrap();
        let mut root = decode_root(&id, &repo.get_manifest(&id).unwrap()).unwrap();
        root.layers[0].segments[0].0 += 1;
        let lying = repo.put_manifest(&serde_json::to_vec(&root).unwrap()).unwrap();
        match load(&repo, &lying) {
            Err(Error::Decode(at, why)) => assert!(at == lying && why.contains("the manifest says"), "{why}"),
            other => panic!("{other:?}"),
        }
        root.layers[0].segments[0].1 = ObjectId::of(b"no such segment");
        let missing = repo.put_manifest(&serde_json::to_vec(&root).unwrap()).unwrap();
        assert!(matches!(load(&repo, &missing), Err(Error::Chunk(..))));
    }

    #[test]
    fn the_index_finds_entries_by_layer_and_path() {
        let mut m = manifest(vec![entry("", EntryKind::Dir), entry("a", EntryKind::Fifo)]);
        m.layers.push(LayerTree::new("at_usr".into(), "/usr".into(), vec![entry("", EntryKind::Dir)]));
        let index = Index::new(&m);
        let root = index.layer("root").expect("the root layer");
        assert_eq!(root.len(), 2);
        assert_eq!(root.get(Path::new("a")).map(|e| &e.kind), Some(&EntryKind::Fifo));
        assert_eq!(index.layer("at_usr").map(|l| l.keys().copied().collect::<Vec<_>>()), Some(vec![Path::new("")]));
        assert!(index.layer("at_opt").is_none());
    }

    #[test]
    fn every_extent_has_bytes_and_chunks() {
        let bad = "extents overlap, are empty or exceed the size";
        let extent = |offset, len, chunks: usize| Extent { offset, len, chunks: (0..chunks).map(|i| ObjectId::of(&[i as u8])).collect() };
        let with = |extents| vec![entry("f", EntryKind::File { size: 10, extents })];
        assert_eq!(refusal(with(vec![extent(0, 10, 1)])), None);
        assert_eq!(refusal(with(vec![extent(0, 0, 1)])), Some(("f".into(), bad)), "no bytes");
        assert_eq!(refusal(with(vec![extent(0, 4, 0)])), Some(("f".into(), bad)), "no chunks");
        assert_eq!(refusal(with(vec![extent(0, 0, 0)])), Some(("f".into(), bad)));
        assert_eq!(refusal(with(vec![extent(0, 4, 1), extent(4, 6, 2)])), None, "adjacent extents");
        assert_eq!(refusal(with(vec![extent(6, 5, 1)])), Some(("f".into(), bad)), "past the size");
        assert_eq!(refusal(with(vec![extent(u64::MAX, 2, 1)])), Some(("f".into(), bad)), "an end past u64");
    }

    #[test]
    fn validate_refuses_what_restore_cannot_do_safely() {
        let bad = [
            vec![entry("../x", EntryKind::Fifo)],
            vec![entry("/x", EntryKind::Fifo)],
            vec![entry("a/./b", EntryKind::Fifo)],
            vec![entry("a/b", EntryKind::Fifo)],
            vec![entry("a", EntryKind::Fifo), entry("a/b", EntryKind::Fifo)],
            vec![entry("b", EntryKind::Fifo), entry("a", EntryKind::Fifo)],
            vec![entry("a", EntryKind::Fifo), entry("a", EntryKind::Fifo)],
            vec![entry("a", EntryKind::HardLink { to: "b".into() }), entry("b", EntryKind::Fifo)],
            vec![entry("a", EntryKind::Dir), entry("b", EntryKind::HardLink { to: "a".into() })],
            vec![entry("a", file(10, &[(5, 10)]))],
            vec![entry("a", file(10, &[(0, 5), (4, 2)]))],
            vec![entry("a", EntryKind::Fifo), entry("", EntryKind::Dir)],
        ];
        for entries in bad {
            let m = manifest(entries.clone());
            assert!(m.validate().is_err(), "{entries:#?}");
        }
        let mut m = manifest(vec![entry("a", EntryKind::Dir), entry("a/b", EntryKind::Fifo), entry("a-b", EntryKind::Fifo)]);
        m.validate().unwrap();
        m.layers[0].name = "a/b".into();
        assert!(m.validate().is_err());
        m.layers[0].name = "root".into();
        m.version = 1;
        assert!(matches!(m.validate(), Err(Error::Version(1, 2))));
    }
}
