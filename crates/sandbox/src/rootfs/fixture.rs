//! The hostile tree the rootfs tests build in: a sandbox root whose names
//! lead to a "host" directory that nothing may touch.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::PathBuf;

use super::Place;

/// `root/d` (a directory), `root/f` (a file), `root/l` -> `host`,
/// `root/dangling` -> `host/new`; `host` (mode 0700) holds one file.
pub(crate) struct Tree {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub host: PathBuf,
}

pub(crate) fn tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let (root, host) = (dir.path().join("root"), dir.path().join("host"));
    fs::create_dir_all(root.join("d")).unwrap();
    fs::create_dir_all(&host).unwrap();
    fs::write(host.join("marker"), "host").unwrap();
    fs::write(root.join("f"), "").unwrap();
    fs::set_permissions(&host, fs::Permissions::from_mode(0o700)).unwrap();
    symlink(&host, root.join("l")).unwrap();
    symlink(host.join("new"), root.join("dangling")).unwrap();
    Tree { _dir: dir, root, host }
}

impl Tree {
    pub fn at(&self, rel: &str) -> Place {
        Place::inside(&self.root, rel)
    }

    /// Nothing made in, mounted on or changed of the host directory.
    pub fn host_untouched(&self) {
        let names: Vec<_> = fs::read_dir(&self.host).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["marker"], "nothing made in the host directory");
        let m = fs::metadata(&self.host).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (0, 0, 0o700), "host directory's owner and mode unchanged");
        let mounts = fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
        assert!(!mounts.contains(self.host.to_str().unwrap()), "nothing mounted on the host directory: {mounts}");
    }
}
