//! Opening a single name in a directory, or a relative path beneath one,
//! without following any symlink.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{openat, openat2, Mode, OFlags, ResolveFlags, CWD};

/// Lookups never leave the starting directory and never traverse a symlink,
/// magic `/proc` links included.
const STRICT: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS).union(ResolveFlags::NO_MAGICLINKS);

/// A name as a C string; a NUL inside it is `InvalidInput`.
pub fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains NUL"))
}

/// Checks that `name` is one path component: not empty, `.` or `..`, and
/// without `/` (which would make the kernel walk, and follow, the parts
/// before it).
pub fn single_name(name: &CStr) -> io::Result<&CStr> {
    let b = name.to_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{:?} is not a single file name", String::from_utf8_lossy(b))));
    }
    Ok(name)
}

/// Opens a directory the daemon owns by absolute path; the last component
/// must not be a symlink. For the top of an untrusted tree (a disk's upper
/// directory, an image directory), whose parents belong to the daemon.
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(openat(CWD, path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?)
}

/// Opens the single name `name` in `dir` without following it if it is a
/// symlink (`O_PATH` then gives the link itself; other flags fail `ELOOP`).
pub fn open_at(dir: impl AsFd, name: &CStr, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
    single_name(name)?;
    Ok(openat(dir, name, flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::from_raw_mode(mode))?)
}

/// Opens the directory `name` in `dir` (`ENOTDIR`/`ELOOP` if it is not one).
pub fn open_dir_at(dir: impl AsFd, name: &CStr) -> io::Result<OwnedFd> {
    open_at(dir, name, OFlags::RDONLY | OFlags::DIRECTORY, 0)
}

/// Opens the relative `path` beneath `dir`, refusing to leave `dir` or to
/// traverse any symlink. `mode` only matters with `O_CREAT`.
pub fn open_beneath(dir: impl AsFd, path: impl rustix::path::Arg, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
    open2(dir, path, flags, mode, STRICT)
}

/// [`open_beneath`] that also refuses to cross a mount point.
pub fn open_beneath_same_fs(dir: impl AsFd, path: impl rustix::path::Arg, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
    open2(dir, path, flags, mode, STRICT | ResolveFlags::NO_XDEV)
}

fn open2(dir: impl AsFd, path: impl rustix::path::Arg, flags: OFlags, mode: u32, resolve: ResolveFlags) -> io::Result<OwnedFd> {
    // The kernel rejects a mode without O_CREAT or O_TMPFILE.
    let mode = if flags.intersects(OFlags::CREATE | OFlags::TMPFILE) { Mode::from_raw_mode(mode) } else { Mode::empty() };
    // RESOLVE_NO_SYMLINKS refuses a final symlink too (ELOOP); only with
    // O_PATH | O_NOFOLLOW, if the caller asks, is the link itself opened.
    Ok(openat2(dir, path, flags | OFlags::CLOEXEC, mode, resolve)?)
}

/// Opens the regular file `name` in `dir` for reading. `O_NONBLOCK` keeps a
/// FIFO swapped in from blocking the open; anything but a regular file, as
/// `fstat` on the opened descriptor says, is `InvalidInput`.
pub fn open_regular_at(dir: impl AsFd, name: &CStr) -> io::Result<File> {
    let fd = open_at(dir, name, OFlags::RDONLY | OFlags::NONBLOCK, 0)?;
    let st = crate::fstat(&fd)?;
    if crate::kind(&st) != crate::Kind::File {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    // Reads of a regular file never block; clear the flag for callers that
    // hand the file on.
    rustix::fs::fcntl_setfl(&fd, OFlags::empty())?;
    Ok(File::from(fd))
}
