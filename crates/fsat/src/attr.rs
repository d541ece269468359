//! Owner, mode and times, set on a descriptor or on a name without
//! following it.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd};

use rustix::fs::{OFlags, CWD, chmodat, chownat, futimens, utimensat, AtFlags, Gid, Mode, Timespec, Timestamps, Uid, UTIME_OMIT};

use crate::single_name;

/// `lchown` of `name` in `dir`.
pub fn chown_at(dir: impl AsFd, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    let (u, g) = (Uid::from_raw(uid), Gid::from_raw(gid));
    Ok(chownat(dir, single_name(name)?, Some(u), Some(g), AtFlags::SYMLINK_NOFOLLOW)?)
}

/// `fchown` of an open descriptor.
pub fn fchown(fd: impl AsFd, uid: u32, gid: u32) -> io::Result<()> {
    let (u, g) = (Uid::from_raw(uid), Gid::from_raw(gid));
    Ok(rustix::fs::fchown(fd, Some(u), Some(g))?)
}

/// `chmod` of `name` in `dir`, never through a symlink. Linux has no
/// `lchmod`, and `fchmod` refuses an `O_PATH` descriptor (the only way to
/// open a device node or FIFO without side effects), so the entry is opened
/// with `O_PATH | O_NOFOLLOW`, checked with `fstat`, and changed through its
/// `/proc/self/fd` link, which names exactly that inode. A symlink is
/// `ELOOP`.
pub fn chmod_at(dir: impl AsFd, name: &CStr, mode: u32) -> io::Result<()> {
    let fd = crate::open_at(dir, name, OFlags::PATH, 0)?;
    if crate::kind(&crate::fstat(&fd)?) == crate::Kind::Symlink {
        return Err(io::Error::from_raw_os_error(rustix::io::Errno::LOOP.raw_os_error()));
    }
    let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok(chmodat(CWD, proc_path.as_str(), Mode::from_raw_mode(mode), AtFlags::empty())?)
}

/// `fchmod` of an open descriptor.
pub fn fchmod(fd: impl AsFd, mode: u32) -> io::Result<()> {
    Ok(rustix::fs::fchmod(fd, Mode::from_raw_mode(mode))?)
}

fn mtime_only(sec: i64, nsec: u32) -> Timestamps {
    Timestamps {
        last_access: Timespec { tv_sec: 0, tv_nsec: UTIME_OMIT },
        last_modification: Timespec { tv_sec: sec, tv_nsec: nsec as _ },
    }
}

/// Sets the mtime of `name` in `dir` (a symlink itself), leaving the atime.
pub fn set_mtime_at(dir: impl AsFd, name: &CStr, sec: i64, nsec: u32) -> io::Result<()> {
    Ok(utimensat(dir, single_name(name)?, &mtime_only(sec, nsec), AtFlags::SYMLINK_NOFOLLOW)?)
}

/// Sets the mtime of an open file or directory, leaving the atime.
pub fn set_mtime_fd(fd: impl AsFd, sec: i64, nsec: u32) -> io::Result<()> {
    Ok(futimens(fd, &mtime_only(sec, nsec))?)
}
