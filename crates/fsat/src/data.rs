//! File contents and whole-file operations: reading a regular file by name,
//! finding data and holes, syncing, renaming without replacing.

use std::ffi::CStr;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::path::Path;

use rustix::fs::{renameat_with, RenameFlags, CWD};
pub use rustix::fs::SeekFrom;

/// Reads the regular file `name` in `dir`, at most `limit` bytes (more is
/// `FileTooLarge`). A symlink, FIFO, device or directory is refused.
pub fn read_regular_at(dir: impl AsFd, name: &CStr, limit: u64) -> io::Result<Vec<u8>> {
    let file = crate::open_regular_at(dir, name)?;
    let size = file.metadata()?.len();
    if size > limit {
        return Err(io::Error::new(io::ErrorKind::FileTooLarge, format!("{size} bytes is over the {limit}-byte limit")));
    }
    let mut data = Vec::with_capacity(size as usize);
    file.take(limit + 1).read_to_end(&mut data)?;
    if data.len() as u64 > limit {
        return Err(io::Error::new(io::ErrorKind::FileTooLarge, format!("it grew over the {limit}-byte limit while read")));
    }
    Ok(data)
}

/// `lseek`, with `ENXIO` (no more data, or no hole) as `None`.
pub fn seek(fd: impl AsFd, to: SeekFrom) -> io::Result<Option<u64>> {
    match rustix::fs::seek(fd, to) {
        Ok(off) => Ok(Some(off)),
        Err(rustix::io::Errno::NXIO) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Flushes the filesystem holding `fd`.
pub fn syncfs(fd: impl AsFd) -> io::Result<()> {
    Ok(rustix::fs::syncfs(fd)?)
}

/// Renames `from` to `to` (paths the daemon owns), failing with `EEXIST`
/// instead of replacing `to`: of two concurrent publishers the second fails
/// rather than silently replacing the first one's work.
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    Ok(renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE)?)
}

/// Atomically swaps the single names `a` and `b` in `dir`.
pub fn exchange_at(dir: impl AsFd, a: &CStr, b: &CStr) -> io::Result<()> {
    let dir = dir.as_fd();
    Ok(renameat_with(dir, crate::single_name(a)?, dir, crate::single_name(b)?, RenameFlags::EXCHANGE)?)
}
