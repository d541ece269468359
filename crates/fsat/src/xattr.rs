//! Extended attributes of an open descriptor, or of a name in a directory
//! without following it.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{fgetxattr, flistxattr, fremovexattr, fsetxattr, lgetxattr, llistxattr, lremovexattr, lsetxattr, XattrFlags};

/// Where extended attributes are read or written: an open descriptor, or a
/// name in a directory reached through `/proc/self/fd/N/name`, which pins
/// the directory and does not follow the name (the `l*xattr` calls). The
/// second is for symlinks and whiteouts, which cannot be opened for I/O.
#[derive(Debug)]
pub enum XattrAt<'a> {
    Fd(BorrowedFd<'a>),
    Name(CString),
}

impl XattrAt<'_> {
    pub fn name_in(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<XattrAt<'static>> {
        crate::single_name(name)?;
        let mut p = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
        p.extend_from_slice(name.to_bytes());
        Ok(XattrAt::Name(CString::new(p).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?))
    }

    /// The attribute names, sorted (none where the filesystem has none).
    pub fn list(&self) -> io::Result<Vec<Vec<u8>>> {
        let raw = fill(|buf| match self {
            XattrAt::Fd(fd) => flistxattr(fd, buf),
            XattrAt::Name(p) => llistxattr(p.as_c_str(), buf),
        });
        let raw = match raw {
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOTSUP.raw_os_error()) => return Ok(Vec::new()),
            r => r?,
        };
        let mut names: Vec<Vec<u8>> = raw.split(|&b| b == 0).filter(|n| !n.is_empty()).map(<[u8]>::to_vec).collect();
        names.sort_unstable();
        Ok(names)
    }

    pub fn get(&self, name: &[u8]) -> io::Result<Vec<u8>> {
        let n = OsStr::from_bytes(name);
        fill(|buf| match self {
            XattrAt::Fd(fd) => fgetxattr(fd, n, buf),
            XattrAt::Name(p) => lgetxattr(p.as_c_str(), n, buf),
        })
    }

    pub fn set(&self, name: &[u8], value: &[u8]) -> io::Result<()> {
        let n = OsStr::from_bytes(name);
        Ok(match self {
            XattrAt::Fd(fd) => fsetxattr(fd, n, value, XattrFlags::empty()),
            XattrAt::Name(p) => lsetxattr(p.as_c_str(), n, value, XattrFlags::empty()),
        }?)
    }

    pub fn remove(&self, name: &[u8]) -> io::Result<()> {
        let n = OsStr::from_bytes(name);
        Ok(match self {
            XattrAt::Fd(fd) => fremovexattr(fd, n),
            XattrAt::Name(p) => lremovexattr(p.as_c_str(), n),
        }?)
    }
}

/// Calls a value-reading xattr function with a growing buffer until the
/// value fits (it may grow between two calls).
fn fill(mut f: impl FnMut(&mut [u8]) -> rustix::io::Result<usize>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        match f(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(rustix::io::Errno::RANGE) if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            Err(e) => return Err(e.into()),
        }
    }
}
