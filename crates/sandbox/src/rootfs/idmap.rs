//! Idmapped bind mounts: a detached copy of a directory tree whose file
//! owners are shifted through a user namespace's id map. The image is owned
//! by host root on disk; seen through a mount idmapped with the sandbox's
//! user namespace, its files belong to the sandbox's root.
//!
//! `open_tree` + `mount_setattr(MOUNT_ATTR_IDMAP)` + `move_mount`; libc has
//! the syscall numbers but no wrappers.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use crate::host::disk::cpath;
use crate::{Error, Result};

const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` from `<linux/mount.h>`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Mounts `source` at `target`, read-only, nosuid, nodev, with owners mapped
/// through the user namespace `userns`.
pub fn bind_idmapped(source: &Path, target: &Path, userns: RawFd) -> Result<()> {
    let src = cpath(source)?;
    // SAFETY: `src` is a valid NUL-terminated path; the flags ask for a
    // detached clone of the tree, returned as a new fd we take ownership of.
    let fd = unsafe {
        libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, src.as_ptr(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
    };
    if fd < 0 {
        return Err(mount_err(target, "open_tree"));
    }
    // SAFETY: open_tree returned a fresh descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns as u64,
    };
    let empty = c"";
    // SAFETY: `tree` is a valid mount fd, `attr` is a correctly sized
    // mount_attr living across the call, and the path is the empty string
    // with AT_EMPTY_PATH, so the fd itself is changed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(mount_err(target, "mount_setattr(MOUNT_ATTR_IDMAP)"));
    }
    let dst = cpath(target)?;
    // SAFETY: `tree` is a valid detached mount, `dst` a valid path; the
    // empty source path with F_EMPTY_PATH moves the fd's mount itself.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(mount_err(target, "move_mount"));
    }
    Ok(())
}

/// A detached recursive copy of the mount tree at `source`.
pub fn clone_tree(source: &Path) -> Result<OwnedFd> {
    let src = cpath(source)?;
    // SAFETY: valid C string; the result is a new descriptor we own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(mount_err(source, "open_tree"));
    }
    // SAFETY: fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Attaches a detached mount (from [`clone_tree`]) at `target`.
pub fn attach(tree: &OwnedFd, target: &Path) -> Result<()> {
    let dst = cpath(target)?;
    let empty = c"";
    // SAFETY: valid mount fd and C strings; F_EMPTY_PATH moves the fd's mount.
    let rc = unsafe {
        libc::syscall(libc::SYS_move_mount, tree.as_raw_fd(), empty.as_ptr(), libc::AT_FDCWD, dst.as_ptr(), MOVE_MOUNT_F_EMPTY_PATH)
    };
    if rc < 0 {
        return Err(mount_err(target, "move_mount"));
    }
    Ok(())
}

fn mount_err(target: &Path, step: &str) -> Error {
    let os = std::io::Error::last_os_error();
    Error::Mount { target: target.to_owned(), err: std::io::Error::new(os.kind(), format!("{step}: {os}")) }
}
