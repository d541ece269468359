//! Random edits of a small random tree, then a restore of the snapshot taken
//! before them: the tree is back exactly. And the same edits captured with
//! change tracking give what a full walk gives.
#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use cairn_snapshot::{capture, capture_tracked, restore, ChangeWatch, Manifest, NoFreeze};
use common::*;
use proptest::prelude::*;

const DIRS: [&str; 4] = ["", "d0", "d1", "d0/d2"];
const NAMES: [&str; 3] = ["f0", "f1", "d0"];

/// A path of the small namespace the edits play in.
fn slot(i: usize) -> PathBuf {
    Path::new(DIRS[i % DIRS.len()]).join(NAMES[i / DIRS.len() % NAMES.len()])
}

#[derive(Debug, Clone)]
enum Op {
    Write(usize, u8, usize),
    Delete(usize),
    Rename(usize, usize),
    Mkdir(usize),
    Chmod(usize, u32),
    Symlink(usize, usize),
    HardLink(usize, usize),
    Xattr(usize, u8),
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0..DIRS.len() * NAMES.len();
    prop_oneof![
        3 => (s.clone(), any::<u8>(), 0..3000usize).prop_map(|(p, seed, len)| Op::Write(p, seed, len)),
        1 => s.clone().prop_map(Op::Delete),
        1 => (s.clone(), s.clone()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => s.clone().prop_map(Op::Mkdir),
        1 => (s.clone(), prop::sample::select(vec![0o600, 0o644, 0o755, 0o2755, 0o1777])).prop_map(|(p, m)| Op::Chmod(p, m)),
        1 => (s.clone(), s.clone()).prop_map(|(a, b)| Op::Symlink(a, b)),
        1 => (s.clone(), s.clone()).prop_map(|(a, b)| Op::HardLink(a, b)),
        1 => (s, any::<u8>()).prop_map(|(p, v)| Op::Xattr(p, v)),
    ]
}

/// Applies an edit the way a program in the sandbox might; edits that make
/// no sense for the current tree (a missing parent, a file as a directory)
/// simply fail and are skipped.
fn apply(u: &Path, op: &Op) {
    let p = |i: usize| u.join(slot(i));
    let _ = match op {
        Op::Write(i, seed, len) => {
            let target = p(*i);
            fs::create_dir_all(target.parent().unwrap()).and_then(|_| fs::write(&target, noise(u64::from(*seed), *len)))
        }
        Op::Delete(i) => {
            let target = p(*i);
            match fs::symlink_metadata(&target) {
                Ok(m) if m.is_dir() => fs::remove_dir_all(&target),
                Ok(_) => fs::remove_file(&target),
                Err(e) => Err(e),
            }
        }
        Op::Rename(a, b) => fs::rename(p(*a), p(*b)),
        Op::Mkdir(i) => fs::create_dir_all(p(*i)),
        Op::Chmod(i, mode) => match fs::symlink_metadata(p(*i)) {
            Ok(m) if !m.file_type().is_symlink() => {
                chmod(&p(*i), *mode);
                Ok(())
            }
            _ => Ok(()),
        },
        Op::Symlink(i, t) => symlink(slot(*t), p(*i)),
        Op::HardLink(a, b) => fs::hard_link(p(*a), p(*b)),
        Op::Xattr(i, v) => {
            if fs::symlink_metadata(p(*i)).is_ok_and(|m| !m.file_type().is_symlink()) {
                setxattr(&p(*i), "user.v", &[*v]);
            }
            Ok(())
        }
    };
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn restore_undoes_random_edits(
        init in prop::collection::vec(op(), 0..14),
        edits in prop::collection::vec(op(), 1..10),
        more in prop::collection::vec(op(), 0..6),
    ) {
        let t = tempfile::tempdir().unwrap();
        let repo = repo(t.path());
        let disk = t.path().join("d");
        let u = upper(&disk, "root", X);
        for o in &init {
            apply(&u, o);
        }
        let (_, s1, _) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();
        let at_s1 = listing(&u, X);

        for o in &edits {
            apply(&u, o);
        }
        let (refreshed, _) = restore(&repo, &s1, &disk, Some(&s1), X, &mut |_| {}).unwrap();
        assert_same(&at_s1, &listing(&u, X));

        // Again from the restored disk, with the baseline the restore gave.
        for o in &more {
            apply(&u, o);
        }
        restore(&repo, &s1, &disk, Some(&refreshed), X, &mut |_| {}).unwrap();
        assert_same(&at_s1, &listing(&u, X));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Edits right after a capture (within the same clock tick) are all in
    /// the next, incremental capture.
    #[test]
    fn incremental_capture_misses_no_edit(
        init in prop::collection::vec(op(), 0..14),
        edits in prop::collection::vec(op(), 1..10),
    ) {
        let t = tempfile::tempdir().unwrap();
        let repo = repo(t.path());
        let disk = t.path().join("d");
        let u = upper(&disk, "root", X);
        for o in &init {
            apply(&u, o);
        }
        let (_, s1, _) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();
        for o in &edits {
            apply(&u, o);
        }
        let (_, s2, _) = capture(&repo, &disk, &root_layer(), Some(&s1), X, &NoFreeze, &mut |_| {}).unwrap();
        let other = t.path().join("other");
        fs::create_dir(&other).unwrap();
        restore(&repo, &s2, &other, None, X, &mut |_| {}).unwrap();
        assert_same(&listing(&u, X), &listing(&other.join("root/upper"), X));
    }
}

/// A tmpfs mounted for one test: change tracking needs the layer on a
/// filesystem of its own, as a task disk is. Unmounted on drop.
struct OwnMount(PathBuf);

impl OwnMount {
    fn new(at: &Path) -> OwnMount {
        fs::create_dir_all(at).unwrap();
        let ok = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"]).arg(at).status().unwrap();
        assert!(ok.success(), "mount a tmpfs (the test runs as root)");
        OwnMount(at.to_owned())
    }
}

impl Drop for OwnMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The manifest without what only says when to look again (ctimes, which
/// a reused entry keeps from when it was read).
fn comparable(m: &Manifest) -> Manifest {
    let mut m = m.clone();
    for e in m.layers.iter_mut().flat_map(|l| l.entries.iter_mut()) {
        e.ctime = Default::default();
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Two rounds of random edits, each captured with change tracking: the
    /// manifest is the one a full walk makes, and it restores to the tree.
    #[test]
    fn tracked_capture_matches_a_full_walk(
        init in prop::collection::vec(op(), 0..14),
        edits in prop::collection::vec(op(), 1..10),
        more in prop::collection::vec(op(), 1..10),
    ) {
        let t = tempfile::tempdir().unwrap();
        let repo = repo(t.path());
        let disk = t.path().join("d");
        let _mounted = OwnMount::new(&disk);
        let u = upper(&disk, "root", X);
        for o in &init {
            apply(&u, o);
        }
        let mut watch = ChangeWatch::start(&disk).unwrap();
        let (_, mut base, _) = capture_tracked(&repo, &disk, &root_layer(), None, &mut watch, X, &NoFreeze, &mut |_| {}).unwrap();
        let first = base.clone();
        for (round, ops) in [&edits, &more].into_iter().enumerate() {
            for o in ops {
                apply(&u, o);
            }
            let had_links = base.has_hard_links();
            let (_, tracked, stats) = capture_tracked(&repo, &disk, &root_layer(), Some(base), &mut watch, X, &NoFreeze, &mut |_| {}).unwrap();
            let (_, full, _) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();
            prop_assert_eq!(comparable(&tracked), comparable(&full), "round {}", round);
            if !had_links && !tracked.has_hard_links() {
                prop_assert!(stats.tracked, "round {}: without hard links both passes are tracked", round);
            }
            let other = t.path().join(format!("other{round}"));
            fs::create_dir(&other).unwrap();
            restore(&repo, &tracked, &other, None, X, &mut |_| {}).unwrap();
            assert_same(&listing(&u, X), &listing(&other.join("root/upper"), X));
            base = tracked;
        }

        // A rollback to the first capture keeps the watch: the restore's
        // own writes are seen, and the next capture is tracked from the
        // manifest the restore gives back, which stores as it is.
        let (mut restored, _) = restore(&repo, &first, &disk, Some(&base), X, &mut |_| {}).unwrap();
        let id = cairn_snapshot::store(&repo, &mut restored).unwrap();
        prop_assert_eq!(&cairn_snapshot::load(&repo, &id).unwrap(), &restored, "the segments stored are the entries");
        for o in &edits {
            apply(&u, o);
        }
        let (_, tracked, _) = capture_tracked(&repo, &disk, &root_layer(), Some(restored), &mut watch, X, &NoFreeze, &mut |_| {}).unwrap();
        let (_, full, _) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();
        prop_assert_eq!(comparable(&tracked), comparable(&full), "after the rollback");
    }
}

/// A change deep in a tree of 2,000 files is found by looking at its
/// directory only; a hard link makes the capture walk everything.
#[test]
fn tracking_reads_only_what_changed() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(t.path());
    let disk = t.path().join("d");
    let _mounted = OwnMount::new(&disk);
    let u = upper(&disk, "root", X);
    for d in 0..20 {
        fs::create_dir_all(u.join(format!("d{d}/sub"))).unwrap();
        for f in 0..100 {
            fs::write(u.join(format!("d{d}/sub/f{f}")), noise(d * 100 + f, 64)).unwrap();
        }
    }
    let mut watch = ChangeWatch::start(&disk).unwrap();
    let run = |base, watch: &mut ChangeWatch| capture_tracked(&repo, &disk, &root_layer(), base, watch, X, &NoFreeze, &mut |_| {}).unwrap();
    let (_, base, first) = run(None, &mut watch);
    assert!(!first.tracked, "the first capture walks everything");
    assert_eq!(first.files_read, 2000);

    fs::write(u.join("d7/sub/f3"), b"changed").unwrap();
    fs::create_dir(u.join("d9/new")).unwrap();
    fs::write(u.join("d9/new/g"), b"new").unwrap();
    let (_, base, second) = run(Some(base), &mut watch);
    assert!(second.tracked);
    assert_eq!(second.files_read, 2, "the changed file and the new one");
    assert_eq!(base.file_count(), 2001);

    // The positive control for the fallback: the same change beside a hard link.
    fs::hard_link(u.join("d1/sub/f1"), u.join("d2/link")).unwrap();
    fs::write(u.join("d7/sub/f4"), b"changed too").unwrap();
    let (_, with_link, third) = run(Some(base), &mut watch);
    assert!(!third.tracked, "a hard link makes the capture walk everything");
    assert!(with_link.has_hard_links());
    let (_, full, _) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();
    assert_eq!(comparable(&with_link), comparable(&full));
}

#[test]
fn a_watch_needs_a_filesystem_of_its_own() {
    let t = tempfile::tempdir().unwrap();
    let err = ChangeWatch::start(t.path()).unwrap_err();
    assert!(err.to_string().contains("is not a mount of its own"), "{err}");
    let disk = t.path().join("d");
    let mounted = OwnMount::new(&disk);
    let watch = ChangeWatch::start(&disk).unwrap();
    assert!(watch.watches(&disk));
    drop(mounted);
    let _again = OwnMount::new(&disk);
    assert!(!watch.watches(&disk), "a mount made again is another filesystem");
}

/// A watch started after the baseline was made knows nothing of the changes
/// made before it: its first capture walks everything and misses nothing.
#[test]
fn a_new_watch_does_not_vouch_for_what_came_before_it() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(t.path());
    let disk = t.path().join("d");
    let _mounted = OwnMount::new(&disk);
    let u = upper(&disk, "root", X);
    fs::create_dir_all(u.join("src")).unwrap();
    fs::write(u.join("src/a"), b"one").unwrap();
    let (_, base, _) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();
    fs::write(u.join("src/a"), b"two").unwrap();
    fs::write(u.join("src/b"), b"new").unwrap();
    // Past the ctime tick: files read now are not re-read for being racy.
    settle();

    let mut watch = ChangeWatch::start(&disk).unwrap();
    let (_, m, stats) = capture_tracked(&repo, &disk, &root_layer(), Some(base), &mut watch, X, &NoFreeze, &mut |_| {}).unwrap();
    assert!(!stats.tracked);
    assert_eq!(stats.files_read, 2, "both changes were read");
    let (_, full, _) = capture(&repo, &disk, &root_layer(), None, X, &NoFreeze, &mut |_| {}).unwrap();
    assert_eq!(comparable(&m), comparable(&full));

    // From then on it vouches: the positive control.
    fs::write(u.join("src/b"), b"newer").unwrap();
    let (_, _, stats) = capture_tracked(&repo, &disk, &root_layer(), Some(m), &mut watch, X, &NoFreeze, &mut |_| {}).unwrap();
    assert!(stats.tracked);
    assert_eq!(stats.files_read, 1);
}
