//! The system calls capture and restore make, relative to directory file
//! descriptors and never following a symlink: the upper directories are
//! written by untrusted sandbox code.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `ret < 0` → the errno as an `io::Error`.
fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains NUL"))
}

fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-negative return of open/openat/openat2 is a new
    // descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens a directory by absolute path; the last component must not be a
/// symlink (the parents belong to the daemon).
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cstr(path.as_os_str())?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    owned(unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) })
}

/// Opens `name` in `dir` without following it if it is a symlink.
pub fn open_at(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: valid directory fd and NUL-terminated name; mode is only read
    // with O_CREAT.
    owned(unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode as libc::c_uint) })
}

pub fn open_dir_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    open_at(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

/// `struct open_how` version 0 (libc's copy cannot be built field by field).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens a relative `path` under `dir` with `openat2`, refusing to leave
/// `dir`, to cross a mount or to traverse any symlink.
pub fn open_beneath(dir: BorrowedFd<'_>, path: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    let how = OpenHow {
        flags: (flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_XDEV,
    };
    // SAFETY: `path` is NUL-terminated and `how` is a properly laid out
    // open_how; both outlive the call and the size passed is that of `how`.
    let ret = unsafe {
        libc::syscall(libc::SYS_openat2, dir.as_raw_fd(), path.as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>())
    };
    owned(ret as libc::c_int)
}

fn zeroed_stat() -> libc::stat {
    // SAFETY: `stat` is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// `lstat` of `name` in `dir`.
pub fn lstat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<libc::stat> {
    let mut st = zeroed_stat();
    // SAFETY: valid fd, NUL-terminated name and out pointer.
    check(unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    let mut st = zeroed_stat();
    // SAFETY: valid fd and out pointer.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// The names in a directory but `.` and `..`, sorted by bytes.
pub fn read_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    // fdopendir takes ownership of its descriptor; give it a duplicate.
    // SAFETY: `dir` is a valid descriptor.
    let dup = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    let dup = owned(dup)?;
    // SAFETY: `dup` is a valid directory descriptor; on success the DIR owns it.
    let d = unsafe { libc::fdopendir(dup.as_raw_fd()) };
    if d.is_null() {
        return Err(io::Error::last_os_error());
    }
    std::mem::forget(dup);
    // The duplicate shares the file offset with `dir`, which may have been
    // read before.
    // SAFETY: `d` is a valid DIR stream.
    unsafe { libc::rewinddir(d) };
    let mut names = Vec::new();
    let result = loop {
        // SAFETY: resetting errno distinguishes the end of the stream from an
        // error, both of which readdir reports as NULL.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `d` is a valid DIR stream, used by this thread only.
        let ent = unsafe { libc::readdir(d) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            break if e.raw_os_error() == Some(0) { Ok(()) } else { Err(e) };
        }
        // SAFETY: readdir returned a valid dirent whose d_name is
        // NUL-terminated; it stays valid until the next readdir on `d`.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
        let b = name.to_bytes();
        if b != b"." && b != b".." {
            names.push(name.to_owned());
        }
    };
    // SAFETY: `d` is valid and not used afterwards; this closes the duplicate.
    unsafe { libc::closedir(d) };
    result?;
    names.sort_unstable();
    Ok(names)
}

pub fn readlink_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: valid fd and name; `buf` is writable for its length.
        let n = unsafe { libc::readlinkat(dir.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n < buf.len() {
            buf.truncate(n);
            return Ok(buf);
        }
        buf.resize(buf.len() * 4, 0);
    }
}

pub fn mkdir_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid fd and NUL-terminated name.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) })
}

pub fn mknod_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    // SAFETY: valid fd and NUL-terminated name.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) })
}

pub fn symlink_at(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: valid fd and NUL-terminated strings.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })
}

/// A new name `new_name` in `new_dir` for `old_name` in `old_dir` (a symlink
/// is linked itself, not followed).
pub fn link_at(old_dir: BorrowedFd<'_>, old_name: &CStr, new_dir: BorrowedFd<'_>, new_name: &CStr) -> io::Result<()> {
    // SAFETY: valid fds and NUL-terminated names; flags 0 does not follow.
    check(unsafe { libc::linkat(old_dir.as_raw_fd(), old_name.as_ptr(), new_dir.as_raw_fd(), new_name.as_ptr(), 0) })
}

/// Removes `name` (a directory with `AT_REMOVEDIR`).
pub fn unlink_at(dir: BorrowedFd<'_>, name: &CStr, is_dir: bool) -> io::Result<()> {
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: valid fd and NUL-terminated name.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })
}

/// `lchown` of `name` in `dir`.
pub fn chown_at(dir: BorrowedFd<'_>, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: valid fd and name; AT_SYMLINK_NOFOLLOW changes a symlink itself.
    check(unsafe { libc::fchownat(dir.as_raw_fd(), name.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) })
}

/// `chmod` of `name` in `dir`; never called on a symlink (Linux has no
/// `lchmod`), so the caller checks the type first.
pub fn chmod_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid fd and NUL-terminated name.
    check(unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t, 0) })
}

/// Sets the mtime of `name` in `dir` (a symlink itself), leaving the atime.
pub fn set_mtime_at(dir: BorrowedFd<'_>, name: &CStr, sec: i64, nsec: u32) -> io::Result<()> {
    let times = [
        libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        libc::timespec { tv_sec: sec as libc::time_t, tv_nsec: nsec as libc::c_long },
    ];
    // SAFETY: valid fd, NUL-terminated name, and a two-element timespec array.
    check(unsafe { libc::utimensat(dir.as_raw_fd(), name.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) })
}

/// Sets the mtime of an open file or directory, leaving the atime.
pub fn set_mtime_fd(fd: BorrowedFd<'_>, sec: i64, nsec: u32) -> io::Result<()> {
    let times = [
        libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        libc::timespec { tv_sec: sec as libc::time_t, tv_nsec: nsec as libc::c_long },
    ];
    // SAFETY: valid fd and a two-element timespec array.
    check(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) })
}

/// `lseek` that reports `ENXIO` (no more data or holes) as `None`.
pub fn seek(fd: BorrowedFd<'_>, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    // SAFETY: valid fd; lseek touches no memory.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), offset as libc::off_t, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENXIO) { Ok(None) } else { Err(e) };
    }
    Ok(Some(r as u64))
}

/// Flushes the filesystem holding `fd`.
pub fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe { libc::syncfs(fd.as_raw_fd()) })
}

/// Where extended attributes are read or written: an open descriptor, or a
/// name in a directory reached through `/proc/self/fd/N/name`, which pins the
/// directory and does not follow the name (the `l*xattr` calls).
#[derive(Debug)]
pub enum XattrAt<'a> {
    Fd(BorrowedFd<'a>),
    Name(CString),
}

impl XattrAt<'_> {
    pub fn name_in(dir: BorrowedFd<'_>, name: &CStr) -> XattrAt<'static> {
        let mut p = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
        p.extend_from_slice(name.to_bytes());
        // Neither part contains NUL.
        XattrAt::Name(CString::new(p).unwrap_or_default())
    }

    fn raw_fd(&self) -> RawFd {
        match self {
            XattrAt::Fd(fd) => fd.as_raw_fd(),
            XattrAt::Name(_) => -1,
        }
    }

    /// The attribute names, sorted (ENOTSUP: none).
    pub fn list(&self) -> io::Result<Vec<Vec<u8>>> {
        let raw = fill(|buf, len| match self {
            // SAFETY: valid fd; `buf` is writable for `len` bytes (or NULL with 0).
            XattrAt::Fd(_) => unsafe { libc::flistxattr(self.raw_fd(), buf.cast(), len) },
            // SAFETY: NUL-terminated path; `buf` as above.
            XattrAt::Name(p) => unsafe { libc::llistxattr(p.as_ptr(), buf.cast(), len) },
        });
        let raw = match raw {
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
            r => r?,
        };
        let mut names: Vec<Vec<u8>> = raw.split(|&b| b == 0).filter(|n| !n.is_empty()).map(<[u8]>::to_vec).collect();
        names.sort_unstable();
        Ok(names)
    }

    pub fn get(&self, name: &[u8]) -> io::Result<Vec<u8>> {
        let n = cstr(OsStr::from_bytes(name))?;
        fill(|buf, len| match self {
            // SAFETY: valid fd and name; `buf` writable for `len` bytes.
            XattrAt::Fd(_) => unsafe { libc::fgetxattr(self.raw_fd(), n.as_ptr(), buf.cast(), len) },
            // SAFETY: NUL-terminated path and name; `buf` as above.
            XattrAt::Name(p) => unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.cast(), len) },
        })
    }

    pub fn set(&self, name: &[u8], value: &[u8]) -> io::Result<()> {
        let n = cstr(OsStr::from_bytes(name))?;
        let (v, len) = (value.as_ptr().cast(), value.len());
        check(match self {
            // SAFETY: valid fd and name; `value` readable for `len` bytes.
            XattrAt::Fd(_) => unsafe { libc::fsetxattr(self.raw_fd(), n.as_ptr(), v, len, 0) },
            // SAFETY: NUL-terminated path and name; `value` as above.
            XattrAt::Name(p) => unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), v, len, 0) },
        })
    }

    pub fn remove(&self, name: &[u8]) -> io::Result<()> {
        let n = cstr(OsStr::from_bytes(name))?;
        check(match self {
            // SAFETY: valid fd and NUL-terminated name.
            XattrAt::Fd(_) => unsafe { libc::fremovexattr(self.raw_fd(), n.as_ptr()) },
            // SAFETY: NUL-terminated path and name.
            XattrAt::Name(p) => unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) },
        })
    }
}

/// Calls a size-probing xattr function (size 0 → needed length) until the
/// value fits; the value may grow between the two calls.
fn fill(mut f: impl FnMut(*mut u8, usize) -> libc::ssize_t) -> io::Result<Vec<u8>> {
    loop {
        let need = f(std::ptr::null_mut(), 0);
        if need < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; need as usize];
        if buf.is_empty() {
            return Ok(buf);
        }
        let n = f(buf.as_mut_ptr(), buf.len());
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
    }
}
