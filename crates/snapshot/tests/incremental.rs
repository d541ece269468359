//! Incremental capture and restore, diff of real captures, and the freeze.
#![allow(clippy::unwrap_used)]

mod common;

use std::cell::RefCell;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Instant;

use cairn_snapshot::{capture, diff, restore, store, Error, Freezer, NoFreeze};
use common::*;

/// Ten files in three directories, one with an attribute.
fn small_tree(u: &Path) {
    for d in ["src", "src/nested", "docs"] {
        fs::create_dir_all(u.join(d)).unwrap();
    }
    for i in 0..10 {
        let dir = ["src", "src/nested", "docs"][i % 3];
        fs::write(u.join(dir).join(format!("f{i}")), noise(i as u64, 1000 + i * 100)).unwrap();
    }
    setxattr(&u.join("docs/f2"), "user.note", b"n");
}

#[test]
fn unchanged_tree_reads_nothing_and_keeps_its_id() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(t.path());
    let disk = t.path().join("d");
    let u = upper(&disk, "root", X);
    small_tree(&u);
    settle();

    let (id1, m1, s1) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();
    assert_eq!((s1.files, s1.files_read, s1.dirs), (10, 10, 4), "{s1:?}");
    let (id2, m2, s2) = capture(&repo, &disk, &root_layer(), Some(&m1), X, &NoFreeze, &mut |_| {}).unwrap();
    assert_eq!((s2.files_read, s2.bytes_read, s2.new_chunks), (0, 0, 0), "{s2:?}");
    assert_eq!(id2, id1);
    assert_eq!(m2, m1);

    fs::write(u.join("src/nested/f1"), b"changed").unwrap();
    settle();
    let (id3, m3, s3) = capture(&repo, &disk, &root_layer(), Some(&m2), X, &NoFreeze, &mut |_| {}).unwrap();
    // The file's one chunk and the one segment of the manifest holding it.
    assert_eq!((s3.files_read, s3.bytes_read, s3.new_chunks), (1, 7, 2), "{s3:?}");
    assert_ne!(id3, id1);
    let d = diff(&m2, &m3);
    assert_eq!((d.added.len(), d.changed.as_slice(), d.deleted.len()), (0, ["/src/nested/f1".to_string()].as_slice(), 0));
}

#[test]
fn diff_of_captures_shows_whiteouts_as_deletions() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(t.path());
    let disk = t.path().join("d");
    let u = upper(&disk, "root", X);
    small_tree(&u);
    let (_, m1, _) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();

    // As overlayfs does: deleting an upper file that hides a lower one
    // leaves a whiteout; deleting a lower-only file adds one.
    fs::remove_file(u.join("docs/f2")).unwrap();
    mknod(&u.join("docs/f2"), libc::S_IFCHR, 0);
    mknod(&u.join("etc_passwd_gone"), libc::S_IFCHR, 0);
    fs::write(u.join("src/f3"), b"edited").unwrap();
    fs::write(u.join("new"), b"n").unwrap();
    fs::remove_file(u.join("src/f6")).unwrap();
    let (_, m2, _) = capture(&repo, &disk, &root_layer(), Some(&m1), X, &NoFreeze, &mut |_| {}).unwrap();
    let d = diff(&m1, &m2);
    assert_eq!(d.added, ["/new"]);
    assert_eq!(d.changed, ["/src/f3"]);
    assert_eq!(d.deleted, ["/docs/f2", "/etc_passwd_gone", "/src/f6"]);
}

#[test]
fn restore_onto_an_edited_disk_keeps_what_it_can() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(t.path());
    let disk = t.path().join("d");
    let u = upper(&disk, "root", X);
    small_tree(&u);
    symlink("src", u.join("link")).unwrap();
    settle();
    let (_, m1, _) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();
    let at_s1 = listing(&u, X);

    // Ten files in S1; touched below: f0 (rewritten), f3 (deleted), f5
    // (chmod: a new ctime, so its contents are not trusted), and f1, f4, f7
    // are under src/nested, which becomes a file.
    fs::write(u.join("src/f0"), b"rewritten").unwrap();
    fs::remove_file(u.join("src/f3")).unwrap();
    chmod(&u.join("docs/f5"), 0o600);
    fs::remove_dir_all(u.join("src/nested")).unwrap();
    fs::write(u.join("src/nested"), b"now a file").unwrap();
    fs::write(u.join("docs/extra"), b"new").unwrap();
    fs::remove_file(u.join("link")).unwrap();
    symlink("docs", u.join("link")).unwrap();
    setxattr(&u.join("docs"), "user.added", b"1");

    let (refreshed, rs) = restore(&repo, &m1, &disk, Some(&m1), X, &mut |_| {}).unwrap();
    assert_same(&at_s1, &listing(&u, X));
    // Kept: f2, f6, f8, f9 (untouched). Written: f0, f3, f5, f1, f4, f7.
    assert_eq!((rs.files_kept, rs.files_written), (4, 6), "{rs:?}");
    // Removed: f0, f5, the file src/nested, docs/extra, the old link.
    assert_eq!(rs.entries_removed, 5, "{rs:?}");

    // Restoring again onto the untouched result keeps everything, and a
    // capture of it reads nothing and equals the refreshed manifest.
    let (refreshed2, rs2) = restore(&repo, &m1, &disk, Some(&refreshed), X, &mut |_| {}).unwrap();
    assert_eq!((rs2.files_kept, rs2.files_written, rs2.entries_removed), (10, 0, 0), "{rs2:?}");
    assert_same(&at_s1, &listing(&u, X));
    let (id, m, st) = capture(&repo, &disk, &root_layer(), Some(&refreshed2), X, &NoFreeze, &mut |_| {}).unwrap();
    assert_eq!(st.files_read, 0);
    assert_eq!(m, refreshed2);
    assert_eq!(id, store(&repo, &mut refreshed2.clone()).unwrap());
}

/// Records calls; optionally fails to freeze or breaks the layer while
/// "frozen" so that the second pass fails.
#[derive(Default)]
struct Recorder {
    calls: RefCell<Vec<&'static str>>,
    fail_freeze: bool,
    break_upper: Option<std::path::PathBuf>,
}

impl Freezer for Recorder {
    fn freeze(&self) -> Result<(), String> {
        self.calls.borrow_mut().push("freeze");
        if let Some(u) = &self.break_upper {
            fs::rename(u, u.with_extension("moved")).unwrap();
            symlink("/", u).unwrap();
        }
        if self.fail_freeze {
            return Err("cgroup gone".into());
        }
        Ok(())
    }
    fn thaw(&self) -> Result<(), String> {
        self.calls.borrow_mut().push("thaw");
        Ok(())
    }
}

#[test]
fn freezes_once_and_always_thaws() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(t.path());
    let disk = t.path().join("d");
    let u = upper(&disk, "root", X);
    small_tree(&u);

    let ok = Recorder::default();
    let (_, _, stats) = capture(&repo, &disk, &root_layer(), None, X, &ok, &mut |_| {}).unwrap();
    assert_eq!(*ok.calls.borrow(), ["freeze", "thaw"]);
    assert!(stats.freeze_ms > 0.0 && stats.freeze_ms < stats.duration_ms, "{stats:?}");

    let refused = Recorder { fail_freeze: true, ..Recorder::default() };
    let err = capture(&repo, &disk, &root_layer(), None, X, &refused, &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::Freeze(ref m) if m == "cgroup gone"), "{err}");
    assert_eq!(*refused.calls.borrow(), ["freeze", "thaw"]);

    // The upper becomes a symlink while frozen: the second pass refuses it.
    let broken = Recorder { break_upper: Some(u.clone()), ..Recorder::default() };
    let err = capture(&repo, &disk, &root_layer(), None, X, &broken, &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::Read(ref p, _) if p == &u), "{err}");
    assert_eq!(*broken.calls.borrow(), ["freeze", "thaw"]);
}

/// Writes a file the moment the sandbox is frozen, as if the sandbox had
/// written it just before.
struct LastMinuteWrite(std::path::PathBuf);

impl Freezer for LastMinuteWrite {
    fn freeze(&self) -> Result<(), String> {
        fs::write(&self.0, b"last minute").map_err(|e| e.to_string())
    }
    fn thaw(&self) -> Result<(), String> {
        Ok(())
    }
}

#[test]
fn the_frozen_pass_rereads_only_what_changed_during_the_first() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(t.path());
    let disk = t.path().join("d");
    let u = upper(&disk, "root", X);
    small_tree(&u);
    settle();
    let freezer = LastMinuteWrite(u.join("docs/f5"));
    let (_, m, stats) = capture(&repo, &disk, &root_layer(), None, X, &freezer, &mut |_| {}).unwrap();
    assert_eq!(stats.files_read, 11, "ten in the first pass, one again in the second");
    let other = t.path().join("other");
    fs::create_dir(&other).unwrap();
    restore(&repo, &m, &other, None, X, &mut |_| {}).unwrap();
    assert_eq!(fs::read(other.join("root/upper/docs/f5")).unwrap(), b"last minute");
    assert_same(&listing(&u, X), &listing(&other.join("root/upper"), X));
}

/// The frozen pass over 10,000 unchanged files: the sandbox's pause.
#[test]
fn frozen_pass_over_ten_thousand_unchanged_files_is_short() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(t.path());
    let disk = t.path().join("d");
    let u = upper(&disk, "root", X);
    for d in 0..100 {
        let dir = u.join(format!("d{d:03}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..100 {
            fs::write(dir.join(format!("f{f:03}")), format!("{d}/{f}")).unwrap();
        }
    }
    settle();
    let (_, m, _) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();
    let started = Instant::now();
    let (_, _, stats) = capture(&repo, &disk, &root_layer(), Some(&m), X, &NoFreeze, &mut |_| {}).unwrap();
    eprintln!("10,100 entries unchanged: freeze {:.1} ms, capture {:.1} ms", stats.freeze_ms, started.elapsed().as_secs_f64() * 1e3);
    // What incremental means: nothing unchanged is read again. How fast
    // that is, is measured by bench/snapshots.sh, not asserted here.
    assert_eq!(stats.files_read, 0, "{stats:?}");
}
