//! What an entry is, decided from `fstat` on a descriptor already opened or
//! from `fstatat(AT_SYMLINK_NOFOLLOW)` of one name.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;

use rustix::fs::{fstatfs, statat, AtFlags, FileType, Stat};

/// The kind of a directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A character device; overlayfs writes a whiteout as one with `rdev` 0.
    CharDevice { rdev: u64 },
    BlockDevice,
    Fifo,
    Socket,
}

/// The kind of a stat result.
pub fn kind(st: &Stat) -> Kind {
    match FileType::from_raw_mode(st.st_mode as _) {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Symlink,
        FileType::CharacterDevice => Kind::CharDevice { rdev: st.st_rdev },
        FileType::BlockDevice => Kind::BlockDevice,
        FileType::Fifo => Kind::Fifo,
        _ => Kind::Socket,
    }
}

/// `lstat` of the single name `name` in `dir`.
pub fn lstat_at(dir: impl AsFd, name: &CStr) -> io::Result<Stat> {
    crate::single_name(name)?;
    Ok(statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?)
}

/// `fstat` of an open descriptor.
pub fn fstat(fd: impl AsFd) -> io::Result<Stat> {
    Ok(rustix::fs::fstat(fd)?)
}

/// The filesystem type (`statfs.f_type`) of an open descriptor.
pub fn fs_magic(fd: impl AsFd) -> io::Result<i64> {
    Ok(fstatfs(fd)?.f_type as i64)
}

const PROC_SUPER_MAGIC: i64 = 0x9fa0;
const SYSFS_MAGIC: i64 = 0x6265_6572;
const DEVPTS_SUPER_MAGIC: i64 = 0x1cd1;
const CGROUP_SUPER_MAGIC: i64 = 0x27e0eb;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const DEBUGFS_MAGIC: i64 = 0x6462_6720;
const SECURITYFS_MAGIC: i64 = 0x7365_6373;
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const TRACEFS_MAGIC: i64 = 0x7472_6163;

/// Whether `fd` is on one of the kernel's pseudo filesystems (`/proc`,
/// `/sys`, `/dev/pts`, cgroups, ...), through which the daemon's
/// privileges would reach the host.
pub fn is_kernel_fs(fd: impl AsFd) -> io::Result<bool> {
    let magic = fs_magic(fd)?;
    Ok([
        PROC_SUPER_MAGIC,
        SYSFS_MAGIC,
        DEVPTS_SUPER_MAGIC,
        CGROUP_SUPER_MAGIC,
        CGROUP2_SUPER_MAGIC,
        DEBUGFS_MAGIC,
        SECURITYFS_MAGIC,
        BPF_FS_MAGIC,
        TRACEFS_MAGIC,
    ]
    .contains(&magic))
}
