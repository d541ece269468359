//! Each call against a tree whose owner is hostile: a symlink to a "host"
//! directory where a real one is expected, a FIFO where a file is expected,
//! and a racer that swaps a directory and a symlink while the calls run.
//! Each refusal is paired with the same call on a plain tree.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use cairn_fsat as fsat;
use fsat::testing::Racer;
use fsat::OFlags;

struct Setup {
    _dir: tempfile::TempDir,
    tree: std::path::PathBuf,
    host: std::path::PathBuf,
}

/// `tree/d/secret` (benign) and `tree/l` -> `host`, whose `secret` holds a
/// marker.
fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (tree, host) = (dir.path().join("tree"), dir.path().join("host"));
    fs::create_dir_all(tree.join("d")).unwrap();
    fs::create_dir_all(&host).unwrap();
    fs::write(tree.join("d/secret"), "benign").unwrap();
    fs::write(host.join("secret"), "HOST-MARKER").unwrap();
    fs::set_permissions(host.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    symlink(&host, tree.join("l")).unwrap();
    Setup { _dir: dir, tree, host }
}

fn host_untouched(host: &Path) {
    assert_eq!(fs::read_to_string(host.join("secret")).unwrap(), "HOST-MARKER");
    let m = fs::metadata(host.join("secret")).unwrap();
    assert_eq!((m.mode() & 0o7777, m.uid()), (0o600, 0));
    assert_eq!(fs::read_dir(host).unwrap().count(), 1, "nothing created or removed in the host directory");
}

#[test]
fn a_symlink_is_never_followed() {
    let s = setup();
    let root = fsat::open_dir(&s.tree).unwrap();
    // Positive controls.
    assert_eq!(fsat::read_regular_at(fsat::open_dir_at(&root, c"d").unwrap(), c"secret", 100).unwrap(), b"benign");
    fsat::open_beneath(&root, "d/secret", OFlags::RDONLY, 0).unwrap();
    // Through the link.
    let loop_ = |e: std::io::Error| e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error());
    assert!(loop_(fsat::open_dir_at(&root, c"l").unwrap_err()));
    assert!(loop_(fsat::open_beneath(&root, "l/secret", OFlags::RDONLY, 0).unwrap_err()));
    assert!(fsat::open_beneath(&root, "../tree/d/secret", OFlags::RDONLY, 0).is_err(), "no climbing out");
    assert!(fsat::read_regular_at(&root, c"l", 100).is_err());
    assert!(fsat::chmod_at(&root, c"l", 0o777).is_err());
    assert!(fsat::open_at(&root, c"l/secret", OFlags::RDONLY, 0).is_err(), "a name with a slash is refused");
    fsat::chown_at(&root, c"l", 1234, 1234).unwrap(); // the link itself
    assert_eq!(fs::symlink_metadata(s.tree.join("l")).unwrap().uid(), 1234);
    assert_eq!(fsat::readlink_at(&root, c"l").unwrap(), s.host.as_os_str().as_encoded_bytes());
    // Removing the tree removes the link, not what it points to.
    let top = fsat::open_dir(s.tree.parent().unwrap()).unwrap();
    fsat::remove_tree_at(&top, c"tree").unwrap();
    assert!(!s.tree.exists());
    host_untouched(&s.host);
}

#[test]
fn a_fifo_does_not_block_a_read_and_a_mount_stops_a_removal() {
    let s = setup();
    let root = fsat::open_dir(&s.tree).unwrap();
    fsat::mknod_at(&root, c"pipe", 0o010644, 0).unwrap();
    let err = fsat::read_regular_at(&root, c"pipe", 100).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
    // A mount inside a tree being removed is refused, not emptied.
    fs::create_dir(s.tree.join("m")).unwrap();
    let mounted = Tmpfs::mount(&s.tree.join("m"));
    fs::write(s.tree.join("m/keep"), "x").unwrap();
    let top = fsat::open_dir(s.tree.parent().unwrap()).unwrap();
    let err = fsat::remove_tree_at(&top, c"tree").unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::CrossesDevices, "{err}");
    assert!(s.tree.join("m/keep").exists());
    drop(mounted);
    fsat::remove_tree_at(&top, c"tree").unwrap();
    host_untouched(&s.host);
}

/// A tmpfs mounted for the test, unmounted when dropped (also on failure).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Tmpfs {
        let st = std::process::Command::new("mount").args(["-t", "tmpfs", "tmpfs"]).arg(at).status().unwrap();
        assert!(st.success(), "mounting a tmpfs needs root");
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn racing_reads_and_writes_stay_in_the_tree() {
    let s = setup();
    let root = fsat::open_dir(&s.tree).unwrap();
    let racer = Racer::start(fsat::open_dir(&s.tree).unwrap(), "d", "l");
    racer.wait_started();
    let (mut read, mut wrote) = (0, 0);
    racer.race(2000, || {
        if let Ok(data) = fsat::open_beneath(&root, "d/secret", OFlags::RDONLY, 0).and_then(|fd| {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut fs::File::from(fd), &mut v).map(|_| v)
        }) {
            assert_eq!(data, b"benign");
            read += 1;
        }
        if let Ok(d) = fsat::open_dir_at(&root, c"d") {
            if fsat::chmod_at(&d, c"secret", 0o644).is_ok() && fsat::chown_at(&d, c"secret", 4321, 4321).is_ok() {
                wrote += 1;
            }
            assert_eq!(fsat::read_regular_at(&d, c"secret", 100).unwrap(), b"benign");
        }
        // Both kinds of call must have gone through while racing, so the
        // test cannot pass by every call being refused.
        read > 0 && wrote > 0
    });
    drop(racer);
    host_untouched(&s.host);
}

#[test]
fn racing_removal_never_leaves_the_tree() {
    for _ in 0..30 {
        let s = setup();
        // Enough entries in `d` that removing it takes a while.
        for i in 0..200 {
            fs::write(s.tree.join("d").join(format!("f{i}")), "x").unwrap();
        }
        let top = fsat::open_dir(s.tree.parent().unwrap()).unwrap();
        // It stops by itself once the names are removed under it.
        let racer = Racer::start(fsat::open_dir(&s.tree).unwrap(), "d", "l");
        racer.wait_started();
        // Removal may fail while a name is swapped; retry until gone.
        let mut tries = 0;
        while s.tree.exists() && tries < 10_000 {
            let _ = fsat::remove_tree_at(&top, c"tree");
            tries += 1;
        }
        drop(racer);
        assert!(!s.tree.exists(), "the tree could not be removed in {tries} tries");
        host_untouched(&s.host);
    }
}
