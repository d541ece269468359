//! Real trees on the test machine's filesystem (the tests run as root), a
//! local blob repository, and a listing that compares two uppers.
#![allow(clippy::unwrap_used, dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr};
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cairn_blob::{ObjectStoreBackend, Repository};
use cairn_snapshot::{IdShift, LayerSpec};

pub const X: IdShift = IdShift { base: 1_000_000_000, len: 65536 };
pub const Y: IdShift = IdShift { base: 1_100_000_000, len: 65536 };

pub fn repo(dir: &Path) -> Arc<Repository> {
    let backend = ObjectStoreBackend::local(&dir.join("repo")).unwrap();
    Repository::open(Arc::new(backend)).unwrap()
}

pub fn root_layer() -> Vec<LayerSpec> {
    vec![LayerSpec { name: "root".into(), at: "/".into() }]
}

/// `<disk>/<name>/upper`, created with the sandbox's root as owner.
pub fn upper(disk: &Path, name: &str, ids: IdShift) -> PathBuf {
    let u = disk.join(name).join("upper");
    fs::create_dir_all(&u).unwrap();
    fs::create_dir_all(disk.join(name).join("work")).unwrap();
    chown(&u, ids.base, ids.base);
    u
}

/// Lets the kernel's coarse clock move on, so freshly written files count as
/// unchanged to the next capture (see the crate's racy-ctime rule).
pub fn settle() {
    std::thread::sleep(Duration::from_millis(30));
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

pub fn chown(p: &Path, uid: u32, gid: u32) {
    // SAFETY: NUL-terminated path.
    assert_eq!(unsafe { libc::lchown(c(p).as_ptr(), uid, gid) }, 0, "lchown {}", p.display());
}

pub fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

pub fn mknod(p: &Path, mode: u32, rdev: u64) {
    // SAFETY: NUL-terminated path.
    assert_eq!(unsafe { libc::mknod(c(p).as_ptr(), mode, rdev) }, 0, "mknod {}", p.display());
}

pub fn setxattr(p: &Path, name: &str, value: &[u8]) {
    let n = CString::new(name).unwrap();
    // SAFETY: NUL-terminated path and name; value readable for its length.
    let r = unsafe { libc::lsetxattr(c(p).as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(r, 0, "setxattr {name} on {}: {}", p.display(), std::io::Error::last_os_error());
}

/// Sets a (symlink's own) mtime.
pub fn set_mtime(p: &Path, sec: i64, nsec: i64) {
    let t = [libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }, libc::timespec { tv_sec: sec, tv_nsec: nsec }];
    // SAFETY: NUL-terminated path and a two-element array.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c(p).as_ptr(), t.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
    assert_eq!(r, 0);
}

/// Deterministic incompressible bytes.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn xattrs(p: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let cp = c(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: NUL-terminated path, buffer writable for its length.
    let n = unsafe { libc::llistxattr(cp.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0);
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = buf[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|name| {
            let cn = CString::new(name).unwrap();
            let mut v = vec![0u8; 65536];
            // SAFETY: as above.
            let m = unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
            assert!(m >= 0);
            v.truncate(m as usize);
            (name.to_vec(), v)
        })
        .collect();
    out.sort();
    out
}

/// The data regions of a file (SEEK_DATA/SEEK_HOLE).
pub fn data_regions(p: &Path) -> Vec<(u64, u64)> {
    let f = fs::File::open(p).unwrap();
    let size = f.metadata().unwrap().len() as i64;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < size {
        // SAFETY: valid fd.
        let d = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if d < 0 {
            break;
        }
        // SAFETY: valid fd.
        let h = unsafe { libc::lseek(fd, d, libc::SEEK_HOLE) };
        out.push((d as u64, (h - d) as u64));
        pos = h;
    }
    out
}

/// Everything a restore must reproduce about one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub kind: String,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: (i64, i64),
    pub size: u64,
    pub content: String,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The first path (in listing order) of a hard-linked inode.
    pub link_group: Option<PathBuf>,
}

/// A recursive listing of `root` (itself as ""), owners relative to `ids`.
pub fn listing(root: &Path, ids: IdShift) -> BTreeMap<PathBuf, Item> {
    let mut out = BTreeMap::new();
    let mut groups: HashMap<u64, PathBuf> = HashMap::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let p = root.join(&rel);
        let md = fs::symlink_metadata(&p).unwrap();
        let ft = md.file_type();
        let mut size = 0;
        let content;
        let kind;
        if ft.is_dir() {
            kind = "dir".to_string();
            content = String::new();
            for e in fs::read_dir(&p).unwrap() {
                todo.push(rel.join(e.unwrap().file_name()));
            }
        } else if ft.is_file() {
            kind = "file".into();
            size = md.len();
            let mut h = blake3::Hasher::new();
            let mut data = Vec::new();
            fs::File::open(&p).unwrap().read_to_end(&mut data).unwrap();
            h.update(&data);
            content = h.finalize().to_hex().to_string();
        } else if ft.is_symlink() {
            kind = "symlink".into();
            content = String::from_utf8_lossy(fs::read_link(&p).unwrap().as_os_str().as_bytes()).into_owned();
        } else {
            kind = format!("node {:o}", md.mode() & libc::S_IFMT);
            content = format!("rdev {}", md.rdev());
        }
        let link_group =
            (!ft.is_dir() && md.nlink() > 1).then(|| groups.entry(md.ino()).or_insert_with(|| rel.clone()).clone());
        out.insert(
            rel.clone(),
            Item {
                kind,
                mode: md.mode() & 0o7777,
                uid: ids.to_relative(md.uid()),
                gid: ids.to_relative(md.gid()),
                mtime: (md.mtime(), md.mtime_nsec()),
                size,
                content,
                xattrs: xattrs(&p),
                link_group,
            },
        );
    }
    // Groups were named in walk order; name them by their first path instead.
    let mut first: HashMap<PathBuf, PathBuf> = HashMap::new();
    for (path, item) in &out {
        if let Some(g) = &item.link_group {
            first.entry(g.clone()).or_insert_with(|| path.clone());
        }
    }
    for item in out.values_mut() {
        if let Some(g) = &item.link_group {
            item.link_group = Some(first[g].clone());
        }
    }
    out
}

/// Fails with the first difference, readably.
pub fn assert_same(a: &BTreeMap<PathBuf, Item>, b: &BTreeMap<PathBuf, Item>) {
    for (p, x) in a {
        match b.get(p) {
            None => panic!("{} missing after restore ({x:?})", p.display()),
            Some(y) => assert_eq!(x, y, "{} differs", p.display()),
        }
    }
    for p in b.keys() {
        assert!(a.contains_key(p), "{} appeared after restore", p.display());
    }
}

pub fn name(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}
