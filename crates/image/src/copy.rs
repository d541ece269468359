//! Copies a directory tree from the host into an image.
//!
//! The source is walked through file descriptors too: each entry is opened
//! relative to its parent's fd, refusing symlinks, and its metadata is taken
//! from the opened fd. A source tree that changes while it is copied (a
//! directory swapped for a symlink to `/root`, say) therefore cannot make the
//! copy read anything outside the tree.

use std::ffi::CString;
use std::fs::{self, File};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{readlinkat, AtFlags};
use nix::sys::stat::{fstat, fstatat, FileStat, SFlag};

use super::path::RelPath;
use super::writer::{file_type, Content, Meta, TreeWriter, CAPABILITY_XATTR};
use crate::{Error, Result};
use cairn_fsat::{open_beneath, OFlags, XattrAt};

/// Decides why an entry must be left out of the copy, if it must. Gets the
/// entry's path relative to the source root and its metadata (taken from the
/// opened entry for files and directories).
pub(super) type SkipFn<'a> = &'a dyn Fn(&RelPath, &FileStat) -> Option<&'static str>;

/// How a tree is copied.
#[derive(Clone, Copy)]
pub(super) struct CopyPolicy<'a> {
    /// Owner given to every entry instead of the source's.
    pub owner: Option<(u32, u32)>,
    pub skip: Option<SkipFn<'a>>,
}

impl CopyPolicy<'_> {
    /// Copies everything, keeping owners.
    pub(super) const EXACT: CopyPolicy<'static> = CopyPolicy { owner: None, skip: None };
}

/// Copies directory `src` (its metadata and its contents) to `dest` in the
/// tree being written. Symlinks are copied as links, never followed; hard
/// links become separate copies; devices, fifos and sockets are dropped;
/// set-id bits and file capabilities are kept.
pub(super) fn copy_tree(src: &Path, dest: &RelPath, w: &mut TreeWriter, policy: CopyPolicy<'_>) -> Result<()> {
    let source_err = |e: std::io::Error| Error::ImageSource(src.to_owned(), e.to_string());
    let dir = OwnedFd::from(File::open(src).map_err(source_err)?);
    let st = fstat(dir.as_raw_fd()).map_err(|e| source_err(e.into()))?;
    if file_type(&st) != SFlag::S_IFDIR {
        return Err(Error::ImageSource(src.to_owned(), "not a directory".into()));
    }
    let mut copier = Copier { src, w, policy };
    copier.w.dir(dest, copier.meta(&st))?;
    copier.copy_children(&dir, &RelPath::root(), dest)
}

struct Copier<'a, 'w> {
    src: &'a Path,
    w: &'w mut TreeWriter,
    policy: CopyPolicy<'a>,
}

impl Copier<'_, '_> {
    fn copy_children(&mut self, dir: &OwnedFd, rel: &RelPath, dest: &RelPath) -> Result<()> {
        for name in self.list(dir, rel)? {
            self.copy_entry(dir, &name, &rel.child(&name), &dest.child(&name))?;
        }
        Ok(())
    }

    fn copy_entry(&mut self, dir: &OwnedFd, name: &CString, rel: &RelPath, dest: &RelPath) -> Result<()> {
        let st = match fstatat(Some(dir.as_raw_fd()), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Deleted since the directory was listed: nothing to copy.
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(self.source_err(rel, e.into())),
        };
        let kind = file_type(&st);
        if kind == SFlag::S_IFDIR {
            let Some((fd, st)) = self.open(dir, name, rel, OFlags::RDONLY | OFlags::DIRECTORY, kind)? else {
                return Ok(());
            };
            if !self.skipped(rel, &st) {
                self.w.dir(dest, self.meta(&st))?;
                self.copy_children(&fd, rel, dest)?;
            }
        } else if kind == SFlag::S_IFREG {
            // O_NONBLOCK: should the file have become a fifo, opening it must
            // not hang; the type check after opening then skips it.
            let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY;
            let Some((fd, st)) = self.open(dir, name, rel, flags, kind)? else { return Ok(()) };
            if !self.skipped(rel, &st) {
                let capability = self.capability(&fd, rel)?;
                let content = Content { capability: capability.as_deref(), ..Content::dense(st.st_size as u64) };
                self.w.file(dest, self.meta(&st), content, &mut File::from(fd))?;
            }
        } else if kind == SFlag::S_IFLNK {
            if !self.skipped(rel, &st) {
                let target =
                    readlinkat(Some(dir.as_raw_fd()), name.as_c_str()).map_err(|e| self.source_err(rel, e.into()))?;
                self.w.symlink(dest, target.as_bytes(), self.meta(&st))?;
            }
        } else if self.skipped(rel, &st) {
            // Left out by the policy: not dropped, never wanted.
        } else if kind == SFlag::S_IFCHR || kind == SFlag::S_IFBLK {
            self.w.drop_device(dest);
        } else {
            self.w.drop_fifo(dest);
        }
        Ok(())
    }

    /// Opens entry `name` of `dir` without following a symlink and checks
    /// that it still has the type it was listed with; `None` when it
    /// changed or vanished in the meantime.
    fn open(
        &self,
        dir: &OwnedFd,
        name: &CString,
        rel: &RelPath,
        flags: OFlags,
        kind: SFlag,
    ) -> Result<Option<(OwnedFd, FileStat)>> {
        let fd = match open_beneath(dir.as_fd(), name, flags, 0) {
            Ok(fd) => fd,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)) => {
                tracing::warn!(path = %self.src_path(rel).display(), "changed while being copied; skipped");
                return Ok(None);
            }
            Err(e) => return Err(self.source_err(rel, e)),
        };
        let st = fstat(fd.as_raw_fd()).map_err(|e| self.source_err(rel, e.into()))?;
        if file_type(&st) != kind {
            tracing::warn!(path = %self.src_path(rel).display(), "changed type while being copied; skipped");
            return Ok(None);
        }
        Ok(Some((fd, st)))
    }

    /// The names in directory `dir`, sorted so that images are reproducible.
    /// Listed through `/proc/self/fd`, which reopens exactly the directory
    /// the fd refers to, wherever it has moved.
    fn list(&self, dir: &OwnedFd, rel: &RelPath) -> Result<Vec<CString>> {
        let by_fd = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let mut names = Vec::new();
        for entry in fs::read_dir(&by_fd).map_err(|e| self.source_err(rel, e))? {
            let entry = entry.map_err(|e| self.source_err(rel, e))?;
            // readdir names never contain NUL.
            if let Ok(name) = CString::new(entry.file_name().into_vec()) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// The file capabilities of the opened file `fd`, if it has any.
    fn capability(&self, fd: &OwnedFd, rel: &RelPath) -> Result<Option<Vec<u8>>> {
        match XattrAt::Fd(fd.as_fd()).get(CAPABILITY_XATTR) {
            Ok(value) => Ok(Some(value)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP)) => Ok(None),
            Err(e) => Err(self.source_err(rel, e)),
        }
    }

    fn skipped(&self, rel: &RelPath, st: &FileStat) -> bool {
        let Some(reason) = self.policy.skip.and_then(|skip| skip(rel, st)) else { return false };
        tracing::debug!(path = %self.src_path(rel).display(), reason, "not copied into the image");
        true
    }

    fn meta(&self, st: &FileStat) -> Meta {
        let mut meta = Meta::from_stat(st);
        if let Some((uid, gid)) = self.policy.owner {
            (meta.uid, meta.gid) = (uid, gid);
        }
        meta
    }

    fn src_path(&self, rel: &RelPath) -> PathBuf {
        self.src.join(std::ffi::OsStr::from_bytes(rel.to_cstring().to_bytes()))
    }

    fn source_err(&self, rel: &RelPath, err: std::io::Error) -> Error {
        Error::ImageSource(self.src_path(rel), err.to_string())
    }
}
