//! Capture a tree with every kind of entry, restore it elsewhere under
//! another id range, and compare.
#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::Path;

use cairn_snapshot::{capture, load, referenced_chunks, restore, EntryKind, IdShift, LayerSpec, NoFreeze, NOBODY};
use common::*;

const MIB: u64 = 1 << 20;

/// Builds the kitchen-sink tree in `u` (owners in `ids`).
fn build(u: &Path, ids: IdShift) {
    let id = |rel: u32| ids.base + rel;
    fs::create_dir_all(u.join("a/b/c")).unwrap();
    fs::write(u.join("a/b/c/deep.txt"), b"deep").unwrap();
    fs::write(u.join("a/empty"), b"").unwrap();
    fs::write(u.join("big.bin"), noise(1, 5 * MIB as usize + 12345)).unwrap();

    // Sparse: 1 MiB data, 8 MiB hole, 1 MiB data, 2 MiB hole at the end.
    let sparse = fs::File::create(u.join("sparse.bin")).unwrap();
    sparse.set_len(12 * MIB).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, &noise(2, MIB as usize), 0).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, &noise(3, MIB as usize), 9 * MIB).unwrap();
    drop(sparse);
    // All hole.
    fs::File::create(u.join("hole_only")).unwrap().set_len(3 * MIB).unwrap();

    symlink("a/b", u.join("link")).unwrap();
    symlink("/nonexistent/target", u.join("dangling")).unwrap();
    fs::write(u.join("h1"), b"linked twice").unwrap();
    fs::hard_link(u.join("h1"), u.join("a/h2")).unwrap();
    mknod(&u.join("fifo"), libc::S_IFIFO | 0o640, 0);
    mknod(&u.join("wh"), libc::S_IFCHR, 0);

    fs::create_dir(u.join("opq")).unwrap();
    setxattr(&u.join("opq"), "trusted.overlay.opaque", b"y");
    fs::write(u.join("opq/inside"), b"i").unwrap();
    fs::create_dir(u.join("moved")).unwrap();
    setxattr(&u.join("moved"), "trusted.overlay.redirect", b"/old/place");
    fs::write(u.join("tagged"), b"t").unwrap();
    setxattr(&u.join("tagged"), "user.comment", b"hello");
    setxattr(&u.join("tagged"), "user.binary", &[0, 0xff, 1]);
    setxattr(&u.join("tagged"), "trusted.other", b"x");

    fs::create_dir(u.join("shared")).unwrap();
    chmod(&u.join("shared"), 0o2775);
    fs::create_dir(u.join("tmp")).unwrap();
    chmod(&u.join("tmp"), 0o1777);
    fs::write(u.join("suid"), b"#!/bin/sh\n").unwrap();
    let weird = u.join(name(b"caf\xe9-\xff"));
    fs::write(&weird, b"latin-1 name").unwrap();

    // Owners: most are the sandbox's root, some a user, one outside the range.
    for p in ["", "a", "a/b", "a/b/c", "a/b/c/deep.txt", "a/empty", "big.bin", "sparse.bin", "hole_only", "link", "dangling"] {
        chown(&u.join(p), id(0), id(0));
    }
    for p in ["h1", "fifo", "wh", "opq", "opq/inside", "moved", "tagged", "shared", "tmp"] {
        chown(&u.join(p), id(1000), id(100));
    }
    chown(&weird, 0, 0);
    chown(&u.join("suid"), id(1000), id(1000));
    chmod(&u.join("suid"), 0o4755);

    set_mtime(&u.join("big.bin"), 1_600_000_000, 123_456_789);
    set_mtime(&u.join("link"), 1_500_000_000, 1);
    set_mtime(&u.join("a/b/c"), 1_400_000_000, 0);
    set_mtime(&u.join("a"), 1_300_000_000, 5);
}

#[test]
fn every_kind_round_trips_under_another_id_range() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(t.path());
    let (disk_a, disk_b) = (t.path().join("a"), t.path().join("b"));
    let ua = upper(&disk_a, "root", X);
    build(&ua, X);
    let usr_a = upper(&disk_a, "at_usr", X);
    fs::write(usr_a.join("local"), b"usr layer").unwrap();
    chown(&usr_a.join("local"), X.base, X.base);

    let layers = vec![
        LayerSpec { name: "root".into(), at: "/".into() },
        LayerSpec { name: "at_usr".into(), at: "/usr".into() },
        LayerSpec { name: "at_opt".into(), at: "/opt".into() }, // no directory: skipped
    ];
    settle();
    let mut reports = 0;
    let (id, m, stats) = capture(&repo, &disk_a, &layers, None, X, &NoFreeze, &mut |_| reports += 1).unwrap();
    assert!(reports >= 3);
    assert_eq!(m.layers.len(), 2, "the missing layer is skipped");
    assert_eq!(load(&repo, &id).unwrap(), m);
    assert_eq!(stats.files, m.file_count());
    assert_eq!(stats.files_read, m.file_count(), "no baseline: every file read once");
    assert!(stats.new_chunks >= 5, "{stats:?}");

    let root = m.layer("root").unwrap();
    let find = |p: &str| root.entries.iter().find(|e| e.path == Path::new(p)).unwrap();
    assert_eq!(find("wh").kind, EntryKind::Whiteout);
    assert_eq!(find("h1").kind, EntryKind::HardLink { to: "a/h2".into() }, "the first name in path order holds the data");
    assert_eq!(find("").uid, 0);
    assert_eq!(find("h1").uid, 1000);
    assert_eq!(root.entries.iter().find(|e| e.path == name(b"caf\xe9-\xff")).unwrap().uid, NOBODY);
    match &find("sparse.bin").kind {
        EntryKind::File { size, extents } => {
            assert_eq!(*size, 12 * MIB);
            let regions: Vec<_> = extents.iter().map(|x| (x.offset, x.len)).collect();
            assert_eq!(regions, [(0, MIB), (9 * MIB, MIB)]);
        }
        k => panic!("{k:?}"),
    }
    assert_eq!(find("hole_only").kind, EntryKind::File { size: 3 * MIB, extents: vec![] });
    assert_eq!(find("a/empty").kind, EntryKind::File { size: 0, extents: vec![] });
    match &find("big.bin").kind {
        EntryKind::File { extents, .. } => assert!(extents[0].chunks.len() > 1, "several chunks"),
        k => panic!("{k:?}"),
    }
    assert!(referenced_chunks(&m).len() >= 7);

    fs::create_dir(&disk_b).unwrap();
    let (refreshed, rs) = restore(&repo, &m, &disk_b, None, Y, &mut |_| {}).unwrap();
    assert_eq!(rs.files_written, m.file_count());
    assert_eq!(rs.files_kept, 0);
    let ub = disk_b.join("root/upper");
    // (The outsider, host root in A, lists as nobody in both.)
    assert_same(&listing(&ua, X), &listing(&ub, Y));
    assert_eq!(fs::symlink_metadata(ub.join(name(b"caf\xe9-\xff"))).unwrap().uid(), Y.base + NOBODY);
    assert_same(&listing(&usr_a, X), &listing(&disk_b.join("at_usr/upper"), Y));
    assert_eq!(fs::symlink_metadata(&ub).unwrap().uid(), Y.base, "the upper itself is the sandbox root's");
    assert!(disk_b.join("root/work").is_dir());

    // Holes stayed holes.
    assert_eq!(data_regions(&ub.join("sparse.bin")), [(0, MIB), (9 * MIB, MIB)]);
    assert_eq!(data_regions(&ub.join("hole_only")), []);
    assert_eq!(fs::read(ub.join("sparse.bin")).unwrap(), fs::read(ua.join("sparse.bin")).unwrap());
    // One inode, two names.
    assert_eq!(fs::metadata(ub.join("h1")).unwrap().ino(), fs::metadata(ub.join("a/h2")).unwrap().ino());

    // The refreshed manifest describes disk B: capturing it reads nothing and
    // gives the same manifest.
    settle();
    let (_, again, st) = capture(&repo, &disk_b, &layers, Some(&refreshed), Y, &NoFreeze, &mut |_| {}).unwrap();
    assert_eq!(st.files_read, 0, "{st:?}");
    assert_eq!(again, refreshed);
    assert_eq!(cairn_snapshot::diff(&m, &again), cairn_snapshot::Diff::default());
}

#[test]
fn restore_empties_layers_the_target_lacks_and_clears_work() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(t.path());
    let disk = t.path().join("d");
    let u = upper(&disk, "root", X);
    fs::write(u.join("f"), b"x").unwrap();
    settle();
    let (_, m, _) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();

    let usr = upper(&disk, "at_usr", X);
    fs::create_dir_all(usr.join("lib/deep")).unwrap();
    fs::write(usr.join("lib/deep/x"), b"x").unwrap();
    // overlayfs's scratch directory: `work` inside the root layer's
    // work directory on the task disk.
    let overlay_scratch = disk.join("root").join("work").join("work");
    fs::create_dir_all(&overlay_scratch).unwrap();
    fs::write(overlay_scratch.join("stale"), b"s").unwrap();
    fs::create_dir_all(disk.join("lost+found")).unwrap();

    let (_, rs) = restore(&repo, &m, &disk, Some(&m), X, &mut |_| {}).unwrap();
    assert_eq!(fs::read_dir(&usr).unwrap().count(), 0);
    assert_eq!(fs::read_dir(disk.join("root/work")).unwrap().count(), 0);
    assert!(disk.join("lost+found").is_dir(), "not a layer: left alone");
    assert_eq!(rs.entries_removed, 3);
    assert_eq!((rs.files_kept, rs.files_written), (1, 0));
    assert_eq!(fs::read(u.join("f")).unwrap(), b"x");
}

#[test]
fn a_corrupt_chunk_fails_the_restore_naming_it() {
    let t = tempfile::tempdir().unwrap();
    let repo_dir = t.path().join("r");
    let repo = repo(&repo_dir);
    let disk = t.path().join("d");
    let u = upper(&disk, "root", X);
    fs::write(u.join("data"), noise(9, 300_000)).unwrap();
    let (_, m, _) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();

    // Flip a byte in the middle of the largest object: the pack.
    let mut files = Vec::new();
    let mut todo = vec![repo_dir.clone()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            } else {
                files.push((e.metadata().unwrap().len(), e.path()));
            }
        }
    }
    let (_, pack) = files.into_iter().max().unwrap();
    let mut bytes = fs::read(&pack).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    fs::write(&pack, bytes).unwrap();

    let fresh = self::repo(&repo_dir);
    let other = t.path().join("other");
    fs::create_dir(&other).unwrap();
    let err = restore(&fresh, &m, &other, None, X, &mut |_| {}).unwrap_err();
    let chunks = referenced_chunks(&m);
    let msg = err.to_string();
    assert!(chunks.iter().any(|c| msg.contains(&c.to_hex())), "{msg}");
    assert!(msg.contains("data"), "{msg}");
}
