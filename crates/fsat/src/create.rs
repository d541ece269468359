//! New entries in a directory, by single name.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;

use rustix::fs::{linkat, mkdirat, mknodat, symlinkat, AtFlags, FileType, Mode};

use crate::single_name;

pub fn mkdir_at(dir: impl AsFd, name: &CStr, mode: u32) -> io::Result<()> {
    Ok(mkdirat(dir, single_name(name)?, Mode::from_raw_mode(mode))?)
}

/// `mknod` of `name` in `dir`; `mode` carries the file type bits.
pub fn mknod_at(dir: impl AsFd, name: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    let kind = FileType::from_raw_mode(mode as _);
    Ok(mknodat(dir, single_name(name)?, kind, Mode::from_raw_mode(mode & 0o7777), rdev as _)?)
}

/// A symlink `name` in `dir` holding `target` (which is never resolved here).
pub fn symlink_at(target: &CStr, dir: impl AsFd, name: &CStr) -> io::Result<()> {
    Ok(symlinkat(target, dir, single_name(name)?)?)
}

/// A new name `new_name` in `new_dir` for `old_name` in `old_dir` (a
/// symlink is linked itself, not followed).
pub fn link_at(old_dir: impl AsFd, old_name: &CStr, new_dir: impl AsFd, new_name: &CStr) -> io::Result<()> {
    Ok(linkat(old_dir, single_name(old_name)?, new_dir, single_name(new_name)?, AtFlags::empty())?)
}

/// The target of the symlink `name` in `dir`, as bytes.
pub fn readlink_at(dir: impl AsFd, name: &CStr) -> io::Result<Vec<u8>> {
    Ok(rustix::fs::readlinkat(dir, single_name(name)?, Vec::new())?.into_bytes())
}

/// The target of the symlink an `O_PATH | O_NOFOLLOW` descriptor holds: the
/// link that was opened, not whatever now has its name.
pub fn readlink_fd(fd: impl AsFd) -> io::Result<Vec<u8>> {
    Ok(rustix::fs::readlinkat(fd, c"", Vec::new())?.into_bytes())
}
