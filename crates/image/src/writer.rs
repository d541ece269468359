//! Writes an image's tree, one entry at a time, through directory file
//! descriptors.
//!
//! Every entry's parent directory is looked up with `openat2` beneath the
//! image root, refusing symlinks, and the entry is then created with the
//! `*at()` syscalls relative to that parent. No entry is ever resolved as a
//! path string on the host, so none, however named, can land outside the
//! image, and a symlink an archive planted earlier is never followed.
//!
//! Every file's size is checked against the import's [`Budget`] before it
//! is written and counted as it is written. A sparse file is written
//! sparse: its chunks at their offsets, its holes left unwritten.
//!
//! Set-id bits and file capabilities (`security.capability`) are kept, as
//! real images carry `sudo` and `ping`: image and layer trees live on a
//! `nosuid` mount, so they mean something inside a sandbox only. Device
//! nodes, fifos and sockets are dropped.

use std::ffi::{CStr, CString};
use std::fmt::Display;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{fstatat, futimens, mkdirat, utimensat, FileStat, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};

use super::limits::Budget;
use super::path::{join, RelPath};
use super::tarstream::Sparse;
use super::Dropped;
use crate::stack::OPAQUE_XATTR;
use crate::{Error, Result};
use cairn_fsat::{open_beneath, OFlags, XattrAt};

/// Setuid and setgid, counted when kept.
const SETID_BITS: u32 = 0o6000;

/// The extended attribute holding a file's capabilities.
pub(super) const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// Opens a directory for changing its metadata (fchown and fchmod need a
/// real descriptor, not an `O_PATH` one).
const DIR_RDONLY: OFlags = OFlags::RDONLY.union(OFlags::DIRECTORY);

/// Owner, permission bits and modification time of one entry.
#[derive(Clone, Copy, Debug)]
pub(super) struct Meta {
    pub uid: u32,
    pub gid: u32,
    /// Permission bits (`0o7777`); file type bits are ignored.
    pub mode: u32,
    pub mtime_sec: i64,
    pub mtime_nsec: i64,
}

impl Meta {
    /// Owned by root, with `mode`, modified at `mtime_sec`.
    pub(super) fn root(mode: u32, mtime_sec: i64) -> Meta {
        Meta { uid: 0, gid: 0, mode, mtime_sec, mtime_nsec: 0 }
    }

    pub(super) fn from_stat(st: &FileStat) -> Meta {
        Meta { uid: st.st_uid, gid: st.st_gid, mode: st.st_mode, mtime_sec: st.st_mtime, mtime_nsec: st.st_mtime_nsec }
    }

    fn mtime(&self) -> TimeSpec {
        TimeSpec::new(self.mtime_sec, self.mtime_nsec)
    }
}

/// What a regular file holds, besides its owner, mode and time.
#[derive(Clone, Copy, Debug)]
pub(super) struct Content<'a> {
    /// Bytes its data should give: the file's size, or a sparse file's
    /// chunks'.
    pub size: u64,
    /// Where a sparse file's data goes; `None` for a file written whole.
    pub sparse: Option<&'a Sparse>,
    /// Its file capabilities (the `security.capability` value).
    pub capability: Option<&'a [u8]>,
}

impl Content<'static> {
    /// A file of `size` bytes written whole, without capabilities.
    pub(super) fn dense(size: u64) -> Self {
        Content { size, sparse: None, capability: None }
    }
}

/// Builds a tree under one root directory. Directory metadata is applied by
/// [`TreeWriter::finish`], after every entry inside has been written, since
/// adding an entry changes its directory's mtime.
#[derive(Debug)]
pub(super) struct TreeWriter {
    /// `O_PATH | O_DIRECTORY` descriptor of the root being filled.
    root: OwnedFd,
    /// Where the entries come from, for read errors.
    source: PathBuf,
    dropped: Dropped,
    dirs: Vec<(RelPath, Meta)>,
    /// Writing one layer of a stack: whiteouts and opaque markers are made
    /// for overlayfs, and hard links must stay in this layer.
    layer: bool,
    /// Whiteout-prefixed names of no meaning to overlayfs, skipped.
    skipped: u64,
    /// What the import may still write.
    budget: Budget,
    /// Entries written with a setuid or setgid bit.
    setid: u64,
}

impl TreeWriter {
    /// Writes into the (existing, empty) directory `root`, within `budget`;
    /// `source` names the import source in error messages.
    pub(super) fn new(root: &Path, source: &Path, budget: Budget) -> Result<TreeWriter> {
        let dir = File::open(root).map_err(|e| Error::ImageIo(root.to_owned(), e))?;
        let root_fd = open_beneath(dir.as_fd(), c".", OFlags::PATH | OFlags::DIRECTORY, 0)
            .map_err(|e| Error::ImageIo(root.to_owned(), e))?;
        Ok(TreeWriter {
            root: root_fd,
            source: source.to_owned(),
            dropped: Dropped::default(),
            dirs: Vec::new(),
            layer: false,
            skipped: 0,
            budget,
            setid: 0,
        })
    }

    /// A writer for one layer of a stack (see [`TreeWriter::whiteout`]).
    pub(super) fn for_layer(root: &Path, source: &Path, budget: Budget) -> Result<TreeWriter> {
        Ok(TreeWriter { layer: true, ..TreeWriter::new(root, source, budget)? })
    }

    pub(super) fn is_layer(&self) -> bool {
        self.layer
    }

    /// How many whiteout-prefixed names were skipped.
    pub(super) fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Creates directory `path` (the root itself when empty). A directory
    /// that already exists is kept; anything else at `path` is replaced.
    pub(super) fn dir(&mut self, path: &RelPath, meta: Meta) -> Result<()> {
        self.count_setid(path, &meta);
        if let Some((parents, name)) = path.split_last() {
            let parent = self.open_dir(parents, true).map_err(|e| lookup_error(path, e))?;
            // A directory made where this layer put a whiteout hides the
            // lower directory of that name, but shows its own entries: it
            // is opaque.
            let over_whiteout = self.layer && is_whiteout_at(parent.as_fd(), name);
            make_dir(parent.as_fd(), name, path)?;
            if over_whiteout {
                self.opaque(path)?;
            }
        }
        self.dirs.push((path.clone(), meta));
        Ok(())
    }

    /// Records, for a layer, that `name` in directory `dir` is deleted from
    /// the layers below: an overlay whiteout (a character device 0/0) is
    /// made there. What this layer itself has at that name stays, as the OCI
    /// image spec says a whiteout only applies to lower layers: a directory
    /// is marked opaque instead (its lower namesake is hidden), and a
    /// non-directory already hides its lower namesake.
    pub(super) fn whiteout(&mut self, dir: &RelPath, name: &CStr, entry: &RelPath) -> Result<()> {
        let path = dir.child(name);
        let parent = self.open_dir(dir.parts(), true).map_err(|e| lookup_error(entry, e))?;
        match fstatat(Some(parent.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if file_type(&st) == SFlag::S_IFDIR => self.opaque(&path),
            Ok(_) => Ok(()),
            Err(Errno::ENOENT) => {
                cairn_fsat::mknod_at(parent.as_fd(), name, SFlag::S_IFCHR.bits(), 0).map_err(|e| entry_io(entry, e))
            }
            Err(e) => Err(entry_io(entry, e.into())),
        }
    }

    /// Marks directory `dir` (made if missing) opaque for overlayfs: the
    /// same-named directories of the layers below are hidden.
    pub(super) fn opaque(&mut self, dir: &RelPath) -> Result<()> {
        self.open_dir(dir.parts(), true).map_err(|e| lookup_error(dir, e))?;
        let fd = open_beneath(self.root.as_fd(), dir.to_cstring(), DIR_RDONLY, 0).map_err(|e| lookup_error(dir, e))?;
        XattrAt::Fd(fd.as_fd()).set(OPAQUE_XATTR, b"y").map_err(|e| entry_io(dir, e))
    }

    /// Skips a whiteout-prefixed name that means nothing to overlayfs.
    pub(super) fn skip_meta(&mut self, path: &RelPath) {
        tracing::debug!(entry = %path, "skipping whiteout metadata entry");
        self.skipped += 1;
    }

    /// Creates regular file `path` with the contents of `data`, replacing
    /// any non-directory already there. Nothing is written if the import
    /// cannot afford what `content` says the file takes.
    pub(super) fn file(&mut self, path: &RelPath, meta: Meta, content: Content<'_>, data: &mut dyn Read) -> Result<()> {
        let logical = content.sparse.map_or(content.size, |s| s.real_size);
        self.budget.reserve(&self.source, path, content.size, logical)?;
        self.count_setid(path, &meta);
        let (parent, name) = self.parent_for_new(path)?;
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
        let fd = open_beneath(parent.as_fd(), name, flags, 0o600).map_err(|e| lookup_error(path, e))?;
        let mut file = File::from(fd);
        match content.sparse {
            None => self.copy_data(path, data, &mut file)?,
            Some(sparse) => self.copy_sparse(path, sparse, data, &file)?,
        }
        // After the owner is set: a chown clears file capabilities.
        set_meta(file.as_fd(), &meta).map_err(|e| entry_io(path, e))?;
        if let Some(value) = content.capability {
            XattrAt::Fd(file.as_fd()).set(CAPABILITY_XATTR, value).map_err(|e| entry_io(path, e))?;
        }
        Ok(())
    }

    /// Creates symlink `path` pointing at `target`, which is stored as given
    /// and never resolved here: it only means something inside the sandbox.
    pub(super) fn symlink(&mut self, path: &RelPath, target: &[u8], meta: Meta) -> Result<()> {
        let (parent, name) = self.parent_for_new(path)?;
        let at = Some(parent.as_raw_fd());
        let io_err = |e: Errno| entry_io(path, e.into());
        symlinkat(target, at, name).map_err(io_err)?;
        let (uid, gid) = (Some(Uid::from_raw(meta.uid)), Some(Gid::from_raw(meta.gid)));
        fchownat(at, name, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io_err)?;
        utimensat(at, name, &meta.mtime(), &meta.mtime(), UtimensatFlags::NoFollowSymlink).map_err(io_err)
    }

    /// Creates `path` as a hard link to `target`, an entry already in the
    /// tree. The target is looked up like any other path, so a link can only
    /// ever share an inode that this tree itself contains.
    pub(super) fn hardlink(&mut self, path: &RelPath, target: &RelPath) -> Result<()> {
        if path == target {
            return Err(unsafe_entry(path, "hard link to itself"));
        }
        let (tparents, tname) = target.split_last().ok_or_else(|| unsafe_entry(path, "hard link to the image root"))?;
        let layer = self.layer;
        let tparent = self.open_dir(tparents, false).map_err(|e| link_target_error(path, e, layer))?;
        match fstatat(Some(tparent.as_raw_fd()), tname, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if file_type(&st) == SFlag::S_IFDIR => {
                return Err(unsafe_entry(path, "hard link target is a directory"))
            }
            // This layer's own whiteout: the target is in a lower layer.
            Ok(st) if layer && file_type(&st) == SFlag::S_IFCHR => {
                return Err(link_target_error(path, io::Error::from_raw_os_error(libc::ENOENT), layer))
            }
            Ok(_) => {}
            Err(e) => return Err(link_target_error(path, e.into(), layer)),
        }
        let (parent, name) = self.parent_for_new(path)?;
        // No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink itself.
        linkat(Some(tparent.as_raw_fd()), tname, Some(parent.as_raw_fd()), name, AtFlags::empty())
            .map_err(|e| entry_io(path, e.into()))
    }

    /// Skips a device node: a sandbox gets its devices from the runtime,
    /// never from an image.
    pub(super) fn drop_device(&mut self, path: &RelPath) {
        tracing::debug!(entry = %path, "dropping device node");
        self.dropped.devices += 1;
    }

    /// Skips a fifo or socket: they are only meaningful to a live process.
    pub(super) fn drop_fifo(&mut self, path: &RelPath) {
        tracing::debug!(entry = %path, "dropping fifo or socket");
        self.dropped.fifos_sockets += 1;
    }

    /// True if anything (of any type) is at `path`.
    pub(super) fn exists(&self, path: &RelPath) -> Result<bool> {
        let Some((parents, name)) = path.split_last() else { return Ok(true) };
        let parent = match self.open_dir(parents, false) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
            Err(e) => return Err(lookup_error(path, e)),
        };
        match fstatat(Some(parent.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(_) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(entry_io(path, e.into())),
        }
    }

    /// Applies the directories' owners, modes and mtimes, and returns what
    /// was dropped on the way.
    pub(super) fn finish(self) -> Result<Dropped> {
        for (path, meta) in &self.dirs {
            let fd =
                open_beneath(self.root.as_fd(), path.to_cstring(), DIR_RDONLY, 0).map_err(|e| lookup_error(path, e))?;
            set_meta(fd.as_fd(), meta).map_err(|e| entry_io(path, e))?;
        }
        if self.setid > 0 {
            tracing::info!(source = %self.source.display(), entries = self.setid, "kept setuid/setgid bits");
        }
        Ok(self.dropped)
    }

    fn count_setid(&mut self, path: &RelPath, meta: &Meta) {
        if meta.mode & SETID_BITS != 0 {
            tracing::debug!(entry = %path, mode = format_args!("{:o}", meta.mode & 0o7777), "keeping setuid/setgid bits");
            self.setid += 1;
        }
    }

    /// Opens directory `parts` (relative to the root) as an `O_PATH` fd.
    /// With `create`, missing directories are made (owned by root, 0755),
    /// as archives need not list every parent before its children.
    fn open_dir(&self, parts: &[CString], create: bool) -> io::Result<OwnedFd> {
        const DIR_FLAGS: OFlags = OFlags::PATH.union(OFlags::DIRECTORY);
        match open_beneath(self.root.as_fd(), join(parts), DIR_FLAGS, 0) {
            Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {}
            other => return other,
        }
        // Some directory is missing: walk down one component at a time,
        // creating what is absent.
        let mut dir = self.root.try_clone()?;
        for part in parts {
            dir = match open_beneath(dir.as_fd(), part, DIR_FLAGS, 0) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    match mkdirat(Some(dir.as_raw_fd()), part.as_c_str(), Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    open_beneath(dir.as_fd(), part, DIR_FLAGS, 0)?
                }
                other => other?,
            };
        }
        Ok(dir)
    }

    /// The parent directory of `path` and its last component, with nothing
    /// left at that name, ready for a new non-directory entry.
    fn parent_for_new<'p>(&self, path: &'p RelPath) -> Result<(OwnedFd, &'p CStr)> {
        let (parents, name) =
            path.split_last().ok_or_else(|| unsafe_entry(path, "a non-directory entry with an empty path"))?;
        let parent = self.open_dir(parents, true).map_err(|e| lookup_error(path, e))?;
        remove_non_dir(parent.as_fd(), name, path)?;
        Ok((parent, name))
    }

    /// Copies file contents, telling read errors (the source is broken) from
    /// write errors (the image store is), and counting what is written.
    fn copy_data(&self, path: &RelPath, data: &mut dyn Read, out: &mut File) -> Result<()> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match data.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.read_error(path, e)),
            };
            self.budget.wrote(&self.source, path, n as u64)?;
            out.write_all(&buf[..n]).map_err(|e| entry_io(path, e))?;
        }
    }

    /// Writes each chunk of a sparse file's data at its offset and sets the
    /// file's size: what lies between the chunks is never written, so it
    /// stays a hole in the new file.
    fn copy_sparse(&self, path: &RelPath, sparse: &Sparse, data: &mut dyn Read, out: &File) -> Result<()> {
        let mut buf = vec![0u8; 64 * 1024];
        for &(offset, len) in &sparse.map {
            let (mut at, end) = (offset, offset.saturating_add(len));
            while at < end {
                let want = usize::try_from(end - at).map_or(buf.len(), |left| left.min(buf.len()));
                let n = match data.read(&mut buf[..want]) {
                    Ok(0) => return Err(self.read_error(path, io::ErrorKind::UnexpectedEof.into())),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(self.read_error(path, e)),
                };
                self.budget.wrote(&self.source, path, n as u64)?;
                out.write_all_at(&buf[..n], at).map_err(|e| entry_io(path, e))?;
                at += n as u64;
            }
        }
        out.set_len(sparse.real_size).map_err(|e| entry_io(path, e))
    }

    fn read_error(&self, path: &RelPath, e: io::Error) -> Error {
        Error::ImageSource(self.source.clone(), format!("reading {}: {e}", super::quoted(&path.to_string())))
    }
}

pub(super) fn file_type(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// Makes directory `name`, keeping one that exists (archives may list a
/// directory twice) and replacing anything else.
fn make_dir(parent: BorrowedFd<'_>, name: &CStr, path: &RelPath) -> Result<()> {
    let at = Some(parent.as_raw_fd());
    // 0700 until `finish` sets the real mode.
    let mode = Mode::from_bits_truncate(0o700);
    match mkdirat(at, name, mode) {
        Ok(()) => return Ok(()),
        Err(Errno::EEXIST) => {}
        Err(e) => return Err(entry_io(path, e.into())),
    }
    match fstatat(at, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if file_type(&st) == SFlag::S_IFDIR => return Ok(()),
        Ok(_) => {}
        Err(e) => return Err(entry_io(path, e.into())),
    }
    remove_non_dir(parent, name, path)?;
    mkdirat(at, name, mode).map_err(|e| entry_io(path, e.into()))
}

/// True when `name` in `parent` is an overlay whiteout.
fn is_whiteout_at(parent: BorrowedFd<'_>, name: &CStr) -> bool {
    fstatat(Some(parent.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| file_type(&st) == SFlag::S_IFCHR && st.st_rdev == 0)
}

/// Unlinks whatever non-directory is at `name` (a later archive entry
/// replaces an earlier one). A directory is refused: replacing it would mean
/// deleting a whole subtree on an archive's say-so.
fn remove_non_dir(parent: BorrowedFd<'_>, name: &CStr, path: &RelPath) -> Result<()> {
    match unlinkat(Some(parent.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(Errno::EISDIR) => Err(unsafe_entry(path, "replaces a directory with a non-directory")),
        Err(e) => Err(entry_io(path, e.into())),
    }
}

/// Sets owner, then mode (changing the owner may clear mode bits), then
/// times, all through an fd that refers to the entry itself.
fn set_meta(fd: BorrowedFd<'_>, meta: &Meta) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    fchown(raw, Some(Uid::from_raw(meta.uid)), Some(Gid::from_raw(meta.gid)))?;
    nix::sys::stat::fchmod(raw, Mode::from_bits_truncate(meta.mode & 0o7777))?;
    futimens(raw, &meta.mtime(), &meta.mtime())?;
    Ok(())
}

fn unsafe_entry(entry: impl Display, reason: &'static str) -> Error {
    Error::UnsafeEntry { entry: entry.to_string(), reason }
}

fn entry_io(entry: impl Display, err: io::Error) -> Error {
    Error::ImageEntry { entry: entry.to_string(), err }
}

/// Explains a failed lookup of an entry's parent directory.
fn lookup_error(path: &RelPath, err: io::Error) -> Error {
    match err.raw_os_error() {
        Some(libc::ELOOP) => {
            unsafe_entry(path, "path goes through a symlink (writing through it could escape the image)")
        }
        Some(libc::ENOTDIR) => unsafe_entry(path, "a parent of the path is not a directory"),
        Some(libc::EXDEV) => unsafe_entry(path, "path leads outside the image"),
        _ => entry_io(path, err),
    }
}

/// Explains a failed lookup of a hard link's target.
fn link_target_error(path: &RelPath, err: io::Error, layer: bool) -> Error {
    match err.raw_os_error() {
        Some(libc::ENOENT) if layer => {
            unsafe_entry(path, "hard link target is not in this layer (not yet, or only in a lower one)")
        }
        Some(libc::ENOENT) => unsafe_entry(path, "hard link target does not exist in the image (yet)"),
        Some(libc::ELOOP) => unsafe_entry(path, "hard link target goes through a symlink"),
        _ => lookup_error(path, err),
    }
}
