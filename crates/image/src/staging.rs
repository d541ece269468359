//! Building an image out of sight and publishing it in one rename.
//!
//! An image is built in `<root>/.tmp-<random>/`, which holds an exclusive
//! `flock` for as long as it is being built. When complete, `image.json` is
//! written into it (temporary file, fsync, rename), the filesystem is synced,
//! and the directory is renamed to `<root>/<name>` without replacing
//! anything. A crash at any point leaves either no image or a complete one,
//! plus at most a `.tmp-*` directory that [`discard`] removes later.

use std::collections::hash_map::RandomState;
use std::fs::{self, DirBuilder, File, Permissions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::Serialize;

use cairn_fsat::rename_noreplace;
use super::{Image, IMAGE_JSON, ROOTFS, TMP_PREFIX};
use crate::{Error, Result};

/// A directory an image is being built in; deleted on drop unless published.
#[derive(Debug)]
pub(super) struct Staging {
    dir: PathBuf,
    /// Tells [`discard`] in other processes that this one is still in use.
    lock: Flock<File>,
    published: bool,
    /// The directory inside that holds the tree.
    tree: &'static str,
}

impl Staging {
    /// Creates `<store_root>/.tmp-<random>/rootfs/`, creating the store
    /// root if needed.
    pub(super) fn new(store_root: &Path) -> Result<Staging> {
        Staging::with_tree(store_root, ROOTFS)
    }

    /// Creates `<store_root>/.tmp-<random>/<tree>/`.
    pub(super) fn with_tree(store_root: &Path, tree: &'static str) -> Result<Staging> {
        let io_err = |p: &Path| {
            let p = p.to_owned();
            move |e| Error::ImageIo(p, e)
        };
        fs::create_dir_all(store_root).map_err(io_err(store_root))?;
        let dir = loop {
            let dir = temp_path(store_root);
            // 0700 until published: a half-built image is nobody's business.
            match DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::ImageIo(dir, e)),
            }
        };
        let lock =
            File::open(&dir).and_then(|f| Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| e.into()));
        let lock = match lock {
            Ok(lock) => lock,
            Err(e) => {
                let _ = fs::remove_dir(&dir);
                return Err(Error::ImageIo(dir, e));
            }
        };
        // From here on, Drop cleans up.
        let staging = Staging { lock, dir, published: false, tree };
        let rootfs = staging.rootfs();
        DirBuilder::new().mode(0o755).create(&rootfs).map_err(io_err(&rootfs))?;
        Ok(staging)
    }

    pub(super) fn rootfs(&self) -> PathBuf {
        self.dir.join(self.tree)
    }

    /// Makes the image visible at `dest`. Fails with `ImageExists` if
    /// something already is there, leaving it untouched.
    pub(super) fn publish(self, dest: &Path, image: &Image) -> Result<()> {
        match self.publish_with(dest, IMAGE_JSON, image)? {
            true => Ok(()),
            false => Err(Error::ImageExists(image.name.clone())),
        }
    }

    /// Writes `value` as `json_name` next to the tree and makes the whole
    /// visible at `dest`. Returns false, leaving `dest` untouched, if
    /// something already is there.
    pub(super) fn publish_with(mut self, dest: &Path, json_name: &str, value: &impl Serialize) -> Result<bool> {
        let io_err = |p: &Path| {
            let p = p.to_owned();
            move |e| Error::ImageIo(p, e)
        };
        fs::set_permissions(&self.dir, Permissions::from_mode(0o755)).map_err(io_err(&self.dir))?;
        write_json_atomic(&self.dir.join(json_name), value)?;
        // Flush the whole tree: the image must be complete on disk before it
        // can be seen, or a power loss could publish empty files.
        nix::unistd::syncfs(self.lock.as_raw_fd()).map_err(|e| Error::ImageIo(self.dir.clone(), e.into()))?;
        match rename_noreplace(&self.dir, dest) {
            Ok(()) => self.published = true,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ENOTEMPTY)) => return Ok(false),
            Err(e) => return Err(Error::ImageIo(dest.to_owned(), e)),
        }
        let store_root = dest.parent().unwrap_or(Path::new("/"));
        fsync_dir(store_root).map_err(io_err(store_root))?;
        Ok(true)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            if let Err(e) = fs::remove_dir_all(&self.dir) {
                tracing::warn!(path = %self.dir.display(), "cannot remove unfinished image: {e}");
            }
        }
    }
}

/// A fresh `<store_root>/.tmp-<random>` path.
pub(super) fn temp_path(store_root: &Path) -> PathBuf {
    // RandomState is randomly keyed per process and differs per call; the
    // time and pid make names from concurrent processes differ as well.
    let mut h = RandomState::new().build_hasher();
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    h.write_u128(nanos);
    h.write_u32(std::process::id());
    store_root.join(format!("{TMP_PREFIX}{:016x}", h.finish()))
}

/// Deletes a `.tmp-*` directory unless a live build holds its lock.
/// Returns whether it was deleted (or already gone).
pub(super) fn discard(dir: &Path) -> io::Result<bool> {
    let file = match File::open(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e),
    };
    if !file.metadata()?.is_dir() {
        fs::remove_file(dir)?;
        return Ok(true);
    }
    let _lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((_, Errno::EWOULDBLOCK)) => return Ok(false),
        Err((_, e)) => return Err(e.into()),
    };
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(true),
    }
}

/// Writes `image` to `path` so that `path` always holds either the old
/// content or the complete new one.
pub(super) fn write_json_atomic(path: &Path, image: &impl Serialize) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let write = || -> io::Result<()> {
        let mut file = File::create(&tmp)?;
        serde_json::to_writer_pretty(&mut file, image).map_err(io::Error::other)?;
        file.write_all(b"\n")?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        fsync_dir(path.parent().unwrap_or(Path::new("/")))
    };
    write().map_err(|e| Error::ImageIo(path.to_owned(), e))
}

/// Makes a rename or unlink in `dir` durable.
pub(super) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
