//! Removing names, and whole trees without following a link out of them.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;

use rustix::fs::{unlinkat, AtFlags};
use rustix::io::Errno;

use crate::{fstat, kind, lstat_at, open_dir_at, read_dir, single_name, Kind};

/// Removes the single name `name` (a directory with `is_dir`).
pub fn unlink_at(dir: impl AsFd, name: &CStr, is_dir: bool) -> io::Result<()> {
    let flags = if is_dir { AtFlags::REMOVEDIR } else { AtFlags::empty() };
    Ok(unlinkat(dir, single_name(name)?, flags)?)
}

/// Removes `name` in `dir` and, if it is a directory, everything under it.
/// Directories are opened with `O_NOFOLLOW` one at a time and their entries
/// removed through that descriptor, so a symlink anywhere in the tree is
/// removed as a link and never followed; a directory on another filesystem
/// (a mount inside the tree) is refused with `EXDEV` rather than emptied.
/// A missing `name` is not an error.
pub fn remove_tree_at(dir: impl AsFd, name: &CStr) -> io::Result<()> {
    let dir = dir.as_fd();
    let st = match lstat_at(dir, name) {
        Ok(st) => st,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if kind(&st) != Kind::Dir {
        return unlink_at(dir, name, false);
    }
    let parent_dev = fstat(dir)?.st_dev;
    let sub = match open_dir_at(dir, name) {
        Ok(fd) => fd,
        // Swapped for a non-directory since the lstat: remove that instead.
        Err(e) if [Errno::LOOP, Errno::NOTDIR].iter().any(|n| e.raw_os_error() == Some(n.raw_os_error())) => {
            return unlink_at(dir, name, false);
        }
        Err(e) => return Err(e),
    };
    if fstat(&sub)?.st_dev != parent_dev {
        return Err(io::Error::new(io::ErrorKind::CrossesDevices, format!("{} is a mount point", name.to_string_lossy())));
    }
    for child in read_dir(&sub)? {
        remove_tree_at(&sub, &child)?;
    }
    unlink_at(dir, name, true)
}
