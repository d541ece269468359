//! Image store tests. They run as root: imports preserve owners and create
//! device nodes in source trees.

#![allow(clippy::unwrap_used)]

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use nix::sys::stat::{mknod, Mode, SFlag};
use tar::{Builder, EntryType, Header};
use tempfile::TempDir;

use super::*;

const MTIME: u64 = 1_600_000_000;

// --- helpers ---

fn store() -> (TempDir, ImageStore) {
    let tmp = TempDir::new().unwrap();
    let store = ImageStore::new(tmp.path().join("images"));
    (tmp, store)
}

fn archive(add: impl FnOnce(&mut Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = Builder::new(Vec::new());
    add(&mut b);
    b.into_inner().unwrap()
}

fn header(kind: EntryType, size: u64, uid: u64, gid: u64, mode: u32) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_uid(uid);
    h.set_gid(gid);
    h.set_mode(mode);
    h.set_mtime(MTIME);
    h
}

fn add_file(b: &mut Builder<Vec<u8>>, path: &str, data: &[u8], uid: u64, gid: u64, mode: u32) {
    let mut h = header(EntryType::Regular, data.len() as u64, uid, gid, mode);
    b.append_data(&mut h, path, data).unwrap();
}

fn add_dir(b: &mut Builder<Vec<u8>>, path: &str, uid: u64, gid: u64, mode: u32) {
    let mut h = header(EntryType::Directory, 0, uid, gid, mode);
    b.append_data(&mut h, path, std::io::empty()).unwrap();
}

fn add_link(b: &mut Builder<Vec<u8>>, kind: EntryType, path: &str, target: &str) {
    let mut h = header(kind, 0, 0, 0, 0o777);
    b.append_link(&mut h, path, target).unwrap();
}

/// An entry whose name and link name are written as raw header bytes,
/// which the builder would refuse (absolute, `..`).
fn add_raw(b: &mut Builder<Vec<u8>>, kind: EntryType, path: &[u8], link: &[u8], data: &[u8]) {
    let mut h = header(kind, data.len() as u64, 0, 0, 0o644);
    h.as_old_mut().name[..path.len()].copy_from_slice(path);
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    h.set_cksum();
    b.append(&h, data).unwrap();
}

fn write_tmp(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, bytes).unwrap();
    path
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// Nothing named `name` and no temporary directory is left in the store.
fn assert_nothing_visible(store: &ImageStore, name: &str) {
    assert!(matches!(store.get(name), Err(Error::UnknownImage(_))), "{name} visible");
    assert!(store.list().unwrap().iter().all(|i| i.name != name));
    assert!(!store.root().join(name).exists(), "{name} directory left behind");
    if let Ok(entries) = fs::read_dir(store.root()) {
        for e in entries {
            let n = e.unwrap().file_name();
            assert!(!n.to_string_lossy().starts_with(".tmp-"), "temporary {n:?} left behind");
        }
    }
}

/// Importing `bad` is refused with a reason containing `reason`, and leaves
/// nothing behind.
fn assert_refused(store: &ImageStore, tmp: &Path, bad: &[u8], reason: &str) {
    let src = write_tmp(tmp, "bad.tar", bad);
    match store.import("bad", &src) {
        Err(Error::UnsafeEntry { entry, reason: r }) => {
            assert!(r.contains(reason), "refused {entry:?} for {r:?}, expected {reason:?}")
        }
        other => panic!("expected UnsafeEntry ({reason}), got {other:?}"),
    }
    assert_nothing_visible(store, "bad");
}

fn rootfs(image: &Image, rel: &str) -> PathBuf {
    image.rootfs.join(rel)
}

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

// --- archives ---

#[test]
fn normal_archive_imports_with_owners_and_modes() {
    let (tmp, store) = store();
    let long = format!("deep/{}/file.txt", "d".repeat(120));
    let pax_long = format!("pax/{}/file.txt", "p".repeat(150));
    let bytes = archive(|b| {
        add_dir(b, "./", 0, 0, 0o755);
        add_dir(b, "home/alice", 1000, 1001, 0o750);
        add_file(b, "./home/alice/notes.txt", b"hello", 1000, 1001, 0o640);
        add_file(b, "bin/tool", b"#!/bin/sh\n", 0, 0, 0o755);
        add_link(b, EntryType::Symlink, "bin/sh", "/bin/busybox");
        add_link(b, EntryType::Link, "bin/tool2", "bin/tool");
        add_file(b, &long, b"gnu long name", 5, 6, 0o600);
        b.append_pax_extensions([("path", pax_long.as_bytes())]).unwrap();
        add_raw(b, EntryType::Regular, b"placeholder", b"", b"pax long name");
    });
    let image = store.import("basic", &write_tmp(tmp.path(), "basic.tar", &bytes)).unwrap();
    assert_eq!(image.kind, ImageKind::Rootfs);
    assert_eq!(image.rootfs, store.root().join("basic/rootfs"));
    assert_eq!(image.dropped, Dropped::default());

    let notes = fs::metadata(rootfs(&image, "home/alice/notes.txt")).unwrap();
    assert_eq!((notes.uid(), notes.gid(), notes.mode() & 0o7777), (1000, 1001, 0o640));
    assert_eq!(notes.modified().unwrap(), UNIX_EPOCH + Duration::from_secs(MTIME));
    assert_eq!(fs::read(rootfs(&image, "home/alice/notes.txt")).unwrap(), b"hello");
    let home = fs::metadata(rootfs(&image, "home/alice")).unwrap();
    assert_eq!((home.uid(), home.gid(), home.mode() & 0o7777), (1000, 1001, 0o750));
    assert_eq!(home.modified().unwrap(), UNIX_EPOCH + Duration::from_secs(MTIME), "dir mtime set last");
    assert_eq!(mode_of(&rootfs(&image, "bin/tool")), 0o755);
    assert_eq!(fs::read_link(rootfs(&image, "bin/sh")).unwrap(), Path::new("/bin/busybox"));
    let (tool, tool2) =
        (fs::metadata(rootfs(&image, "bin/tool")).unwrap(), fs::metadata(rootfs(&image, "bin/tool2")).unwrap());
    assert_eq!(tool.ino(), tool2.ino(), "hard link shares the inode");
    assert_eq!(fs::read(rootfs(&image, &long)).unwrap(), b"gnu long name");
    assert_eq!(fs::metadata(rootfs(&image, &long)).unwrap().uid(), 5);
    assert_eq!(fs::read(rootfs(&image, &pax_long)).unwrap(), b"pax long name");

    assert_eq!(store.get("basic").unwrap(), image);
    assert_eq!(store.list().unwrap(), vec![image.clone()]);
    assert!(store.root().join("basic/image.json").is_file());
    let expected = 5 + 10 + 13 + 13; // tool2 shares tool's bytes
    assert_eq!(image.size_bytes, expected);
}

#[test]
fn gzip_and_zstd_archives_are_recognised_by_content() {
    let (tmp, store) = store();
    let bytes = archive(|b| add_file(b, "etc/os-release", b"ID=test\n", 0, 0, 0o644));
    let gz = write_tmp(tmp.path(), "layer.tar.gz", &gzip(&bytes));
    let tgz_named_tar = write_tmp(tmp.path(), "misnamed.tar", &gzip(&bytes));
    let zst = write_tmp(tmp.path(), "layer.tar.zst", &zstd::stream::encode_all(&bytes[..], 3).unwrap());
    let zst_no_ext = write_tmp(tmp.path(), "layer", &zstd::stream::encode_all(&bytes[..], 3).unwrap());
    for (name, src) in [("gz", &gz), ("misnamed", &tgz_named_tar), ("zst", &zst), ("zst-bare", &zst_no_ext)] {
        let image = store.import(name, src).unwrap();
        assert_eq!(fs::read(rootfs(&image, "etc/os-release")).unwrap(), b"ID=test\n", "{name}");
    }
}

#[test]
fn corrupt_or_unknown_sources_leave_nothing() {
    let (tmp, store) = store();
    let bytes = gzip(&archive(|b| add_file(b, "a", &[7u8; 100_000], 0, 0, 0o644)));
    let truncated = write_tmp(tmp.path(), "t.tar.gz", &bytes[..bytes.len() / 2]);
    assert!(matches!(store.import("trunc", &truncated), Err(Error::ImageSource(..))));
    assert_nothing_visible(&store, "trunc");
    let text = write_tmp(tmp.path(), "notes.tar", b"not an archive at all");
    assert!(matches!(store.import("text", &text), Err(Error::ImageSource(..))));
    assert!(matches!(store.import("missing", &tmp.path().join("nope")), Err(Error::ImageSource(..))));
    assert_nothing_visible(&store, "text");
}

#[test]
fn refuses_absolute_path() {
    let (tmp, store) = store();
    let outside = TempDir::new().unwrap();
    let target = outside.path().join("abs.txt");
    let build = |bad: bool| {
        archive(|b| {
            add_file(b, "ok.txt", b"ok", 0, 0, 0o644);
            if bad {
                add_raw(b, EntryType::Regular, target.to_str().unwrap().as_bytes(), b"", b"pwned");
            }
        })
    };
    assert_refused(&store, tmp.path(), &build(true), "absolute");
    assert!(!target.exists());
    store.import("good", &write_tmp(tmp.path(), "good.tar", &build(false))).unwrap();
}

#[test]
fn refuses_dotdot_escape() {
    let (tmp, store) = store();
    let build = |bad: bool| {
        archive(|b| {
            add_file(b, "ok.txt", b"ok", 0, 0, 0o644);
            if bad {
                add_raw(b, EntryType::Regular, b"../../../escaped.txt", b"", b"pwned");
                add_raw(b, EntryType::Regular, b"a/../../escaped.txt", b"", b"pwned");
            }
        })
    };
    assert_refused(&store, tmp.path(), &build(true), "'..'");
    // Where the entry would have landed from the staging rootfs upwards.
    for dir in [store.root().to_owned(), tmp.path().to_owned(), tmp.path().parent().unwrap().to_owned()] {
        assert!(!dir.join("escaped.txt").exists(), "written into {}", dir.display());
    }
    store.import("good", &write_tmp(tmp.path(), "good.tar", &build(false))).unwrap();
}

#[test]
fn refuses_writing_through_a_symlink() {
    let (tmp, store) = store();
    let outside = TempDir::new().unwrap();
    let abs = outside.path().to_str().unwrap().to_owned();
    let rel = format!("../../../../../../../..{abs}");
    for (link, target) in [("escape", abs.as_str()), ("up", rel.as_str())] {
        let build = |bad: bool| {
            archive(|b| {
                add_link(b, EntryType::Symlink, link, target);
                if bad {
                    add_file(b, &format!("{link}/pwned"), b"pwned", 0, 0, 0o644);
                }
                add_file(b, "ok.txt", b"ok", 0, 0, 0o644);
            })
        };
        assert_refused(&store, tmp.path(), &build(true), "symlink");
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0, "wrote outside through {link}");
        // Positive control: the link itself is fine, and kept as a link.
        let good = store.import(link, &write_tmp(tmp.path(), "good.tar", &build(false))).unwrap();
        assert_eq!(fs::read_link(rootfs(&good, link)).unwrap(), Path::new(target));
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    }
}

#[test]
fn a_later_entry_replaces_a_symlink_without_following_it() {
    let (tmp, store) = store();
    let outside = TempDir::new().unwrap();
    let victim = outside.path().join("victim");
    fs::write(&victim, "original").unwrap();
    let bytes = archive(|b| {
        add_link(b, EntryType::Symlink, "f", victim.to_str().unwrap());
        add_file(b, "f", b"replaced", 0, 0, 0o644);
        add_link(b, EntryType::Symlink, "d", outside.path().to_str().unwrap());
        add_dir(b, "d", 0, 0, 0o755);
    });
    let image = store.import("replace", &write_tmp(tmp.path(), "r.tar", &bytes)).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "original");
    assert_eq!(fs::read(rootfs(&image, "f")).unwrap(), b"replaced");
    assert!(fs::symlink_metadata(rootfs(&image, "d")).unwrap().is_dir());
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 1);
}

#[test]
fn refuses_hard_link_to_an_absolute_path() {
    let (tmp, store) = store();
    let passwd = fs::metadata("/etc/passwd").unwrap();
    let build = |bad: bool| {
        archive(|b| {
            add_file(b, "ok.txt", b"ok", 0, 0, 0o644);
            if bad {
                add_raw(b, EntryType::Link, b"evil", b"/etc/passwd", b"");
            }
        })
    };
    assert_refused(&store, tmp.path(), &build(true), "hard link target is an absolute path");
    let after = fs::metadata("/etc/passwd").unwrap();
    assert_eq!((after.nlink(), after.mtime(), after.len()), (passwd.nlink(), passwd.mtime(), passwd.len()));
    store.import("good", &write_tmp(tmp.path(), "good.tar", &build(false))).unwrap();
}

#[test]
fn refuses_hard_link_with_dotdot() {
    let (tmp, store) = store();
    fs::create_dir_all(store.root()).unwrap();
    let x = store.root().join("x");
    fs::write(&x, "outside").unwrap();
    let build = |bad: bool| {
        archive(|b| {
            add_file(b, "ok.txt", b"ok", 0, 0, 0o644);
            if bad {
                add_raw(b, EntryType::Link, b"evil", b"../x", b"");
                add_raw(b, EntryType::Link, b"evil2", b"../../x", b"");
            }
        })
    };
    assert_refused(&store, tmp.path(), &build(true), "hard link target has a '..' component");
    assert_eq!(fs::metadata(&x).unwrap().nlink(), 1);
    store.import("good", &write_tmp(tmp.path(), "good.tar", &build(false))).unwrap();
}

#[test]
fn refuses_other_malformed_entries() {
    let (tmp, store) = store();
    let outside = TempDir::new().unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("does not exist", archive(|b| add_raw(b, EntryType::Link, b"l", b"not/yet", b""))),
        (
            "hard link target goes through a symlink",
            archive(|b| {
                add_link(b, EntryType::Symlink, "s", outside.path().to_str().unwrap());
                add_raw(b, EntryType::Link, b"l", b"s/x", b"");
            }),
        ),
        (
            "NUL",
            archive(|b| {
                b.append_pax_extensions([("path", &b"evil\0name"[..])]).unwrap();
                add_raw(b, EntryType::Regular, b"placeholder", b"", b"x");
            }),
        ),
        ("unknown entry type", archive(|b| add_raw(b, EntryType::new(b'Z'), b"z", b"", b""))),
        (
            "not a directory",
            archive(|b| {
                add_file(b, "f", b"x", 0, 0, 0o644);
                add_file(b, "f/g", b"y", 0, 0, 0o644);
            }),
        ),
    ];
    for (reason, bytes) in cases {
        assert_refused(&store, tmp.path(), &bytes, reason);
    }
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[test]
fn devices_and_fifos_are_dropped_and_counted_and_setid_bits_kept() {
    let (tmp, store) = store();
    let bytes = archive(|b| {
        for (kind, path) in [(EntryType::Char, "dev/null"), (EntryType::Block, "dev/sda")] {
            let mut h = header(kind, 0, 0, 0, 0o666);
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
            b.append_data(&mut h, path, std::io::empty()).unwrap();
        }
        let mut h = header(EntryType::Fifo, 0, 0, 0, 0o644);
        b.append_data(&mut h, "run/fifo", std::io::empty()).unwrap();
        add_file(b, "bin/su", b"x", 0, 0, 0o4755);
        add_dir(b, "shared", 0, 50, 0o2775);
        add_file(b, "bin/plain", b"x", 0, 0, 0o1755);
    });
    let image = store.import("special", &write_tmp(tmp.path(), "s.tar", &bytes)).unwrap();
    assert_eq!(image.dropped, Dropped { devices: 2, fifos_sockets: 1, setid: 0 });
    for gone in ["dev/null", "dev/sda", "run/fifo"] {
        assert!(fs::symlink_metadata(rootfs(&image, gone)).is_err(), "{gone} exists");
    }
    // Set-id bits are kept exactly (the store lives on a nosuid mount).
    assert_eq!(mode_of(&rootfs(&image, "bin/su")), 0o4755);
    assert_eq!(mode_of(&rootfs(&image, "shared")), 0o2775);
    let shared = fs::metadata(rootfs(&image, "shared")).unwrap();
    assert_eq!((shared.uid(), shared.gid()), (0, 50));
    assert_eq!(mode_of(&rootfs(&image, "bin/plain")), 0o1755, "sticky bit is harmless and kept");
    assert_eq!(store.get("special").unwrap().dropped, image.dropped, "recorded in image.json");
}

// --- directories ---

#[test]
fn directory_import_copies_without_following_links() {
    let (tmp, store) = store();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o755)).unwrap();
    let file = src.join("a.txt");
    fs::write(&file, "data").unwrap();
    std::os::unix::fs::chown(&file, Some(1234), Some(4321)).unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o640)).unwrap();
    File::options().write(true).open(&file).unwrap().set_modified(UNIX_EPOCH + Duration::from_secs(MTIME)).unwrap();
    fs::write(src.join("su"), "x").unwrap();
    fs::set_permissions(src.join("su"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::hard_link(&file, src.join("a-link")).unwrap();
    symlink("/etc", src.join("etc-link")).unwrap();
    fs::create_dir(src.join("sub")).unwrap();
    fs::write(src.join("sub/inner"), "inner").unwrap();
    std::os::unix::fs::chown(src.join("sub"), Some(7), Some(8)).unwrap();
    fs::set_permissions(src.join("sub"), fs::Permissions::from_mode(0o700)).unwrap();
    nix::unistd::mkfifo(&src.join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
    mknod(&src.join("null"), SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), nix::sys::stat::makedev(1, 3)).unwrap();
    let _listener = UnixListener::bind(src.join("sock")).unwrap();

    let image = store.import("tree", &src).unwrap();
    assert_eq!(image.dropped, Dropped { devices: 1, fifos_sockets: 2, setid: 0 });
    let a = fs::metadata(rootfs(&image, "a.txt")).unwrap();
    assert_eq!((a.uid(), a.gid(), a.mode() & 0o7777), (1234, 4321, 0o640));
    assert_eq!(a.modified().unwrap(), UNIX_EPOCH + Duration::from_secs(MTIME));
    assert_eq!(fs::read(rootfs(&image, "a-link")).unwrap(), b"data");
    assert_eq!(mode_of(&rootfs(&image, "su")), 0o4755, "set-id bits kept");
    assert_eq!(fs::read_link(rootfs(&image, "etc-link")).unwrap(), Path::new("/etc"));
    let sub = fs::metadata(rootfs(&image, "sub")).unwrap();
    assert_eq!((sub.uid(), sub.gid(), sub.mode() & 0o7777), (7, 8, 0o700));
    assert_eq!(fs::read(rootfs(&image, "sub/inner")).unwrap(), b"inner");
    assert_eq!(mode_of(&image.rootfs), 0o755, "the root keeps the source's mode");
    for gone in ["fifo", "null", "sock"] {
        assert!(fs::symlink_metadata(rootfs(&image, gone)).is_err(), "{gone} copied");
    }
    assert_eq!(image.files, 6);
    assert!(image.source.ends_with("/src"));
}

#[test]
fn refuses_a_directory_that_contains_the_store() {
    let (tmp, store) = store();
    assert!(matches!(store.import("loop", tmp.path()), Err(Error::ImageSource(..))));
    assert_nothing_visible(&store, "loop");
}

// --- the store ---

#[test]
fn names_are_checked_and_duplicates_refused() {
    let (tmp, store) = store();
    let src = write_tmp(tmp.path(), "a.tar", &archive(|b| add_file(b, "v1", b"1", 0, 0, 0o644)));
    let first = store.import("dup", &src).unwrap();
    let other = write_tmp(tmp.path(), "b.tar", &archive(|b| add_file(b, "v2", b"2", 0, 0, 0o644)));
    assert!(matches!(store.import("dup", &other), Err(Error::ImageExists(n)) if n == "dup"));
    assert_eq!(store.get("dup").unwrap(), first);
    assert!(rootfs(&first, "v1").exists() && !rootfs(&first, "v2").exists());
    assert!(matches!(store.import("host", &src), Err(Error::ImageExists(_))), "host is reserved");
    for bad in ["../x", "UP", ".tmp-x", "", "a//b", "Team/x"] {
        assert!(matches!(store.import(bad, &src), Err(Error::InvalidImageName(_))), "{bad:?}");
        assert!(matches!(store.get(bad), Err(Error::InvalidImageName(_))), "{bad:?}");
    }
    assert_nothing_visible(&store, "host");
}

#[test]
fn remove_deletes_and_host_is_built_in() {
    let (tmp, store) = store();
    let src = write_tmp(tmp.path(), "a.tar", &archive(|b| add_file(b, "f", b"1", 0, 0, 0o644)));
    store.import("gone", &src).unwrap();
    store.remove("gone").unwrap();
    assert_nothing_visible(&store, "gone");
    assert!(matches!(store.remove("gone"), Err(Error::UnknownImage(_))));
    assert!(matches!(store.remove("host"), Err(Error::ImageBuiltIn(_))));
    // The name is free again.
    store.import("gone", &src).unwrap();
}

#[test]
fn stale_temporaries_are_cleaned_and_incomplete_images_ignored() {
    let tmp = TempDir::new().unwrap();
    let root = tmp.path().join("images");
    fs::create_dir_all(root.join(".tmp-stale/rootfs/deep")).unwrap();
    fs::write(root.join(".tmp-stale/rootfs/deep/f"), "x").unwrap();
    fs::create_dir_all(root.join("half/rootfs")).unwrap();
    let store = ImageStore::new(&root);
    assert!(!root.join(".tmp-stale").exists());
    assert!(matches!(store.get("half"), Err(Error::UnknownImage(_))));
    assert!(store.list().unwrap().is_empty());

    // A build in progress holds its lock and survives a cleanup.
    let staging = Staging::new(&root).unwrap();
    assert_eq!(store.cleanup().unwrap(), 0);
    assert!(staging.rootfs().exists());
    let path = staging.rootfs();
    drop(staging);
    assert!(!path.exists(), "an abandoned build is deleted");
}

// --- the host image ---

/// A fake host with a merged /usr (except sbin) and an /etc full of things
/// that must not reach a sandbox.
fn fake_host(root: &Path) {
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    symlink("usr/bin", root.join("bin")).unwrap();
    symlink("usr/lib", root.join("lib")).unwrap();
    symlink("usr/lib64", root.join("lib64")).unwrap();
    fs::create_dir(root.join("sbin")).unwrap();
    let etc = root.join("etc");
    for dir in
        ["ssh", "ssl/private", "ssl/certs", "ld.so.conf.d", "alternatives", "python3.11", "default", "apt/auth.conf.d"]
    {
        fs::create_dir_all(etc.join(dir)).unwrap();
    }
    for (name, mode) in [
        ("hosts", 0o644),
        ("group", 0o644),
        ("shadow", 0o644),
        ("gshadow", 0o644),
        ("shadow-", 0o644),
        ("machine-id", 0o444),
        ("ssh/ssh_host_ed25519_key", 0o644),
        ("ssh/ssh_host_ed25519_key.pub", 0o644),
        ("ssh/ssh_config", 0o644),
        ("ssl/private/server.pem", 0o644),
        ("ssl/certs/ca.pem", 0o644),
        ("tls.key", 0o644),
        ("app-Secrets.conf", 0o644),
        ("private.conf", 0o600),
        ("hostname", 0o644),
        // Allowlisted.
        ("nsswitch.conf", 0o644),
        ("ld.so.cache", 0o644),
        ("ld.so.conf.d/x86_64-linux-gnu.conf", 0o644),
        ("python3.11/sitecustomize.py", 0o644),
        ("default/locale", 0o644),
        // World-readable and innocently named, but not on the allowlist.
        ("app.conf", 0o644),
        ("ld.so.preload", 0o644),
        ("environment", 0o644),
        ("pip.conf", 0o644),
        ("default/grub", 0o644),
        ("apt/auth.conf.d/mirror.conf", 0o644),
    ] {
        fs::write(etc.join(name), name).unwrap();
        fs::set_permissions(etc.join(name), fs::Permissions::from_mode(mode)).unwrap();
    }
    std::os::unix::fs::chown(etc.join("group"), Some(1000), Some(1000)).unwrap();
    fs::write(etc.join("big.db"), vec![0u8; 2 << 20]).unwrap();
    symlink("/run/systemd/resolve/stub-resolv.conf", etc.join("resolv.conf")).unwrap();
    symlink("/usr/share/zoneinfo/UTC", etc.join("localtime")).unwrap();
    symlink("/usr/bin/mawk", etc.join("alternatives/awk")).unwrap();
    nix::unistd::mkfifo(&etc.join("initctl"), Mode::from_bits_truncate(0o600)).unwrap();
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        out.push(p.clone());
        if fs::symlink_metadata(&p).unwrap().is_dir() {
            walk(&p, out);
        }
    }
}

#[test]
fn host_image_from_a_fake_host_leaves_secrets_out() {
    let (tmp, store) = store();
    let host = tmp.path().join("host");
    fake_host(&host);
    let image = store.ensure_host_from(&host).unwrap();
    assert_eq!(image.kind, ImageKind::Host);
    assert_eq!(image.projections, vec![Projection { host_path: host.join("usr"), at: "/usr".into() }]);
    assert_eq!(image.dropped.fifos_sockets, 0, "the fifo is not on the allowlist");

    let etc = rootfs(&image, "etc");
    for kept in [
        "hosts",
        "group",
        "ssh/ssh_config",
        "ssl/certs/ca.pem",
        "nsswitch.conf",
        "ld.so.cache",
        "ld.so.conf.d/x86_64-linux-gnu.conf",
        "python3.11/sitecustomize.py",
        "default/locale",
    ] {
        assert!(etc.join(kept).is_file(), "{kept} missing");
        assert_eq!(fs::read_to_string(etc.join(kept)).unwrap(), kept, "{kept}");
    }
    assert_eq!(fs::read_link(etc.join("alternatives/awk")).unwrap(), Path::new("/usr/bin/mawk"));
    for left_out in ["app.conf", "ld.so.preload", "environment", "pip.conf", "default/grub", "apt"] {
        assert!(fs::symlink_metadata(etc.join(left_out)).is_err(), "{left_out} copied");
    }
    for skipped in [
        "shadow",
        "gshadow",
        "shadow-",
        "machine-id",
        "ssh/ssh_host_ed25519_key",
        "ssh/ssh_host_ed25519_key.pub",
        "ssl/private",
        "tls.key",
        "app-Secrets.conf",
        "private.conf",
        "big.db",
        "initctl",
    ] {
        assert!(fs::symlink_metadata(etc.join(skipped)).is_err(), "{skipped} copied");
    }
    assert_eq!(fs::read_link(etc.join("localtime")).unwrap(), Path::new("/usr/share/zoneinfo/UTC"));
    let resolv = fs::symlink_metadata(etc.join("resolv.conf")).unwrap();
    assert!(resolv.is_file(), "the host's resolv.conf link is replaced, not followed");
    assert!(fs::read_to_string(etc.join("resolv.conf")).unwrap().starts_with('#'));
    assert_eq!(fs::read_to_string(etc.join("hostname")).unwrap(), "cairn\n");
    assert!(fs::read_to_string(etc.join("passwd")).unwrap().starts_with("root:x:0:0:"), "fallback passwd");
    assert_eq!(fs::read_to_string(etc.join("group")).unwrap(), "group", "host group kept");

    assert_eq!(fs::read_link(rootfs(&image, "bin")).unwrap(), Path::new("usr/bin"));
    assert_eq!(fs::read_link(rootfs(&image, "lib64")).unwrap(), Path::new("usr/lib64"));
    for absent in ["sbin", "lib32", "libx32"] {
        assert!(fs::symlink_metadata(rootfs(&image, absent)).is_err(), "{absent} present");
    }
    assert_eq!(fs::read_dir(rootfs(&image, "usr")).unwrap().count(), 0, "usr is a mount point");
    for (dir, mode) in [("tmp", 0o1777), ("var/tmp", 0o1777), ("root", 0o700), ("workspace", 0o755), ("proc", 0o755)] {
        assert_eq!(mode_of(&rootfs(&image, dir)), mode, "{dir}");
    }
    let mut all = Vec::new();
    walk(&image.rootfs, &mut all);
    for p in all {
        let m = fs::symlink_metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (0, 0), "{} not owned by root", p.display());
    }
}

/// Removes a file when dropped.
struct Planted(PathBuf);

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[test]
fn a_file_an_operator_adds_to_the_hosts_etc_stays_out_of_a_new_host_image() {
    let id = format!("{:016x}", rand_u64());
    let planted: Vec<Planted> = [format!("/etc/cairn-test-secret-{id}"), format!("/etc/cairn-test-{id}.conf")]
        .into_iter()
        .map(|p| {
            fs::write(&p, format!("marker {id}\n")).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
            Planted(PathBuf::from(p))
        })
        .collect();
    let (_tmp, store) = store();
    let image = store.ensure_host().unwrap();
    let etc = rootfs(&image, "etc");
    for p in &planted {
        let name = p.0.file_name().unwrap();
        assert!(fs::symlink_metadata(etc.join(name)).is_err(), "{} is in the host image", p.0.display());
    }
    assert!(files_containing(&image.rootfs, id.as_bytes()).is_empty());
    // Positive control: allowlisted files the host has are there, as they are.
    let mut found = 0;
    for name in ["nsswitch.conf", "hosts", "ld.so.cache", "protocols", "services", "mime.types"] {
        if let Ok(host) = fs::read(Path::new("/etc").join(name)) {
            assert_eq!(fs::read(etc.join(name)).unwrap(), host, "{name}");
            found += 1;
        }
    }
    assert!(found > 0, "this host has none of the allowlisted files checked");
    drop(planted);
}

#[test]
fn host_image_on_this_host() {
    let (_tmp, store) = store();
    let image = store.ensure_host().unwrap();
    assert_eq!(image.name, "host");
    assert_eq!(image.projections, vec![Projection { host_path: "/usr".into(), at: "/usr".into() }]);
    let etc = rootfs(&image, "etc");
    assert!(etc.join("passwd").exists() && etc.join("group").exists());
    for secret in ["shadow", "shadow-", "gshadow", "gshadow-", "machine-id"] {
        assert!(fs::symlink_metadata(etc.join(secret)).is_err(), "{secret} copied");
    }
    if let Ok(ssh) = fs::read_dir(etc.join("ssh")) {
        for e in ssh {
            assert!(!e.unwrap().file_name().to_string_lossy().starts_with("ssh_host_"), "ssh host key copied");
        }
    }
    for name in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        let host = fs::symlink_metadata(Path::new("/").join(name));
        let ours = fs::symlink_metadata(rootfs(&image, name));
        match host {
            Ok(m) if m.file_type().is_symlink() => {
                assert_eq!(
                    fs::read_link(rootfs(&image, name)).unwrap(),
                    fs::read_link(Path::new("/").join(name)).unwrap()
                )
            }
            _ => assert!(ours.is_err(), "/{name} is not a host symlink but the image has it"),
        }
    }
    // Built once: later calls only read image.json.
    assert_eq!(store.ensure_host().unwrap(), image);
    assert_eq!(ImageStore::new(store.root()).ensure_host().unwrap().created_ms, image.created_ms);
    assert_eq!(store.list().unwrap(), vec![image]);
    assert!(matches!(store.remove("host"), Err(Error::ImageBuiltIn(_))));
}

/// Files under `dir` whose content contains `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut all = Vec::new();
    walk(dir, &mut all);
    all.into_iter()
        .filter(|p| {
            fs::symlink_metadata(p).is_ok_and(|m| m.is_file())
                && fs::read(p).is_ok_and(|d| d.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

#[test]
fn directory_import_never_follows_a_racing_swap_into_the_host() {
    let (tmp, store) = store();
    let (src, host) = (tmp.path().join("src"), tmp.path().join("host"));
    let marker = format!("host-marker-{:x}", rand_u64());
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/secret"), "benign").unwrap();
    fs::create_dir_all(&host).unwrap();
    fs::write(host.join("secret"), &marker).unwrap();
    symlink(&host, src.join("l")).unwrap();
    // Positive control: without the racer the directory is copied.
    let image = store.import("control", &src).unwrap();
    assert_eq!(fs::read(rootfs(&image, "d/secret")).unwrap(), b"benign");

    let (mut ok, mut copied_secret) = (0, 0);
    let racer = cairn_fsat::testing::Racer::start(cairn_fsat::open_dir(&src).unwrap(), "d", "l");
    racer.wait_started();
    let mut i = 0;
    racer.race(60, || {
        let name = format!("race{i}");
        i += 1;
        if let Ok(image) = store.import(&name, &src) {
            ok += 1;
            copied_secret += usize::from(
                fs::read(rootfs(&image, "d/secret")).is_ok_and(|d| d == b"benign")
                    || fs::read(rootfs(&image, "l/secret")).is_ok_and(|d| d == b"benign"),
            );
            assert!(files_containing(&image.rootfs, marker.as_bytes()).is_empty(), "host file imported into {name}");
        }
        copied_secret > 0
    });
    drop(racer);
    assert!(ok > 0 && copied_secret > 0, "no import succeeded while racing ({ok}, {copied_secret})");
    assert_eq!(fs::read_to_string(host.join("secret")).unwrap(), marker);
    assert_eq!(fs::read_dir(&host).unwrap().count(), 1, "nothing created in the host directory");
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    std::io::Read::read_exact(&mut File::open("/dev/urandom").unwrap(), &mut b).unwrap();
    u64::from_le_bytes(b)
}

#[test]
fn reference_names_live_in_escaped_directories() {
    assert_eq!(dir_name("alpine-3.20"), "alpine-3.20");
    assert_eq!(dir_name("test/two:v1"), "test%2Ftwo%3Av1");
    assert_eq!(dir_name("127.0.0.1:5000/a/b:Tag"), "127.0.0.1%3A5000%2Fa%2Fb%3A%54ag");
    assert_eq!(dir_name("x@sha256:ab"), "x%40sha256%3Aab");
    // Too long once escaped: cut, with a hash of the whole name.
    let long = format!("registry.example.com:5000/{}:{}", "a/".repeat(60).trim_end_matches('/'), "T".repeat(40));
    cairn_core::check_image_name(&long).unwrap();
    let dir = dir_name(&long);
    assert!(dir.len() <= 200 && dir.contains('~'), "{dir}");
    assert_ne!(dir, dir_name(&format!("{long}x")));
    let (tmp, store) = store();
    let src = write_tmp(tmp.path(), "a.tar", &archive(|b| add_file(b, "f", b"x", 0, 0, 0o644)));
    for name in ["test/two:v1", "plain", &long] {
        let image = store.import(name, &src).unwrap();
        assert_eq!(image.name, name);
        assert_eq!(store.get(name).unwrap().name, name);
    }
    assert!(tmp.path().join("images/test%2Ftwo%3Av1/image.json").is_file());
    let mut names: Vec<String> = store.list().unwrap().into_iter().map(|i| i.name).collect();
    names.sort();
    let mut want = vec!["plain".to_owned(), "test/two:v1".to_owned(), long.clone()];
    want.sort();
    assert_eq!(names, want);
    assert!(matches!(store.import("test/two:v1", &src), Err(Error::ImageExists(_))));
    store.remove("test/two:v1").unwrap();
    assert!(matches!(store.get("test/two:v1"), Err(Error::UnknownImage(_))));
    assert!(!tmp.path().join("images/test%2Ftwo%3Av1").exists());
}
