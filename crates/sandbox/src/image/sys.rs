//! The two syscalls the image store needs that nix does not offer in a form
//! usable here: `openat2` (returning an owned fd) and `renameat2` with
//! `RENAME_NOREPLACE` (also on musl).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Lookups never leave the starting directory and never follow any symlink,
/// magic `/proc` links included. Every path an archive names is resolved this
/// way, so a hostile archive cannot plant a link and then write through it.
const RESOLVE_STRICT: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

/// `struct open_how` version 0, as the kernel defines it. Declared here
/// because libc's copy is non-exhaustive and cannot be built field by field.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens `path` relative to `dir` with `openat2`, refusing to escape `dir`
/// or to traverse any symlink (`ELOOP`). `O_CLOEXEC` is always added; `mode`
/// only matters with `O_CREAT`.
pub(super) fn open_beneath(dir: BorrowedFd<'_>, path: &CStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    let creating = flags & libc::O_CREAT != 0;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        // The kernel rejects a non-zero mode without O_CREAT.
        mode: if creating { u64::from(mode) } else { 0 },
        resolve: RESOLVE_STRICT,
    };
    // SAFETY: `path` is NUL-terminated and `how` is a properly laid out
    // open_how; both outlive the call, and the size passed is that of `how`.
    // The kernel only reads through these pointers.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success openat2 returns a new file descriptor that nothing
    // else owns, so handing it to an OwnedFd is sound.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

/// Renames `from` to `to`, failing with `EEXIST` instead of replacing `to`.
/// Publishing an image with this makes the last of two concurrent writers
/// fail rather than silently replace the first one's image.
pub(super) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let from = c_path(from)?;
    let to = c_path(to)?;
    // SAFETY: both pointers are NUL-terminated strings that outlive the call;
    // AT_FDCWD makes relative paths relative to the working directory.
    let ret =
        unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_NOREPLACE) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}
